"""How many of each seed's 64 warm-start (expert) episodes show a recovery at all: the planted wrong
constant, its failing test run and the fix (`warm_start.wrong_edit = 0.15`). Only bodies with an
integer literal can get one, and level-4 bodies rarely have one, so the expert's words before that
test run (what 4732799 changed) touch only these episodes.

Rebuilds each seed's warm-start split of the micro world from its kept config.toml (the same
repos and tasks `carl train` built; about 30 s a seed on 2 cores) and replays the expert's plans
with the same random numbers as `carl.train.warm_start.expert_rollouts`. Run from the repository
root:
    .venv/bin/python docs/results/fresh-seeds5-expert-words-2026-12-07/recoveries_in_data.py
"""
import random
import tempfile
import tomllib
import warnings
from pathlib import Path

from carl.micro.expert import ExpertMistakes, plan_messages
from carl.micro.world import build_micro_tasks
from carl.train.warm_start import round_robin_by_repo

HERE = Path(__file__).parent
RUNS = [(HERE.parent / "fresh-seeds4-eval48-2026-12-07", s) for s in (25, 26, 27, 28, 29)] + \
       [(HERE, s) for s in (30, 31, 32, 33, 34)]

warnings.filterwarnings("ignore", message="carl: the 'local' sandbox backend")
for folder, seed in RUNS:
    cfg = tomllib.loads((folder / f"seed{seed}_grpo+errcost+eval48" / "config.toml").read_text())
    m, ws = cfg["micro"], cfg["warm_start"]
    with tempfile.TemporaryDirectory() as out:
        tasks = build_micro_tasks(out, m["seed"], m["difficulty"], {"warm_start": m["warm_start_repos"]},
                                  m["modules_per_repo"], m["defs_per_module"], m["max_tasks_per_repo"],
                                  backend="local")["warm_start"]
        spread = round_robin_by_repo(tasks)
        chosen = [spread[i % len(spread)] for i in range(ws["episodes"])]
        mistakes = ExpertMistakes(ws["bad_call"], ws["wrong_edit"], ws["skip_read"])
        n = sum(any(msg.startswith("A constant is wrong") for msg in
                    plan_messages(t, mistakes, random.Random(f"expert-{t.instance_id}-{cfg['seed'] * 7919 + i}")))
                for i, t in enumerate(chosen))
    print(f"seed {seed}: {n} of {len(chosen)} warm-start episodes recover from a planted mistake after a failing run")
