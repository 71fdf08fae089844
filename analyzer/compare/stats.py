"""Ratio of median step times with a 95 % confidence interval over repeats and steps.

Method (stated in every pair as ``METHOD``): a hierarchical bootstrap. Each resample draws the
repeats of both runs with replacement -- the same repeat indices for both when they were
recorded interleaved in one experiment (``paired``: repeat r of A and of B ran back to back, so
load that drifts across repeats hits both), independently otherwise -- then, within every drawn
repeat, its steps with replacement; the statistic is log(median of B's drawn steps / median of
A's). The interval is the percentile interval (2.5 % and 97.5 % points). ``RESAMPLES``
resamples, fixed ``SEED``: the same inputs give the same interval.

Why this and not more: on simulated step times (per-repeat log-normal effects 0.03-0.15, step
noise 0.02-0.3, a load drift shared by the runs of one repeat), with 5 paired repeats of 10
steps, the interval held a true ratio of 1 in 94-100 % of 300 draws and excluded 1 for a 1.3x
ratio in 60-99 % (the t-test's own power is low at the noisiest setting). Resampling the steps
inside each drawn repeat counts step noise twice (it is in the per-repeat medians already),
which makes the interval conservative when steps are noisy; the plain percentile interval
of 5 repeats is a little narrow when repeats dominate; together they land near 95 %. Below
``MIN_REPEATS`` the percentile interval of so few repeats is too narrow (2 repeats: every
resample is one of 3 combinations), so callers decide nothing from it.

``repeats_to_resolve``: repeats per run a t-interval would need to exclude 1 for a given ratio
with 80 % power, from the spread of the per-repeat log ratios measured here.

numpy only (no scipy): the Student t quantiles come from ``T975`` and a Cornish-Fisher
expansion beyond it. Times are any positive unit (ns in the analyzer); ratios are unitless.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

RESAMPLES = 4000
SEED = 0
LEVEL = 0.95
MIN_REPEATS = 5
"""Fewest repeats per run for a decision: below it the interval is shown but nothing is called
faster (module docstring)."""
MIN_DIFFERENCE = 0.05
"""Smallest ratio beyond 1 called a difference (5 %): identical configurations recorded back to
back, interleaved with rotated order, differed by a steady 1-3 % on the 2-core development
machine (bench/noise_decision.py, quiet, 500 steps per arm: intervals such as 1.01-1.07 that
exclude 1). That is a bias of the machine and of process placement, not noise the interval can
shrink, so a ratio below 1 + MIN_DIFFERENCE is reported as "less than 5 %", never as faster."""
METHOD = ("hierarchical bootstrap (repeats, then steps within each repeat; repeats paired by "
          "index when recorded interleaved), 4000 resamples, seed 0, percentile 95 % "
          "interval of the ratio of median step times")
_CELLS = 4_000_000
"""Largest resamples x repeats x steps block drawn at once (memory: 8 bytes each, twice)."""

T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student t 0.975 quantiles for 1..30 degrees of freedom (any statistics table)."""


def t975(df: int) -> float:
    """Student t 0.975 quantile for ``df`` >= 1 degrees of freedom (table to 30, then the
    Cornish-Fisher expansion z + (z^3 + z) / 4df + (5z^5 + 16z^3 + 3z) / 96df^2, error < 1e-3).
    Raises ``ValueError`` for df < 1."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True, slots=True)
class RatioCI:
    """B's median step time over A's with its interval: ``ratio`` (median of all of B's steps
    / median of all of A's), ``ci_low`` .. ``ci_high`` (``LEVEL``), ``repeats`` (the fewer of
    the two runs' repeats), ``steps`` (all steps of A and B), ``paired``, ``log_sd`` (the
    standard deviation of per-repeat log ratios; None with fewer than 2 repeats)."""

    ratio: float
    ci_low: float
    ci_high: float
    repeats: int
    steps: int
    paired: bool
    log_sd: float | None


def _arrays(repeats: Sequence[Sequence[float]], which: str) -> list[np.ndarray]:
    out = [np.asarray(r, dtype=float) for r in repeats]
    if not out or any(a.size == 0 for a in out):
        raise ValueError(f"{which}: every repeat needs at least one step time")
    if any(not np.all(np.isfinite(a) & (a > 0)) for a in out):
        raise ValueError(f"{which}: step times must be finite and > 0")
    return out


def _padded(reps: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    m = max(a.size for a in reps)
    x = np.full((len(reps), m), np.nan)
    for i, a in enumerate(reps):
        x[i, :a.size] = a
    return x, np.array([a.size for a in reps])


def _draw_medians(x: np.ndarray, counts: np.ndarray, idx: np.ndarray, rng: np.random.Generator
                  ) -> np.ndarray:
    """Median of the pooled, resampled steps of the repeats ``idx`` [R, n] of ``x``."""
    r, n = idx.shape
    m = x.shape[1]
    c = counts[idx]  # [R, n]
    k = np.floor(rng.random((r, n, m)) * c[..., None]).astype(np.int64)
    vals = x[idx[..., None], k]  # [R, n, m]
    vals[np.arange(m)[None, None, :] >= c[..., None]] = np.nan  # a repeat draws its own count
    return np.nanmedian(vals.reshape(r, n * m), axis=1)


def ratio_ci(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], *,
             paired: bool = False, resamples: int = RESAMPLES, seed: int = SEED) -> RatioCI:
    """B / A (module docstring). ``a``, ``b``: per repeat, that repeat's step times (any
    positive unit, the same for both). ``paired``: resample repeat indices jointly (needs the
    same number of repeats). Raises ``ValueError`` for an empty repeat, a time <= 0 or not
    finite, or ``paired`` with unequal repeat counts."""
    ra, rb = _arrays(a, "A"), _arrays(b, "B")
    if paired and len(ra) != len(rb):
        raise ValueError(f"paired needs equal repeat counts, got {len(ra)} and {len(rb)}")
    ratio = float(np.median(np.concatenate(rb)) / np.median(np.concatenate(ra)))
    xa, ca = _padded(ra)
    xb, cb = _padded(rb)
    rng = np.random.default_rng(seed)
    block = max(1, _CELLS // max(len(ra) * xa.shape[1], len(rb) * xb.shape[1]))
    logs = []
    for start in range(0, resamples, block):
        r = min(block, resamples - start)
        ia = rng.integers(0, len(ra), (r, len(ra)))
        ib = ia if paired else rng.integers(0, len(rb), (r, len(rb)))
        logs.append(np.log(_draw_medians(xb, cb, ib, rng)) - np.log(_draw_medians(xa, ca, ia, rng)))
    t = np.concatenate(logs)
    n_rep = min(len(ra), len(rb))
    lo, hi = np.quantile(t, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return RatioCI(ratio=ratio, ci_low=float(np.exp(lo)), ci_high=float(np.exp(hi)),
                   repeats=n_rep, steps=int(ca.sum() + cb.sum()), paired=paired,
                   log_sd=_log_sd(ra, rb, paired))


def _log_sd(ra: list[np.ndarray], rb: list[np.ndarray], paired: bool) -> float | None:
    """Standard deviation of one repeat's log ratio log(median B_r / median A_r): paired, of the
    differences; else sqrt(var A + var B) of the per-repeat log medians. None below 2 repeats."""
    la = np.log([np.median(x) for x in ra])
    lb = np.log([np.median(x) for x in rb])
    if min(len(la), len(lb)) < 2:
        return None
    if paired:
        return float(np.std(lb - la, ddof=1))
    return float(math.sqrt(np.var(la, ddof=1) + np.var(lb, ddof=1)))


def repeats_to_resolve(log_sd: float | None, ratio: float, *, power: float = 0.8,
                       most: int = 1000, repeats: int | None = None) -> int | None:
    """Repeats per run for a 95 % t-interval of the log ratio to exclude 1 with probability
    ``power`` when the true ratio is ``ratio`` and one repeat's log ratio has standard deviation
    ``log_sd``: the least n >= ``MIN_REPEATS`` with (t(n-1) + z(power)) log_sd / sqrt(n) <=
    |log ratio|. None when ``log_sd`` is unknown, ``ratio`` is 1, more than ``most`` would
    be needed, or ``log_sd`` was measured over ``repeats`` < ``MIN_REPEATS`` repeats: a standard
    deviation of 2 repeats has one degree of freedom, and a count extrapolated from it ("63")
    is no basis for advice (the caller asks for ``MIN_REPEATS`` or more)."""
    if repeats is not None and repeats < MIN_REPEATS:
        return None
    if log_sd is None or not math.isfinite(log_sd) or ratio <= 0 or ratio == 1:
        return None
    if log_sd == 0:
        return MIN_REPEATS
    effect = abs(math.log(ratio))
    zp = NormalDist().inv_cdf(power)
    for n in range(MIN_REPEATS, most + 1):
        if (t975(n - 1) + zp) * log_sd / math.sqrt(n) <= effect:
            return n
    return None


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (numpy's: the mean of the two middle values for an even count).
    Raises ``ValueError`` when empty."""
    if len(values) == 0:
        raise ValueError("median of no values")
    return float(np.median(np.asarray(values, dtype=float)))
