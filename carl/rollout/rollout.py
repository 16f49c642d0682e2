"""Rollouts: G episodes per task, each in its own sandbox, rewarded by the task reward.

    tasks --+--> [episode 1: open_sandbox -> run_episode(policy) -> reward + monitor -> close]
            |--> [episode 2: ...]           (threads; the policy batches their generate calls)
            +--> [episode G*tasks: ...]
                            v
                 groups: list[list[Rollout]]  (one list per task, in task order)

A rollout whose infrastructure failed (sandbox crash, policy error, reward sandbox failure) is
`valid=False`: it is masked out of its group's advantages, never scored 0. Any exception inside
one episode becomes such an error record; it never stops the other episodes.
"""

from __future__ import annotations

import dataclasses
import traceback
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from carl.harness.agent import EpisodeLimits, run_episode
from carl.harness.tools.base import Tool
from carl.rewards.episode import reward_from_trajectory
from carl.rewards.shaping import ShapingConfig, given_back, group_rewards, trained, training_reward
from carl.rewards.monitor import MonitorConfig
from carl.rewards.reward import RewardConfig
from carl.sandbox import open_sandbox
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord, broken_repo_dir, sandbox_config_for
from carl.types import StopReason, Trajectory


@dataclass
class Rollout:
    task: TaskRecord
    trajectory: Trajectory
    reward: float = 0.0
    """The training reward: the test reward after the monitor's action, minus the tool-error
    penalty when a cost is set (`passed` is the outcome)."""
    valid: bool = True
    """False for infrastructure failures: masked out of advantages and losses."""
    trained: bool = True
    """False for a valid episode that shaping leaves out of training (`shaping.mask_unfinished`
    and no finish call): out of advantages and losses, but its reward and outcome count."""
    passed: bool = False
    """The tests pass in a clean sandbox and the monitor saw nothing suspicious (and, with
    `require_finish`, the agent called finish)."""
    feedback: str = ""
    """The failing test output of the clean-sandbox reward (self-distillation's hint)."""
    monitor_flags: list[str] = field(default_factory=list)
    diff: str = ""
    advantage: float | None = None
    """Set by a caller with its own baseline (production has one sample per prompt:
    carl.online.batch); None: the group's mean is the baseline (GRPO)."""
    feedback_heading: str = "The final tests failed:"
    """What the self-distillation hint says `feedback` is (production: the user's follow-up)."""


def collect_groups(
    policy_factory: Callable[[int, int], Any],
    tasks: list[TaskRecord],
    group_size: int,
    limits: EpisodeLimits,
    tools: dict[str, Tool],
    sandbox: SandboxConfig,
    reward: RewardConfig = RewardConfig(),
    monitor: MonitorConfig = MonitorConfig(),
    max_workers: int = 16,
    shaping: ShapingConfig = ShapingConfig(),
    on_done: Callable[[Rollout], None] = lambda r: None,
) -> list[list[Rollout]]:
    """Run `group_size` episodes of every task concurrently; returns one group per task.

    `policy_factory(t, j)` gives the policy of sample j of task `tasks[t]`: the shared batched token
    policy for RL, the episode streams named by (task, sample) for evaluation, or a fresh scripted
    expert per episode for warm-start data. `shaping` turns test rewards into training rewards
    (`carl.rewards.shaping`). `on_done` sees each rollout as it finishes (progress).
    """
    jobs = [(t, j) for t in range(len(tasks)) for j in range(group_size)]

    def run(tj: tuple[int, int]) -> Rollout:
        r = run_rollout(policy_factory(*tj), tasks[tj[0]], limits, tools, sandbox, reward, monitor, shaping)
        on_done(r)
        return r

    with ThreadPoolExecutor(max_workers=min(max_workers, len(jobs))) as pool:
        results = list(pool.map(run, jobs))
    return [results[i * group_size : (i + 1) * group_size] for i in range(len(tasks))]


def run_rollout(policy: Any, task: TaskRecord, limits: EpisodeLimits, tools: dict[str, Tool],
                base: SandboxConfig, reward: RewardConfig, monitor: MonitorConfig,
                shaping: ShapingConfig = ShapingConfig()) -> Rollout:
    version = getattr(policy, "policy_version", 0)  # the weights this episode starts with
    try:
        config = sandbox_config_for(task, base)
        with open_sandbox(broken_repo_dir(task), config) as sandbox:
            traj = run_episode(policy, sandbox, task, limits, tools)
            traj.policy_version = version
            if traj.stop_reason.is_infra_failure:
                return Rollout(task, traj, valid=False, feedback=traj.error or "")
            # the reward's clean sandbox gets the task's environment, like the agent's
            r = reward_from_trajectory(traj, task, sandbox, dataclasses.replace(reward, sandbox=config), monitor)
    except Exception:  # a crashed episode becomes an error record, masked from training
        traj = Trajectory(task_id=task.instance_id, stop_reason=StopReason.SANDBOX_ERROR,
                          error=traceback.format_exc(), policy_version=version)
        return Rollout(task, traj, valid=False, feedback=traj.error)
    if r.infra_failure:  # the reward's sandbox failed: keep why, as an episode's own failure does
        traj.error = traj.error or r.result.infra_error
    shaped, passed = training_reward(r, traj, shaping)
    traj.metadata["reward"] = shaped
    return Rollout(
        task=task,
        trajectory=traj,
        reward=shaped,
        valid=not r.infra_failure,
        trained=trained(traj, shaping),
        passed=passed,
        feedback=r.result.feedback,
        monitor_flags=sorted(r.monitor.kinds()),
        diff=r.diff,
    )


def infra_error(r: Rollout) -> str:
    """One line saying why an invalid rollout's infrastructure failed: the last line of its error
    (an exception's type and message, not the traceback above it); "" for a valid rollout."""
    if r.valid:
        return ""
    lines = [line.strip() for line in (r.trajectory.error or "").splitlines() if line.strip()]
    line = lines[-1] if lines else f"{r.trajectory.stop_reason.value} (no detail)"
    return line if len(line) <= 300 else line[:297] + "..."


def require_valid(rollouts: list[Rollout], what: str) -> None:
    """Raise when no rollout is valid: every episode failed in the infrastructure (a missing repo,
    a broken sandbox or environment), so there is nothing to train on or to score."""
    if rollouts and not any(r.valid for r in rollouts):
        errors = Counter(infra_error(r) for r in rollouts)
        lines = "\n".join(f"  {n}x {e}" for e, n in errors.most_common(3))
        raise RuntimeError(f"{what}: all {len(rollouts)} episodes failed in the infrastructure (sandbox, policy "
                           f"or reward), so none can be scored. Their errors:\n{lines}")


def shape_group(group: list[Rollout], shaping: ShapingConfig) -> list[Rollout]:
    """The group with the group-level part of shaping applied (`group_rewards`: with
    cost_needs_pass, each valid rollout's tool-error penalty, which its reward includes, is given
    back, all of it or its `given_back` part, where none of the valid, trained rollouts passed)."""
    penalties = [given_back(r.trajectory, shaping) if r.valid else 0.0 for r in group]
    rewards = group_rewards([r.reward for r in group], penalties,
                            [r.passed and r.valid and r.trained for r in group], shaping)
    return [r if new == r.reward else dataclasses.replace(r, reward=new) for r, new in zip(group, rewards)]


def has_signal(group: list[Rollout]) -> bool:
    """Whether the group's valid rollouts differ in outcome (some passed, some failed): only then
    does GRPO see an advantage from the task itself (and a failed rollout a successful sibling to
    be distilled towards). Rewards that differ only by the tool-error penalty do not count, so
    dynamic sampling keeps looking for task signal."""
    return len({r.passed for r in group if r.valid and r.trained}) > 1


def rollout_metrics(groups: list[list[Rollout]]) -> dict[str, float]:
    flat = [r for g in groups for r in g]
    valid = [r for r in flat if r.valid]
    n = max(len(valid), 1)
    calls = sum(r.trajectory.num_tool_calls for r in valid)
    # attempted calls = parsed calls + calls that failed to parse (each parse error is one attempt)
    attempts = calls + sum(len(t.errors) for r in valid for t in r.trajectory.turns)
    return {
        "rl/reward_mean": sum(r.reward for r in valid) / n,
        "rl/pass_rate": sum(r.passed for r in valid) / n,
        "rl/tokens_per_episode": sum(r.trajectory.num_tokens for r in valid) / n,
        "rl/generated_tokens_per_episode": sum(r.trajectory.num_generated_tokens for r in valid) / n,
        "rl/tool_calls_per_episode": calls / n,
        "rl/tool_error_rate": sum(r.trajectory.num_tool_errors for r in valid) / max(attempts, 1),
        "rl/turns_per_episode": sum(len(r.trajectory.turns) for r in valid) / n,
        "rl/summaries_per_episode": sum(r.trajectory.metadata.get("num_summaries", 0) for r in valid) / n,
        "rl/truncations_per_episode": sum(r.trajectory.metadata.get("num_truncations", 0) for r in valid) / n,
        "rl/finish_rate": sum(r.trajectory.stop_reason == StopReason.FINISHED for r in valid) / n,
        "rl/untrained": float(sum(not r.trained for r in valid)),
        "rl/infra_failures": float(len(flat) - len(valid)),
        "rl/monitor_flagged": float(sum(bool(r.monitor_flags) for r in valid)),
    }
