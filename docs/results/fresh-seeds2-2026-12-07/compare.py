"""The 64-episode default on ten fresh seeds, two sets of five chosen before they ran: 10-14
(`../fresh-seeds-2026-12-07/`) and 15-19 (this folder). Per seed RL - warm start with its standard
error over tasks; per set and over all ten the count beyond 2 s.e. and the spread over seeds.
Run from the repository root:
    .venv/bin/python docs/results/fresh-seeds2-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SETS = {"10-14": (HERE.parent / "fresh-seeds-2026-12-07", (10, 11, 12, 13, 14)), "15-19": (HERE, (15, 16, 17, 18, 19))}


def evals(run: Path) -> tuple[dict, dict]:
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def finish_rate(report: dict) -> float:
    return report["summary"]["finish_rate"]


print("| seed | held-out tasks | warm start | after RL | RL - warm ± s.e. over tasks | z | better / worse | finish: warm -> RL |")
print("|---|---|---|---|---|---|---|---|")
gains: dict[str, list[tuple[float, float, float]]] = {}
for name, (folder, seeds) in SETS.items():
    for seed in seeds:
        warm, rl = evals(folder / f"seed{seed}_grpo+errcost")
        d = paired_difference(warm, rl)
        se = over_tasks(d).se_paired
        gains.setdefault(name, []).append((d.diff, d.diff / se, d.pass_a))
        print(f"| {seed} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} | {d.diff / se:.1f} "
              f"| {d.tasks_better} / {d.tasks_worse} | {finish_rate(warm):.2f} -> {finish_rate(rl):.2f} |")
for name, rows in [*gains.items(), ("10-19", [r for rows in gains.values() for r in rows])]:
    s = seed_spread([g for g, _, _ in rows])
    beyond = sum(z > 2 for _, z, _ in rows)
    print(f"seeds {name}: RL - warm mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to "
          f"{s.high:+.3f} (n = {s.n}); {beyond} of {s.n} beyond 2 s.e.; warm start mean {sum(w for _, _, w in rows) / len(rows):.3f}")
