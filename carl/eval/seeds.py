"""Spread over seeds: the mean of one value per seed, its sample standard deviation and a 95% interval.

    x_1 .. x_n (one per seed: a run's held-out gain, its warm start's pass@1, ...)
        --> mean        m = (x_1 + ... + x_n) / n
        --> sample sd   s = sqrt(sum (x_i - m)^2 / (n - 1))          (n - 1: Bessel's correction)
        --> 95% interval of the mean   m ± t(0.975, n - 1) · s / sqrt(n)   (Student, Biometrika 6, 1908)

Seeds are a sample of the runs a recipe could give, so their spread is the sample standard deviation,
not the population one (dividing by n understates it, by a factor sqrt((n-1)/n): 0.82 at n = 3), and
the interval uses Student's t with n - 1 degrees of freedom, not the normal 1.96: at n = 3 the
quantile is 4.303. It assumes the per-seed values are independent draws of one roughly normal
distribution; it says nothing about sampling noise inside a seed's eval (that is each seed's own
paired standard error, `carl.eval.paired`). One seed has no spread: `sd` and the interval are None.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

# t(0.975, df) for df = 1..30 (any t table, e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
Z_975 = 1.959964  # the normal quantile t tends to


def t_975(df: int) -> float:
    """Student's t quantile 0.975 at `df` degrees of freedom: the table up to 30, beyond it the first
    two terms of the Cornish-Fisher expansion in 1/df around the normal quantile (Abramowitz and
    Stegun 26.7.5; within 2e-4 of the exact value for df > 30, where the normal 1.96 alone is 4% low)."""
    if df < 1:
        raise ValueError(f"t_975: df must be >= 1, got {df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


@dataclass(frozen=True)
class SeedSpread:
    n: int  # seeds
    mean: float
    sd: float | None  # sample standard deviation (n - 1); None for one seed
    low: float | None  # 95% t-interval of the mean; None for one seed
    high: float | None

    def excludes_zero(self) -> bool:
        """Whether the interval lies wholly above or below 0 (False for one seed: nothing to tell)."""
        return self.low is not None and (self.low > 0 or self.high < 0)

    def in_words(self) -> str:
        """What the interval says about the mean against 0, for a printed summary."""
        if self.sd is None:
            return "one seed: no spread over seeds to judge the mean by"
        if self.excludes_zero():
            return f"the mean is {'above' if self.low > 0 else 'below'} 0 beyond the spread over seeds (95% interval)"
        return "the mean is not distinguishable from 0 over seeds (its 95% interval includes 0)"

    def format(self, signed: bool = False) -> str:
        """`+0.342 (sd 0.292, 95% CI [-0.383, +1.067], n=3)`, or `+0.342 (n=1, no spread)`."""
        f = "+.3f" if signed else ".3f"
        if self.sd is None:
            return f"{self.mean:{f}} (n={self.n}, no spread)"
        return f"{self.mean:{f}} (sd {self.sd:.3f}, 95% CI [{self.low:{f}}, {self.high:{f}}], n={self.n})"

    def to_dict(self) -> dict[str, float | int | None]:
        return {"n": self.n, "mean": self.mean, "sd": self.sd, "ci95_low": self.low, "ci95_high": self.high}


def seed_spread(values: Sequence[float]) -> SeedSpread:
    """Mean, sample standard deviation and 95% Student t-interval of the mean of one value per seed."""
    n = len(values)
    if n == 0:
        raise ValueError("seed_spread: no values")
    mean = statistics.fmean(values)
    if n == 1:
        return SeedSpread(1, mean, None, None, None)
    sd = statistics.stdev(values)
    half = t_975(n - 1) * sd / math.sqrt(n)
    return SeedSpread(n, mean, sd, mean - half, mean + half)
