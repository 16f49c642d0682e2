"""The default's RL - warm start on seeds 5-9 in fp32 (this folder: 2-core Zen 3, AVX2) next to the
same seeds in bf16 (`../two-rules-2026-12-05/`: 2-core Zen 4), recomputed from the kept per-sample
evals, and fp32 - bf16 paired by seed (same world, same tasks). Run from the repository root:
    .venv/bin/python docs/results/fp32-seeds-2026-12-06/dtypes.py
"""
import importlib.util
import json
from pathlib import Path

from carl.eval.paired import paired_difference
from carl.eval.seeds import seed_spread

HERE = Path(__file__).parent
BF16 = HERE.parent / "two-rules-2026-12-05"
SEEDS = (5, 6, 7, 8, 9)
ARM = "grpo+errcost"

spec = importlib.util.spec_from_file_location("gains", BF16 / "gains.py")
gains = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gains)  # prints the bf16 tables first


print("\n| seed | held-out tasks | fp32: rollouts (steps) | warm | after RL | RL - warm ± s.e. over tasks (samples' luck) "
      "| z | better / worse | bf16: RL - warm ± s.e. over tasks | fp32 - bf16 |")
print("|---|---|---|---|---|---|---|---|---|---|")
fp32, bf16, beyond_f, beyond_b = [], [], 0, 0
for seed in SEEDS:
    f, se_f, rollouts = gains.gain(HERE / f"seed{seed}_{ARM}")
    b, se_b, _ = gains.gain(BF16 / f"seed{seed}_{ARM}")
    assert f.tasks == b.tasks, (seed, f.tasks, b.tasks)  # one world per seed, whatever the dtype
    z = f.diff / se_f if se_f else 0.0
    beyond_f += z > 2
    beyond_b += (b.diff / se_b if se_b else 0.0) > 2
    fp32.append(f.diff)
    bf16.append(b.diff)
    print(f"| {seed} | {f.tasks} | {rollouts[-1]} ({len(rollouts)}) | {f.pass_a:.3f} | {f.pass_b:.3f} | "
          f"{f.diff:+.3f} ± {se_f:.3f} ({f.se_paired:.3f}) | {z:.1f} | {f.tasks_better} / {f.tasks_worse} | "
          f"{b.diff:+.3f} ± {se_b:.3f} | {f.diff - b.diff:+.3f} |")
print("\nwarm starts' held-out episodes, fp32 against bf16 (same tasks, same sampler seeds):")
for seed in SEEDS:
    warm = [json.loads(min((f / f"seed{seed}_{ARM}" / "eval").glob("step*.json")).read_text()) for f in (BF16, HERE)]
    w = paired_difference(*warm)
    print(f"seed {seed}: {w.identical} of {w.pairs} episodes token-identical, {w.agree} the same outcome; "
          f"pass@1 {w.pass_a:.3f} bf16, {w.pass_b:.3f} fp32")
for name, diffs, beyond in (("fp32", fp32, beyond_f), ("bf16", bf16, beyond_b),
                            ("fp32 - bf16", [a - b for a, b in zip(fp32, bf16)], None)):
    s = seed_spread(diffs)
    extra = f"; {beyond} of {s.n} seeds beyond 2 standard errors over tasks" if beyond is not None else ""
    print(f"{name}: mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval {s.low:+.3f} to {s.high:+.3f} "
          f"(n = {s.n}){extra}")
