"""Records that cross module and process boundaries.

These are plain dataclasses (JSON-serialisable through `to_dict` / `from_dict`), shared by the
harness, the sandboxes, the task pipeline, the rewards and the trainer. Nothing here imports
torch.

Token legend used by trajectory fields: T = tokens of one context segment.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Literal

# --------------------------------------------------------------------------- tool calls

ToolErrorKind = Literal[
    "unknown_tool",  # <tool name="x"> where x is not a tool of this harness
    "missing_param",  # a required parameter is absent
    "extra_param",  # a parameter the tool does not take
    "duplicate_param",  # the same parameter given twice
    "unclosed_tag",  # <tool ...> or <param> without its closing tag
    "bad_value",  # a value that does not parse as the parameter's type
    "malformed",  # anything else the parser cannot read (e.g. no name attribute)
    "execution",  # the call parsed, but the tool failed while running (file not found, ...)
]


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call. `params` maps parameter name -> raw string value."""

    name: str
    params: dict[str, str]
    index: int = 0  # position of the call within its assistant message


@dataclass(frozen=True)
class ToolError:
    """A stable, typed description of a failed tool call; self-distillation targets these."""

    kind: ToolErrorKind
    message: str
    tool: str | None = None  # tool name when known
    param: str | None = None  # offending parameter when known
    valid_tools: tuple[str, ...] = ()  # filled for unknown_tool
    raw: str = ""  # the raw text of the call as the model wrote it
    index: int = 0


@dataclass(frozen=True)
class ToolResult:
    """What one call produced. `output` is exactly the text the model will see."""

    tool: str
    output: str
    ok: bool
    error: ToolError | None = None
    truncated: bool = False
    duration_s: float = 0.0
    index: int = 0


# --------------------------------------------------------------------------- messages

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


class StopReason(str, enum.Enum):
    FINISHED = "finished"  # the agent called finish
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"  # total generated+observed token budget over all segments
    WALL_TIME = "wall_time"
    CONTEXT_FULL = "context_full"  # a segment's context budget is used up and no self-summaries remain
    NO_TOOL_CALL = "no_tool_call"  # the agent replied without any tool call (limits.stop_on_no_call)
    POLICY_ERROR = "policy_error"  # the policy raised (endpoint down, ...): an infrastructure failure
    SANDBOX_ERROR = "sandbox_error"  # the sandbox crashed: an infrastructure failure

    @property
    def is_infra_failure(self) -> bool:
        return self in (StopReason.POLICY_ERROR, StopReason.SANDBOX_ERROR)


@dataclass
class Turn:
    """One assistant message and what its tool calls returned."""

    assistant: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolError] = field(default_factory=list)  # parse errors of this message
    results: list[ToolResult] = field(default_factory=list)  # in call order, errors included
    segment: int = 0  # which context segment this turn belongs to
    is_summary: bool = False  # this assistant message is a self-summary
    wall_s: float = 0.0
    # why the reply ended, for token-level policies: "stop" (a stop id), "length" (max_new_tokens
    # or the context budget), "repeat" (cut by the repetition guard, carl.harness.repetition);
    # "" for text-level policies, whose endpoint does not say
    finish_reason: Literal["", "stop", "length", "repeat"] = ""


@dataclass
class Segment:
    """One context window of an episode: from (system + task [+ summary]) until reset or the end.

    For token-level policies the ids are exactly what the model saw and sampled:
    `token_ids_T` = the full context, `generated_mask_T[t]` is True where the model sampled
    token t, and `logprobs_T[t]` its log-prob under the sampling policy (0.0 elsewhere).
    Text-level policies (OpenAI client, scripted) leave the token fields empty.
    `messages` are the chat messages that render (through the chat template) to `token_ids_T`.
    """

    messages: list[Message] = field(default_factory=list)
    token_ids_T: list[int] = field(default_factory=list)
    logprobs_T: list[float] = field(default_factory=list)
    generated_mask_T: list[bool] = field(default_factory=list)
    # MoE router replay: top-k expert ids per layer for every context position, aligned with
    # token_ids_T (-1 where nothing was routed); `carl.systems.router_replay.encode_routes` stores
    # them compactly (base64 of a uint8/uint16 array).
    routing: dict[str, Any] | None = None
    # [start, length, version] per run of generated tokens: the weights version that sampled
    # token_ids_T[start : start + length] (async RL logs per-token staleness from these)
    versions: list[list[int]] = field(default_factory=list)


@dataclass
class Trajectory:
    task_id: str
    turns: list[Turn] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    stop_reason: StopReason = StopReason.FINISHED
    error: str | None = None  # traceback text for infra failures
    wall_s: float = 0.0
    policy_version: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def num_generated_tokens(self) -> int:
        return sum(sum(s.generated_mask_T) for s in self.segments)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids_T) for s in self.segments)

    @property
    def num_tool_calls(self) -> int:
        return sum(len(t.calls) for t in self.turns)

    @property
    def num_tool_errors(self) -> int:
        return sum(1 for t in self.turns for r in t.results if r.error is not None)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        turns = [
            Turn(
                assistant=t["assistant"],
                calls=[ToolCall(**c) for c in t.get("calls", [])],
                errors=[_tool_error(e) for e in t.get("errors", [])],
                results=[
                    ToolResult(**{**r, "error": _tool_error(r["error"]) if r.get("error") else None})
                    for r in t.get("results", [])
                ],
                segment=t.get("segment", 0),
                is_summary=t.get("is_summary", False),
                wall_s=t.get("wall_s", 0.0),
                finish_reason=t.get("finish_reason", ""),
            )
            for t in d.get("turns", [])
        ]
        segments = [
            Segment(
                messages=[Message(**m) for m in s.get("messages", [])],
                token_ids_T=list(s.get("token_ids_T", [])),
                logprobs_T=list(s.get("logprobs_T", [])),
                generated_mask_T=list(s.get("generated_mask_T", [])),
                routing=s.get("routing"),
                versions=[list(v) for v in s.get("versions", [])],
            )
            for s in d.get("segments", [])
        ]
        return cls(
            task_id=d["task_id"],
            turns=turns,
            segments=segments,
            stop_reason=StopReason(d.get("stop_reason", "finished")),
            error=d.get("error"),
            wall_s=d.get("wall_s", 0.0),
            policy_version=d.get("policy_version", 0),
            metadata=d.get("metadata", {}),
        )


def _tool_error(d: dict[str, Any]) -> ToolError:
    return ToolError(**{**d, "valid_tools": tuple(d.get("valid_tools", ()))})


def to_jsonable(obj: Any) -> Any:
    """Dataclasses, enums, tuples -> plain JSON types (recursively)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    return obj
