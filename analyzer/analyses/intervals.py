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
    """Segments where ``want(in_a, in_b)`` holds, as a canonical set.

    A canonical set's bounds interleaved (s0, e0, s1, e1, ...) are one sorted run, so the
    stable sort of both runs is a linear merge. After the last bound at each distinct
    instant, the running counts say whether [instant, next instant) is in A and in B; the
    output starts where ``want`` turns true and ends where it turns false."""
    na, nb = len(a[0]), len(b[0])
    if na + nb == 0:
        return EMPTY
    pts = np.empty(2 * (na + nb), np.int64)
    pts[0:2 * na:2], pts[1:2 * na:2] = a[0], a[1]
    pts[2 * na::2], pts[2 * na + 1::2] = b[0], b[1]
    step = np.zeros((2, len(pts)), np.int8)  # +1 at a start, -1 at an end (row 0: A, row 1: B)
    step[0, 0:2 * na:2], step[0, 1:2 * na:2] = 1, -1
    step[1, 2 * na::2], step[1, 2 * na + 1::2] = 1, -1
    order = np.argsort(pts, kind="stable")
    p = pts[order]
    count = np.cumsum(step[:, order], axis=1, dtype=np.int32)
    last = np.empty(len(p), bool)  # the last bound at each distinct instant
    last[:-1] = p[1:] != p[:-1]
    last[-1] = True
    p = p[last]
    on = want(count[0, last] > 0, count[1, last] > 0)
    was = np.empty(len(on), bool)
    was[0] = False
    was[1:] = on[:-1]
    return p[on & ~was], p[was & ~on]


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
