"""Replace attrs' and python-dateutil's entries in configs/suites/default.lock.json with those of a
whole build of the two packages with Hypothesis tests pinned (carl.tasks.hypothesis_pin); the other
ten packages' entries stay as they are (their tests do not use Hypothesis, so the pin changes
nothing there). Run from the repository root, after

    carl bench build SUITE2.toml --out OUT

where SUITE2.toml is configs/suites/default.toml with packages = ["attrs", "python-dateutil"] and
no package_caps line (suite-attrs-dateutil.toml here), beside copies of dev.jsonl and the lock:

    .venv/bin/python docs/results/bench/hypothesis-pin-2026-12-06/merge_lock.py SUITE2.toml OUT

The selection (`select_tasks`), smoke subset and lock entries are carl's own (finish_suite with no
reference); the counts are recomputed over the merged entries.
"""

import json
import sys
from collections import Counter
from pathlib import Path

from carl.eval.strata import STRATA, order_values
from carl.eval.suite import load_suite_config
from carl.eval.suite_build import finish_suite
from carl.io import atomic_write_json

LOCK = Path("configs/suites/default.lock.json")


def main(suite2: str, out: str) -> None:
    default = load_suite_config("configs/suites/default.toml")
    two = load_suite_config(suite2)
    fresh = finish_suite(two, Path(out), None).lock
    replaced = {p["name"] for p in fresh["packages"]}
    old = json.loads(LOCK.read_text())
    entries = {p["name"]: [] for p in old["packages"]}
    for e in old["tasks"]:
        if e["repo"] not in replaced:
            entries[e["repo"]].append(e)
    for e in fresh["tasks"]:
        entries[e["repo"]].append(e)
    smoke_of = {e["instance_id"]: e["repo"] for e in old["tasks"] + fresh["tasks"]}
    smoke = [i for i in old["smoke"] if smoke_of[i] not in replaced] + fresh["smoke"]
    order = [p["name"] for p in old["packages"]]
    tasks = [e for name in order for e in entries[name]]
    smoke = sorted(smoke, key=lambda i: order.index(smoke_of[i]))
    new_packages = {p["name"]: p for p in fresh["packages"]}
    packages = [new_packages.get(p["name"], p) for p in old["packages"]]
    counts = {s: Counter(e["strata"][s] for e in tasks) for s in STRATA}
    merged = {
        **old,
        "packages": packages,
        "tasks": tasks,
        "smoke": smoke,
        "counts": {"tasks": len(tasks), "smoke": len(smoke),
                   **{s: {v: counts[s][v] for v in order_values(s, set(counts[s]), default.strata)} for s in STRATA}},
    }
    atomic_write_json(LOCK, merged)
    before = {e["instance_id"]: e for e in old["tasks"]}
    after = {e["instance_id"]: e for e in tasks}
    changed = sorted(i for i in before.keys() & after.keys() if before[i] != after[i])
    print(f"{LOCK}: {len(tasks)} tasks ({len(smoke)} smoke); left: {sorted(before.keys() - after.keys())}; "
          f"new: {sorted(after.keys() - before.keys())}; entry changed: {changed}")


if __name__ == "__main__":
    main(*sys.argv[1:])
