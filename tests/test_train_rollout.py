"""A crashed episode becomes a masked error record that keeps its policy version."""

from carl.harness.agent import EpisodeLimits
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.train.rollout import collect_groups, rollout_metrics
from carl.types import StopReason


class VersionedPolicy:
    policy_version = 7

    def chat(self, messages, max_new_tokens):
        raise AssertionError("never reached: the sandbox cannot open")


def test_crashed_episode_is_invalid_not_zero(tmp_path):
    task = TaskRecord(instance_id="t1", repo="r", broken_repo=str(tmp_path / "missing"))
    groups = collect_groups(lambda i: VersionedPolicy(), [task], 2, EpisodeLimits(max_turns=2), {},
                            SandboxConfig(backend="local"))
    assert len(groups) == 1 and len(groups[0]) == 2
    for r in groups[0]:
        assert not r.valid
        assert r.trajectory.stop_reason is StopReason.SANDBOX_ERROR
        assert r.trajectory.policy_version == 7
        assert "Traceback" in r.feedback
    m = rollout_metrics(groups)
    assert m["rl/infra_failures"] == 2.0 and m["rl/reward_mean"] == 0.0
