"""RL - warm start of the default under rl.max_rollouts=64, recomputed from kept per-sample evals.

Which run stands for each seed (fixed before looking at the numbers): the run that had
rl.max_rollouts=64 set where one exists (seeds 0-2: the `+r64` Dr. GRPO arms of
../learning-equal-2026-12-04, branched from each seed's warm start, 5 or fewer steps), else the
uncapped default run (seeds 3-4 of ../learning-ctx-2026-12-04, whose 5 steps took 56 and 64
rollouts: the cap never bound). Seed 0's uncapped run (48 rollouts, so the cap would not have
bound either) is printed as the alternative. Run from the repository root:
    .venv/bin/python docs/results/rollout-cap-2026-12-05/cap.py
"""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

R = Path("docs/results")
RUNS = {0: R / "learning-equal-2026-12-04/seed0_grpo+errcost+ctx3072+r64",
        1: R / "learning-equal-2026-12-04/seed1_grpo+errcost+ctx3072+r64",
        2: R / "learning-equal-2026-12-04/seed2_grpo+errcost+ctx3072+r64",
        3: R / "learning-ctx-2026-12-04/seed3_grpo+errcost+ctx3072",
        4: R / "learning-ctx-2026-12-04/seed4_grpo+errcost+ctx3072"}
UNCAPPED = {s: R / f"learning-ctx-2026-12-04/seed{s}_grpo+errcost+ctx3072" for s in range(5)}


def gain(run: Path) -> tuple[float, float, float, float, float, int, int]:
    evals = sorted((run / "eval").glob("step*.json"))
    warm, rl = (json.loads(p.read_text()) for p in (evals[0], evals[-1]))
    d = paired_difference(warm, rl)
    rollouts = [json.loads(line).get("rl/rollouts_total") for line in (run / "metrics.jsonl").read_text().splitlines()]
    rollouts = [int(r) for r in rollouts if r is not None]
    return d.pass_a, d.pass_b, d.diff, over_tasks(d).se_paired, d.se_paired, rollouts[-1], len(rollouts)


def table(runs: dict[int, Path], title: str) -> None:
    print(f"\n{title}\n| seed | run | rollouts (steps) | warm start | after RL | RL - warm ± s.e. over tasks (samples' luck) |")
    print("|---|---|---|---|---|---|")
    diffs = []
    for seed, run in runs.items():
        a, b, diff, se_t, se_s, n, steps = gain(run)
        diffs.append(diff)
        print(f"| {seed} | `{run.relative_to(R)}` | {n} ({steps}) | {a:.3f} | {b:.3f} | {diff:+.3f} ± {se_t:.3f} ({se_s:.3f}) |")
    s = seed_spread(diffs)
    print(f"mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f} (n = {s.n})")


table(RUNS, "rl.max_rollouts=64 (the new default): seeds 0-2 the r64 arms, seeds 3-4 the uncapped runs (cap not binding)")
table({**RUNS, 0: UNCAPPED[0]}, "the same with seed 0's uncapped run (48 rollouts) instead of its r64 arm")
table(UNCAPPED, "uncapped (the default until 2026-12-05), for reference")
