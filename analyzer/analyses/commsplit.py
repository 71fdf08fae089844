"""Communication split into transfer and waiting for the slowest rank, from cross-rank matching.

A collective cannot move data before every rank of its group has started it: the time a rank
spends inside a collective before the last rank of the group started the same collective is
spent waiting for that rank, not transferring. Per collective instance on rank r (times on
aligned clocks, analyzer/analyses/clock.py):

    latest_start = max over the group's ranks of the instance's start
    wait_ns      = min(max(latest_start - start_r, 0), dur_r)
    transfer_ns  = dur_r - wait_ns          (latest_start .. end on rank r)

so wait_ns + transfer_ns = dur_ns exactly, per instance and therefore per rank and kind. The
last rank to start waits 0. Matching is the clock's (``clock.match_collectives``): the same
instance on every rank is the one with the same process group, kind and order among that
(process group, kind) on its rank (TraceLens matches by (process group, index in group); the
kind is added so that one mis-ordered kind cannot pair an all_gather with an all_reduce).
Instances not matched (seen on one rank only, a kind that does not finish together such as
send_recv, or one rank's trace missing) have no evidence of waiting: all transfer, counted as
``matched`` False. When some ranks of a group have no trace, latest_start is over the ranks
present, a lower bound: the wait can only be under-stated.

busbw from transfer time: ``collectives.by_kind`` of the table with ``dur_ns`` replaced by
``transfer_ns`` (the nccl-tests definitions, analyzer/analyses/collectives.py).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses.clock import MATCHABLE_KINDS


def instance_keys(coll: pd.DataFrame, offsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row of ``coll``: rank, pg, kind, start (aligned: start_ns - the rank's offset_ns),
    pos (the row's position in ``coll``) and seq (its order within (rank, pg, kind) by start,
    ties by position), sorted by (rank, pg, kind, start, pos). ``offsets`` as
    ``wait_transfer``'s."""
    rank = coll["rank"].to_numpy(dtype=np.int64)
    shift = np.zeros(len(coll), np.int64)
    if offsets is not None and len(offsets):
        off = dict(zip(offsets["rank"].astype(int), offsets["offset_ns"].astype(int)))
        shift = np.array([off.get(int(r), 0) for r in rank], np.int64)
    start = coll["start_ns"].to_numpy(dtype=np.int64) - shift
    key = pd.DataFrame({"rank": rank, "pg": coll["pg"].astype(str).to_numpy(),
                        "kind": coll["kind"].astype(str).to_numpy(),
                        "start": start, "pos": np.arange(len(coll))})
    # order within (rank, pg, kind) by start on the rank's clock (the offset is one constant
    # per rank), ties by table order
    key = key.sort_values(["rank", "pg", "kind", "start", "pos"], kind="stable")
    key["seq"] = key.groupby(["rank", "pg", "kind"], sort=False).cumcount()
    return key


def latest_starts(keys: pd.DataFrame) -> pd.DataFrame:
    """Per instance (pg, kind, seq) of ``instance_keys`` rows (several ranks'), or of rows
    with columns pg, kind, seq, latest, n_ranks (this table's own, reset: the reduction is
    associative, analyzer/analyses/crossrank.py): latest (the latest aligned start, int64 ns)
    and n_ranks (how many ranks ran it, each rank once). Indexed by (pg, kind, seq)."""
    n = keys["n_ranks"] if "n_ranks" in keys.columns else pd.Series(1, index=keys.index)
    latest = keys["latest"] if "latest" in keys.columns else keys["start"]
    t = pd.DataFrame({"pg": keys["pg"], "kind": keys["kind"], "seq": keys["seq"],
                      "latest": latest, "n_ranks": n})
    return t.groupby(["pg", "kind", "seq"], sort=False).agg(latest=("latest", "max"),
                                                            n_ranks=("n_ranks", "sum"))


def wait_transfer(coll: pd.DataFrame, offsets: pd.DataFrame | None = None,
                  instances: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row of ``coll`` (``JobTables.collectives``: rank, pg, kind, start_ns, dur_ns, ...
    times int64 ns on each rank's own clock), in ``coll``'s order and index: wait_ns,
    transfer_ns (int64 ns, wait_ns + transfer_ns = dur_ns) and matched (bool), by the module
    docstring's rule. ``offsets``: each rank's clock offset (columns rank, offset_ns:
    ``clock.clock_offsets`` of the same table; None or a missing rank: 0); aligned start =
    start_ns - offset_ns. ``instances``: ``latest_starts`` over every rank of the job, when
    ``coll`` holds only some of them (analyzer/analyses/crossrank.py); None: ``coll``'s own.
    A negative duration (a malformed event) is taken as 0."""
    out = pd.DataFrame({"wait_ns": np.zeros(len(coll), np.int64),
                        "transfer_ns": np.zeros(len(coll), np.int64),
                        "matched": np.zeros(len(coll), bool)}, index=coll.index)
    if coll.empty:
        return out
    dur = np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0)
    key = instance_keys(coll, offsets)
    inst = latest_starts(key) if instances is None else instances
    at = inst.index.get_indexer(pd.MultiIndex.from_frame(key[["pg", "kind", "seq"]])) \
        if len(inst) else np.full(len(key), -1)
    seen = at >= 0  # int64 lookups: a join's NaN would turn the ns into floats
    n_ranks = np.where(seen, inst["n_ranks"].to_numpy(dtype=np.int64)[at], 0)
    latest = np.where(seen, inst["latest"].to_numpy(dtype=np.int64)[at], 0)
    pos = key["pos"].to_numpy()
    ok = (n_ranks >= 2) & np.isin(key["kind"].to_numpy(), MATCHABLE_KINDS)
    wait = np.where(ok, np.clip(latest - key["start"].to_numpy(), 0, dur[pos]), 0)
    w = np.zeros(len(coll), np.int64)
    m = np.zeros(len(coll), bool)
    w[pos], m[pos] = wait, ok
    out["wait_ns"], out["transfer_ns"], out["matched"] = w, dur - w, m
    return out


def rank_kind_split(coll: pd.DataFrame, split: pd.DataFrame,
                    rank_steps: pd.Series | None = None) -> pd.DataFrame:
    """Per (rank, kind): count, time_ns (sum of durations), transfer_ns, wait_ns (sums,
    transfer_ns + wait_ns = time_ns), unmatched (instances without a match), and, over the
    rows inside profiled steps (``step`` >= 0) divided by the rank's number of profiled steps
    (``rank_steps``: rank -> steps; None or a rank missing: NaN), time_ns_per_step,
    transfer_ns_per_step, wait_ns_per_step. ``split``: ``wait_transfer(coll, ...)``. Rows
    sorted by (rank, kind); rows without a kind left out."""
    cols = ["rank", "kind", "count", "time_ns", "transfer_ns", "wait_ns", "unmatched",
            "time_ns_per_step", "transfer_ns_per_step", "wait_ns_per_step"]
    has = coll["kind"].notna().to_numpy() if len(coll) else np.zeros(0, bool)
    if not has.any():
        return pd.DataFrame(columns=cols)
    t = pd.DataFrame({"rank": coll["rank"].to_numpy(dtype=np.int64),
                      "kind": coll["kind"].astype(str).to_numpy(),
                      "time_ns": np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0),
                      "transfer_ns": split["transfer_ns"].to_numpy(),
                      "wait_ns": split["wait_ns"].to_numpy(),
                      "unmatched": (~split["matched"].to_numpy()).astype(np.int64),
                      "inside": coll["step"].to_numpy() >= 0})[has]
    g = t.groupby(["rank", "kind"], sort=True)
    out = g.agg(count=("time_ns", "size"), time_ns=("time_ns", "sum"),
                transfer_ns=("transfer_ns", "sum"), wait_ns=("wait_ns", "sum"),
                unmatched=("unmatched", "sum"))
    ins = t[t["inside"]].groupby(["rank", "kind"], sort=True)[["time_ns", "transfer_ns",
                                                               "wait_ns"]].sum()
    ins = ins.reindex(out.index).fillna(0)
    steps = (pd.Series(out.index.get_level_values("rank"), index=out.index)
             .map(rank_steps if rank_steps is not None else {}).astype(float))
    for c in ("time_ns", "transfer_ns", "wait_ns"):
        out[f"{c}_per_step"] = (ins[c] / steps).where(steps > 0)
    return out.reset_index()[cols]
