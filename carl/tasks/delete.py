"""Delete a feature from a source tree, in place, keeping every untouched byte as it was.

Two modes (DESIGN 1.3):
  stub    the signature, decorators and docstring stay; the body becomes
          `raise NotImplementedError` at the body's own indentation.
  remove  the definitions disappear (a module: its file is deleted). Whatever would then break
          imports elsewhere in the package is cleaned up: `from m import name` loses the name
          (the statement goes when no name is left; `pass` keeps a block non-empty), re-exports
          of a removed name are followed to a fixpoint, and `__all__` loses its string.
          Other import-time uses (a subclass, a decorator, an alias) are left alone: validation
          finds they break the import and drops the task.

All edits are byte ranges computed from `ast` positions, so formatting elsewhere is kept and the
gold patch (carl.tasks.patch.tree_diff from broken to original) is its exact reverse.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from carl.tasks.definitions import Definition, parse_definitions
from carl.tasks.layout import Layout
from carl import pyast

STUB_BODY = "raise NotImplementedError"


class DeletionError(ValueError):
    """The deletion cannot be made (nothing to stub, the edit would not parse)."""


@dataclass(frozen=True)
class Candidate:
    kind: str
    """"function", "method", "class", "module" or "cluster"."""
    definitions: tuple[Definition, ...]
    """What is deleted (for a module: every definition in it)."""
    tests: frozenset[str]
    """Node ids of the tests that execute it (the ones that can be affected)."""
    module_file: str = ""
    """For kind "module": the file."""
    occurrence: int = 1
    """The how-many-th candidate of this kind with these symbols, in source order (a property's
    getter and setter, or a def in both branches of an if, share a symbol): later ones are named
    "SYMBOL#2"... so that each makes its own task id (`carl.tasks.candidates.find_candidates`)."""

    @property
    def name(self) -> str:
        base = self.module_file if self.kind == "module" else "+".join(d.symbol for d in self.definitions)
        return base if self.occurrence == 1 else f"{base}#{self.occurrence}"

    @property
    def symbols(self) -> tuple[str, ...]:
        if self.kind == "module":
            return (self.definitions[0].module,) if self.definitions else (self.module_file,)
        return tuple(d.symbol for d in self.definitions)


Edit = tuple[int, int, bytes]  # (start byte, end byte, replacement)


def apply_deletion(root: Path, cand: Candidate, mode: str, layout: Layout) -> list[str]:
    """Apply the deletion to the tree at root; return the repo-relative files changed or deleted."""
    edits: dict[str, list[Edit]] = {}
    deleted_files: list[str] = []
    if mode == "stub":
        defs = [d for d in cand.definitions if d.kind != "class"]
        for cls in (d for d in cand.definitions if d.kind == "class"):
            defs += [m for m in _methods_of(root, cls)]
        stubbable = {d.key: d for d in defs if d.body_start}
        if not stubbable:
            raise DeletionError(f"{cand.name}: nothing to stub")
        for d in stubbable.values():
            edits.setdefault(d.file, []).append(_stub_edit(root, d))
    elif mode == "remove":
        removed_names: set[tuple[str, str]] = set()
        removed_modules: set[str] = set()
        if cand.kind == "module":
            deleted_files.append(cand.module_file)
            removed_modules.add(layout.module_name(cand.module_file))
        else:
            defs = _outermost(cand.definitions)
            by_file: dict[str, list[Definition]] = {}
            for d in defs:
                by_file.setdefault(d.file, []).append(d)
                if d.kind != "method":
                    removed_names.add((d.module, d.qualname))
            for rel, ds in by_file.items():
                edits.setdefault(rel, []).extend(_remove_edits(root, rel, ds))
        for rel, es in _import_fixups(
            root, layout, removed_names, removed_modules, set(deleted_files)
        ).items():
            edits.setdefault(rel, []).extend(es)
    else:
        raise ValueError(f"deletion mode: got {mode!r}, expected 'stub' or 'remove'")

    new_data: dict[str, bytes] = {}
    for rel, es in edits.items():  # all files checked before any is written: no half deletion
        data = (root / rel).read_bytes()
        for start, end, repl in sorted(es, reverse=True):
            data = data[:start] + repl + data[end:]
        try:
            pyast.parse(data)
        except SyntaxError as e:
            raise DeletionError(f"{cand.name}: edited {rel} does not parse ({e.msg})") from None
        new_data[rel] = data
    for rel, data in new_data.items():
        (root / rel).write_bytes(data)
    for rel in deleted_files:
        (root / rel).unlink()
    return sorted(set(edits) | set(deleted_files))


# --------------------------------------------------------------------------- stub / remove


def _line_offsets(data: bytes) -> list[int]:
    """offsets[i] = byte offset of line i+1; offsets[n] = len(data)."""
    offs = [0]
    for line in data.splitlines(keepends=True):
        offs.append(offs[-1] + len(line))
    return offs


def _stub_edit(root: Path, d: Definition) -> Edit:
    data = (root / d.file).read_bytes()
    offs = _line_offsets(data)
    start, end = stub_span(data.splitlines(), d)
    return offs[start - 1], offs[end], f"{d.body_indent}{STUB_BODY}\n".encode()


def stub_span(lines: list[bytes], d: Definition) -> tuple[int, int]:
    """The lines (1-based, inclusive) a stub replaces: the body's statements, and the comments of
    the body around them (between the docstring or header and the first statement, and after the
    last one at the body's indentation or deeper), which would otherwise be left as hints."""
    start, end, indent = d.body_start, d.end, len(d.body_indent)

    def comment_or_blank(i: int) -> bool:
        text = lines[i - 1].strip()
        return not text or text.startswith(b"#")

    i = start - 1  # between the header or docstring and the first statement: only comments and blanks
    while i >= 1 and comment_or_blank(i):
        if lines[i - 1].strip():
            start = i
        i -= 1
    j = end
    while j < len(lines) and comment_or_blank(j + 1):
        j += 1
        line = lines[j - 1]
        if line.strip() and len(line) - len(line.lstrip()) >= indent:
            end = j  # a comment inside the body after its last statement
        elif line.strip():
            break  # a comment at an outer level belongs to what follows
    return start, end


def _methods_of(root: Path, cls: Definition) -> list[Definition]:
    return [
        d
        for d in parse_definitions(root, cls.file, cls.module)
        if d.kind == "method" and d.qualname.startswith(cls.qualname + ".")
    ]


def _outermost(defs: tuple[Definition, ...]) -> list[Definition]:
    """Drop methods whose class is itself removed."""
    classes = {(d.file, d.qualname) for d in defs if d.kind == "class"}
    return [d for d in defs if not (d.kind == "method" and (d.file, d.qualname.split(".")[0]) in classes)]


def _remove_edits(root: Path, rel: str, defs: list[Definition]) -> list[Edit]:
    data = (root / rel).read_bytes()
    offs = _line_offsets(data)
    tree = pyast.parse(data)
    edits: list[Edit] = []
    gone = {(d.start, d.end) for d in defs}
    for d in defs:
        edits.append((offs[d.start - 1], offs[d.end], b""))
    # A class whose every statement is removed needs `pass` to stay valid.
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.body:
            spans = [(_node_start(s), s.end_lineno) for s in node.body]
            if all(sp in gone for sp in spans):
                first = node.body[0]
                indent = data[offs[_node_start(first) - 1] : offs[_node_start(first) - 1] + first.col_offset]
                edits.append((offs[_node_start(first) - 1], offs[_node_start(first) - 1], indent + b"pass\n"))
    return edits


def _node_start(node: ast.stmt) -> int:
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


# --------------------------------------------------------------------------- import fix-ups


def _import_fixups(
    root: Path,
    layout: Layout,
    removed_names: set[tuple[str, str]],
    removed_modules: set[str],
    skip_files: set[str],
) -> dict[str, list[Edit]]:
    """Edits that drop imports (and __all__ entries) of removed names, followed to a fixpoint."""
    files = {rel: layout.module_name(rel) for rel in layout.source_files if rel not in skip_files}
    trees = {}
    for rel in files:
        try:
            trees[rel] = pyast.parse((root / rel).read_bytes())
        except SyntaxError:
            continue

    def gone_module(mod: str) -> bool:
        return any(mod == m or mod.startswith(m + ".") for m in removed_modules)

    changed = True
    while changed:  # a name removed from m is also gone from every module that re-exports it
        changed = False
        for rel, tree in trees.items():
            mod = files[rel]
            for node in ast.walk(tree):
                if not isinstance(node, ast.ImportFrom):
                    continue
                target = _resolve(mod, rel, node)
                for alias in node.names:
                    local = alias.asname or alias.name
                    if alias.name == "*":
                        new = {(mod, n) for (m, n) in removed_names if m == target}
                    elif (
                        gone_module(target)
                        or (target, alias.name) in removed_names
                        or gone_module(f"{target}.{alias.name}")
                    ):
                        new = {(mod, local)}
                    else:
                        continue
                    if not new <= removed_names:
                        removed_names |= new
                        changed = True

    edits: dict[str, list[Edit]] = {}
    for rel, tree in trees.items():
        mod = files[rel]
        data = (root / rel).read_bytes()
        offs = _line_offsets(data)
        for parent in ast.walk(tree):
            for field in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, field, None)
                if not isinstance(block, list):
                    continue
                for stmt in block:
                    if isinstance(stmt, ast.ImportFrom):
                        target = _resolve(mod, rel, stmt)
                        keep = [
                            a
                            for a in stmt.names
                            if not (
                                gone_module(target)
                                or gone_module(f"{target}.{a.name}")
                                or (target, a.name) in removed_names
                            )
                        ]
                    elif isinstance(stmt, ast.Import):
                        keep = [a for a in stmt.names if not gone_module(a.name)]
                    else:
                        continue
                    if len(keep) == len(stmt.names):
                        continue
                    edits.setdefault(rel, []).append(
                        _rewrite_import(data, offs, stmt, keep, sole=len(block) == 1)
                    )
        edits.setdefault(rel, []).extend(
            _all_edits(data, offs, tree, {n for (m, n) in removed_names if m == mod})
        )
    return {rel: es for rel, es in edits.items() if es}


def _resolve(mod: str, rel: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = mod.split(".") if rel.endswith("__init__.py") else mod.split(".")[:-1]
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _rewrite_import(data: bytes, offs: list[int], stmt: ast.stmt, keep: list[ast.alias], sole: bool) -> Edit:
    start = offs[stmt.lineno - 1] + stmt.col_offset
    end = offs[stmt.end_lineno - 1] + stmt.end_col_offset
    names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in keep)
    if keep:
        if isinstance(stmt, ast.ImportFrom):
            return start, end, f"from {'.' * stmt.level}{stmt.module or ''} import {names}".encode()
        return start, end, f"import {names}".encode()
    line_start, line_end = offs[stmt.lineno - 1], offs[stmt.end_lineno]
    whole_lines = not data[line_start:start].strip() and not data[end:line_end].split(b"#")[0].strip(
        b" \t\r\n;"
    )
    if sole or not whole_lines:
        return start, end, b"pass"
    return line_start, line_end, b""


def _all_edits(data: bytes, offs: list[int], tree: ast.Module, names: set[str]) -> list[Edit]:
    """Remove the string literals of removed names from `__all__ = [...]` / `+= [...]`."""
    out: list[Edit] = []
    if not names:
        return out
    for stmt in tree.body:
        targets = (
            stmt.targets
            if isinstance(stmt, ast.Assign)
            else [stmt.target]
            if isinstance(stmt, (ast.AugAssign, ast.AnnAssign))
            else []
        )
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        if not isinstance(stmt.value, (ast.List, ast.Tuple)):
            continue
        for elt in stmt.value.elts:
            if not (isinstance(elt, ast.Constant) and elt.value in names and elt.lineno == elt.end_lineno):
                continue
            line_start, line_end = offs[elt.lineno - 1], offs[elt.lineno]
            start = line_start + elt.col_offset
            end = line_start + elt.end_col_offset
            rest = data[end:line_end]
            stripped = rest.lstrip(b" \t")
            if stripped.startswith(b","):
                end += len(rest) - len(stripped) + 1
                end += len(data[end:line_end]) - len(data[end:line_end].lstrip(b" \t"))
            if not data[line_start:start].strip() and not data[end:line_end].strip():
                out.append((line_start, line_end, b""))  # one entry per line: drop the line
            else:
                out.append((start, end, b""))
    return out
