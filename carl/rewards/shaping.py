"""Reward shaping: the training reward of a rollout from its test reward and its trajectory.

    infra failure                  -> 0.0 and masked (never trained on)
    require_finish, no finish call -> a fail: 0.0, whatever the tests say
    else                           -> the test reward after the monitor's action
    minus tool_error_cost per failed tool call, at most MAX_TOOL_ERROR_PENALTY in all

    cost_needs_pass, a group where no rollout passed -> the cost is given back (group_rewards):
                                       all-fail groups then carry no advantage at all; with
                                       needs_pass_gives_back="execution" only that of calls that
                                       parsed and then failed (malformed calls keep their cost)

    mask_unfinished, no finish call -> scored as above, but kept out of its group's baseline and
                                       the loss (`trained`): nothing an unfinished episode did is
                                       reinforced or punished

`passed` (the outcome evaluation counts) is stricter than a positive reward: the tests pass, the
monitor saw nothing suspicious and, with require_finish, the agent called finish.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from carl.rewards.episode import EpisodeReward
from carl.types import StopReason, Trajectory

MAX_TOOL_ERROR_PENALTY = 0.5
"""Cap on the total tool-error penalty of one episode: a pass then scores at least 0.5 and a fail
at most 0.0, so a passing episode always outranks a failing one, however many calls failed."""


@dataclass(frozen=True)
class ShapingConfig:
    tool_error_cost: float = 0.0
    """Subtracted per failed tool call (a call that did not parse or that the tool rejected), at
    most 0.5 in all, so a pass still outranks any fail; 0 turns it off."""
    require_finish: bool = False
    """Score an episode that ends without calling finish (out of turns, tokens or time) as a fail. Off
    by default: on seeds 15-19 of the 64-episode default it scored +0.004 above it after RL (95%
    interval -0.035 to +0.044); it kept seed 18's held-out finishing (0.57 against 0.23) without
    raising its pass@1 (docs/training.md, "Charging for not finishing")."""
    mask_unfinished: bool = False
    """Leave an episode that ends without calling finish out of training (its group's baseline and
    the loss), as DAPO's overlong filtering and TRL's mask_truncated_completions do: an episode
    that passed and then ran out of turns is not rewarded for the turns after the pass, and one
    that failed that way is not punished for calls that might have led somewhere. Its reward and
    outcome still count in the metrics and in evaluation. A policy can use it: a failing episode
    that never calls finish escapes the negative advantage a finished one gets (measured in
    docs/training.md, "Finishing"; off by default)."""
    cost_needs_pass: bool = False
    """Charge tool_error_cost only in a group where some rollout passed. In a group where all
    failed the cost is then the only difference between rollouts, and what lowers it is calling
    fewer tools: in one run of the embedded default (fp32 seed 8) whose RL batches almost never
    passed, tool calls per episode fell 4.46 -> 2.12 over four steps and held-out episodes that
    call finish rose 0.28 -> 0.90, while pass@1 went 0.060 -> 0.020 (docs/training.md). With it,
    such a group has no advantage, and dynamic sampling looks further for one that does. Off by
    default: over fp32 seeds 5-9 it scored +0.096 above the default after RL (95% interval -0.057 to
    +0.249, within noise), and its RL rollouts' failed-call rate was 0.27 against 0.16 (the cost in
    an all-fail group also keeps the call format; docs/training.md, "No error cost where nothing passed")."""
    needs_pass_gives_back: Literal["all", "execution"] = "all"
    """Which failed calls' cost cost_needs_pass gives back in a group where nothing passed: "all",
    or "execution": only calls that parsed and then failed while running (an edit whose old text did
    not match, a missing file), so a malformed call (an unknown tool or parameter, an unclosed tag)
    is still charged and the call format is still taught where nothing passed. After needspass, one
    seed's held-out episodes made 31 malformed calls and 19 failed edits in 38 episodes, against
    none with the default (docs/training.md, "With a rollout budget all-fail batches do not exhaust").
    Off by default: with rl.max_rollouts=128, two bf16 draws over seeds 5-9 scored +0.047 above the
    default after RL (95% interval -0.021 to +0.114, within noise; docs/training.md, "The same seeds
    again in bf16")."""

    def __post_init__(self) -> None:
        if self.tool_error_cost < 0:
            raise ValueError(f"shaping.tool_error_cost: got {self.tool_error_cost}, expected >= 0")
        if self.needs_pass_gives_back not in ("all", "execution"):
            raise ValueError(f"shaping.needs_pass_gives_back: got {self.needs_pass_gives_back!r}, expected "
                             "'all' or 'execution'")
        if self.needs_pass_gives_back != "all" and not self.cost_needs_pass:
            raise ValueError(f"shaping.needs_pass_gives_back: got {self.needs_pass_gives_back!r} with "
                             "shaping.cost_needs_pass=false, where nothing is given back; set "
                             "shaping.cost_needs_pass=true too")
        if self.require_finish and self.mask_unfinished:
            raise ValueError("shaping.require_finish and shaping.mask_unfinished: got both true, expected at "
                             "most one (an unfinished episode is either scored as a fail or left out of training)")


def tool_error_penalty(num_tool_errors: int, cost_per_error: float) -> float:
    """cost_per_error * failed calls, capped at MAX_TOOL_ERROR_PENALTY (0 when cost is 0)."""
    if cost_per_error < 0:
        raise ValueError(f"cost_per_error: got {cost_per_error}, expected >= 0")
    return min(cost_per_error * num_tool_errors, MAX_TOOL_ERROR_PENALTY)


def given_back(trajectory: Trajectory, config: ShapingConfig) -> float:
    """The part of the episode's tool-error penalty that cost_needs_pass gives back in a group where
    nothing passed: all of it, or (needs_pass_gives_back="execution") all but what its malformed
    calls alone would cost."""
    penalty = tool_error_penalty(trajectory.num_tool_errors, config.tool_error_cost)
    if config.needs_pass_gives_back == "all":
        return penalty
    malformed = sum(1 for t in trajectory.turns for r in t.results if r.error is not None and r.error.kind != "execution")
    return penalty - tool_error_penalty(malformed, config.tool_error_cost)


def group_rewards(rewards: list[float], penalties: list[float], passed: list[bool],
                  config: ShapingConfig) -> list[float]:
    """The training rewards of one group: `rewards` (each rollout's tool-error penalty already
    subtracted) with `penalties` (the part of it to give back: `given_back`) given back when
    cost_needs_pass is set and none of the group passed."""
    if not (len(rewards) == len(penalties) == len(passed)):
        raise ValueError(f"group_rewards: got {len(rewards)} rewards, {len(penalties)} penalties and "
                         f"{len(passed)} outcomes, expected one of each per rollout")
    if not config.cost_needs_pass or any(passed):
        return list(rewards)
    return [r + p for r, p in zip(rewards, penalties)]


def trained(trajectory: Trajectory, config: ShapingConfig) -> bool:
    """Whether the episode enters its group's baseline and the loss (False: mask_unfinished and no
    finish call)."""
    return not (config.mask_unfinished and trajectory.stop_reason is not StopReason.FINISHED)


def training_reward(ep: EpisodeReward, trajectory: Trajectory, config: ShapingConfig) -> tuple[float, bool]:
    """(training reward, passed) of one rewarded episode (see the module docstring)."""
    if ep.infra_failure:
        return 0.0, False
    unfinished = config.require_finish and trajectory.stop_reason is not StopReason.FINISHED
    reward = (0.0 if unfinished else ep.reward) - tool_error_penalty(trajectory.num_tool_errors, config.tool_error_cost)
    passed = not unfinished and ep.result.reward >= 1.0 and not ep.monitor.suspicious
    return reward, passed
