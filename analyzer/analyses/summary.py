"""The tables behind ``analyzer summary``: one function of a job's tables returning tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pandas as pd

from analyzer.contract.report_types import Finding


@dataclass(kw_only=True, slots=True)
class Summary:
    """Everything ``analyzer summary`` shows, as tables (units in column names)."""

    headline: list[str]
    """Lines: how ranks were found, "N of M ranks", whole-trace mode, warnings."""
    ranks: pd.DataFrame
    """rank, path, rank_source, device_kind, world_size, steps, whole_trace_mode."""
    breakdown: pd.DataFrame
    """``JobTables.breakdown`` (analyzer/analyses/breakdown.py COLUMNS)."""
    by_kind: pd.DataFrame
    """analyzer.analyses.collectives.by_kind of the job's collectives in profiled steps
    (``crossrank.kind_table``: those launched outside every ProfilerStep left out, as the
    headline's step notes say; in whole-trace mode all of them), ``busbw_gbps`` over the whole
    durations as report.json's, with ``transfer_busbw_gbps``: the same with each instance's
    transfer time (analyzer/analyses/commsplit.py), as report.json's."""
    offsets: pd.DataFrame
    """analyzer.analyses.clock.clock_offsets of the job's collectives (``clock.OFFSET_COLUMNS``:
    rank, offset_ns (applied), estimate_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent,
    clock): the clocks ``cross_rank`` and ``stragglers`` align."""
    cross_rank: pd.DataFrame
    """analyzer.analyses.collectives.match_ranks of the job's collectives, on aligned clocks
    (``measured`` False: skew, transfer, wait and straggler null)."""
    stragglers: pd.DataFrame
    """analyzer.analyses.collectives.stragglers (measured instances with skew > 0 only), with
    each rank's lateness over all kinds split as report.json's ``stragglers``
    (analyzer/analyses/straggler.py): cause (None: not established), largest_part (the
    largest named part), explained_frac (its share of the lateness) and the parts in ns (device_compute_ns, host_delay_ns,
    data_wait_ns, own_collective_ns, late_step_start_ns, unexplained_ns)."""
    crosscheck: pd.DataFrame | None = None
    """analyzer.compare.crosscheck_hta.compare when requested."""
    notes: list[str] = field(default_factory=list)
    """Cross-check remarks."""
    findings: list[Finding] = field(default_factory=list)
    """What ``analyzer report`` concludes for this job (analyzer/analyses/findings.py), most
    severe first: the CLI sets them (analyzer/compare/runs.py ``job_findings``, the report's
    rules on the same loaded tables); evidence paths point into that job's report.json."""

    def to_json(self) -> dict[str, Any]:
        """Plain JSON-able dict (NaN -> null)."""
        def records(df: pd.DataFrame | None):
            return None if df is None else [
                {k: (None if v is pd.NA or (isinstance(v, float) and math.isnan(v)) else
                     v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
                for rec in df.to_dict("records")]
        return {"headline": self.headline, "ranks": records(self.ranks),
                "breakdown": records(self.breakdown), "by_kind": records(self.by_kind),
                "clock_offsets": records(self.offsets), "cross_rank": records(self.cross_rank), "stragglers": records(self.stragglers),
                "crosscheck_hta": records(self.crosscheck), "notes": self.notes,
                "findings": msgspec.to_builtins(self.findings)}


SHOW_RANKS = 8
"""The partial-rank caveat names the missing ranks only when at most this many are missing."""


def partial_caveat(world_size: int | None, missing: list[int]) -> str:
    """"partial: 2 of 128 ranks have a trace" -- with the missing ranks' numbers only when
    there are at most ``SHOW_RANKS`` of them."""
    world = world_size if world_size is not None else len(missing)
    text = f"partial: {world - len(missing)} of {world} ranks have a trace"
    if len(missing) <= SHOW_RANKS:
        text += f" (no trace: rank{'s' if len(missing) > 1 else ''} " \
                f"{', '.join(str(r) for r in missing)})"
    return text


def summarize(job) -> Summary:
    """Build the summary tables of a loaded job (``analyzer.ingest.pipeline.JobTables``)."""
    from analyzer.analyses import clock, crossrank
    from analyzer.analyses.collectives import stragglers

    # a batch of ranks' collectives at a time (analyzer/analyses/crossrank.py)
    offsets = crossrank.clock_offsets(job)
    matched = crossrank.match_ranks(job, offsets)
    sources = sorted({r.rank_source for r in job.ranks})
    head = [f"{job.root}: {len(job.ranks)} of {job.world_size} ranks, rank from "
            f"{' / '.join(sources)}"]
    if job.missing_ranks:
        head.append(partial_caveat(job.world_size, job.missing_ranks))
    if job.whole_trace_mode:
        head.append("whole-trace mode: no ProfilerStep in the traces, step 0 = the launched "
                    "device work's extent on a GPU rank, the whole trace on a CPU rank")
    if len(offsets) > 1:
        head.append(f"start skew and stragglers on aligned clocks: rank r's offset to rank "
                    f"{int(offsets['rank'].min())} = median of (end on r - end on the reference) "
                    "over matched collectives (analyzer/analyses/clock.py)")
        for row in offsets.itertuples(index=False):
            note = clock.clock_note(row)
            if note is not None:
                head.append(note)
    bad = matched[matched["n_ranks"] > 1] if len(matched) else matched
    if len(bad) and not bad["measured"].all():
        n = int((~bad["measured"].astype(bool)).sum())
        head.append(f"{n} of {len(bad)} collectives matched across ranks by process group and "
                    "order are not one instance (kinds differ, ends further apart than the "
                    "shortest duration + 50 µs, or a rank ended before another started, on "
                    "aligned clocks): their skew, transfer, wait and straggler not measured")
    head += job.warnings
    for r in job.ranks:
        head += [f"rank {r.rank}: {w}" for w in r.warnings]
    ranks = pd.DataFrame([{"rank": r.rank, "path": str(r.path), "rank_source": r.rank_source,
                           "device_kind": r.device_kind, "world_size": r.world_size,
                           "steps": r.table("steps").num_rows, "whole_trace_mode": r.whole_trace_mode}
                          for r in job.ranks])
    return Summary(headline=head, ranks=ranks, breakdown=job.breakdown,
                   by_kind=_with_transfer_busbw(job, crossrank.kind_table(job), offsets),
                   offsets=offsets, cross_rank=matched,
                   stragglers=_with_causes(stragglers(matched),
                                           crossrank.straggler_causes(job, offsets, matched,
                                                                      by_kind=False)))


def _with_causes(table: pd.DataFrame, causes: list) -> pd.DataFrame:
    """``collectives.stragglers``' table with each rank's cause columns (``Summary.stragglers``;
    a rank without a split: cause None, the rest NaN)."""
    from analyzer.analyses.straggler import NAMED

    keys = [*NAMED, "unexplained"]
    by_rank = {c.rank: c for c in causes}
    rows = [by_rank.get(int(r)) for r in table["rank"]] if len(table) else []
    out = table.assign(
        cause=pd.Series([None if c is None else c.cause for c in rows], index=table.index,
                        dtype=object),
        largest_part=pd.Series([None if c is None else
                                max(NAMED, key=lambda k: (c.split_ns[k], -NAMED.index(k)))
                                for c in rows], index=table.index, dtype=object),
        explained_frac=pd.Series([None if c is None else c.explained_frac for c in rows],
                                 index=table.index, dtype="float64"))
    for k in keys:
        out[f"{k}_ns"] = pd.Series([None if c is None else c.split_ns[k] for c in rows],
                                   index=table.index, dtype="float64")
    return out


def _with_transfer_busbw(job, kinds: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """``kinds`` (``crossrank.kind_table``) with column transfer_busbw_gbps per (rank, kind):
    ``by_kind`` of the measured collectives with transfer time as the duration
    (``crossrank.transfer_rows``), the report's "busbw from transfer" per rank (one definition
    per name: analyzer/compare/runs.py); NaN where none is measured."""
    from analyzer.analyses import crossrank
    from analyzer.analyses.collectives import by_kind

    if kinds.empty:
        return kinds.assign(transfer_busbw_gbps=pd.Series(dtype="float64"))
    inst = crossrank.instances(job, offsets)
    moved = crossrank.joined(  # the rows kind_table counts: those of profiled steps
        [by_kind(crossrank.transfer_rows(coll, split), rows=coll["step"].to_numpy() >= 0)
         for _, coll, split in crossrank.each_split(job, offsets, inst) if len(coll)])
    t = moved[["rank", "kind", "busbw_gbps"]].rename(columns={"busbw_gbps": "transfer_busbw_gbps"})
    t = t.astype({"rank": kinds["rank"].dtype, "kind": str})
    out = kinds.assign(kind=kinds["kind"].astype(str)).merge(t, on=["rank", "kind"], how="left")
    return out.assign(transfer_busbw_gbps=out["transfer_busbw_gbps"].astype("float64"))
