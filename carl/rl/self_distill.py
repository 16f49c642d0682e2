"""Self-distillation from textual feedback: find the turns that erred, build hinted teacher contexts, losses.

Sources: SDPO (arXiv 2601.20802), OPSD (2601.18734), SDFT (2601.19897), SRPO (2604.02288).
Legend: N = scored tokens (flattened), V = vocabulary, B = sequences, T = tokens.

The student sampled turn k under context c_k. When turn k went wrong (a bad tool call, tests
that fail after its edits, a failed final reward), the same policy, shown c_k plus a hint
(the error text and valid tools, the failing test output, a successful sibling's actions),
knows better. The teacher scores the student's own tokens of turn k under that hinted context,
without gradient, and the student is pulled towards it at those tokens:

    student context:  [system, task, ..., tool result] <assistant> y_1 .. y_n
    teacher context:  [system, task, ..., tool result] <user> hint <assistant> y_1 .. y_n
                                                                          ^ scored positions

Losses at the scored tokens (student logits s, teacher logits t, both at temperature 1):
- `topk_kl_loss`: KL(student || teacher) over the student's top-k tokens plus one tail bucket
  with the remaining mass of each distribution (exact when k = V).
- `sampled_token_sd_loss`: the cheap estimator; at the sampled token y, advantage
  log p_t(y) - log p_s(y) (detached) times log p_s(y), policy-gradient style.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from carl.harness.protocol import render_call
from carl.types import Message, Trajectory

EDIT_TOOLS = ("write_file", "edit_file")
_TESTS_PASSED = re.compile(r"^Tests: .*\(exit code 0:")


@dataclass(frozen=True)
class SelfDistillConfig:
    weight: float = 0.0
    """Weight of the self-distillation loss added to the GRPO loss (0 = off)."""
    loss: Literal["topk_kl", "sampled_token"] = "topk_kl"
    """Top-k KL with a tail bucket, or the cheap sampled-token estimator."""
    topk: int = 50
    """k of the top-k KL (20-100 in the papers)."""
    route_by_success: bool = False
    """SRPO: successful rollouts get the GRPO loss only, failed ones self-distillation only."""
    success_reward: float = 1.0
    """A rollout whose reward reaches this counts as a success (for routing and sibling hints)."""
    teacher: Literal["policy", "ema"] = "policy"
    """Teacher weights: the current policy, or an EMA copy of it (see `ema_update`)."""
    ema_decay: float = 0.99
    """EMA teacher: teacher = decay * teacher + (1 - decay) * student after each step."""
    max_hint_chars: int = 2000
    """Hints longer than this are cut to their first characters (test summaries come first)."""

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"weight: got {self.weight}, expected >= 0")
        if self.loss not in ("topk_kl", "sampled_token"):
            raise ValueError(f"loss: got {self.loss!r}, expected 'topk_kl' or 'sampled_token'")
        if self.topk < 1:
            raise ValueError(f"topk: got {self.topk}, expected >= 1")
        if self.teacher not in ("policy", "ema"):
            raise ValueError(f"teacher: got {self.teacher!r}, expected 'policy' or 'ema'")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay: got {self.ema_decay}, expected a value in [0, 1)")
        if self.max_hint_chars < 1:
            raise ValueError(f"max_hint_chars: got {self.max_hint_chars}, expected >= 1")


# --------------------------------------------------------------------------- which turns, which hint


@dataclass(frozen=True)
class ErrorTurn:
    turn: int
    """Index into `trajectory.turns` of the turn whose sampled tokens the teacher scores."""
    kind: Literal["tool_error", "failing_tests", "failed_reward"]
    hint: str


def find_error_turns(
    trajectory: Trajectory,
    reward_feedback: str | None = None,
    sibling: Trajectory | None = None,
    valid_tools: Sequence[str] = (),
    max_hint_chars: int = 2000,
    feedback_heading: str = "The final tests failed:",
) -> list[ErrorTurn]:
    """The turns where the agent erred, each with the hint its teacher sees (at most one per turn).

    - tool_error: a call of the turn failed to parse or to run; hint = the error texts and the
      valid tools (from the error, else `valid_tools`).
    - failing_tests: a run_tests result reports failures; the turns that edited files since the
      previous test run are blamed; hint = the test output.
    - failed_reward: `reward_feedback` (the clean-sandbox test output of a failed episode, or in
      production the user's follow-up; `feedback_heading` says which) is given; every editing turn not blamed yet (else the last turn) gets it as hint.
    In a failed episode (`reward_feedback` given) with a successful `sibling` rollout of the same
    group, every hint is followed by the sibling's actions: the one hint that shows a small model
    what to write instead. (Appending it to the failed_reward turns only left it out of the most
    common failure, a wrong edit that the episode's own test run had already blamed.)
    """
    found: dict[int, ErrorTurn] = {}
    edits_since_tests: list[int] = []
    for i, turn in enumerate(trajectory.turns):
        errors = list(turn.errors) + [
            r.error for r in turn.results if r.error is not None and r.error not in turn.errors
        ]
        if errors:
            tools = next((e.valid_tools for e in errors if e.valid_tools), tuple(valid_tools))
            lines = ["Your tool call failed:"] + [f"- {e.kind}: {e.message}" for e in errors]
            if tools:
                lines.append("Valid tools: " + ", ".join(tools))
            found[i] = ErrorTurn(i, "tool_error", _clip("\n".join(lines), max_hint_chars))
        if any(c.name in EDIT_TOOLS for c in turn.calls):
            edits_since_tests.append(i)
        for r in turn.results:
            if r.tool == "run_tests" and r.error is None:
                if not _TESTS_PASSED.match(r.output):
                    hint = _clip("Running the tests after these edits gave:\n" + r.output, max_hint_chars)
                    for j in edits_since_tests:
                        found.setdefault(j, ErrorTurn(j, "failing_tests", hint))
                edits_since_tests = []
    if reward_feedback is not None and trajectory.turns:
        hint = _clip(feedback_heading + "\n" + reward_feedback, max_hint_chars)
        edit_turns = [i for i, t in enumerate(trajectory.turns) if any(c.name in EDIT_TOOLS for c in t.calls)]
        for j in [i for i in edit_turns if i not in found] or (
            [len(trajectory.turns) - 1] if not edit_turns else []
        ):
            found.setdefault(j, ErrorTurn(j, "failed_reward", hint))
        if sibling is not None:
            demo = sibling_hint(sibling)
            found = {i: ErrorTurn(i, e.kind, _clip(_clip(e.hint, max_hint_chars // 2) + "\n\n" + demo, max_hint_chars))
                     for i, e in found.items()}
    return [found[i] for i in sorted(found)]


def sibling_hint(sibling: Trajectory) -> str:
    """The tool calls of a successful rollout of the same task, in order, as the model writes them."""
    calls = [render_call(c) for t in sibling.turns for c in t.calls]
    return "A successful attempt at this task made these tool calls:\n" + "\n".join(calls)


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[: max_chars - 4] + "\n..."


# --------------------------------------------------------------------------- teacher context


@dataclass(frozen=True)
class TeacherContext:
    """Teacher ids and where the student's sampled tokens of one turn sit in both contexts."""

    teacher_ids: list[int]
    """Student context before the turn, a hint message, the assistant header, the turn's tokens."""
    teacher_positions: list[int]
    """Positions in `teacher_ids` of the turn's sampled tokens."""
    segment: int
    """Index of the trajectory segment holding the turn."""
    student_positions: list[int]
    """Positions of the same tokens in `trajectory.segments[segment].token_ids_T`."""


def build_teacher_context(trajectory: Trajectory, turn: int, hint: str, tokenizer: Any) -> TeacherContext:
    """Insert `hint` as a user message just before turn `turn`'s assistant header.

    The hint message and the header are rendered with the tokenizer's chat template (the same
    template that framed the student's context), only template text is encoded, and the
    student's tokens are copied, never re-tokenized.
    """
    seg_index = trajectory.turns[turn].segment
    segment = trajectory.segments[seg_index]
    k = sum(1 for t in trajectory.turns[:turn] if t.segment == seg_index)
    runs = generated_runs(segment.generated_mask_T)
    if k >= len(runs):
        raise ValueError(
            f"turn {turn} is generation {k} of segment {seg_index}, but the segment holds only "
            f"{len(runs)} generated runs (a text-level trajectory has no token ids)"
        )
    start, end = runs[k]
    hint_ids, header_ids = hint_message_ids(tokenizer, hint)
    prefix = segment.token_ids_T[:start]
    if prefix[len(prefix) - len(header_ids) :] != header_ids:
        raise ValueError(
            f"turn {turn}: the context before its tokens does not end with the chat template's "
            f"assistant header {header_ids}; cannot insert the hint before it"
        )
    teacher_prefix = prefix[: len(prefix) - len(header_ids)] + hint_ids + header_ids
    teacher_ids = teacher_prefix + segment.token_ids_T[start:end]
    return TeacherContext(
        teacher_ids=teacher_ids,
        teacher_positions=list(range(len(teacher_prefix), len(teacher_ids))),
        segment=seg_index,
        student_positions=list(range(start, end)),
    )


def generated_runs(generated_mask_T: Sequence[bool]) -> list[tuple[int, int]]:
    """[start, end) of each maximal run of generated tokens: one run per assistant turn."""
    runs, start = [], None
    for t, g in enumerate(list(generated_mask_T) + [False]):
        if g and start is None:
            start = t
        elif not g and start is not None:
            runs.append((start, t))
            start = None
    return runs


def hint_message_ids(tokenizer: Any, hint: str) -> tuple[list[int], list[int]]:
    """(ids of a user message holding `hint`, ids of the assistant generation header), from the template."""
    base = [Message("system", "s"), Message("user", "u")]
    with_hint = base + [Message("user", hint)]
    text_base = _render(tokenizer, base, False)
    text_hint = _render(tokenizer, with_hint, False)
    text_header = _render(tokenizer, with_hint, True)
    if not text_hint.startswith(text_base) or not text_header.startswith(text_hint):
        raise ValueError("the chat template does not render conversations as prefixes of longer ones")
    hint_ids = tokenizer.encode(text_hint[len(text_base) :], add_special_tokens=False)
    return hint_ids, tokenizer.encode(text_header[len(text_hint) :], add_special_tokens=False)


def _render(tokenizer: Any, messages: list[Message], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )


@torch.no_grad()
def teacher_logits(model: Any, contexts: Sequence[TeacherContext], pad_id: int) -> torch.Tensor:
    """Teacher logits at every scored position of every context, concatenated: logits_N_V (fp32).

    Row order = contexts in order, positions in order; the student side gathers its logits at
    `(segment, student_positions)` in the same order. The scored tokens are the tail of each
    context, so the contexts are left-padded and the model computes logits for the last
    max(n) + 1 positions only (not T x V per context: V is ~50k for real models).
    """
    T = max(len(c.teacher_ids) for c in contexts)
    ids_B_T = torch.full((len(contexts), T), pad_id, dtype=torch.long)
    mask_B_T = torch.zeros((len(contexts), T), dtype=torch.long)
    for b, c in enumerate(contexts):
        if c.teacher_positions != list(
            range(len(c.teacher_ids) - len(c.teacher_positions), len(c.teacher_ids))
        ):
            raise ValueError(f"context {b}: the scored positions must be the last ones of teacher_ids")
        ids_B_T[b, T - len(c.teacher_ids) :] = torch.tensor(c.teacher_ids)
        mask_B_T[b, T - len(c.teacher_ids) :] = 1
    pos_B_T = (mask_B_T.cumsum(-1) - 1).clamp(min=0)
    keep = max(len(c.teacher_positions) for c in contexts) + 1
    device = next(model.parameters()).device
    logits_B_K_V = model(
        input_ids=ids_B_T.to(device),
        attention_mask=mask_B_T.to(device),
        position_ids=pos_B_T.to(device),
        use_cache=False,
        logits_to_keep=keep,
    ).logits
    # the logits at (left-padded) position T - 1 - i predict the i-th token from the end of the
    # row; the last position predicts past the end and is unused
    rows = [logits_B_K_V[b, keep - 1 - len(c.teacher_positions) : keep - 1] for b, c in enumerate(contexts)]
    return torch.cat(rows).float()


@torch.no_grad()
def ema_update(teacher: torch.nn.Module, student: torch.nn.Module, decay: float) -> None:
    """teacher = decay * teacher + (1 - decay) * student, parameter by parameter."""
    for t, s in zip(teacher.parameters(), student.parameters(), strict=True):
        t.lerp_(s.detach().to(t.dtype), 1 - decay)


# --------------------------------------------------------------------------- losses


def topk_kl_loss(
    student_logits_N_V: torch.Tensor, teacher_logits_N_V: torch.Tensor, mask_N: torch.Tensor, k: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean over masked positions of KL(student || teacher) on the student's top-k tokens + a tail bucket.

    Per position, with S = the student's k most likely tokens, p = student, q = teacher:
        KL = sum_{i in S} p_i (log p_i - log q_i) + p_tail (log p_tail - log q_tail),
        p_tail = 1 - sum_{i in S} p_i (same for q).
    The tail masses are log-sum-exps over the tokens outside S, so they are exact (0 when k = V).
    Gradient flows into the student logits only.
    """
    k = min(k, student_logits_N_V.shape[-1])
    logp_N_V = torch.log_softmax(student_logits_N_V.float(), dim=-1)
    logq_N_V = torch.log_softmax(teacher_logits_N_V.detach().float(), dim=-1)
    top_N_K = logp_N_V.detach().topk(k, dim=-1).indices
    logp_N_K, logq_N_K = logp_N_V.gather(-1, top_N_K), logq_N_V.gather(-1, top_N_K)
    outside_N_V = torch.ones_like(logp_N_V, dtype=torch.bool).scatter(-1, top_N_K, False)
    # a huge finite negative, not -inf: with k = V every entry is filled and -inf would make
    # the logsumexp gradient NaN; exp() of it is exactly 0, so the tail mass is still exact
    fill = torch.tensor(-1e30, device=logp_N_V.device)
    logp_tail_N = torch.logsumexp(torch.where(outside_N_V, logp_N_V, fill), dim=-1)
    logq_tail_N = torch.logsumexp(torch.where(outside_N_V, logq_N_V, fill), dim=-1)
    kl_top_N = (logp_N_K.exp() * (logp_N_K - logq_N_K)).sum(-1)
    p_tail_N = logp_tail_N.exp()
    kl_tail_N = torch.where(p_tail_N > 0, p_tail_N * (logp_tail_N - logq_tail_N), torch.zeros_like(p_tail_N))
    kl_N = kl_top_N + kl_tail_N
    maskf_N = mask_N.float()
    n = maskf_N.sum().clamp(min=1)
    loss = (kl_N * maskf_N).sum() / n
    metrics = {
        "kl": float(loss.detach()),
        "student_tail_mass": float((p_tail_N.detach() * maskf_N).sum() / n),
        "num_tokens": float(maskf_N.sum()),
    }
    return loss, metrics


def sampled_token_sd_loss(
    student_logprobs_N: torch.Tensor, teacher_logprobs_N: torch.Tensor, mask_N: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Sampled-token estimator: -mean(A * log p_student) with A = log p_teacher - log p_student (detached).

    Its gradient is the per-token policy gradient of KL(student || teacher) with the sampled
    token as the one-sample estimate (unbiased when the tokens were sampled from the student).
    """
    advantage_N = (teacher_logprobs_N.detach() - student_logprobs_N.detach()).float()
    maskf_N = mask_N.float()
    n = maskf_N.sum().clamp(min=1)
    loss = -(advantage_N * student_logprobs_N.float() * maskf_N).sum() / n
    metrics = {
        "advantage_mean": float((advantage_N * maskf_N).sum() / n),
        "num_tokens": float(maskf_N.sum()),
    }
    return loss, metrics


def srpo_split(
    rewards_B: torch.Tensor, valid_B: torch.Tensor, success_reward: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """SRPO routing: (rows for GRPO = valid successes, rows for self-distillation = valid failures)."""
    success_B = valid_B.bool() & (rewards_B >= success_reward)
    return success_B, valid_B.bool() & ~success_B


def combine_losses(
    grpo: tuple[torch.Tensor, dict[str, float]],
    self_distill: tuple[torch.Tensor, dict[str, float]] | None,
    self_distill_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO loss + weight * self-distillation loss, with the metrics of both under prefixes."""
    loss, metrics = grpo[0], {f"grpo/{k}": v for k, v in grpo[1].items()}
    if self_distill is not None and self_distill_weight > 0:
        loss = loss + self_distill_weight * self_distill[0]
        metrics.update({f"sd/{k}": v for k, v in self_distill[1].items()})
    metrics["loss"] = float(loss.detach())
    return loss, metrics
