"""The analyzer's facade: load traces, then small analyses, each a function of tables.

This module is the interface the report (``reports/``) builds on. It never imports torch.
All times are int64 nanoseconds, converted once at parse time.

Event table (``RankTrace.events``; one pandas DataFrame per rank, one row per complete event,
``ph == "X"``), at least these columns:

    name         str     event name as in the trace
    cat          str     Kineto category: cpu_op, kernel, gpu_memcpy, gpu_memset, cuda_runtime,
                         user_annotation, gpu_user_annotation, python_function, ...
    pid, tid     str     normalised to strings
    ts_ns        int64   start, ns (trace clock)
    dur_ns       int64   duration, ns
    end_ns       int64   ts_ns + dur_ns
    is_gpu       bool    the event runs on a GPU stream
    stream       int64   CUDA stream, -1 for CPU events
    correlation  int64   -1 when absent
    external_id  int64   -1 when absent
    step         int64   ProfilerStep number the event starts in; -1 outside every step.
                         In whole-trace mode (no ProfilerStep) every event is in step 0.
    role         str     compute | comm | comm_enqueue | memcpy | memset | sync | step |
                         annotation | other | data (DataLoader ``__next__`` ranges, issue 10)
    coll_kind    str|None all_gather | reduce_scatter | all_reduce | broadcast | all_to_all |
                         send_recv | barrier | other (comm and comm_enqueue rows only)
    bytes        int64   bytes of the collective as nccl-tests counts them, -1 unknown
    pg           str|None process group name, when the trace says it
    rule         str     id of the rule that classified the row (see analyzer/classify.py)

Added columns (issue 3): thread_name (str), coll_name / dtype / pg_ranks (str|None, collective
args as the trace says), in_nelems / out_nelems / group_size / shape_numel / shape_elem_bytes
(int64, -1 unknown), launch_row (row of the CPU event that launched a GPU event, -1 none),
paired_row (gloo op <-> c10d enqueue pairing, -1 none). Rows are sorted by ts_ns.
Strings are pandas categoricals (name, cat, pid, tid, role, coll_kind, rule).

Step windows (``RankTrace.steps``): one row per ProfilerStep: step, cpu_start_ns, cpu_end_ns
(the CPU span), start_ns, end_ns (the window the breakdown measures: the CPU span extended to
the end of the last GPU / gloo event the step launched). Whole-trace mode: one row, step 0,
the whole trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd


@dataclass(kw_only=True, slots=True)
class RankTrace:
    """One rank's parsed trace."""

    rank: int
    """Rank number."""
    path: Path
    """The trace file."""
    rank_source: str
    """How the rank was found: "distributedInfo", "file name", "single file"."""
    world_size: int | None
    """World size the trace says (distributedInfo.world_size), None when it does not."""
    device_kind: str
    """"gpu" when the trace has GPU kernels, else "cpu"."""
    events: pd.DataFrame
    """The event table described in the module docstring."""
    warnings: list[str] = field(default_factory=list)
    """Problems skipped while parsing (bad ts/dur counts ...), one line each."""
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Step windows (module docstring)."""
    main_tid: str | None = None
    """The main thread's tid on a CPU-only rank (classify.py says how it is found)."""
    whole_trace_mode: bool = False
    """No ProfilerStep in this rank's trace: step 0 is the whole trace."""
    distributed_info: dict[str, Any] | None = None
    """The trace's distributedInfo as written (backend, pg_config ...), None when absent."""


@dataclass(kw_only=True, slots=True)
class TraceSet:
    """Every rank of one job (one run directory or one folder of foreign traces)."""

    root: Path
    """The folder that was loaded."""
    ranks: list[RankTrace]
    """Sorted by rank."""
    world_size: int
    """World size the traces agree on (number of files when none says)."""
    manifest: dict[str, Any] | None
    """The run's manifest when ``root`` is a tracer run directory, else None."""
    whole_trace_mode: bool
    """True when no ProfilerStep was found: each rank's whole trace is step 0."""
    warnings: list[str] = field(default_factory=list)
    """Load-level notes (ranks missing, ranks in whole-trace mode ...), one line each."""

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks in ``range(world_size)`` with no trace."""
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in have]


def load_traces(path: Path | str, *, allow_incomplete: bool = False, jobs: int | None = None) -> TraceSet:
    """Load a tracer run directory or a folder of Kineto traces. Raises ``BadInput``.

    ``path``: a run directory (has ``manifest.json``, or ``numerics.parquet`` /
    ``steps.parquet`` without a manifest: an incomplete run, refused unless
    ``allow_incomplete``), a folder of ``*.json`` / ``*.json.gz`` traces, or one trace file.
    Ranks are parsed in ``jobs`` processes (default min(cpu count, files)) through a Parquet
    cache (analyzer/load.py). Rank rule and errors: analyzer/load.py. All problems of a folder
    are raised together as one ``BadInput`` whose ``problems`` lists them.
    """
    from analyzer.load import load_traceset

    return load_traceset(Path(path), allow_incomplete=allow_incomplete, jobs=jobs)


def load_tables(path: Path | str, *, allow_incomplete: bool = False, jobs: int | None = None):
    """Like ``load_traces``, but each rank's events are reduced, in the process that parses it,
    to the tables the report needs (breakdown, collectives, prefetch, first-step timeline), and
    those are cached beside the trace. Returns ``analyzer.tables.TraceTables``: no events held,
    so memory follows the largest rank, not the sum. Same errors as ``load_traces``."""
    from analyzer.tables import load_tables as _load

    return _load(Path(path), allow_incomplete=allow_incomplete, jobs=jobs)


def breakdown(ts: TraceSet) -> pd.DataFrame:
    """Per rank and step time breakdown.

    Columns: rank, step, step_start_ns, step_ns, compute_ns, comm_ns, overlap_ns,
    exposed_comm_ns, other_ns, idle_ns, overlap_frac (overlap_ns / comm_ns, NaN when no comm),
    data_wait_ns, data_wait_frac (data_wait_ns / step_ns), input_bound (bool; issue 10).
    Identity: compute_ns + exposed_comm_ns + data_wait_ns + other_ns + idle_ns == step_ns
    exactly.
    Definitions: analyzer/breakdown.py. Rows sorted by rank, step.
    """
    from analyzer.breakdown import COLUMNS, rank_breakdown

    parts = [rank_breakdown(r.rank, r.events, r.steps, r.device_kind, r.main_tid)
             for r in ts.ranks]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True)


def collectives(ts: TraceSet) -> pd.DataFrame:
    """One row per collective instance per rank.

    Columns: rank, step, pg, seq (order within pg on that rank), kind, start_ns, end_ns, dur_ns,
    bytes, rule. Added: name, group_size, enqueue_start_ns, enqueue_end_ns (analyzer/collectives.py).
    """
    from analyzer.collectives import COLUMNS, rank_collectives

    parts = [rank_collectives(r.rank, r.events, ts.world_size) for r in ts.ranks]
    if not parts:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(parts, ignore_index=True)


def comm_by_kind(ts: TraceSet) -> pd.DataFrame:
    """Per rank and collective kind: rank, kind, count, time_ns, bytes, algbw_gbps, busbw_gbps.

    nccl-tests definitions (analyzer/collectives.py ``by_kind``)."""
    from analyzer.collectives import by_kind

    return by_kind(collectives(ts))


def cross_rank(ts: TraceSet) -> pd.DataFrame:
    """Collectives matched across ranks by (pg, seq).

    Columns: pg, seq, kind, n_ranks, start_skew_ns, transfer_ns (shortest duration across ranks),
    max_wait_ns, straggler_rank (last to start). Added: start_ns, kinds_agree.
    Start skew compares clocks of different ranks: meaningful on one host (one clock), and
    across hosts only as far as their clocks agree.
    """
    from analyzer.collectives import match_ranks

    return match_ranks(collectives(ts))


def timeline(ts: TraceSet, rank: int, step: int) -> pd.DataFrame:
    """Merged intervals of one rank and step for plotting.

    Columns: lane ("compute" | "comm"), kind (coll_kind for comm, "" for compute), start_ns,
    end_ns, relative to the trace clock. Raises ``KeyError`` for an unknown rank or step.
    """
    from analyzer.breakdown import timeline_rows

    rt = next((r for r in ts.ranks if r.rank == rank), None)
    if rt is None:
        raise KeyError(f"no rank {rank} in {ts.root}")
    win = rt.steps[rt.steps["step"] == step]
    if win.empty:
        raise KeyError(f"no step {step} on rank {rank}")
    lo, hi = int(win["start_ns"].iat[0]), int(win["end_ns"].iat[0])
    ev = rt.events[rt.events["step"].to_numpy() == step]
    return timeline_rows(ev, rt.device_kind, rt.main_tid, lo, hi, rt.events["end_ns"].to_numpy())
