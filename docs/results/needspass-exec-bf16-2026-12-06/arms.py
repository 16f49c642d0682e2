"""needspass + exec + a 128-rollout budget (`shaping.cost_needs_pass=true`,
`shaping.needs_pass_gives_back=execution`, `rl.max_rollouts=128`) against the default (grpo+errcost),
in bf16 on a 2-core Zen 4, branched from the same warm starts (step 0 of each seed's default run here),
recomputed from the kept per-sample evals: each arm's RL - warm start with its standard error over
tasks, the exec arm - default after RL paired by seed, what the RL rollouts and held-out episodes did,
and this folder's default runs beside the 2026-12-05 runs of the same seeds and code path (same warm
start recipe; its pass@1 agrees in every seed; RL samples differ run to run). Run from the
repository root:
    .venv/bin/python docs/results/needspass-exec-bf16-2026-12-06/arms.py
"""
import importlib.util
from pathlib import Path

from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
EARLIER = HERE.parent / "two-rules-2026-12-05"
ARMS = ("grpo+errcost", "grpo+errcost+needspass+exec+r128")

spec = importlib.util.spec_from_file_location("gains", EARLIER / "gains.py")
gains = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gains)  # prints the 2026-12-05 bf16 tables first
print("\n" + "=" * 100 + "\nthis folder (bf16, 2-core Zen 4, 2026-12-06):")
gains.HERE = HERE
SEEDS = [s for s in gains.SEEDS if all((HERE / f"seed{s}_{arm}" / "report.json").exists() for arm in ARMS)]
gains.SEEDS = tuple(SEEDS)
after = {arm: {} for arm in ARMS}
warm = {}
for arm in ARMS:
    gains.table(arm)
    for seed in SEEDS:
        d, _, _ = gains.gain(HERE / f"seed{seed}_{arm}")
        after[arm][seed] = d.pass_b
        warm[seed] = d.pass_a



def print_diff(against: str, diff: list[float]) -> None:
    line = f"\n{ARMS[1]} - {against} after RL, seeds {SEEDS}: " + ", ".join(f"{x:+.3f}" for x in diff)
    if len(diff) > 1:
        s = seed_spread(diff)
        line += f"; mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f}"
    print(line)


print_diff("default (same warm start and tasks)", [after[ARMS[1]][s] - after[ARMS[0]][s] for s in SEEDS])

print("\nthe default here against the default of 2026-12-05 (same seed, world and warm-start recipe):")
print("| seed | warm start pass@1 then -> here | after RL then -> here |")
print("|---|---|---|")
both_draws = {}
for seed in SEEDS:
    d0, _, _ = gains.gain(EARLIER / f"seed{seed}_{ARMS[0]}")
    print(f"| {seed} | {d0.pass_a:.3f} -> {warm[seed]:.3f} | {d0.pass_b:.3f} -> {after[ARMS[0]][seed]:.3f} |")
    both_draws[seed] = (d0.pass_b + after[ARMS[0]][seed]) / 2
print_diff("the mean of the default's two RL draws (then and here)", [after[ARMS[1]][s] - both_draws[s] for s in SEEDS])


print("\n| seed | arm | RL steps: rollouts, pass rate | failed-call rate by step | held-out finish warm -> RL |")
print("|---|---|---|---|---|")
for seed in SEEDS:
    for arm in ARMS:
        run = HERE / f"seed{seed}_{arm}"
        rows = gains.rl_rows(run)
        f0, f1 = gains.finish(run)
        steps = ", ".join(f"{r['rl/pass_rate']:.2f}" for r in rows)
        errors = ", ".join(f"{r['rl/tool_error_rate']:.2f}" for r in rows)
        print(f"| {seed} | {arm} | {int(rows[-1]['rl/rollouts_total'])}: {steps} | {errors} | {f0:.2f} -> {f1:.2f} |")

# The arm's second draw: branched again from the same warm starts (draw2/, learning.py --out
# runs/learning-bf16-draw2 with the default's runs above linked in as its first arm).
DRAW2 = HERE / "draw2"
if DRAW2.exists():
    print("\n" + "=" * 100 + f"\nthe second draw of {ARMS[1]} (draw2/), the same warm starts and tasks:")
    gains.HERE = DRAW2
    gains.SEEDS = tuple(s for s in SEEDS if (DRAW2 / f"seed{s}_{ARMS[1]}" / "report.json").exists())
    gains.table(ARMS[1])
    second = {s: gains.gain(DRAW2 / f"seed{s}_{ARMS[1]}")[0].pass_b for s in gains.SEEDS}
    SEEDS = list(gains.SEEDS)
    print_diff("default (this folder's draw) [second draw]", [second[s] - after[ARMS[0]][s] for s in SEEDS])
    print_diff("the mean of the default's two draws [mean of the arm's two draws]",
               [(second[s] + after[ARMS[1]][s]) / 2 - both_draws[s] for s in SEEDS])
