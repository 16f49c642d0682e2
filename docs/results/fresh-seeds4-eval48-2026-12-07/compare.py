"""Five more fresh seeds (25-29) of the 64-episode default scored on 48 held-out repos (arm
`grpo+errcost+eval48`), the second set on the powered eval after seeds 20-24.

Planned before any of them ran (this file was committed while seed 25 was running): the seeds,
the arm, and what is read off. First, seeds 25-29 on 48 repos against issue 30's target (at least
4 of 5 beyond 2 standard errors over tasks, the 95% t-interval of the mean above 0). Then both
powered sets together (seeds 20-29, 48 repos), and every fresh seed so far (10-29) on the demo's
24 held-out repos (the first 24 of the 48: `split_seeds` makes them the same repos). Run from the
repository root:
    .venv/bin/python docs/results/fresh-seeds4-eval48-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread
from carl.micro.world import split_seeds

HERE = Path(__file__).parent
SEEDS = (25, 26, 27, 28, 29)
POWERED = HERE.parent / "fresh-seeds3-eval48-2026-12-07", (20, 21, 22, 23, 24)
EARLIER = ((HERE.parent / "fresh-seeds-2026-12-07", (10, 11, 12, 13, 14)),
           (HERE.parent / "fresh-seeds2-2026-12-07", (15, 16, 17, 18, 19)))


def evals(run: Path) -> tuple[dict, dict]:
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def first_repos(report: dict, seed: int, repos: int) -> dict:
    """`report` cut to the tasks of the split's first `repos` eval repos (task ids start `repo<N>__`)."""
    keep = {f"repo{s}__" for s in split_seeds("eval", seed, repos)}
    return {**report, "tasks": [t for t in report["tasks"] if t["task_id"].split("__")[0] + "__" in keep]}


def gain(warm: dict, rl: dict) -> tuple:
    d = paired_difference(warm, rl)
    return d, over_tasks(d).se_paired


def spread_line(name: str, rows: list[tuple[float, float]]) -> str:
    s = seed_spread([g for g, _ in rows])
    return (f"{name}: RL - warm mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to "
            f"{s.high:+.3f} (n = {s.n}); {sum(z > 2 for _, z in rows)} of {s.n} beyond 2 s.e. over tasks")


def powered_rows(folder: Path, seeds: tuple[int, ...], show: bool) -> dict[str, list[tuple[float, float]]]:
    rows: dict[str, list[tuple[float, float]]] = {"48 repos": [], "first 24 repos": []}
    for seed in seeds:
        warm, rl = evals(folder / f"seed{seed}_grpo+errcost+eval48")
        for name, (a, b) in (("48 repos", (warm, rl)),
                             ("first 24 repos", (first_repos(warm, seed, 24), first_repos(rl, seed, 24)))):
            d, se = gain(a, b)
            rows[name].append((d.diff, d.diff / se))
            if show:
                print(f"| {seed} | {name} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} | "
                      f"{d.diff / se:.1f} | {d.tasks_better} / {d.tasks_worse} | "
                      f"{a['summary']['finish_rate']:.2f} -> {b['summary']['finish_rate']:.2f} |")
    return rows


print("| seed | eval | held-out tasks | warm start | after RL | RL - warm ± s.e. over tasks | z | better / worse | finish: warm -> RL |")
print("|---|---|---|---|---|---|---|---|---|")
rows = powered_rows(HERE, SEEDS, show=True)
print()
for name, r in rows.items():
    print(spread_line(f"seeds 25-29, {name}", r))
before = powered_rows(*POWERED, show=False)
print(spread_line("both powered sets, seeds 20-29, 48 repos", before["48 repos"] + rows["48 repos"]))
every = before["first 24 repos"] + rows["first 24 repos"]
for folder, seeds in EARLIER:
    for seed in seeds:
        d, se = gain(*evals(folder / f"seed{seed}_grpo+errcost"))
        every.append((d.diff, d.diff / se))
print(spread_line("all twenty fresh seeds 10-29, 24 held-out repos", every))
