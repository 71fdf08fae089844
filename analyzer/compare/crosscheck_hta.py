"""Cross-check our communication/computation overlap with HolisticTraceAnalysis (optional dep).

HTA 0.5.0 ``TraceAnalysis.get_comm_comp_overlap`` reports, per rank, the overlap of merged NCCL
kernels (``^nccl.*Kernel``) with merged computation kernels (every other GPU event except
Memcpy/Memset/Sync) as a percentage of communication time, over the whole profiled window,
rounded to 0.01 %. Ours is the same set algebra (analyzer/analyses/breakdown.py) but per ProfilerStep,
with GPU events attributed to the step that launched them; ``whole_trace_overlap`` applies
HTA's scope (every GPU event of the trace) and must agree to HTA's rounding.
Differences to expect: kernels launched outside every ProfilerStep (counted by HTA, not by our
per-step figure), several steps (HTA pools them), CPU-only traces (HTA has no kernels: NaN).
"""

from __future__ import annotations

import logging
import math
import tempfile
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

COLUMNS = ["rank", "hta_overlap_pct", "ours_whole_trace_pct", "ours_step_pct", "diff_pct",
           "explanation"]


def hta_available() -> bool:
    """True when HolisticTraceAnalysis can be imported."""
    try:
        import hta.trace_analysis  # noqa: F401
    except ImportError:
        return False
    return True


def crosscheck(ts) -> pd.DataFrame:
    """``compare`` with HTA's figures for ``ts.root``, a folder or one trace file. Raises
    ``BadInput`` (``hta_missing``) when HTA is not installed.

    HTA reads whole folders: for one file it gets a temporary folder holding only a symlink to
    it (removed afterwards). Given the file's parent instead, HTA read every sibling trace too,
    logged a "same rank" line for each and kept another file's figure for the rank."""
    from analyzer.contract.errors import BadInput, Reason

    if not hta_available():
        raise BadInput(ts.root, Reason.HTA_MISSING, "--crosscheck hta needs HolisticTraceAnalysis",
                       "pip install 'paritytrace[hta]'")
    if ts.root.is_dir():
        return compare(ts, run_hta_overlap(ts.root))
    with tempfile.TemporaryDirectory(prefix="paritytrace-hta-") as tmp:
        (Path(tmp) / ts.root.name).symlink_to(ts.root.resolve())
        return compare(ts, run_hta_overlap(Path(tmp)))


def run_hta_overlap(trace_dir: Path) -> pd.DataFrame:
    """HTA's get_comm_comp_overlap on ``trace_dir``: columns rank, hta_overlap_pct.

    Raises ``ImportError`` when HTA is not installed. HTA needs one folder holding only one
    job's traces with distributedInfo.rank (it reads the rank from the trace too)."""
    from hta.trace_analysis import TraceAnalysis

    logging.getLogger("hta").setLevel(logging.WARNING)
    analysis = TraceAnalysis(trace_dir=str(trace_dir))
    df = analysis.get_comm_comp_overlap(visualize=False)
    return pd.DataFrame({"rank": df["rank"].astype("int64"),
                         "hta_overlap_pct": df["comp_comm_overlap_pctg"].astype(float)})


def compare(job, hta: pd.DataFrame) -> pd.DataFrame:
    """Side by side, per rank of ``job`` (``analyzer.ingest.pipeline.JobTables``): HTA's figure, ours in
    HTA's scope (``RankTables.whole_overlap_ns`` / ``whole_comm_ns``), ours over the
    ProfilerSteps, and why they differ (empty explanation when they agree to HTA's 0.01 %
    rounding). Columns ``COLUMNS``; percentages of communication time, NaN when undefined."""
    b = job.breakdown
    rows = []
    for rt in job.ranks:
        comm = rt.whole_comm_ns
        whole = 100.0 * rt.whole_overlap_ns / comm if comm else math.nan
        mine = b[b["rank"] == rt.rank]
        step_comm = int(mine["comm_ns"].sum())
        step = 100.0 * int(mine["overlap_ns"].sum()) / step_comm if step_comm else math.nan
        h = hta.loc[hta["rank"] == rt.rank, "hta_overlap_pct"]
        hv = float(h.iat[0]) if len(h) else math.nan
        why = []
        if math.isnan(hv):
            why.append("HTA gave no figure for this rank")
        elif not math.isnan(whole) and abs(whole - hv) > 0.005 + 1e-9:
            why.append("same scope but different figure: kernel classification differs")
        if not math.isnan(whole) and not math.isnan(step) and abs(whole - step) > 0.005:
            why.append("HTA pools the whole trace; kernels launched outside the ProfilerSteps "
                       "or several steps change the pooled figure")
        if rt.device_kind == "cpu":
            why.append("CPU-only rank: HTA counts GPU kernels only")
        rows.append((rt.rank, hv, whole, step,
                     hv - whole if not (math.isnan(hv) or math.isnan(whole)) else math.nan,
                     "; ".join(why)))
    return pd.DataFrame(rows, columns=COLUMNS)
