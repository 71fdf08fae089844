"""The one ingest path of every command: a job's trace files -> per-rank tables, cached.

discover (analyzer/ingest/rundirs.py: the job's trace files and its manifest, each read once) ->
per rank: read, decode, classify, tables (analyzer/ingest/ranktables.py, through the parse cache
analyzer/ingest/tablecache.py) -> rank rule (below) -> the traces' SHA-256 against the manifest
-> same-job check (analyzer/ingest/samejob.py) -> ``JobTables``.

Each rank is decoded, classified and reduced to its small tables in a worker process
(analyzer/ingest/pool.py), or a Dask worker with ``--scheduler`` (analyzer/ingest/cluster.py),
which sends back only them: the parent never holds any rank's events and each worker one
rank's at a time, so peak memory follows (largest rank) x (workers), not the sum of the ranks.
The parent holds each rank's small tables (step windows, breakdown, one step's timeline:
rows per step) and, until the job's pass ``PARITYTRACE_TABLES_MEMORY``, its collectives and
prefetch tables; past that budget each arriving rank's two are put on disk
(analyzer/ingest/spill.py) and the cross-rank phase reads batches of consecutive ranks
(``JobTables.batches``, analyzer/analyses/crossrank.py). With ``--tables-out`` each job's tables
are also written as a Parquet dataset (analyzer/ingest/dataset.py).

Rank rule (ours; its row in ARCHITECTURE.md): ``distributedInfo.rank`` when every file has one; a
single file without one is rank 0 of 1; several files without one take the number from a
``rank<N>`` / ``worker<N>`` pattern in the file name only when every file has one and all
differ; anything else (some files with a rank and some without, names without a number,
duplicates) is ``BadInput`` naming the files. Files of one folder must agree on the world size,
and come from one job (analyzer/ingest/samejob.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.ingest import distinfo
from analyzer.ingest.commid import group_fallback
from analyzer.ingest.ranktables import RankTables, cached, no_events, tables_worker
from analyzer.ingest.samejob import check_same_job, distributed_info_mismatches
from analyzer.ingest.spill import Spill

BATCH_BYTES = 64 * 2**20
"""Bytes of a batch of ranks' table in the cross-rank phase (``JobTables.batches``)."""
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


@dataclass(kw_only=True, slots=True)
class JobTables:
    """Every rank's tables of one job: what every command reads (no events held)."""

    root: Path
    """The run directory, folder of traces or trace file that was loaded."""
    ranks: list[RankTables]
    """Sorted by rank."""
    world_size: int
    """World size: the traces', else the manifest's, else max(ranks seen, highest rank + 1)."""
    manifest: schemas.Manifest | None
    """The run's manifest, None for foreign traces."""
    whole_trace_mode: bool
    """No rank has a ProfilerStep: each rank's whole trace is step 0."""
    warnings: list[str] = field(default_factory=list)
    """Load-level notes (files skipped, ranks missing, ranks in whole-trace mode ...)."""
    breakdown: pd.DataFrame = field(default_factory=pd.DataFrame)
    """Per rank and step time breakdown (``schemas.BREAKDOWN_SCHEMA``), sorted by rank,
    step. Identity: compute_ns + exposed_comm_ns + data_wait_ns + other_ns + idle_ns ==
    step_ns exactly."""
    spill: Any = None
    """The ``spill.Spill`` holding the ranks' spilled tables (kept alive with the job)."""

    def __enter__(self) -> "JobTables":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Remove the spilled tables now. Callers close (``with load_run(...) as job``) rather
        than leave it to the garbage collector: a Ctrl-C / SIGTERM that lands in a collected
        object's finalizer is printed and dropped, so the command would run on and exit 0."""
        if self.spill is not None:
            self.spill.close()

    def rank_table(self, rt: RankTables, name: str, columns: list[str] | None = None
                   ) -> pd.DataFrame:
        """Table ``name`` of rank ``rt`` (only ``columns``, None: all), from memory or from
        disk (analyzer/ingest/spill.py), with the rank and group-size fixes of
        ``RankTables.table``."""
        return rt.frame(name, columns)

    def each(self, name: str, columns: list[str] | None = None):
        """(rank tables, its table ``name``) of every rank in rank order, one rank read at a
        time (``rank_table``); ``batches`` groups them."""
        for rt in self.ranks:
            yield rt, self.rank_table(rt, name, columns)

    def batches(self, name: str, columns: list[str] | None = None,
                max_bytes: int | None = None):
        """(the ranks' tables, their tables ``name`` one below the other, in rank order) for
        consecutive ranks, each batch closed once it holds ``max_bytes`` (default
        ``BATCH_BYTES``; a rank larger than that is a batch of its own): the cross-rank
        phase's unit of work, so that a job of many small ranks costs a few pandas calls and
        one of large ranks holds one batch at a time. Each batch is put together in Arrow and
        made a pandas frame once."""
        limit = BATCH_BYTES if max_bytes is None else max_bytes
        names = columns or schemas.TABLE_SCHEMAS[name].names
        held: list[RankTables] = []
        parts: list[pa.Table] = []
        size = 0
        for rt in self.ranks:
            held.append(rt)
            parts.append(rt.table(name, columns))
            size += parts[-1].nbytes
            if size >= limit:
                yield held, _concat(parts, names)
                held, parts, size = [], [], 0
        if held:
            yield held, _concat(parts, names)

    @property
    def collectives(self) -> pd.DataFrame:
        """One row per collective instance per rank (``schemas.COLLECTIVES_SCHEMA``), ranks in
        order, group_size falling back to the world size only when the trace's pg_config
        proves every group is the world (else -1, unknown: analyzer/ingest/commid.py
        ``group_fallback``); ``collectives.by_kind`` /
        ``match_ranks`` take it. Built on each call and holds every rank's rows: for the
        library API and ``analyzer merge``; ``report`` and ``summary`` walk ``batches``."""
        return _concat([rt.table("collectives") for rt in self.ranks],
                       schemas.COLLECTIVES_SCHEMA.names)

    @property
    def prefetch(self) -> pd.DataFrame:
        """``prefetch.prefetch_table`` rows of every rank (empty when none has FSDP labels);
        built on each call, as ``collectives``."""
        return _concat([rt.table("prefetch") for rt in self.ranks], schemas.PREFETCH_SCHEMA.names)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks in ``range(world_size)`` with no trace."""
        have = {r.rank for r in self.ranks}
        return [r for r in range(self.world_size) if r not in have]

    def timeline(self, rank: int, step: int) -> pd.DataFrame:
        """Merged intervals of ``rank`` and ``step`` for plotting: lane ("compute" | "comm"),
        kind ("" | the collective kind), start_ns, end_ns (trace clock). Only each rank's
        first step (>= 0) is kept; raises ``KeyError`` for another rank or step."""
        rt = next((r for r in self.ranks if r.rank == rank), None)
        if rt is None or rt.timeline_step != step or step < 0:
            raise KeyError(f"no timeline of rank {rank} step {step} in {self.root}")
        return rt.timeline


def _size_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the worker says what is wrong


def parse_files(paths: list[Path], jobs: int | None, *, worker=None, keep=None
                ) -> tuple[list[Any], list[BadInput]]:
    """``worker`` (a path -> a result, or the ``BadInput`` of a bad file; None: the per-rank
    tables, ``rank_tables``) over every path, in ``jobs`` processes (analyzer/ingest/pool.py),
    largest file first; ``keep`` (``spill.Spill.keep``, None: none) takes each result as it
    arrives. Returns the results in the order of ``paths`` and the problems (``BadInput``), so
    that all are reported. The default worker is given this process's size cap
    (``decode.max_trace_bytes`` for that many processes) as an argument, so a Dask worker,
    whose environment is not the client's, reads with the client's cap."""
    from functools import partial

    from analyzer.ingest.decode import cpu_count, max_trace_bytes
    from analyzer.ingest.pool import run_all

    if worker is None:
        procs = min(jobs or cpu_count(), max(1, len(paths)))
        worker = partial(tables_worker, max_bytes=max_trace_bytes(procs))

    # largest first (longest-processing-time-first scheduling): processes taking the next file
    # as they free up then end within about one small file of each other
    order = sorted(range(len(paths)), key=lambda i: -_size_bytes(paths[i]))
    results: list[Any] = [None] * len(paths)
    for i, r in zip(order, run_all(worker, [paths[i] for i in order], jobs, keep=keep)):
        results[i] = r
    ok = [r for r in results if not isinstance(r, BadInput)]
    bad = [r for r in results if isinstance(r, BadInput)]
    return ok, bad


def assign_ranks(files: list[RankTables]) -> tuple[list[tuple[int, str, RankTables]], int | None,
                                                    list[BadInput]]:
    """Apply the rank rule (module docstring). Returns ([(rank, rank_source, file)] sorted by
    rank, world size the traces say or None, problems: ``BadInput``)."""
    problems: list[BadInput] = []
    ranks = [f.dist.rank for f in files]
    with_rank = [f for f, r in zip(files, ranks) if r is not None]
    without = [f for f, r in zip(files, ranks) if r is None]
    out: list[tuple[int, str, RankTables]] = []
    if with_rank and without:
        problems.append(BadInput(
            ", ".join(str(f.path) for f in without), "mixed_rank_info",
            f"no distributedInfo.rank while {len(with_rank)} other file(s) of the folder have one",
            "put only one job's traces in the folder"))
        return out, None, problems
    if without:
        if len(without) == 1:
            out = [(0, "single file", without[0])]
        else:
            nums = [_RANK_IN_NAME.findall(f.path.name) for f in without]
            if any(not m for m in nums):
                names = ", ".join(str(f.path) for f, m in zip(without, nums) if not m)
                problems.append(BadInput(names, "no_rank",
                                         "no distributedInfo.rank and no rank<N>/worker<N> in "
                                         "the file name", "rename the files rank<N>.json or "
                                         "record with torch.distributed initialised"))
                return [], None, problems
            out = [(int(m[-1]), "file name", f) for f, m in zip(without, nums)]
    else:
        out = [(r, "distributedInfo", f) for f, r in zip(files, ranks)]  # type: ignore[misc]
    by_rank: dict[int, list[RankTables]] = {}
    for r, _, f in out:
        by_rank.setdefault(r, []).append(f)
    for r, fs in sorted(by_rank.items()):
        if len(fs) > 1:
            problems.append(BadInput(" and ".join(str(f.path) for f in fs), "duplicate_rank",
                                     f"both files are rank {r}",
                                     "keep one trace per rank in the folder"))
    problems += distributed_info_mismatches(files)
    sizes: dict[int, list[RankTables]] = {}
    for f in files:  # world_size: the trace's, read as dist reads it
        if f.world_size is not None:
            sizes.setdefault(f.world_size, []).append(f)
    world = None
    if len(sizes) > 1:
        desc = "; ".join(f"{ws} in {', '.join(str(f.path) for f in fs)}"
                         for ws, fs in sorted(sizes.items()))
        problems.append(BadInput(files[0].path.parent, "world_size_mismatch",
                                 f"world sizes disagree: {desc}",
                                 "put only one job's traces in the folder"))
    elif sizes and (world := next(iter(sizes))) > distinfo.MAX_WORLD_SIZE:
        problems.append(BadInput(sizes[world][0].path, "not_a_trace",
                                 f"distributedInfo.world_size {world:,} is over the "
                                 f"{distinfo.MAX_WORLD_SIZE:,} ranks a job may hold here",
                                 "pass the traces as the profiler wrote them"))
        world = None
    elif sizes:
        beyond = [(r, f) for r, _, f in out if r >= world]
        if beyond:
            problems.append(BadInput(", ".join(str(f.path) for _, f in beyond), "rank_out_of_range",
                                     f"rank {', '.join(str(r) for r, _ in beyond)} but world size "
                                     f"{world}", "put only one job's traces in the folder"))
    return sorted(out, key=lambda t: t[0]), world, problems


def check_manifest_sha256(root: Path, manifest: schemas.Manifest | None,
                          files: list[RankTables]) -> None:
    """Raise ``BadInput`` (reason ``file_changed``) for the first trace whose SHA-256 differs
    from the one ``manifest.json`` of run directory ``root`` records for it. The hash each
    parse of a gzip trace computes is used, so analyzer/ingest/rundirs.py does not read big
    traces twice; a plain JSON trace (``RankTables.sha256`` "") is hashed here."""
    for f in files if manifest is not None else []:
        rel = f.path.relative_to(root).as_posix() if f.path.is_relative_to(root) else f.path.name
        entry = manifest.file(rel)
        if entry is None:  # rundirs refuses unlisted traces first; never skip the check
            raise BadInput(f.path, "bad_run_file", "not listed in manifest.json: added after "
                           "the record, so not checked against it",
                           "move the file out of the run directory, or re-record the run")
        sha = f.sha256 or _sha256_of(f.path)  # a plain JSON trace is hashed only here
        if sha != entry.sha256.lower():
            raise BadInput(f.path, "file_changed",
                           "changed since it was recorded (sha256 differs from manifest.json)",
                           "re-record the run")


def _sha256_of(path: Path) -> str:
    """``schemas.sha256_file(path)``; raises ``BadInput`` (unreadable) when it cannot be read."""
    try:
        return schemas.sha256_file(path)
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})",
                       "check the path and its permissions") from None


def _set_rank(rt: RankTables, rank: int, source: str, world_size: int) -> None:
    rt.rank, rt.rank_source = rank, source
    rt.group_fallback = group_fallback(rt.dist.sizes(), world_size)


def _concat(parts: list[pa.Table], columns: list[str]) -> pd.DataFrame:
    """The rows of ``parts`` one below the other as one pandas frame (an empty one of
    ``columns``, untyped, when none has rows)."""
    parts = [p for p in parts if p.num_rows]
    if not parts:
        return pd.DataFrame(columns=columns)
    return pa.concat_tables(parts, promote_options="permissive").to_pandas()


def load_run(run, *, jobs: int | None = None) -> JobTables:
    """The tables of the job ``run`` (an ``analyzer.ingest.rundirs.RunDir``: its trace files and its
    manifest, already found and read), ranks computed in ``jobs`` processes (default min(cpu
    count, files)). All problems of the folder (unusable files, the rank rule, world sizes,
    mixed jobs) are raised together as one ``BadInput`` whose ``problems`` lists them; then a
    trace changed since the record (``file_changed``) and traces of different jobs
    (``mixed_jobs``, analyzer/ingest/samejob.py)."""
    from analyzer.ingest.decode import max_trace_bytes

    max_trace_bytes()  # a bad PARITYTRACE_MAX_TRACE_BYTES is said even when every rank is cached
    root, paths = run.path, run.traces
    if not paths:
        what = "*.json / *.json.gz trace" if run.manifest is None and not run.incomplete \
            else "rank*.trace.json.gz"
        raise BadInput(root, "empty", f"holds no {what} files",
                       "point at a folder of PyTorch profiler traces")
    notes = [f"{root}: incomplete run (no manifest.json), analysed as found"] \
        if run.incomplete else []
    notes += run.notes
    # valid caches (stat fast path) are read here; only the others go to worker processes.
    # Each rank's big tables go to disk as it arrives once the job's pass the budget.
    store = Spill()  # reads PARITYTRACE_TABLES_MEMORY: a bad value is said before any parse
    try:
        return _load(run, jobs, store, notes)
    except BaseException:  # a refused job (or an interrupt) leaves nothing on disk
        store.close()
        raise


def _load(run, jobs: int | None, store: Spill, notes: list[str]) -> JobTables:
    """``load_run`` once its notes are made, with ``store`` taking each rank's tables."""
    root, manifest, paths = run.path, run.manifest, run.traces
    hits = {p: store.keep(cached(p)) for p in paths}
    computed, problems = parse_files([p for p, hit in hits.items() if hit is None], jobs,
                                     keep=store.keep)
    by_path = {**{p: hit for p, hit in hits.items() if hit is not None},
               **{f.path: f for f in computed}}
    files = [by_path[p] for p in paths if p in by_path]
    check_manifest_sha256(root, manifest, files)
    if files and all(f.empty for f in files):
        problems += [no_events(f.path) for f in files]
        files = []
    assigned, world, more = assign_ranks(files) if files else ([], None, [])
    problems += more
    if problems:
        if len(problems) == 1:
            raise problems[0]
        raise BadInput(root, "bad_folder", f"{len(problems)} problems: "
                       + " | ".join(p.one_line() for p in problems),
                       "fix or remove the files named", problems=problems)
    if manifest is not None:
        if world is not None and world != manifest.world_size:
            raise BadInput(root / schemas.MANIFEST_NAME, "world_size_mismatch",
                           f"manifest world_size {manifest.world_size} but the traces say "
                           f"{world}", "re-record the run")
        world = manifest.world_size
    if world is None:
        world = max(len(assigned), max(r for r, _, _ in assigned) + 1)
    ranks = []
    kind = next((f.device_kind for _, _, f in assigned if not f.empty), "cpu")
    for r, source, f in assigned:
        _set_rank(f, r, source, world)
        if f.empty:
            f.device_kind = kind  # as its job's other ranks
            notes.append(f"rank {r} ({f.path.name}) holds only metadata, no complete events: "
                         "reported as an empty rank")
        ranks.append(f)
    whole = [rt.rank for rt in ranks if rt.whole_trace_mode]
    if whole and len(whole) < len(ranks):
        notes.append(f"ranks {whole} have no ProfilerStep and are analysed in whole-trace mode")
    out = JobTables(root=root, ranks=ranks, world_size=world, manifest=manifest,
                    whole_trace_mode=bool(whole) and len(whole) == len(ranks), warnings=notes,
                    breakdown=_concat([r.table("breakdown") for r in ranks],
                                      schemas.BREAKDOWN_SCHEMA.names),
                    spill=store)
    check_same_job(root, out.batches("collectives", ["rank", "step", "pg", "kind"]),
                   {r.rank: r.path for r in ranks})
    if out.missing_ranks:
        notes.append(f"{len(ranks)} of {world} ranks")
    from analyzer.ingest import dataset

    dataset.offer(run.name, out)  # --tables-out (analyzer/ingest/dataset.py)
    return out


def load_tables(path: Path | str, *, allow_incomplete: bool = False, jobs: int | None = None
                ) -> JobTables:
    """``load_run`` of the one job at ``path`` (``rundirs.find_job``: a run directory, a folder
    of traces or one trace file). Raises ``BadInput``."""
    from analyzer.ingest.rundirs import find_job

    return load_run(find_job(path, allow_incomplete=allow_incomplete), jobs=jobs)
