"""The benchmark runner: n samples per held-out task through the production harness and reward.

    tasks x n --run_samples: ThreadWorkers (carl.rollout.workers; `carl bench run --ray`: Ray actors,
               BenchEpisodes), each sample its own sandbox,
               run_rollout (run_episode, then the clean-sandbox test reward and the monitor, with
               RL's monitor action)--> on_sample(t, j, rollout) as each finishes
        --> Sample (outcome, tokens in and out, tool calls, wall time, monitor flags)
        --> BenchReport (pass@1, pass@k, tokens, tool calls, wall time per task)

The same runner evaluates a training checkpoint (`carl eval`), the warm-start and RL checkpoints
inside `carl train`, the online gate, and `carl bench run`, which also resumes a killed run: it
skips the samples already scored and appends each new one as it finishes (carl.eval.bench_run).

Tokens: a token policy's trajectory is token-exact, so a sample's input tokens are the context
each of its generations was prompted with (as an API bills requests without prompt caching) and
its output tokens the sampled ones. A chat endpoint's are the server's own counts (`usage` of
each reply, carl.engine.openai_client.ChatReply); a server that sends none leaves them uncounted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from typing import Any

from carl.eval.report import BenchReport, Sample, build_report
from carl.harness.agent import EpisodeLimits
from carl.harness.tools.base import Tool
from carl.rewards.monitor import MonitorConfig
from carl.rewards.reward import RewardConfig
from carl.sandbox.base import SandboxConfig
from carl.tasks import TaskRecord
from carl.rollout.rollout import Rollout, infra_error, run_rollout

RL_MONITOR = MonitorConfig(action="zero")
"""RL's monitor action (carl.train.config.TrainConfig.monitor): a flagged sample's reward is 0.
A flagged sample never passes, whatever the action."""


def evaluate(name: str, policy: Any, tasks: list[TaskRecord], samples_per_task: int,
             limits: EpisodeLimits, tools: dict[str, Tool], sandbox: SandboxConfig,
             max_workers: int = 16, monitor: MonitorConfig = RL_MONITOR,
             on_sample: Callable[[int, int, Rollout], None] = lambda t, j, r: None,
             ) -> tuple[BenchReport, list[Rollout]]:
    """Every task `samples_per_task` times, `max_workers` episodes at once; the report and the
    rollouts (task by task, sample by sample). `on_sample(t, j, rollout)` hears of each sample as
    it finishes (progress).

    A policy with seeded episode streams (`HFEngine.episode`) samples sample j of task t from the
    streams named "t/j", so the eval repeats under the policy's seed, and two checkpoints evaluated
    with the same seed are compared on common random numbers (see `carl.engine.streams`)."""
    done: dict[tuple[int, int], Rollout] = {}

    def keep(t: int, j: int, r: Rollout) -> None:
        done[(t, j)] = r
        on_sample(t, j, r)

    run_samples(policy, tasks, samples_per_task, limits, tools, sandbox, max_workers, monitor, on_sample=keep)
    keys = [(t, j) for t in range(len(tasks)) for j in range(samples_per_task)]
    return build_report(name, [to_sample(done[k], k[1]) for k in keys], k=samples_per_task), [done[k] for k in keys]


def run_samples(policy: Any, tasks: list[TaskRecord], samples_per_task: int, limits: EpisodeLimits,
                tools: dict[str, Tool], sandbox: SandboxConfig, max_workers: int = 16,
                monitor: MonitorConfig = RL_MONITOR, skip: Collection[tuple[str, int]] = (),
                on_sample: Callable[[int, int, Rollout], None] = lambda t, j, r: None) -> None:
    """Sample j of task t for every (t, j) whose (task id, j) is not in `skip`, `max_workers` at
    once in threads of this process, each in its own sandbox; `on_sample(t, j, rollout)` runs in
    the calling thread as each finishes. Interrupted, the episodes in flight finish (their
    sandboxes close) and the queued ones never start."""
    from carl.rollout.workers import ThreadWorkers

    jobs = pending_samples(tasks, samples_per_task, skip)
    if not jobs:
        return
    sample = sampler(policy, tasks, limits, tools, sandbox, monitor)
    workers = ThreadWorkers(sample, max(1, min(max_workers, len(jobs))))
    try:
        drive(workers.submit, jobs, on_sample)
    finally:
        workers.close()


def pending_samples(tasks: list[TaskRecord], samples_per_task: int,
                    skip: Collection[tuple[str, int]] = ()) -> list[tuple[int, int]]:
    """(task index, sample index) of every sample whose (task id, sample index) is not in `skip`."""
    skip = set(skip)
    return [(t, j) for t in range(len(tasks)) for j in range(samples_per_task)
            if (tasks[t].instance_id, j) not in skip]


def drive(submit: Callable[[int, int, int], Future], jobs: list[tuple[int, int]],
          on_sample: Callable[[int, int, Rollout], None]) -> None:
    """Submit every (t, j) of `jobs` (`submit(t, j, version)`, carl.rollout.workers) and hand each
    rollout to `on_sample` in this thread as it finishes."""
    futures = {submit(t, j, 0): (t, j) for t, j in jobs}
    for future in as_completed(futures):
        on_sample(*futures[future], future.result())


def sampler(policy: Any, tasks: list[TaskRecord], limits: EpisodeLimits, tools: dict[str, Tool],
            sandbox: SandboxConfig, monitor: MonitorConfig) -> Callable[..., Rollout]:
    """sample(t, j): sample j of task t with `policy`'s view for it, in its own sandbox, scored by
    the clean-sandbox test reward and `monitor`; a chat policy's token counts in its metadata."""
    views = episode_policies(policy, tasks)

    def sample(t: int, j: int, version: int = 0) -> Rollout:
        view = views(t, j)
        meter = _UsageMeter(view) if not hasattr(view, "generate") else None
        r = run_rollout(meter or view, tasks[t], limits, tools, sandbox, RewardConfig(), monitor)
        if meter is not None:
            r.trajectory.metadata["usage"] = meter.usage()
        return r

    return sample


@dataclass(frozen=True)
class BenchEpisodes:
    """Bench samples run by Ray actors (carl.rollout.workers.RayWorkers, `carl bench run --ray`):
    sent to each actor once, pickled; the actor builds its own policy from `policy` (anything
    picklable with `build()`, e.g. carl.commands.eval.PolicyRecipe), its tools and its sandboxes. The
    suite's task files must be at the same path on every node (one machine, or a shared
    filesystem), as RL's task files."""

    policy: Any
    tasks: list[TaskRecord]
    limits: EpisodeLimits
    tool_names: tuple[str, ...]
    sandbox: SandboxConfig
    monitor: MonitorConfig = RL_MONITOR

    def runner(self) -> Callable[[int, int, int], Rollout]:
        from carl.harness.tools import default_tools

        tools = {n: t for n, t in default_tools().items() if n in self.tool_names}
        return sampler(self.policy.build(), self.tasks, self.limits, tools, self.sandbox, self.monitor)


def episode_policies(policy: Any, tasks: list[TaskRecord]) -> Callable[[int, int], Any]:
    """The policy of sample j of task t: its view sampling from the streams named "<task id>/j"."""
    if not hasattr(policy, "episode"):  # scripted policies: one shared policy
        return lambda t, j: policy
    return lambda t, j: policy.episode(f"{tasks[t].instance_id}/{j}")


class _UsageMeter:
    """A chat policy's episode view that adds up the token counts its replies carry."""

    def __init__(self, policy: Any):
        self.policy = policy
        self.prompt_tokens = self.completion_tokens = self.replies = self.counted = 0

    def chat(self, messages, max_new_tokens: int) -> str:
        reply = self.policy.chat(messages, max_new_tokens)
        usage = getattr(reply, "usage", None) or {}
        self.replies += 1
        if "prompt_tokens" in usage and "completion_tokens" in usage:
            self.counted += 1
            self.prompt_tokens += usage["prompt_tokens"]
            self.completion_tokens += usage["completion_tokens"]
        return reply

    def usage(self) -> dict[str, Any]:
        return {"input_tokens": self.prompt_tokens, "output_tokens": self.completion_tokens,
                "counted": self.counted == self.replies}


def to_sample(r: Rollout, sample: int = 0) -> Sample:
    t = r.trajectory
    usage = t.metadata.get("usage")
    if usage is None:  # a token policy: count from the token-exact trajectory
        usage = {"input_tokens": prompt_tokens(t), "output_tokens": t.num_generated_tokens, "counted": True}
    return Sample(
        task_id=r.task.instance_id,
        passed=r.passed,
        reward=r.reward,
        generated_tokens=usage["output_tokens"],
        tool_calls=t.num_tool_calls,
        tool_errors=t.num_tool_errors,
        wall_s=t.wall_s,
        infra_failure=not r.valid,
        error=infra_error(r),
        stop_reason=t.stop_reason.value,
        digest=episode_digest(r.trajectory),
        sample=sample,
        input_tokens=usage["input_tokens"],
        tokens_counted=bool(usage["counted"]),
        monitor_flags=list(r.monitor_flags),
        context_resets=t.metadata.get("num_summaries", 0) + t.metadata.get("num_truncations", 0),
    )


def prompt_tokens(trajectory) -> int:
    """The tokens a token policy's generations were prompted with: each run of sampled tokens in a
    segment starts a generation whose prompt is everything before it in that segment."""
    total = 0
    for s in trajectory.segments:
        mask = s.generated_mask_T
        total += sum(i for i, g in enumerate(mask) if g and (i == 0 or not mask[i - 1]))
    return total


def episode_digest(trajectory) -> str:
    """12 hex digits of a hash of the episode's assistant messages: two checkpoints scored on common
    random numbers (`evaluate`) wrote the same episode exactly when their digests are equal."""
    h = hashlib.blake2b(digest_size=6)
    for turn in trajectory.turns:
        h.update(turn.assistant.encode() + b"\0")
    return h.hexdigest()
