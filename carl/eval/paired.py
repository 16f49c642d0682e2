"""Paired comparison of two eval reports of the same tasks: the difference of pass@1 and its noise.

    report A, report B (JSON of `BenchReport.to_dict`, per-task `outcomes` in sample order)
    (`paired_rates`: any two results given as per-task pass rates, e.g. graded predictions)
        --> per task: mean of B_j - A_j over the samples j scored in both
        --> difference of pass@1 (task-weighted, like pass@1), its standard error as paired and as if
            the two evals had drawn independent random numbers, and how many episodes were identical

Two checkpoints scored with one sampler seed share their random numbers (`carl.eval.bench.evaluate`),
so sample j of a task is the same episode under both until the checkpoints disagree. The variance of
the difference of such paired samples is Var(A) + Var(B) - 2 Cov(A, B), and the covariance is what
common random numbers buy. Both standard errors count sampling noise only, for these tasks: the
within-task variance of the samples, divided by their number, averaged over tasks as pass@1 is.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PairedDiff:
    tasks: int  # tasks with at least one sample scored in both reports
    pairs: int  # samples scored in both
    pass_a: float  # pass@1 of A over those pairs (task-weighted)
    pass_b: float
    diff: float  # pass_b - pass_a
    se_paired: float  # standard error of diff from the pairs' own spread
    se_independent: float  # ... had the two evals drawn independent random numbers
    identical: int  # pairs whose episodes were identical (equal digests)
    agree: int  # pairs with the same outcome
    tasks_better: int  # tasks whose pass rate rose from A to B
    tasks_worse: int
    per_task: tuple[tuple[str, int, int, int], ...] = ()  # (task id, passes of A, passes of B, pairs)

    @property
    def variance_ratio(self) -> float:
        """Var(independent) / Var(paired): how many times the samples an unpaired comparison needs."""
        return (self.se_independent / self.se_paired) ** 2 if self.se_paired > 0 else math.inf


def paired_difference(a: dict[str, Any], b: dict[str, Any]) -> PairedDiff:
    """Compare report `b` with report `a` sample by sample (see the module docstring).

    Both must come from evals that recorded per-sample outcomes (reports since 2026-11-27)."""
    by_id = {t["task_id"]: t for t in b["tasks"]}
    task_diffs, var_paired, var_indep = [], [], []
    pairs = identical = agree = 0
    per_task = []
    for ta in a["tasks"]:
        tb = by_id.get(ta["task_id"])
        if tb is None:
            continue
        for name, t in (("a", ta), ("b", tb)):
            if len(t.get("outcomes", "")) != t["n"] + t["infra_failures"]:
                raise ValueError(f"report {name}, task {t['task_id']}: no per-sample outcomes "
                                 f"(got outcomes={t.get('outcomes')!r} for {t['n']} scored samples); "
                                 "re-run the eval with a carl that records them")
        both = [j for j, (x, y) in enumerate(zip(ta["outcomes"], tb["outcomes"])) if x != "x" and y != "x"]
        if not both:
            continue
        xa = [int(ta["outcomes"][j]) for j in both]
        xb = [int(tb["outcomes"][j]) for j in both]
        d = [y - x for x, y in zip(xa, xb)]
        n = len(both)
        task_diffs.append(statistics.fmean(d))
        var_paired.append(_var(d) / n)
        var_indep.append((_var(xa) + _var(xb)) / n)
        pairs += n
        agree += sum(x == y for x, y in zip(xa, xb))
        digests_a, digests_b = ta.get("digests") or [], tb.get("digests") or []
        identical += sum(1 for j in both if j < min(len(digests_a), len(digests_b))
                         and digests_a[j] and digests_a[j] == digests_b[j])
        per_task.append((ta["task_id"], sum(xa), sum(xb), n))
    if not task_diffs:
        raise ValueError("the two reports share no task with a sample scored in both")
    k = len(task_diffs)
    return PairedDiff(tasks=k, pairs=pairs, pass_a=statistics.fmean(a / n for _, a, _, n in per_task),
                      pass_b=statistics.fmean(b / n for _, _, b, n in per_task),
                      diff=statistics.fmean(task_diffs), se_paired=math.sqrt(sum(var_paired)) / k,
                      se_independent=math.sqrt(sum(var_indep)) / k, identical=identical, agree=agree,
                      tasks_better=sum(b > a for _, a, b, _ in per_task),
                      tasks_worse=sum(b < a for _, a, b, _ in per_task), per_task=tuple(per_task))


def _var(xs: list[float]) -> float:
    """Unbiased sample variance; 0 for a single sample (it has no spread to estimate)."""
    return statistics.variance(xs) if len(xs) > 1 else 0.0


def paired_rates(a: dict[str, float], b: dict[str, float], same: set[str] = frozenset()) -> PairedDiff:
    """Compare results `b` and `a` task by task, from each task's pass rate in them (a graded
    prediction's 0 or 1, a run's passes over its scored samples), paired by task id.

    One outcome per task (a predictions file) cannot show how much of it was the agent's luck, so
    the noise counted here is that of the tasks themselves, as a sample of tasks of their kind:
    the standard error of the mean of the per-task differences d_t = b_t - a_t over T tasks,
    sd(d) / √T (the paired SE), and √((Var a + Var b) / T) had the two been scored on
    independent draws of tasks. `same`: tasks whose two answers were identical (equal patches).
    """
    common = [t for t in a if t in b]
    if not common:
        raise ValueError("the two results share no task scored in both")
    xa, xb = [a[t] for t in common], [b[t] for t in common]
    d = [y - x for x, y in zip(xa, xb)]
    k = len(common)
    return PairedDiff(tasks=k, pairs=k, pass_a=statistics.fmean(xa), pass_b=statistics.fmean(xb),
                      diff=statistics.fmean(d), se_paired=math.sqrt(_var(d) / k),
                      se_independent=math.sqrt((_var(xa) + _var(xb)) / k),
                      identical=sum(t in same for t in common), agree=sum(x == y for x, y in zip(xa, xb)),
                      tasks_better=sum(x > 0 for x in d), tasks_worse=sum(x < 0 for x in d))


def over_tasks(d: PairedDiff) -> PairedDiff:
    """`d` with its standard error counted over tasks: the spread of the per-task differences / √T.

    `paired_difference`'s SE counts the samples' luck on these tasks only; this one also counts
    which tasks were drawn, so it is the noise of a claim about held-out tasks of their kind."""
    return paired_rates({t: a / n for t, a, _, n in d.per_task}, {t: b / n for t, _, b, n in d.per_task})


def in_words(diff: float, se: float, what: str = "B", than: str = "A", z: float = 2.0) -> str:
    """Whether a difference is beyond noise, in words: beyond `z` standard errors or not."""
    if se == 0:
        return f"{what} and {than} scored the same on every task" if diff == 0 else \
            f"{what} differs from {than} by {diff:+.3f} with no spread to judge it by"
    if diff > z * se:
        return f"{what} beat {than} beyond noise ({diff / se:.1f} standard errors)"
    if diff < -z * se:
        return f"{what} scored below {than} beyond noise ({-diff / se:.1f} standard errors)"
    return f"within noise: {what} - {than} is {abs(diff) / se:.1f} standard errors from 0 (needs {z:g})"
