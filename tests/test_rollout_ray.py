"""Rollout workers on a local Ray cluster (2 actors, fractional CPUs) against a vLLM engine: they
complete RL steps through the orchestrator, and killing an actor mid-step loses no rollout."""

import os
import signal
import time

import pytest
import torch
from tiny_hf import save_tiny_model

ray = pytest.importorskip("ray")

from carl.engine.base import SamplingParams  # noqa: E402
from carl.engine.config import EngineConfig  # noqa: E402
from carl.engine.hf import load_model  # noqa: E402
from carl.engine.vllm import VLLMEngine  # noqa: E402
from carl.engine.weights import WeightStore  # noqa: E402
from carl.harness.agent import EpisodeLimits  # noqa: E402
from carl.rewards.monitor import MonitorConfig  # noqa: E402
from carl.rewards.shaping import ShapingConfig  # noqa: E402
from carl.rollout.orchestrator import Orchestrator  # noqa: E402
from carl.rollout.workers import EpisodeSpec, RayWorkers, rl_submit  # noqa: E402
from carl.sandbox.base import SandboxConfig  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.filterwarnings("ignore:carl. the .local. sandbox backend")]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    from carl.micro.world import build_micro_tasks

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("ray")
    tasks = build_micro_tasks(root / "micro", seed=0, difficulty=1, repos={"rl": 1}, max_tasks_per_repo=2,
                              backend="local")["rl"]
    model = save_tiny_model(root / "tiny", head_dim=64)
    engine = VLLMEngine(model, root / "weights", EngineConfig(kv_cache_gb=1), root / "engine", max_model_len=4096,
                        dtype="float32", log=lambda m: None)
    spec = EpisodeSpec(tasks, EpisodeLimits(max_turns=2, max_new_tokens=16, context_budget_tokens=4096),
                       ("read_file", "finish"), SandboxConfig(backend="local"), MonitorConfig(), ShapingConfig(),
                       engine.url, str(model), 4096, 0, SamplingParams(1.0))
    # a cluster of its own: a bare ray.init() joins the one another test's ray.cluster_utils.Cluster announces
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers = RayWorkers(spec, actors=2, per_actor=2, cpus_per_actor=0.5)
    store = WeightStore(root / "weights", torch.float32)
    trainer = load_model(model, torch.float32)[1]

    def new_version(version: int) -> None:  # what the trainer does after a step: the engine follows
        store.push(engine, store.publish(trainer, version))

    new_version(0)
    yield tasks, workers, new_version
    workers.close()
    ray.shutdown()
    engine.close()


def test_two_ray_actors_complete_rl_steps(world):
    tasks, workers, new_version = world
    orch = Orchestrator(rl_submit(workers, 2), len(tasks), list(range(len(tasks))), group_size=2, tasks_per_step=2,
                        max_staleness=0, stale="pace", start_pos=0, start_version=0).start()
    try:
        for step in range(2):
            got = orch.take(step)
            assert len(got.groups) == 2 and all(len(g.rollouts) == 2 for g in got.groups)
            assert all(r.valid and r.trajectory.num_generated_tokens > 0 for g in got.groups for r in g.rollouts)
            assert all(g.min_version == step for g in got.groups)
            new_version(step + 1)
            orch.set_version(step + 1)
    finally:
        orch.stop()
    pids = {ray.get(a.pid.remote()) for a in workers.actors}
    assert len(pids) == 2  # two actor processes did the work


def test_killing_an_actor_mid_step_loses_no_rollout(world):
    tasks, workers, _ = world
    orch = Orchestrator(rl_submit(workers, 4), len(tasks), list(range(len(tasks))), group_size=4, tasks_per_step=2,
                        max_staleness=0, stale="pace", start_pos=0, start_version=2).start()
    try:
        time.sleep(1.0)  # episodes are in flight on both actors
        victim = workers.actors[0]
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        got = orch.take(2)  # the engine holds version 2 after the first test's steps
    finally:
        orch.stop()
    assert workers.replaced >= 1
    rollouts = [r for g in got.groups for r in g.rollouts]
    assert len(rollouts) == 8 and all(r.valid for r in rollouts)  # every episode came back, re-run if it died
