"""Per-rank clock offsets from collectives matched across ranks: the one estimator that
``analyzer summary`` (start skew, stragglers), ``analyzer report`` (per-rank clock offset) and
``analyzer merge`` (aligned timeline) use.

Rule: every rank of a collective (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all,
barrier) finishes at nearly the same instant: it completes only when the last rank's data has
arrived everywhere, so the *ends* line up within one transfer whatever time each rank started.
The same collective of one kind in one process group -- the same Seq / Comms Id where the traces
carry one, else the k-th (analyzer/analyses/matchkey.py; ``match_rule`` says which, on the
reference rank's row) -- is matched across ranks; the difference of its end on rank r and on
the reference rank is rank r's clock offset plus transfer jitter. The offset estimate is the
median of those differences, its uncertainty the median absolute deviation (MAD) around it (both
robust to a few outliers: Rousseeuw & Croux 1993), kept inside causality bounds (no rank ends a
collective before every rank started it). Starts are not used: a rank that starts late is what
skew measures, not a clock error. Point-to-point send/recv never finishes together: not used.

When an offset is applied (``clock`` column of ``estimate_offsets``):
- "measured": the estimate, which the causality bounds admit and which exceeds its own
  uncertainty (|offset| >= MAD), is applied;
- "unresolved": |offset| < MAD (e.g. -358 us +- 2,284 us, ranks on one host whose clocks
  agree to better than the collectives' jitter): the offset cannot be told from 0 and 0 is
  applied -- the rank's clock is taken as the reference's, and each matched instance is still
  checked by the one-instance bound below;
- "inconsistent": lo_ns > hi_ns, no single offset puts every matched collective of the rank
  in causal order: the order-matching paired collectives that are not one instance (a partial
  set of ranks with the process group unknown, a rank that skipped one). 0 is applied and the
  rank's collectives are left out of every cross-rank figure (not measured);
- "unmatched": the rank shares no collective with the reference, directly or through relays
  (below): 0, its cross-rank figures rest on no matched instance;
- "reference": the reference rank itself.

Relays (``relay_base``): on a 2-D mesh a rank may share no process group with the reference
(HSDP 2 x 2: rank 3's groups [1, 3] and [2, 3] never hold rank 0), yet share one with a rank
whose clock is known. Such a rank is estimated, by the same rule, against the collectives of
the ranks whose clock is usable, each on the reference clock (own time - applied offset; per
(pg, kind, seq) the lowest such rank's), and its state is then "measured", "unresolved" or
"inconsistent" as for a direct match; this repeats while a round makes progress (a mesh's
diameter: one round on 2-D). The error adds up along the chain (each link's MAD), which the
one-instance bound below absorbs as it does one link's.

One instance (``one_instance``): a (pg, kind, seq) match on >= 2 ranks is accepted as one
collective only when, on the applied clocks,
    latest start - earliest end  <= END_TOL_NS                     (causality)
    latest end   - earliest end  <= shortest duration + END_TOL_NS (ends agree)
Why: no rank can leave a collective before every rank has entered it (each rank's result
depends on every rank's data), and after the first rank has everything, the others need at
most the rest of one transfer -- which is at most the shortest rank's time inside the
collective (the last rank to start spends all of its time transferring). END_TOL_NS = 50 us
absorbs what the clocks and the trace add: timestamps in whole microseconds, launch and
completion latency of a kernel or of a gloo runloop thread, and the offset's residual error
(its MAD: 0.5-1 us on the 8-rank GPU corpus job, 2 us on the 2-rank gloo one). A match beyond
the bound is not one instance: its time is neither wait nor transfer (analyzer/analyses/
commsplit.py) and it gives no skew or straggler (analyzer/analyses/collectives.py).
Limits: a mis-pairing that shifts every end by the same amount cannot be told from a clock
offset (it is absorbed into the offset); a CPU rank descheduled before its collective's end is
recorded can push one genuine instance past the bound, which then counts as not measured
rather than as a long transfer. Source: the rule is ours (HTA analyses each rank on its own clock and aligns none), stated here and in
docs/method.md "Clock offsets".

Which events are collectives, their kind and process group: the ingest's rules, one for every
command (analyzer/ingest/classify.py, the collectives table of analyzer/analyses/collectives.py
``rank_collectives``, ``JobTables.collectives``). Tables (pandas) in and out; times int64
nanoseconds on each rank's own clock; aligned time = own time - offset_ns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses.matchkey import order_or_key

MATCHABLE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
KEY = ["pg", "kind", "seq"]
END_TOL_NS = 50_000
"""Tolerance of the one-instance bound (module docstring): 50 us."""
USABLE_CLOCKS = ("reference", "measured", "unresolved")
"""Clocks whose rank's collectives can enter cross-rank figures (on the applied offset)."""


def one_instance(latest_start_ns, first_end_ns, last_end_ns, min_dur_ns) -> np.ndarray:
    """True where a matched instance can be one collective (module docstring): per instance
    (arrays of int64 ns on aligned clocks: the latest start, earliest end and latest end over
    its ranks, the shortest duration) latest start - earliest end <= END_TOL_NS and
    latest end - earliest end <= shortest duration + END_TOL_NS."""
    ls, fe, le, md = (np.asarray(a, dtype=np.int64) for a in
                      (latest_start_ns, first_end_ns, last_end_ns, min_dur_ns))
    return (ls - fe <= END_TOL_NS) & (le - fe <= np.maximum(md, 0) + END_TOL_NS)


def sequenced(coll: pd.DataFrame) -> pd.DataFrame:
    """The ``MATCHABLE_KINDS`` rows of ``coll`` with ``seq`` = their cross-rank key
    (analyzer/analyses/matchkey.py): the table's Seq / Comms Id key where ``seq_source`` says
    so, else their order among the rows of the same (rank, pg, kind), in table order; pg and
    kind as str. Columns rank, pg, kind, seq, event_idx, start_ns, end_ns, seq_source
    ("order" for a table without one)."""
    cols = ["rank", *KEY, "event_idx", "start_ns", "end_ns", "seq_source"]
    c = coll[coll["kind"].isin(MATCHABLE_KINDS)]
    if c.empty:
        return pd.DataFrame(columns=cols)
    c = c.assign(kind=c["kind"].astype(str), pg=c["pg"].astype(str))
    order = c.groupby(["rank", "pg", "kind"], sort=False).cumcount().to_numpy(dtype=np.int64)
    src = c["seq_source"].astype(str) if "seq_source" in c.columns else "order"
    c = c.assign(seq=order_or_key(c, order), seq_source=src)
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


def reference_row(rank: int, n_matched: int, match: str = "") -> tuple:
    """The ``offset_row`` tuple of the reference rank itself; ``match``: ``match_rule``'s
    text (the job's matching rule, said once, on this row)."""
    return (rank, 0, 0, 0, 0, 0, n_matched, True, "reference", match)


def relay_base(rows: pd.DataFrame, offsets: dict[int, int]) -> pd.DataFrame:
    """Per (pg, kind, seq) of the ``sequenced`` rows ``rows`` of the ranks in ``offsets``
    (rank -> applied offset_ns: the ranks whose clock is usable), the lowest such rank's row
    on the reference clock (own time - offset), as ``reference`` gives it: columns pg, kind,
    seq, ref_start_ns, ref_end_ns (module docstring, Relays). Its input may be its own output
    with a rank column (the fold is associative: lowest rank wins)."""
    if "ref_end_ns" in rows.columns:
        t = rows
    else:
        t = rows[rows["rank"].isin(list(offsets))]
        shift = t["rank"].map(offsets).astype("int64")
        t = pd.DataFrame({"rank": t["rank"], **{k: t[k] for k in KEY},
                          "ref_start_ns": t["start_ns"] - shift,
                          "ref_end_ns": t["end_ns"] - shift})
    return (t.sort_values([*KEY, "rank"], kind="stable").drop_duplicates(KEY)
            .reset_index(drop=True)[["rank", *KEY, "ref_start_ns", "ref_end_ns"]])


def relayed(rows: list[tuple], estimate) -> list[tuple]:
    """``rows`` (``offset_row`` tuples of every rank) with each "unmatched" rank estimated
    again through relays (module docstring), round after round while one makes progress.
    ``estimate(usable, todo)``: {rank: offset_row tuple} of the ranks ``todo`` against
    ``relay_base`` of the ``usable`` ranks (rank -> applied offset_ns)."""
    rows = list(rows)
    while True:
        usable = {int(r[0]): int(r[1]) for r in rows if r[8] in USABLE_CLOCKS}
        todo = [int(r[0]) for r in rows if r[8] == "unmatched"]
        if not todo or not usable:
            return rows
        new = estimate(usable, todo)
        done = {r: t for r, t in new.items() if t[8] != "unmatched"}
        if not done:
            return rows
        rows = [done.get(int(r[0]), r) for r in rows]


def offset_row(rank: int, mine: pd.DataFrame) -> tuple:
    """(rank, offset_ns, estimate_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent, clock) of
    ``rank`` from ``mine``: its rows of the collectives it shares with the reference rank,
    merged with ``reference`` (``estimate_offsets`` says the rule)."""
    if mine.empty:
        return (rank, 0, None, None, None, None, 0, True, "unmatched", "")
    diff = (mine["end_ns"] - mine["ref_end_ns"]).to_numpy(dtype=np.int64)
    median = int(round(float(np.median(diff))))
    mad = int(round(float(np.median(np.abs(diff - median)))))
    lo = int((mine["start_ns"] - mine["ref_end_ns"]).max())
    hi = int((mine["end_ns"] - mine["ref_start_ns"]).min())
    consistent = lo <= hi
    estimate = min(max(median, lo), hi) if consistent else median
    state = ("inconsistent" if not consistent else
             "unresolved" if abs(estimate) < mad else "measured")
    return (rank, estimate if state == "measured" else 0, estimate, mad, lo, hi, len(diff),
            consistent, state, "")


OFFSET_COLUMNS = ["rank", "offset_ns", "estimate_ns", "mad_ns", "lo_ns", "hi_ns", "n_matched",
                  "consistent", "clock", "match"]


def offsets_frame(rows: list[tuple]) -> pd.DataFrame:
    """The ``estimate_offsets`` table of ``offset_row`` tuples."""
    out = pd.DataFrame(rows, columns=OFFSET_COLUMNS)
    return out.astype({"rank": "int64", "offset_ns": "int64", "estimate_ns": "Int64",
                       "mad_ns": "Int64", "lo_ns": "Int64", "hi_ns": "Int64",
                       "n_matched": "int64", "consistent": "bool", "clock": "object",
                       "match": "object"})


def unusable_ranks(offsets: pd.DataFrame | None) -> list[int]:
    """The ranks of ``offsets`` whose clock is not in ``USABLE_CLOCKS`` (sorted); none when
    ``offsets`` is None or has no ``clock`` column. A rank missing from ``offsets`` is usable
    (offset 0)."""
    if offsets is None or "clock" not in offsets.columns:
        return []
    return sorted(int(r) for r, c in zip(offsets["rank"], offsets["clock"])
                  if c not in USABLE_CLOCKS)


def clock_note(row) -> str | None:
    """The report's line for one ``estimate_offsets`` row whose offset is not applied as
    measured (None for a measured or reference clock)."""
    us = lambda ns: f"{ns / 1000:,.0f} µs"  # noqa: E731
    if row.clock == "reference":
        return getattr(row, "match", "") or None
    if row.clock == "inconsistent":
        return (f"clock offset of rank {row.rank} not measured: its {row.n_matched} matched "
                f"collectives contradict each other (causality bounds lo {us(row.lo_ns)} > hi "
                f"{us(row.hi_ns)}: order-matching paired collectives that are not one "
                "instance); offset 0, its collectives' wait/transfer, skew and straggler not "
                "measured")
    if row.clock == "unresolved":
        return (f"clock offset of rank {row.rank} not resolved: {us(row.estimate_ns)} ± "
                f"{us(row.mad_ns)} (smaller than its own spread): not applied (0); each "
                "matched collective still checked by the one-instance bound")
    if row.clock == "unmatched":
        return (f"clock offset of rank {row.rank} not measured: it shares no collective with "
                "the reference rank (offset 0)")
    return None


def estimate_offsets(matched: pd.DataFrame, ranks: list[int], ref_rank: int,
                     match: str = "") -> pd.DataFrame:
    """Clock offset of each rank relative to ``ref_rank``: aligned time = own time - offset_ns.

    For the collectives rank r shares with ``ref_rank`` (d_k = end on r - end on ref):
    - median_ns = median of d_k; mad_ns = median |d_k - median_ns| (the uncertainty).
    - causality bounds: no rank finishes a collective before every rank has started it, so
      lo_ns = max_k(start on r - end on ref) <= offset <= hi_ns = min_k(end on r - start on ref).
    - estimate_ns = median_ns clamped into [lo_ns, hi_ns] (the bounds win over a median
      pulled by a descheduled rank); when lo_ns > hi_ns the bounds contradict each other
      (mismatched collectives): estimate_ns = median_ns, consistent = False.
    - a rank that shares no collective with ``ref_rank``: the same against the usable ranks
      (module docstring, Relays); clock: its state (module docstring), offset_ns = estimate_ns
      when "measured", else 0 (nulls elsewhere when "unmatched").
    - match: ``match`` on the reference row (``match_rule``'s text), "" elsewhere.
    offset_ns is the offset every cross-rank figure applies. Columns: ``OFFSET_COLUMNS``
    (rank, offset_ns, estimate_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent, clock, match).
    """
    ref = reference(matched, ref_rank)
    rows = []
    for rank in ranks:
        if rank == ref_rank:
            rows.append(reference_row(rank, len(ref), match))
            continue
        rows.append(offset_row(rank, matched[matched["rank"] == rank].merge(ref, on=KEY)))

    def estimate(usable: dict[int, int], todo: list[int]) -> dict[int, tuple]:
        base = relay_base(matched, usable).drop(columns="rank")
        return {r: offset_row(r, matched[matched["rank"] == r].merge(base, on=KEY))
                for r in todo}

    return offsets_frame(relayed(rows, estimate))


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
    rule = match_rule(rule_counts(sequenced(coll))) if len(ranks) > 1 else ""
    return estimate_offsets(match_collectives(coll), ranks, ref, rule)


RULE_COLUMNS = ["rank", "pg", "kind", "seq_source", "n"]


def rule_counts(seq_rows: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, pg, kind, seq_source) of ``sequenced`` rows: n, their count
    (``RULE_COLUMNS``); its own output folds again (sums), so batches of ranks reduce."""
    if seq_rows.empty:
        return pd.DataFrame(columns=RULE_COLUMNS)
    if "n" not in seq_rows.columns:
        seq_rows = seq_rows.assign(n=1)
    return seq_rows.groupby(RULE_COLUMNS[:-1], sort=True)["n"].sum().reset_index()


ORDER_FALLBACK = ("collectives matched across ranks by order within process group and kind "
                  "(fallback: no Seq or Comms Id in the traces)")
"""``match_rule``'s text when every group is matched by order and nothing suggests the ranks'
windows begin at different collectives: the usual case of gloo traces (no
``record_param_comms``), a note of the run rather than a caveat of the report."""


def match_rule(counts: pd.DataFrame) -> str:
    """The report's line on how collectives were matched across ranks (analyzer/analyses/
    matchkey.py), from ``rule_counts`` of every rank: by Seq / Comms Id, by order, or a mix;
    with order, whether the ranks' windows may begin at different collectives: a (pg, kind)
    whose count differs between the ranks that ran it. "" without matchable collectives."""
    if counts.empty:
        return ""
    by_pg = counts.groupby("pg")["seq_source"].agg(lambda s: frozenset(s))
    keyed = sorted({s for v in by_pg for s in v} - {"order"})
    keyed_pgs = sorted(str(pg) for pg, v in by_pg.items() if "order" not in v)
    mixed = sorted(str(pg) for pg, v in by_pg.items() if "order" in v and len(v) > 1)
    ordered = sorted(str(pg) for pg, v in by_pg.items() if v == {"order"})
    some = bool(ordered or mixed)
    out = []
    if keyed_pgs:
        out.append(f"collectives matched across ranks by {' / '.join(keyed)} (the per process "
                   "group sequence number record_param_comms gives each collective, on the "
                   "kernel since kineto #1296 / #1300)"
                   + (f" in process group(s) {', '.join(keyed_pgs)}" if some else ""))
    if ordered:
        out.append(("in process group(s) " + ", ".join(ordered) + " " if keyed_pgs else
                    "collectives matched across ranks ")
                   + "by order within process group and kind (fallback: no Seq or Comms Id "
                   "in the traces)" + _shift(counts, ordered))
    if out == [ORDER_FALLBACK]:
        return ORDER_FALLBACK
    if mixed:
        out.append(f"process group(s) {', '.join(mixed)}: some ranks carry Seq / Comms Id and "
                   "others not; their collectives cannot be matched by one key (pairs may be "
                   "wrong)")
    return "; ".join(x for x in out if x)


def _shift(counts: pd.DataFrame, pgs: list[str]) -> str:
    """The clause naming the first (pg, kind) matched by order whose count differs between the
    ranks that ran it ("" when none does)."""
    c = counts[counts["pg"].astype(str).isin(pgs)]
    c = c.groupby(["pg", "kind", "rank"], sort=True)["n"].sum().reset_index()
    for (pg, kind), g in c.groupby(["pg", "kind"], sort=True):
        if g["n"].nunique() > 1:
            lo, hi = g.loc[g["n"].idxmin()], g.loc[g["n"].idxmax()]
            where = f"process group {pg}" if pg else "an unnamed process group"
            return (f"; the ranks' profiler windows may begin at different collectives: rank "
                    f"{int(lo['rank'])} has {int(lo['n'])} {kind} in {where}, rank "
                    f"{int(hi['rank'])} {int(hi['n'])}, so order may pair different instances "
                    "(their skew, wait / transfer and stragglers then wrong; a match outside "
                    "the one-instance bound is left out)")
    return ""


def end_spread(matched: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """Per matched collective: spread (max - min) of its end across ranks, before and after
    subtracting each rank's offset. Columns pg, kind, seq, n_ranks, spread_before_ns,
    spread_after_ns."""
    m = matched.merge(offsets[["rank", "offset_ns"]], on="rank")
    m["aligned_end_ns"] = m["end_ns"] - m["offset_ns"]
    g = m.groupby(KEY, sort=True)
    return pd.DataFrame({
        "n_ranks": g["rank"].nunique(),
        "spread_before_ns": g["end_ns"].max() - g["end_ns"].min(),
        "spread_after_ns": g["aligned_end_ns"].max() - g["aligned_end_ns"].min(),
    }).reset_index()
