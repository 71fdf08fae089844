"""The analysis behind ``analyzer report`` and ``gate``: the runs under a folder -> a ``Report``.

``analyse`` discovers the runs (analyzer/ingest/rundirs.py), checks each one's parity, loads its
traces' per-rank tables (``ingest.load_run``, cached) and summarises them (``summarize_run``),
then compares and ranks the runs (analyzer/compare/ranking.py) and checks their baselines for drift.
The renderers (reports/) only format the ``Report`` this returns.

Per-run figures from the traces: ``ranks[]`` are per-step means over the rank's profiled
steps; the run's ``overlap_frac`` = overlap / communication summed over ranks and steps;
``exposed_comm_ns`` = exposed communication per step, mean over ranks and steps; ``data`` =
the run's data supply (analyzer/analyses/datasupply.py); ``comm_ns_per_step`` = the union of a
rank's collective intervals per profiled step (breakdown comm_ns), mean over ranks and steps: the
run's communication per step, never above the step; ``communication[kind]`` = per-rank means of
all profiled steps' count (collectives launched outside every ProfilerStep left out,
analyzer/analyses/crossrank.py ``comm_parts``; without ProfilerStep the whole trace), time_ns (a sum of durations, labelled so) and bytes (None when unknown), and the run's busbw (nccl-tests: bus bytes over the
time combined across ranks, ``collectives.run_busbw_gbps``; not a mean of per-rank busbw),
plus ``count_per_step``, ``time_ns_per_step``, ``bytes_per_step``: collectives inside profiled
steps per rank divided by that rank's number of profiled steps, mean over ranks;
``profiled_steps`` = the most profiled steps of a rank; ``comm_groups`` = the same per (kind,
process group, dtype), all profiled steps, its per-rank means over the ranks that ran it (the
group's members), not the job's, and its mesh dimension; ``mesh_dims`` = the same per mesh
dimension (analyzer/analyses/meshdims.py: from pg_desc, else the manifest's mesh, else the
group's ranks), with the union of its collectives' intervals and the part of it no computation
overlaps. Communication split (analyzer/analyses/commsplit.py): per
rank and kind ``comm_ranks``, and in ``communication[kind]`` the per-rank means
``transfer_ns`` / ``wait_ns`` (all profiled steps; their sum is ``time_ns``), the same per profiled
step, and ``transfer_busbw_gbps`` (busbw with transfer time in place of the duration; in
``comm_groups`` too). Step times: steps.parquet's profiled steps (slowest rank's
wall time) when recorded, else the traces' step windows, slowest rank (analyzer/ingest/steps.py:
device windows on GPU ranks, ProfilerStep spans with their gloo work on CPU ranks). Steps that
launched no device work (``device_work`` False, empty windows) are left out of every mean,
median and count here.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pandas as pd

from analyzer.compare import drift, footprint, pipefigs, ranking
from analyzer.analyses import (clock, crossrank, datasupply, findings, memory, meshdims,
                               parity, prefetch)
from analyzer.ingest import cachekey, frdump, pipeline, rundirs, tablecache
from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.analyses.collectives import run_busbw_gbps
from analyzer.analyses.summary import partial_caveat
from analyzer.contract.report_types import (AnalysisOptions, CommGroup, CommKind, CommRank,
                                   Finding, Interval, Memory, MeshDimComm, Parity, Prefetch, PrefetchUnit,
                                   RankFigures, Report, RunEntry, StepBar, StepTime, Timeline,
                                   RANK_TIMELINES_MAX,
                                   TraceInfo)

RANK_MEANS = ["step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "data_wait_ns", "other_ns",
              "idle_ns"]
BAR_PARTS = ["step_ns", "compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]
_SAID = re.compile(r"^\d+ of \d+ ranks$|incomplete run")
"""Load notes that are already caveats."""


def _ranks(bd: pd.DataFrame, offsets: pd.DataFrame, device_kind: str) -> list[RankFigures]:
    per = bd.groupby("rank", sort=True).agg(
        steps=("step", "size"), **{c: (c, "mean") for c in RANK_MEANS},
        last_step_tail_ns=("last_step_tail_ns", "sum"),
        comm=("comm_ns", "sum"), overlap=("overlap_ns", "sum"), wait=("data_wait_ns", "sum"),
        total=("step_ns", "sum"), input_bound_steps=("input_bound", "sum"))
    per["overlap_frac"] = (per["overlap"] / per["comm"]).where(per["comm"] != 0)
    per["data_wait_frac"] = (per["wait"] / per["total"]).where(per["total"] != 0)
    per = per.drop(columns=["comm", "overlap", "wait", "total"])
    state = {int(o.rank): str(o.clock) for o in offsets.itertuples(index=False)}
    off = {int(o.rank): int(o.offset_ns) for o in offsets.itertuples(index=False)
           if o.clock in ("reference", "measured")}
    many = len(offsets) > 1
    # one row per rank holds the tail (its last step with device work), the others 0
    per["last_step_tail_ns"] = [int(v) if device_kind == "gpu" else None
                                for v in per["last_step_tail_ns"].tolist()]
    return [RankFigures(rank=int(r), clock_offset_ns=off.get(int(r)) if many else None,
                        clock=state.get(int(r)) if many else None, **row)
            for r, row in per.to_dict("index").items()]


def _with_work(ranks: list[RankFigures], comm_ranks: list[CommRank]) -> list[RankFigures]:
    """``ranks`` with ``transfer_ns`` (the sum of the rank's ``comm_ranks[]
    .transfer_ns_per_step`` over its measured kinds: 0 without collectives, None when none is
    measured) and ``work_ns`` = compute_ns + transfer_ns (None if either is)."""
    by: dict[int, list[float]] = {}
    unmeasured: set[int] = set()
    for c in comm_ranks:
        if c.transfer_ns_per_step is not None:
            by.setdefault(c.rank, []).append(c.transfer_ns_per_step)
        elif c.measured == 0:
            unmeasured.add(c.rank)
    out = []
    for x in ranks:
        transfer = (sum(by[x.rank]) if x.rank in by else
                    None if x.rank in unmeasured else 0.0)
        out.append(msgspec.structs.replace(
            x, transfer_ns=transfer, work_ns=None if transfer is None or x.compute_ns is None
            else x.compute_ns + transfer))
    return out


def _communication(parts: dict[str, pd.DataFrame] | None, rank_steps: pd.Series, n_ranks: int
                   ) -> tuple[dict[str, CommKind], list[CommRank]]:
    """(``communication`` per kind, ``comm_ranks``: module docstring) from the per-rank pieces
    of ``crossrank.comm_parts`` (None: no collective)."""
    if parts is None:
        return {}, []
    n = max(n_ranks, 1)
    cols = ["count", "time_ns", "bytes"]
    whole = parts["whole"]  # collectives inside profiled steps only
    # per profiled step: a rank's collectives over its number of steps (NaN: none)
    per_rank = whole[cols].clip(lower=0).astype(float).div(whole["rank"].map(rank_steps), axis=0)
    per_rank["known"] = (whole["bytes"] >= 0).to_numpy()
    per_step = per_rank.groupby(whole["kind"].astype(str).to_numpy()).sum()
    per_step[cols] = per_step[cols] / n
    whole["kind"] = whole["kind"].astype(str)
    whole["known"] = whole["bytes"] >= 0  # -1: no instance with known bytes
    whole["bytes"] = whole["bytes"].clip(lower=0)
    totals = whole.groupby("kind", sort=True)[[*cols, "bus_bytes", "bus_time_ns", "known"]].sum()
    unknown = parts["unknown"].groupby("kind")["unknown"].sum()

    def step_figure(kind: str, c: str) -> float | None:
        if kind not in per_step.index or (c == "bytes" and not per_step.at[kind, "known"]):
            return None
        return float(per_step.at[kind, c])

    ranks = parts["ranks"]
    split = ranks.groupby("kind")[["transfer_ns", "wait_ns", "not_measured_ns",
                                   "transfer_ns_per_step", "wait_ns_per_step",
                                   "not_measured_ns_per_step"]].sum(min_count=1) / n
    # no measured instance of a kind: its transfer and wait are not measured (None), not 0
    none_measured = ranks.groupby("kind")["measured"].sum() == 0
    split.loc[none_measured.reindex(split.index, fill_value=True).to_numpy(),
              ["transfer_ns", "wait_ns", "transfer_ns_per_step", "wait_ns_per_step"]] = float("nan")
    moved = parts["moved"]
    moved["kind"] = moved["kind"].astype(str)
    tbus = moved.groupby("kind")[["bus_bytes", "bus_time_ns"]].sum()

    def part(kind: str, c: str) -> float | None:
        v = split.at[kind, c] if kind in split.index else None
        return None if v is None or pd.isna(v) else float(v)

    return {
        kind: CommKind(count=t["count"] / n, time_ns=t["time_ns"] / n,
                       bytes=t["bytes"] / n if t["known"] else None,
                       unknown_bytes=int(unknown.get(kind, 0)),
                       busbw_gbps=run_busbw_gbps(t["bus_bytes"], t["bus_time_ns"]),
                       transfer_busbw_gbps=run_busbw_gbps(tbus.at[kind, "bus_bytes"],
                                                          tbus.at[kind, "bus_time_ns"]),
                       **{f"{c}_per_step": step_figure(kind, c) for c in cols},
                       **{c: part(kind, c) for c in split.columns})
        for kind, t in totals.to_dict("index").items()}, [
        _comm_rank(row)
        for row in ranks.astype({"rank": int, "count": int, "time_ns": int, "transfer_ns": int,
                                 "wait_ns": int, "not_measured_ns": int, "unmatched": int,
                                 "inconsistent": int, "measured": int}).to_dict("records")]


def _comm_rank(row: dict) -> CommRank:
    """A ``rank_kind_split`` row as a ``CommRank``: NaN as None, and transfer and wait None
    (not measured) when none of the rank's instances of the kind is measured."""
    row = {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in row.items()}
    if row["measured"] == 0:
        for c in ("transfer_ns", "wait_ns", "transfer_ns_per_step", "wait_ns_per_step"):
            row[c] = None
    return CommRank(**row)


def _comm_groups(parts: dict[str, pd.DataFrame] | None, dims: dict[str, tuple[str, str]]
                 ) -> list[CommGroup]:
    """Per (kind, process group, dtype) over all profiled steps (``CommGroup``): what shows a bf16
    vs an fp32 reduction, or a half-world process group, that the per-kind figures mix.
    ``parts``: ``crossrank.comm_parts`` (its ``groups``: per rank, in rank order). Per-rank
    means are over the ranks that ran it (the ranks with rows for that kind, group and dtype:
    the group's members in the traces), not over every rank of the job: an all_gather of a
    group of 8 in a 16-rank job is not halved by the 8 ranks outside it. ``dims``: pg -> (mesh
    dimension, source), ``meshdims.group_dims``."""
    if parts is None:
        return []
    out = []
    for (kind, pg, dtype), g in parts["groups"].groupby(["kind", "pg", "dtype"], sort=True):
        sizes = sorted(frozenset().union(*g["group_sizes"]))
        pg_ranks = frozenset().union(*g["pg_ranks"])
        known = int(g["known"].sum())
        n = int(g["rank"].nunique())
        out.append(CommGroup(
            kind=kind, pg=str(pg), dtype=str(dtype),
            pg_ranks=str(next(iter(pg_ranks))) if len(pg_ranks) == 1 else "various",
            group_size=int(sizes[0]) if len(sizes) == 1 and sizes[0] > 0 else None,
            n_ranks=n, count=int(g["count"].sum()) / n, time_ns=float(g["time_ns"].sum()) / n,
            bytes=float(g["bytes"].sum()) / n if known else None,
            unknown_bytes=int(g["count"].sum()) - known,
            busbw_gbps=run_busbw_gbps(g["bus_bytes"].to_numpy(), g["bus_time_ns"].to_numpy()),
            transfer_busbw_gbps=run_busbw_gbps(g["transfer_bus_bytes"].to_numpy(),
                                               g["transfer_bus_time_ns"].to_numpy()),
            mesh_dim=dims.get(str(pg), (meshdims.UNKNOWN, "none"))[0],
            mesh_dim_source=dims.get(str(pg), (meshdims.UNKNOWN, "none"))[1]))
    return out


def _rank_timelines(tables, bd: pd.DataFrame, offsets: pd.DataFrame) -> list[Timeline]:
    """Every rank's timeline of the lowest rank's first profiled step (``RunEntry.
    rank_timelines``): intervals from the rank's own step start, ``start_ns`` = that start on
    aligned clocks (trace clock minus the rank's measured clock offset, as ``_ranks`` reports
    it) minus the earliest rank's."""
    r0 = int(bd["rank"].min())
    step = int(bd[bd["rank"] == r0]["step"].min())
    off = {int(o.rank): int(o.offset_ns) for o in offsets.itertuples(index=False)
           if o.clock in ("reference", "measured")} if len(offsets) > 1 else {}
    rows = bd[bd["step"] == step].sort_values("rank").head(RANK_TIMELINES_MAX)
    out = []
    for r in rows.itertuples(index=False):
        try:
            ivs = tables.timeline(int(r.rank), step)
        except KeyError:  # this rank's first profiled step is another one
            continue
        t0 = int(r.step_start_ns)
        out.append((t0 - off.get(int(r.rank), 0), Timeline(
            rank=int(r.rank), step=step, step_ns=int(r.step_ns), intervals=[
                Interval(lane=str(i.lane), kind=str(i.kind or ""), start_ns=int(i.start_ns) - t0,
                         end_ns=int(i.end_ns) - t0) for i in ivs.itertuples()])))
    first = min((a for a, _ in out), default=0)
    for aligned, tl in out:
        tl.start_ns = aligned - first
    return [tl for _, tl in out]


def _prefetch(tables, device_kind: str) -> Prefetch | None:
    found = crossrank.prefetch_parts(tables)
    if found is None:
        return None
    units, total = found
    return Prefetch(**total, note=prefetch.CPU_NOTE if device_kind == "cpu" else None,
                    units=[PrefetchUnit(**u) for u in units.to_dict("records")])


def _kernels_per_step(bd) -> float | msgspec.UnsetType:
    """Kernels per rank per profiled step (``RunEntry.compute_kernels_per_step``): the mean of
    the breakdown's ``compute_kernels`` over the steps with device work; UNSET without one."""
    bd = bd[(bd["step"] >= 0) & bd["device_work"].astype(bool)]
    return float(bd["compute_kernels"].mean()) if len(bd) else msgspec.UNSET


def _trace_figures(tables) -> tuple[dict, list[int], list[str]]:
    """(RunEntry fields from the traces, the slowest rank's time of each profiled step in ns,
    the loader's notes). ``tables``: ``ingest.load_run``'s result."""
    bd = tables.breakdown
    bd = bd[(bd["step"] >= 0) & bd["device_work"].astype(bool)]
    device_kind = next((r.device_kind for r in tables.ranks if not r.empty), "cpu")
    by_step = bd.groupby("step", sort=True)
    comm_total = int(bd["comm_ns"].sum())
    # per-rank means over the ranks that recorded events: an empty (metadata-only) rank is
    # named in a note, not averaged in as a rank that communicated nothing
    n_ranks = sum(1 for r in tables.ranks if not r.empty)
    # the cross-rank phase reads a batch of ranks at a time (analyzer/analyses/crossrank.py)
    offsets = crossrank.clock_offsets(tables)
    rank_steps = bd.groupby("rank")["step"].nunique()
    profiled = int(rank_steps.max()) if len(rank_steps) else 0
    parts = crossrank.comm_parts(tables, offsets, rank_steps)
    comm, comm_ranks = _communication(parts, rank_steps, n_ranks)
    mesh = tables.manifest.mesh if tables.manifest is not None else None
    dim_rows = parts["dims"] if parts is not None else None
    clock_notes = [n for n in (clock.clock_note(o) for o in offsets.itertuples(index=False))
                   if n is not None] if len(offsets) > 1 else []
    timelines = _rank_timelines(tables, bd, offsets) if len(bd) else []
    fields = dict(
        communication=comm, profiled_steps=profiled, comm_ranks=comm_ranks,
        comm_groups=_comm_groups(parts, meshdims.group_dims(dim_rows, tables.world_size, mesh)),
        mesh_dims=[MeshDimComm(**d) for d in
                   meshdims.dim_table(dim_rows, rank_steps, tables.world_size, mesh)],
        comm_ns_per_step=float(bd["comm_ns"].mean()) if len(bd) else None,
        overlap_frac=float(bd["overlap_ns"].sum() / comm_total) if comm_total else None,
        exposed_comm_ns=float(bd["exposed_comm_ns"].mean()) if len(bd) else None,
        ranks=_with_work(_ranks(bd, offsets, device_kind), comm_ranks),
        stragglers=crossrank.straggler_causes(tables, offsets),
        prefetch=_prefetch(tables, device_kind),
        steps=[StepBar(step=int(s), **row)
               for s, row in by_step[BAR_PARTS].mean().to_dict("index").items()],
        timeline=msgspec.structs.replace(timelines[0], start_ns=0) if timelines else None,
        rank_timelines=timelines,
        exposed_comm_step_ns=[float(v) for v in by_step["exposed_comm_ns"].mean().tolist()],
        trace_info=TraceInfo(whole_trace_mode=tables.whole_trace_mode,
                             rank_sources=sorted({r.rank_source for r in tables.ranks}),
                             missing_ranks=tables.missing_ranks, device_kind=device_kind,
                             trace_warnings=[f"rank {r.rank}: {w}" for r in tables.ranks
                                             for w in r.warnings][:40]))
    fields["caveats"] = clock_notes  # added to the entry's caveats (summarize_run)
    return fields, by_step["step_ns"].max().tolist(), list(tables.warnings)


def trace_backend(tables) -> str | None:
    """The communication backend foreign traces show: distributedInfo.backend when a rank's
    trace names it (the same-job check refuses traces that disagree), else "gloo" when the
    communication is gloo runloop ops (analyzer/ingest/classify.py rule ``cpu.gloo_op``), else
    None: the traces do not tell (an MTIA or CUPTI-range trace is not a gloo record because it
    has no GPU kernel)."""
    named = sorted({b for r in tables.ranks if (b := r.dist.backend) is not None})
    if named:
        return named[0]
    for _, coll in tables.batches("collectives", ["rule"]):
        if coll["rule"].astype(str).str.startswith("cpu.gloo_op").any():
            return "gloo"
    return None


def _cross_rank_caveats(entry: RunEntry) -> list[str]:
    """What the cross-rank figures of ``entry`` leave out: instances matched by order but
    outside the one-instance bound (analyzer/analyses/clock.py ``one_instance``), per kind."""
    out = []
    by_kind: dict[str, int] = {}
    for c in entry.comm_ranks:
        if c.inconsistent:
            by_kind[c.kind] = by_kind.get(c.kind, 0) + c.inconsistent
    for kind, n in sorted(by_kind.items()):
        out.append(f"{n} {kind} calls (over all ranks) matched by process group, kind and order "
                   "are not one collective (ends further apart than the shortest duration + "
                   "50 µs, or one rank ended before another started, on aligned clocks): "
                   "their wait/transfer, skew and straggler not measured")
    return out


def trace_step_source(tables) -> str:
    """What the traces' step times are, in words (module docstring)."""
    if tables.whole_trace_mode:
        return ("traces: no ProfilerStep, one step: the launched device work's extent on GPU "
                "ranks, the whole trace on CPU ranks; slowest rank")
    if any(r.device_kind == "gpu" for r in tables.ranks):
        return ("traces: device windows (first device work launched by the step to the next "
                "step's; the last step's to its first device work + its CPU span, or to its last "
                "device work if later), slowest rank")
    return ("traces: CPU ProfilerStep spans extended to the end of their gloo work, slowest "
            "rank")


def _steps_and_memory(run: rundirs.RunDir, tables, options: AnalysisOptions
                      ) -> tuple[list[int], Memory]:
    """(profiled step times from steps.parquet, slowest rank's wall time, in ns; the run's
    memory, analyzer/compare/footprint.py)."""
    path = run.path / schemas.STEPS_NAME
    steps = memory.read_steps(path) if run.manifest is not None and path.exists() else None
    mem = footprint.run_memory(run, steps, tables, options)
    if steps is None:
        return [], mem
    st = memory.step_times(steps)
    return st.loc[st["profiled"], "step_ns"].tolist(), mem


PROJECTION_PARITY = "projection: the fake process group moves no data"
"""The parity reason of a ``tracer project`` run (manifest ``projection``, issue 44; the
reports say "not verified (<reason>)" for a run without a verdict): its
collectives ran on torch's fake process group (torch/testing/_internal/distributed/fake_pg.py),
which returns without moving data, so its numbers are not the job's: neither pass nor fail."""


def _parity(run: rundirs.RunDir, options: AnalysisOptions) -> Parity:
    if run.manifest is not None and run.manifest.projection is not None:
        return Parity(status="not_recorded", reason=PROJECTION_PARITY)
    res = parity.check_run(run.path, run.manifest, options.tolerance)
    if run.incomplete:
        res.reason = "incomplete run (no manifest.json): parity not checked"
    return res


def summarize_run(run: rundirs.RunDir, tables, options: AnalysisOptions) -> RunEntry:
    """The report entry of one run: parity, step times, memory and, from ``tables`` (its traces'
    per-rank tables, ``ingest.load_run``; None when it has no trace), the trace figures (module
    docstring). Raises ``BadInput`` for a malformed numerics, steps or memory file."""
    m = run.manifest
    step_ns, mem = _steps_and_memory(run, tables, options)
    source = "steps.parquet: profiled steps, slowest rank's wall time" if step_ns else None
    entry = RunEntry(
        name=run.name, path=str(run.path), strategy=run.strategy,
        **({} if m is None else dict(
            options=m.strategy_options, fault=m.fault, world_size=m.world_size, backend=m.backend,
            device=m.device.type, settings={k: msgspec.to_builtins(getattr(m, k)) for k in ranking.SETTINGS},
            experiment=msgspec.to_builtins(m.experiment) if m.experiment else None,
            machine=msgspec.to_builtins(m.machine) if m.machine else None,
            projection=msgspec.to_builtins(m.projection) if m.projection else None,
            **({} if m.compile_warmup is None else
               {"compile_warmup": msgspec.to_builtins(m.compile_warmup)}))),
        parity=_parity(run, options), traces=[str(p) for p in run.traces], memory=mem,
        incomplete=run.incomplete,
        data=datasupply.data_summary(None if tables is None else tables.breakdown, run.manifest),
        caveats=["incomplete run (no manifest.json), analysed as found"] if run.incomplete else [])
    notes = []
    if tables is not None:
        fields, trace_step_ns, notes = _trace_figures(tables)
        clock_caveats = fields.pop("caveats")
        # order matching with nothing amiss is how every gloo trace is matched: said once per
        # run among its notes, not on the first screen (a window shift stays a caveat)
        notes = list(notes) + [c for c in clock_caveats if c == clock.ORDER_FALLBACK]
        clock_caveats = [c for c in clock_caveats if c != clock.ORDER_FALLBACK]
        for k, v in fields.items():
            setattr(entry, k, v)
        if m is not None and m.experiment is not None and m.experiment.settings is not None:
            entry.compute_kernels_per_step = _kernels_per_step(tables.breakdown)
        if entry.world_size is None:
            entry.world_size = tables.world_size
            entry.device = "cuda" if entry.trace_info.device_kind == "gpu" else "cpu"
        if m is None:
            entry.backend = trace_backend(tables)
        if not step_ns and trace_step_ns:
            step_ns, source = trace_step_ns, trace_step_source(tables)
        if tables.missing_ranks:
            entry.caveats.append(partial_caveat(entry.world_size, tables.missing_ranks))
        entry.caveats += clock_caveats + _cross_rank_caveats(entry)
        if tables.whole_trace_mode:
            entry.caveats.append("whole-trace mode: no ProfilerStep in the traces, step 0 = the "
                                 "launched device work's extent on a GPU rank, the whole trace "
                                 "on a CPU rank")
    entry.pipeline = pipefigs.run_pipeline(tables, m)
    stated = m is not None or (tables is not None and any(r.world_size is not None for r in tables.ranks))
    entry.flight_recorder = frdump.flight_recorder(run.fr_dumps, entry.world_size,  # issue 30
                                                   world_stated=stated, pickles=run.fr_pickles)
    entry.caveats += [frdump.pickle_line(p) for p in run.fr_pickles]  # never read: said where seen
    if m is not None and m.projection is not None and options.link_model and tables is not None:
        from analyzer.analyses.linkmodel import read_link_table
        from analyzer.compare.projection import projected_step

        links = read_link_table(options.link_model)
        entry.projected_step = projected_step(run, tables, links.curves, arrival=links.arrival,
                                              ranks_per_node=options.ranks_per_node,
                                              links_from=", ".join(options.link_model))
    stats = memory.step_stats(step_ns)
    entry.step_time_ns = StepTime(median=stats["median"], p90=stats["p90"], n=stats["n"],
                                  min=min(step_ns, default=None), max=max(step_ns, default=None),
                                  source=source, values_ns=[int(v) for v in step_ns])
    entry.notes = [n for n in notes if not _SAID.search(n)] + (
        entry.trace_info.trace_warnings if entry.trace_info else [])
    return entry


def analyse(root: Path | str, options: AnalysisOptions = AnalysisOptions()) -> Report:
    """Discover the runs under ``root`` and build the whole report, its findings last
    (analyzer/analyses/findings.py). Raises ``BadInput``."""
    found = rundirs.discover(root, allow_incomplete=options.allow_incomplete)
    if options.link_model:  # read now: a bad file is refused even where no projection uses it
        from analyzer.analyses.linkmodel import read_link_table

        read_link_table(options.link_model)
        if not any(r.manifest is not None and r.manifest.projection is not None
                   for r in found.runs):
            found.warnings.append("--link-model: no run here is a projection (tracer project), "
                                  "so no step was projected with it")
    had_key = cachekey.key_exists()
    try:
        entries = [_summarized(r, options) for r in found.runs]
    except BadInput:
        # a refused input leaves no cache file (issue 42): the ranks parsed before the one
        # refused were cached by the workers, and the key they were signed with may be new
        tablecache.forget([t for r in found.runs for t in r.traces])
        if not had_key:
            cachekey.forget_new_key()
        raise
    return _report(found, entries)


def _summarized(run: rundirs.RunDir, options: AnalysisOptions) -> RunEntry:
    """``summarize_run`` of ``run``, its spilled tables removed once it is summarised."""
    if not run.traces:
        return summarize_run(run, None, options)
    with pipeline.load_run(run, jobs=options.jobs) as tables:
        return summarize_run(run, tables, options)


def _report(found: rundirs.Discovery, runs: list[RunEntry]) -> Report:
    from analyzer.compare.projection import projection_rows

    for r, s in zip(runs, ranking.speedups(runs)):
        r.speedup_vs_single = s
    report = Report(root=str(found.root), layout=found.layout, runs=runs,
                    ranking=ranking.rank_runs(runs),
                    settings_warnings=ranking.settings_differences(
                        [r for r in runs if r.projection is None]),
                    prefetch_comparisons=ranking.prefetch_groups(runs),
                    baseline_drift=drift.report_section(runs),
                    warnings=found.warnings + [f"{r.name}: {n}" for r in runs
                                               for n in r.caveats + r.notes])
    report.projections = projection_rows(runs)
    report.findings = findings.findings(report)
    return report


def job_findings(run: rundirs.RunDir, tables) -> list[Finding]:
    """``analyzer summary``'s findings: those ``analyzer report`` gives for the one job ``run``
    (its loaded ``tables``, ``ingest.load_run``), from the same ``summarize_run`` with the
    default options, so both commands draw them by one set of rules. Their evidence paths
    point into the report.json of ``analyzer report`` on that job alone (``/runs/0/...``)."""
    entry = summarize_run(run, tables, AnalysisOptions())
    found = rundirs.Discovery(root=run.path, layout="foreign" if run.foreign else "run",
                              runs=[run])
    return _report(found, [entry]).findings


def gate(root: Path | str, options: AnalysisOptions = AnalysisOptions()) -> list[RunEntry]:
    """Every run under ``root`` with its parity only, for ``analyzer gate``.

    Traces of recorded runs are not parsed (their sizes are checked against the manifest).
    A folder of foreign traces has no numerics, so it is listed as ``not_recorded`` (a FAIL,
    exit 3); its traces are loaded first (``ingest.load_run``, cached) so that unusable ones
    (truncated, not a trace, the rank rule) raise ``BadInput`` -- exit 2, as ``report`` does --
    rather than a parity verdict. An incomplete run (``allow_incomplete``) is skipped unread."""
    found = rundirs.discover(root, allow_incomplete=options.allow_incomplete)
    for r in found.runs:
        if r.foreign and not r.incomplete:
            pipeline.load_run(r, jobs=options.jobs).close()
    return [RunEntry(name=r.name, strategy=r.strategy, incomplete=r.incomplete,
                     parity=_parity(r, options),
                     projection=msgspec.to_builtins(r.manifest.projection)
                     if r.manifest is not None and r.manifest.projection else None)
            for r in found.runs]
