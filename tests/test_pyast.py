"""carl.pyast.parse holds when many threads parse while garbage collection runs finalizers.

On CPython 3.11 a plain `ast.parse` from several threads fails now and then with
`SystemError: AST constructor recursion depth mismatch` (python/cpython#106905): CI hit it in the
validation workers of `carl tasks build`. This probe makes the race likely (a thread making
cyclic garbage with finalizers, a tiny switch interval) and asks that no parse fails.
"""

from __future__ import annotations

import gc
import sys
import threading

from carl import pyast

SOURCE = "\n".join(
    f"def f{i}(x):\n    return [(a, b) for a in range(x) if a % 3 for b in {{1: 2}}]\n" for i in range(200)
)


class _Cyclic:
    def __init__(self):
        self.me = self

    def __del__(self):  # Python code run inside a collection: the interpreter may switch threads here
        for _ in range(20):
            pass


def _hammer(parse, threads: int = 4, parses: int = 25) -> list[str]:
    errors: list[str] = []
    stop = threading.Event()

    def junk():  # bounded: while one collection runs, garbage made meanwhile waits for the next
        for _ in range(5_000):
            if stop.is_set():
                return
            for _ in range(100):
                _Cyclic()
            gc.collect(0)

    def work():
        for _ in range(parses):
            try:
                parse(SOURCE)
            except SystemError as e:
                errors.append(str(e))

    old_threshold, old_interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(100, 1, 1)
    sys.setswitchinterval(1e-6)
    try:
        junk_thread = threading.Thread(target=junk)
        junk_thread.start()
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        stop.set()
        junk_thread.join()
    finally:
        gc.set_threshold(*old_threshold)
        sys.setswitchinterval(old_interval)
    return errors


def test_parse_from_many_threads_never_fails():
    assert _hammer(pyast.parse) == []


def test_parse_returns_the_same_tree_as_ast_parse():
    import ast

    src = "x = 1\nif x:\n    y = [i for i in range(3)]\n"
    assert ast.dump(pyast.parse(src)) == ast.dump(ast.parse(src))
    assert isinstance(pyast.parse("1 + 2", mode="eval"), ast.Expression)
