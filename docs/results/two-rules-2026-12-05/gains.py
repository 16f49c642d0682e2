"""RL - warm start of the two-rule default (micro.templates = ["shift", "scale"]) over seeds 5-9,
recomputed from the kept per-sample evals, with both standard errors: over tasks (what `carl train`'s
verdict uses; the tasks are a sample of the world too) and the samples' luck alone (learning.py's).
Run from the repository root:
    .venv/bin/python docs/results/two-rules-2026-12-05/gains.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SEEDS = (5, 6, 7, 8, 9)


def gain(run: Path):
    evals = sorted((run / "eval").glob("step*.json"))
    warm, rl = (json.loads(p.read_text()) for p in (evals[0], evals[-1]))
    d = paired_difference(warm, rl)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rollouts = [int(r["rl/rollouts_total"]) for r in rows if r.get("rl/rollouts_total") is not None]
    return d, over_tasks(d).se_paired, rollouts


def table(arm: str) -> dict[int, float]:
    print(f"\n{arm}\n| seed | held-out tasks | rollouts (steps) | warm start | after RL | RL - warm "
          f"± s.e. over tasks (samples' luck) | z over tasks | tasks better / worse |")
    print("|---|---|---|---|---|---|---|---|")
    diffs, beyond = {}, 0
    for seed in SEEDS:
        run = HERE / f"seed{seed}_{arm}"
        if not (run / "report.json").exists():
            print(f"| {seed} | (not run or not finished) |")
            continue
        d, se_t, rollouts = gain(run)
        z = d.diff / se_t if se_t else float("inf") if d.diff > 0 else 0.0
        beyond += z > 2
        diffs[seed] = d.diff
        print(f"| {seed} | {d.tasks} | {rollouts[-1]} ({len(rollouts)}) | {d.pass_a:.3f} | {d.pass_b:.3f} | "
              f"{d.diff:+.3f} ± {se_t:.3f} ({d.se_paired:.3f}) | {z:.1f} | {d.tasks_better} / {d.tasks_worse} |")
    if len(diffs) > 1:
        s = seed_spread(list(diffs.values()))
        print(f"mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f} (n = {s.n}); "
              f"{beyond} of {len(diffs)} seeds beyond 2 standard errors over tasks")
    return diffs


def rl_rows(run: Path) -> list[dict]:
    """The metrics rows of a run's RL steps."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "rl/reward_mean" in r]


def finish(run: Path) -> tuple[float, float]:
    """The fraction of held-out episodes that called finish: warm start, after RL."""
    evals = sorted((run / "eval").glob("step*.json"))
    rates = []
    for p in (evals[0], evals[-1]):
        tasks = json.loads(p.read_text())["tasks"]
        rates.append(sum(t["finish_rate"] * t["n"] for t in tasks) / sum(t["n"] for t in tasks))
    return rates[0], rates[1]


grpo = table("grpo+errcost")
sd = table("grpo+errcost+sd")
both = {seed: sd[seed] - grpo[seed] for seed in sd if seed in grpo}  # the same warm start and eval tasks
if len(both) > 1:
    s = seed_spread(list(both.values()))
    print(f"\nself-distillation - Dr. GRPO after RL, seeds {', '.join(map(str, both))}: "
          f"{', '.join(f'{x:+.3f}' for x in both.values())}; mean {s.mean:+.3f}, sample sd {s.sd:.3f}, "
          f"95% t-interval {s.low:+.3f} to {s.high:+.3f}")
