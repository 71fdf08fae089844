"""Collective instances per rank, per-kind bandwidth, and cross-rank matching.

Bandwidth follows nccl-tests (doc/PERFORMANCE.md): algbw = bytes / time with bytes as nccl-tests
counts them (all_gather and reduce_scatter: the total buffer; all_reduce, broadcast, all_to_all:
the buffer), busbw = algbw x factor(n): all_reduce 2(n-1)/n, all_gather, reduce_scatter and
all_to_all (n-1)/n, broadcast and send_recv 1; GB = 10^9 bytes. Across the ranks of a run, times
are combined before the bandwidth is computed, as nccl-tests does (``run_busbw_gbps``).
Cross-rank matching: the same collective on every rank is the one with the same process group
and the same key within it (analyzer/analyses/matchkey.py: the per process group sequence number
Seq or the Comms Id where the traces carry them, kineto #1296 / #1300; else TraceLens' index
within the group); transfer and wait as the report splits them (analyzer/analyses/commsplit.py):
a rank waits from its start to the group's latest start, and transfers from there to its end.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses.breakdown import is_in
from analyzer.analyses.clock import MATCHABLE_KINDS
from analyzer.analyses.matchkey import rank_keys


def busbw_factor(kind: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor of ``kind`` on ``n`` ranks (NaN when undefined). broadcast
    and send_recv have factor 1 for any group (nccl-tests doc/PERFORMANCE.md), so an unknown
    group size (``n`` <= 0) leaves them defined; the others are NaN then."""
    if kind in ("broadcast", "send_recv"):
        return 1.0
    if n <= 0:
        return float("nan")
    if kind == "all_reduce":
        return 2.0 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return float("nan")


def _enqueue_spans(events: pd.DataFrame, launch: np.ndarray,
                   paired: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) ns of the CPU op that enqueued each communication row (``launch`` /
    ``paired``: the rows' launch_row / paired_row in ``events``): the comm op enclosing the
    launch or paired op (a runtime launch sits inside nccl:* / record_param_comms), else that
    op itself; -1 when the row has neither."""
    link = np.where(launch >= 0, launch, paired)
    enclosers = _enclosing_enqueue(events, link)
    src_row = np.where(enclosers >= 0, enclosers, link)
    known, at = src_row >= 0, np.maximum(src_row, 0)
    return (np.where(known, events["ts_ns"].to_numpy()[at], -1),
            np.where(known, events["end_ns"].to_numpy()[at], -1))


def _index_in_pg(pg: np.ndarray, start: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(a code per process group, each row's index within its group by ``start``, ties: table
    order) of rows whose process groups are ``pg``."""
    pg_code = np.unique(pg, return_inverse=True)[1].ravel() if len(pg) else np.zeros(0, int)
    by_pg = np.lexsort((start, pg_code))  # (pg, start, table order)
    seq = np.empty(len(pg), np.int64)
    grouped = pg_code[by_pg]
    seq[by_pg] = np.arange(len(pg)) - np.searchsorted(grouped, grouped, "left")
    return pg_code, seq


def rank_collectives(rank: int, events: pd.DataFrame,
                     shares: tuple[np.ndarray, np.ndarray] | None = None) -> pd.DataFrame:
    """One row per communication event (NCCL kernel or gloo op) of one rank (``schemas.COLLECTIVES_SCHEMA``).

    ``pg`` is "" when the trace does not name the process group (``dtype`` and ``pg_ranks``
    likewise); device rows with no launch on a trace that has launch links (queued before the
    profiler started) are left out, as HTA and TraceLens do; ``seq`` is the row's cross-rank key
    within its pg (analyzer/analyses/matchkey.py ``rank_keys``: the trace's Seq or Comms Id
    where every matchable row of the rank's pg has a distinct one, else the index within (rank,
    pg) by start time, ties: table order), ``seq_source`` which ("Seq", "Comms Id", "order"),
    ``pg_seq`` the row's own Seq (-1 unknown), ``comms_id`` its Comms Id ("" unknown); rows are
    sorted by start time (ties: pg, then table order); ``group_size`` is the event table's (-1
    unknown: never assumed to be the world size here, analyzer/ingest/commid.py says when it
    is); enqueue_* is the CPU op that launched it (GPU: the launch's enclosing comm op, gloo:
    the paired c10d op), -1 when unknown; ``event_idx`` is the event's position in the trace
    file's traceEvents list (analyzer/ingest/decode.py), what ``analyzer merge`` links its flow
    arrows to; ``peer`` the global rank a send / recv's tag names (-1 unknown), ``pg_desc`` the
    process group's description ("" unknown); ``union_ns`` / ``exposed_ns`` the row's share of
    its process group's communication time and of the part no computation overlaps (``shares``:
    ``breakdown.comm_shares`` of ``events``; None: 0).
    """
    comm = is_in(events["role"], ("comm",))
    gpu = events["is_gpu"].to_numpy(dtype=bool)
    launch_all = events["launch_row"].to_numpy()
    if (launch_all[gpu] >= 0).any():  # un-launched device work: queued before the profiler
        comm &= ~(gpu & (launch_all < 0))  # started; HTA and TraceLens leave it out too
    idx = np.flatnonzero(comm)

    def strs(name: str, fill: str | None = None) -> np.ndarray:
        """``col.astype(str)`` of these rows as an object array (missing stays NaN unless
        ``fill``); a categorical through one str() per category."""
        col = events[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            lut = np.array([*(str(c) for c in col.array.categories.tolist()),
                            np.nan if fill is None else fill], object)
            return lut[col.array.codes[idx]]  # code -1 (missing) takes the last slot
        col = col.iloc[idx]
        return (col if fill is None else col.fillna(fill)).astype(str).to_numpy()

    def ints(name: str) -> np.ndarray:
        return events[name].to_numpy()[idx].astype(np.int64)

    pg = strs("pg", "")
    gs = ints("group_size")
    gs[gs <= 0] = -1
    enq_s, enq_e = _enqueue_spans(events, ints("launch_row"), ints("paired_row"))
    start, end = events["ts_ns"].to_numpy()[idx], events["end_ns"].to_numpy()[idx]
    pg_code, seq = _index_in_pg(pg, start)
    pg_seq = ints("seq_arg") if "seq_arg" in events.columns else np.full(len(idx), -1, np.int64)
    cid = strs("comms_id", "") if "comms_id" in events.columns else np.full(len(idx), "", object)
    seq, source = rank_keys(pg, np.isin(strs("coll_kind"), MATCHABLE_KINDS), seq, pg_seq, cid)
    order = np.lexsort((pg_code, start))  # (start, pg, table order)
    return pd.DataFrame({
        "rank": np.full(len(idx), rank, np.int64), "step": ints("step")[order],
        "pg": pg[order], "seq": seq[order], "kind": strs("coll_kind")[order],
        "start_ns": start[order], "end_ns": end[order],
        "dur_ns": events["dur_ns"].to_numpy()[idx][order],
        "bytes": events["bytes"].to_numpy()[idx][order], "rule": strs("rule")[order],
        "name": strs("name")[order], "group_size": gs[order],
        "dtype": strs("dtype", "")[order], "pg_ranks": strs("pg_ranks", "")[order],
        "enqueue_start_ns": enq_s[order], "enqueue_end_ns": enq_e[order],
        "event_idx": ints("event_idx")[order],
        "peer": (ints("peer") if "peer" in events.columns
                 else np.full(len(idx), -1, np.int64))[order],
        "pg_desc": (strs("pg_desc", "") if "pg_desc" in events.columns
                    else np.full(len(idx), "", object))[order],
        "union_ns": (shares[0][idx] if shares is not None
                     else np.zeros(len(idx), np.int64))[order],
        "exposed_ns": (shares[1][idx] if shares is not None
                       else np.zeros(len(idx), np.int64))[order],
        # filled by analyzer/analyses/straggler.py ``gap_parts`` at ingest (-1: not computed)
        "gap_ns": np.full(len(idx), -1, np.int64),
        **{c: np.zeros(len(idx), np.int64)
           for c in ("gap_compute_ns", "gap_host_ns", "gap_data_ns", "gap_coll_ns")},
        "pg_seq": pg_seq[order], "comms_id": cid[order], "seq_source": source[order],
    })


def _enclosing_enqueue(events: pd.DataFrame, link: np.ndarray) -> np.ndarray:
    """For each linked CPU row (a runtime launch, or a paired c10d op), the outermost
    comm_enqueue op enclosing it on the same thread (itself when it is the outermost); -1
    otherwise. Outermost: the earliest start (ties: table order).

    Per thread, with the enqueue ops in (start, table order) and their running maximum of
    end: the first op whose end reaches the row's end is the earliest-starting op that could
    enclose it; it encloses it when it also starts at or before the row."""
    out = np.full(len(link), -1, np.int64)
    enq = np.flatnonzero(is_in(events["role"], ("comm_enqueue",)))
    has = np.flatnonzero(link >= 0)
    if not len(enq) or not len(has):
        return out
    ts = events["ts_ns"].to_numpy()
    end = events["end_ns"].to_numpy()
    tid = _codes(events["tid"])
    enq = enq[np.lexsort((ts[enq], tid[enq]))]  # (thread, start, table order)
    e_tid = tid[enq]
    rows = link[has]
    for t in np.unique(tid[rows]).tolist():
        a, b = np.searchsorted(e_tid, [t, t + 1])
        if a == b:
            continue
        ops = enq[a:b]
        sel = np.flatnonzero(tid[rows] == t)
        j = rows[sel]
        k = np.minimum(np.searchsorted(np.maximum.accumulate(end[ops]), end[j]), len(ops) - 1)
        ok = (end[ops[k]] >= end[j]) & (ts[ops[k]] <= ts[j])
        out[has[sel[ok]]] = ops[k[ok]]
    return out


def _codes(col: pd.Series) -> np.ndarray:
    """Integer codes of a column's values as strings (equal codes = equal strings)."""
    if isinstance(col.dtype, pd.CategoricalDtype) and not col.isna().any():
        cats = col.cat.categories.astype(str)
        if cats.is_unique:
            return col.cat.codes.to_numpy().astype(np.int64)
    return pd.factorize(col.astype(str))[0].astype(np.int64)


def by_kind(coll: pd.DataFrame, rows: np.ndarray | None = None) -> pd.DataFrame:
    """Per rank and kind: rank, kind, count, time_ns (sum of durations), bytes (sum of known
    bytes), algbw_gbps, busbw_gbps (over the instances whose bytes are known:
    sum(bytes) / sum(time), busbw weighting each instance by its nccl-tests factor),
    bus_bytes (float: sum of bytes x factor over the instances with known bytes and a factor)
    and bus_time_ns (their summed duration), so busbw_gbps = bus_bytes / bus_time_ns; a run's
    busbw over ranks is ``run_busbw_gbps`` of these two columns, not a mean of busbw_gbps.
    Rows sorted by (rank, kind); rows without a kind are left out. ``rows``: a boolean mask
    over ``coll``'s rows, giving ``by_kind(coll[rows])`` without building that table."""
    cols = ["rank", "kind", "count", "time_ns", "bytes", "algbw_gbps", "busbw_gbps", "bus_bytes",
            "bus_time_ns"]
    pos = None if rows is None else np.flatnonzero(rows)
    if coll.empty or (pos is not None and not len(pos)):
        return pd.DataFrame(columns=cols)

    def pick(values: np.ndarray) -> np.ndarray:
        return values if pos is None else values[pos]

    # a few thousand rows: integer sums with numpy over dense group ids in (rank, kind) order
    kcol = coll["kind"]
    categorical = isinstance(kcol.dtype, pd.CategoricalDtype)
    kind = pick(kcol.to_numpy(dtype=object))
    if categorical:  # groupby order: the categories' order
        codes = pick(kcol.cat.codes.to_numpy())
        has_kind, kind_idx = codes >= 0, codes[codes >= 0]
        names = np.asarray(kcol.cat.categories, dtype=object)
    else:
        has_kind = pick(kcol.notna().to_numpy())
        names, kind_idx = np.unique(kind[has_kind].astype(str), return_inverse=True)
    ranks = pick(coll["rank"].to_numpy())
    _, rank_idx = np.unique(ranks[has_kind], return_inverse=True)
    cell, gid_kept = np.unique(rank_idx * len(names) + kind_idx, return_inverse=True)
    gid = np.full(len(kind), -1, np.int64)
    gid[has_kind] = gid_kept
    n = len(cell)
    dur = pick(coll["dur_ns"].to_numpy()).astype(np.int64, copy=False)
    nbytes = pick(coll["bytes"].to_numpy()).astype(np.int64, copy=False)
    known = nbytes >= 0
    fac = _factors(kind, has_kind, kind_idx, names, pick(coll["group_size"].to_numpy()))
    bus = known & np.isfinite(fac)
    sel = gid >= 0

    def total(values: np.ndarray) -> np.ndarray:
        out = np.zeros(n, np.int64)
        np.add.at(out, gid[sel], values[sel])
        return out

    count = np.bincount(gid[sel], minlength=n).astype(np.int64)
    time_ns = total(dur)
    kbytes = total(np.where(known, nbytes, 0))
    ktime = total(np.where(known, dur, 0))
    kbustime = total(np.where(bus, dur, 0))
    anyknown = total(known.astype(np.int64)) > 0
    # the float sum through pandas' own group sum, so its rounding is the one a pandas
    # groupby gives (compensated or reduceat, depending on the row order)
    kbus_rows = np.where(bus, np.where(known, nbytes, 0) * np.nan_to_num(fac), 0.0)
    keys = np.where(sel, gid, np.nan)
    kbus = pd.Series(kbus_rows).groupby(keys, sort=True).sum().to_numpy()
    # bytes per ns == GB/s (1e9 bytes per 1e9 ns)
    algbw = np.where(ktime > 0, kbytes / np.where(ktime > 0, ktime, 1), np.nan)
    busbw = np.where(kbustime > 0, kbus / np.where(kbustime > 0, kbustime, 1), np.nan)
    first = np.flatnonzero(sel)[np.unique(gid[sel], return_index=True)[1]]
    at = first if pos is None else pos[first]  # their rows in ``coll``
    if categorical:
        kinds = kcol.iloc[at].reset_index(drop=True)
    elif kcol.dtype.kind == "O":  # str or object: the values (pandas infers str, as groupby)
        kinds = kind[first]
    else:
        kinds = kcol.iloc[at].to_numpy()
    return pd.DataFrame({
        "rank": ranks[first], "kind": kinds,
        "count": count, "time_ns": time_ns, "bytes": np.where(anyknown, kbytes, -1),
        "algbw_gbps": algbw, "busbw_gbps": busbw, "bus_bytes": kbus, "bus_time_ns": kbustime})


def run_busbw_gbps(bus_bytes: np.ndarray, bus_time_ns: np.ndarray) -> float:
    """busbw of one collective kind over the ranks of a run, in GB/s (10^9 bytes/s), from the
    per-rank ``bus_bytes`` and ``bus_time_ns`` of ``by_kind``: sum(bus_bytes) / sum(bus_time_ns),
    i.e. S x factor / (mean time over ranks), as nccl-tests averages the ranks' times before
    dividing (src/common.cu ``BenchTime``); a mean of per-rank busbw would weigh a slow rank
    less than its time. NaN when no instance has known bytes and a factor."""
    t = float(np.sum(bus_time_ns))
    return float(np.sum(bus_bytes)) / t if t > 0 else float("nan")


def _factors(kind: np.ndarray, has_kind: np.ndarray, kind_idx: np.ndarray, names: np.ndarray,
             group_size: np.ndarray) -> np.ndarray:
    """``busbw_factor(kind, group_size)`` of every row, computed once per distinct pair."""
    gs = group_size.astype(np.int64)
    out = np.full(len(kind), np.nan)
    if has_kind.any():
        pair, inv = np.unique(np.stack([kind_idx, gs[has_kind]]), axis=1, return_inverse=True)
        out[has_kind] = np.array([busbw_factor(names[k], int(g)) for k, g in pair.T])[inv.ravel()]
    for i in np.flatnonzero(~has_kind):  # no kind (NaN): busbw_factor says NaN or not
        out[i] = busbw_factor(kind[i], int(gs[i]))
    return out


MATCH_COLUMNS = ["pg", "seq", "kind", "n_ranks", "start_ns", "start_skew_ns", "transfer_ns",
                 "max_wait_ns", "straggler_rank", "kinds_agree", "measured"]


def finish_matches(out: pd.DataFrame) -> pd.DataFrame:
    """``match_ranks``' last step on its per-(pg, seq) table (columns pg, seq, kind, n_ranks,
    start_ns, last_start, transfer_ns, max_wait_ns, straggler_rank, kinds_agree, all_measured):
    measured = every row measured, one kind, >= 2 ranks; start_skew_ns, transfer_ns,
    max_wait_ns and straggler_rank null (Int64) where not measured, straggler_rank also where
    the skew is 0 (a tie is nobody's)."""
    out = out.copy()
    measured = (out["all_measured"].astype(bool) & out["kinds_agree"].astype(bool)
                & (out["n_ranks"] > 1))
    out["measured"] = measured.to_numpy()
    out["start_skew_ns"] = out["last_start"] - out["start_ns"]
    for c in ("start_skew_ns", "transfer_ns", "max_wait_ns", "straggler_rank"):
        out[c] = out[c].astype("int64").astype("Int64").where(measured.to_numpy())
    out["straggler_rank"] = out["straggler_rank"].where(out["start_skew_ns"] > 0)
    return out[MATCH_COLUMNS].astype({"n_ranks": "int64", "start_ns": "int64",
                                      "kinds_agree": "bool", "measured": "bool"})


def match_ranks(coll: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """Collectives matched across ranks by (pg, seq), compared on aligned clocks.

    ``coll``: ``JobTables.collectives``; ``offsets``: each rank's clock offset (columns rank,
    offset_ns, clock: ``analyzer.analyses.clock.clock_offsets`` of the same table; a rank
    missing from it counts as offset 0). Every start is first put on the reference rank's
    clock (start_ns - offset_ns), so a rank whose clock runs ahead is not the straggler of
    every collective; a rank whose clock is not usable (``clock.USABLE_CLOCKS``) is left out.
    Columns (``MATCH_COLUMNS``): pg, seq, kind, n_ranks, start_ns (first aligned start,
    reference clock), start_skew_ns (last aligned start - first), transfer_ns (the shortest of
    the ranks' transfer times) and max_wait_ns (the longest of their waits for the last rank
    to start), both by the report's rule (analyzer/analyses/commsplit.py ``wait_transfer``:
    wait = start .. latest start of the group, transfer = the rest), straggler_rank (last to
    start, aligned; the lowest rank on a tie), kinds_agree, measured (every rank's row
    measured by ``wait_transfer`` -- one instance by ``clock.one_instance`` -- one kind, >= 2
    ranks). Not measured: skew, transfer, wait and straggler null; skew 0: straggler null."""
    from analyzer.analyses.clock import unusable_ranks
    from analyzer.analyses.commsplit import wait_transfer

    bad = unusable_ranks(offsets)
    if bad and len(coll):
        coll = coll[~coll["rank"].isin(bad)]
    if coll.empty:
        return pd.DataFrame(columns=MATCH_COLUMNS)
    split = wait_transfer(coll, offsets)
    shift = coll["rank"].map(dict(zip(offsets["rank"], offsets["offset_ns"]))).fillna(0)
    coll = coll.assign(start_ns=coll["start_ns"] - shift.astype("int64"),
                       transfer_ns=split["transfer_ns"], wait_ns=split["wait_ns"],
                       measured=split["measured"])
    g = coll.groupby(["pg", "seq"], sort=True)
    last = coll.loc[g["start_ns"].idxmax(), ["pg", "seq", "rank"]].set_index(["pg", "seq"])
    out = g.agg(kind=("kind", lambda k: k.mode().iat[0]), n_ranks=("rank", "nunique"),
                start_ns=("start_ns", "min"), last_start=("start_ns", "max"),
                transfer_ns=("transfer_ns", "min"), max_wait_ns=("wait_ns", "max"),
                nkinds=("kind", "nunique"), all_measured=("measured", "all"))
    out["straggler_rank"] = last["rank"].reindex(out.index)
    out["kinds_agree"] = out["nkinds"] == 1
    return finish_matches(out.reset_index())


def stragglers(matched: pd.DataFrame) -> pd.DataFrame:
    """Per rank: times_last (measured collectives it started last with a start skew > 0:
    a zero-skew tie counts for nobody), skew_caused_ns (sum of start skew of those
    collectives). ``matched``: ``match_ranks``' table, whose starts are already on aligned
    clocks; instances not measured (outside the one-instance bound, ``clock.one_instance``)
    count for nobody. Sorted, worst first."""
    cols = ["rank", "times_last", "skew_caused_ns"]
    if matched.empty:
        return pd.DataFrame(columns=cols)
    m = matched[matched["measured"].astype(bool) & matched["straggler_rank"].notna()
                & (matched["n_ranks"] > 1)]
    m = m[m["start_skew_ns"].astype("int64") > 0]
    if m.empty:
        return pd.DataFrame(columns=cols)
    g = m.astype({"straggler_rank": "int64", "start_skew_ns": "int64"}).groupby(
        "straggler_rank").agg(times_last=("seq", "size"),
                              skew_caused_ns=("start_skew_ns", "sum")).reset_index()
    g = g.rename(columns={"straggler_rank": "rank"})
    return g.sort_values(["skew_caused_ns", "rank"], ascending=[False, True])[cols] \
        .reset_index(drop=True)
