"""Two ways to build the micro world, same process, same repos (`--baseline`):

    full: RL and held-out repos cut to the run's templates while building (`build_micro_tasks(
          templates=...)`: the other templates' candidates never validated) against a full build cut
          afterwards (`keep_templates`, the build before 2026-12-07)
    gold: both cut, without the third validation run of each task (the gold patch applied;
          `build_micro_tasks(gold_run=False)`, the default since 2026-12-07) against with it

    .venv/bin/python benchmarks/micro_world.py                    # the embedded default's world (seed 0)
    .venv/bin/python benchmarks/micro_world.py --seed 5 --repeats 2 --baseline gold

Each repeat builds the world twice into fresh directories, the two arms alternating (the new one
first in odd repeats), and checks that both give the same RL and held-out tasks. Prints each
build's wall time, the validation runs of each, and the ratio baseline / new of the median times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from carl.micro.world import build_micro_tasks, keep_templates  # noqa: E402
from carl.train.config import MicroConfig  # noqa: E402


def build(out: Path, m: MicroConfig, cut: bool, gold_run: bool = False) -> tuple[float, dict[str, list[str]], int]:
    """(wall s, RL and held-out instance ids of m.templates, candidates validated)."""
    repos = {"warm_start": m.warm_start_repos, "rl": m.rl_repos, "eval": m.eval_repos}
    attempts = []
    t0 = time.perf_counter()
    world = build_micro_tasks(out, m.seed, m.difficulty, repos, m.modules_per_repo, m.defs_per_module,
                              m.max_tasks_per_repo, progress=lambda split, s, r: attempts.append(r.n_attempts if r else 0),
                              templates={"rl": m.templates, "eval": m.templates} if cut else None, gold_run=gold_run)
    wall = time.perf_counter() - t0
    world = keep_templates(world, m.templates, out)
    return wall, {split: [t.instance_id for t in world[split]] for split in ("rl", "eval")}, sum(attempts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="micro.seed")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--baseline", default="full", choices=["full", "gold"], help="what the default build is compared with")
    p.add_argument("--json", default="", help="also write the results here")
    args = p.parse_args()
    m = MicroConfig(seed=args.seed)
    base = args.baseline
    arms = {"new": lambda out: build(out, m, cut=True),
            base: (lambda out: build(out, m, cut=False)) if base == "full" else (lambda out: build(out, m, True, True))}
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    validated: dict[str, int] = {}
    tasks: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            for arm in (("new", base) if i % 2 == 0 else (base, "new")):
                wall, ids, n = arms[arm](Path(tmp) / f"{arm}{i}")
                times[arm].append(wall)
                validated[arm], tasks[arm] = n, ids
                print(f"repeat {i + 1}, {arm}: {wall:.1f} s, {n} candidates validated, "
                      f"{len(ids['rl'])} RL and {len(ids['eval'])} held-out tasks", flush=True)
            if tasks["new"] != tasks[base]:
                raise SystemExit(f"the default build's RL or held-out tasks differ from the {base} build's")
    new, old = statistics.median(times["new"]), statistics.median(times[base])
    out = {"seed": args.seed, "baseline": base, "new_s": times["new"], f"{base}_s": times[base], "validated": validated,
           f"ratio_{base}_over_new": old / new, "same_tasks": True}
    what = {"full": "a full build then cut", "gold": "with the gold-patch run"}[base]
    print(f"world build, the default (cut to {list(m.templates)} while building, no gold-patch run) {new:.1f} s, "
          f"{what} {old:.1f} s (ratio {old / new:.2f}); the same tasks")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
