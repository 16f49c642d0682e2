"""Time the RL step on expert-made groups (4 per task, distinct mistake seeds) of the default's RL tasks."""
import os, sys, time, torch
from pathlib import Path
from carl.config import load_config
from carl.train.config import TrainConfig
from carl.train.loop import resolve_model_path
from carl.train.trainer import Trainer
from carl.micro.expert import ExpertMistakes, expert_token_policy
from carl.rollout.rollout import collect_groups
from carl.tasks import load_tasks
from carl.harness.tools import default_tools
from carl.engine.hf import pad_token_id
cfg = load_config(TrainConfig, "configs/default.toml", sys.argv[1:])
micro = Path(os.environ.get("RUN", "runs/default")) / "micro"
tasks = sorted(load_tasks(micro / "rl.jsonl"), key=lambda t: t.instance_id)[:3]
trainer = Trainer(cfg, resolve_model_path(cfg.model.path))
tools = {n: t for n, t in default_tools().items() if n in cfg.tools}
m = ExpertMistakes(0.3, 0.3, 0.3)
groups = collect_groups(lambda t, j: expert_token_policy(trainer.tokenizer, tasks[t], m, seed=100 * t + j),
                        tasks, 4, cfg.limits, tools, cfg.sandbox)
for g in groups:
    for j, r in enumerate(g):
        r.reward = float(j % 2)
        for s in r.trajectory.segments:  # as if sampled: log-probs near the policy's
            s.logprobs_T = [-0.5 if g else 0.0 for g in s.generated_mask_T]
lens = [len(s.token_ids_T) for g in groups for r in g for s in r.trajectory.segments]
print(f"{len(lens)} segments, lengths {sorted(lens)}", flush=True)
trainer.set_lr(cfg.rl.lr)
pad = pad_token_id(trainer.tokenizer)
norm = float(cfg.rollout.group_size * cfg.rollout.tasks_per_step * cfg.limits.max_new_tokens)
for i in range(3):
    t = time.perf_counter()
    m = trainer.rl_step(groups, norm, tuple(tools), pad)
    print(f"rl step {i}: {time.perf_counter()-t:.1f}s loss {m.get('loss', m.get('loss/total'))}", flush=True)
