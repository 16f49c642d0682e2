"""Build the default's micro world (seed 0, level 4, 32 + 4 + 6 repos, 3 tasks each) into OUT with
JOBS repos at a time; prints the wall time and a digest of the task ids of each split.
    .venv/bin/python docs/results/demo-speed-2026-12-05/world_build.py /tmp/w1 1
"""
import hashlib
import json
import sys
import time

from carl.micro.world import build_micro_tasks

out, jobs = sys.argv[1], int(sys.argv[2])
t = time.perf_counter()
w = build_micro_tasks(out, 0, 4, {"warm_start": 32, "rl": 4, "eval": 6}, 2, 3, 3, jobs=jobs)
dt = time.perf_counter() - t
ids = {k: [t.instance_id for t in v] for k, v in w.items()}
print(json.dumps({"jobs": jobs, "wall_s": round(dt, 1), "n": {k: len(v) for k, v in ids.items()},
                  "ids_sha": hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:16]}))
