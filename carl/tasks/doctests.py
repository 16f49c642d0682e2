"""Doctests are tests: the examples in docstrings and documentation files that a task's
FAIL_TO_PASS / PASS_TO_PASS node ids name must run as the original wrote them.

pytest names a doctest item after what the doctest finder found (`_pytest/doctest.py`):

    src/pkg/mod.py::pkg.mod                  the module docstring (the module's __name__)
    src/pkg/mod.py::pkg.mod.func             a function; pkg.mod.Class.method, pkg.mod.Outer.Inner
    pkg/__init__.py::pkg.helper              a package's __init__
    README.rst::README.rst, docs/x.txt::x.txt    a text file (--doctest-glob): the whole file

The reward applies the agent's edits to source files, so an agent could otherwise replace an
example's expected output with a trivial one. Pure functions, no I/O:

    is_doctest_id(node_id)             -> whether a node id names a doctest item
    doctest_files(node_ids)            -> (python files, text files) that hold doctest items
    restore_doctests(original, edited) -> edited, with every docstring of `original` that holds
                                          a doctest example put back verbatim
    doctest_object(node_id)            -> the qualified name inside its module (["Class", "meth"])
    doctest_examples(text)             -> [(source, expected output)] (the monitor's test values)
    without_doctest_examples(text)     -> text without them (what the original *code* has)

Text files are test files as a whole: the caller never applies the agent's version of them.
`original` is the original source (in remove mode the broken file lacks the deleted definition
and its docstring: rebuild it with carl.rewards.diff.patched_file from the gold patch).
Not covered: examples in a module's `__test__` dict; a docstring replaced at run time
(`f.__doc__ = ...`, a decorator that swaps it, `f = other` after the `def`); sources that do not
parse with the host's Python (returned unchanged, so the host must be at least as new as the
task's interpreter).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator

from carl import pyast

# doctest.DocTestParser's example start: a line whose first non-blank characters are `>>>`.
_EXAMPLE = re.compile(r"^[ \t]*>>>", re.MULTILINE)
_NEWLINE = re.compile(r"\r\n|\r|\n")  # the line ends the tokenizer knows (str.splitlines knows more)
_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def is_doctest_id(node_id: str) -> bool:
    """Whether a pytest node id names a doctest item rather than a test function.

    A text file (any path not ending in .py) is always one. In a .py file, a test function or
    method has a plain name per `::` part (`test_x`, `TestC::test_x`, `test_x[1.5]`); a doctest
    has one dotted name after the path, the module's own name first (pytest function and class
    names cannot hold a dot). Without a dot it is the module docstring of a top-level module
    (`mod.py::mod`); a test function named exactly like its file reads the same, but such a file
    is a test file, which the reward never applies anyway.
    """
    path, sep, rest = node_id.partition("::")
    if not sep:
        return False
    if not path.endswith(".py"):
        return True
    name = rest.split("[")[0]
    if "::" in name:
        return False
    return "." in name or name == ".".join(_module_name(path)[-1:])


def doctest_files(node_ids: Iterable[str]) -> tuple[set[str], set[str]]:
    """(python files, non-python files) that hold the doctest items among `node_ids`."""
    python, text = set(), set()
    for node_id in node_ids:
        if is_doctest_id(node_id):
            path = node_id.split("::")[0]
            (python if path.endswith(".py") else text).add(path)
    return python, text


def doctest_object(node_id: str) -> list[str] | None:
    """The qualified name inside its module that a python doctest node id names: [] for the
    module docstring, ["Class", "method"] for a method; None for a text file or a test id."""
    if not is_doctest_id(node_id):
        return None
    path, _, rest = node_id.partition("::")
    if not path.endswith(".py"):
        return None
    dotted = rest.split("[")[0].split(".")
    module = _module_name(path)
    # The module's __name__ is the longest tail of the path that the name starts with (pytest's
    # rootdir-relative or package-relative import both give a tail of the path).
    for k in range(min(len(module), len(dotted)), 0, -1):
        if dotted[:k] == module[-k:]:
            return dotted[k:]
    return dotted[1:]  # a module that renamed itself: assume a one-part module name


def restore_doctests(original: str, edited: str) -> str:
    """`edited` with every docstring of `original` that holds a doctest example (`>>>` at the
    start of a line) put back verbatim, at the same qualified name: module, classes (nested
    too), their methods, module-level functions: what doctest's finder collects. An edited
    docstring at that name is replaced in place (its exact source span); a missing one is
    inserted as the first statement; a name the edited source no longer defines has nothing to
    restore. Everything else stays byte-identical. When either source does not parse, `edited`
    is returned unchanged (the test run then fails on its own).

    A name defined more than once (branches of an `if`, overloads) is matched in order when both
    sources define it equally often; otherwise every edited definition of it gets the original's
    (last) doctest docstring, so that whichever one runs is tested (a second `def` that shadows
    the first, one under `if False:`). A property's setter and deleter are not counted.
    """
    orig = _parse(original)
    new = _parse(edited)
    if orig is None or new is None:
        return edited
    (orig_tree, orig_bom), (new_tree, new_bom) = orig, new
    orig_lines, new_lines = _line_starts(original), _line_starts(edited)
    targets = _by_name(new_tree)
    newline = "\r\n" if "\r\n" in edited else "\r" if "\r" in edited and "\n" not in edited else "\n"
    edits: list[tuple[int, int, str]] = []  # (start, end, text) in `edited`, non-overlapping
    for qual, defs in _by_name(orig_tree).items():
        docs = []  # the source text of each definition's docstring when it holds an example
        for node in defs:
            doc = _docstring(node)
            if doc is not None and _EXAMPLE.search(doc.value.value):
                start, end = _span(original, orig_lines, orig_bom, doc.value)
                docs.append(original[start:end])
            else:
                docs.append(None)
        if not any(docs):
            continue
        found = targets.get(qual, [])  # none: the object is gone, nothing to restore
        last = [d for d in docs if d is not None][-1]
        texts = docs if len(found) == len(docs) else [last] * len(found)
        edits += [
            _replacement(edited, new_lines, new_bom, t, text, newline)
            for t, text in zip(found, texts)
            if text
        ]
    out = edited
    for start, end, text in sorted(edits, reverse=True):
        out = out[:start] + text + out[end:]
    return out


def doctest_examples(text: str) -> list[tuple[str, str]]:
    """(source, expected output) of the doctest examples in `text`, by doctest's line rules: a
    `>>>` line and its `...` continuations, then the output up to a blank line or the next
    `>>>`. Indentation is dropped. Works on any text: a docstring, a documentation file, the
    added lines of a diff."""
    lines = text.splitlines()
    return [
        ("\n".join(lines[i].lstrip()[4:] for i in source), "\n".join(lines[i].strip() for i in want))
        for source, want in _scan(lines)
    ]


def without_doctest_examples(text: str) -> str:
    """`text` without the lines of its doctest examples (sources and expected outputs)."""
    lines = text.splitlines(keepends=True)
    dropped = {i for source, want in _scan(lines) for i in (*source, *want)}
    return "".join(line for i, line in enumerate(lines) if i not in dropped)


# ------------------------------------------------------------------------------ helpers


def _scan(lines: list[str]) -> Iterator[tuple[range, range]]:
    """(indices of the source lines, indices of the expected-output lines) of each example."""
    i = 0
    while i < len(lines):
        if not _starts_with(lines[i], ">>>"):
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and _starts_with(lines[i], "..."):
            i += 1
        source = range(start, i)
        while i < len(lines) and lines[i].strip() and not lines[i].lstrip().startswith(">>>"):
            i += 1
        yield source, range(source.stop, i)


def _starts_with(line: str, prompt: str) -> bool:
    """A doctest prompt: `>>> code`, `... code`, or the prompt alone."""
    head = line.strip()
    return head == prompt or line.lstrip().startswith(prompt + " ")


def _module_name(path: str) -> list[str]:
    """The path's parts as a module name: src/pkg/mod.py -> [src, pkg, mod]; pkg/__init__.py -> [pkg]."""
    parts = path.replace("\\", "/").removesuffix(".py").split("/")
    parts = [p for p in parts if p not in ("", ".")]
    return parts[:-1] if parts and parts[-1] == "__init__" else parts


def _parse(source: str) -> tuple[ast.Module, int] | None:
    """(tree, offset of the code in `source`): a leading BOM is skipped, as the import system does."""
    bom = 1 if source.startswith("\ufeff") else 0
    try:
        return pyast.parse(source[bom:]), bom
    except (SyntaxError, ValueError):
        return None


def _definitions(tree: ast.Module) -> Iterator[tuple[tuple[str, ...], ast.AST]]:
    """(qualified name, node) of the module and of what doctest's finder looks into: module-level
    functions and classes, and the members of classes, recursively (not inside functions).
    Definitions under `if`/`try`/`with`/... at those levels count (they run at import)."""
    yield (), tree

    def walk(body: list[ast.stmt], prefix: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], ast.AST]]:
        for stmt in body:
            if isinstance(stmt, _Def):
                yield (*prefix, stmt.name), stmt
                if isinstance(stmt, ast.ClassDef):
                    yield from walk(stmt.body, (*prefix, stmt.name))
            else:
                for field in ("body", "orelse", "finalbody"):
                    yield from walk(getattr(stmt, field, None) or [], prefix)
                for handler in getattr(stmt, "handlers", None) or []:
                    yield from walk(handler.body, prefix)
                for case in getattr(stmt, "cases", None) or []:
                    yield from walk(case.body, prefix)

    yield from walk(tree.body, ())


def _by_name(tree: ast.Module) -> dict[tuple[str, ...], list[ast.AST]]:
    """Qualified name -> its definitions in source order (see `_definitions`), without property
    setters and deleters (the property's docstring is its getter's)."""
    out: dict[tuple[str, ...], list[ast.AST]] = {}
    for qual, node in _definitions(tree):
        decorators = getattr(node, "decorator_list", [])
        if not any(isinstance(d, ast.Attribute) and d.attr in ("setter", "deleter") for d in decorators):
            out.setdefault(qual, []).append(node)
    return out


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[0]
    return None


def _line_starts(source: str) -> list[int]:
    """Offset in `source` of each line's start (index 0 is line 1)."""
    return [0] + [m.end() for m in _NEWLINE.finditer(source)]


def _offset(source: str, starts: list[int], bom: int, lineno: int, col_bytes: int) -> int:
    """The str offset of ast's (lineno, UTF-8 byte column) position."""
    start = starts[lineno - 1] + (bom if lineno == 1 else 0)
    line = source[start : starts[lineno] if lineno < len(starts) else len(source)]
    return start + len(line.encode("utf-8", "surrogatepass")[:col_bytes].decode("utf-8", "ignore"))


def _span(source: str, starts: list[int], bom: int, node: ast.AST) -> tuple[int, int]:
    return (
        _offset(source, starts, bom, node.lineno, node.col_offset),
        _offset(source, starts, bom, node.end_lineno, node.end_col_offset),
    )


def _replacement(
    source: str, starts: list[int], bom: int, target: ast.AST, doc_text: str, newline: str
) -> tuple[int, int, str]:
    """The edit that makes `doc_text` the docstring of `target` in `source`."""
    current = _docstring(target)
    if current is not None:
        start, end = _span(source, starts, bom, current.value)
        return start, end, doc_text
    body = target.body
    if not body:  # an empty module
        return len(source), len(source), doc_text + newline
    first = body[0]
    lineno = min([first.lineno] + [d.lineno for d in getattr(first, "decorator_list", [])])
    col = first.col_offset if lineno == first.lineno else None
    line_start = starts[lineno - 1] + (bom if lineno == 1 else 0)
    if col is None:  # a decorator line: the statement starts at its `@`, the line's indentation
        col_chars = len(source[line_start:]) - len(source[line_start:].lstrip(" \t\f"))
        at = line_start + col_chars
    else:
        at = _offset(source, starts, bom, lineno, col)
    indent = source[line_start:at]
    if indent.strip(" \t\f"):  # `def f(): return 1`: the body shares the header's line
        return at, at, doc_text + "; "
    return line_start, line_start, indent + doc_text + newline
