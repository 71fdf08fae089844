"""Where a cold ``analyzer report`` spends its time, stage by stage (issue 34). Asserts nothing.

``python3 bench/stage_probe.py LOG ARGS...`` runs ``analyzer report ARGS...`` as the console
script does (same process pool, workers forked from this process), with the functions that
make up each stage (``STAGES``) wrapped: every call adds its wall time (``time.perf_counter``)
and the process' CPU time (``time.process_time``) to that function's totals in the process
that ran it. Each process appends its totals to ``LOG`` as one JSON line: a worker after each
rank it parsed (it ends by ``os._exit``, no hook runs), the caller at the end. The product's
code is unchanged; the wrappers cost about 1 µs a call, on functions called once per rank or
per command (none per event).

``stage_table(LOG, total_cpu_s)`` turns the lines into exclusive stages (a function's time
less that of the wrapped functions it calls, ``STAGES``' parents), in CPU seconds summed over
the processes and as shares of ``total_cpu_s`` (the command's CPU time, wait4): what is left
is "other" (the interpreter's start, the pool's start, the caller's waits).
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Stage:
    """A stage of the report: the ``functions`` (``module:attribute.path``) whose time it is,
    less that of its ``children``' functions (stage names)."""

    name: str
    functions: tuple[str, ...]
    children: tuple[str, ...] = ()


_TABLES = ("analyzer.analyses.breakdown:timeline_rows", "analyzer.analyses.breakdown:whole_trace_overlap",
           "analyzer.analyses.breakdown:comm_shares", "analyzer.analyses.breakdown:rank_breakdown",
           "analyzer.analyses.collectives:rank_collectives", "analyzer.analyses.straggler:gap_parts",
           "analyzer.analyses.prefetch:prefetch_table", "analyzer.analyses.memory:device_peaks")
STAGES = (
    Stage("start-up: interpreter, typer, options (caller, to write_report)", ()),
    Stage("start-up: worker imports (pool initializer)", ("analyzer.ingest.pool:_init_worker",)),
    Stage("per rank: read + SHA-256 of the file", ("analyzer.ingest.ranktables:rank_tables",),
          ("per rank: gunzip", "per rank: decode: the rest (freeing the decoded events)",
           "per rank: [memory] events", "per rank: classify (rules, launches)",
           "per rank: per-rank tables", "per rank: cache write")),
    Stage("per rank: gunzip", ("analyzer.ingest.decode:decompress",)),
    Stage("per rank: decode: JSON (msgspec)", ("analyzer.ingest.decode:_decode_trace",)),
    Stage("per rank: decode: event columns", ("analyzer.ingest.decode:_columns",)),
    Stage("per rank: decode: the rest (freeing the decoded events)",
          ("analyzer.ingest.decode:parse", "analyzer.ingest.decode:columns"),
          ("per rank: decode: JSON (msgspec)", "per rank: decode: event columns")),
    Stage("per rank: [memory] events", ("analyzer.ingest.decode:memory_events",)),
    Stage("per rank: classify (rules, launches)", ("analyzer.ingest.classify:classify",),
          ("per rank: steps", "per rank: collective identity")),
    Stage("per rank: steps", ("analyzer.ingest.classify:assign_steps",)),
    Stage("per rank: collective identity", (
        "analyzer.ingest.classify:_Identity.__init__", "analyzer.ingest.classify:_comm_kernels",
        "analyzer.ingest.classify:_gloo_ops", "analyzer.ingest.classify:_Identity.enqueue",
        "analyzer.ingest.classify:_fake_calls", "analyzer.ingest.classify:_Identity.table")),
    Stage("per rank: per-rank tables", _TABLES),
    Stage("per rank: cache write", ("analyzer.ingest.tablecache:write_tables",)),
    Stage("imports on a miss: pandas, the analysis (caller)", ("analyzer.compare.reportfiles:_analysed",),
          ("job: discover, load (cache reads, rank rule, same-job check)",
           "cross-rank phase and run figures", "report build: ranking, findings, JSON")),
    Stage("job: discover, load (cache reads, rank rule, same-job check)",
          ("analyzer.ingest.pipeline:load_run", "analyzer.ingest.rundirs:discover"),
          ("per rank: read + SHA-256 of the file",)),
    Stage("cross-rank phase and run figures", ("analyzer.compare.runs:summarize_run",)),
    Stage("report build: ranking, findings, JSON", ("analyzer.compare.runs:_report",
                                                    "analyzer.contract.report_types:encode")),
    Stage("rendering and writing (md, html, json, report cache)",
          ("analyzer.compare.reportfiles:write_report",),
          ("imports on a miss: pandas, the analysis (caller)",)),
)
"""The stages, in the order a cold report runs them. ``rank_tables``' own time (less its
children) is reading the file and hashing it; ``_analysed``'s own time is the imports it does
before the analysis (and the pool's start)."""

_TOTALS: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
_LOG_FD: list[int] = []
_OWNER = [os.getpid()]


def _flush() -> None:
    """Append this process' totals to the log and start again from zero."""
    if _TOTALS:
        line = json.dumps({"pid": os.getpid(), "totals": dict(_TOTALS)}) + "\n"
        os.write(_LOG_FD[0], line.encode())  # O_APPEND: one write per line, lines never mix
        _TOTALS.clear()


def _wrap(spec: str, owner) -> None:
    """Wrap the function ``spec`` names in the module ``owner`` (just imported)."""
    *path, name = spec.partition(":")[2].split(".")
    for part in path:
        owner = getattr(owner, part)
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def timed(*args, **kwargs):
        if _OWNER[0] != os.getpid():  # a forked worker: not its parent's totals
            _OWNER[0] = os.getpid()
            _TOTALS.clear()
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            t = _TOTALS[spec]
            t[0] += time.perf_counter() - w0
            t[1] += time.process_time() - c0
            t[2] += 1
            if spec == "analyzer.ingest.ranktables:rank_tables" and os.getpid() != _LOG_FD[1]:
                _flush()  # a worker: its totals so far, it may end without a hook

    setattr(owner, name, timed)


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Wrap a module's stage functions right after it is imported, wherever the command
    imports it: wrapping them up front would import pandas and the analysis before the fork,
    which the command does not (its workers import them while the caller imports its own)."""

    def __init__(self, specs: list[str]):
        self.pending: dict[str, list[str]] = defaultdict(list)
        for spec in specs:
            self.pending[spec.partition(":")[0]].append(spec)

    def find_spec(self, name, path=None, target=None):
        if name not in self.pending:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        run = spec.loader.exec_module
        specs = self.pending.pop(name)

        def exec_module(module):
            run(module)
            for s in specs:
                _wrap(s, module)

        spec.loader.exec_module = exec_module
        return spec


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit("usage: python3 bench/stage_probe.py LOG ARGS... (the arguments of "
                         "analyzer report; LOG: the file the stage times are appended to)")
    log, args = sys.argv[1], sys.argv[2:]
    _LOG_FD[:] = [os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), os.getpid()]
    sys.path.insert(0, str(REPO))
    sys.meta_path.insert(0, _WrapOnImport([f for s in STAGES for f in s.functions]))
    from analyzer.compare import reportfiles

    write_report = reportfiles.write_report

    def first_call(*a, **k):  # the caller's CPU from its start to the command proper
        _TOTALS["start-up"][1] += time.process_time()
        _TOTALS["start-up"][2] += 1
        return write_report(*a, **k)

    reportfiles.write_report = first_call
    sys.argv = ["analyzer", "report", *args]
    from analyzer.cli import app

    try:
        app.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    _flush()
    sys.stdout.flush()
    os._exit(code)  # as the console script ends (analyzer/cli/app.py run)


def stage_table(log: Path, total_cpu_s: float) -> list[tuple[str, float, float]]:
    """[(stage, CPU seconds summed over processes, share of ``total_cpu_s``)] in ``STAGES``'
    order, then "other" (the rest of ``total_cpu_s``). A stage's time in a process is that of
    its functions less that of its children's functions, where its functions ran there."""
    per_pid: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for line in Path(log).read_text().splitlines():
        rec = json.loads(line)
        for spec, (_, c, _) in rec["totals"].items():
            per_pid[rec["pid"]][spec] += c
    by_name = {s.name: s for s in STAGES}
    cpu: dict[str, float] = defaultdict(float)
    for t in per_pid.values():
        cpu[STAGES[0].name] += t["start-up"]
        for s in STAGES[1:]:
            mine = sum(t[f] for f in s.functions)
            if mine:
                cpu[s.name] += mine - sum(t[f] for c in s.children for f in by_name[c].functions)
    rows = [(s.name, cpu[s.name], cpu[s.name] / total_cpu_s) for s in STAGES]
    rest = total_cpu_s - sum(v for _, v, _ in rows)
    return rows + [("other: interpreter starts, pool, waits", rest, rest / total_cpu_s)]


if __name__ == "__main__":
    main()
