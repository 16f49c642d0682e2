"""Production requests -> a training batch: rewards from signals, advantages from a baseline.

    stored requests (FeedbackStore.finished_requests: token-exact trajectories and signals)
      -> reward per request (carl.online.signals.request_reward; None: not yet signalled, skipped)
      -> advantage = reward - baseline            (one sample per prompt: no group to compare with)
      -> Rollout(trajectory, advantage, feedback = the user's follow-up text)  -> carl.train.step.rl_step

Production has one sample per prompt, so GRPO's group mean is not available. The baselines:

    running_mean   a moving mean of past rewards per cluster (the user's workspace: the
                   nearest thing production has to "the same prompt"), shrunk toward the moving
                   mean over every cluster (weight n / (n + prior_count) for a cluster seen n
                   times; the overall mean alone for a new one; the batch mean before any). The
                   request's own reward is added only after its advantage is taken, so it never
                   baselines itself.
    batch          the mean reward of this cycle's batch (a cycle of only good or only
                   bad requests then learns nothing from its rewards).
    prompt         (default) requests of this batch with the same text (whitespace aside: the same
                   question, e.g. asked by several users of one repository) form a group, and
                   the group's mean reward is the baseline, as Dr. GRPO's group mean; a request
                   whose text no other request of the batch shares gets the batch mean. A
                   request that fails for every user then pushes nothing down, where the batch
                   mean pushes down whatever the model did on it.
    distill        no policy-gradient term (advantage 0): only self-distillation from the users'
                   follow-ups (rl.sd_weight > 0), the teacher being the same model with the
                   follow-up in context at the turns that went wrong.

Measured on 144 served requests where 3 users asked each question (benchmarks/online_baselines.py,
docs/online.md): mean squared advantage 0.51 under `prompt`, 2.65 under `batch`, 2.57 under the
running mean (without the request's own reward: prompt 1.15, batch 2.80, paired -1.65 +- 0.27).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from carl.online.signals import SignalWeights, production_flags, request_reward
from carl.rollout.rollout import Rollout
from carl.tasks import TaskRecord
from carl.types import Trajectory

BASELINES = ("running_mean", "batch", "prompt", "distill")
FOLLOWUP_HEADING = "The user replied to this work:"


@dataclass
class Baseline:
    """The running mean's state, saved with the online run's state between cycles."""

    means: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    prior_count: float = 4.0
    """Shrinkage: a cluster's own mean of n rewards is weighted n / (n + prior_count) against the
    mean over all clusters (production sees a cluster a few times: its own mean alone is noisy;
    measured in benchmarks/online_baselines.py)."""

    def value(self, key: str) -> float | None:
        overall = self.means.get("*")
        if key not in self.means or overall is None:
            return overall
        n = self.counts[key]
        return (n * self.means[key] + self.prior_count * overall) / (n + self.prior_count)

    def add(self, key: str, reward: float, decay: float) -> None:
        for k in (key, "*"):
            n = self.counts.get(k, 0)
            old = self.means.get(k, reward)
            # the plain mean for the first 1 / (1 - decay) rewards, then the moving mean
            rate = max(1.0 / (n + 1), 1.0 - decay)
            self.means[k] = old + rate * (reward - old)
            self.counts[k] = n + 1

    def to_dict(self) -> dict[str, Any]:
        return {"means": self.means, "counts": self.counts}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Baseline:
        d = d or {}
        return cls(dict(d.get("means", {})), {k: int(v) for k, v in d.get("counts", {}).items()})


@dataclass(frozen=True)
class Batch:
    rollouts: list[Rollout]
    stats: dict[str, float]
    last_id: int
    """The highest store id read (a cycle resumes after it)."""


def prompt_key(request: Mapping[str, Any]) -> str:
    """The request's text with runs of whitespace made one space: the `prompt` baseline's group."""
    return " ".join(str(request.get("text", "")).split())


def group_mean(rewards: list[float], fallback: float) -> float:
    """The `prompt` baseline of a request whose group (itself included) has these rewards."""
    return statistics.fmean(rewards) if len(rewards) > 1 else fallback


def build_batch(requests: list[dict[str, Any]], cluster_of: Callable[[dict[str, Any]], str],
                weights: SignalWeights, baseline: Baseline, mode: str = "running_mean",
                decay: float = 0.9) -> Batch:
    """The training batch of `requests` (FeedbackStore dicts, in id order); updates `baseline`."""
    if mode not in BASELINES:
        raise ValueError(f"online.baseline: got {mode!r}, expected one of {', '.join(BASELINES)}")
    scored = []
    flagged = unsignalled = 0
    for r in requests:
        reward = request_reward(r, weights)
        if reward is None:
            unsignalled += 1
            continue
        traj = Trajectory.from_dict(r["trajectory"])
        if not any(any(s.generated_mask_T) for s in traj.segments):
            continue  # a text-level policy served it: nothing token-exact to train on
        flagged += bool(production_flags(r, weights))
        scored.append((r, reward, traj))
    batch_mean = statistics.fmean(x for _, x, _ in scored) if scored else 0.0
    groups: dict[str, list[float]] = {}
    for r, reward, _ in scored:
        groups.setdefault(prompt_key(r), []).append(reward)
    rollouts = []
    for r, reward, traj in scored:
        key = cluster_of(r)
        if mode == "distill":
            advantage = 0.0
        elif mode == "batch":
            advantage = reward - batch_mean
        elif mode == "prompt":
            advantage = reward - group_mean(groups[prompt_key(r)], batch_mean)
        else:
            prior = baseline.value(key)
            advantage = reward - (batch_mean if prior is None else prior)
            baseline.add(key, reward, decay)
        followups = [s["text"] for s in r.get("signals", []) if s["kind"] == "followup" and s.get("text")]
        kept = any(s["kind"] == "kept" and (s.get("value") is None or s["value"] > 0) for s in r.get("signals", []))
        task = TaskRecord(instance_id=f"{r['session_id']}/{r['request_index']}", repo=key,
                          problem_statement=r["text"])
        rollouts.append(Rollout(task, traj, reward=reward, valid=True, passed=kept, feedback="\n".join(followups),
                                diff=r.get("edits") or "", advantage=advantage, feedback_heading=FOLLOWUP_HEADING))
    rewards = [x for _, x, _ in scored]
    stats = {"requests": float(len(requests)), "trained": float(len(rollouts)), "unsignalled": float(unsignalled),
             "flagged": float(flagged), "reward_mean": batch_mean,
             "reward_std": statistics.stdev(rewards) if len(rewards) > 1 else 0.0,
             "kept_rate": sum(r.passed for r in rollouts) / len(rollouts) if rollouts else 0.0,
             "advantage_abs_mean": statistics.fmean(abs(r.advantage) for r in rollouts) if rollouts else 0.0,
             "prompt_groups": float(sum(len(g) > 1 for g in groups.values()))}
    return Batch(rollouts, stats, max((int(r["id"]) for r in requests), default=0))
