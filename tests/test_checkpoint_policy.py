"""A trained checkpoint in production behaves as in training: `carl agent run --checkpoint RUN`
(the serving path) writes, task for task, the very episodes the run's own eval (the training path:
`carl.eval.bench.evaluate` on the engine `carl train` samples with) wrote under the same seed;
and `load_checkpoint_policy` reads the run's sampling, limits and tools, or says clearly why not.

The run directory is made cheaply: a tiny random model saved as checkpoints step 0 and step 2 (the
second perturbed, standing for the trained weights) beside a config.toml, no training."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from tiny_hf import save_tiny_model

from carl.cli import main
from carl.config import save_config
from carl.engine.hf import HFEngine, load_model
from carl.errors import UserError
from carl.harness.agent import EpisodeLimits
from carl.sandbox.base import SandboxConfig
from carl.train.checkpoint import save_checkpoint
from carl.train.checkpoint_policy import load_checkpoint_policy
from carl.train.config import EvalConfig, ModelConfig, RolloutConfig, TrainConfig
from carl.train.loop import eval_limits, sampler_config
from carl.train.state import RunState
from carl.types import Trajectory

TOOLS = ("read_file", "finish")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """(run config, run directory, micro eval tasks) of a run with checkpoints step 0 and step 2."""
    from carl.micro.world import build_micro_tasks

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ckpt")
    base = save_tiny_model(root / "base", head_dim=64)  # 4,096 positions: the harness's prompts fit
    run_dir = root / "run"
    cfg = TrainConfig(
        run_dir=str(run_dir), seed=3,
        model=ModelConfig(path=str(base), dtype="float32", trainable_layers=1),
        limits=EpisodeLimits(max_turns=3, max_new_tokens=24, max_tokens=20_000, context_budget_tokens=4096,
                             wall_time_s=600.0, max_repeat_tokens=16),
        # one episode at a time: no batch padding, whose last-bit differences could flip a sample
        rollout=RolloutConfig(concurrency=1, top_p=0.95),
        eval=EvalConfig(samples_per_task=1, temperature=1.0),
        tools=TOOLS, sandbox=SandboxConfig(backend="local"))
    run_dir.mkdir()
    save_config(cfg, run_dir / "config.toml")
    tokenizer, model = load_model(base, torch.float32)
    save_checkpoint(run_dir, 0, model, tokenizer, None, None, RunState(phase="rl").to_dict())
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    save_checkpoint(run_dir, 2, model, tokenizer, None, None, RunState(phase="done", rl_step=2).to_dict())
    world = build_micro_tasks(root / "micro", seed=0, difficulty=1, repos={"eval": 1}, max_tasks_per_repo=2,
                              backend="local")
    return cfg, run_dir, world["eval"]


def test_the_serving_path_writes_the_episodes_of_the_training_path(run, tmp_path):
    from carl.eval.bench import evaluate
    from carl.harness.tools import default_tools
    from carl.tasks import broken_repo_dir

    cfg, run_dir, tasks = run
    # the training path: the run's sampler (carl.train.loop.open_engine with engine.kind = "hf") at
    # the trained weights (as sync_weights brings them), scored as run_eval does
    engine = HFEngine(sampler_config(cfg, cfg.model.path, cfg.rollout.temperature))
    engine.load_state_dict(load_model(run_dir / "checkpoints" / "step_000002" / "model", torch.float32)[1].state_dict(),
                           version=2)
    tools = {name: tool for name, tool in default_tools().items() if name in cfg.tools}
    with engine.sampling(cfg.eval.temperature):
        report, rollouts = evaluate("after RL", engine, tasks, cfg.eval.samples_per_task, eval_limits(cfg), tools,
                                    cfg.sandbox, max_workers=cfg.rollout.concurrency)
    engine.close()
    assert all(r.valid for r in rollouts) and len(rollouts) == len(tasks) == 2

    for r in rollouts:  # the serving path: the CLI a user runs, on the task's repository
        out = tmp_path / f"{r.task.instance_id}.json"
        assert main(["agent", "run", "--checkpoint", str(run_dir), "--repo", str(broken_repo_dir(r.task)),
                     "--task", r.task.problem_statement, "--task-id", r.task.instance_id, "--out", str(out)]) == 0
        served = Trajectory.from_dict(json.loads(out.read_text()))
        trained = r.trajectory
        assert [s.token_ids_T for s in served.segments] == [s.token_ids_T for s in trained.segments]
        assert [s.generated_mask_T for s in served.segments] == [s.generated_mask_T for s in trained.segments]
        for a, b in zip(served.segments, trained.segments):
            assert a.logprobs_T == pytest.approx(b.logprobs_T, abs=1e-4)  # prefix reuse differs: last bits
        assert [s.versions for s in served.segments] == [s.versions for s in trained.segments]  # step 2's weights
        assert [(t.assistant, t.finish_reason) for t in served.turns] == \
            [(t.assistant, t.finish_reason) for t in trained.turns]
        assert served.stop_reason == trained.stop_reason
        assert served.metadata["checkpoint"]["step"] == 2 and served.metadata["sandbox"] == "local"
    assert sum(r.trajectory.num_generated_tokens for r in rollouts) > 20  # the model sampled something
    assert len({t.assistant for r in rollouts for t in r.trajectory.turns}) > 1


def test_load_checkpoint_policy_reads_the_runs_sampling_limits_and_tools(run):
    cfg, run_dir, _ = run
    engine, limits, info = load_checkpoint_policy(str(run_dir))
    try:
        assert info["step"] == 2 and engine.policy_version == 2
        assert info["model"] == str(run_dir / "checkpoints" / "step_000002" / "model")
        assert limits == eval_limits(cfg) and limits.max_repeat_tokens == 16
        assert (info["temperature"], info["top_p"], info["seed"]) == (1.0, 0.95, 3)
        assert engine.default_sampling.temperature == 1.0 and engine.default_sampling.top_p == 0.95
        assert info["tools"] == TOOLS and info["sandbox"] == cfg.sandbox and info["dtype"] == "float32"
    finally:
        engine.close()
    engine, _, info = load_checkpoint_policy(f"{run_dir}:0", temperature=0.0, top_p=0.5, seed=9)
    engine.close()
    assert info["step"] == 0 and (info["temperature"], info["top_p"], info["seed"]) == (0.0, 0.5, 9)
    for spec in (run_dir / "checkpoints" / "step_000000", run_dir / "checkpoints" / "step_000000" / "model"):
        engine, _, info = load_checkpoint_policy(str(spec))
        engine.close()
        assert (info["step"], info["run_dir"], info["temperature"]) == (0, str(run_dir), 1.0)
    engine, limits, info = load_checkpoint_policy(cfg.model.path)  # a plain model folder: no run
    engine.close()
    assert limits == EpisodeLimits() and info["run_dir"] is None and info["tools"] is None
    assert (info["step"], info["temperature"], engine.policy_version) == (None, 0.0, 0)


@pytest.mark.parametrize("suffix,message", [
    (":5", "has no checkpoint step_000005; it has ['step_000000', 'step_000002']"),
    (":last", "expected PATH or RUN_DIR:STEP (a number)"),
    ("/micro-not-here", "holds no model; expected a carl run directory"),
])
def test_a_spec_without_a_model_is_a_clear_error(run, suffix, message):
    _, run_dir, _ = run
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")
                       .replace(")", r"\)")):
        load_checkpoint_policy(f"{run_dir}{suffix}")


def test_a_step_needs_a_run_directory_and_a_run_needs_a_checkpoint(run, tmp_path):
    cfg, _, _ = run
    with pytest.raises(UserError, match="not a carl run directory"):
        load_checkpoint_policy(f"{cfg.model.path}:1")
    fresh = tmp_path / "fresh"
    (fresh / "checkpoints").mkdir(parents=True)
    save_config(dataclasses.replace(cfg, run_dir=str(fresh)), fresh / "config.toml")
    with pytest.raises(UserError, match="has no complete checkpoint yet"):
        load_checkpoint_policy(str(fresh))
