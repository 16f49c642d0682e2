"""The benchmark runner: n samples per held-out task through the production harness and reward.

    tasks x n --collect_groups (sandboxes, run_episode, clean-sandbox reward)--> samples
        --> BenchReport (pass@1, pass@k, tokens, tool calls, wall time per task)

The same runner evaluates a training checkpoint (`carl eval --checkpoint DIR`), the warm-start
and RL checkpoints inside `carl train`, and any OpenAI-compatible endpoint.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from carl.eval.report import BenchReport, Sample, build_report
from carl.harness.agent import EpisodeLimits
from carl.harness.tools.base import Tool
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.rollout.rollout import Rollout, collect_groups, infra_error


def evaluate(name: str, policy: Any, tasks: list[TaskRecord], samples_per_task: int,
             limits: EpisodeLimits, tools: dict[str, Tool], sandbox: SandboxConfig,
             max_workers: int = 16) -> tuple[BenchReport, list[Rollout]]:
    """Every task `samples_per_task` times, `max_workers` episodes at once; the report and the rollouts.

    A policy with seeded episode streams (`HFEngine.episode`) samples sample j of task t from the
    streams named "t/j", so the eval repeats under the policy's seed, and two checkpoints evaluated
    with the same seed are compared on common random numbers (see `carl.engine.streams`)."""
    groups = collect_groups(episode_policies(policy, tasks), tasks, samples_per_task, limits,
                            tools, sandbox, max_workers=max_workers)
    rollouts = [r for g in groups for r in g]
    return build_report(name, [to_sample(r) for r in rollouts], k=samples_per_task), rollouts


def episode_policies(policy: Any, tasks: list[TaskRecord]) -> Callable[[int, int], Any]:
    """`collect_groups`'s policy factory: sample j of task t samples from the streams named "<task id>/j"."""
    if not hasattr(policy, "episode"):  # scripted policies: one shared policy
        return lambda t, j: policy
    return lambda t, j: policy.episode(f"{tasks[t].instance_id}/{j}")


def to_sample(r: Rollout) -> Sample:
    t = r.trajectory
    return Sample(
        task_id=r.task.instance_id,
        passed=r.passed,
        reward=r.reward,
        generated_tokens=t.num_generated_tokens,
        tool_calls=t.num_tool_calls,
        tool_errors=t.num_tool_errors,
        wall_s=t.wall_s,
        infra_failure=not r.valid,
        error=infra_error(r),
        stop_reason=t.stop_reason.value,
        digest=episode_digest(r.trajectory),
    )


def episode_digest(trajectory) -> str:
    """12 hex digits of a hash of the episode's assistant messages: two checkpoints scored on common
    random numbers (`evaluate`) wrote the same episode exactly when their digests are equal."""
    h = hashlib.blake2b(digest_size=6)
    for turn in trajectory.turns:
        h.update(turn.assistant.encode() + b"\0")
    return h.hexdigest()
