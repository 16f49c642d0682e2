"""Build a `carl train` run's task sets (the micro world) into its run_dir, without the model.

    python world.py KEY=VALUE ...   (the overrides of the run, run_dir included)

The run started later with the same overrides finds the world there and skips the build. On a
device machine this happens in the call before the one that carries the model's weights."""
import sys
import time
from pathlib import Path

from rich.console import Console

from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import load_task_sets
from carl.train.progress import RunProgress

cfg = load_config(TrainConfig, None, sys.argv[1:])
t0 = time.time()
world = load_task_sets(cfg, Path(cfg.run_dir), RunProgress(Console()))
print(f"{cfg.run_dir}: {[(name, len(tasks)) for name, tasks in world.items()]} tasks in {time.time() - t0:.0f}s",
      flush=True)
