"""The rollout orchestrator with fake episodes: staleness 0 is synchronous RL, larger bounds run
rollouts ahead and never hand the trainer a group older than the bound ("pace" never starts one,
"drop" drops it), dynamic sampling asks for more batches, and a worker's failure reaches the trainer."""

import threading
import time
from concurrent.futures import Future

import pytest

from carl.rollout.orchestrator import Orchestrator
from carl.rollout.rollout import Rollout
from carl.types import Segment, Trajectory

G, T = 2, 3


class FakeEpisodes:
    """Episodes that take `episode_s`, sampled at the engine version current when each starts (and,
    when `turns` > 1, one more turn at the version current half way)."""

    def __init__(self, episode_s=0.02, passed=lambda t, j: j == 0, turns=1):
        self.version = 0
        self.started: list[tuple[int, int, int]] = []  # (task, sample, version at start)
        self.episode_s, self.passed, self.turns = episode_s, passed, turns
        self.lock = threading.Lock()

    def submit(self, t: int, j: int, version: int, pos: int = 0) -> Future:
        fut: Future = Future()
        with self.lock:
            self.started.append((t, j, self.version))

        def run():
            seg = Segment(token_ids_T=[1] * 8, generated_mask_T=[True] * 8)
            for k in range(self.turns):
                seg.versions.append([k * 8 // self.turns, 8 // self.turns, self.version])
                time.sleep(self.episode_s / self.turns)
            traj = Trajectory(task_id=str(t), segments=[seg], policy_version=version)
            fut.set_result(Rollout(task=None, trajectory=traj, reward=float(self.passed(t, j)),
                                   passed=self.passed(t, j)))

        threading.Thread(target=run, daemon=True).start()
        return fut


def _orchestrator(ep, S, stale="pace", extra=0, start_pos=0, start_version=0, end_step=None):
    return Orchestrator(ep.submit, num_tasks=10, order=list(range(10)), group_size=G, tasks_per_step=T,
                        max_staleness=S, stale=stale, start_pos=start_pos, start_version=start_version,
                        max_extra_batches=extra, end_step=end_step).start()


def _train(orch, ep, steps, train_s=0.05):
    taken = []
    for step in range(steps):
        got = orch.take(step)
        taken.append(got)
        time.sleep(train_s)  # the trainer's step
        ep.version = step + 1  # the engine loads the new weights
        orch.set_version(step + 1)
    orch.stop()
    return taken


def test_staleness_0_is_synchronous_rl():
    ep = FakeEpisodes()
    taken = _train(_orchestrator(ep, S=0), ep, steps=3)
    for step, got in enumerate(taken):
        assert [g.pos for g in got.groups] == [step * T + i for i in range(T)]  # the task order, in order
        assert all(g.min_version == step for g in got.groups) and got.dropped == 0
        assert got.staleness["staleness/token_max"] == 0.0
    # no episode of a later step started before the engine held that step's weights
    assert all(v == t // T for t, _, v in ep.started), ep.started


def test_staleness_1_runs_the_next_steps_rollouts_while_the_trainer_trains():
    ep = FakeEpisodes()
    taken = _train(_orchestrator(ep, S=1), ep, steps=4, train_s=0.1)
    ahead = [(t, v) for t, _, v in ep.started if v < t // T]  # started before the engine held its step
    assert ahead, "nothing was produced ahead of the trainer"
    for step, got in enumerate(taken):
        assert all(step - g.min_version <= 1 for g in got.groups)
        assert got.dropped == 0  # pacing never starts a group that would be too old
    assert any(got.staleness["staleness/token_max"] == 1.0 for got in taken)


@pytest.mark.parametrize("S", [0, 1, 2])
def test_no_group_starts_for_a_step_past_the_runs_last(S):
    """With end_step (rl.steps), the episodes started are exactly those the steps train on: none for
    a step the run never takes, which the run would otherwise wait for as it ends."""
    ep = FakeEpisodes()
    taken = _train(_orchestrator(ep, S=S, end_step=3), ep, steps=3, train_s=0.1)
    time.sleep(0.1)  # time for a group the producer should not start
    assert len(ep.started) == sum(len(got.groups) for got in taken) * G == 3 * T * G


def test_drop_keeps_workers_busy_and_drops_groups_older_than_the_bound():
    ep = FakeEpisodes(episode_s=0.01)
    taken = _train(_orchestrator(ep, S=0, stale="drop"), ep, steps=3, train_s=0.2)
    assert sum(got.dropped for got in taken) > 0
    for step, got in enumerate(taken):
        assert all(g.min_version == step for g in got.groups) and len(got.groups) == T


def test_a_turn_sampled_after_an_update_counts_for_the_groups_versions():
    ep = FakeEpisodes(episode_s=0.2, turns=2)
    orch = _orchestrator(ep, S=1)
    first = orch.take(0)
    ep.version = 1
    orch.set_version(1)
    second = orch.take(1)
    orch.stop()
    assert all(g.min_version == 0 for g in first.groups)
    versions = {v for g in second.groups for v, _ in g.token_versions}
    assert versions <= {0, 1} and second.staleness["staleness/token_mean"] <= 1.0


def test_dynamic_sampling_takes_more_batches_until_a_group_has_signal():
    ep = FakeEpisodes(passed=lambda t, j: t >= T and j == 0)  # the first batch's tasks: all fail
    orch = _orchestrator(ep, S=0, extra=2)
    got = orch.take(0)
    orch.stop()
    assert got.batches == 2 and len(got.groups) == 2 * T and got.task_pos == 2 * T


def test_a_budgets_last_step_draws_no_more_batches_than_the_budget_allows():
    ep = FakeEpisodes(passed=lambda t, j: False)  # no batch ever has signal
    orch = _orchestrator(ep, S=0, extra=2)
    first = orch.take(0, max_batches=2)
    ep.version = 1
    orch.set_version(1)  # synchronous: step 1's groups start after the update
    second = orch.take(1, max_batches=1)
    orch.stop()
    assert (first.batches, len(first.groups)) == (2, 2 * T) and (second.batches, len(second.groups)) == (1, T)


def test_a_resume_starts_at_its_task_position_and_version():
    ep = FakeEpisodes()
    ep.version = 5
    orch = _orchestrator(ep, S=0, start_pos=7, start_version=5)
    got = orch.take(5)
    orch.stop()
    assert [g.pos for g in got.groups] == [7, 8, 9] and got.task_pos == 10
    assert [g.task_index for g in got.groups] == [7, 8, 9]


def test_a_failing_worker_reaches_the_trainer():
    def submit(t, j, version, pos):
        fut: Future = Future()
        fut.set_exception(OSError("the worker's machine is gone"))
        return fut

    orch = Orchestrator(submit, 4, [0, 1, 2, 3], G, T, 0, "pace", 0, 0).start()
    with pytest.raises(RuntimeError, match="machine is gone"):
        orch.take(0)
    orch.stop()


def test_a_bad_mode_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match="rollout.stale"):
        Orchestrator(FakeEpisodes().submit, 4, [0, 1, 2, 3], G, T, 0, "hurry", 0, 0)


def test_groups_that_are_always_too_old_stop_the_run_instead_of_rolling_out_forever():
    ep = FakeEpisodes(episode_s=0.005)  # the engine never follows: every group samples at version 0
    orch = _orchestrator(ep, S=0, stale="drop")
    orch.take(0)
    orch.set_version(1)  # the trainer moved on, the engine did not (ep.version stays 0)
    with pytest.raises(RuntimeError, match="not following the trainer's weights"):
        orch.take(1)
    orch.stop()
