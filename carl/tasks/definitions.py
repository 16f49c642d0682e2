"""Definitions of a package found with `ast`: functions, classes, methods, and their line ranges.

Line numbers are 1-based and inclusive. `start` includes decorators. `body_start` is the first
line a stub replaces (the first statement after the docstring), 0 when the definition cannot be
stubbed (one-line body, body already trivial, body starting on the header's line).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from carl import pyast


@dataclass(frozen=True)
class Definition:
    file: str
    """Repo-relative path of the defining file."""
    module: str
    """Dotted module name."""
    qualname: str
    """`func`, `Cls` or `Cls.meth`."""
    kind: str
    """"function", "method" or "class"."""
    start: int
    end: int
    body_start: int
    body_indent: str

    @property
    def key(self) -> str:
        """How per-test coverage names it: `path::qualname`."""
        return f"{self.file}::{self.qualname}"

    @property
    def symbol(self) -> str:
        return f"{self.module}:{self.qualname}"

    @property
    def lines(self) -> int:
        return self.end - self.start + 1


def parse_definitions(root: Path, rel: str, module: str) -> list[Definition]:
    """Top-level functions and classes of a file, and the methods of its top-level classes."""
    source = (root / rel).read_bytes()
    try:
        tree = pyast.parse(source, filename=rel)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    out: list[Definition] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append(_definition(node, rel, module, node.name, "function", lines))
        elif isinstance(node, ast.ClassDef):
            out.append(_definition(node, rel, module, node.name, "class", lines))
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append(_definition(sub, rel, module, f"{node.name}.{sub.name}", "method", lines))
    return out


def _definition(node, rel: str, module: str, qualname: str, kind: str, lines: list[bytes]) -> Definition:
    start = min([node.lineno] + [d.lineno for d in node.decorator_list])
    body_start, indent = 0, ""
    if kind != "class":
        body_start, indent = _stub_point(node, lines)
    return Definition(rel, module, qualname, kind, start, node.end_lineno, body_start, indent)


def _stub_point(node, lines: list[bytes]) -> tuple[int, str]:
    body = node.body
    if _is_docstring(body[0]):
        body = body[1:]
    if not body or all(_is_trivial(s) for s in body):
        return 0, ""
    first = body[0]
    line = lines[first.lineno - 1]
    prefix = line[: first.col_offset]
    if prefix.strip() or first.lineno <= node.lineno:
        return 0, ""  # body shares a line with the header or the docstring
    if _is_docstring(node.body[0]) and node.body[0].end_lineno >= first.lineno:
        return 0, ""
    return first.lineno, prefix.decode("utf-8", "replace")


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


def _is_trivial(stmt: ast.stmt) -> bool:
    """pass, `...`, or `raise NotImplementedError`: nothing to rebuild."""
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis:
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False
