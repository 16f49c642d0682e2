"""Five runs of the default at one seed (three fresh-clone demos and repro-a/b): warm-start evals
compared sample by sample with the first demo's, and RL - warm start per run with its paired
standard error over tasks; the spread over the five with carl.eval.seeds. Run from the repository
root."""
import json
from pathlib import Path

from carl.eval.paired import over_tasks, paired_difference
from carl.eval.seeds import seed_spread

here = Path(__file__).parent
runs = {"demo": Path("docs/results/demo/2026-12-05-zen4-19bc992"),
        "repro-a": here / "runs" / "repro-a", "repro-b": here / "runs" / "repro-b",
        "demo-2": Path("docs/results/demo/2026-12-05-zen4-f804adf"),
        "demo-3": Path("docs/results/demo/2026-12-05-zen4-f23dac8")}
evals = {name: (json.loads((d / "step000000.json").read_text()), json.loads((d / "step000005.json").read_text()))
         for name, d in runs.items()}
ref = evals["demo"][0]
for name in ("repro-a", "repro-b", "demo-2", "demo-3"):
    d = paired_difference(ref, evals[name][0])
    print(f"warm-start eval, demo vs {name}: {d.pairs} sample pairs, {d.identical} identical episodes, "
          f"{d.agree} same outcome; pass@1 {d.pass_a:.3f} vs {d.pass_b:.3f}")
gains = []
for name, (warm, rl) in evals.items():
    d = over_tasks(paired_difference(warm, rl))
    gains.append(d.diff)
    print(f"{name}: warm {d.pass_a:.3f} -> RL {d.pass_b:.3f}: {d.diff:+.3f} ± {d.se_paired:.3f} over tasks "
          f"({d.diff / d.se_paired:.1f} SE)")
s = seed_spread(gains)
print(f"RL - warm start over the {len(gains)} runs: mean {s.mean:+.3f}, sample sd {s.sd:.3f}, 95% t-interval "
      f"{s.low:+.3f} .. {s.high:+.3f}")
