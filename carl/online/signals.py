"""From what users did to rewards: one number per served request, and the production hacks.

    signals of a request                      reward (SignalWeights, every weight a setting)
      kept 1 / reverted                  ->   + kept            / + reverted
      tests 1 / 0 (the user's own run)   ->   + tests_pass      / + tests_fail
      thumbs +1 / -1                     ->   + thumbs * value
      still_present 1 / 0 (next session) ->   + still_present * (2 * value - 1)
      followup (dissatisfied message)    ->   + followup
      comment                            ->   nothing (text only: a hint for self-distillation)

A request with none of the scored signals has no reward (None): it is not trained on until a
signal arrives. The reward of a request the production monitor flags (`production_flags`) is
capped at `honest_failure` minus `hack_margin`, the reward of an attempted edit that was
reverted with failing tests, so broken or skipped work never scores better than an honest
failure, whatever the user happened to signal:

    no_edit          the request finished without changing any file (a reply that only talks,
                     or asks a clarifying question, instead of attempting the edit)
    broken_calls     more than `max_tool_errors` malformed tool calls in the episode
    noop_edit        every changed line differs from the old one only in whitespace or comments
                     (an edit that is easy to keep because it does nothing)
    infra            the episode failed in the infrastructure (policy or sandbox error): masked,
                     never trained on, not a reward
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class SignalWeights:
    kept: float = 1.0
    reverted: float = -1.0
    tests_pass: float = 0.5
    tests_fail: float = -0.5
    thumbs: float = 0.5
    """Times the thumbs value (+1 or -1)."""
    still_present: float = 0.5
    """Times +1 when the edit was still in the code at the user's next session, -1 when it was gone."""
    followup: float = -0.5
    """A follow-up message that reads as dissatisfied (times its value when it has one, else 1)."""
    max_tool_errors: int = 2
    """More malformed tool calls than this in one request flags it as broken_calls."""
    hack_margin: float = 0.25
    """A flagged request's reward is at most honest_failure - hack_margin."""

    @property
    def honest_failure(self) -> float:
        """The reward of an attempted edit that the user reverted after their tests failed."""
        return self.reverted + self.tests_fail

    def __post_init__(self) -> None:
        if self.hack_margin < 0:
            raise ValueError(f"signals.hack_margin: got {self.hack_margin}, expected >= 0")
        if self.max_tool_errors < 0:
            raise ValueError(f"signals.max_tool_errors: got {self.max_tool_errors}, expected >= 0")
        if self.kept <= self.reverted:
            raise ValueError(f"signals.kept ({self.kept}) must be above signals.reverted ({self.reverted})")


SCORED = ("kept", "reverted", "tests", "thumbs", "still_present", "followup")


def request_reward(request: Mapping[str, Any], weights: SignalWeights = SignalWeights()) -> float | None:
    """The reward of one stored request (a FeedbackStore.get_request dict), or None without a
    scored signal or for an infrastructure failure."""
    flags = production_flags(request, weights)
    if "infra" in flags:
        return None
    signals = [s for s in request.get("signals", []) if s["kind"] in SCORED]
    if not signals:
        return None
    reward = sum(_signal_value(s, weights) for s in _latest_per_kind(signals))
    if flags:
        reward = min(reward, weights.honest_failure - weights.hack_margin)
    return reward


def _latest_per_kind(signals: list[Mapping[str, Any]]) -> Iterable[Mapping[str, Any]]:
    """A user who changes their mind (kept, then reverted) counts once, as they ended up:
    the last of kept/reverted, the last thumbs, the last tests result, every followup."""
    last: dict[str, Mapping[str, Any]] = {}
    followups = []
    for s in signals:
        if s["kind"] == "followup":
            followups.append(s)
        else:
            last["kept/reverted" if s["kind"] in ("kept", "reverted") else s["kind"]] = s
    return [*last.values(), *followups]


def _signal_value(s: Mapping[str, Any], w: SignalWeights) -> float:
    kind, value = s["kind"], s.get("value")
    if kind == "kept":
        return w.kept if value is None or value > 0 else w.reverted
    if kind == "reverted":
        return w.reverted if value is None or value > 0 else w.kept
    if kind == "tests":
        return w.tests_pass if value is not None and value > 0 else w.tests_fail
    if kind == "thumbs":
        return w.thumbs * (1.0 if value is not None and value > 0 else -1.0)
    if kind == "still_present":
        return w.still_present * (1.0 if value is not None and value > 0 else -1.0)
    return w.followup * (1.0 if value is None else float(value))  # followup


def production_flags(request: Mapping[str, Any], weights: SignalWeights = SignalWeights()) -> list[str]:
    """What the production monitor sees in a finished request (see module docstring)."""
    trajectory = request.get("trajectory") or {}
    stop = request.get("stop_reason") or trajectory.get("stop_reason")
    if stop in ("policy_error", "sandbox_error"):
        return ["infra"]
    flags = []
    edits = request.get("edits") or ""
    if not edits.strip():
        flags.append("no_edit")
    elif noop_edit(edits):
        flags.append("noop_edit")
    tool_errors = sum(len(t.get("errors", [])) for t in trajectory.get("turns", []))
    if tool_errors > weights.max_tool_errors:
        flags.append("broken_calls")
    return flags


_COMMENT = re.compile(r"\s*(#.*)?$")


def noop_edit(diff: str) -> bool:
    """Every removed and added line of the diff is the same code up to whitespace and comments."""
    removed, added = [], []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            continue
        if line.startswith("-"):
            removed.append(line[1:])
        elif line.startswith("+"):
            added.append(line[1:])
    if not removed and not added:
        return True

    def code(lines: list[str]) -> list[str]:
        out = []
        for x in lines:
            stripped = _COMMENT.sub("", x) if "#" in x else x
            if stripped.strip():
                out.append("".join(stripped.split()))
        return out

    return code(removed) == code(added)
