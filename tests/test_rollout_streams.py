"""RL rollouts sample from streams named by their task and their number in the run (rollout.seeded):
rollout j of the group at task-stream position p is number p * G + j whatever order the threads
finish in, a resumed run gives the same positions the same numbers, and each rollout's policy is
the engine's episode view named "<task id>/rl/<number>" (its turns' seeds: carl.engine.streams)."""

import random
import time

import carl.train.loop as loop
from carl.config import load_config
from carl.engine.streams import EpisodeStream
from carl.rollout.orchestrator import Orchestrator
from carl.rollout.rollout import Rollout
from carl.rollout.workers import rl_submit
from carl.tasks.store import TaskRecord
from carl.train.config import TrainConfig
from carl.types import Segment, Trajectory

G, T = 3, 2
TASKS = [TaskRecord(instance_id=f"t{k}", repo="r") for k in range(5)]
ORDER = [3, 1, 4, 0, 2]


class Engine:
    """What RL asks of an engine here (the episodes themselves are faked)."""

    tokenizer = None
    policy_version = 0

    def episode(self, key):
        return EpisodeStream(self, 11, key)


def fake_rollout(policy, task, *args):
    """An episode that finishes after a random delay and reports which policy it was given."""
    time.sleep(random.random() * 0.02)
    name = policy.key if isinstance(policy, EpisodeStream) else type(policy).__name__
    seg = Segment(token_ids_T=[1], generated_mask_T=[True], versions=[[0, 1, policy.policy_version]])
    traj = Trajectory(task_id=name, segments=[seg], policy_version=policy.policy_version)
    return Rollout(task=task, trajectory=traj, reward=0.0, passed=False)


def policies(monkeypatch, seeded: bool, first_step: int, steps: int) -> dict[tuple[int, int], str]:
    """{(group position, sample index): the policy its rollout sampled from}, over `steps` synchronous
    RL steps from `first_step` (a resumed run starts at task position first_step * T)."""
    monkeypatch.setattr(loop, "run_rollout", fake_rollout)
    cfg = load_config(TrainConfig, None, [f"rollout.seeded={str(seeded).lower()}", "rollout.concurrency=4"])
    engine = Engine()
    engine.policy_version = first_step
    workers = loop.make_workers(cfg, engine, TASKS, cfg.limits, {})
    orch = Orchestrator(rl_submit(workers, G), len(TASKS), ORDER, G, T, 0, "pace", first_step * T, first_step).start()
    out = {}
    try:
        for step in range(first_step, first_step + steps):
            for group in orch.take(step).groups:
                assert all(r.task is TASKS[group.task_index] for r in group.rollouts)
                out.update({(group.pos, j): r.trajectory.task_id for j, r in enumerate(group.rollouts)})
            engine.policy_version = step + 1  # the trainer's new weights reach the engine
            orch.set_version(step + 1)
    finally:
        orch.stop()
        workers.close()
    return out


def test_each_rl_rollout_samples_from_a_stream_named_by_its_task_and_number(monkeypatch):
    got = policies(monkeypatch, seeded=True, first_step=0, steps=3)
    assert got == {(p, j): f"t{ORDER[p % len(ORDER)]}/rl/{p * G + j}" for p in range(3 * T) for j in range(G)}
    # a run resumed after step 1 starts at task position 2 T: the same rollouts, the same streams
    resumed = policies(monkeypatch, seeded=True, first_step=1, steps=2)
    assert resumed == {k: v for k, v in got.items() if k[0] >= T}


def test_unseeded_rl_rollouts_sample_from_the_engine_itself(monkeypatch):
    got = policies(monkeypatch, seeded=False, first_step=0, steps=1)
    assert set(got.values()) == {"Engine"} and len(got) == T * G
