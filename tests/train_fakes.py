"""Fakes for the trainer tests: rollouts with token segments built by hand or recorded through the
harness's TokenContext with a scripted token policy (no sandboxes, no sampling)."""

from __future__ import annotations

from carl.harness.chat_tokens import TokenContext
from carl.harness.policies import ScriptedTokenPolicy
from carl.tasks import TaskRecord
from carl.rollout.rollout import Rollout
from carl.types import Message, Segment, ToolCall, ToolError, ToolResult, Trajectory, Turn

TASK = TaskRecord(instance_id="fake__0-function-stub-0", repo="fake")
TOOLS = ("read_file", "edit_file", "run_tests", "finish")
FAIL = "Tests: 1 passed, 2 failed (exit code 1: some tests failed, 0.3 s)\nFailed:\n  tests/test_a.py::test_add"
PASS = "Tests: 3 passed (exit code 0: all selected tests passed, 0.3 s)"


def token_rollout(ids_T: list[int], generated_T: list[bool], reward: float, valid: bool = True,
                  logprob: float = -1.0) -> Rollout:
    """A one-segment rollout with no turns (GRPO only: no error turns for self-distillation)."""
    seg = Segment(token_ids_T=list(ids_T), generated_mask_T=list(generated_T),
                  logprobs_T=[logprob if g else 0.0 for g in generated_T])
    traj = Trajectory(task_id=TASK.instance_id, segments=[seg])
    return Rollout(TASK, traj, reward=reward, valid=valid, passed=valid and reward >= 1.0)


def recorded_rollout(tokenizer, replies: list[str], outputs: list[str], passed: bool,
                     feedback: str = "") -> Rollout:
    """A rollout recorded token-exactly: each reply is one assistant turn, followed by its tool output.

    A reply naming an unknown tool gets an unknown_tool error (a self-distillation error turn)."""
    ctx = TokenContext(ScriptedTokenPolicy(tokenizer, replies))
    ctx.start([Message("system", "You are a coding agent."), Message("user", "Fix the failing tests.")])
    turns = []
    for reply, output in zip(replies, outputs):
        text = ctx.generate(64, 100_000)
        name = reply.split('"')[1]
        errors = []
        if name not in TOOLS:
            errors = [ToolError("unknown_tool", f"unknown tool {name!r}", tool=name, valid_tools=TOOLS)]
        result = ToolResult(name, output, ok=not errors, error=errors[0] if errors else None)
        turns.append(Turn(assistant=text, calls=[ToolCall(name, {})], errors=errors, results=[result]))
        ctx.add(Message("tool", output))
    traj = Trajectory(task_id=TASK.instance_id, turns=turns, segments=[ctx.segment])
    return Rollout(TASK, traj, reward=1.0 if passed else 0.0, valid=True, passed=passed, feedback=feedback)


def solved_rollout(tokenizer) -> Rollout:
    return recorded_rollout(tokenizer, [
        '<tool name="edit_file"><path>a.py</path><old>x = 1</old><new>x = 2</new></tool>',
        '<tool name="run_tests"></tool>',
        '<tool name="finish"></tool>',
    ], ["edited a.py", PASS, "done"], passed=True)


def failed_rollout(tokenizer) -> Rollout:
    """A bad tool call (turn 0), an edit whose tests then fail (turn 1), then finish: two error turns."""
    return recorded_rollout(tokenizer, [
        '<tool name="reed_file"><path>a.py</path></tool>',
        '<tool name="edit_file"><path>a.py</path><old>x = 1</old><new>x = 3</new></tool>',
        '<tool name="run_tests"></tool>',
        '<tool name="finish"></tool>',
    ], ["unknown tool 'reed_file'", "edited a.py", FAIL, "done"], passed=False,
        feedback="FAILED tests/test_a.py::test_add")


def tokens_through(model, block: int = 0) -> list[int]:
    """A counter ([n]) of the tokens that enter `model`'s block `block` (every pass, whatever its batch)."""
    seen = [0]
    model.model.layers[block].register_forward_pre_hook(lambda m, a, kw: seen.__setitem__(
        0, seen[0] + (a[0] if a else kw["hidden_states"]).shape[:2].numel()), with_kwargs=True)
    return seen
