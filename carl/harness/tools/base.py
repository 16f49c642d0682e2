"""What a tool is: a spec the system prompt lists, and `run(params, sandbox) -> str`.

A tool acts only through the `Sandbox` protocol (never on host paths), so the same tool works on a
local, bubblewrap or remote sandbox. It returns the text the model will see, or raises
`ToolFailure(message)` for an execution error (file not found, ambiguous edit, ...), which the
executor turns into a `ToolResult` with `ToolError(kind="execution")`.

`params` reaching `run` are already checked and typed by the executor against `spec.params`:
required ones are present, optional ones are present with their default or absent when the default
is None, and each value is a `str`, `int` or `bool` as declared.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from carl.sandbox.base import Sandbox

ParamType = Literal["str", "int", "bool"]


@dataclass(frozen=True)
class ParamSpec:
    name: str
    """Tag name of the parameter, e.g. `path` in `<path>a.py</path>`."""
    type: ParamType
    """How the raw text is read: "str" (verbatim), "int" (decimal), "bool" (true/false)."""
    description: str
    """One line for the system prompt."""
    required: bool = True
    """A call without it is a `missing_param` error."""
    default: Any = None
    """Value of an optional parameter the call leaves out (None: absent from `params`)."""

    def __post_init__(self) -> None:
        if self.type not in ("str", "int", "bool"):
            raise ValueError(f"ParamSpec.type of {self.name!r}: got {self.type!r}, expected str, int or bool")
        if self.required and self.default is not None:
            raise ValueError(f"ParamSpec.default of {self.name!r}: a required parameter has no default")


@dataclass(frozen=True)
class ToolSpec:
    name: str
    """The tool's name, as written in `<tool name="...">`."""
    description: str
    """What the tool does, for the system prompt (a few lines at most)."""
    params: tuple[ParamSpec, ...] = ()
    """Parameters in the order the system prompt lists them."""
    ends_episode: bool = False
    """A successful call ends the episode (the `finish` tool)."""
    param_names: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        names = [p.name for p in self.params]
        if len(set(names)) != len(names):
            raise ValueError(f"ToolSpec.params of {self.name!r}: duplicate parameter names {names}")
        object.__setattr__(self, "param_names", frozenset(names))

    def param(self, name: str) -> ParamSpec:
        return next(p for p in self.params if p.name == name)


class ToolFailure(Exception):
    """The call was well formed but could not be carried out; the message is shown to the model."""


class Tool(Protocol):
    spec: ToolSpec

    def run(self, params: Mapping[str, Any], sandbox: Sandbox) -> str: ...


@dataclass(frozen=True)
class ToolsConfig:
    max_output_chars: int = 20_000
    """Every tool output longer than this is cut (head and tail kept) with a marker saying how much."""
    terminal_timeout_s: float = 60.0
    """run_terminal's timeout when the call gives none."""
    max_terminal_timeout_s: float = 600.0
    """Upper bound on the timeout_s a run_terminal call may ask for."""
    tests_timeout_s: float = 300.0
    """Wall-clock limit of one run_tests call."""
    semantic_top_k: int = 8
    """semantic_search results when the call gives no k."""
    test_durations: bool = False
    """run_tests shows wall-clock durations (off: they made identical episodes' tokens differ run
    to run, so seeds did not reproduce; carl.harness.tools.tests)."""

    def __post_init__(self) -> None:
        for name in (
            "max_output_chars",
            "terminal_timeout_s",
            "max_terminal_timeout_s",
            "tests_timeout_s",
            "semantic_top_k",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"tools.{name}: got {getattr(self, name)!r}, expected a positive number")
        if self.max_output_chars < 200:
            raise ValueError(f"tools.max_output_chars: got {self.max_output_chars}, expected at least 200")


def cap_output(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut `text` to about `max_chars`, keeping the head (2/3) and the tail (1/3) around a marker
    that says how many characters and lines were cut. Returns (text, truncated).

    The tail is kept because the end of long outputs (test summaries, tracebacks) matters most.
    Cuts fall on line boundaries when one is near, so kept lines stay whole."""
    if len(text) <= max_chars:
        return text, False
    budget = max(max_chars - 80, 0)  # room for the marker
    head_end = _line_cut(text, budget * 2 // 3, backwards=True)
    tail_start = _line_cut(text, len(text) - (budget - head_end), backwards=False)
    tail_start = max(tail_start, head_end)
    cut = text[head_end:tail_start]
    marker = f"\n[... truncated {len(cut)} chars ({cut.count(chr(10))} lines) ...]\n"
    return text[:head_end].rstrip("\n") + marker + text[tail_start:].lstrip("\n"), True


def _line_cut(text: str, pos: int, backwards: bool) -> int:
    """A cut position near `pos` at a line boundary, if one lies within 200 chars."""
    pos = min(max(pos, 0), len(text))
    if backwards:
        nl = text.rfind("\n", max(pos - 200, 0), pos)
        return nl + 1 if nl >= 0 else pos
    nl = text.find("\n", pos, min(pos + 200, len(text)))
    return nl + 1 if nl >= 0 else pos
