"""Rewards and the reward-hacking monitor (DESIGN 1.4).

    workspace_changes(sandbox, broken_repo_dir) -> WorkspaceDiff    what the agent changed
    compute_reward(task, agent_sandbox, config) -> RewardResult     tests in a clean sandbox
    monitor(trajectory, task, changes)          -> MonitorReport    flags known reward hacks
    reward_from_trajectory(...)                 -> EpisodeReward    all three, for rollout workers
    training_reward(episode reward, traj, cfg)  -> (float, passed)  shaping: failed calls, finish (shaping.py)
    judge_diff(diff, statement, chat, config)   -> JudgeResult      optional LLM style score (shaping)

This package never imports torch.
"""

from carl.rewards.diff import FileChange, WorkspaceDiff, is_test_path, workspace_changes
from carl.rewards.episode import EpisodeReward, reward_from_trajectory
from carl.rewards.judge import JudgeConfig, JudgeResult, judge_diff, shaped_reward
from carl.rewards.monitor import FLAG_KINDS, Flag, MonitorConfig, MonitorReport, apply_action, monitor
from carl.rewards.reward import RewardConfig, RewardResult, compute_reward
from carl.rewards.shaping import ShapingConfig, tool_error_penalty, training_reward

__all__ = [
    "FLAG_KINDS",
    "EpisodeReward",
    "FileChange",
    "Flag",
    "JudgeConfig",
    "JudgeResult",
    "MonitorConfig",
    "MonitorReport",
    "RewardConfig",
    "RewardResult",
    "ShapingConfig",
    "WorkspaceDiff",
    "apply_action",
    "compute_reward",
    "is_test_path",
    "judge_diff",
    "monitor",
    "reward_from_trajectory",
    "shaped_reward",
    "tool_error_penalty",
    "training_reward",
    "workspace_changes",
]
