"""Communication split into transfer and waiting for the slowest rank, from cross-rank matching.

A collective cannot move data before every rank of its group has started it: the time a rank
spends inside a collective before the last rank of the group started the same collective is
spent waiting for that rank, not transferring. Per collective instance on rank r (times on
aligned clocks, analyzer/analyses/clock.py):

    latest_start = max over the group's ranks of the instance's start
    wait_ns      = min(max(latest_start - start_r, 0), dur_r)
    transfer_ns  = dur_r - wait_ns          (latest_start .. end on rank r)

for an instance that is *measured*: matched (the same process group, kind and order among that
(process group, kind) on >= 2 ranks whose clocks are usable, ``clock.USABLE_CLOCKS``; TraceLens
matches by (process group, index in group), the kind keeps a mis-ordered kind from pairing an
all_gather with an all_reduce) and one instance (``clock.one_instance``). Then wait_ns +
transfer_ns = dur_ns exactly; the last rank to start waits 0.

Not measured (wait_ns = transfer_ns = 0, not_measured_ns = dur_ns): an instance seen on one rank
only (its group's other ranks have no trace, or it is point-to-point send_recv), a kind that
does not finish together, a match outside the one-instance bound ("inconsistent": the order
pairs collectives that cannot be one, e.g. on 2 of 128 ranks with the process group unknown), or
a rank whose clock is "inconsistent" (clock.py; its rows also leave the other ranks' instances).
Nothing is inferred for them: there is no evidence of either. So wait_ns + transfer_ns +
not_measured_ns = dur_ns per instance, rank and kind. When some ranks of a group have no trace,
latest_start is over the ranks present, a lower bound: the wait can only be under-stated.

busbw from transfer time: ``collectives.by_kind`` of the measured rows with ``dur_ns`` replaced
by ``transfer_ns`` (the nccl-tests definitions, analyzer/analyses/collectives.py); none
measured: unknown.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses.clock import MATCHABLE_KINDS, one_instance, unusable_ranks
from analyzer.analyses.matchkey import order_or_key


def instance_keys(coll: pd.DataFrame, offsets: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row of ``coll`` (columns rank, pg, kind, start_ns, dur_ns): rank, pg, kind, start
    and end (aligned: own time - the rank's offset_ns; end = start + max(dur_ns, 0)), dur
    (max(dur_ns, 0)), usable (the rank's clock is in ``clock.USABLE_CLOCKS``), pos (the row's
    position in ``coll``) and seq (its Seq / Comms Id key where the table has one,
    analyzer/analyses/matchkey.py; else its order within (rank, pg, kind) by start, ties by
    position), sorted by (rank, pg, kind, start, pos). ``offsets`` as ``wait_transfer``'s."""
    rank = coll["rank"].to_numpy(dtype=np.int64)
    shift = np.zeros(len(coll), np.int64)
    if offsets is not None and len(offsets):
        off = dict(zip(offsets["rank"].astype(int), offsets["offset_ns"].astype(int)))
        shift = np.array([off.get(int(r), 0) for r in rank], np.int64)
    bad = np.array(unusable_ranks(offsets), np.int64)
    start = coll["start_ns"].to_numpy(dtype=np.int64) - shift
    dur = np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0)
    key = pd.DataFrame({"rank": rank, "pg": coll["pg"].astype(str).to_numpy(),
                        "kind": coll["kind"].astype(str).to_numpy(),
                        "start": start, "end": start + dur, "dur": dur,
                        "usable": ~np.isin(rank, bad),
                        "pos": np.arange(len(coll))})
    # order within (rank, pg, kind) by start on the rank's clock (the offset is one constant
    # per rank), ties by table order
    key = key.sort_values(["rank", "pg", "kind", "start", "pos"], kind="stable")
    order = key.groupby(["rank", "pg", "kind"], sort=False).cumcount().to_numpy(dtype=np.int64)
    # the Seq / Comms Id key where the rank's pg has one (analyzer/analyses/matchkey.py)
    key["seq"] = order_or_key(coll.iloc[key["pos"].to_numpy()], order)
    return key


INSTANCE_COLUMNS = ["latest", "first_end", "last_end", "min_dur", "n_ranks"]


def latest_starts(keys: pd.DataFrame) -> pd.DataFrame:
    """Per instance (pg, kind, seq) over the usable rows of ``instance_keys`` (several
    ranks'), or over rows with columns pg, kind, seq and ``INSTANCE_COLUMNS`` (this table's
    own, reset: every reduction is associative, analyzer/analyses/crossrank.py): latest (the
    latest aligned start), first_end / last_end (the earliest / latest aligned end), min_dur
    (the shortest duration), all int64 ns, and n_ranks (how many ranks ran it, each rank
    once). Indexed by (pg, kind, seq)."""
    if "n_ranks" in keys.columns:
        t = keys[["pg", "kind", "seq", *INSTANCE_COLUMNS]]
    else:
        k = keys[keys["usable"]] if "usable" in keys.columns else keys
        t = pd.DataFrame({"pg": k["pg"], "kind": k["kind"], "seq": k["seq"],
                          "latest": k["start"], "first_end": k["end"], "last_end": k["end"],
                          "min_dur": k["dur"], "n_ranks": 1})
    return t.groupby(["pg", "kind", "seq"], sort=False).agg(
        latest=("latest", "max"), first_end=("first_end", "min"), last_end=("last_end", "max"),
        min_dur=("min_dur", "min"), n_ranks=("n_ranks", "sum"))


def wait_transfer(coll: pd.DataFrame, offsets: pd.DataFrame | None = None,
                  instances: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per row of ``coll`` (``JobTables.collectives``: rank, pg, kind, start_ns, dur_ns, ...
    times int64 ns on each rank's own clock), in ``coll``'s order and index: wait_ns,
    transfer_ns, not_measured_ns (int64 ns, their sum = dur_ns), matched (bool: the instance
    ran on >= 2 ranks with usable clocks) and measured (bool: matched, one instance by
    ``clock.one_instance``, on a usable clock), by the module docstring's rule. ``offsets``:
    each rank's clock offset (``clock.clock_offsets`` of the same table: rank, offset_ns and
    clock; None or a missing rank: 0, usable); aligned time = own time - offset_ns.
    ``instances``: ``latest_starts`` over every rank of the job, when ``coll`` holds only some
    of them (analyzer/analyses/crossrank.py); None: ``coll``'s own. A negative duration (a
    malformed event) is taken as 0."""
    out = pd.DataFrame({"wait_ns": np.zeros(len(coll), np.int64),
                        "transfer_ns": np.zeros(len(coll), np.int64),
                        "not_measured_ns": np.zeros(len(coll), np.int64),
                        "matched": np.zeros(len(coll), bool),
                        "measured": np.zeros(len(coll), bool)}, index=coll.index)
    if coll.empty:
        return out
    dur = np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0)
    key = instance_keys(coll, offsets)
    inst = latest_starts(key) if instances is None else instances
    at = inst.index.get_indexer(pd.MultiIndex.from_frame(key[["pg", "kind", "seq"]])) \
        if len(inst) else np.full(len(key), -1)
    seen = at >= 0  # int64 lookups: a join's NaN would turn the ns into floats

    def col(c: str) -> np.ndarray:
        if not len(inst):  # no instance on a usable clock: every row unseen
            return np.zeros(len(key), np.int64)
        return np.where(seen, inst[c].to_numpy(dtype=np.int64)[at], 0)

    latest = col("latest")
    ok = (key["usable"].to_numpy() & (col("n_ranks") >= 2)
          & np.isin(key["kind"].to_numpy(), MATCHABLE_KINDS))
    good = ok & one_instance(latest, col("first_end"), col("last_end"), col("min_dur"))
    pos = key["pos"].to_numpy()
    wait = np.where(good, np.clip(latest - key["start"].to_numpy(), 0, dur[pos]), 0)
    w, m, g = np.zeros(len(coll), np.int64), np.zeros(len(coll), bool), np.zeros(len(coll), bool)
    w[pos], m[pos], g[pos] = wait, ok, good
    out["wait_ns"], out["transfer_ns"] = w, np.where(g, dur - w, 0)
    out["not_measured_ns"], out["matched"], out["measured"] = np.where(g, 0, dur), m, g
    return out


SPLIT_PARTS = ("time_ns", "transfer_ns", "wait_ns", "not_measured_ns")


def rank_kind_split(coll: pd.DataFrame, split: pd.DataFrame,
                    rank_steps: pd.Series | None = None) -> pd.DataFrame:
    """Per (rank, kind): count, time_ns (sum of durations), transfer_ns, wait_ns,
    not_measured_ns (sums, transfer_ns + wait_ns + not_measured_ns = time_ns), unmatched
    (instances without a match on a usable clock), inconsistent (matched, outside the
    one-instance bound), measured (the rest), and, over the rows inside profiled steps
    (``step`` >= 0) divided by the rank's number of profiled steps (``rank_steps``: rank ->
    steps; None or a rank missing: NaN), time_ns_per_step, transfer_ns_per_step,
    wait_ns_per_step, not_measured_ns_per_step. ``split``: ``wait_transfer(coll, ...)``. Rows
    sorted by (rank, kind); rows without a kind left out."""
    cols = ["rank", "kind", "count", *SPLIT_PARTS, "unmatched", "inconsistent", "measured",
            *[f"{c}_per_step" for c in SPLIT_PARTS]]
    has = coll["kind"].notna().to_numpy() if len(coll) else np.zeros(0, bool)
    if not has.any():
        return pd.DataFrame(columns=cols)
    matched, measured = split["matched"].to_numpy(), split["measured"].to_numpy()
    t = pd.DataFrame({"rank": coll["rank"].to_numpy(dtype=np.int64),
                      "kind": coll["kind"].astype(str).to_numpy(),
                      "time_ns": np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0),
                      "transfer_ns": split["transfer_ns"].to_numpy(),
                      "wait_ns": split["wait_ns"].to_numpy(),
                      "not_measured_ns": split["not_measured_ns"].to_numpy(),
                      "unmatched": (~matched).astype(np.int64),
                      "inconsistent": (matched & ~measured).astype(np.int64),
                      "measured": measured.astype(np.int64),
                      "inside": coll["step"].to_numpy() >= 0})[has]
    g = t.groupby(["rank", "kind"], sort=True)
    out = g.agg(count=("time_ns", "size"), **{c: (c, "sum") for c in SPLIT_PARTS},
                unmatched=("unmatched", "sum"), inconsistent=("inconsistent", "sum"),
                measured=("measured", "sum"))
    ins = t[t["inside"]].groupby(["rank", "kind"], sort=True)[list(SPLIT_PARTS)].sum()
    ins = ins.reindex(out.index).fillna(0)
    steps = (pd.Series(out.index.get_level_values("rank"), index=out.index)
             .map(rank_steps if rank_steps is not None else {}).astype(float))
    for c in SPLIT_PARTS:
        out[f"{c}_per_step"] = (ins[c] / steps).where(steps > 0)
    return out.reset_index()[cols]
