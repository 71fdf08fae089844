"""Interval algebra: hand-built cases and a brute-force oracle (a boolean mask per ns)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.analyses import intervals as iv


def s(*pairs):
    return iv.as_intervals([p[0] for p in pairs], [p[1] for p in pairs])


def pairs(a):
    return list(zip(a[0].tolist(), a[1].tolist()))


def test_merge_overlapping_touching_nested_and_empty():
    a = s((5, 10), (0, 3), (3, 4), (8, 12), (20, 20), (6, 7))
    assert pairs(a) == [(0, 4), (5, 12)]
    assert iv.measure(a) == 11


def test_intersect_subtract_union_clip_by_hand():
    a = s((0, 10), (20, 30))
    b = s((5, 25))
    assert pairs(iv.intersect(a, b)) == [(5, 10), (20, 25)]
    assert pairs(iv.subtract(a, b)) == [(0, 5), (25, 30)]
    assert pairs(iv.subtract(b, a)) == [(10, 20)]
    assert pairs(iv.union(a, b)) == [(0, 30)]
    assert pairs(iv.clip(a, 8, 22)) == [(8, 10), (20, 22)]
    assert pairs(iv.intersect(a, iv.EMPTY)) == []
    assert pairs(iv.subtract(a, iv.EMPTY)) == [(0, 10), (20, 30)]


def test_large_int64_nanoseconds_stay_exact():
    base = 1_712_195_495_520_854_800  # an epoch timestamp in ns: beyond float64's exact range
    a = s((base, base + 7))
    b = s((base + 3, base + 11))
    assert iv.measure(iv.intersect(a, b)) == 4
    assert pairs(iv.subtract(a, b)) == [(base, base + 3)]


def test_reversed_interval_is_an_error():
    with pytest.raises(ValueError, match="ends before"):
        iv.as_intervals([5], [4])


interval_lists = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 12)), max_size=12)


def mask(ivs, n=80):
    m = np.zeros(n, bool)
    for a, b in zip(*ivs):
        m[a:b] = True
    return m


def build(raw):
    return iv.as_intervals([a for a, _ in raw], [a + d for a, d in raw])


@settings(max_examples=300, deadline=None)
@given(interval_lists, interval_lists)
def test_against_boolean_mask(ra, rb):
    a, b = build(ra), build(rb)
    ma, mb = mask(a), mask(b)
    # canonical form: sorted, disjoint, non-touching, non-empty
    for x in (a, b):
        assert (x[1] > x[0]).all()
        assert (x[0][1:] > x[1][:-1]).all()
    # raw input coverage equals canonical coverage
    raw_mask = np.zeros(80, bool)
    for s0, d in ra:
        raw_mask[s0:s0 + d] = True
    assert (mask(a) == raw_mask).all()
    assert iv.measure(a) == ma.sum()
    assert (mask(iv.intersect(a, b)) == (ma & mb)).all()
    assert (mask(iv.subtract(a, b)) == (ma & ~mb)).all()
    assert (mask(iv.union(a, b)) == (ma | mb)).all()
    assert (mask(iv.clip(a, 10, 50)) == (ma & (np.arange(80) >= 10) & (np.arange(80) < 50))).all()
