"""Find a job's trace files, parse them in parallel processes with a Parquet cache, assign ranks.

Input: a tracer run directory (``manifest.json`` + ``rank*.trace.json.gz``), any folder of
``*.json`` / ``*.json.gz`` Kineto traces, or one trace file.

Rank rule (DESIGN.md "Trace semantics"): ``distributedInfo.rank`` when every file has one;
a single file without one is rank 0 of 1; several files without one take the number from a
``rank<N>`` / ``worker<N>`` pattern in the file name only when every file has one and all
differ; anything else (some files with a rank and some without, names without a number,
duplicates) is ``BadInput`` naming the files.

Cache: each parsed rank (events after classification) is stored as ``<trace>.parsed.parquet``
beside the trace when that folder is writable (and not marked read-only), else as
``$XDG_CACHE_HOME/paritytrace/<content hash>.parsed.parquet`` (``~/.cache`` when unset). The
key is the SHA-256 hash of the whole trace file's bytes (hardware-accelerated: twice the speed
of BLAKE2b here) plus ``PARSER_VERSION``; any change to the file or to the parser invalidates
it. Writes are atomic (temp file + ``os.replace``); a
cache that cannot be written or read is skipped with a log line, never an error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.errors import BadInput

log = logging.getLogger(__name__)

PARSER_VERSION = "5"
"""Bump whenever decode / classify change what they produce (invalidates every cache)."""

_META_KEY = b"paritytrace.parsed"
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


@dataclass(slots=True)
class ParsedFile:
    """One trace file, decoded and classified (see analyzer/classify.py)."""

    path: Path
    events: pd.DataFrame
    distributed_info: dict[str, Any] | None
    device_kind: str
    main_tid: str | None
    whole_trace_mode: bool
    steps: pd.DataFrame
    warnings: list[str] = field(default_factory=list)
    cache_hit: bool = False
    sha256: str = ""
    """SHA-256 of the file's bytes (hex), checked against the run's manifest.json."""


def find_trace_files(root: Path, *, run_dir: bool, skipped: list[str] | None = None) -> list[Path]:
    """Trace files of ``root``: ``rank*.trace.json.gz`` in a run dir, else every ``*.json`` /
    ``*.json.gz`` that is not a manifest. Sorted by name (order never decides a rank).
    Symlinks out of ``root``, hidden files and the analyzer's own outputs are left out
    (analyzer/fswalk.py ``entries`` / ``not_an_input``); each one skipped is appended to
    ``skipped``."""
    from fnmatch import fnmatch

    from analyzer.fswalk import entries, not_an_input
    from analyzer.schemas import TRACE_GLOB

    children, left_out = entries(root)
    if run_dir:  # hidden traces (a killed record's .tmp-<pid>-rank0...) are named as skipped
        found = [p for p in children if p.is_file() and (fnmatch(p.name, TRACE_GLOB) or (
            p.name.startswith(".") and fnmatch(p.name, "*.json*")))]
    else:
        found = [p for p in children
                 if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
                 and p.name != "manifest.json"]
    keep = []
    for p in found:
        why = not_an_input(p.name)
        if why:
            left_out.append(f"{p}: {why}; skipped")
        else:
            keep.append(p)
    if skipped is not None:
        skipped += left_out
    return keep


def content_key(data: bytes) -> str:
    """Cache key of a trace file's bytes: SHA-256 (hex) + parser version."""
    return f"{hashlib.sha256(data).hexdigest()}-v{PARSER_VERSION}"


def key_sha256(key: str) -> str:
    """The SHA-256 hex part of a ``content_key``."""
    return key.rsplit("-v", 1)[0]


def check_manifest_sha256(root: Path, manifest: dict[str, Any] | None,
                          files: list[tuple[Path, str]]) -> None:
    """Raise ``BadInput`` (reason ``file_changed``) for the first trace whose SHA-256 (hex, from
    its parse) differs from the one ``manifest.json`` records for it. ``files``: (path, sha256)
    of the traces of run dir ``root``. The traces' hashes are checked here, from the hash each
    parse computes anyway, rather than read a second time by analyzer/rundirs.py."""
    if not manifest or not isinstance(manifest.get("files"), list):
        return
    want = {str(f.get("path")): f.get("sha256") for f in manifest["files"] if isinstance(f, dict)}
    for path, digest in files:
        rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
        expected = want.get(rel)
        if isinstance(expected, str) and digest and digest != expected.lower():
            raise BadInput(path, "file_changed",
                           "changed since it was recorded (sha256 differs from manifest.json)",
                           "re-record the run")


def folder_writable(folder: Path) -> bool:
    """True when ``folder`` is writable *and* its mode has a write bit: root passes
    ``os.access`` everywhere, but a folder marked read-only (a shared corpus) stays untouched."""
    try:
        mode = folder.stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)) and os.access(folder, os.W_OK)


def cache_path(trace: Path, key: str) -> Path:
    """Where the parsed Parquet of ``trace`` lives (beside it when writable)."""
    if folder_writable(trace.parent):
        return trace.with_name(trace.name + ".parsed.parquet")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "paritytrace" / f"{key}.parsed.parquet"


def read_raw(path: Path) -> bytes:
    """The bytes of the trace file at ``path``. Raises ``BadInput`` (``unreadable``)."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})",
                       "check the path and its permissions") from None


def parse_file(path: Path, *, use_cache: bool = True) -> ParsedFile:
    """Decode + classify one trace, through the cache. Raises ``BadInput``."""
    raw = read_raw(path)
    return parse_raw(path, raw, content_key(raw), read_cache=use_cache, write_cache=use_cache)


def parse_raw(path: Path, raw: bytes, key: str, *, read_cache: bool,
              write_cache: bool) -> ParsedFile:
    """``parse_file`` on the file's bytes ``raw`` already read, whose ``content_key`` is
    ``key``. Raises ``BadInput``."""
    from analyzer.classify import classify
    from analyzer.decode import decode_bytes, decompress

    cpath = cache_path(path, key)
    if read_cache:
        hit = _read_cache(cpath, key, path)
        if hit is not None:
            hit.sha256 = key_sha256(key)
            return hit
    dec = decode_bytes(decompress(raw, path), path)
    if dec.events.empty:
        raise BadInput(path, "no_events", "holds no complete (ph X) events with a valid ts and "
                       "dur (only metadata, or every event skipped): this rank recorded nothing",
                       "re-record it, or move the file out of the folder to analyse the other "
                       "ranks")
    di = dec.distributed_info
    ws = di.get("world_size") if di else None
    events, info = classify(dec.events, world_size=ws if isinstance(ws, int) else None)
    parsed = ParsedFile(path=path, events=events, distributed_info=di,
                        device_kind=info["device_kind"], main_tid=info["main_tid"],
                        whole_trace_mode=info["whole_trace_mode"], steps=info["steps"],
                        warnings=dec.warnings, sha256=key_sha256(key))
    if write_cache:
        _write_cache(cpath, key, parsed)
    return parsed


def _read_cache(cpath: Path, key: str, path: Path) -> ParsedFile | None:
    if not cpath.exists():
        return None
    try:
        table = pq.read_table(cpath)
        meta = json.loads(table.schema.metadata[_META_KEY])
        if meta.get("key") != key:
            return None
        events = table.to_pandas()
    except (OSError, pa.ArrowException, KeyError, TypeError, ValueError) as exc:
        log.info("ignoring unreadable cache %s (%s)", cpath, exc)
        return None
    return ParsedFile(path=path, events=events, distributed_info=meta["distributed_info"],
                      device_kind=meta["device_kind"], main_tid=meta["main_tid"],
                      whole_trace_mode=meta["whole_trace_mode"],
                      steps=pd.DataFrame(meta["steps"]).astype("int64"),
                      warnings=meta["warnings"], cache_hit=True)


def _write_cache(cpath: Path, key: str, parsed: ParsedFile) -> None:
    meta = {"key": key, "distributed_info": parsed.distributed_info,
            "device_kind": parsed.device_kind, "main_tid": parsed.main_tid,
            "whole_trace_mode": parsed.whole_trace_mode,
            "steps": {c: parsed.steps[c].astype("int64").tolist() for c in parsed.steps},
            "warnings": parsed.warnings}
    try:
        cpath.parent.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pandas(parsed.events, preserve_index=False)
        table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                               _META_KEY: json.dumps(meta).encode()})
        fd, tmp = tempfile.mkstemp(dir=cpath.parent, prefix=".tmp-", suffix=".parquet")
        os.close(fd)
        try:
            pq.write_table(table, tmp)
            os.replace(tmp, cpath)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, pa.ArrowException) as exc:
        log.info("could not write cache %s (%s)", cpath, exc)


def _parse_worker(path: Path) -> ParsedFile | tuple[str, str, str, str]:
    """Process-pool entry: errors come back as plain tuples (BadInput is not picklable)."""
    try:
        return parse_file(path)
    except BadInput as exc:
        return (exc.path, exc.reason, exc.message, exc.fix)


def _size_bytes(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0  # the worker says what is wrong


def parse_files(paths: list[Path], jobs: int | None, *, worker=None
                ) -> tuple[list[ParsedFile], list[BadInput]]:
    """Parse every file, in ``jobs`` processes (analyzer/parallel.py).

    ``worker`` (default: ``parse_file`` through the cache) maps a path to a result or to a
    BadInput's (path, reason, message, fix) tuple; ``analyzer/tables.py`` passes its own.
    Returns the results and the problems (``BadInput``), so that all are reported."""
    from analyzer.parallel import run_all

    # largest first (longest-processing-time-first scheduling): processes taking the next file
    # as they free up then end within about one small file of each other
    order = sorted(range(len(paths)), key=lambda i: -_size_bytes(paths[i]))
    results: list[Any] = [None] * len(paths)
    for i, r in zip(order, run_all(worker or _parse_worker, [paths[i] for i in order], jobs)):
        results[i] = r
    ok = [r for r in results if not isinstance(r, tuple)]
    bad = [BadInput(*r) for r in results if isinstance(r, tuple)]
    return ok, bad


def assign_ranks(files: list[ParsedFile]) -> tuple[list[tuple[int, str, ParsedFile]], int | None,
                                                    list[BadInput]]:
    """Apply the rank rule. Returns ([(rank, rank_source, file)], world size the traces say or
    None, problems)."""
    problems: list[BadInput] = []
    ranks: list[int | None] = []
    for f in files:
        di = f.distributed_info or {}
        r = di.get("rank")
        ranks.append(r if isinstance(r, int) and not isinstance(r, bool) and r >= 0 else None)
    with_rank = [f for f, r in zip(files, ranks) if r is not None]
    without = [f for f, r in zip(files, ranks) if r is None]
    out: list[tuple[int, str, ParsedFile]] = []
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
    by_rank: dict[int, list[ParsedFile]] = {}
    for r, _, f in out:
        by_rank.setdefault(r, []).append(f)
    for r, fs in sorted(by_rank.items()):
        if len(fs) > 1:
            problems.append(BadInput(" and ".join(str(f.path) for f in fs), "duplicate_rank",
                                     f"both files are rank {r}",
                                     "keep one trace per rank in the folder"))
    problems += _job_mismatches(files)
    sizes: dict[int, list[ParsedFile]] = {}
    for f in files:
        ws = (f.distributed_info or {}).get("world_size")
        if isinstance(ws, int):
            sizes.setdefault(ws, []).append(f)
    world = None
    if len(sizes) > 1:
        desc = "; ".join(f"{ws} in {', '.join(str(f.path) for f in fs)}"
                         for ws, fs in sorted(sizes.items()))
        problems.append(BadInput(files[0].path.parent, "world_size_mismatch",
                                 f"world sizes disagree: {desc}",
                                 "put only one job's traces in the folder"))
    elif sizes:
        world = next(iter(sizes))
        beyond = [(r, f) for r, _, f in out if r >= world]
        if beyond:
            problems.append(BadInput(", ".join(str(f.path) for _, f in beyond), "rank_out_of_range",
                                     f"rank {', '.join(str(r) for r, _ in beyond)} but world size "
                                     f"{world}", "put only one job's traces in the folder"))
    return sorted(out, key=lambda t: t[0]), world, problems


def _job_mismatches(files: list[ParsedFile]) -> list[BadInput]:
    """Files that cannot come from one job: ``distributedInfo.backend`` differs, or a process
    group of the same name has different member ranks (``distributedInfo.pg_config``). Ranks may
    list different groups (a rank outside a subgroup does not know it), so only groups present
    in several files are compared."""
    problems: list[BadInput] = []
    if not files:
        return problems
    folder = files[0].path.parent
    backends: dict[str, list[ParsedFile]] = {}
    groups: dict[str, dict[str, list[ParsedFile]]] = {}
    for f in files:
        di = f.distributed_info or {}
        if isinstance(di.get("backend"), str):
            backends.setdefault(di["backend"], []).append(f)
        pgs = di.get("pg_config")
        for pg in pgs if isinstance(pgs, list) else []:
            if isinstance(pg, dict) and "pg_name" in pg and isinstance(pg.get("ranks"), list):
                members = json.dumps(pg["ranks"])
                groups.setdefault(str(pg["pg_name"]), {}).setdefault(members, []).append(f)

    def names(fs: list[ParsedFile]) -> str:
        return ", ".join(f.path.name for f in fs)

    if len(backends) > 1:
        desc = "; ".join(f"{b} in {names(fs)}" for b, fs in sorted(backends.items()))
        problems.append(BadInput(folder, "mixed_jobs", f"backends disagree: {desc}",
                                 "put only one job's traces in the folder"))
    for pg, by_members in sorted(groups.items()):
        if len(by_members) > 1:
            desc = "; ".join(f"ranks {m} in {names(fs)}" for m, fs in sorted(by_members.items()))
            problems.append(BadInput(folder, "mixed_jobs",
                                     f"process group {pg!r} has different members: {desc}",
                                     "put only one job's traces in the folder"))
    return problems


def _is_run_dir(root: Path) -> bool:
    from analyzer.schemas import MANIFEST_NAME, NUMERICS_NAME, STEPS_NAME

    return any((root / n).exists() for n in (MANIFEST_NAME, NUMERICS_NAME, STEPS_NAME))


def discover_paths(root: Path, *, allow_incomplete: bool
                   ) -> tuple[dict[str, Any] | None, list[str], list[Path]]:
    """(manifest or None, notes, trace files) of ``root`` (see ``api.load_traces``). Raises
    ``BadInput``."""
    from analyzer.schemas import MANIFEST_NAME, SchemaError, read_manifest

    if not root.exists():
        raise BadInput(root, "missing", "no such file or folder", "check the path")
    manifest = None
    notes: list[str] = []
    if root.is_file():
        paths = [root]
    else:
        run_dir = _is_run_dir(root)
        if run_dir:
            mpath = root / MANIFEST_NAME
            if mpath.exists():
                try:
                    manifest = read_manifest(mpath)
                except SchemaError as exc:
                    raise BadInput(mpath, "bad_manifest", str(exc).split(": ", 1)[-1]) from None
                from analyzer.rundirs import check_listed_files_present

                check_listed_files_present(root, manifest)
            elif not allow_incomplete:
                raise BadInput(root, "incomplete_run", "incomplete run: no manifest.json (the "
                               "tracer writes it last)", "re-record the run, or pass "
                               "--allow-incomplete to analyse what is there")
            else:
                notes.append(f"{root}: incomplete run (no manifest.json), analysed as found")
        paths = find_trace_files(root, run_dir=run_dir, skipped=notes)
        if not paths:
            what = "rank*.trace.json.gz" if run_dir else "*.json / *.json.gz trace"
            raise BadInput(root, "empty", f"no {what} files in the folder",
                           "point at a folder of PyTorch profiler traces")
    return manifest, notes, paths


def resolve_ranks(root: Path, files: list, problems: list[BadInput],
                  manifest: dict[str, Any] | None) -> tuple[list[tuple[int, str, Any]], int]:
    """Rank rule over parsed ``files`` (anything with ``path`` and ``distributed_info``) and the
    world size (traces, else manifest, else the ranks seen). Raises every problem of the folder
    (``problems`` from parsing plus the rank rule's) as one ``BadInput``."""
    from analyzer.schemas import MANIFEST_NAME

    assigned, world, more = assign_ranks(files) if files else ([], None, [])
    problems += more
    if problems:
        if len(problems) == 1:
            raise problems[0]
        raise BadInput(root, "bad_folder", f"{len(problems)} problems: "
                       + " | ".join(p.one_line() for p in problems),
                       "fix or remove the files named", problems=problems)
    if manifest is not None and isinstance(manifest.get("world_size"), int):
        if world is not None and world != manifest["world_size"]:
            raise BadInput(root / MANIFEST_NAME, "world_size_mismatch",
                           f"manifest world_size {manifest['world_size']} but the traces say "
                           f"{world}", "re-record the run")
        world = manifest["world_size"]
    if world is None:
        world = max(len(assigned), max(r for r, _, _ in assigned) + 1)
    return assigned, world


def load_traceset(root: Path, *, allow_incomplete: bool = False, jobs: int | None = None):
    """Implementation of ``analyzer.api.load_traces`` (see there)."""
    from analyzer.api import RankTrace, TraceSet

    manifest, notes, paths = discover_paths(root, allow_incomplete=allow_incomplete)
    files, problems = parse_files(paths, jobs)
    check_manifest_sha256(root, manifest, [(f.path, f.sha256) for f in files])
    assigned, world = resolve_ranks(root, files, problems, manifest)
    ranks = []
    for r, source, f in assigned:
        ws = (f.distributed_info or {}).get("world_size")
        ranks.append(RankTrace(rank=r, path=f.path, rank_source=source,
                               world_size=ws if isinstance(ws, int) else None,
                               device_kind=f.device_kind, events=f.events, warnings=f.warnings,
                               steps=f.steps, main_tid=f.main_tid,
                               whole_trace_mode=f.whole_trace_mode,
                               distributed_info=f.distributed_info))
    _check_same_job(root, ranks)
    whole = [rt.rank for rt in ranks if rt.whole_trace_mode]
    if whole and len(whole) < len(ranks):
        notes.append(f"ranks {whole} have no ProfilerStep and are analysed in whole-trace mode")
    ts = TraceSet(root=root, ranks=ranks, world_size=world, manifest=manifest,
                  whole_trace_mode=bool(whole) and len(whole) == len(ranks), warnings=notes)
    if ts.missing_ranks:
        notes.append(f"{len(ranks)} of {world} ranks")
    return ts


def _check_same_job(root: Path, ranks: list) -> None:
    """Refuse ranks of different jobs (analyzer/samejob.py) before anything is analysed."""
    if len(ranks) < 2:
        return
    import pandas as pd

    from analyzer.collectives import rank_collectives
    from analyzer.samejob import check_same_job

    coll = pd.concat([rank_collectives(rt.rank, rt.events, -1) for rt in ranks], ignore_index=True)
    check_same_job(root, coll, {rt.rank: rt.path for rt in ranks})

