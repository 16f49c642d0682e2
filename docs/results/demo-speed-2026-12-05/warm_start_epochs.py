"""Time warm-start epochs on the default's real expert data (micro world of a kept run)."""
import os, sys, time, random, torch
from pathlib import Path
from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import resolve_model_path
from carl.train.trainer import Trainer
from carl.train.warm_start import expert_rollouts
from carl.micro.expert import ExpertMistakes
from carl.tasks.store import load_tasks
from carl.harness.tools import default_tools
from carl.engine.hf import pad_token_id
cfg = load_config(TrainConfig, "configs/default.toml", sys.argv[2:])
micro = Path(os.environ.get("RUN", "runs/default")) / "micro"
tasks = sorted(load_tasks(micro / "warm_start.jsonl"), key=lambda t: t.instance_id)
trainer = Trainer(cfg, resolve_model_path(cfg.model.path))
tools = {n: t for n, t in default_tools().items() if n in cfg.tools}
ws = cfg.warm_start
t = time.perf_counter()
data = expert_rollouts(tasks, trainer.tokenizer, ws.episodes, ExpertMistakes(ws.bad_call, ws.wrong_edit, ws.skip_read),
                       cfg.limits, tools, cfg.sandbox, cfg.seed, summary=ws.expert_summary)
data = [r for r in data if r.valid and r.passed]
lens = sorted(len(s.token_ids_T) for r in data for s in r.trajectory.segments)
print(f"expert {time.perf_counter()-t:.1f}s, {len(data)} ok; segment lengths min {lens[0]} median {lens[len(lens)//2]} max {lens[-1]} n {len(lens)}", flush=True)
trainer.set_lr(ws.lr)
pad = pad_token_id(trainer.tokenizer)
for e in range(int(sys.argv[1])):
    t = time.perf_counter()
    losses = trainer.sft_epoch(data, pad, e)
    print(f"epoch {e+1}: {time.perf_counter()-t:.1f}s loss {sum(losses)/len(losses):.4f} first losses {[round(x,4) for x in losses[:3]]}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "1":
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.sft_epoch(data[:8], pad, 1)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
