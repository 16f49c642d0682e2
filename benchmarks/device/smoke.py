"""carl train end to end on a tiny random model on $DEVICE (default cuda:0): warm start, evals, 1 RL step with KL.

    python smoke.py ROOT [KEY=VALUE ...]   (more overrides, e.g. rollout.max_staleness=2 rl.steps=3)"""
import os
import sys
import time

sys.path.insert(0, "tests")
from pathlib import Path

from rich.console import Console
from tiny_hf import save_tiny_model

from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import train

root = Path(sys.argv[1])
device = os.environ.get("DEVICE", "cuda:0")
model = save_tiny_model(root / "tiny")
t0 = time.time()
cfg = load_config(TrainConfig, None, [
    f"run_dir={root / 'run'}", f"model.path={model}", "model.trainable_layers=1", f"model.device={device}",
    "micro.warm_start_repos=1", "micro.rl_repos=1", "micro.eval_repos=1", "micro.templates=[]", "sandbox.backend=local",
    "limits.max_turns=4", "limits.max_new_tokens=400", "limits.max_tokens=40000",  # the tiny tokenizer is ~bytes
    "limits.context_budget_tokens=20000", "warm_start.bad_call=0", "warm_start.wrong_edit=0", "warm_start.skip_read=1",
    "warm_start.episodes=2", "warm_start.epochs=1", "rl.steps=1", "rl.kl_coef=1.0",
    "rollout.group_size=4", "rollout.tasks_per_step=2", "rollout.concurrency=8", "eval.samples_per_task=2",
    "engine.kind=hf", *sys.argv[2:]])
summary = train(cfg, Console(width=120))
print(f"SMOKE OK on {device} in {time.time() - t0:.0f}s:", {k: v["pass@1"] for k, v in summary.items()})
