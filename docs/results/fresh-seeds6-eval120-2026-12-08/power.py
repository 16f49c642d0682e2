"""Where the standard error of a seed's RL - warm start comes from, on the kept 48-repo evals of fresh
seeds 20-34 (arm `grpo+errcost+eval48`), and what it would be with more tasks or more samples.

Per held-out task i, d_i = (RL's pass rate) - (warm start's) over its 2 samples each. var(d) over tasks
= the samples' noise (the mean over tasks of each arm's unbiased within-task variance / 2, summed over
the two arms) + the tasks' own spread (tau2, the rest). s.e. = sqrt(var(d) / n). Projected:
  n x 2.5 tasks, 2 samples: sqrt(var(d) / (2.5 n))          (120 repos instead of 48)
  n tasks, 4 samples:       sqrt((tau2 + noise / 2) / n)     (twice the samples)
Twice the samples costs as many episodes as twice the tasks but removes only the samples' part.

    .venv/bin/python docs/results/fresh-seeds6-eval120-2026-12-08/power.py > docs/results/fresh-seeds6-eval120-2026-12-08/power.txt
"""
import glob
import json
import math
import statistics as st
from pathlib import Path

RESULTS = Path(__file__).parent.parent

print("| seed | tasks | RL - warm | s.e. | var(d) | samples' noise | tasks' spread | s.e. at 2.5x tasks | s.e. at 4 samples |")
print("|---|---|---|---|---|---|---|---|---|")
ses, projected = [], []
for run in sorted(glob.glob(str(RESULTS / "fresh-seeds*" / "seed*_grpo+errcost+eval48"))):
    paths = sorted(glob.glob(run + "/eval/step*.json"))
    warm, rl = (json.loads(Path(p).read_text()) for p in (paths[0], paths[-1]))
    after = {t["task_id"]: [float(c) for c in t["outcomes"]] for t in rl["tasks"]}
    d, noise = [], []
    for t in warm["tasks"]:
        a, b = [float(c) for c in t["outcomes"]], after[t["task_id"]]
        d.append(st.mean(b) - st.mean(a))
        noise.append(st.variance(a) / len(a) + st.variance(b) / len(b))
    n, var_d, var_noise = len(d), st.variance(d), st.mean(noise)
    tau2 = max(var_d - var_noise, 0.0)
    se, se_tasks, se_samples = (math.sqrt(var_d / n), math.sqrt(var_d / (2.5 * n)), math.sqrt((tau2 + var_noise / 2) / n))
    ses.append(se)
    projected.append(se_tasks)
    print(f"| {Path(run).name.split('_')[0][4:]} | {n} | {st.mean(d):+.3f} | {se:.3f} | {var_d:.3f} | {var_noise:.3f} | "
          f"{tau2:.3f} | {se_tasks:.3f} | {se_samples:.3f} |")
print(f"\nmedian s.e. on 48 repos {st.median(ses):.3f} (range {min(ses):.3f}-{max(ses):.3f}); "
      f"projected at 2.5x the tasks {st.median(projected):.3f} ({min(projected):.3f}-{max(projected):.3f})")
