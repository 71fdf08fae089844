"""The cross-rank phase in batches of ranks: what ``report`` and ``summary`` compute across a
job's ranks without holding every rank's collectives or prefetch rows at once.

Each function walks ``JobTables.batches`` (consecutive ranks' tables, read from memory or from
disk, analyzer/ingest/spill.py, up to ``pipeline.BATCH_BYTES`` at a time) and keeps only what
the rule it streams needs:
- clock offsets (analyzer/analyses/clock.py): the reference rank's matchable collectives, then
  each other rank against them; ranks that share none with it, against the usable ranks'
  (one row per instance) in a further pass per relay round;
- the transfer/wait split (analyzer/analyses/commsplit.py): per collective instance (pg, kind,
  seq) the latest aligned start and the number of ranks that ran it, reduced batch by batch,
  then each batch's split against it;
- per rank and kind, per (rank, kind, process group, dtype) and per FSDP unit: sums, joined
  across batches in rank order;
- ``match_ranks`` (analyzer/analyses/collectives.py): per (pg, seq) its extremes, reduced
  batch by batch.
Every rule above is per rank or an associative reduction over ranks, so a batch of ranks is
computed as the whole table would be. Memory: one batch, plus one row per collective instance
of the job (about one rank's collectives: every rank of an SPMD job runs the same ones) and a
few rows per rank. Results equal the functions named above on the concatenated table
(tests/analyzer/test_crossrank.py); the FSDP-unit means sum per batch first (equal when the job
is one batch, within a few ulp otherwise).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pandas as pd

from analyzer.analyses import clock
from analyzer.analyses.collectives import MATCH_COLUMNS, by_kind, finish_matches
from analyzer.analyses.commsplit import instance_keys, latest_starts, rank_kind_split, wait_transfer
from analyzer.analyses.meshdims import dim_parts

REDUCE_ROWS = 1 << 18
"""Per-instance rows gathered before they are reduced into the running per-instance table
(fewer reductions; at most ~20 MB besides that table)."""
COMPACT_PARTS = 8
"""Per-batch pieces of ``comm_parts`` gathered before they are joined into one (the join is
associative; a small frame's per-column overhead would otherwise grow with the batches)."""
_OFFSET_COLS = ["rank", "pg", "kind", "event_idx", "start_ns", "end_ns", "seq", "seq_source"]


class _Reduction:
    """Rows added batch by batch and folded with ``fold`` (rows -> the same columns, one row
    per key) whenever ``REDUCE_ROWS`` have gathered: an associative reduction whose memory is
    its result plus ``REDUCE_ROWS`` rows."""

    def __init__(self, fold) -> None:
        self.fold = fold
        self.acc: pd.DataFrame | None = None
        self.parts: list[pd.DataFrame] = []
        self.rows = 0

    def add(self, rows: pd.DataFrame) -> None:
        if len(rows):
            self.parts.append(rows)
            self.rows += len(rows)
        if self.rows >= REDUCE_ROWS:
            self.result()

    def result(self) -> pd.DataFrame | None:
        if self.parts:
            self.acc = self.fold(pd.concat(([] if self.acc is None else [self.acc]) + self.parts,
                                           ignore_index=True))
            self.parts, self.rows = [], 0
        return self.acc


def clock_offsets(job) -> pd.DataFrame:
    """``clock.clock_offsets(job.collectives, ranks)``: each rank's offset to the lowest rank,
    holding the lowest rank's matchable collectives and one batch of ranks at a time."""
    ranks = [rt.rank for rt in job.ranks]
    if not ranks:
        return clock.offsets_frame([])
    ref = min(ranks)
    ref_rt = next(rt for rt in job.ranks if rt.rank == ref)
    ref_rows = clock.reference(
        clock.sequenced(job.rank_table(ref_rt, "collectives", _OFFSET_COLS)), ref)
    shared: set[tuple] = set()  # the reference's instances some other rank also ran
    rows = []
    counts = _Reduction(clock.rule_counts)  # the matching rule's note (clock.match_rule)
    for held, coll in job.batches("collectives", _OFFSET_COLS):
        every = clock.sequenced(coll)
        counts.add(clock.rule_counts(every))
        seq = every[every["rank"] != ref]
        mine = seq.merge(ref_rows, on=clock.KEY) if len(seq) and len(ref_rows) else \
            pd.DataFrame(columns=[*seq.columns, "ref_start_ns", "ref_end_ns"])
        shared.update(mine[clock.KEY].itertuples(index=False, name=None))
        by_rank = dict(iter(mine.groupby("rank", sort=False))) if len(mine) else {}
        empty = mine.iloc[:0]
        rows += [None if rt.rank == ref else clock.offset_row(rt.rank, by_rank.get(rt.rank, empty))
                 for rt in held]
    acc = counts.result()
    rule = clock.match_rule(acc) if acc is not None and len(ranks) > 1 else ""
    rows = [clock.reference_row(ref, len(shared), rule) if r is None else r for r in rows]

    def estimate(usable: dict[int, int], todo: list[int]) -> dict[int, tuple]:
        """Relays (analyzer/analyses/clock.py): the usable ranks' rows folded to one per
        instance, batch by batch, then each ``todo`` rank against them."""
        red = _Reduction(lambda t: clock.relay_base(t, usable))
        for _, coll in job.batches("collectives", _OFFSET_COLS):
            red.add(clock.relay_base(clock.sequenced(coll[coll["rank"].isin(list(usable))]),
                                     usable))
        acc = red.result()
        base = acc.drop(columns="rank") if acc is not None else \
            pd.DataFrame(columns=[*clock.KEY, "ref_start_ns", "ref_end_ns"])
        out = {}
        for held, coll in job.batches("collectives", _OFFSET_COLS):
            seq = clock.sequenced(coll[coll["rank"].isin(todo)])
            mine = seq.merge(base, on=clock.KEY) if len(seq) and len(base) else \
                pd.DataFrame(columns=[*seq.columns, "ref_start_ns", "ref_end_ns"])
            for rt in held:
                if rt.rank in todo:
                    out[rt.rank] = clock.offset_row(rt.rank, mine[mine["rank"] == rt.rank])
        return out

    return clock.offsets_frame(clock.relayed(rows, estimate))


def instances(job, offsets: pd.DataFrame) -> pd.DataFrame:
    """``commsplit.latest_starts`` over every rank of ``job`` (aligned by ``offsets``; ranks
    whose clock is not usable left out), indexed by (pg, kind, seq)."""
    red = _Reduction(lambda t: latest_starts(t).reset_index())
    for _, coll in job.batches("collectives", ["rank", "pg", "kind", "start_ns", "dur_ns", "seq",
                                               "seq_source"]):
        if len(coll):  # as latest_starts' own rows, so that every column stays int64
            keys = instance_keys(coll, offsets)
            keys = keys[keys["usable"]]
            red.add(pd.DataFrame({"pg": keys["pg"], "kind": keys["kind"], "seq": keys["seq"],
                                  "latest": keys["start"], "first_end": keys["end"],
                                  "last_end": keys["end"], "min_dur": keys["dur"],
                                  "n_ranks": 1}))
    acc = red.result()
    if acc is None:
        return latest_starts(pd.DataFrame({"pg": [], "kind": [], "seq": [], "start": [],
                                           "end": [], "dur": []}))
    return acc.set_index(["pg", "kind", "seq"])


def each_split(job, offsets: pd.DataFrame, inst: pd.DataFrame
               ) -> Iterator[tuple[list, pd.DataFrame, pd.DataFrame]]:
    """(the batch's rank tables, their collectives, ``wait_transfer`` of them against every
    rank's ``inst``) per batch of ranks, in rank order."""
    for held, coll in job.batches("collectives"):
        yield held, coll, wait_transfer(coll, offsets, inst)


def joined(parts: list[pd.DataFrame], columns: list[str] | None = None) -> pd.DataFrame:
    """The frames ``parts`` one below the other (fresh index); empty frames left out
    (``columns``: an all-empty result's)."""
    keep = [p for p in parts if len(p)]
    if not keep:
        return pd.DataFrame(columns=columns if columns is not None else
                            (parts[0].columns if parts else []))
    return pd.concat(keep, ignore_index=True)


def comm_parts(job, offsets: pd.DataFrame, rank_steps: pd.Series
               ) -> dict[str, pd.DataFrame] | None:
    """The pieces ``analyzer/compare/runs.py`` builds the communication figures from, each the
    concatenation in rank order of what the named function gives on a batch of ranks, over the
    collectives of profiled steps only (``step`` >= 0: a collective launched outside every
    ProfilerStep is left out of these tables, as the step notes say, analyzer/ingest/steps.py
    rule 3; in whole-trace mode every collective is step 0's): whole (``by_kind``), unknown
    (per kind: instances without bytes), ranks (``rank_kind_split``),
    moved (``by_kind`` with transfer time as the duration), groups (per rank, kind, pg and
    dtype: count, time_ns, bytes, known, bus_bytes, bus_time_ns, transfer_bus_bytes,
    transfer_bus_time_ns, group_sizes, pg_ranks), dims (``meshdims.dim_parts``: per rank,
    kind and process group, what the figures per mesh dimension are summed from). The
    wait / transfer split itself matches every collective, in steps or not (``instances``).
    None when no rank has a collective in a profiled step."""
    inst = instances(job, offsets)
    out: dict[str, list[pd.DataFrame]] = {k: [] for k in ("whole", "unknown", "ranks", "moved",
                                                          "groups", "dims")}
    for _, coll, split in each_split(job, offsets, inst):
        if len(coll):
            kept = coll["step"].to_numpy() >= 0
            coll = coll[kept].reset_index(drop=True)
            split = split[kept].reset_index(drop=True)
        if coll.empty:
            continue
        kind = coll["kind"].astype(str).to_numpy()
        out["whole"].append(by_kind(coll))
        out["unknown"].append(pd.DataFrame({"kind": kind, "unknown": coll["bytes"].to_numpy() < 0})
                              .groupby("kind", sort=True)["unknown"].sum().reset_index())
        out["ranks"].append(rank_kind_split(coll, split, rank_steps))
        moved = transfer_rows(coll, split)
        out["moved"].append(by_kind(moved))
        out["groups"].append(_group_part(coll, moved))
        out["dims"].append(dim_parts(coll, split))
        if len(out["whole"]) >= COMPACT_PARTS:  # a small frame costs ~1 kB a column: join
            out = {k: [joined(v)] for k, v in out.items()}
    if not out["whole"]:
        return None
    return {k: joined(v) for k, v in out.items()}


def transfer_rows(coll: pd.DataFrame, split: pd.DataFrame) -> pd.DataFrame:
    """``coll`` with dur_ns = transfer_ns and, on the rows not measured, bytes -1 (unknown),
    so that ``by_kind`` gives busbw from the measured instances' transfer time only."""
    measured = split["measured"].to_numpy()
    return coll.assign(dur_ns=split["transfer_ns"].to_numpy(),
                       bytes=np.where(measured, coll["bytes"].to_numpy(dtype=np.int64), -1))


def _group_part(coll: pd.DataFrame, moved: pd.DataFrame) -> pd.DataFrame:
    """Sums per (rank, kind, pg, dtype) in that order: ``by_kind`` with the rank column replaced
    by the cell's code, so bus bytes are summed exactly as ``by_kind`` sums them per rank."""
    kind = coll["kind"].astype(str).to_numpy()  # as str: a row without a kind is "nan" here
    codes, uniq = pd.factorize(pd.MultiIndex.from_arrays(
        [coll["rank"].to_numpy(), kind, coll["pg"].to_numpy(), coll["dtype"].to_numpy()]),
        sort=True)
    k = by_kind(coll.assign(rank=codes, kind=kind))
    t = by_kind(moved.assign(rank=codes, kind=kind))
    cells = pd.DataFrame({"g": codes, "known": coll["bytes"].to_numpy() >= 0,
                          "gs": coll["group_size"].to_numpy(),
                          "pr": coll["pg_ranks"].to_numpy()}).groupby("g", sort=True)
    extra = cells.agg(known=("known", "sum"), group_sizes=("gs", lambda s: frozenset(s.tolist())),
                      pg_ranks=("pr", lambda s: frozenset(s.tolist())))
    g = k["rank"].to_numpy()
    return pd.DataFrame({
        "rank": [uniq[i][0] for i in g], "kind": [uniq[i][1] for i in g],
        "pg": [uniq[i][2] for i in g], "dtype": [uniq[i][3] for i in g],
        "count": k["count"].to_numpy(), "time_ns": k["time_ns"].to_numpy(),
        "bytes": k["bytes"].clip(lower=0).to_numpy(), "known": extra.loc[g, "known"].to_numpy(),
        "bus_bytes": k["bus_bytes"].to_numpy(), "bus_time_ns": k["bus_time_ns"].to_numpy(),
        "transfer_bus_bytes": t["bus_bytes"].to_numpy(),
        "transfer_bus_time_ns": t["bus_time_ns"].to_numpy(),
        "group_sizes": extra.loc[g, "group_sizes"].to_numpy(),
        "pg_ranks": extra.loc[g, "pg_ranks"].to_numpy()})


def kind_table(job) -> pd.DataFrame:
    """``by_kind`` of ``job.collectives``' rows in profiled steps (``step`` >= 0, as
    ``comm_parts``), a batch of ranks at a time."""
    return joined([by_kind(c, rows=c["step"].to_numpy() >= 0)
                   for _, c in job.batches("collectives")],
                  ["rank", "kind", "count", "time_ns", "bytes", "algbw_gbps", "busbw_gbps",
                   "bus_bytes", "bus_time_ns"])


def _fold_instances(t: pd.DataFrame) -> pd.DataFrame:
    """``match_ranks``' per-(pg, seq) reduction of rows with the same columns."""
    last = (t.sort_values(["last_start", "straggler_rank"], ascending=[False, True],
                          kind="stable")
            .drop_duplicates(["pg", "seq"]).set_index(["pg", "seq"])["straggler_rank"])
    g = t.groupby(["pg", "seq"], sort=True).agg(
        n_ranks=("n_ranks", "sum"), start_ns=("start_ns", "min"),
        last_start=("last_start", "max"), transfer_ns=("transfer_ns", "min"),
        max_wait_ns=("max_wait_ns", "max"), all_measured=("all_measured", "all"))
    g["straggler_rank"] = last.reindex(g.index)
    return g.reset_index()


def match_ranks(job, offsets: pd.DataFrame) -> pd.DataFrame:
    """``collectives.match_ranks(job.collectives, offsets)``, a batch of ranks at a time: per
    (pg, seq) the first and last aligned start (the last's lowest rank on a tie, as ``idxmax``
    over the rank-ordered table), the shortest transfer, the longest wait, whether every row
    is measured, the ranks, and per kind the ranks that ran it (the kind is their mode, ties
    to the smallest name); ranks whose clock is not usable left out."""
    inst = instances(job, offsets)
    shift = dict(zip(offsets["rank"].astype(int), offsets["offset_ns"].astype(int)))
    bad = clock.unusable_ranks(offsets)
    extremes = _Reduction(_fold_instances)
    kinds = _Reduction(lambda t: t.groupby(["pg", "seq", "kind"], sort=True)["n"].sum()
                       .reset_index())
    for _, coll, split in each_split(job, offsets, inst):
        if bad and len(coll):
            keep = ~coll["rank"].isin(bad).to_numpy()
            coll, split = coll[keep], split[keep]
        if coll.empty:
            continue
        rank = coll["rank"].to_numpy(dtype=np.int64)
        start = coll["start_ns"].to_numpy(dtype=np.int64) - np.array(
            [shift.get(int(r), 0) for r in rank], np.int64)
        extremes.add(pd.DataFrame({
            "pg": coll["pg"].to_numpy(), "seq": coll["seq"].to_numpy(), "n_ranks": 1,
            "start_ns": start, "last_start": start, "transfer_ns": split["transfer_ns"].to_numpy(),
            "max_wait_ns": split["wait_ns"].to_numpy(), "straggler_rank": rank,
            "all_measured": split["measured"].to_numpy()}))
        kinds.add(pd.DataFrame({"pg": coll["pg"].to_numpy(), "seq": coll["seq"].to_numpy(),
                                "kind": coll["kind"].to_numpy(), "n": 1}))
    acc, counts = extremes.result(), kinds.result()
    if acc is None:
        return pd.DataFrame(columns=MATCH_COLUMNS)
    top = (counts.sort_values(["pg", "seq", "n", "kind"], ascending=[True, True, False, True],
                              kind="stable")
           .drop_duplicates(["pg", "seq"]).set_index(["pg", "seq"])["kind"])
    nkinds = counts.groupby(["pg", "seq"])["kind"].nunique()
    out = acc.set_index(["pg", "seq"])
    out["kind"] = top.reindex(out.index)
    out["kinds_agree"] = nkinds.reindex(out.index) == 1
    return finish_matches(out.reset_index())


def prefetch_parts(job) -> tuple[pd.DataFrame, dict] | None:
    """Per FSDP unit (phase, unit; in order of first appearance over the ranks in rank order):
    n, and sums / counts of prefetched, comm_ns, hidden_frac and slack_ns, min slack_ns; plus
    the run-level sums (all_gathers, prefetched, comm_ns, hidden_ns, hidden_frac time-weighted,
    late: slack < 0, unknown: no slack, wait_ns: -slack over the late ones, labels). None when
    no rank has a row."""
    units: pd.DataFrame | None = None
    total = {"all_gathers": 0, "prefetched": 0, "comm_ns": 0, "hidden_ns": 0, "late": 0,
             "unknown": 0, "wait_ns": 0, "labels": None}
    for _, pf in job.batches("prefetch"):
        if pf.empty:
            continue
        part = pf.groupby(["phase", "unit"], sort=False).agg(
            n=("rank", "size"), prefetched_sum=("prefetched", "sum"),
            prefetched_n=("prefetched", "count"), comm_ns_sum=("comm_ns", "sum"),
            comm_ns_n=("comm_ns", "count"), hidden_frac_sum=("hidden_frac", "sum"),
            hidden_frac_n=("hidden_frac", "count"), slack_ns_sum=("slack_ns", "sum"),
            slack_ns_n=("slack_ns", "count"), min_slack_ns=("slack_ns", "min"),
            **_extra_aggs(pf)).reset_index()
        part = part.astype({c: "float64" for c in part.columns if c.endswith("_sum")})
        units = part if units is None else (
            pd.concat([units, part], ignore_index=True).groupby(["phase", "unit"], sort=False)
            .agg({**{c: "sum" for c in part.columns if c not in ("phase", "unit") + _NOT_SUMMED},
                  **_NOT_SUMMED_AGG}).reset_index())
        slack = pf["slack_ns"].dropna()
        late = slack[slack < 0]
        total["all_gathers"] += len(pf)
        total["prefetched"] += int(pf["prefetched"].sum())
        total["comm_ns"] += int(pf["comm_ns"].sum())
        total["hidden_ns"] += int(pf["hidden_ns"].sum())
        total["late"] += len(late)
        total["unknown"] += len(pf) - len(slack)
        total["wait_ns"] += int(-late.sum())
        if total["labels"] is None:
            total["labels"] = str(pf["labels"].iloc[0])
    if units is None:
        return None
    comm = total["comm_ns"]
    total["hidden_frac"] = total["hidden_ns"] / comm if comm > 0 else None
    for c in ("prefetched", "comm_ns", "hidden_frac", "slack_ns"):
        units[c] = (units[f"{c}_sum"] / units[f"{c}_n"]).where(units[f"{c}_n"] > 0)
    one = units["min_group_size"] == units["max_group_size"]  # one group size, else None
    units["group_size"] = units["min_group_size"].where(one)
    units["ahead_units"] = units["max_ahead_units"]
    out = units[["phase", "unit", "n", "prefetched", "comm_ns", "hidden_frac", "slack_ns",
                 "min_slack_ns", "ahead_units", "group_size"]].astype(object)
    for c in ("ahead_units", "group_size"):  # ints or None (msgspec: int | None)
        out[c] = [None if pd.isna(v) else int(v) for v in out[c]]
    return out, total


_NOT_SUMMED = ("min_slack_ns", "max_ahead_units", "min_group_size", "max_group_size")
_NOT_SUMMED_AGG = {"min_slack_ns": "min", "max_ahead_units": "max", "min_group_size": "min",
                   "max_group_size": "max"}


def _extra_aggs(pf: pd.DataFrame) -> dict:
    """Per unit: the most units ahead its all_gathers were issued, the least and most ranks they
    gathered over (issue 45; ``PREFETCH_SCHEMA`` columns, so every table read has them)."""
    del pf
    return dict(max_ahead_units=("ahead_units", "max"), min_group_size=("group_size", "min"),
                max_group_size=("group_size", "max"))


def straggler_causes(job, offsets: pd.DataFrame, matched: pd.DataFrame | None = None,
                     by_kind: bool = True, limit: int | None = None) -> list:
    """``straggler.causes`` of the job's collectives (``instance_rows``, ``bounded``,
    ``split_instances``), a batch of ranks at a time (whole ranks: ``step_anchors`` reads a
    rank's first collective of each group): per instance the straggler's row and its first
    ``straggler.MEDIAN_PEERS`` peers' gap parts and step-start anchors (aligned by
    ``offsets``) are kept (at most MEDIAN_PEERS + 1 rows per instance), then split.
    ``matched``: ``match_ranks(job, offsets)`` (None: computed here); ``by_kind``, ``limit``:
    ``straggler.causes``' (None: ``straggler.MAX_ROWS``)."""
    from analyzer.analyses import straggler

    if matched is None:
        matched = match_ranks(job, offsets)
    red = _Reduction(straggler.bounded)
    for held, coll in job.batches("collectives", straggler.ANCHOR_COLUMNS):
        red.add(straggler.instance_rows(coll, matched, offsets,
                                        [rt.rank for rt in held if rt.whole_trace_mode]))
    rows = red.result()
    if rows is None:
        return []
    return straggler.causes(straggler.split_instances(straggler.bounded(rows)), by_kind,
                            straggler.MAX_ROWS if limit is None else limit)
