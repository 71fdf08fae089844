"""The analyzer's library facade, for notebooks and scripts (no command imports it).

``load_tables(path)``: a job's per-rank tables, what every command reads (analyzer/ingest/pipeline.py);
the small analyses are functions of them (``collectives.by_kind(t.collectives)``,
``collectives.match_ranks(t.collectives, clock.clock_offsets(t.collectives))`` ...). ``load_events(path)``: one trace file's event
table, decoded and classified by the same rules, for a closer look. It never imports torch.
All times are int64 nanoseconds, converted once at parse time.

Event table (``load_events``; one row per complete event, ``ph == "X"``), at least these
columns:

    name         str     event name as in the trace
    cat          str     Kineto category: cpu_op, kernel, gpu_memcpy, gpu_memset, cuda_runtime,
                         user_annotation, gpu_user_annotation, python_function, ...
    pid, tid     str     normalised to strings
    event_idx    int64   position of the event in the file's traceEvents list
    ts_ns        int64   start, ns (trace clock)
    dur_ns       int64   duration, ns
    end_ns       int64   ts_ns + dur_ns
    is_gpu       bool    the event runs on a GPU stream
    stream       int64   CUDA stream, -1 for CPU events (GPU events without a ``stream``
                         argument: the stream their tid names)
    stream_arg   int64   the ``stream`` argument as the trace writes it, on every event; -1
                         when absent or not a number (HTA's reading, crosscheck_hta.py)
    correlation  int64   -1 when absent
    external_id  int64   -1 when absent
    step         int64   ProfilerStep number the event starts in; -1 outside every step.
                         In whole-trace mode (no ProfilerStep) every event is in step 0.
    role         str     compute | comm | comm_enqueue | memcpy | memset | sync | step |
                         annotation | other | data (DataLoader ``__next__`` ranges, issue 10)
    coll_kind    str|None all_gather | reduce_scatter | all_reduce | broadcast | all_to_all |
                         send_recv | barrier | other (comm and comm_enqueue rows only)
    bytes        int64   bytes of the collective as nccl-tests counts them, -1 unknown
    pg           str|None process group name, when the trace says it (or the tracer's
                         ``paritytrace::pg`` tag around the collective: analyzer/ingest/commid.py)
    pg_desc      str|None process group description ("mesh_shard", "default_pg" ...), when
                         the trace says it (Process Group Description, else pg_config)
    peer         int64   global rank a send / recv's tag names, -1 unknown (and on other rows)
    rule         str     id of the rule that classified the row (see analyzer/ingest/classify.py)

Added columns (issue 3): thread_name (str), coll_name / dtype / pg_ranks (str|None, collective
args as the trace says), in_nelems / out_nelems / group_size / shape_numel / shape_elem_bytes
/ shape2_numel (int64, -1 unknown; shape_*: the first tensor input's elements and element
size, shape2_numel: the second's), launch_row (row of the CPU event that launched a GPU event,
-1 none), paired_row (gloo op <-> c10d enqueue pairing, -1 none). Rows are sorted by ts_ns.
Strings are pandas categoricals (name, cat, pid, tid, role, coll_kind, rule).

Step windows (``load_events``' second table, ``RankTables.steps``): ``STEP_WINDOWS_SCHEMA``
(analyzer/contract/schemas.py, with the other per-rank tables).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyzer.ingest import pipeline, ranktables


def load_tables(path: Path | str, *, allow_incomplete: bool = False, jobs: int | None = None
                ) -> pipeline.JobTables:
    """Load a run directory, a folder of Kineto traces or one trace file. Raises ``BadInput``.

    ``path``: a run directory (has ``manifest.json``, or ``numerics.parquet`` /
    ``steps.parquet`` without a manifest: an incomplete run, refused unless
    ``allow_incomplete``), a folder of ``*.json`` / ``*.json.gz`` traces, or one trace file.
    Each rank is reduced, in one of ``jobs`` processes (default min(cpu count, files)), to its
    tables (breakdown, collectives, prefetch, first-step timeline), cached in the user's cache:
    no events are held, so memory follows the largest rank. Rank rule, cache and errors:
    analyzer/ingest/pipeline.py. All problems of a folder are raised together as one ``BadInput`` whose
    ``problems`` lists them."""
    return pipeline.load_tables(path, allow_incomplete=allow_incomplete, jobs=jobs)


def load_events(path: Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(event table, step windows) of the one trace file ``path`` (module docstring), decoded
    and classified by the rules every command uses; no cache, no rank rule (``load_tables``
    says the rank). The table's ``attrs`` hold device_kind, main_tid, whole_trace_mode and
    warnings (``RankTables`` fields). Raises ``BadInput``."""
    events, info = ranktables.classified(Path(path))
    events.attrs = {k: info[k] for k in ("device_kind", "main_tid", "whole_trace_mode",
                                         "warnings")}
    return events, info["steps"]
