"""Run the default's warm-start expert episodes twice; compare the token ids per episode."""
import sys, hashlib
from pathlib import Path
from rich.console import Console
from transformers import AutoTokenizer
from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import load_task_sets, warm_start_data, resolve_model_path
from carl.train.progress import RunProgress
from carl.train.metrics import MetricsLog
from carl.harness.tools import default_tools

cfg = load_config(TrainConfig, None, [f"run_dir={sys.argv[1]}"])
run_dir = Path(cfg.run_dir); run_dir.mkdir(parents=True, exist_ok=True)
tok = AutoTokenizer.from_pretrained(str(resolve_model_path(cfg.model.path)))
tools = {n: t for n, t in default_tools().items() if n in cfg.tools}
log = MetricsLog(run_dir, ())
with RunProgress(Console(quiet=True)) as progress:
    sets = load_task_sets(cfg, run_dir, progress)
    data = warm_start_data(cfg, run_dir, sets["warm_start"], tok, cfg.limits, tools, progress, log)
for r in data:
    ids = [i for s in r.trajectory.segments for i in s.token_ids_T]
    print(r.task.instance_id, len(ids), hashlib.sha1(str(ids).encode()).hexdigest()[:10])
    Path(sys.argv[1], r.task.instance_id + ".txt").write_text(tok.decode(ids))
