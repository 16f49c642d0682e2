"""A safe constant folder over Python ASTs: the value an expression of constants computes,
found without running it. The monitor compares these values with the failing tests' expected
values, so that an answer written in another form is still recognised:

    "hel" + "lo"   "".join(["he", "llo"])   "%s%s" % ("he", "llo")   f"{'he'}llo"   "olleh"[::-1]
    chr(104) + "ello"   b"hello".decode()   int("55")   str(55)   11 * 5   [1, 2, 3]   {"a": 1}
    x = "hel"; y = "lo"; return x + y      (names bound once, by a plain assignment, in a scope)

No eval or exec: only whitelisted operators, a few pure builtins and str/bytes methods run, on
str, bytes, int, float, bool, None and tuples, lists, sets and dicts of those. Sizes are checked
before an operation can allocate: a value over MAX_SIZE characters/items (nested ones counted)
or an int over MAX_BITS bits is not a constant here, nor is anything that raises.

Not covered: names bound more than once or inside a branch or loop, attributes (`self.x`,
`string.digits`), closures (a nested function sees the module's names only), comprehensions,
any call outside the whitelist.
"""

from __future__ import annotations

import ast
import contextlib
import contextvars
import operator
import re
import types
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

MAX_SIZE = 10_000
"""Characters of a str/bytes plus items of containers, nested ones included."""
MAX_BITS = 4096
"""Bits of an int."""

_SCALARS = (str, bytes, int, float, bool, type(None))
_CONTAINERS = (tuple, list, set, frozenset, dict)
_BINOPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
    ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
    ast.BitXor: operator.xor, ast.BitAnd: operator.and_,
}  # fmt: skip
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}
_BUILTINS = {
    "chr": chr, "ord": ord, "str": str, "int": int, "float": float, "bool": bool, "len": len, "abs": abs,
    "round": round, "min": min, "max": max, "sum": sum, "sorted": sorted, "list": list, "tuple": tuple,
    "set": set, "frozenset": frozenset, "repr": repr, "ascii": ascii, "hex": hex, "oct": oct, "bin": bin,
    "divmod": divmod, "bytes": bytes, "reversed": lambda v: list(reversed(v)),
}  # fmt: skip
_METHODS = frozenset(
    "join upper lower strip lstrip rstrip replace format decode encode title capitalize swapcase casefold "
    "removeprefix removesuffix split rsplit splitlines zfill center ljust rjust startswith endswith count "
    "find rfind index rindex partition rpartition".split()
)
_WIDTH_METHODS = frozenset({"zfill", "center", "ljust", "rjust"})
_CODECS = frozenset({"utf-8", "utf8", "ascii", "latin-1", "latin1", "iso-8859-1", "utf-16", "utf-32"})
_BIG_NUMBER = re.compile(r"\d{5,}")  # a width or precision of 10000 or more in a format
_FORMAT_FIELD_ACCESS = re.compile(r"\{[^{}]*[.\[{]")  # "{0.attr}", "{0[k]}", "{:{}}" (nested width)


@dataclass(frozen=True)
class Folded:
    value: Any
    lines: frozenset[int]
    """Source lines of the constants and name bindings the value was computed from."""


class NotConstant(Exception):
    pass


def fold(node: ast.AST, env: Mapping[str, Folded] | None = None) -> Folded | None:
    """The constant value of expression `node` (names looked up in `env`), or None."""
    lines: set[int] = set()
    try:
        value = _fold(node, env or _NO_NAMES, lines)
    except (NotConstant, RecursionError):
        return None
    except Exception:  # a whitelisted operation that failed on these values: not a constant
        return None
    return Folded(value, frozenset(lines))


def size(value: Any, limit: int = MAX_SIZE) -> int:
    """Characters plus items of `value`, nested ones included; stops counting past `limit`."""
    total, stack = 0, [value]
    while stack and total <= limit:
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v)
        elif isinstance(v, dict):
            total += len(v)
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, (tuple, list, set, frozenset)):
            total += len(v)
            stack += list(v)
        else:
            total += 1
    return total


def leaves(value: Any) -> Iterator[Any]:
    """`value` and, for a container, every item (and dict key) inside it, recursively."""
    stack = [value]
    while stack:
        v = stack.pop()
        yield v
        if isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, (tuple, list, set, frozenset)):
            stack += list(v)


def scope_env(scope: ast.AST, outer: Mapping[str, Folded] | None = None) -> dict[str, Folded]:
    """The names of `scope` (a module, function or lambda) with a constant value: those bound
    exactly once in it, by a plain assignment among its top-level statements (`x = ...`,
    `x: T = ...`, `a, b = 1, 2`), in order; plus the names of `outer` it does not bind itself."""
    counts = _binding_counts(scope)
    env = {k: v for k, v in (outer or {}).items() if counts[k] == 0}
    body = getattr(scope, "body", None)
    for stmt in body if isinstance(body, list) else []:
        stmt_lines = set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
        for name, value in _plain_bindings(stmt):
            if counts[name] != 1:
                continue
            folded = fold(value, env)
            if folded is not None:
                env[name] = Folded(folded.value, folded.lines | stmt_lines)
    return env


def scoped_nodes(tree: ast.AST) -> Iterator[tuple[ast.AST, Mapping[str, Folded]]]:
    """Every node of `tree` with the names it sees (carl.rewards.fold.scope_env): a function's
    or lambda's own names over the module's."""
    module_env = scope_env(tree) if isinstance(tree, ast.Module) else {}
    stack: list[tuple[ast.AST, Mapping[str, Folded]]] = [(tree, module_env)]
    while stack:
        node, env = stack.pop()
        yield node, env
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                stack.append((child, scope_env(child, module_env)))
            else:
                stack.append((child, env))


# ------------------------------------------------------------------------------ internals


_NO_NAMES: Mapping[str, Folded] = types.MappingProxyType({})  # one object: shared folding keys on it
_MEMO: contextvars.ContextVar[dict | None] = contextvars.ContextVar("carl_fold_memo", default=None)
_FAILED = object()


@contextlib.contextmanager
def shared_folding() -> Iterator[None]:
    """Inside it, fold() computes each (node, scope) once and reuses it. Folding every
    subexpression of one tree children first then costs the tree's size: without it, a hostile
    2,000-term `1+1+...` cost the monitor about 9 s (each of its nodes folded its whole subtree
    again, near the recursion limit), and much more in a file of many such lines."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def _fold(node: ast.AST, env: Mapping[str, Folded], lines: set[int]) -> Any:
    memo = _MEMO.get()
    if memo is None:
        return _fold_node(node, env, lines)
    key = (id(node), id(env))  # each entry holds its node and env, so no id is reused while it lives
    if key not in memo:
        own: set[int] = set()
        try:
            memo[key] = (node, env, _fold_node(node, env, own), frozenset(own))
        except (RecursionError, MemoryError):
            raise  # depends on the stack, not the node: fold() answers None, nothing is kept
        except Exception:  # NotConstant, or a whitelisted operation that failed on these values
            memo[key] = (node, env, _FAILED, frozenset())
    _, _, value, used = memo[key]
    if value is _FAILED:
        raise NotConstant
    lines.update(used)
    return value


def _fold_node(node: ast.AST, env: Mapping[str, Folded], lines: set[int]) -> Any:
    if isinstance(node, ast.Constant):
        if not isinstance(node.value, _SCALARS):
            raise NotConstant  # complex, Ellipsis
        lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
        return _bounded(node.value)
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise NotConstant
        lines.update(env[node.id].lines)
        return env[node.id].value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        if len(node.elts) > MAX_SIZE:
            raise NotConstant
        items = [_fold(e, env, lines) for e in node.elts]  # a Starred item is not constant
        kind = {ast.Tuple: tuple, ast.List: list, ast.Set: set}[type(node)]
        return _bounded(kind(items))
    if isinstance(node, ast.Dict):
        if len(node.keys) > MAX_SIZE or any(k is None for k in node.keys):  # `**other`
            raise NotConstant
        return _bounded({_fold(k, env, lines): _fold(v, env, lines) for k, v in zip(node.keys, node.values)})
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _fold(node.left, env, lines), _fold(node.right, env, lines)
        _check_binop(node.op, left, right)
        return _bounded(_BINOPS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp):
        return _bounded(_UNARY[type(node.op)](_fold(node.operand, env, lines)))
    if isinstance(node, ast.BoolOp):
        value = _fold(node.values[0], env, lines)
        for other in node.values[1:]:
            if bool(value) == isinstance(node.op, ast.Or):
                break
            value = _fold(other, env, lines)
        return value
    if isinstance(node, ast.JoinedStr):
        return _bounded("".join(_fold_fstring_part(v, env, lines) for v in node.values))
    if isinstance(node, ast.Subscript):
        value = _fold(node.value, env, lines)
        if not isinstance(value, (str, bytes, tuple, list, dict)):
            raise NotConstant
        return _bounded(value[_fold_index(node.slice, env, lines)])
    if isinstance(node, ast.Call):
        return _bounded(_fold_call(node, env, lines))
    raise NotConstant


def _fold_fstring_part(node: ast.AST, env: Mapping[str, Folded], lines: set[int]) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if not isinstance(node, ast.FormattedValue):
        raise NotConstant
    value = _fold(node.value, env, lines)
    value = {-1: lambda v: v, 115: str, 114: repr, 97: ascii}[node.conversion](value)
    spec = _fold(node.format_spec, env, lines) if node.format_spec is not None else ""
    if _BIG_NUMBER.search(spec):
        raise NotConstant
    return format(value, spec)


def _fold_index(node: ast.AST, env: Mapping[str, Folded], lines: set[int]) -> Any:
    if isinstance(node, ast.Slice):
        parts = [None if p is None else _fold(p, env, lines) for p in (node.lower, node.upper, node.step)]
        if not all(p is None or (isinstance(p, int) and not isinstance(p, bool)) for p in parts):
            raise NotConstant
        return slice(*parts)
    return _fold(node, env, lines)


def _fold_call(node: ast.Call, env: Mapping[str, Folded], lines: set[int]) -> Any:
    args = [_fold(a, env, lines) for a in node.args]
    if any(k.arg is None for k in node.keywords):  # **kwargs
        raise NotConstant
    kwargs = {k.arg: _fold(k.value, env, lines) for k in node.keywords}
    func = node.func
    if isinstance(func, ast.Name) and func.id in _BUILTINS and func.id not in env:
        if func.id == "bytes" and args and isinstance(args[0], int):
            raise NotConstant  # bytes(10**9) allocates
        if func.id == "round" and len(args) > 1 and not (isinstance(args[1], int) and abs(args[1]) <= 1000):
            raise NotConstant  # round(5, -10**9) computes 10**(10**9)
        return _BUILTINS[func.id](*args, **kwargs)
    if isinstance(func, ast.Attribute) and func.attr in _METHODS:
        target = _fold(func.value, env, lines)
        if not isinstance(target, (str, bytes)):
            raise NotConstant
        _check_method(func.attr, target, args, kwargs)
        return getattr(target, func.attr)(*args, **kwargs)
    raise NotConstant


def _check_binop(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse an operation whose result could be too big to build at all."""
    ints = all(isinstance(v, int) for v in (left, right))
    if isinstance(op, ast.Mult):
        if ints and left.bit_length() + right.bit_length() > MAX_BITS:
            raise NotConstant
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, bytes, tuple, list)) and isinstance(n, int) and size(seq) * n > MAX_SIZE:
                raise NotConstant
    elif isinstance(op, ast.Pow) and ints and right > 0 and left.bit_length() * right > MAX_BITS:
        raise NotConstant
    elif isinstance(op, ast.LShift) and ints and left.bit_length() + right > MAX_BITS:
        raise NotConstant
    elif isinstance(op, ast.Mod) and isinstance(left, (str, bytes)):
        fmt = left if isinstance(left, str) else left.decode("latin-1")
        if "*" in fmt or _BIG_NUMBER.search(fmt):
            raise NotConstant


def _check_method(name: str, target: str | bytes, args: list, kwargs: dict) -> None:
    if name in _WIDTH_METHODS and any(isinstance(a, int) and a > MAX_SIZE for a in [*args, *kwargs.values()]):
        raise NotConstant
    if name == "replace" and len(args) >= 2 and (len(target) + 1) * max(size(args[1]), 1) > MAX_SIZE:
        raise NotConstant
    if name == "join" and args and size(target) * size(args[0]) > MAX_SIZE:
        raise NotConstant
    if name in ("encode", "decode"):
        codec = (args[0] if args else kwargs.get("encoding", "utf-8")).lower().replace("_", "-")
        if codec not in _CODECS:  # some codecs are slow (punycode is quadratic)
            raise NotConstant
    if name == "format":
        fmt = target if isinstance(target, str) else ""
        if _FORMAT_FIELD_ACCESS.search(fmt) or _BIG_NUMBER.search(fmt):
            raise NotConstant


def _bounded(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > MAX_BITS:
        raise NotConstant
    if not isinstance(value, (*_SCALARS, *_CONTAINERS)) or size(value) > MAX_SIZE:
        raise NotConstant
    return value


def _plain_bindings(stmt: ast.stmt) -> Iterator[tuple[str, ast.expr]]:
    """(name, value expression) of a plain assignment statement."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        if isinstance(target, ast.Name):
            yield target.id, stmt.value
        elif (
            isinstance(target, ast.Tuple)
            and isinstance(stmt.value, (ast.Tuple, ast.List))
            and len(target.elts) == len(stmt.value.elts)
            and all(isinstance(t, ast.Name) for t in target.elts)
            and not any(isinstance(v, ast.Starred) for v in stmt.value.elts)
        ):
            yield from ((t.id, v) for t, v in zip(target.elts, stmt.value.elts))
    elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
        yield stmt.target.id, stmt.value


def _binding_counts(scope: ast.AST) -> Counter[str]:
    """How often each name is bound in `scope` itself (nested functions and classes count with
    their own name only); names declared global or nonlocal anywhere below count as rebound."""
    counts: Counter[str] = Counter()
    args = getattr(scope, "args", None)
    if isinstance(args, ast.arguments):
        for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
            if a is not None:
                counts[a.arg] += 1
    body = getattr(scope, "body", [])
    stack = list(body) if isinstance(body, list) else [body]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            counts[node.name] += 1
            if isinstance(scope, ast.Module):  # `global x` inside a function rebinds a module name
                for inner in ast.walk(node):
                    if isinstance(inner, ast.Global):
                        counts.update({n: 2 for n in inner.names})
            continue
        if isinstance(node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            counts[node.id] += 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            counts.update({n: 2 for n in node.names})
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            counts.update((a.asname or a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            counts[node.name] += 1
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            counts[node.name] += 1
        elif isinstance(node, ast.MatchMapping) and node.rest:
            counts[node.rest] += 1
        stack.extend(ast.iter_child_nodes(node))
    return counts
