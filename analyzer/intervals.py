"""Interval algebra on int64 nanosecond arrays, vectorised with numpy.

An interval set is a pair ``(starts, ends)`` of equal-length int64 arrays; intervals are
half-open ``[start, end)``. ``merge`` turns any set into the canonical form (sorted, disjoint,
non-touching, no empty intervals); every other function takes and returns canonical sets.
The overlap / exposed-communication algebra follows HTA's (merge communication, merge
computation, sweep; HolisticTraceAnalysis ``get_comm_comp_overlap``) and TraceLens's
"exposed = comm - compute" formulation.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0, np.int64), np.zeros(0, np.int64))


def as_intervals(starts, ends) -> Intervals:
    """Canonical set from any starts/ends (array-likes of ints; end < start is an error)."""
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    if s.shape != e.shape:
        raise ValueError(f"starts and ends differ in length: {s.shape} vs {e.shape}")
    if (e < s).any():
        raise ValueError("an interval ends before it starts")
    return merge(s, e)


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Union of possibly overlapping intervals as a canonical set. O(n log n)."""
    keep = ends > starts
    s, e = starts[keep], ends[keep]
    if len(s) == 0:
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_end = np.maximum.accumulate(e)
    # a new group starts where the start is beyond every earlier end (touching merges)
    new = np.empty(len(s), bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    out_s = s[idx]
    last = np.append(idx[1:], len(s)) - 1
    out_e = run_end[last]
    return out_s, out_e


def measure(a: Intervals) -> int:
    """Total length of a canonical set, ns (exact integer)."""
    return int((a[1] - a[0]).sum())


def _sweep(a: Intervals, b: Intervals, want) -> Intervals:
    """Segments where ``want(in_a, in_b)`` holds, as a canonical set."""
    pts = np.unique(np.concatenate([a[0], a[1], b[0], b[1]]))
    if len(pts) < 2:
        return EMPTY
    left = pts[:-1]
    # coverage of [left, next) by a canonical set: the last start <= left has its end > left
    ina = _covered(a, left)
    inb = _covered(b, left)
    sel = want(ina, inb)
    return merge(left[sel], pts[1:][sel])


def _covered(a: Intervals, points: np.ndarray) -> np.ndarray:
    if len(a[0]) == 0:
        return np.zeros(len(points), bool)
    i = np.searchsorted(a[0], points, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(points), bool)
    out[ok] = a[1][i[ok]] > points[ok]
    return out


def union(a: Intervals, b: Intervals) -> Intervals:
    """A ∪ B."""
    return merge(np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """A ∩ B."""
    return _sweep(a, b, lambda x, y: x & y)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """A \\ B."""
    return _sweep(a, b, lambda x, y: x & ~y)


def clip(a: Intervals, lo: int, hi: int) -> Intervals:
    """A ∩ [lo, hi)."""
    s = np.maximum(a[0], lo)
    e = np.minimum(a[1], hi)
    keep = e > s
    return s[keep], e[keep]
