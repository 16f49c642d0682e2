"""Five fresh seeds (20-24, chosen before any ran) of the 64-episode default scored on 48 held-out
repos (`micro.eval_repos=48`, arm `grpo+errcost+eval48`), and on their first 24, the held-out set
of `make demo` and of seeds 10-19 (`split_seeds` makes the first 24 of 48 the same repos). Per seed
RL - warm start with its standard error over tasks; the count beyond 2 s.e. and the spread over
seeds; then all fifteen fresh seeds on the 24-repo set. Run from the repository root:
    .venv/bin/python docs/results/fresh-seeds3-eval48-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread
from carl.micro.world import split_seeds

HERE = Path(__file__).parent
SEEDS = (20, 21, 22, 23, 24)
EARLIER = {"10-14": (HERE.parent / "fresh-seeds-2026-12-07", (10, 11, 12, 13, 14)),
           "15-19": (HERE.parent / "fresh-seeds2-2026-12-07", (15, 16, 17, 18, 19))}


def evals(run: Path) -> tuple[dict, dict]:
    paths = sorted((run / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def first_repos(report: dict, seed: int, repos: int) -> dict:
    """`report` cut to the tasks of the split's first `repos` eval repos (task ids start `repo<N>__`)."""
    keep = {f"repo{s}__" for s in split_seeds("eval", seed, repos)}
    return {**report, "tasks": [t for t in report["tasks"] if t["task_id"].split("__")[0] + "__" in keep]}


def gain(warm: dict, rl: dict) -> tuple:
    d = paired_difference(warm, rl)
    se = over_tasks(d).se_paired
    return d, se


def spread_line(name: str, rows: list[tuple[float, float]]) -> str:
    s = seed_spread([g for g, _ in rows])
    return (f"{name}: RL - warm mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to "
            f"{s.high:+.3f} (n = {s.n}); {sum(z > 2 for _, z in rows)} of {s.n} beyond 2 s.e. over tasks")


print("| seed | eval | held-out tasks | warm start | after RL | RL - warm ± s.e. over tasks | z | better / worse | finish: warm -> RL |")
print("|---|---|---|---|---|---|---|---|---|")
rows: dict[str, list[tuple[float, float]]] = {"48 repos": [], "first 24 repos": []}
for seed in SEEDS:
    warm, rl = evals(HERE / f"seed{seed}_grpo+errcost+eval48")
    for name, (a, b) in (("48 repos", (warm, rl)),
                         ("first 24 repos", (first_repos(warm, seed, 24), first_repos(rl, seed, 24)))):
        d, se = gain(a, b)
        rows[name].append((d.diff, d.diff / se))
        print(f"| {seed} | {name} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} | "
              f"{d.diff / se:.1f} | {d.tasks_better} / {d.tasks_worse} | "
              f"{a['summary']['finish_rate']:.2f} -> {b['summary']['finish_rate']:.2f} |")
print()
for name, r in rows.items():
    print(spread_line(f"seeds 20-24, {name}", r))
every = list(rows["first 24 repos"])
for name, (folder, seeds) in EARLIER.items():
    for seed in seeds:
        d, se = gain(*evals(folder / f"seed{seed}_grpo+errcost"))
        every.append((d.diff, d.diff / se))
print(spread_line("all fifteen fresh seeds 10-24, 24 held-out repos", every))
