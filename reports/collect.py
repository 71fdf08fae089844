"""Gather everything the report shows into one JSON-ready dict (report.json's content).

Reads run directories through ``analyzer`` only (never torch). The renderers (``markdown``,
``html``) take this dict and nothing else.

Per-run figures from the traces (``analyzer.ingest``): ``ranks[]`` are per-step means over the
rank's steps; the run's ``overlap_frac`` = overlap / communication summed over ranks and steps;
``exposed_comm_ns`` = exposed communication per step, mean over ranks; ``data`` = the run's data
supply (analyzer/datasupply.py: time-weighted data-wait shares, input-bound rule);
``communication[kind]``
= per-rank means (count, time_ns, bytes: totals over the whole trace) and the run's busbw
(nccl-tests: bus bytes over the time combined across ranks, ``collectives.run_busbw_gbps``;
not a mean of per-rank busbw), plus ``count_per_step``, ``time_ns_per_step``,
``bytes_per_step``: collectives inside profiled steps per rank divided by that rank's number
of profiled steps, mean over ranks (the figures the report shows, next to the other per-step
means); ``profiled_steps`` = their count.
"""

from __future__ import annotations

import logging
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analyzer import compare, datasupply, drift, ingest, memory, parity, prefetch, rundirs, schemas
from analyzer.collectives import by_kind, run_busbw_gbps

log = logging.getLogger(__name__)

REPORT_SCHEMA_VERSION = 1
BAR_PARTS = ("compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns")


def _num(v: Any) -> Any:
    """JSON-safe scalar: numpy -> python, NaN/NA -> None."""
    if v is None or v is pd.NA:
        return None
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v) if math.isfinite(float(v)) else None  # JSON has no NaN / inf
    return v


def _parity_dict(res: parity.ParityResult) -> dict[str, Any]:
    tol = res.tolerance
    return {
        "status": res.status, "reason": res.reason,
        "tolerance": None if tol is None else {"rtol": tol.rtol, "atol": tol.atol,
                                               "precision": tol.precision, "source": tol.source},
        "max_grad_rel_l2": _num(res.max_grad_rel_l2),
        "loss_max_rel_diff": _num(res.loss_max_rel_diff),
        "first_divergence": None if res.first_divergence is None else {
            k: _num(v) if not isinstance(v, dict) else v for k, v in res.first_divergence.items()},
        "failed_checks": [] if res.tensors.empty else [
            {"kind": r.kind, "tensor": r.tensor, "step": int(r.step), "rel_l2": _num(r.rel_l2),
             "max_abs_diff": _num(r.max_abs_diff), "limit": _num(r.limit)}
            for r in res.tensors[~res.tensors["passed"].astype(bool)].head(10).itertuples()],
    }


RANK_MEANS = ("step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "data_wait_ns", "other_ns",
              "idle_ns")


def _groups(keys: np.ndarray) -> list[tuple[Any, np.ndarray]]:
    """(key, row positions) per distinct key, keys ascending, rows in their order: a groupby
    for the few hundred rows of the report's tables, without pandas' per-call cost."""
    if not len(keys):
        return []
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    cuts = np.flatnonzero(k[1:] != k[:-1]) + 1
    return [(k[a], order[a:b]) for a, b in zip([0, *cuts], [*cuts, len(k)])]


def _mean(a: np.ndarray) -> float:
    """Mean as ``pandas.Series.mean`` computes it (NaN skipped; NaN when nothing is left):
    the float64 sum of the values over their count."""
    if a.dtype.kind == "f":
        ok = ~np.isnan(a)
        n = int(ok.sum())
        if n == 0:
            return float("nan")
        return (a if n == len(a) else np.where(ok, a, 0.0)).sum() / float(n)
    return a.sum(dtype=np.float64) / float(len(a)) if len(a) else float("nan")


def _nansum(a: np.ndarray) -> Any:
    """Sum as ``pandas.Series.sum`` computes it (NaN counted as 0)."""
    if a.dtype.kind == "f":
        return np.where(np.isnan(a), 0.0, a).sum()
    return a.sum()


def _communication(ts, bd: pd.DataFrame) -> tuple[int, dict[str, Any]]:
    """(profiled steps, ``communication`` of the run: per kind, per-rank means of the whole
    trace's totals and of the per-step figures; module docstring)."""
    cbk = by_kind(ts.collectives)
    n = max(len(ts.ranks), 1)
    # per profiled step: collectives inside a step, divided by that rank's number of steps
    coll = ts.collectives
    in_steps = by_kind(coll, rows=coll["step"].to_numpy() >= 0) if not coll.empty else cbk
    rank_steps = {int(r): len(np.unique(bd["step"].to_numpy()[i]))
                  for r, i in _groups(bd["rank"].to_numpy())}
    per_step: dict[str, dict[str, np.ndarray]] = {}
    if len(in_steps):
        div = np.array([rank_steps.get(int(r), 0) for r in in_steps["rank"]], dtype=float)
        div[div == 0] = np.nan
        kinds = in_steps["kind"].to_numpy()
        for k, i in _groups(kinds.astype(str)):
            per_step[str(k)] = {c: np.clip(in_steps[c].to_numpy()[i], 0, None).astype(float)
                                / div[i] for c in ("count", "time_ns", "bytes")}
    comm: dict[str, Any] = {}
    if len(cbk):
        cols = {c: cbk[c].to_numpy() for c in ("count", "time_ns", "bytes", "bus_bytes",
                                                 "bus_time_ns")}
        for kind, i in _groups(cbk["kind"].to_numpy().astype(str)):
            ps = per_step.get(str(kind))
            comm[str(kind)] = {
                "count": _num(cols["count"][i].sum() / n),
                "time_ns": _num(cols["time_ns"][i].sum() / n),
                "bytes": _num(np.clip(cols["bytes"][i], 0, None).sum() / n),
                "busbw_gbps": _num(run_busbw_gbps(cols["bus_bytes"][i], cols["bus_time_ns"][i])),
                **{f"{c}_per_step": (_num(_nansum(ps[c]) / n) if ps is not None else None)
                   for c in ("count", "time_ns", "bytes")}}
    return (max(rank_steps.values()) if rank_steps else 0), comm


def _trace_part(ts) -> dict[str, Any]:
    """Figures from the traces: ranks[], steps[] (bars), communication, overlap, timeline.
    ``ts``: analyzer.ingest.JobTables (per-rank tables, no events)."""
    bd = ts.breakdown
    bd = bd[bd["step"] >= 0]
    out: dict[str, Any] = {"whole_trace_mode": ts.whole_trace_mode,
                           "rank_sources": sorted({r.rank_source for r in ts.ranks}),
                           "missing_ranks": ts.missing_ranks,
                           "device_kind": ts.ranks[0].device_kind if ts.ranks else "cpu",
                           "trace_warnings": [w for r in ts.ranks for w in r.warnings][:20],
                           "load_notes": list(ts.warnings)}
    col = {c: bd[c].to_numpy() for c in (*RANK_MEANS, "step", "overlap_ns", "input_bound")}
    ranks = []
    for rank, i in _groups(bd["rank"].to_numpy()):
        comm = int(col["comm_ns"][i].sum())
        step_sum = col["step_ns"][i].sum()
        ranks.append({"rank": int(rank), "steps": int(len(i)),
                      **{c: _num(float(_mean(col[c][i]))) for c in RANK_MEANS},
                      "overlap_frac": _num(col["overlap_ns"][i].sum() / comm) if comm else None,
                      "data_wait_frac": _num(col["data_wait_ns"][i].sum() / step_sum)
                      if step_sum else None,
                      "input_bound_steps": int(col["input_bound"][i].sum())})
    out["ranks"] = ranks
    comm_total = int(bd["comm_ns"].sum())
    out["overlap_frac"] = _num(bd["overlap_ns"].sum() / comm_total) if comm_total else None
    out["exposed_comm_ns"] = _num(float(bd["exposed_comm_ns"].mean())) if len(bd) else None
    by_step = _groups(col["step"])
    out["trace_step_ns"] = [int(col["step_ns"][i].max()) for _, i in by_step]
    out["steps"] = [{"step": int(s), **{c: _num(float(_mean(col[c][i])))
                                        for c in ("step_ns", *BAR_PARTS)}}
                    for s, i in by_step]
    out["profiled_steps"], out["communication"] = _communication(ts, bd)
    out["timeline"] = None
    if len(bd):
        r0 = int(bd["rank"].min())
        first = bd[bd["rank"] == r0].sort_values("step").iloc[0]
        tl = ts.timeline(r0, int(first["step"]))
        t0 = int(first["step_start_ns"])
        out["timeline"] = {"rank": r0, "step": int(first["step"]), "step_ns": int(first["step_ns"]),
                           "intervals": [{"lane": str(r.lane), "kind": str(r.kind or ""),
                                          "start_ns": int(r.start_ns) - t0, "end_ns": int(r.end_ns) - t0}
                                         for r in tl.itertuples()]}
    if not ts.prefetch.empty:
        pf = ts.prefetch
        summary = prefetch.prefetch_summary(pf)
        units = (pf.groupby(["phase", "unit"], sort=False)
                 .agg(n=("rank", "size"), prefetched=("prefetched", "mean"),
                      comm_ns=("comm_ns", "mean"), hidden_frac=("hidden_frac", "mean"),
                      slack_ns=("slack_ns", "mean"), min_slack_ns=("slack_ns", "min"))
                 .reset_index())
        out["prefetch"] = {**summary,
                           "note": prefetch.CPU_NOTE if out["device_kind"] == "cpu" else None,
                           "units": [{k: _num(v) if not isinstance(v, str) else v
                                      for k, v in row.items()} for row in units.to_dict("records")]}
    else:
        out["prefetch"] = None
    return out


def _check(run: rundirs.RunDir, *, rtol: float | None, atol: float | None) -> parity.ParityResult:
    res = parity.check_run(run.path, run.manifest, rtol=rtol, atol=atol)
    if run.incomplete:
        res.reason = "incomplete run (no manifest.json): parity not checked"
    return res


def collect_run(run: rundirs.RunDir, *, rtol: float | None, atol: float | None,
                allow_incomplete: bool) -> dict[str, Any]:
    """The report entry of one run. Raises ``BadInput`` for malformed inputs."""
    m = run.manifest
    res = _check(run, rtol=rtol, atol=atol)
    entry: dict[str, Any] = {
        "name": run.name, "path": str(run.path), "strategy": run.strategy,
        "options": (m or {}).get("strategy_options") or {}, "fault": (m or {}).get("fault"),
        "world_size": (m or {}).get("world_size"), "backend": (m or {}).get("backend"),
        "device": ((m or {}).get("device") or {}).get("type"),
        "settings": None if m is None else {k: m.get(k) for k in compare.SETTINGS},
        "parity": _parity_dict(res),
    }
    steps_path = run.path / schemas.STEPS_NAME
    peaks = pd.DataFrame()
    step_ns: list[int] = []
    step_source = None
    if m is not None and steps_path.exists():
        steps = memory.read_steps(steps_path)
        st = memory.step_times(steps)
        step_ns = [int(v) for v in st[st["profiled"]]["step_ns"]]
        step_source = "steps.parquet: profiled steps, slowest rank's wall time"
        peaks = memory.rank_peaks(steps)
    entry["traces"] = [str(p) for p in run.traces]
    trace_part: dict[str, Any] = {}
    data_bd = None
    if run.traces:
        ts = ingest.load_run(run)
        trace_part = _trace_part(ts)
        data_bd = ts.breakdown
        if entry["world_size"] is None:
            entry["world_size"] = ts.world_size
            entry["device"] = "cuda" if trace_part["device_kind"] == "gpu" else "cpu"
        if not step_ns and trace_part["trace_step_ns"]:
            step_ns = trace_part["trace_step_ns"]
            step_source = "traces: ProfilerStep spans, slowest rank"
    stats = memory.step_stats(step_ns)
    entry["step_time_ns"] = {"median": stats["median"], "p90": stats["p90"], "n": stats["n"],
                             "min": min(step_ns) if step_ns else None,
                             "max": max(step_ns) if step_ns else None, "source": step_source}
    mem_ranks = [{k: _num(v) for k, v in row.items()} for row in peaks.to_dict("records")]
    entry["memory"] = {
        "peak_rss_bytes": _num(peaks["peak_rss_bytes"].max()) if len(peaks) else None,
        "peak_allocated_bytes": memory.peak_allocated_bytes(peaks) if len(peaks) else None,
        "peak_reserved_bytes": _num(peaks["cuda_max_reserved_bytes"].max()) if len(peaks) else None,
        "ranks": mem_ranks, "by_category": [], "largest": []}
    mem_path = run.path / schemas.MEMORY_DIR / schemas.MEMORY_PARQUET_NAME
    if m is not None and mem_path.exists():
        mem = memory.read_memory(mem_path)
        entry["memory"]["by_category"] = [{k: _num(v) for k, v in r.items()}
                                          for r in memory.memory_by_category(mem).to_dict("records")]
        entry["memory"]["largest"] = [{k: _num(v) for k, v in r.items()}
                                      for r in memory.largest_allocations(mem).to_dict("records")]
    entry["communication"] = trace_part.get("communication", {})
    entry["profiled_steps"] = trace_part.get("profiled_steps")
    entry["overlap_frac"] = trace_part.get("overlap_frac")
    entry["exposed_comm_ns"] = trace_part.get("exposed_comm_ns")
    entry["data"] = {k: _num(v) for k, v in datasupply.data_summary(data_bd, m).items()}
    entry["ranks"] = trace_part.get("ranks", [])
    entry["prefetch"] = trace_part.get("prefetch")
    entry["steps"] = trace_part.get("steps", [])
    entry["timeline"] = trace_part.get("timeline")
    entry["trace_info"] = {k: trace_part.get(k) for k in
                           ("whole_trace_mode", "rank_sources", "missing_ranks", "device_kind",
                            "trace_warnings")} if trace_part else None
    entry["incomplete"] = run.incomplete
    entry["caveats"], entry["notes"] = _caveats(entry, trace_part)
    return entry


def _caveats(entry: dict[str, Any], trace_part: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(caveats, notes) of one run. Caveats say when a figure covers less than a whole run
    (incomplete run, ranks missing, no ProfilerStep); notes add everything skipped while loading
    (events with a bad ts/dur, symlinks left out ...), one line each."""
    caveats: list[str] = []
    if entry.get("incomplete"):
        caveats.append("incomplete run (no manifest.json), analysed as found")
    missing = trace_part.get("missing_ranks") or []
    if missing:
        caveats.append(f"partial: ranks {missing} of {entry['world_size']} have no trace")
    if trace_part.get("whole_trace_mode"):
        caveats.append("whole-trace mode: no ProfilerStep in the traces, step 0 = the whole trace")
    said = re.compile(r"^\d+ of \d+ ranks$|incomplete run")  # already a caveat
    notes = [n for n in trace_part.get("load_notes") or [] if not said.search(n)]
    notes += list(trace_part.get("trace_warnings") or [])
    return caveats, notes


def build_report(runs: list[dict[str, Any]], *, layout: str, root: str,
                 warnings: list[str] | None = None) -> dict[str, Any]:
    """Assemble report.json from run entries: adds speedups, ranking, settings warnings."""
    sp = compare.speedups(runs)
    for r in runs:
        r["speedup_vs_single"] = sp.get(r["name"])
    return {
        "schema_version": REPORT_SCHEMA_VERSION, "root": root, "layout": layout,
        "runs": runs, "ranking": compare.rank_runs(runs),
        "settings_warnings": compare.settings_differences(runs),
        "prefetch_comparisons": compare.prefetch_groups(runs),
        "baseline_drift": drift.report_section(runs),
        "warnings": list(warnings or []) + [f"{r['name']}: {n}" for r in runs
                                            for n in (r.get("caveats") or []) + (r.get("notes") or [])],
    }


def collect(root: Path | str, *, rtol: float | None = None, atol: float | None = None,
            allow_incomplete: bool = False) -> dict[str, Any]:
    """Discover runs under ``root`` and build the whole report dict. Raises ``BadInput``."""
    found = rundirs.discover(root, allow_incomplete=allow_incomplete)
    runs = [collect_run(r, rtol=rtol, atol=atol, allow_incomplete=allow_incomplete)
            for r in found.runs]
    return build_report(runs, layout=found.layout, root=str(found.root), warnings=found.warnings)


def gate_runs(root: Path | str, *, rtol: float | None = None, atol: float | None = None,
              allow_incomplete: bool = False) -> list[dict[str, Any]]:
    """Parity: ``[{name, strategy, incomplete, parity}]`` for ``analyzer gate``.

    Traces of recorded runs are not parsed (their sizes are checked against the manifest).
    A folder of foreign traces has no numerics, so it is listed as ``not_recorded`` (a FAIL,
    exit 3); its traces are loaded first (``ingest.load_run``, cached) so that unusable ones
    (truncated, not a trace, the rank rule) raise ``BadInput`` -- exit 2, as ``report`` does --
    rather than a parity verdict. An incomplete run (``allow_incomplete``) is skipped unread."""
    found = rundirs.discover(root, allow_incomplete=allow_incomplete)
    for r in found.runs:
        if r.foreign and not r.incomplete:
            ingest.load_run(r)
    return [{"name": r.name, "strategy": r.strategy, "incomplete": r.incomplete,
             "parity": _parity_dict(_check(r, rtol=rtol, atol=atol))}
            for r in found.runs]
