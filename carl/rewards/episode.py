"""One call for the rollout worker: a finished episode in, its reward and monitor report out.

trajectory.stop_reason is POLICY_ERROR / SANDBOX_ERROR --> infra failure (masked), no tests run
else: workspace_changes(agent sandbox) --> compute_reward (clean sandbox) + monitor
      --> reward after the monitor's action (tampering the test runner caught is a flag too)

Shaping the training reward from it is `carl.rewards.shaping`'s job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from carl.rewards.diff import WorkspaceDiff, workspace_changes
from carl.rewards.monitor import Flag, MonitorConfig, MonitorReport, apply_action, monitor
from carl.rewards.reward import OpenSandbox, RewardConfig, RewardResult, compute_reward, infra_failure
from carl.sandbox.base import Sandbox, SandboxError
from carl.types import Trajectory

@dataclass(frozen=True)
class EpisodeReward:
    reward: float
    """What the trainer uses: the test reward after the monitor's action (0.0 on infra failure;
    check `infra_failure` and mask)."""
    result: RewardResult
    monitor: MonitorReport
    diff: str = ""
    """The final diff of the episode (all changes, tests included)."""

    @property
    def infra_failure(self) -> bool:
        return self.result.infra_failure


def reward_from_trajectory(
    trajectory: Trajectory,
    task: Any,
    agent_sandbox: Sandbox,
    config: RewardConfig,
    monitor_config: MonitorConfig | None = None,
    *,
    open_sandbox: OpenSandbox | None = None,
) -> EpisodeReward:
    """Reward and monitor one finished episode whose workspace is still open in `agent_sandbox`."""
    from carl.tasks.store import broken_repo_dir

    monitor_config = monitor_config or MonitorConfig()
    if trajectory.stop_reason.is_infra_failure:
        error = f"{trajectory.stop_reason.value}: {trajectory.error or 'no detail'}"
        return EpisodeReward(0.0, infra_failure(error), monitor(trajectory, task, None))
    t0 = time.monotonic()
    try:
        changes: WorkspaceDiff | None = workspace_changes(
            agent_sandbox, str(broken_repo_dir(task)), task.test_files
        )
    except (SandboxError, OSError) as e:
        result = infra_failure(f"{type(e).__name__}: {e}", time.monotonic() - t0)
        return EpisodeReward(0.0, result, monitor(trajectory, task, None))
    result = compute_reward(task, agent_sandbox, config, changes=changes, open_sandbox=open_sandbox)
    report = monitor(trajectory, task, changes)
    if result.tampering:  # what the test runner itself caught is evidence too
        seen = [Flag("runner_tamper", evidence[:300], None) for evidence in result.tampering]
        report = MonitorReport(flags=tuple(dict.fromkeys([*report.flags, *seen])), suspicious=True)
    reward = 0.0 if result.infra_failure else apply_action(result.reward, report, monitor_config)
    return EpisodeReward(reward, result, report, diff=changes.text)
