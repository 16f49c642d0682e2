"""The agent loop: one episode of a policy acting in a sandbox through tools.

    system + task ──> policy ──> reply ──parse──> calls ──run_calls (parallel)──> results
         ^                                                                          │
         └──────────── one tool message: results in call order (or a notice) <──────┘
    context past summarize_at_fraction * budget: ask for a summary, start a new segment
    from system + task + summary, go on (or, context_strategy "truncate": no summary, the new
    segment starts from system + task + the last turn).

Production and RL rollouts run this same function. Control flow is exceptions (as in
mini-swe-agent): any limit, the finish tool, or an infrastructure failure raises `_Stop`, which
becomes the trajectory's typed stop reason. Nothing else escapes: a policy that raises (endpoint
down, broken chat template) is POLICY_ERROR, a sandbox or executor that raises is SANDBOX_ERROR,
both with the traceback in `Trajectory.error`, so rollout workers can mask them from training.
A malformed tool call is not a failure: its typed ToolError is the observation and the loop goes
on. A reply without any tool call gets `prompts.NO_TOOL_CALL_NOTICE` as its observation (or ends
the episode with NO_TOOL_CALL when `limits.stop_on_no_call`).

Limits are checked between turns: a turn already running (a long test run) is bounded by its
tool's own timeout, not by `wall_time_s`. Within a turn, a token-level policy's reply is bounded by
`max_new_tokens` and cut early by the repetition guard (`max_repeat_tokens`,
`carl.harness.repetition`); `Turn.finish_reason` records which ended it.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from carl.harness.chat_tokens import ChatContext, ContextFull, TokenContext, approx_tokens
from carl.harness.execute import run_calls
from carl.harness.policies import ChatPolicy, TokenPolicy
from carl.harness.prompts import (
    NO_TOOL_CALL_NOTICE,
    SUMMARY_REQUEST,
    resume_prompt,
    system_prompt,
    task_prompt,
    truncated_prompt,
)
from carl.harness.protocol import parse_calls, render_results, tools_prompt
from carl.harness.tools import default_tools
from carl.harness.tools.base import Tool
from carl.sandbox.base import Sandbox
from carl.types import Message, StopReason, ToolCall, ToolError, Trajectory, Turn


CONTEXT_STRATEGIES = ("summarize", "truncate")


@dataclass(frozen=True)
class EpisodeLimits:
    max_turns: int = 50
    """Most assistant messages in an episode, summaries included."""
    max_tokens: int = 1_000_000
    """Most context tokens over all segments (prompts, generated and observation tokens); for
    text-level policies as estimated by the token counter."""
    max_new_tokens: int = 4096
    """Most tokens the policy may generate in one turn (also clipped to the room left in the context)."""
    wall_time_s: float = 3600.0
    """Wall-clock limit of the episode, checked between turns."""
    context_budget_tokens: int = 32_768
    """Size of one context segment (the model's context window, or less)."""
    summarize_at_fraction: float = 0.8
    """Ask for a self-summary once a segment's context passes this fraction of the budget."""
    max_summaries: int = 8
    """Most self-summaries (context resets) in an episode; after that a full context ends it."""
    context_strategy: str = "summarize"
    """What a context reset keeps: "summarize" (the model writes a summary, the new segment starts
    from the task and it) or "truncate" (no summary: the new segment starts from the task, a notice
    and the last turn; the baseline a summary must beat). Resets count against `max_summaries`."""
    stop_on_no_call: bool = False
    """End the episode (NO_TOOL_CALL) when a reply has no tool call, instead of sending a notice.
    Production chat use ends the agent's turn this way; RL rollouts keep the notice."""
    max_repeat_tokens: int = 256
    """Repetition guard of token-level policies (`carl.harness.repetition`): cut a reply once its
    last `max_repeat_tokens` ids are one pattern of at most 64 ids repeated (at least 4 times);
    the turn records finish_reason "repeat". 0 = off. 256 never cuts the CPU default's 128-token
    replies and stops a loop at 4,096-token limits 16x sooner."""

    def __post_init__(self) -> None:
        for name in ("max_turns", "max_tokens", "max_new_tokens", "wall_time_s", "context_budget_tokens"):
            if getattr(self, name) <= 0:
                raise ValueError(f"limits.{name}: got {getattr(self, name)!r}, expected a positive number")
        if not 0.0 < self.summarize_at_fraction <= 1.0:
            raise ValueError(f"limits.summarize_at_fraction: got {self.summarize_at_fraction!r}, expected in (0, 1]")
        if self.context_strategy not in CONTEXT_STRATEGIES:
            raise ValueError(f"limits.context_strategy: got {self.context_strategy!r}, expected one of "
                             f"{CONTEXT_STRATEGIES}")
        if self.max_summaries < 0:
            raise ValueError(f"limits.max_summaries: got {self.max_summaries!r}, expected >= 0")
        if self.max_repeat_tokens != 0 and self.max_repeat_tokens < 4:
            raise ValueError(f"limits.max_repeat_tokens: got {self.max_repeat_tokens!r}, expected 0 (off) or >= 4")


class Task(Protocol):
    """What an episode needs from a task (carl.tasks.record.TaskRecord is one)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def problem_statement(self) -> str: ...


@dataclass(frozen=True)
class TextTask:
    """A task given as plain text (the CLI's --task)."""

    instance_id: str
    problem_statement: str


class _Stop(Exception):
    def __init__(self, reason: StopReason, error: str | None = None):
        self.reason, self.error = reason, error


def run_episode(
    policy: ChatPolicy | TokenPolicy,
    sandbox: Sandbox,
    task: Task,
    limits: EpisodeLimits,
    tools: Mapping[str, Tool] | None = None,
    *,
    count_tokens: Callable[[str], int] = approx_tokens,
    on_turn: Callable[[Turn], None] | None = None,
) -> Trajectory:
    """Run one episode to its end and return its trajectory; never raises for policy or sandbox
    failures (see module docstring). `count_tokens` estimates tokens for text-level policies;
    `on_turn` sees each turn as it completes (live transcripts)."""
    tools = default_tools() if tools is None else tools
    specs = {name: tool.spec for name, tool in tools.items()}
    system = Message("system", system_prompt(tools_prompt(specs)))
    ctx = TokenContext(policy) if isinstance(policy, TokenPolicy) else ChatContext(policy, count_tokens)
    traj = Trajectory(task_id=task.instance_id)
    start = time.monotonic()
    num_resets = turns_in_segment = 0
    try:
        with _infra_failure(StopReason.POLICY_ERROR):
            traj.segments.append(ctx.start([system, Message("user", task_prompt(task.problem_statement))]))
        while True:
            if len(traj.turns) >= limits.max_turns:
                raise _Stop(StopReason.MAX_TURNS)
            if ctx.total_tokens >= limits.max_tokens:
                raise _Stop(StopReason.MAX_TOKENS)
            if time.monotonic() - start >= limits.wall_time_s:
                raise _Stop(StopReason.WALL_TIME)
            turn_start = time.monotonic()
            segment = len(traj.segments) - 1

            if (ctx.num_tokens >= limits.summarize_at_fraction * limits.context_budget_tokens
                    and num_resets < limits.max_summaries and turns_in_segment > 0):
                if limits.context_strategy == "truncate":
                    with _infra_failure(StopReason.POLICY_ERROR):
                        last_turn = ctx.segment.messages[-2:]  # its reply and what the tools returned
                        resumed = Message("user", truncated_prompt(task.problem_statement))
                        traj.segments.append(ctx.start([system, resumed, *last_turn]))
                    num_resets, turns_in_segment = num_resets + 1, 0
                    continue
                with _infra_failure(StopReason.POLICY_ERROR):
                    ctx.add(Message("user", SUMMARY_REQUEST))
                    summary = ctx.generate(limits.max_new_tokens, limits.context_budget_tokens,
                                           limits.max_repeat_tokens)
                    turn = Turn(summary, segment=segment, is_summary=True, wall_s=time.monotonic() - turn_start,
                                finish_reason=ctx.finish_reason)
                    traj.turns.append(turn)
                    resumed = Message("user", resume_prompt(task.problem_statement, summary))
                    traj.segments.append(ctx.start([system, resumed]))
                num_resets, turns_in_segment = num_resets + 1, 0
                if on_turn:
                    on_turn(turn)
                continue

            with _infra_failure(StopReason.POLICY_ERROR):
                reply = ctx.generate(limits.max_new_tokens, limits.context_budget_tokens, limits.max_repeat_tokens)
            parsed = parse_calls(reply, specs)
            with _infra_failure(StopReason.SANDBOX_ERROR):
                results = run_calls(parsed, tools, sandbox) if parsed else []
            turn = Turn(
                assistant=reply,
                calls=[c for c in parsed if isinstance(c, ToolCall)],
                errors=[e for e in parsed if isinstance(e, ToolError)],
                results=results,
                segment=segment,
                wall_s=time.monotonic() - turn_start,
                finish_reason=ctx.finish_reason,
            )
            traj.turns.append(turn)
            turns_in_segment += 1
            if on_turn:
                on_turn(turn)
            if not parsed and limits.stop_on_no_call:
                raise _Stop(StopReason.NO_TOOL_CALL)
            with _infra_failure(StopReason.POLICY_ERROR):  # the policy's chat template frames it
                ctx.add(Message("tool", render_results(results) if parsed else NO_TOOL_CALL_NOTICE))
            if any(r.ok and r.tool in specs and specs[r.tool].ends_episode for r in results):
                raise _Stop(StopReason.FINISHED)
    except _Stop as stop:
        traj.stop_reason, traj.error = stop.reason, stop.error
    traj.wall_s = time.monotonic() - start
    truncating = limits.context_strategy == "truncate"  # the same count of context resets, by kind
    traj.metadata["num_summaries"] = 0 if truncating else num_resets
    traj.metadata["num_truncations"] = num_resets if truncating else 0
    return traj


@contextlib.contextmanager
def _infra_failure(reason: StopReason) -> Iterator[None]:
    """Turn any exception of the block into `_Stop(reason)` with its traceback."""
    try:
        yield
    except _Stop:
        raise
    except ContextFull:  # the segment budget is used up (no summaries left, or no room for one)
        raise _Stop(StopReason.CONTEXT_FULL) from None
    except Exception:  # noqa: BLE001 - failure must become data here (STYLE.md habit 8)
        raise _Stop(reason, traceback.format_exc()) from None
