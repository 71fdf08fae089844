"""The step-time ratio interval (analyzer/compare/stats.py) on synthetic step times with known
answers: no timing, seeded draws, exact cases where the interval must collapse to the ratio."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from analyzer.compare import stats


def _draws(seed: int, repeats: int, steps: int, *, level: float = 10.0, step_sd: float = 0.1,
           repeat_sd: float = 0.05) -> list[list[float]]:
    """Log-normal step times: a per-repeat effect and per-step noise around ``level``."""
    rng = np.random.default_rng(seed)
    return [list(np.exp(math.log(level) + rng.normal(0, repeat_sd) + rng.normal(0, step_sd, steps)))
            for _ in range(repeats)]


def test_identical_distributions_give_an_interval_around_one():
    hits = 0
    for seed in range(20):  # two independent draws of one distribution, 5 repeats of 20 steps
        a, b = _draws(2 * seed, 5, 20), _draws(2 * seed + 1, 5, 20)
        ci = stats.ratio_ci(a, b)
        assert ci.ci_low < ci.ratio < ci.ci_high
        hits += ci.ci_low <= 1 <= ci.ci_high
    assert hits >= 18  # a 95 % interval; 20 draws fixed by their seeds


def test_a_30_percent_shift_with_many_samples_excludes_one():
    a = _draws(1, 10, 50)
    b = [[1.3 * v for v in r] for r in _draws(2, 10, 50)]
    ci = stats.ratio_ci(a, b)
    # the point estimate is the ratio of pooled medians, computed here a second way
    pooled = statistics.median([v for r in b for v in r]) / statistics.median([v for r in a for v in r])
    assert ci.ratio == pytest.approx(pooled, rel=1e-12)
    assert 1.0 < ci.ci_low < 1.3 < ci.ci_high < 1.45
    assert ci.repeats == 10 and ci.steps == 1000 and not ci.paired


def test_constant_steps_give_the_exact_ratio():
    ci = stats.ratio_ci([[6.0] * 4] * 5, [[9.0] * 4] * 5)
    assert ci.ratio == 1.5
    assert ci.ci_low == pytest.approx(1.5, rel=1e-12) and ci.ci_high == pytest.approx(1.5, rel=1e-12)
    assert ci.log_sd == 0.0


def test_same_input_same_interval_and_scaling_is_exact():
    a, b = _draws(3, 5, 10), _draws(4, 5, 10)
    first = stats.ratio_ci(a, b)
    assert stats.ratio_ci(a, b) == first  # fixed seed
    lows = []
    for k in (1.0, 1.1, 1.2, 1.3):  # same draws of indices: the interval scales by k
        ci = stats.ratio_ci(a, [[k * v for v in r] for r in b])
        assert ci.ci_low == pytest.approx(k * first.ci_low, rel=1e-9)
        assert ci.ci_high == pytest.approx(k * first.ci_high, rel=1e-9)
        lows.append(ci.ci_low)
    assert lows == sorted(lows)


def test_pairing_cancels_load_shared_by_a_repeat():
    # every step of repeat r takes d_r (load drifting 0.5x..2x); B is 1.3x A in each repeat
    drift = [0.5, 2.0, 1.0, 1.7, 0.6]
    a = [[d] * 6 for d in drift]
    b = [[1.3 * d] * 6 for d in drift]
    paired = stats.ratio_ci(a, b, paired=True)
    assert paired.ci_low == pytest.approx(1.3) and paired.ci_high == pytest.approx(1.3)
    assert paired.log_sd == pytest.approx(0.0, abs=1e-12)
    unpaired = stats.ratio_ci(a, b)
    assert unpaired.ci_low < 1 < unpaired.ci_high  # the drift swamps the 1.3x unpaired


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one step"):
        stats.ratio_ci([[]], [[1.0]])
    with pytest.raises(ValueError, match="> 0"):
        stats.ratio_ci([[0.0]], [[1.0]])
    with pytest.raises(ValueError, match="equal repeat counts"):
        stats.ratio_ci([[1.0]], [[1.0], [2.0]], paired=True)


def test_repeats_to_resolve_matches_the_t_formula():
    # (t(n-1) + z(0.8)) * 0.1 / sqrt(n) <= log 1.1 = 0.0953 first holds at n = 11:
    # n = 10: (2.262 + 0.8416) * 0.1 / 3.162 = 0.0981; n = 11: (2.228 + 0.8416) * 0.1 / 3.317 = 0.0925
    assert stats.repeats_to_resolve(0.1, 1.1) == 11
    assert stats.repeats_to_resolve(0.1, 1 / 1.1) == 11  # direction does not matter
    assert stats.repeats_to_resolve(0.2, 1.1) > 11  # noisier needs more
    assert stats.repeats_to_resolve(0.01, 1.5) == stats.MIN_REPEATS  # never fewer than decide
    assert stats.repeats_to_resolve(None, 1.1) is None
    assert stats.repeats_to_resolve(0.1, 1.0) is None
    assert stats.repeats_to_resolve(1.0, 1.0001) is None  # beyond any practical number


def test_t_quantiles():
    assert stats.t975(4) == 2.776 and stats.t975(30) == 2.042
    assert stats.t975(100) == pytest.approx(1.98397, abs=1e-3)  # tables: 1.984
    assert stats.t975(10_000) == pytest.approx(1.95996, abs=1e-3)
    with pytest.raises(ValueError):
        stats.t975(0)
