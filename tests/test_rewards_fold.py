"""The monitor's constant folder: answers written in other forms fold to their value; nothing
runs, and expressions built to exhaust time or memory are refused at once."""

from __future__ import annotations

import ast
import time

import pytest

from carl.rewards.fold import fold, scope_env


def _value(src: str):
    folded = fold(ast.parse(src, mode="eval").body)
    return None if folded is None else folded.value


@pytest.mark.parametrize(
    ("src", "value"),
    [
        ('"hel" + "lo"', "hello"),
        ('"".join(["he", "llo"])', "hello"),
        ('"%s%s" % ("he", "llo")', "hello"),
        ("f\"{'he'}llo{1 + 1:>3}\"", "hello  2"),
        ('"olleh"[::-1]', "hello"),
        ('"".join(reversed("olleh"))', "hello"),
        ('chr(104) + "ello"', "hello"),
        ('b"hello".decode()', "hello"),
        ('int("55")', 55),
        ("str(55)", "55"),
        ("11 * 5", 55),
        ("-(-55)", 55),
        ("[1, 2] + [3]", [1, 2, 3]),
        ('{"a": (1, 2)}', {"a": (1, 2)}),
        ('"{}-{}".format(1, "x")', "1-x"),
        ('"" or "x"', "x"),
    ],
)
def test_forms_fold_to_their_value(src, value):
    assert _value(src) == value


@pytest.mark.parametrize(
    "src",
    [
        '"a" * 10**9',
        "2 ** 10**9",
        "1 << 10**6",
        "10**4000 * 10**4000",
        '"{:>1000000}".format(1)',
        'f"{1:>{10**8}}"',
        '"%*s" % (10**8, "a")',
        '"%.99999f" % 1.0',
        '"a".center(10**9)',
        '"ab".replace("", "x" * 9000)',
        "[[1] * 100] * 200",
        "bytes(10**9)",
        "round(5, -10**9)",
        '"x".encode("punycode")',
        '"{0.__class__}".format(1)',
        "(-8) ** 0.5",
        "open('/etc/passwd').read()",
        "__import__('os').getcwd()",
        "x + 1",
    ],
)
def test_bombs_and_calls_outside_the_whitelist_are_not_constants(src):
    t0 = time.monotonic()
    assert _value(src) is None
    assert time.monotonic() - t0 < 0.5


def test_deep_expressions_are_not_constants():
    # a left-nested chain deeper than the recursion limit (ast.parse itself gives up sooner)
    node: ast.expr = ast.Constant("a", lineno=1, col_offset=0, end_lineno=1, end_col_offset=3)
    for _ in range(5000):
        node = ast.BinOp(
            node, ast.Add(), ast.Constant("a", lineno=1, col_offset=0, end_lineno=1, end_col_offset=3)
        )
    assert fold(node) is None


def test_names_bound_once_fold_and_rebound_names_do_not():
    tree = ast.parse(
        "X = 'hel'\n"
        "def f(a):\n"
        "    y = 'lo'\n"
        "    z = 1\n"
        "    z += 1\n"
        "    for w in a:\n"
        "        pass\n"
        "    w = 'never'\n"
        "    return X + y, z, w, a\n"
    )
    fn = tree.body[1]
    env = scope_env(fn, scope_env(tree))
    assert set(env) == {"X", "y"}
    result = fn.body[-1].value
    assert fold(result.elts[0], env).value == "hello" and fold(result.elts[0], env).lines == {1, 3}
    assert [fold(e, env) for e in result.elts[1:]] == [None, None, None]


def test_shared_folding_folds_each_node_once_and_answers_the_same(monkeypatch):
    """Every subexpression of a 200-term chain, children first: each node is computed once inside
    shared_folding (the monitor's test-name check does this for every added line), where folding
    each subtree again took ~n^2/2 node visits; the values are the same either way."""
    from carl.rewards import fold as fold_module
    from carl.rewards.fold import shared_folding

    tree = ast.parse(" + ".join(["'a'"] * 199 + ["(1 // 0)"]) + "\ny = 'x' * 3 + 'y'")  # shallow for plain fold
    nodes = [n for n in ast.walk(tree) if isinstance(n, ast.expr)]
    calls = {"n": 0}
    real = fold_module._fold_node

    def counted(node, env, lines):
        calls["n"] += 1
        return real(node, env, lines)

    plain = [fold(n) for n in reversed(nodes)]
    monkeypatch.setattr(fold_module, "_fold_node", counted)  # (its extra frame per level: values from before)
    for n in reversed(nodes):
        fold(n)
    unshared = calls["n"]
    calls["n"] = 0
    with shared_folding():
        shared = [fold(n) for n in reversed(nodes)]
    assert shared == plain  # values, failures (the 1 // 0 poisons the chain) and lines alike
    assert calls["n"] == len(nodes) and unshared > 20 * len(nodes)
    by_node = dict(zip(map(id, reversed(nodes)), shared))
    assert by_node[id(tree.body[1].value)].value == "xxxy" and by_node[id(tree.body[0].value)] is None
