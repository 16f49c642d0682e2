"""Self-distillation (`rl.sd_weight=0.5`, arm grpo+errcost+sd) against Dr. GRPO (the default, arm
grpo+errcost) on fresh seeds 10-14 of the 64-episode default: both branch from the same warm start
per seed, train at most 64 rollouts (`rl.max_rollouts`) on the same RL tasks, and are scored on the
same held-out tasks with the same eval random numbers. Recomputed from the kept per-sample evals:
  1. each arm's RL - warm start per seed, its standard error over tasks, the count beyond 2 s.e.;
  2. self-distillation - Dr. GRPO after RL per seed, paired over tasks, and over the seeds;
  3. the rollouts each run trained on (the budget both arms share).
Run from the repository root:
    .venv/bin/python docs/results/sd-fresh-2026-12-07/compare.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SEEDS = (10, 11, 12, 13, 14)
ARMS = {"Dr. GRPO": "grpo+errcost", "self-distillation": "grpo+errcost+sd"}


def run(seed: int, arm: str) -> Path:
    return HERE / f"seed{seed}_{ARMS[arm]}"


def evals(run_dir: Path) -> tuple[dict, dict]:
    """The run's warm-start and after-RL eval reports (every sample's outcome)."""
    paths = sorted((run_dir / "eval").glob("step*.json"))
    return json.loads(paths[0].read_text()), json.loads(paths[-1].read_text())


def rl_rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r for r in rows if "rl/reward_mean" in r]


def spread(name: str, values: list[float], beyond: int | None = None) -> None:
    s = seed_spread(values)
    tail = f"; {beyond} of {len(values)} seeds beyond 2 s.e. over tasks" if beyond is not None else ""
    print(f"{name}: " + ", ".join(f"{v:+.3f}" for v in values)
          + f"\n  mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f} (n = {s.n}){tail}")


def gains(arm: str) -> None:
    print(f"\n{arm}\n| seed | held-out tasks | warm start | after RL | RL - warm ± s.e. over tasks (samples' luck) "
          "| z | tasks better / worse | RL steps' pass rates | rollouts |")
    print("|---|---|---|---|---|---|---|---|---|")
    diffs, beyond = [], 0
    for seed in SEEDS:
        d = paired_difference(*evals(run(seed, arm)))
        se = over_tasks(d).se_paired
        z = d.diff / se if se else 0.0
        beyond += z > 2
        diffs.append(d.diff)
        rows = rl_rows(run(seed, arm))
        steps = ", ".join(f"{r['rl/pass_rate']:.2f}" for r in rows)
        rollouts = rows[-1]["rl/rollouts_total"]  # cumulative over the steps
        print(f"| {seed} | {d.tasks} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} ({d.se_paired:.3f}) "
              f"| {z:.1f} | {d.tasks_better} / {d.tasks_worse} | {steps} | {rollouts} |")
    spread("RL - warm start", diffs, beyond)


def against() -> None:
    print("\nafter RL, self-distillation - Dr. GRPO on the same held-out tasks and random numbers"
          "\n| seed | Dr. GRPO | self-distillation | difference ± s.e. over tasks | z | tasks better / worse |"
          "\n|---|---|---|---|---|---|")
    diffs = []
    for seed in SEEDS:
        d = paired_difference(evals(run(seed, "Dr. GRPO"))[1], evals(run(seed, "self-distillation"))[1])
        se = over_tasks(d).se_paired
        diffs.append(d.diff)
        print(f"| {seed} | {d.pass_a:.3f} | {d.pass_b:.3f} | {d.diff:+.3f} ± {se:.3f} | {d.diff / se if se else 0:.1f} "
              f"| {d.tasks_better} / {d.tasks_worse} |")
    spread("self-distillation - Dr. GRPO", diffs)


for name in ARMS:
    gains(name)
against()
