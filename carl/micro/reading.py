"""Reading levels of the micro world (difficulty 4 and 5): what a definition does is in the repo, not
in its own docstring.

At levels 1-3 a docstring states its body ("Return x plus 3." -> `return x + 3`): a model learns to
transcribe a sentence. Here a docstring names a *rule* in words ("Return x moved up by the price
step.") and the rule's value lives elsewhere:

    level 4  reading the module: constants at the top of the same module (`PRICE_STEP = 7`) and
             sibling functions of the module (`total_price` sums `shift_price` over a list)
    level 5  reading across modules: the constants live in the package's `settings` module, which
             every other module imports (`return x + settings.PRICE_STEP`); siblings as at level 4

Bodies are one to five lines: arithmetic, a condition, a loop, a call to another function of the
repo. Every module is about one noun (`price.py` holds the price rules), so a module's constants
and functions share their noun, and the tests of a definition are the only place its expected
values appear. Everything is a pure function of the caller's random generator.
"""

from __future__ import annotations

import random
import types
from dataclasses import dataclass

from carl.micro.generate import _example, _indent


@dataclass(frozen=True)
class Rule:
    """A reading template: `{n}` is the module's noun, `{N}` its upper-case form, `{S}` the prefix of
    a setting (`""` at level 4, `"settings."` at level 5)."""

    stem: str
    params: str
    doc: str
    body: str
    arg: str  # the kind of test argument: "int", "str" or "list"
    constants: tuple[str, ...] = ()  # constant names (without the noun prefix) the body reads
    calls: str = ""  # the stem of a sibling the body calls


RULES = [
    Rule("shift", "x: int", "Return x moved up by the {n} step.", "return x + {S}{N}_STEP", "int", ("STEP",)),
    Rule("scale", "x: int", "Return x scaled by the {n} factor.", "return x * {S}{N}_FACTOR", "int", ("FACTOR",)),
    Rule("clamp", "x: int", "Return x kept within the {n} limits.",
         "if x < {S}{N}_LOW:\n    return {S}{N}_LOW\nif x > {S}{N}_HIGH:\n    return {S}{N}_HIGH\nreturn x", "int",
         ("LOW", "HIGH")),
    Rule("tag", "s: str", "Return s marked with the {n} tag.", "return {S}{N}_TAG + s", "str", ("TAG",)),
    Rule("fits", "s: str", "Return True if s is no longer than the {n} width.", "return len(s) <= {S}{N}_WIDTH",
         "str", ("WIDTH",)),
    Rule("count_over", "xs: list[int]", "Return how many items of xs are above the {n} limit.",
         "n = 0\nfor v in xs:\n    if v > {S}{N}_LIMIT:\n        n += 1\nreturn n", "list", ("LIMIT",)),
    Rule("total", "xs: list[int]", "Return the sum of shift_{n} over the items of xs.",
         "acc = 0\nfor v in xs:\n    acc += shift_{n}(v)\nreturn acc", "list", calls="shift"),
    Rule("clamp_all", "xs: list[int]", "Return the items of xs, each kept within the {n} limits, in order.",
         "return [clamp_{n}(v) for v in xs]", "list", calls="clamp"),
    Rule("tag_all", "words: list[str]", "Return the words that fit the {n} width, each marked with the {n} tag.",
         "return [tag_{n}(w) for w in words if fits_{n}(w)]", "words", calls="tag,fits"),
]
_BY_STEM = {r.stem: r for r in RULES}

NOUNS = ["price", "score", "level", "weight", "token", "label", "count", "index"]
_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]


def constant_values(rng: random.Random, noun: str) -> dict[str, object]:
    """Every constant a module about `noun` may define, drawn once per module."""
    low = rng.randint(-5, 10)
    return {"STEP": rng.randint(2, 9), "FACTOR": rng.randint(2, 7), "LOW": low, "HIGH": low + rng.randint(5, 25),
            "TAG": f"{rng.choice(_WORDS)}_", "WIDTH": rng.randint(3, 6), "LIMIT": rng.randint(0, 12)}


def pick_rules(rng: random.Random, count: int) -> list[Rule]:
    """`count` rules, plus the siblings the chosen callers need, callees first."""
    chosen = rng.sample(RULES, count)
    out: list[Rule] = []
    for rule in chosen:
        for stem in filter(None, rule.calls.split(",")):
            if _BY_STEM[stem] not in out:
                out.append(_BY_STEM[stem])
        if rule not in out:
            out.append(rule)
    return out


def module_source(rng: random.Random, package: str, noun: str, rules: list[Rule], level: int
                  ) -> tuple[str, str, list[str], dict[str, object]]:
    """(module source, its tests, the definitions' names, the constants it reads) of one module."""
    values = constant_values(rng, noun)
    used = sorted({c for r in rules for c in _constants(r)}, key=list(values).index)
    consts = {f"{noun.upper()}_{c}": values[c] for c in used}
    prefix = "settings." if level >= 5 else ""
    head = [f'"""The {noun} rules of {package}."""\n']
    if level >= 5:
        head.append(f"\nfrom {package} import settings\n")
    else:
        head.append("\n" + "".join(f"{name} = {value!r}\n" for name, value in consts.items()))
    namespace: dict = {"settings": types.SimpleNamespace(**consts), **consts}
    src, tests, names = ["".join(head)], [f"from {package} import {noun}\n"], []
    for rule in rules:
        name = f"{rule.stem}_{noun}"
        body = rule.body.format(n=noun, N=noun.upper(), S=prefix)
        code = f"def {name}({rule.params}):\n" + _indent(body, 4)
        src.append(f'\n\ndef {name}({rule.params}):\n    """{rule.doc.format(n=noun)}"""\n' + _indent(body, 4) + "\n")
        exec(code, namespace)
        lines = [f"\n\ndef test_{name}():"]
        for arg in _telling_args(rng, rule.arg, namespace[name]):
            lines.append(f"    assert {noun}.{name}({arg!r}) == {namespace[name](arg)!r}")
        tests.append("\n".join(lines) + "\n")
        names.append(name)
    return "".join(src), "".join(tests), names, consts


def settings_source(package: str, consts: dict[str, object]) -> str:
    """Level 5: the package's settings module, every module's constants in one place."""
    body = "".join(f"{name} = {value!r}\n" for name, value in sorted(consts.items()))
    return f'"""Settings of {package}: the constants its rules read."""\n\n{body}'


def _constants(rule: Rule) -> tuple[str, ...]:
    """The constants a rule reads, its callees' included."""
    callees = [_BY_STEM[s] for s in filter(None, rule.calls.split(","))]
    return rule.constants + tuple(c for r in callees for c in _constants(r))


def _telling_args(rng: random.Random, kind: str, fn, count: int = 3, tries: int = 40) -> list:
    """`count` arguments whose expected values differ where the draws allow: a test whose three
    asserts all expect True (or hit the same bound) lets a constant answer pass."""
    args, seen = [], []
    for _ in range(tries):
        arg = _words(rng) if kind == "words" else _example(rng, kind)
        if fn(arg) not in seen:
            args.append(arg)
            seen.append(fn(arg))
        if len(args) == count:
            return args
    return args + [arg] * (count - len(args))


def _words(rng: random.Random) -> list[str]:
    return ["".join(rng.choice("abcdeiou") for _ in range(rng.randint(1, 8))) for _ in range(rng.randint(1, 4))]
