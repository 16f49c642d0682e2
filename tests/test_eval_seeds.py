"""Spread over seeds: sample standard deviation and Student t-interval, on numbers checkable by hand."""

import math
import statistics

import pytest

from carl.eval.seeds import t_975, seed_spread


def test_three_seeds_use_the_sample_sd_and_t_with_two_degrees_of_freedom():
    s = seed_spread([1.0, 2.0, 3.0])  # deviations -1, 0, 1: sum of squares 2, / (3 - 1) = 1
    assert (s.n, s.mean, s.sd) == (3, 2.0, 1.0)
    half = 4.303 * 1.0 / math.sqrt(3)  # 2.484
    assert (s.low, s.high) == pytest.approx((2.0 - half, 2.0 + half))
    assert statistics.pstdev([1.0, 2.0, 3.0]) == pytest.approx(0.816, abs=1e-3)  # what it replaces: sqrt(2/3)


def test_two_seeds_get_t_with_one_degree_of_freedom():
    s = seed_spread([0.0, 4.0])  # sd = sqrt((4 + 4) / 1) = 2.828; half = 12.706 * 2.828 / 1.414 = 25.412
    assert s.sd == pytest.approx(math.sqrt(8))
    assert (s.low, s.high) == pytest.approx((2.0 - 25.412, 2.0 + 25.412))


def test_the_readme_transfer_gain_over_three_seeds():
    s = seed_spread([0.182, 0.679, 0.165])  # held-out gains of seeds 2, 3, 4 (docs/results/transfer)
    assert s.mean == pytest.approx(0.342, abs=5e-4)
    assert s.sd == pytest.approx(0.292, abs=5e-4)  # the population sd was 0.238
    assert (s.low, s.high) == pytest.approx((-0.383, 1.067), abs=1e-3)
    assert not s.excludes_zero()
    assert s.format(signed=True) == "+0.342 (sd 0.292, 95% CI [-0.383, +1.067], n=3)"
    assert "not distinguishable from 0" in s.in_words()


def test_an_interval_above_or_below_zero_says_so():
    up, down = seed_spread([0.1, 0.2, 0.3]), seed_spread([-0.1, -0.2, -0.3])  # half = 4.303 * 0.1 / 1.732 = 0.248
    assert up.excludes_zero() is False and down.excludes_zero() is False
    tight = seed_spread([0.30, 0.31, 0.32])  # half = 4.303 * 0.01 / 1.732 = 0.0248
    assert tight.low == pytest.approx(0.31 - 0.0248, abs=1e-4) and tight.excludes_zero()
    assert "above 0" in tight.in_words()
    assert "below 0" in seed_spread([-0.30, -0.31, -0.32]).in_words()


def test_one_seed_has_no_spread_and_no_interval():
    s = seed_spread([0.25])
    assert (s.mean, s.sd, s.low, s.high) == (0.25, None, None, None)
    assert not s.excludes_zero() and s.format() == "0.250 (n=1, no spread)"
    assert s.to_dict() == {"n": 1, "mean": 0.25, "sd": None, "ci95_low": None, "ci95_high": None}
    with pytest.raises(ValueError, match="no values"):
        seed_spread([])


def test_t_quantiles_from_the_table_and_beyond_it():
    assert t_975(1) == 12.706 and t_975(2) == 4.303 and t_975(30) == 2.042
    assert t_975(31) == pytest.approx(2.0395, abs=2e-4)  # the table's next entry, from the expansion
    assert t_975(120) == pytest.approx(1.9799, abs=2e-4)
    assert t_975(10**6) == pytest.approx(1.960, abs=1e-3)
    assert all(t_975(df) > t_975(df + 1) for df in range(1, 200))  # falls toward the normal quantile
    with pytest.raises(ValueError, match="df must be >= 1"):
        t_975(0)
