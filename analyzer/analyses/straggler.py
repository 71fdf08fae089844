"""Straggler with a cause (issue 28): why the rank its peers wait for starts its collectives late.

Per rank, at ingest (``gap_parts``, one row per collective of ``collectives.rank_collectives``):
the collective's *gap* is the interval on the rank's own clock from its anchor to its start,
the anchor being the end of the rank's previous collective of the same process group (the
same instance on every rank, so nearly one instant on aligned clocks), or, for the first of
its group, the start of its step's CPU span (ProfilerStep; no step: the trace's first event).
Each instant of the gap counts once, for the first of (the sets of analyzer/analyses/breakdown.py):

  own_collective   C: communication (another process group's collective it was still in)
  device_compute   K \\ C: computation (GPU: kernels; CPU: main-thread ops less enqueue,
                   waits and DataLoader work)
  data_wait        D \\ (C ∪ K): DataLoader ranges, host-to-device copies (breakdown's data)
  host_delay       GPU: device idle (no C, K, D or other device work: memcpy, memset, sync)
                   before the next device op's launch call started (the host had not yet
                   asked for it: Python, the dispatcher, a host sync); after that call the
                   wait is the device's (launch latency, a stream dependency), not host delay.
                   CPU: the instants with nothing recorded on any thread (no C, K, D or
                   other op): Python between ops, a sleep, a lock.
  (the rest)       other device or CPU work, and on GPU the queued-but-not-started time.

Across ranks (``straggler_causes``), per collective instance (pg, seq) measured by
``collectives.match_ranks`` (aligned clocks, one instance, >= 2 ranks) with a start skew L > 0,
the last rank S to start is the straggler and L its lateness. Its part c in the gap is
compared with the median of c over its peers (the other ranks of the instance; the first
``MEDIAN_PEERS`` of them in rank order, so the cross-rank state stays bounded): excess_c =
max(part_c(S) - median_c, 0).

A fifth part, late_step_start, is the lateness the anchor itself carries. Where the gap's
anchor is the start of the step (the rank's first collective of its process group, inside a
ProfilerStep: nothing earlier of that group pairs it with its peers), the straggler's anchor
is compared on aligned clocks (own clock - ``clock.clock_offsets``' offset_ns; a rank whose
clock is not usable, ``clock.unusable_ranks``, has none) with the earliest of its peers'
anchors: excess_late_step_start = max(anchor(S) - min over peers of anchor, 0), how much later
S entered the step than the first rank. L is measured from the first rank's start, so
L = (anchor(S) - anchor(F)) + (gap(S) - gap(F)) for the rank F that started first: the
anchors' difference is compared with the first rank's, not the median's. What made S enter
its step late lies before the step's window (the trace does not show it: the previous step's
end, data loading, a host sync, checkpointing ...).

With E = the sum of the five excesses: E <= L gives split_c += excess_c and unexplained +=
L - E; E > L scales every excess by L / E (the parts then explain all of L). An instance
without a gap on some rank (tables built without one) adds L to unexplained. Per (straggler
rank, kind): late_ns = sum of L (as ``collectives.stragglers``' skew_caused_ns), split_ns
(sums to late_ns), the largest named part's share explained_frac, and cause = that part when
explained_frac >= ``CAUSE_THRESHOLD`` (else None: "cause not established").

The sets are built per step, then merged (``_real_sets``). Memory across ranks: per instance
the straggler's row and at most ``MEDIAN_PEERS`` peers' (7 int64 each), reduced batch by batch
(analyzer/analyses/crossrank.py ``straggler_causes``). Limits: the previous collective of the
same group is taken to be the same instance on every rank (an SPMD job; ``match_ranks`` pairs
by the same order); a same-group collective still running when the next starts leaves an empty
gap (0); a rank whose trace begins mid-step has its step's start as the anchor of its first
collective, like its peers. The 80 % threshold is TraceML's; the rule itself is ours.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv
from analyzer.analyses.breakdown import _Rows, _sets, _Windows
from analyzer.contract.report_types import CAUSE_THRESHOLD, StragglerCause

PARTS = {"device_compute": "gap_compute_ns", "host_delay": "gap_host_ns",
         "data_wait": "gap_data_ns", "own_collective": "gap_coll_ns"}
"""split_ns key -> the collectives table's column (``COLLECTIVES_SCHEMA``)."""
GAP_COLUMNS = ["gap_ns", *PARTS.values()]
LATE_START = "late_step_start"
"""split_ns key: the straggler entered the step after the first of its peers (module
docstring); the anchor's part, not the gap's."""
NAMED = (*PARTS, LATE_START)
"""The named parts of split_ns, in order (ties for the largest go to the earlier); then
"unexplained"."""
MEDIAN_PEERS = 63
"""Peers whose parts the median of an instance is taken over (the first in rank order): every
peer in a group of up to 64 ranks."""
MAX_ROWS = 16
"""Straggler causes kept per run, largest lateness first."""
RULE = ("per measured collective it started last (aligned clocks): lateness = start skew; its "
        "gap (from the end of its previous collective of the same process group, the first: "
        "its step's start, to this start) split into own_collective, device_compute, "
        "data_wait, host_delay (analyzer/analyses/straggler.py) against the peers' median; "
        "where the gap starts at its step's start (its group's first collective), "
        "late_step_start: that start after the earliest peer's; "
        f"a cause when one part explains >= {CAUSE_THRESHOLD:.0%} of the lateness")


def _covered(a: iv.Intervals, t: np.ndarray) -> np.ndarray:
    """|a ∩ (-inf, t)| for each t (``a`` merged and sorted), int64."""
    s, e = a
    if not len(s):
        return np.zeros(len(t), np.int64)
    cs = np.zeros(len(s) + 1, np.int64)
    np.cumsum(e - s, out=cs[1:])
    j = np.searchsorted(s, t, "right") - 1
    jj = np.maximum(j, 0)
    return np.where(j >= 0, cs[jj] + np.clip(t - s[jj], 0, e[jj] - s[jj]), 0)


def _host_delay(idle: iv.Intervals, r: _Rows, launch_ts: np.ndarray) -> iv.Intervals:
    """GPU: the part of each idle interval [x, y) before the launch call of the first device op
    starting at or after y (none, or no launch: nothing)."""
    dev = np.flatnonzero(r.gpu & (r.comm | r.comp | r.other | r.data))
    if not len(idle[0]) or not len(dev):
        return iv.EMPTY
    order = dev[np.argsort(r.s[dev], kind="stable")]
    starts = r.s[order]
    j = np.searchsorted(starts, idle[1], "left")
    ok = j < len(order)
    lt = np.where(ok, launch_ts[order[np.minimum(j, len(order) - 1)]], -1)
    x, y = idle
    end = np.where((lt >= 0) & ok, np.clip(lt, x, y), x)
    keep = end > x
    return x[keep], end[keep]


def _real_sets(r: _Rows, all_end_ns: np.ndarray, step: np.ndarray
               ) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals, iv.Intervals]:
    """breakdown's (C, K, O, D) of rows ``r`` in real time, built per step as the breakdown
    builds them (a CPU rank's collective waits pair an enqueue op with its own step's ops
    only), each step's window the extent of its rows (nothing clipped), the rows of no step
    one more window; the steps' sets merged."""
    if not len(step):
        return iv.EMPTY, iv.EMPTY, iv.EMPTY, iv.EMPTY
    keys, g = np.unique(step, return_inverse=True)
    g = g.ravel().astype(np.int64)
    lo = np.full(len(keys), np.iinfo(np.int64).max)
    hi = np.full(len(keys), np.iinfo(np.int64).min)
    np.minimum.at(lo, g, r.s)
    np.maximum.at(hi, g, r.e)
    w = _Windows(lo, hi, g)
    virtual = _sets(r, w, all_end_ns)
    out = []
    for x in virtual:
        parts = [w.real(x, k) for k in range(len(keys))]
        out.append(iv.merge(np.concatenate([p[0] for p in parts]) if parts else iv.EMPTY[0],
                            np.concatenate([p[1] for p in parts]) if parts else iv.EMPTY[1]))
    return tuple(out)


def gap_parts(ev: pd.DataFrame, coll: pd.DataFrame, steps: pd.DataFrame, device_kind: str,
              main_tid: str | None) -> pd.DataFrame:
    """Per row of ``coll`` (one rank's ``rank_collectives``, same order): gap_ns and its parts
    gap_compute_ns, gap_host_ns, gap_data_ns, gap_coll_ns (module docstring), int64 ns."""
    n = len(coll)
    out = pd.DataFrame({c: np.zeros(n, np.int64) for c in GAP_COLUMNS})
    if not n or ev.empty:
        out["gap_ns"] = -1
        return out
    full = _Rows(ev, device_kind, main_tid)
    if device_kind == "gpu":
        full.stepless_as_other(ev["step"].to_numpy())
    used = np.flatnonzero(full.used())
    r = full.take(used)
    t0 = int(min(ev["ts_ns"].min(), coll["start_ns"].min()))
    t1 = int(max(ev["end_ns"].max(), coll["end_ns"].max()))
    comm, comp, other, data = _real_sets(r, full.e, ev["step"].to_numpy()[used])
    compute = iv.subtract(comp, comm)
    cu = iv.union(comm, comp)
    data_only = iv.subtract(data, cu)
    busy = iv.union(iv.union(cu, data), other)
    idle = iv.subtract(iv.as_intervals([t0], [t1]), busy)
    if device_kind == "gpu":
        lrow = ev["launch_row"].to_numpy().astype(np.int64) if "launch_row" in ev.columns \
            else np.full(len(ev), -1, np.int64)
        ts = ev["ts_ns"].to_numpy().astype(np.int64)
        launch_ts = np.where(lrow >= 0, ts[np.maximum(lrow, 0)], -1)[used]
        host = _host_delay(idle, r, launch_ts)
    else:
        host = idle
    start = coll["start_ns"].to_numpy(dtype=np.int64)
    end = coll["end_ns"].to_numpy(dtype=np.int64)
    pg = coll["pg"].astype(str).to_numpy()
    seq = coll["seq"].to_numpy(dtype=np.int64)
    order = np.lexsort((seq, pg))
    prev = np.full(n, -1, np.int64)
    same = np.zeros(n, bool)
    same[order[1:]] = pg[order[1:]] == pg[order[:-1]]
    prev[order[1:]] = end[order[:-1]]
    first = steps.set_index("step")["cpu_start_ns"] if len(steps) else pd.Series(dtype="int64")
    step = coll["step"].to_numpy(dtype=np.int64)
    step_start = pd.Series(step).map(first).fillna(t0).to_numpy(dtype=np.int64)
    anchor = np.where(same, prev, np.where(step >= 0, step_start, t0))
    lo = np.minimum(anchor, start)
    out["gap_ns"] = start - lo
    for col, a in (("gap_coll_ns", comm), ("gap_compute_ns", compute),
                   ("gap_data_ns", data_only), ("gap_host_ns", host)):
        out[col] = _covered(a, start) - _covered(a, lo)  # |a ∩ [lo, start)| per row
    return out


def step_anchors(coll: pd.DataFrame, offsets: pd.DataFrame | None,
                 whole_trace_ranks: tuple[int, ...] | list[int] = ()) -> np.ndarray:
    """Per row of ``coll`` (whole ranks' ``rank_collectives`` with rank, pg, seq, step,
    start_ns, gap_ns): the gap's anchor on aligned clocks (start_ns - gap_ns - the rank's
    offset_ns), int64 ns (epoch-scale: a float64 would round it to 256 ns), where that anchor
    is the step's start (the rank's first collective of its process group, inside a step,
    ``gap_parts``' rule) and the rank's clock is usable; ``NO_ANCHOR`` elsewhere, and on the
    ``whole_trace_ranks`` (no ProfilerStep: their one step's start is the trace's, when the
    profiler started, not when the rank entered a step)."""
    from analyzer.analyses.clock import unusable_ranks

    if coll.empty:
        return np.zeros(0, np.int64)
    rank = coll["rank"].to_numpy(dtype=np.int64)
    seq = coll["seq"].to_numpy(dtype=np.int64)
    first = seq == pd.Series(seq).groupby([rank, coll["pg"].astype(str).to_numpy()]
                                          ).transform("min").to_numpy()
    shift = np.zeros(len(coll), np.int64)
    bad: list[int] = []
    if offsets is not None and len(offsets):
        off = dict(zip(offsets["rank"].astype(int), offsets["offset_ns"].astype(int)))
        shift = np.array([off.get(int(r), 0) for r in rank], np.int64)
        bad = unusable_ranks(offsets)
    gap = coll["gap_ns"].to_numpy(dtype=np.int64)
    ok = (first & (coll["step"].to_numpy(dtype=np.int64) >= 0) & (gap >= 0)
          & ~np.isin(rank, [*bad, *whole_trace_ranks]))
    anchor = coll["start_ns"].to_numpy(dtype=np.int64) - gap - shift
    return np.where(ok, anchor, NO_ANCHOR)


NO_ANCHOR = np.iinfo(np.int64).max
"""``step_anchors``: the row's gap does not start at its step's start."""
ANCHOR_COLUMNS = ["rank", "pg", "seq", "step", "start_ns", *GAP_COLUMNS]
"""The collectives' columns ``instance_rows`` reads."""


def instance_rows(coll: pd.DataFrame, matched: pd.DataFrame,
                  offsets: pd.DataFrame | None = None,
                  whole_trace_ranks: tuple[int, ...] | list[int] = ()) -> pd.DataFrame:
    """The rows of ``coll`` (whole ranks' rows: ``ANCHOR_COLUMNS``; without step / start_ns
    no anchor) whose instance ``matched`` (``match_ranks``) measured with a straggler: rank,
    pg, seq, ``GAP_COLUMNS``, anchor_ns (``step_anchors`` on ``offsets``' clocks, none on the
    ``whole_trace_ranks``), with its straggler, kind and skew: the straggler's own row and its
    peers'."""
    m = matched[matched["measured"].astype(bool) & matched["straggler_rank"].notna()]
    m = m[m["start_skew_ns"].astype("int64") > 0]
    cols = ["rank", "pg", "seq", *GAP_COLUMNS]
    if m.empty or coll.empty:
        return pd.DataFrame(columns=[*cols, "anchor_ns", "straggler", "kind", "late_ns"])
    m = pd.DataFrame({"pg": m["pg"].astype(str).to_numpy(), "seq": m["seq"].astype("int64"),
                      "straggler": m["straggler_rank"].astype("int64").to_numpy(),
                      "kind": m["kind"].astype(str).to_numpy(),
                      "late_ns": m["start_skew_ns"].astype("int64").to_numpy()})
    anchor = step_anchors(coll, offsets, whole_trace_ranks) \
        if {"step", "start_ns"} <= set(coll.columns) \
        else np.full(len(coll), NO_ANCHOR, np.int64)
    c = coll[cols].assign(pg=coll["pg"].astype(str).to_numpy(),
                          seq=coll["seq"].to_numpy(dtype=np.int64), anchor_ns=anchor)
    return c.merge(m, on=["pg", "seq"], how="inner")


def bounded(rows: pd.DataFrame) -> pd.DataFrame:
    """Per instance the straggler's row and its first ``MEDIAN_PEERS`` peers (rank order)."""
    rows = rows.sort_values(["pg", "seq", "rank"], kind="stable")
    peer = rows["rank"].to_numpy() != rows["straggler"].to_numpy()
    k = rows.assign(peer=peer).groupby(["pg", "seq", "peer"], sort=False).cumcount()
    return rows[~peer | (k.to_numpy() < MEDIAN_PEERS)].reset_index(drop=True)


def split_instances(rows: pd.DataFrame) -> pd.DataFrame:
    """Per instance (pg, seq) of ``instance_rows``: straggler, kind, late_ns and the split of
    late_ns into ``NAMED`` and unexplained (module docstring), floats."""
    cols = ["pg", "seq", "straggler", "kind", "late_ns", *NAMED, "unexplained"]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    if "anchor_ns" not in rows.columns:
        rows = rows.assign(anchor_ns=NO_ANCHOR)
    own = rows[rows["rank"] == rows["straggler"]].set_index(["pg", "seq"])
    peers = rows[rows["rank"] != rows["straggler"]]
    med = peers.groupby(["pg", "seq"], sort=True)[GAP_COLUMNS].median()
    first = peers.astype({"anchor_ns": "int64"}).groupby(["pg", "seq"], sort=True)[
        "anchor_ns"].min()  # NO_ANCHOR is the largest: the earliest peer with one
    gapless = rows.assign(bad=rows["gap_ns"] < 0).groupby(["pg", "seq"])["bad"].any()
    idx = own.index.intersection(med.index)
    own, med = own.loc[idx], med.loc[idx]
    late = own["late_ns"].to_numpy(dtype=np.float64)
    ex = np.stack([np.maximum(own[c].to_numpy(np.float64) - med[c].to_numpy(np.float64), 0.0)
                   for c in PARTS.values()], axis=1)
    mine = own["anchor_ns"].to_numpy(np.int64)
    theirs = first.reindex(idx, fill_value=NO_ANCHOR).to_numpy(np.int64)
    has = (mine != NO_ANCHOR) & (theirs != NO_ANCHOR)
    start = np.where(has, np.maximum(np.where(has, mine, 0) - np.where(has, theirs, 0), 0), 0)
    ex = np.column_stack([ex, start.astype(np.float64)])
    ex[gapless.reindex(idx).fillna(True).to_numpy(bool)] = 0.0
    tot = ex.sum(axis=1)
    scale = np.where(tot > late, late / np.where(tot > 0, tot, 1.0), 1.0)
    ex = ex * scale[:, None]
    out = pd.DataFrame({"pg": idx.get_level_values(0), "seq": idx.get_level_values(1),
                        "straggler": own["straggler"].to_numpy(), "kind": own["kind"].to_numpy(),
                        "late_ns": late})
    for k, part in enumerate(NAMED):
        out[part] = ex[:, k]
    rest = late - ex.sum(axis=1)
    out["unexplained"] = np.where(rest < 0.5, 0.0, rest)  # under 1 ns: the scaling's rounding
    return out[cols]


def causes(inst: pd.DataFrame, by_kind: bool = True, limit: int | None = MAX_ROWS
           ) -> list[StragglerCause]:
    """Per (straggler rank, kind) of ``split_instances`` (``by_kind`` False: per rank, kind
    "all"): the ``StragglerCause``, largest lateness first (ties: rank, kind), at most
    ``limit`` (None: all)."""
    if inst.empty:
        return []
    keys = [*NAMED, "unexplained"]
    if not by_kind:
        inst = inst.assign(kind="all")
    g = inst.groupby(["straggler", "kind"], sort=True).agg(
        times_last=("seq", "size"), late_ns=("late_ns", "sum"), **{k: (k, "sum") for k in keys})
    g = g.reset_index().sort_values(["late_ns", "straggler", "kind"],
                                    ascending=[False, True, True], kind="stable")
    out = []
    for row in (g if limit is None else g.head(limit)).to_dict("records"):
        late = float(row["late_ns"])
        split = {k: float(row[k]) for k in keys}
        top = max(NAMED, key=lambda k: (split[k], -NAMED.index(k)))
        frac = split[top] / late if late > 0 else None
        out.append(StragglerCause(
            rank=int(row["straggler"]), kind=str(row["kind"]), times_last=int(row["times_last"]),
            late_ns=late, split_ns=split, explained_frac=frac,
            cause=top if frac is not None and frac >= CAUSE_THRESHOLD else None, rule=RULE))
    return out
