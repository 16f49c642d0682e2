"""Time the default's warm-start eval on vLLM at a given engine.cpu_threads."""
import os, sys, time
from pathlib import Path
from rich.console import Console
from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import EngineStart, run_eval  # d44dbb7: start_engine(cfg, path, run_dir, progress)
from carl.train.progress import RunProgress
from carl.train.metrics import MetricsLog
from carl.tasks import load_tasks
from carl.harness.tools import default_tools
cfg = load_config(TrainConfig, os.environ.get("RUN", "runs/default") + "/config.toml", sys.argv[2:] + [f"run_dir={sys.argv[1]}"])
run_dir = Path(sys.argv[1]); run_dir.mkdir(parents=True, exist_ok=True)
tasks = sorted(load_tasks(os.environ.get("RUN", "runs/default") + "/micro/eval.jsonl"), key=lambda t: t.instance_id)
tools = {n: t for n, t in default_tools().items() if n in cfg.tools}
console = Console(width=100)
with RunProgress(console) as progress:
    t0 = time.perf_counter()
    model = Path(os.environ.get("RUN", "runs/default")) / "checkpoints/step_000000/model"
    policy, store = EngineStart(cfg, model, run_dir, console).get(progress)
    t1 = time.perf_counter()
    try:
        r = run_eval("warm start", policy, cfg, tasks, tools, progress, MetricsLog(run_dir), 0)
    finally:
        policy.close()
    t2 = time.perf_counter()
print(f"RESULT threads={cfg.engine.cpu_threads} start {t1-t0:.1f}s eval {t2-t1:.1f}s pass@1 {r['summary']['pass@1']:.3f}")
