"""Per-rank clock offsets from collectives matched across ranks: the one estimator that
``analyzer summary`` (start skew, stragglers), ``analyzer report`` (per-rank clock offset) and
``analyzer merge`` (aligned timeline) use.

Rule: every rank of a collective (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all,
barrier) finishes at nearly the same instant -- NCCL and gloo collectives complete only when the
last rank's data has arrived everywhere, so their *ends* line up within one transfer whatever
time each rank started (a late rank delays everyone's end, not only its own). The k-th
collective of one kind in one process group is therefore matched across ranks, and the
difference of its end on rank r and on the reference rank is rank r's clock offset plus
transfer jitter. The offset estimate is the median of those differences, its uncertainty the
median absolute deviation (MAD) around it (both robust to a few outliers: Rousseeuw & Croux
1993), kept inside causality bounds (no rank ends a collective before every rank started it).
Starts are not used: a rank that starts late is what skew measures, not a clock error.
Point-to-point send/recv never finishes together across all ranks and is not used. Source: the
rule is ours (HTA analyses each rank on its own clock and aligns none), stated here and in
README "Clock offsets".

Which events are collectives, their kind and process group: the ingest's rules, one for every
command (analyzer/ingest/classify.py, the collectives table of analyzer/analyses/collectives.py
``rank_collectives``, ``JobTables.collectives``). Tables (pandas) in and out; times int64
nanoseconds on each rank's own clock; aligned time = own time - offset_ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

MATCHABLE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
KEY = ["pg", "kind", "seq"]


def sequenced(coll: pd.DataFrame) -> pd.DataFrame:
    """The ``MATCHABLE_KINDS`` rows of ``coll`` with ``seq`` = their order among the rows of the
    same (rank, pg, kind), in table order; pg and kind as str. Columns rank, pg, kind, seq,
    event_idx, start_ns, end_ns."""
    cols = ["rank", *KEY, "event_idx", "start_ns", "end_ns"]
    c = coll[coll["kind"].isin(MATCHABLE_KINDS)]
    if c.empty:
        return pd.DataFrame(columns=cols)
    c = c.assign(kind=c["kind"].astype(str), pg=c["pg"].astype(str))
    c = c.assign(seq=c.groupby(["rank", "pg", "kind"], sort=False).cumcount().astype("int64"))
    return c[cols]


def match_collectives(coll: pd.DataFrame) -> pd.DataFrame:
    """Collectives matched across ranks by (pg, kind, seq).

    ``coll``: the ingest's collectives table of every rank (``JobTables.collectives``: rank,
    pg, kind, start_ns, end_ns, event_idx ..., each rank's rows by start). ``seq`` is here the
    order of the collective among those of the same (pg, kind) on its rank (``sequenced``).
    Only ``MATCHABLE_KINDS`` and keys seen on at least two ranks are kept. Returns columns rank,
    pg, kind, seq, event_idx, start_ns, end_ns.
    """
    c = sequenced(coll)
    if c.empty:
        return c
    n = c.groupby(KEY)["rank"].transform("nunique")
    return c[n >= 2].sort_values([*KEY, "rank"]).reset_index(drop=True)


def reference(matched: pd.DataFrame, ref_rank: int) -> pd.DataFrame:
    """``ref_rank``'s rows of ``matched`` (or of ``sequenced``), keyed by (pg, kind, seq), with
    columns ref_start_ns and ref_end_ns: what ``offset_row`` merges each rank with."""
    return matched[matched["rank"] == ref_rank][[*KEY, "start_ns", "end_ns"]].rename(
        columns={"start_ns": "ref_start_ns", "end_ns": "ref_end_ns"})


def offset_row(rank: int, mine: pd.DataFrame) -> tuple:
    """(rank, offset_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent) of ``rank`` from
    ``mine``: its rows of the collectives it shares with the reference rank, merged with
    ``reference`` (``estimate_offsets`` says the rule)."""
    if mine.empty:
        return (rank, 0, None, None, None, 0, True)
    diff = (mine["end_ns"] - mine["ref_end_ns"]).to_numpy(dtype=np.int64)
    median = int(round(float(np.median(diff))))
    mad = int(round(float(np.median(np.abs(diff - median)))))
    lo = int((mine["start_ns"] - mine["ref_end_ns"]).max())
    hi = int((mine["end_ns"] - mine["ref_start_ns"]).min())
    consistent = lo <= hi
    offset = min(max(median, lo), hi) if consistent else median
    return (rank, offset, mad, lo, hi, len(diff), consistent)


def offsets_frame(rows: list[tuple]) -> pd.DataFrame:
    """The ``estimate_offsets`` table of ``offset_row`` tuples."""
    out = pd.DataFrame(rows, columns=["rank", "offset_ns", "mad_ns", "lo_ns", "hi_ns", "n_matched",
                                      "consistent"])
    return out.astype({"rank": "int64", "offset_ns": "int64", "mad_ns": "Int64", "lo_ns": "Int64",
                       "hi_ns": "Int64", "n_matched": "int64", "consistent": "bool"})


def estimate_offsets(matched: pd.DataFrame, ranks: list[int], ref_rank: int) -> pd.DataFrame:
    """Clock offset of each rank relative to ``ref_rank``: aligned time = own time - offset_ns.

    For the collectives rank r shares with ``ref_rank`` (d_k = end on r - end on ref):
    - median_ns = median of d_k; mad_ns = median |d_k - median_ns| (the uncertainty).
    - causality bounds: no rank finishes a collective before every rank has started it, so
      lo_ns = max_k(start on r - end on ref) <= offset <= hi_ns = min_k(end on r - start on ref).
    - offset_ns = median_ns clamped into [lo_ns, hi_ns] (the bounds win over a median pulled
      by a descheduled rank); when lo_ns > hi_ns the bounds contradict each other (mismatched
      collectives) and offset_ns = median_ns, consistent = False.
    A rank sharing no collective with ``ref_rank`` gets offset 0, n_matched 0, nulls elsewhere.
    Columns: rank, offset_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent.
    """
    ref = reference(matched, ref_rank)
    rows = []
    for rank in ranks:
        if rank == ref_rank:
            rows.append((rank, 0, 0, 0, 0, len(ref), True))
            continue
        rows.append(offset_row(rank, matched[matched["rank"] == rank].merge(ref, on=KEY)))
    return offsets_frame(rows)


def clock_offsets(coll: pd.DataFrame, ranks: list[int] | None = None,
                  ref_rank: int | None = None) -> pd.DataFrame:
    """``estimate_offsets(match_collectives(coll), ranks, ref_rank)``: each rank's clock offset
    to ``ref_rank`` (None: the lowest rank) from the job's collectives table
    (``JobTables.collectives``). ``ranks`` None: the ranks in ``coll``. Columns as
    ``estimate_offsets``; empty table when there is no rank."""
    if ranks is None:
        ranks = sorted(int(r) for r in coll["rank"].unique()) if len(coll) else []
    if not ranks:
        return estimate_offsets(match_collectives(coll), [], 0)
    ref = min(ranks) if ref_rank is None else ref_rank
    return estimate_offsets(match_collectives(coll), ranks, ref)


def end_spread(matched: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """Per matched collective: spread (max - min) of its end across ranks, before and after
    subtracting each rank's offset. Columns pg, kind, seq, n_ranks, spread_before_ns,
    spread_after_ns."""
    m = matched.merge(offsets[["rank", "offset_ns"]], on="rank")
    m["aligned_end_ns"] = m["end_ns"] - m["offset_ns"]
    g = m.groupby(KEY, sort=True)
    out = pd.DataFrame({
        "n_ranks": g["rank"].nunique(),
        "spread_before_ns": g["end_ns"].max() - g["end_ns"].min(),
        "spread_after_ns": g["aligned_end_ns"].max() - g["aligned_end_ns"].min(),
    }).reset_index()
    return out
