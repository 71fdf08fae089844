"""Cross-check our communication/computation overlap with HolisticTraceAnalysis (optional dep).

HTA's figure: ``TraceAnalysis.get_comm_comp_overlap`` reports, per rank, the overlap of merged
NCCL kernels (``^nccl.*Kernel``) with merged computation kernels (every other GPU kernel whose
name does not match ``.*Memcpy``, ``Memset`` or ``.*Sync``) as a percentage of communication
time, rounded to 0.01 % (hta/analyzers/communication_analysis.py, hta/utils/utils.py). Kernel
types are HTA's, by name: communication our ingest recognises and HTA does not (``symm_mem``,
``hccl``, dispatch/combine kernels) is computation on HTA's side, and in ``hta_scope_overlap``.

HTA's scope, as HTA applies it when it loads the traces (hta/common/trace.py
``_filter_irrelevant_gpu_kernels``, same rule in HolisticTraceAnalysis 0.5.0 and traceinsight
0.6.1, default ``include_last_profiler_step=False``): when the traces name at least two
ProfilerSteps (HTA counts distinct ``ProfilerStep#N`` names over all ranks), the CPU events that
start at or after the start of the rank's *last* ProfilerStep are dropped, and a GPU kernel is
kept only when a kept CPU event carries its correlation id -- so the last ProfilerStep's kernels
and kernels with no launch in the trace (queued before the profiler started) are left out. With
fewer than two ProfilerSteps nothing is filtered: HTA takes every kernel of the trace.

Ours: ``hta_scope_overlap`` applies that same filter to our event table (the ingest's
classification: analyzer/ingest/classify.py) and computes the same set algebra
(analyzer/analyses/intervals.py) on HTA's times: on a trace with sub-µs timestamps HTA moves
every start up and every end down to a whole µs (hta/common/trace_parser.py
``round_down_time_stamps``), and so does ``hta_scope_overlap`` -- on the A100 corpus trace exact
ns give 14.76 % where HTA and this rounding give 14.31 %. It must agree with HTA to 0.01 %. Our report's figure
is per ProfilerStep (device work in the step whose CPU span launched it); differences between it
and HTA's are explained by scope first: the last step HTA drops, kernels without a launch in the
trace, several steps pooled. When HTA itself raises (HTA 0.5.0 and traceinsight 0.6.1 both do
under pandas 3.x on some traces), the cross-check reports HTA's error in one line and our figures
still stand.
"""

from __future__ import annotations

import logging
import math
import re
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv

log = logging.getLogger(__name__)

_HTA_COMM = re.compile(r"^nccl.*Kernel")  # hta/utils/utils.py NCCL_KERNEL_RE
_HTA_NOT_COMPUTE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
"""hta/utils/utils.py NCCL_COMPUTE_KERNEL_RE, as HTA writes it (``re.match``)."""

COLUMNS = ["rank", "hta_overlap_pct", "ours_hta_scope_pct", "ours_step_pct", "diff_pct",
           "explanation"]
SCOPE_NOTE = (
    "HTA's scope (hta/common/trace.py _filter_irrelevant_gpu_kernels, HTA 0.5.0 and "
    "traceinsight 0.6.1): with two or more ProfilerSteps in the traces HTA drops the last "
    "ProfilerStep and every GPU kernel not launched by a CPU event before it (kernels queued "
    "before the profiler started have no launch); with fewer it takes every kernel. "
    "ours_hta_scope_pct applies that filter to our events; ours_step_pct is the report's "
    "per-ProfilerStep figure.")
_STEP = re.compile(r"ProfilerStep")


def hta_available() -> bool:
    """True when HolisticTraceAnalysis (or traceinsight, which installs as module ``hta``) can be
    imported."""
    try:
        import hta.trace_analysis  # noqa: F401
    except ImportError:
        return False
    return True


def crosscheck(ts) -> tuple[pd.DataFrame, list[str]]:
    """(``compare`` with HTA's figures for ``ts.root``, a folder or one trace file; note lines).

    The notes state HTA's scope and, when HTA itself raised, one line with HTA's error (HTA's
    column is then NaN, ours are still computed). Raises ``BadInput`` (``hta_missing``) when HTA
    is not installed.

    HTA reads whole folders: for one file it gets a temporary folder holding only a symlink to
    it (removed afterwards). Given the file's parent instead, HTA read every sibling trace too,
    logged a "same rank" line for each and kept another file's figure for the rank."""
    from analyzer.contract.errors import BadInput, Reason

    if not hta_available():
        raise BadInput(ts.root, Reason.HTA_MISSING, "--crosscheck hta needs HolisticTraceAnalysis",
                       "pip install 'paritytrace[hta]'")
    notes = [SCOPE_NOTE]
    try:
        if ts.root.is_dir():
            hta = run_hta_overlap(ts.root)
        else:
            with tempfile.TemporaryDirectory(prefix="paritytrace-hta-") as tmp:
                (Path(tmp) / ts.root.name).symlink_to(ts.root.resolve())
                hta = run_hta_overlap(Path(tmp))
    except Exception as exc:  # HTA's own failure: said in one line, ours still shown
        text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        first = (text.strip().splitlines() or [""])[0][:300]  # KeyError's str() adds quotes
        notes.append(f"HTA failed: {type(exc).__name__}: {first} (HTA's column left empty; "
                     "our figures are unaffected)")
        hta = pd.DataFrame({"rank": pd.Series([], dtype="int64"),
                            "hta_overlap_pct": pd.Series([], dtype=float)})
    return compare(ts, hta), notes


def run_hta_overlap(trace_dir: Path) -> pd.DataFrame:
    """HTA's get_comm_comp_overlap on ``trace_dir``: columns rank, hta_overlap_pct.

    Raises ``ImportError`` when HTA is not installed, and whatever HTA raises. HTA needs one
    folder holding only one job's traces with distributedInfo.rank (it reads the rank from the
    trace too)."""
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.WARNING)
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    df = analysis.get_comm_comp_overlap(visualize=False)
    return pd.DataFrame({"rank": df["rank"].astype("int64"),
                         "hta_overlap_pct": df["comp_comm_overlap_pctg"].astype(float)})


def step_names(events: pd.DataFrame) -> set[str]:
    """The distinct ProfilerStep names of one rank's event table (HTA's test: name contains
    "ProfilerStep")."""
    cpu = ~events["is_gpu"].to_numpy()
    names = events["name"].to_numpy()[cpu].astype(str)
    return {n for n in set(names.tolist()) if _STEP.search(n)}


def hta_scope_overlap(events: pd.DataFrame, filtered: bool) -> dict[str, int]:
    """Our overlap on HTA's scope for one rank's event table (``analyzer.api.load_events``).

    ``filtered``: the traces name at least two ProfilerSteps (module docstring), so HTA's filter
    applies: CPU events starting before this rank's last ProfilerStep start are kept, GPU
    kernels whose correlation id (-1 when missing, as HTA's parser) one of them carries are
    kept. Returns ns and counts: overlap_ns (|∪comm ∩ ∪compute| of the kept kernels), comm_ns
    (|∪comm|), last_step_dropped (comm/compute kernels HTA drops whose launch is in or after
    the last ProfilerStep), unlaunched_dropped (comm/compute kernels dropped with no CPU event
    carrying their correlation); sub_us: a kept kernel starts or ends off a whole µs, and then
    the times are rounded as HTA rounds them (module docstring)."""
    gpu = events["is_gpu"].to_numpy()
    role = events["role"].to_numpy().astype(object)
    names = events["name"].astype(str).to_numpy()
    # HTA's kernel types by name alone (hta/utils/utils.py get_kernel_type), not our roles:
    # communication HTA does not name (symm_mem, hccl, ...) is computation to HTA
    uniq, codes = np.unique(names, return_inverse=True)
    hta_comm = np.array([_HTA_COMM.match(n) is not None for n in uniq], bool)[codes]
    hta_comp = np.array([_HTA_NOT_COMPUTE.match(n) is None for n in uniq], bool)[codes]
    device = gpu & (role != "annotation")
    is_comm = device & hta_comm
    counted = is_comm | (device & hta_comp)
    keep = counted.copy()
    last_dropped = unlaunched = 0
    if filtered:
        name = events["name"].to_numpy().astype(str)
        ts = events["ts_ns"].to_numpy()
        corr = events["correlation"].to_numpy()
        is_step = ~gpu & np.array([bool(_STEP.search(n)) for n in name], dtype=bool)
        if is_step.any():
            cutoff = ts[is_step].max()
            kept_cpu = ~gpu & (ts < cutoff)
            in_kept = np.isin(corr, np.unique(corr[kept_cpu]))
            in_any = np.isin(corr, np.unique(corr[~gpu]))
            keep = counted & in_kept
            last_dropped = int((counted & ~in_kept & in_any).sum())
            unlaunched = int((counted & ~in_any).sum())
    s, e = events["ts_ns"].to_numpy(), events["end_ns"].to_numpy()
    sub_us = bool(((s[keep] % 1000) != 0).any() or ((e[keep] % 1000) != 0).any())
    if sub_us:  # HTA trace_parser.round_down_time_stamps: start up, end down, to whole µs
        s, e = -(-s // 1000) * 1000, e // 1000 * 1000
    comm = iv.merge(s[keep & is_comm], e[keep & is_comm])
    comp = iv.merge(s[keep & ~is_comm], e[keep & ~is_comm])
    return {"overlap_ns": int(iv.measure(iv.intersect(comm, comp))),
            "comm_ns": int(iv.measure(comm)), "last_step_dropped": last_dropped,
            "unlaunched_dropped": unlaunched, "sub_us": sub_us}


def _scopes(job) -> dict[int, dict[str, int]]:
    """``hta_scope_overlap`` of every rank of ``job`` (the traces decoded again: HTA's scope
    needs the events, which the cached tables do not hold)."""
    from analyzer.ingest.pipeline import classified

    events = {rt.rank: classified(rt.path)[0] for rt in job.ranks}
    names: set[str] = set()
    for ev in events.values():
        names |= step_names(ev)
    return {r: hta_scope_overlap(ev, filtered=len(names) >= 2) for r, ev in events.items()}


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
        elif math.isnan(hv) and not sc["comm_ns"]:
            why.append("no communication kernel in HTA's scope: overlap undefined")
        elif math.isnan(hv):
            why.append("HTA gave no figure for this rank")
        elif not math.isnan(whole) and abs(whole - hv) > 0.005 + 1e-9:
            why.append("same scope and rounding, different figure: HTA names communication "
                       "by kernel name only (^nccl.*Kernel)")
        if not math.isnan(whole) and not math.isnan(step) and abs(whole - step) > 0.005:
            scope = []
            if sc["last_step_dropped"]:
                scope.append(f"HTA drops the last ProfilerStep ({sc['last_step_dropped']} kernels)")
            if sc["unlaunched_dropped"]:
                scope.append(f"HTA drops {sc['unlaunched_dropped']} kernels with no launch in "
                             "the trace")
            scope.append("HTA pools its steps into one figure; ours counts device work in the "
                         "step that launched it")
            why.append("scope: " + ", ".join(scope))
        rows.append((rt.rank, hv, whole, step,
                     hv - whole if not (math.isnan(hv) or math.isnan(whole)) else math.nan,
                     "; ".join(why)))
    return pd.DataFrame(rows, columns=COLUMNS)
