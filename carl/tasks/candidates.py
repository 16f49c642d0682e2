"""Candidate features to delete, from the per-test map of executed definitions.

Sizes, small to large:
  function  a top-level function some test executes
  method    a method some test executes
  class     a class some test executes a method of
  module    a non-__init__ module some test executes code of
  cluster   definitions that exactly the same group of tests executes (and no other test
            does): a feature those tests depend on and the rest of the suite does not
Candidates no test executes are not made: no test could fail.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from carl.tasks.definitions import Definition, parse_definitions
from carl.tasks.delete import Candidate
from carl.tasks.layout import Layout

MAX_CLUSTER_SIZE = 8
"""Larger groups of co-executed definitions are usually a whole module's plumbing, not a feature."""


def all_definitions(root: Path, layout: Layout) -> list[Definition]:
    out: list[Definition] = []
    for rel in layout.source_files:
        out += parse_definitions(root, rel, layout.module_name(rel))
    return out


def invert_test_map(coverage: dict[str, list[str]], selected: set[str]) -> dict[str, frozenset[str]]:
    """Invert test -> executed keys into key -> tests, keeping only selected tests."""
    inv: dict[str, set[str]] = defaultdict(set)
    for test, keys in coverage.items():
        if test in selected:
            for key in keys:
                inv[key].add(test)
    return {k: frozenset(v) for k, v in inv.items()}


def find_candidates(
    defs: list[Definition], tests_of: dict[str, frozenset[str]], import_time: frozenset[str] = frozenset()
) -> list[Candidate]:
    """Candidates executed by some test. Definitions called at import time (`import_time` keys)
    are left out, and so is every class, module or cluster holding one: deleting them breaks
    the import of the package, which validation would only find out at the cost of a run."""
    defs = [d for d in defs if d.key not in import_time]
    blocked_classes = {k.rsplit(".", 1)[0] for k in import_time if "." in k.split("::")[1]}
    blocked_files = {k.split("::")[0] for k in import_time}
    out: list[Candidate] = []
    methods_of: dict[tuple[str, str], list[Definition]] = defaultdict(list)
    for d in defs:
        if d.kind == "method":
            methods_of[(d.file, d.qualname.split(".")[0])].append(d)
    for d in defs:
        if d.kind in ("function", "method"):
            tests = tests_of.get(d.key, frozenset())
            if tests:
                out.append(Candidate(d.kind, (d,), tests))
        elif d.kind == "class" and d.key not in blocked_classes:
            tests = frozenset().union(
                tests_of.get(d.key, frozenset()),
                *(tests_of.get(m.key, frozenset()) for m in methods_of[(d.file, d.qualname)]),
            )
            if tests:
                out.append(Candidate("class", (d,), tests))
    by_file: dict[str, list[Definition]] = defaultdict(list)
    for d in defs:
        by_file[d.file].append(d)
    for rel, ds in sorted(by_file.items()):
        if rel.endswith("__init__.py") or rel in blocked_files:
            continue
        tests = frozenset().union(*(tests_of.get(d.key, frozenset()) for d in ds))
        if tests:
            out.append(Candidate("module", tuple(ds), tests, module_file=rel))
    groups: dict[frozenset[str], list[Definition]] = defaultdict(list)
    for d in defs:
        if d.kind in ("function", "method") and tests_of.get(d.key):
            groups[tests_of[d.key]].append(d)
    for tests, ds in groups.items():
        if 2 <= len(ds) <= MAX_CLUSTER_SIZE:
            out.append(Candidate("cluster", tuple(ds), tests))
    return distinct_names(out)


def distinct_names(candidates: list[Candidate]) -> list[Candidate]:
    """Candidates whose kind and name repeat an earlier one's (a property's getter and setter share
    `Class.attr`) get occurrence 2, 3, ...: their own task ids, where two tasks with one id overwrote
    each other's broken repo in the store. The first keeps the name, and so the id, it always had."""
    seen: dict[tuple[str, str], int] = defaultdict(int)
    out = []
    for c in candidates:
        seen[(c.kind, c.name)] += 1
        out.append(c if seen[(c.kind, c.name)] == 1 else replace(c, occurrence=seen[(c.kind, c.name)]))
    return out


def plan(
    candidates: list[Candidate], modes: list[str], kinds: list[str], seed: int
) -> list[tuple[Candidate, str]]:
    """(candidate, mode) pairs in the order to try: shuffled, kinds and modes interleaved so that
    a per-repo cap still yields a mix of sizes."""
    rng = random.Random(seed)
    queues = []
    for kind in kinds:
        for mode in modes:
            q = [c for c in candidates if c.kind == kind]
            rng.shuffle(q)
            queues.append([(c, mode) for c in q])
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return out
