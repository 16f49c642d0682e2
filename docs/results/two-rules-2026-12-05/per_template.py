"""Held-out pass@1 per template, warm start -> after RL, in the kept runs of the all-template default
(seeds 0-4, 3,072 tokens): where RL moved held-out tasks, which is how the two-rule default's
templates were picked (before seeds 5-9 ran). The kept evals name tasks by id only, so each seed's
RL and held-out tasks are built again (the world is a pure function of its seed: about 1 minute for
all five). Run from the repository root:
    .venv/bin/python docs/results/two-rules-2026-12-05/per_template.py [work dir, default /tmp/per_template]
"""
import collections
import json
import sys
from pathlib import Path

from carl.micro.world import build_micro_tasks, template

R = Path("docs/results")
RUNS = {0: ["learning-equal-2026-12-04/seed0_grpo+errcost+ctx3072+r64", "learning-ctx-2026-12-04/seed0_grpo+errcost+ctx3072"],
        1: ["learning-equal-2026-12-04/seed1_grpo+errcost+ctx3072+r64", "learning-ctx-2026-12-04/seed1_grpo+errcost+ctx3072"],
        2: ["learning-equal-2026-12-04/seed2_grpo+errcost+ctx3072+r64", "learning-ctx-2026-12-04/seed2_grpo+errcost+ctx3072"],
        3: ["learning-ctx-2026-12-04/seed3_grpo+errcost+ctx3072"],
        4: ["learning-ctx-2026-12-04/seed4_grpo+errcost+ctx3072"]}
work = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/per_template")
totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])  # passed before, after, samples
for seed, runs in RUNS.items():
    world = build_micro_tasks(work / f"seed{seed}", seed, 4, {"rl": 4, "eval": 6}, 2, 3, 3)
    names = {t.instance_id: template(t) for t in world["rl"] + world["eval"]}
    print(f"seed {seed}: RL tasks per template {dict(sorted(collections.Counter(map(template, world['rl'])).items()))}")
    for run in runs:
        evals = sorted((R / run / "eval").glob("step*.json"))
        passed = []
        for path in (evals[0], evals[-1]):
            per = collections.defaultdict(list)
            for t in json.loads(path.read_text())["tasks"]:
                per[names[t["task_id"]]] += [o == "1" for o in t["outcomes"]]
            passed.append(per)
        row = {k: f"{sum(passed[0][k])} -> {sum(passed[1][k])} of {len(passed[0][k])}" for k in sorted(passed[0])}
        print(f"  {run}: {row}")
        if run == runs[0]:  # one run per seed in the totals
            for k in passed[0]:
                totals[k][0] += sum(passed[0][k])
                totals[k][1] += sum(passed[1][k])
                totals[k][2] += len(passed[0][k])
print("\nper template over the 5 seeds (one run each, the first listed): passed samples warm -> after RL of all")
for k, (a, b, n) in sorted(totals.items(), key=lambda kv: kv[1][1] - kv[1][0], reverse=True):
    print(f"  {k:<11} {a:>3} -> {b:>3} of {n}")
