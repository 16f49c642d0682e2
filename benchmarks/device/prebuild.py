"""Build the micro worlds of learning.py's runs ahead of time (same run dirs, same config), one process per seed.

    python prebuild.py OUT ARM SEED [override ...]
"""
import importlib.util
import sys
import time
from pathlib import Path

from rich.console import Console

from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import load_task_sets
from carl.train.progress import RunProgress

spec = importlib.util.spec_from_file_location("learning", Path("benchmarks/learning.py"))
learning = importlib.util.module_from_spec(spec)
spec.loader.exec_module(learning)
out, arm, seed, *extra = sys.argv[1:]
run_dir = Path(out) / f"seed{seed}_{arm}"
cfg = load_config(TrainConfig, None, [f"seed={seed}", f"micro.seed={seed}", f"run_dir={run_dir}",
                                      *learning.ARMS[arm], *extra])
t0 = time.time()
world = load_task_sets(cfg, run_dir, RunProgress(Console()))
print(f"seed {seed}: {[len(v) for v in world.values()]} tasks in {time.time() - t0:.0f}s", flush=True)
