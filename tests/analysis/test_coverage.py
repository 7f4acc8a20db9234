"""The intervals of lit-credit-compare hold their level, by simulation: designs of n paired seed differences with
a known true mean difference, the share of intervals that contain it. With R designs the share's binomial
standard deviation at 95 % is sqrt(0.95 x 0.05 / R): 0.34 % at R = 4000, 0.49 % at R = 2000."""
from __future__ import annotations

import numpy as np
import pytest

from lit_credit.analysis.compare import paired_bootstrap, paired_t


def coverage(interval, draws: np.ndarray, truth: float) -> float:
    bounds = np.array([interval(d)[1:] for d in draws])
    return float(((bounds[:, 0] <= truth) & (truth <= bounds[:, 1])).mean())


@pytest.mark.parametrize("n", [3, 5, 10])
def test_the_t_interval_covers_95_percent_at_3_to_10_seeds(n):
    draws = np.random.default_rng(n).normal(0.3, 1.0, size=(4000, n))
    assert abs(coverage(paired_t, draws, 0.3) - 0.95) < 0.015  # 4.4 binomial sd


def test_the_t_interval_under_skewed_differences_at_5_seeds():
    """Exponential differences (skewness 2), centred: t covers about 89 %, stated in its docstring; the plain
    percentile bootstrap it replaced covers under 80 % on the same designs."""
    draws = np.random.default_rng(1).exponential(1.0, size=(4000, 5)) - 1.0
    assert 0.87 < coverage(paired_t, draws, 0.0) < 0.92
    means = draws[:, np.random.default_rng(2).integers(0, 5, size=(2000, 5))].mean(-1)  # [designs, resamples]
    low, high = np.percentile(means, [2.5, 97.5], axis=1)
    assert ((low <= 0) & (high >= 0)).mean() < 0.80


def test_the_plain_percentile_bootstrap_undercovers_at_5_seeds():
    """Why the bootstrap is no longer the default: on normal differences the plain 95 % percentile interval
    covers about 84 % at 5 seeds (its resampled means never leave [min, max] and ignore the t correction)."""
    draws = np.random.default_rng(3).normal(0.0, 1.0, size=(4000, 5))
    means = draws[:, np.random.default_rng(4).integers(0, 5, size=(2000, 5))].mean(-1)
    low, high = np.percentile(means, [2.5, 97.5], axis=1)
    assert 0.81 < ((low <= 0) & (high >= 0)).mean() < 0.87


def test_the_expanded_bootstrap_covers_at_10_seeds():
    draws = np.random.default_rng(5).normal(-0.2, 1.0, size=(2000, 10))
    assert abs(coverage(lambda d: paired_bootstrap(d, resamples=2000), draws, -0.2) - 0.95) < 0.02
