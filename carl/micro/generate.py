"""The micro world: small, seeded, generated Python repositories with pytest suites.

Each repository is a package of a few modules; each module holds functions (and, at higher
difficulty, a class) with docstrings that state exactly what the code does, and one pytest
test per definition whose expected values were computed by running the generated code. The
repositories then go through the same task pipeline as real ones (carl.tasks): a definition is
deleted, and the agent must rebuild it from its docstring and the failing test.

Difficulty levels (one dial):
  1  one-line functions (arithmetic, string and list one-liners)
  2  adds small multi-line functions (loops, branches)
  3  adds a class whose methods carry state
  4  reading the module: docstrings name a rule, its value is a constant or a sibling of the module
  5  reading across modules: the constants live in the package's `settings` module
     (levels 4 and 5: carl.micro.reading)

At levels 1-3 a docstring states its function's body outright; those levels are kept so that
results measured on them stay comparable.

Everything is a pure function of (seed, difficulty): the same arguments give the same bytes.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

# Each template: (name stem, params, docstring, body, argument generators for the tests).
# `{k}`/`{m}` are filled with small integers; bodies are indented by the writer.
_ONE_LINERS = [
    ("add", "x: int", "Return x plus {k}.", "return x + {k}", ["int"]),
    ("sub", "x: int", "Return x minus {k}.", "return x - {k}", ["int"]),
    ("mul", "x: int", "Return x multiplied by {k}.", "return x * {k}", ["int"]),
    ("affine", "x: int", "Return {k} times x plus {m}.", "return {k} * x + {m}", ["int"]),
    ("mod", "x: int", "Return the remainder of x divided by {k}.", "return x % {k}", ["int"]),
    ("square_plus", "x: int", "Return x squared plus {k}.", "return x * x + {k}", ["int"]),
    ("upper", "s: str", "Return s in upper case.", "return s.upper()", ["str"]),
    ("reverse", "s: str", "Return s reversed.", "return s[::-1]", ["str"]),
    ("repeat", "s: str", "Return s repeated {k} times.", "return s * {k}", ["str"]),
    ("prefix", "s: str", "Return s with the prefix '{w}_' added.", "return '{w}_' + s", ["str"]),
    ("longer", "s: str", "Return True if s has more than {k} characters.", "return len(s) > {k}", ["str"]),
    ("total", "xs: list[int]", "Return the sum of xs plus {k}.", "return sum(xs) + {k}", ["list"]),
    ("largest", "xs: list[int]", "Return the largest item of xs, or {k} if xs is empty.",
     "return max(xs) if xs else {k}", ["list"]),
    ("evens", "xs: list[int]", "Return the items of xs that are divisible by {k}, in order.",
     "return [v for v in xs if v % {k} == 0]", ["list"]),
    ("scaled", "xs: list[int]", "Return each item of xs multiplied by {k}.", "return [v * {k} for v in xs]",
     ["list"]),
]

_MULTI_LINE = [
    ("clamp", "x: int", "Return x limited to the range [{m}, {m2}].",
     "if x < {m}:\n    return {m}\nif x > {m2}:\n    return {m2}\nreturn x", ["int"]),
    ("count_vowels", "s: str", "Return how many characters of s are vowels (aeiou, lower case).",
     "n = 0\nfor c in s:\n    if c in 'aeiou':\n        n += 1\nreturn n", ["str"]),
    ("sum_squares", "xs: list[int]", "Return the sum of the squares of the items of xs.",
     "acc = 0\nfor v in xs:\n    acc += v * v\nreturn acc", ["list"]),
    ("sign_label", "x: int", "Return 'neg' if x < 0, 'zero' if x == 0, else 'pos'.",
     "if x < 0:\n    return 'neg'\nif x == 0:\n    return 'zero'\nreturn 'pos'", ["int"]),
    ("running_max", "xs: list[int]", "Return the list of running maxima of xs.",
     "out = []\nbest = None\nfor v in xs:\n    best = v if best is None or v > best else best\n"
     "    out.append(best)\nreturn out", ["list"]),
]

LEVELS = (1, 2, 3, 4, 5)

_NOUNS = ["price", "score", "count", "level", "value", "token", "label", "weight", "index", "name"]
_MODULES = ["numbers", "text", "lists", "metrics", "records", "shapes"]
_WORDS = ["alpha", "beta", "gamma", "delta", "omega", "kappa"]


_PKG_ADJ = ["tidy", "brisk", "quiet", "amber", "lunar", "rapid", "solid", "mellow", "crisp", "nimble", "silver",
            "cobalt", "gentle", "hollow", "bright", "frozen", "golden", "humble", "jolly", "misty", "noble",
            "plain", "royal", "sunny"]
_PKG_NOUN = ["ledger", "toolkit", "parser", "engine", "atlas", "harbor", "widget", "beacon", "folio", "kernel",
             "garden", "bridge", "anchor", "canvas", "compass", "lantern", "meadow", "orbit", "pebble", "quarry",
             "signal", "timber", "vessel", "zephyr"]


def package_name(seed: int) -> str:
    """The package of repo `seed`, e.g. "amber_ledger3": a word pair the agent must copy from the task,
    distinct for any two seeds less than 5760 apart (an affine permutation of the 576 pairs, then a
    digit). Numbered names ("micro001") let a small model write a memorized warm-start repo's name
    for an unseen one (seen in RL rollouts), and the former `seed % 1000` gave the held-out repos
    (seeds 100000+) the warm-start repos' names."""
    n = seed % (10 * 576)
    pair = (n * 373 + 101) % 576  # 373 is coprime with 576: a bijection that scatters neighbouring seeds
    return f"{_PKG_ADJ[pair % 24]}_{_PKG_NOUN[pair // 24]}{n // 576}"


@dataclass(frozen=True)
class MicroRepo:
    root: Path
    package: str
    definitions: tuple[str, ...]  # qualified names, e.g. "pkg.numbers.add_price"
    difficulty: int
    seed: int


def templates_of(level: int) -> tuple[str, ...]:
    """The templates a level's tasks can have (a template is a deleted definition's name without its
    noun: `shift_price` -> shift; a class method's is its own name), in the order they are defined."""
    if level not in LEVELS:
        raise ValueError(f"difficulty: got {level!r}, expected one of {LEVELS}")
    if level >= 4:
        from carl.micro.reading import RULES

        return tuple(rule.stem for rule in RULES)
    stems = [t[0] for t in _ONE_LINERS + (_MULTI_LINE if level >= 2 else [])]
    return tuple(stems + (["reset"] if level >= 3 else []))  # a class's `add` shares the one-liner's name


def generate_repo(out_dir: str | Path, seed: int, difficulty: int = 1, num_modules: int = 2,
                  defs_per_module: int = 3) -> MicroRepo:
    """Write a micro repository into `out_dir` (created; must be empty or absent)."""
    if difficulty not in LEVELS:
        raise ValueError(f"difficulty: got {difficulty!r}, expected one of {LEVELS}")
    if not 1 <= num_modules <= len(_MODULES):
        raise ValueError(f"num_modules: got {num_modules!r}, expected 1..{len(_MODULES)}")
    root = Path(out_dir)
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"out_dir: {str(root)!r} is not empty")
    rng = random.Random(f"carl-micro-{seed}-{difficulty}")
    package = package_name(seed)
    pool = list(_ONE_LINERS) + (list(_MULTI_LINE) if difficulty >= 2 else [])
    (root / package).mkdir(parents=True)
    (root / "tests").mkdir()
    (root / package / "__init__.py").write_text(f'"""Generated micro package {package}."""\n')
    (root / "pyproject.toml").write_text(
        f'[project]\nname = "{package}"\nversion = "0.1.0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'
    )
    definitions: list[str] = []
    if difficulty >= 4:
        definitions = _write_reading_modules(rng, root, package, difficulty, num_modules, defs_per_module)
        return MicroRepo(root, package, tuple(definitions), difficulty, seed)
    for module in rng.sample(_MODULES, num_modules):
        templates = rng.sample(pool, defs_per_module)
        src, tests, names = _module_source(rng, package, module, templates)
        if difficulty >= 3:
            csrc, ctests, cname = _class_source(rng, package, module)
            src += csrc
            tests += ctests
            names.append(cname)
        (root / package / f"{module}.py").write_text(src)
        (root / "tests" / f"test_{module}.py").write_text(tests)
        definitions += [f"{package}.{module}.{n}" for n in names]
    return MicroRepo(root, package, tuple(definitions), difficulty, seed)


def _write_reading_modules(rng: random.Random, root: Path, package: str, level: int, num_modules: int,
                           defs_per_module: int) -> list[str]:
    from carl.micro import reading  # it builds on this module's helpers

    definitions: list[str] = []
    settings: dict[str, object] = {}
    for noun in rng.sample(reading.NOUNS, num_modules):
        rules = reading.pick_rules(rng, defs_per_module)
        src, tests, names, consts = reading.module_source(rng, package, noun, rules, level)
        (root / package / f"{noun}.py").write_text(src)
        (root / "tests" / f"test_{noun}.py").write_text(tests)
        definitions += [f"{package}.{noun}.{n}" for n in names]
        settings.update(consts)
    if level >= 5:
        (root / package / "settings.py").write_text(reading.settings_source(package, settings))
    return definitions


def _module_source(rng: random.Random, package: str, module: str, templates) -> tuple[str, str, list[str]]:
    src = [f'"""{module.capitalize()} helpers of {package}."""\n']
    tests = [f"from {package} import {module}\n"]
    names: list[str] = []
    used: set[str] = set()
    for stem, params, doc, body, arg_kinds in templates:
        noun = rng.choice([n for n in _NOUNS if f"{stem}_{n}" not in used])
        name = f"{stem}_{noun}"
        used.add(name)
        k, m = rng.randint(2, 9), rng.randint(1, 20)
        fill = dict(k=k, m=m, m2=m + rng.randint(5, 30), w=rng.choice(_WORDS))
        code = body.format(**fill)
        src.append(f'\n\ndef {name}({params}):\n    """{doc.format(**fill)}"""\n' + _indent(code, 4) + "\n")
        ns: dict = {}
        exec(f"def {name}({params}):\n" + _indent(code, 4), ns)
        fn = ns[name]
        lines = [f"\n\ndef test_{name}():"]
        for _ in range(3):
            arg = _example(rng, arg_kinds[0])
            lines.append(f"    assert {module}.{name}({arg!r}) == {fn(arg)!r}")
        tests.append("\n".join(lines) + "\n")
        names.append(name)
    return "".join(src), "".join(tests), names


def _class_source(rng: random.Random, package: str, module: str) -> tuple[str, str, str]:
    k = rng.randint(2, 5)
    cname = rng.choice(["Tally", "Ledger", "Meter", "Gauge"])
    src = (
        f"\n\nclass {cname}:\n"
        f'    """Keeps a running total that starts at 0."""\n\n'
        f"    def __init__(self):\n        self.total = 0\n\n"
        f"    def add(self, x: int) -> None:\n"
        f'        """Add {k} times x to the total."""\n        self.total += {k} * x\n\n'
        f"    def reset(self) -> int:\n"
        f'        """Set the total back to 0 and return the total it had before."""\n'
        f"        old = self.total\n        self.total = 0\n        return old\n"
    )
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    tests = (
        f"\n\ndef test_{cname.lower()}():\n"
        f"    t = {module}.{cname}()\n    t.add({a})\n    t.add({b})\n"
        f"    assert t.total == {k * (a + b)}\n    assert t.reset() == {k * (a + b)}\n    assert t.total == 0\n"
    )
    return src, tests, cname


def _example(rng: random.Random, kind: str):
    if kind == "int":
        return rng.randint(-20, 40)
    if kind == "str":
        return "".join(rng.choice("abcdeiou") for _ in range(rng.randint(1, 7)))
    return [rng.randint(-5, 20) for _ in range(rng.randint(1, 5))]


def _indent(code: str, n: int) -> str:
    return "\n".join((" " * n + line) if line else line for line in code.splitlines())
