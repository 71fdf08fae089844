"""Cross-check our communication/computation overlap with HolisticTraceAnalysis (optional dep).

HTA's figure: ``TraceAnalysis.get_comm_comp_overlap`` reports, per rank, the overlap of merged
communication kernels with merged computation kernels as a percentage of communication time,
rounded to 0.01 % (hta/analyzers/communication_analysis.py). The rules below are those of
traceinsight 0.6.1, the HTA release the ``[hta]`` extra pins (module ``hta``), read in its code;
``hta_scope_overlap`` applies each of them to our event table (analyzer/ingest/classify.py) and
computes the same set algebra (analyzer/analyses/intervals.py). It must agree with HTA to 0.01 %.

Which rows HTA has (hta/common/trace_parser.py ``_compress_df``): complete events with a
category other than ``Trace``; ``stream`` and ``correlation`` come from the event's args, -1
when absent (``stream`` through ``to_numeric``: ROCm's ``"0x0"`` is -1,
hta/utils/utils.py ``normalize_gpu_stream_numbers``). A row is a GPU kernel when its stream and
its correlation are both >= 0, or it is named ``Event Sync`` / ``Context Sync``; every other
row is a CPU row (hta/common/trace_filter.py ``_filter_gpu_kernels_with_cuda_sync``,
``CPUOperatorFilter``) -- so the copies of ``ProfilerStep#N`` that Kineto writes on the GPU
track (``gpu_user_annotation``, no stream, no correlation) are CPU rows to HTA.

HTA's scope (hta/common/trace.py ``_filter_irrelevant_gpu_kernels``, default
``include_last_profiler_step=False``): when the traces name at least two ProfilerSteps (distinct
names matching ``^ProfilerStep#\\d+`` over all ranks), each rank keeps its CPU rows that start
before its cutoff and the GPU kernels whose correlation one of those carries. The cutoff is the
latest start of the rank's CPU rows named ``ProfilerStep#N``, *GPU copies included*: where the
GPU copy of the last step starts after its CPU span (the GPU running behind), the cutoff is
that later start, and the last step's kernels launched before it are kept -- HTA then does not
drop the last step, or drops only its kernels launched after the copy started. A rank with no
ProfilerStep row (while other ranks name two or more) gets its earliest CPU row's start as the
cutoff, so nothing of it is kept; a rank with no CPU row is not filtered. Kernels with no launch
in the trace (queued before the profiler started) are left out too. With fewer than two
ProfilerSteps nothing is filtered.

What HTA counts (``get_comm_comp_overlap``): the kept rows whose stream is not -1 (a CPU row
with a ``stream`` argument and no correlation counts too; a kernel without a ``stream``
argument, as the tb_plugin's test traces write them, never does), typed by name with ``re.match``
(hta/utils/utils.py ``get_kernel_type``, hta/common/types.py): communication
``(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)``, else memory ``(^(hip)?Memcpy)|(^(hip)?Memset)|
(^dma)`` (not counted), else computation unless the name matches ``ComputeKernelGroupingPattern``
(``^nccl``, ``.*Memcpy``, ``.*Memset``, ``.*dma``, ``^.*Sync``, ``^Stream Wait Event``,
``cuda.*LaunchKernel``, ...). Communication our ingest recognises and HTA does not (``symm_mem``,
dispatch/combine kernels) is computation on HTA's side, and in ``hta_scope_overlap``.

Times: on a trace with float timestamps HTA moves every start up and every end down to a whole
µs before anything else (hta/common/trace_parser.py ``round_down_time_stamps``); so does
``hta_scope_overlap``, for the cutoff too (rounding whole µs changes nothing) -- on the A100
corpus trace exact ns give 14.76 % where HTA and this rounding give 14.31 %.

Our report's figure is per ProfilerStep (device work in the step whose CPU span launched it);
differences between it and HTA's are explained by scope first: the kernels HTA drops after its
cutoff, kernels without a launch in the trace, several steps pooled.

HTA runs in a child process (analyzer/compare/hta_child.py, a fresh interpreter in its own
process group, so HTA's fork pool is inside it), with its logging, stdout and stderr in a file
of ours, never on the terminal, for at most ``PARITYTRACE_HTA_TIMEOUT_S`` seconds (default
``timeout_s``: 300 s + 1 s per MB of trace files). Its figures come back as JSON in a file we
create. When HTA raises (both releases do under pandas 3.x on some traces), ends without a
result, or does not finish in time (it can hang in its process pool), the process tree is
killed, the cross-check says so in one line and our figures still stand; Ctrl-C and SIGTERM kill
the tree too.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv
from analyzer.contract import children, settings

log = logging.getLogger(__name__)

_HTA_COMM = re.compile(r"(^nccl.*)|(^hip)|(^hccl)|(.*ncclKernel.*)")
"""hta/common/types.py CommunicateKernelGroupingPattern (traceinsight 0.6.1), ``re.match``."""
_HTA_MEMORY = re.compile(r"(^(hip)?Memcpy)|(^(hip)?Memset)|(^dma)")
"""hta/common/types.py MemoryKernelGroupingPattern."""
_HTA_NOT_COMPUTE = re.compile(
    r"(^nccl)|(.*Memcpy)|(.*Memset)|(.*dma)|(^.*Sync)|(^Stream Wait Event)|(cuda.*LaunchKernel)"
    r"|(^runFunction)|(^hip)|(^job_exe)|(^packet)|(^pe_exe)|(^cpum_exe_subgraph)|(^hccl)"
    r"|(^collective_subgraph_execution)")
"""hta/common/types.py ComputeKernelGroupingPattern (an inverse match: a name it matches is not
computation)."""
_HTA_STEP = re.compile(r"^ProfilerStep#(\d+)")
"""hta/common/types.py ProfilerStepGroupingPattern, matched against every symbol."""
_HTA_SYNC = ("Event Sync", "Context Sync")
"""Kernels to HTA whatever their stream (hta/common/trace_filter.py)."""

COLUMNS = ["rank", "hta_overlap_pct", "ours_hta_scope_pct", "ours_step_pct", "diff_pct",
           "explanation"]
SCOPE_NOTE = (
    "HTA's scope (hta/common/trace.py _filter_irrelevant_gpu_kernels, traceinsight 0.6.1): "
    "with two or more ProfilerSteps in the traces HTA keeps, per rank, the GPU kernels launched "
    "by a CPU row that starts before the latest ProfilerStep#N start -- GPU copies of "
    "ProfilerStep#N (no stream) count as CPU rows, so when the last step's GPU copy starts "
    "after its CPU span HTA keeps that step's kernels launched before it; otherwise it drops "
    "the last ProfilerStep. Kernels queued before the profiler started (no launch) are dropped; "
    "with fewer than two ProfilerSteps HTA takes every kernel. Kernels without a stream "
    "argument are CPU rows to HTA and never counted. ours_hta_scope_pct applies these rules to "
    "our events; ours_step_pct is the report's per-ProfilerStep figure.")


class HtaFailed(RuntimeError):
    """HTA raised, ended without a result, or did not finish in time: ``args[0]`` is the one
    line the cross-check notes."""


def hta_available() -> bool:
    """True when HolisticTraceAnalysis (or traceinsight, which installs as module ``hta``) can be
    imported."""
    try:
        import hta.trace_analysis  # noqa: F401
    except ImportError:
        return False
    return True


def timeout_s(trace_dir: Path) -> float:
    """The longest HTA may run on ``trace_dir``, s: ``PARITYTRACE_HTA_TIMEOUT_S``, else 300 s +
    1 s per MB (10^6 bytes) of the ``*.json`` / ``*.json.gz`` files in it as stored (HTA took
    30-78 s on 8 ranks x 41 MB of JSON on a 2-vCPU machine: README, Performance)."""
    override = settings.hta_timeout_s()
    if override is not None:
        return override
    size = sum(f.stat().st_size for f in trace_dir.iterdir()
               if f.name.endswith((".json", ".json.gz")) and f.is_file())
    return 300.0 + size / 1e6


def crosscheck(ts) -> tuple[pd.DataFrame, list[str]]:
    """(``compare`` with HTA's figures for ``ts.root``, a folder or one trace file; note lines).

    The notes state HTA's scope and, when HTA failed (``run_hta_overlap`` raised ``HtaFailed``:
    HTA raised, died, or did not finish in time), that in one line (HTA's column is then NaN,
    ours are still computed). Raises ``BadInput`` (``hta_missing``) when HTA is not installed,
    (``bad_option``) for a bad ``PARITYTRACE_HTA_TIMEOUT_S``.

    HTA reads whole folders: for one file it gets a temporary folder holding only a symlink to
    it (removed afterwards). Given the file's parent instead, HTA read every sibling trace too,
    logged a "same rank" line for each and kept another file's figure for the rank."""
    from analyzer.contract.errors import BadInput, Reason

    if not hta_available():
        raise BadInput(ts.root, Reason.HTA_MISSING, "--crosscheck hta needs HolisticTraceAnalysis",
                       "pip install 'paritytrace[hta]'")
    settings.hta_timeout_s()  # a bad value is refused before HTA starts
    notes = [SCOPE_NOTE]
    try:
        if ts.root.is_dir():
            hta = run_hta_overlap(ts.root)
        else:
            with tempfile.TemporaryDirectory(prefix="paritytrace-hta-") as tmp:
                (Path(tmp) / ts.root.name).symlink_to(ts.root.resolve())
                hta = run_hta_overlap(Path(tmp))
    except HtaFailed as exc:  # HTA's own failure: said in one line, ours still shown
        notes.append(exc.args[0])
        hta = pd.DataFrame({"rank": pd.Series([], dtype="int64"),
                            "hta_overlap_pct": pd.Series([], dtype=float)})
    return compare(ts, hta), notes


def run_hta_overlap(trace_dir: Path, timeout: float | None = None) -> pd.DataFrame:
    """HTA's get_comm_comp_overlap on ``trace_dir``, run in a child process: columns rank,
    hta_overlap_pct (NaN where HTA gives none).

    ``timeout``: seconds, default ``timeout_s(trace_dir)``. Raises ``HtaFailed`` (one line, HTA's
    column left empty, our figures unaffected) when HTA raises, its process ends without a
    result (killed, out of memory), or it runs past the timeout; the child and every process it
    started are killed then, and on ``KeyboardInterrupt`` (Ctrl-C, SIGTERM in the CLI), which
    is re-raised. HTA's log, stdout and stderr go to a temporary file (removed afterwards); its
    last line is quoted when HTA ends without a result. HTA needs one folder holding only one
    job's traces with distributedInfo.rank (it reads the rank from the trace too)."""
    import analyzer

    limit = timeout_s(trace_dir) if timeout is None else timeout
    work = Path(tempfile.mkdtemp(prefix="paritytrace-hta-run-"))
    try:
        result, log_path = work / "result.json", work / "hta.log"
        env = dict(os.environ)
        root = str(Path(analyzer.__file__).resolve().parent.parent)  # this analyzer, not another
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
        code = children.run([sys.executable, "-m", "analyzer.compare.hta_child", str(trace_dir),
                             str(result)], log_path, limit, env=env)
        if code is None:
            raise HtaFailed(f"HTA did not finish within {limit:g} s ({settings.HTA_TIMEOUT_S.name}); its "
                            "column is empty, our figures stand" + _last_line(log_path))
        return _read_result(result, code, log_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _last_line(log_path: Path) -> str:
    """``; its last log line: ...`` (at most 200 characters), or "" for an empty log."""
    lines = children.log_lines(log_path)
    return f"; its last log line: {lines[-1][:200]}" if lines else ""


def _read_result(result: Path, code: int, log_path: Path) -> pd.DataFrame:
    """The child's JSON (plain data, never pickle): {"rank": [...], "hta_overlap_pct": [...]} or
    {"error": {"type", "message"}}. Raises ``HtaFailed``."""
    try:
        data = json.loads(result.read_text())
    except (OSError, ValueError):
        how = f"signal {-code}" if code < 0 else f"exit code {code}"
        raise HtaFailed(f"HTA failed: its process ended ({how}) without a result (HTA's column "
                        "left empty; our figures are unaffected)" + _last_line(log_path)) from None
    if "error" in data:
        err = data["error"]
        first = (str(err.get("message", "")).strip().splitlines() or [""])[0][:300]
        raise HtaFailed(f"HTA failed: {err.get('type', 'Error')}: {first} (HTA's column left "
                        "empty; our figures are unaffected)")
    pct = [math.nan if v is None else float(v) for v in data["hta_overlap_pct"]]
    return pd.DataFrame({"rank": pd.Series(data["rank"], dtype="int64"),
                         "hta_overlap_pct": pd.Series(pct, dtype=float)})


def hta_overlap_in_process(trace_dir: str) -> dict[str, list]:
    """HTA's get_comm_comp_overlap on ``trace_dir`` in this process (what the child runs):
    {"rank": [int], "hta_overlap_pct": [float or None]}. Raises whatever HTA raises."""
    from hta.trace_analysis import TraceAnalysis

    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    df = analysis.get_comm_comp_overlap(visualize=False)
    pct = [None if v != v else float(v) for v in df["comp_comm_overlap_pctg"].astype(float)]
    return {"rank": [int(r) for r in df["rank"]], "hta_overlap_pct": pct}


def _by_name(names: np.ndarray, test) -> np.ndarray:
    """``test(name)`` for each row, evaluated once per distinct name."""
    uniq, codes = np.unique(names, return_inverse=True)
    return np.array([bool(test(n)) for n in uniq], bool)[codes] if len(uniq) else \
        np.zeros(len(names), bool)


def _hta_read(events: pd.DataFrame) -> np.ndarray:
    """The rows HTA has (module docstring): a category, not ``Trace``."""
    cat = events["cat"].astype(str).to_numpy()
    return (cat != "") & (cat != "Trace")


def step_names(events: pd.DataFrame) -> set[str]:
    """The distinct names of one rank's event table that HTA counts as ProfilerSteps
    (``^ProfilerStep#\\d+``, any row HTA has: GPU copies carry the same names)."""
    names = events["name"].astype(str).to_numpy()[_hta_read(events)]
    return {n for n in set(names.tolist()) if _HTA_STEP.match(n)}


def hta_scope_overlap(events: pd.DataFrame, filtered: bool) -> dict:
    """Our overlap on HTA's scope for one rank's event table (``analyzer.api.load_events``).

    ``filtered``: the traces name at least two ProfilerSteps, so HTA's filter applies (module
    docstring: HTA's CPU rows and kernels by ``stream_arg`` and ``correlation``, the cutoff at
    the latest ProfilerStep#N start among CPU rows, GPU copies without a stream included). Times
    are rounded as HTA rounds them (starts up, ends down, to whole µs) before the cutoff and the
    set algebra. Returns ns and counts of communication/computation rows (HTA's kernel types):
    overlap_ns (|∪comm ∩ ∪compute| of what HTA keeps), comm_ns (|∪comm|), last_step_dropped
    (rows dropped because they, or the CPU row launching them, start at or after the cutoff),
    unlaunched_dropped (kernels no CPU row carries the correlation of), last_step_kept (rows
    kept although launched at or after the start of the last ProfilerStep on the CPU track: the
    cutoff is a later GPU copy), no_stream_kernels (our communication or computation kernels
    with no ``stream`` argument: CPU rows to HTA, never counted), cutoff_step (the name of the
    row giving the cutoff, "" when none), cutoff_on_gpu (that row is a GPU-track copy),
    no_step_rank (filtered, and this rank has no ProfilerStep row: HTA keeps nothing of it),
    sub_us (a kept row starts or ends off a whole µs)."""
    names = events["name"].astype(str).to_numpy()
    read = _hta_read(events)
    stream = events["stream_arg"].to_numpy()
    corr = events["correlation"].to_numpy()
    gpu_track = events["is_gpu"].to_numpy()
    kernel = read & (((stream >= 0) & (corr >= 0)) | _by_name(names, lambda n: n in _HTA_SYNC))
    cpu = read & ~kernel
    ts, end = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    s, e = -(-ts // 1000) * 1000, end // 1000 * 1000  # round_down_time_stamps, in ns
    is_comm = _by_name(names, _HTA_COMM.match)
    is_comp = ~is_comm & _by_name(names, lambda n: not (_HTA_MEMORY.match(n)
                                                        or _HTA_NOT_COMPUTE.match(n)))
    counted = read & (stream != -1) & (is_comm | is_comp)  # get_comm_comp_overlap's rows
    role = events["role"].to_numpy().astype(object)
    ours = gpu_track & ((role == "comm") | (role == "compute"))
    keep = read.copy()
    out = {"last_step_dropped": 0, "unlaunched_dropped": 0, "last_step_kept": 0,
           "cutoff_step": "", "cutoff_on_gpu": False, "no_step_rank": False,
           "no_stream_kernels": int((ours & (stream == -1)).sum())}
    if filtered and cpu.any():
        is_step = cpu & _by_name(names, _HTA_STEP.match)
        if is_step.any():
            at = np.flatnonzero(is_step)[np.argmax(s[is_step])]
            cutoff = s[at]
            out.update(cutoff_step=names[at], cutoff_on_gpu=bool(gpu_track[at]))
        else:  # trace.py: the rank's first CPU row start, so no CPU row is before it
            cutoff = s[cpu].min()
            out["no_step_rank"] = True
        kept_cpu = cpu & (s < cutoff)
        keep = kept_cpu | (kernel & np.isin(corr, np.unique(corr[kept_cpu])))
        dropped = counted & ~keep
        launched = np.isin(corr, np.unique(corr[cpu]))
        out["last_step_dropped"] = int((dropped & (cpu | launched)).sum())
        out["unlaunched_dropped"] = int((dropped & kernel & ~launched).sum())
        cpu_steps = is_step & ~gpu_track
        if cpu_steps.any() and out["cutoff_on_gpu"]:
            cpu_cut = s[cpu_steps].max()
            before = np.isin(corr, np.unique(corr[cpu & (s < cpu_cut)]))
            late = (kernel & ~before) | (cpu & (s >= cpu_cut))
            out["last_step_kept"] = int((counted & keep & late).sum())
    sel = keep & counted
    sub_us = bool(((ts[sel] % 1000) != 0).any() or ((end[sel] % 1000) != 0).any())
    comm = iv.merge(s[sel & is_comm], e[sel & is_comm])
    comp = iv.merge(s[sel & is_comp], e[sel & is_comp])
    return {"overlap_ns": int(iv.measure(iv.intersect(comm, comp))),
            "comm_ns": int(iv.measure(comm)), **out, "sub_us": sub_us}


def _scopes(job) -> dict[int, dict]:
    """``hta_scope_overlap`` of every rank of ``job`` (the traces decoded again: HTA's scope
    needs the events, which the cached tables do not hold)."""
    from analyzer.ingest.ranktables import classified

    events = {rt.rank: classified(rt.path)[0] for rt in job.ranks}
    names: set[str] = set()
    for ev in events.values():
        names |= step_names(ev)
    return {r: hta_scope_overlap(ev, filtered=len(names) >= 2) for r, ev in events.items()}


def _scope_reasons(sc: dict) -> list[str]:
    """Why HTA's scope differs from our per-step one, for ``compare``'s explanation."""
    scope = []
    n = sc["last_step_dropped"]
    if n and sc["cutoff_on_gpu"]:
        scope.append(f"HTA drops {n} kernels launched after the GPU copy of {sc['cutoff_step']} "
                     "started (its cutoff: a ProfilerStep copy without a stream is a CPU row "
                     "to HTA)")
    elif n:
        scope.append(f"HTA drops the last ProfilerStep ({n} kernels)")
    if sc["last_step_kept"]:
        scope.append(f"HTA keeps {sc['last_step_kept']} kernels of the last ProfilerStep "
                     f"(launched before its GPU copy {sc['cutoff_step']} started)")
    if sc["no_stream_kernels"]:
        scope.append(f"HTA leaves out {sc['no_stream_kernels']} kernels without a stream "
                     "argument (CPU rows to HTA)")
    if sc["unlaunched_dropped"]:
        scope.append(f"HTA drops {sc['unlaunched_dropped']} kernels with no launch in the trace")
    scope.append("HTA pools its steps into one figure; ours counts device work in the step "
                 "that launched it")
    return scope


def compare(job, hta: pd.DataFrame) -> pd.DataFrame:
    """Side by side, per rank of ``job`` (``analyzer.ingest.pipeline.JobTables``): HTA's figure,
    ours on HTA's scope (``hta_scope_overlap``), ours over the ProfilerSteps, and why they
    differ, scope first (empty explanation when all agree to HTA's 0.01 % rounding). Columns
    ``COLUMNS``; percentages of communication time, NaN when undefined."""
    b = job.breakdown
    scopes = _scopes(job)
    rows = []
    for rt in job.ranks:
        sc = scopes[rt.rank]
        whole = 100.0 * sc["overlap_ns"] / sc["comm_ns"] if sc["comm_ns"] else math.nan
        mine = b[(b["rank"] == rt.rank) & (b["step"] >= 0)]
        step_comm = int(mine["comm_ns"].sum())
        step = 100.0 * int(mine["overlap_ns"].sum()) / step_comm if step_comm else math.nan
        h = hta.loc[hta["rank"] == rt.rank, "hta_overlap_pct"]
        hv = float(h.iat[0]) if len(h) else math.nan
        why = []
        if rt.device_kind == "cpu":
            why.append("CPU-only rank: HTA counts GPU kernels only")
        elif math.isnan(hv) and sc["no_step_rank"]:
            why.append("no ProfilerStep on this rank while the traces name two or more: HTA "
                       "keeps none of its kernels")
        elif math.isnan(hv) and not sc["comm_ns"] and sc["no_stream_kernels"]:
            why.append(f"no communication kernel in HTA's scope: {sc['no_stream_kernels']} "
                       "kernels carry no stream argument, which makes them CPU rows to HTA")
        elif math.isnan(hv) and not sc["comm_ns"]:
            why.append("no communication kernel in HTA's scope: overlap undefined")
        elif math.isnan(hv):
            why.append("HTA gave no figure for this rank")
        elif not math.isnan(whole) and abs(whole - hv) > 0.005 + 1e-9:
            why.append("same scope and rounding, different figure: a rule of HTA's that "
                       "hta_scope_overlap does not follow")
        if not math.isnan(whole) and not math.isnan(step) and abs(whole - step) > 0.005:
            why.append("scope: " + ", ".join(_scope_reasons(sc)))
        rows.append((rt.rank, hv, whole, step,
                     hv - whole if not (math.isnan(hv) or math.isnan(whole)) else math.nan,
                     "; ".join(why)))
    return pd.DataFrame(rows, columns=COLUMNS)
