"""The smallest `carl train` run that tests drive end to end: one validated micro task, a tiny random
model (tiny_hf) on the HF engine, the local sandbox, a 2-episode warm start, RL groups of 2 and
1-sample evals.

A random model never writes a tool call, so each of its replies runs to max_new_tokens, and
decoding them is most of a test run's time: its episodes end at the first reply without a call
(`limits.stop_on_no_call`), and max_new_tokens is as small as the scripted expert's longest
message allows (its edit_file of the task's function, ~150 tokens of the tiny tokenizer; the
warm start fails below that).
"""

from __future__ import annotations

from pathlib import Path


def one_micro_task(out: Path) -> Path:
    """Build one validated stub-deletion task (level 1, local backend) under `out`; its JSONL file."""
    from carl.micro.world import build_micro_tasks

    world = build_micro_tasks(out, seed=3, difficulty=1, repos={"warm_start": 1}, max_tasks_per_repo=1,
                              backend="local")
    assert len(world["warm_start"]) == 1
    return out / "warm_start.jsonl"


def tiny_train_overrides(run_dir: Path, model: Path, tasks: Path, *extra: str) -> list[str]:
    """`carl train` overrides for the smallest run (later `extra` entries win)."""
    return [
        f"run_dir={run_dir}", f"model.path={model}", "model.dtype=float32", "model.trainable_layers=1",
        f"tasks={tasks}", f"eval_tasks={tasks}", "sandbox.backend=local", "engine.kind=hf",
        "limits.max_turns=4", "limits.max_new_tokens=256", "limits.max_tokens=40000", "limits.stop_on_no_call=true",
        "limits.context_budget_tokens=20000",
        "warm_start.episodes=2", "warm_start.epochs=1", "warm_start.bad_call=0", "warm_start.wrong_edit=0",
        "warm_start.skip_read=1", "rl.steps=1", "rollout.group_size=2", "rollout.tasks_per_step=1",
        "rollout.max_extra_batches=1", "eval.samples_per_task=1", *extra,
    ]  # fmt: skip
