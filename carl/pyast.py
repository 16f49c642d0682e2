"""`ast.parse` that is safe to call from several threads at once.

CPython 3.11 keeps the counter the AST constructor uses to bound its recursion in interpreter-wide
state. When two threads build trees at the same time (a thread switch happens inside the
constructor whenever a garbage collection runs a finalizer), one of them fails with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905). carl parses from
several threads (the validation workers of `carl tasks build`, parallel tool calls, reward
workers), so every parse in carl goes through this one lock. Parsing is a few milliseconds per
file; the lock costs nothing measurable.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str | bytes, filename: str = "<unknown>", mode: str = "exec") -> ast.AST:
    """`ast.parse(source, filename, mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, filename=filename, mode=mode)
