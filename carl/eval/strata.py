"""Difficulty strata of feature-deletion tasks, and pass rates with 95% intervals.

A task's strata (`task_strata`): `deletion_kind`; `size_lines`, the lines the deletion removed
(what the agent has to write back), bucketed 1-5, 6-20, 21+; `size_files`, the files it touched,
1 or 2+; `fail_to_pass`, its failing tests, 1, 2-5, 6+; and `repo`, the package. A suite may set
other bucket edges (`StrataConfig`); a record without carl's sizes (a SWE-bench row) is
"unknown" (sizes) or "0" (failing tests).

Intervals (95%):

- One outcome per task (`carl bench grade`): the Wilson score interval of the resolved rate
  (E. B. Wilson, JASA 22, 1927; recommended over p ± 1.96 SE for small n or p near 0 or 1 by
  Brown, Cai & DasGupta, Statistical Science 16, 2001):

      center = (p + z²/2n) / (1 + z²/n),   half width = z √(p(1-p)/n + z²/4n²) / (1 + z²/n)

- n samples per task (`carl bench run`): pass@1 (or pass@k) is the mean over T tasks of each
  task's estimate, and the samples of one task are not independent draws of the benchmark. The
  standard error is the clustered one, the spread of the per-task values over tasks:
  SE² = Var_tasks / T (E. Miller, "Adding Error Bars to Evals", arXiv 2411.00640, 2024). It is
  turned into an effective number of independent outcomes, n_eff = p(1-p) / SE² (Kish's design
  effect), which lies between T (tasks all-or-nothing) and T·n (tasks alike), and the Wilson
  interval is taken at n_eff. With one sample per task n_eff = T, and the interval is Wilson's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from carl.tasks.record import TaskRecord

Z_95 = 1.96


@dataclass(frozen=True)
class StrataConfig:
    """Bucket edges of the size strata: the upper edge of every bucket but the last, increasing."""

    size_lines: tuple[int, ...] = (5, 20)
    """Lines to write: (5, 20) gives the buckets 1-5, 6-20, 21+."""
    size_files: tuple[int, ...] = (1,)
    """Files touched: (1,) gives 1, 2+."""
    fail_to_pass: tuple[int, ...] = (1, 5)
    """Failing tests: (1, 5) gives 1, 2-5, 6+."""

    def __post_init__(self) -> None:
        for name in ("size_lines", "size_files", "fail_to_pass"):
            edges = getattr(self, name)
            if not edges or edges[0] < 1 or any(b <= a for a, b in zip(edges, edges[1:])):
                raise ValueError(f"strata.{name}: got {list(edges)}, expected increasing positive integers "
                                 "(the upper edge of every bucket but the last), e.g. [5, 20]")


STRATA = ("deletion_kind", "size_lines", "size_files", "fail_to_pass", "repo")
_ZERO = {"size_lines": "unknown", "size_files": "unknown", "fail_to_pass": "0"}


def bucket_names(edges: Sequence[int]) -> tuple[str, ...]:
    """(5, 20) -> ("1-5", "6-20", "21+")."""
    names, lo = [], 1
    for e in edges:
        names.append(str(lo) if lo == e else f"{lo}-{e}")
        lo = e + 1
    return (*names, f"{lo}+")


def bucket(value: int, edges: Sequence[int]) -> str:
    """The name of `value`'s bucket (`bucket_names`); "" for a value below 1."""
    if value < 1:
        return ""
    names = bucket_names(edges)
    return next((n for e, n in zip(edges, names) if value <= e), names[-1])


def task_strata(task: TaskRecord, config: StrataConfig = StrataConfig()) -> dict[str, str]:
    """stratum -> the task's value, for every stratum of STRATA."""
    sizes = {"size_lines": task.size_lines, "size_files": task.size_files, "fail_to_pass": len(task.FAIL_TO_PASS)}
    out = {"deletion_kind": task.deletion_kind}
    for name, value in sizes.items():
        out[name] = bucket(value, getattr(config, name)) or _ZERO[name]
    out["repo"] = task.repo
    return out


def order_values(stratum: str, values: set[str], config: StrataConfig = StrataConfig()) -> list[str]:
    """A stratum's values in reading order: size buckets small to large, names alphabetically."""
    if stratum in _ZERO:
        order = (_ZERO[stratum], *bucket_names(getattr(config, stratum)))
        return [v for v in order if v in values] + sorted(values - set(order))
    return sorted(values)


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson's score interval of a binomial rate; (0, 1) when n is 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"wilson_interval: successes must be in [0, n={n}], got {successes}")
    return _wilson(successes / n if n else 0.0, n, z)


def mean_interval(values: Sequence[float], max_n: int, z: float = Z_95) -> tuple[float, float]:
    """The interval of the mean of per-task rates in [0, 1] (see the module docstring); `max_n` is
    the number of samples behind them (it bounds n_eff); (0, 1) for no task."""
    t = len(values)
    if t == 0:
        return 0.0, 1.0
    p = statistics.fmean(values)
    var = statistics.pvariance(values)
    if p <= 0.0 or p >= 1.0:
        n_eff = float(t)  # every task 0 (or 1): as sure as T all-or-nothing tasks, no surer
    elif var == 0.0:
        n_eff = float(max_n)  # every task at the same rate: the samples are as good as independent
    else:
        n_eff = min(float(max_n), max(float(t), p * (1 - p) * t / var))
    return _wilson(min(max(p, 0.0), 1.0), n_eff, z)


def _wilson(p: float, n: float, z: float) -> tuple[float, float]:
    if n <= 0:
        return 0.0, 1.0
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval always holds p; at p = 0 or 1 rounding would leave it a hair outside
    return max(0.0, min(p, center - half)), min(1.0, max(p, center + half))
