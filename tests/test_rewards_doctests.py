"""Doctests are tests: which node ids are doctests, and docstring examples put back verbatim."""

from __future__ import annotations

import ast
import doctest

import pytest

from carl.tasks.doctests import doctest_files, doctest_object, is_doctest_id, restore_doctests

ORIGINAL = '''"""Math helpers.

>>> double(2)
4
"""
import functools


def double(x):
    """Twice x.

    >>> double(21)
    42
    """
    raise NotImplementedError


def plain(x):
    """No examples here."""
    return x
'''


@pytest.mark.parametrize(
    ("node_id", "expected"),
    [
        ("src/pkg/mod.py::pkg.mod.func", True),
        ("pkg/mod.py::pkg.mod", True),  # the module docstring
        ("pkg/mod.py::pkg.mod.Class.method", True),
        ("pkg/__init__.py::pkg", True),
        ("mod.py::mod", True),  # a top-level module's docstring
        ("src/pkg/mod.py::src.pkg.mod.func", True),  # --import-mode=importlib names
        ("README.rst::README.rst", True),
        ("docs/x.txt::x.txt", True),
        ("tests/test_x.py::test_f", False),
        ("tests/test_x.py::TestC::test_m", False),
        ("tests/test_x.py::test_f[1.5-a.b]", False),
        ("tests/test_x.py::TestC::test_m[x.y]", False),
        ("tests/test_x.py", False),
    ],
)
def test_is_doctest_id(node_id, expected):
    assert is_doctest_id(node_id) is expected


def test_doctest_files_splits_python_and_text():
    ids = ["src/pkg/mod.py::pkg.mod.func", "src/pkg/mod.py::pkg.mod", "pkg/__init__.py::pkg.helper",
           "README.rst::README.rst", "docs/x.txt::x.txt", "tests/test_x.py::test_f[1.5]"]  # fmt: skip
    assert doctest_files(ids) == ({"src/pkg/mod.py", "pkg/__init__.py"}, {"README.rst", "docs/x.txt"})
    assert doctest_files([]) == (set(), set())


@pytest.mark.parametrize(
    ("node_id", "qual"),
    [
        ("src/pkg/mod.py::pkg.mod", []),
        ("src/pkg/mod.py::pkg.mod.Class.method", ["Class", "method"]),
        ("pkg/__init__.py::pkg.helper", ["helper"]),
        ("src/pkg/mod.py::src.pkg.mod.f", ["f"]),
        ("README.rst::README.rst", None),
        ("tests/test_x.py::test_f", None),
    ],
)
def test_doctest_object(node_id, qual):
    assert doctest_object(node_id) == qual


def _examples(source: str, *qual: str) -> list[tuple[str, str]]:
    """(source, want) of the doctest examples of the docstring at `qual` (module if empty)."""
    node: ast.AST = ast.parse(source)
    for name in qual:
        node = next(n for n in ast.walk(node) if getattr(n, "name", None) == name)
    doc = ast.get_docstring(node, clean=True) or ""
    return [(e.source, e.want) for e in doctest.DocTestParser().get_examples(doc)]


def test_trivial_expected_output_is_restored():
    edited = ORIGINAL.replace("    >>> double(21)\n    42\n", "    >>> 1\n    1\n").replace(
        "raise NotImplementedError", "return x * 2"
    )
    assert restore_doctests(ORIGINAL, edited) == ORIGINAL.replace("raise NotImplementedError", "return x * 2")


def test_deleted_docstring_is_inserted_back():
    edited = ORIGINAL.replace('    """Twice x.\n\n    >>> double(21)\n    42\n    """\n', "")
    restored = restore_doctests(ORIGINAL, edited)
    assert restored == ORIGINAL
    deleted_module_doc = ORIGINAL[ORIGINAL.index("import functools") :]
    assert restore_doctests(ORIGINAL, deleted_module_doc) == ORIGINAL


def test_rewritten_body_and_docstring_keep_the_body():
    edited = ORIGINAL.replace(
        '    """Twice x.\n\n    >>> double(21)\n    42\n    """\n    raise NotImplementedError\n',
        '    """Twice x (rewritten).\n\n    >>> double(0)\n    0\n    """\n    y = x + x\n    return y\n',
    )
    restored = restore_doctests(ORIGINAL, edited)
    assert "    y = x + x\n    return y\n" in restored
    assert _examples(restored, "double") == [("double(21)\n", "42\n")]
    assert restored == edited.replace(
        "Twice x (rewritten).\n\n    >>> double(0)\n    0\n", "Twice x.\n\n    >>> double(21)\n    42\n"
    )


def test_docstrings_without_examples_and_gone_objects_are_left_alone():
    edited = ORIGINAL.replace('"""No examples here."""', '"""Identity."""').replace(
        'def double(x):\n    """Twice x.\n\n    >>> double(21)\n    42\n    """\n    raise NotImplementedError\n',
        "",
    )
    assert restore_doctests(ORIGINAL, edited) == edited  # the module docstring is unchanged too


def test_classes_methods_nested_decorated_async():
    original = '''class Outer:
    r"""Outer \\d.

    >>> Outer().total()
    3
    """

    class Inner:
        \'\'\'Inner.

        >>> Outer.Inner.NAME
        'in'
        \'\'\'
        NAME = "in"

    @staticmethod
    @functools.cache
    def total():
        u"""Sum.

        >>> Outer.total()
        3
        """
        return 3

    async def fetch(self):
        """Fetch.

        >>> import asyncio; asyncio.run(Outer().fetch())
        'ok'
        """
        return "ok"
'''
    edited = '''class Outer:
    """Outer."""

    class Inner:
        NAME = "in"

    @staticmethod
    @functools.cache
    def total():
        return 1 + 2

    async def fetch(self):
        """Fetch.

        >>> 1
        1
        """
        return "ok"
'''
    restored = restore_doctests(original, edited)
    ast.parse(restored)
    assert (
        restored
        == '''class Outer:
    r"""Outer \\d.

    >>> Outer().total()
    3
    """

    class Inner:
        \'\'\'Inner.

        >>> Outer.Inner.NAME
        'in'
        \'\'\'
        NAME = "in"

    @staticmethod
    @functools.cache
    def total():
        u"""Sum.

        >>> Outer.total()
        3
        """
        return 1 + 2

    async def fetch(self):
        """Fetch.

        >>> import asyncio; asyncio.run(Outer().fetch())
        'ok'
        """
        return "ok"
'''
    )


def test_one_line_defs_tabs_escapes_and_line_endings():
    original = 'def f(): "f(1) == 1\\n>>> f()\\n1\\n"; return 1\n\nclass C:\n\tdef g(self):\n\t\t""">>> 2\n\t\t2\n\t\t"""\n'
    edited = "def f(): return 1 + 0\n\nclass C:\n\tdef g(self):\n\t\treturn 2\n"
    restored = restore_doctests(original, edited)
    assert restored == (
        'def f(): "f(1) == 1\\n>>> f()\\n1\\n"; return 1 + 0\n\nclass C:\n\tdef g(self):\n'
        '\t\t""">>> 2\n\t\t2\n\t\t"""\n\t\treturn 2\n'
    )
    crlf = restore_doctests(ORIGINAL.replace("\n", "\r\n"), edited_crlf := ORIGINAL.replace("\n", "\r\n").replace(
        "    >>> double(21)\r\n    42\r\n", ""))  # fmt: skip
    assert crlf == ORIGINAL.replace("\n", "\r\n") and edited_crlf != crlf


def test_non_ascii_and_bom_keep_positions():
    original = '\ufeffdef f():\n    """Größe: ü.\n\n    >>> f()\n    \'ä\'\n    """\n    return "ä"\n'
    edited = '\ufeffdef f():\n    """Größe: ü.\n\n    >>> 1\n    1\n    """\n    return "ä" + ""\n'
    assert restore_doctests(original, edited) == original.replace('return "ä"', 'return "ä" + ""')


def test_the_rest_stays_byte_identical():
    edited = ORIGINAL.replace("    >>> double(21)\n    42\n", "").replace(
        "import functools\n", "import functools  # noqa\r\n\n\n\nX = 'tab\\there'\t\n"
    )
    restored = restore_doctests(ORIGINAL, edited)
    assert restored == edited.replace("Twice x.\n\n    ", "Twice x.\n\n    >>> double(21)\n    42\n    ")


def test_unparsable_sources_are_returned_unchanged():
    broken = "def double(x):\n    return (\n"
    assert restore_doctests(ORIGINAL, broken) == broken
    assert restore_doctests(broken, ORIGINAL) == ORIGINAL


def test_redefinitions_match_in_order():
    original = 'class P:\n    @property\n    def x(self):\n        """>>> P().x\n        1\n        """\n        return 1\n\n    @x.setter\n    def x(self, v):\n        pass\n'
    edited = 'class P:\n    @property\n    def x(self):\n        """>>> 5\n        5\n        """\n        return 1\n\n    @x.setter\n    def x(self, v):\n        pass\n'
    assert restore_doctests(original, edited) == original


def test_statement_says_doctests_are_restored(tmp_path):
    from carl.tasks.definitions import Definition
    from carl.tasks.delete import Candidate
    from carl.tasks.statement import template_statement

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(ORIGINAL)
    d = Definition("pkg/mod.py", "pkg.mod", "double", "function", 9, 15, 15, "    ")
    cand = Candidate("function", (d,), frozenset())
    plain = template_statement(tmp_path, cand, "stub", ["tests/test_mod.py::test_double"])
    assert "`pkg.mod.double` in `pkg/mod.py`: `def double(x)`" in plain and "octest" not in plain
    for f2p, p2p in [
        (["pkg/mod.py::pkg.mod.double"], []),
        (["tests/test_mod.py::test_double"], ["README.rst::README.rst"]),
    ]:
        text = template_statement(tmp_path, cand, "stub", f2p, pass_to_pass=p2p)
        assert "Doctest examples in docstrings and documentation files are tests too" in text


def test_a_second_definition_cannot_hide_the_doctest():
    """doctest tests the object the module ends up with: a later `def` of the same name (or one
    under `if False:`) must carry the original examples too."""
    trivial = 'def double(x):\n    """>>> 1\n    1\n    """\n    return x * 2\n'
    for extra in (trivial, "if False:\n" + "".join("    " + ln + "\n" for ln in trivial.splitlines())):
        edited = ORIGINAL.replace("raise NotImplementedError", "return x * 2") + "\n\n" + extra
        restored = restore_doctests(ORIGINAL, edited)
        assert ">>> 1\n" not in restored and restored.count(">>> double(21)") == 2
        ast.parse(restored)
