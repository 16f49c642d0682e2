"""shaping.cost_needs_pass (no tool-error cost in a group where nothing passed), alone and with a
rollout budget its 5 steps never reach (rl.max_rollouts=128: r128), against the default
(grpo+errcost), all branched from the same fp32 warm starts of seeds 5-9 (same RL and held-out
tasks), recomputed from the kept per-sample evals: each arm's RL - warm start with its standard
error over tasks, then each arm - default after RL, paired by seed, and what the RL rollouts and
held-out episodes did (tool calls, failed calls, finish). Run from the repository root:
    .venv/bin/python docs/results/needspass-fp32-2026-12-06/arms.py
"""
import importlib.util
from pathlib import Path

from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
SEEDS = (5, 6, 7, 8, 9)
ARMS = ("grpo+errcost", "grpo+errcost+needspass", "grpo+errcost+needspass+r128")

spec = importlib.util.spec_from_file_location("gains", HERE.parent / "two-rules-2026-12-05" / "gains.py")
gains = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gains)  # prints the bf16 tables of that folder first
print("\n" + "=" * 100 + "\nthis folder (fp32, 2-core Zen 3):")
gains.HERE = HERE
after = {arm: {} for arm in ARMS}
for arm in ARMS:
    gains.table(arm)
    for seed in SEEDS:
        d, _, _ = gains.gain(HERE / f"seed{seed}_{arm}")
        after[arm][seed] = d.pass_b

for arm in ARMS[1:]:
    diff = [after[arm][s] - after[ARMS[0]][s] for s in SEEDS]
    s = seed_spread(diff)
    print(f"\n{arm} - default after RL (same warm start and tasks), seeds {SEEDS}: "
          f"{', '.join(f'{x:+.3f}' for x in diff)}; mean {s.mean:+.3f}, sample sd {s.sd:.3f}, "
          f"95% t-interval {s.low:+.3f} to {s.high:+.3f}")

print("\n| seed | arm | RL steps: rollouts, pass rate | tool calls per RL episode by step | failed-call rate by step "
      "| held-out finish warm -> RL |")
print("|---|---|---|---|---|---|")
for seed in SEEDS:
    for arm in ARMS:
        run = HERE / f"seed{seed}_{arm}"
        rows = gains.rl_rows(run)
        f0, f1 = gains.finish(run)
        def by_step(key: str) -> str:
            return ", ".join(f"{r[key]:.2f}" for r in rows)

        print(f"| {seed} | {arm} | {int(rows[-1]['rl/rollouts_total'])}: {by_step('rl/pass_rate')} | "
              f"{by_step('rl/tool_calls_per_episode')} | {by_step('rl/tool_error_rate')} | {f0:.2f} -> {f1:.2f} |")
