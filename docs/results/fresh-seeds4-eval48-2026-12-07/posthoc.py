"""Post hoc (looked for after the twenty fresh seeds had run, not planned): RL's gain against the warm
start's own score, all twenty fresh seeds (10-29) on the demo's 24 held-out repos. A warm start's
score is measured with noise that enters its gain with a minus sign, so part of any negative relation
here is that noise, not RL. Run from the repository root:
    .venv/bin/python docs/results/fresh-seeds4-eval48-2026-12-07/posthoc.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.micro.world import split_seeds

HERE = Path(__file__).parent
SETS = ((HERE.parent / "fresh-seeds-2026-12-07", range(10, 15), "grpo+errcost"),
        (HERE.parent / "fresh-seeds2-2026-12-07", range(15, 20), "grpo+errcost"),
        (HERE.parent / "fresh-seeds3-eval48-2026-12-07", range(20, 25), "grpo+errcost+eval48"),
        (HERE, range(25, 30), "grpo+errcost+eval48"))


def first_24(report: dict, seed: int) -> dict:
    keep = {f"repo{s}__" for s in split_seeds("eval", seed, 24)}
    return {**report, "tasks": [t for t in report["tasks"] if t["task_id"].split("__")[0] + "__" in keep]}


rows = []
for folder, seeds, arm in SETS:
    for seed in seeds:
        paths = sorted((folder / f"seed{seed}_{arm}" / "eval").glob("step*.json"))
        warm, rl = (first_24(json.loads(p.read_text()), seed) for p in (paths[0], paths[-1]))
        d = paired_difference(warm, rl)
        rows.append((seed, d.pass_a, d.diff, d.diff / over_tasks(d).se_paired))
print("| seed | warm start | RL - warm | z |")
print("|---|---|---|---|")
for seed, warm, gain, z in sorted(rows, key=lambda r: r[1]):
    print(f"| {seed} | {warm:.3f} | {gain:+.3f} | {z:.1f} |")
for name, keep in (("warm start under 0.5", lambda w: w < 0.5), ("warm start 0.5 or above", lambda w: w >= 0.5)):
    part = [r for r in rows if keep(r[1])]
    print(f"{name}: {sum(z > 2 for *_, z in part)} of {len(part)} seeds beyond 2 s.e.; "
          f"mean gain {sum(g for _, _, g, _ in part) / len(part):+.3f}")
