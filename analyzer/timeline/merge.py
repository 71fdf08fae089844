"""Merge every rank's trace into one aligned Chrome trace (``analyzer merge``, issue 8).

What a step, a collective and a rank are comes from the ingest, as for every command
(analyzer/ingest/pipeline.py: ``load_run``, cached): the rank rule, each rank's step windows and its
collectives (kind, process group, exact int64-ns times). Merge adds only what a timeline needs:
the raw events to copy, their alignment and the flow arrows. It maps the ingest's rows back to
raw events by their ``event_idx`` (position in the file's traceEvents list, a column of
analyzer/ingest/decode.py's table); every time it writes is converted with the ingest's exact parse
(``decode.parse_decimal_ns``). A ``--steps`` selection keeps the complete events the ingest
puts in a chosen step (a GPU event with its launch's step) and the other events (instants,
counters, flows) whose time lies in a chosen step's ProfilerStep span.

Output layout (Perfetto / chrome://tracing):
- one process per rank: pid = rank + 1, ``process_name`` "rank N", ``process_sort_index`` N;
- one thread track per source (pid, tid) of that rank: CPU threads ("thread 123 (python3)",
  the thread holding ProfilerStep first), GPU streams ("GPU 0 stream 7"), profiler spans; named
  with ``thread_name`` and ordered with ``thread_sort_index``;
- complete events that partially overlap an earlier one on their track (real traces have them,
  e.g. on GPU streams or gloo threads; Perfetto drops or moves them) go to an "(overlap k)" track
  next to it, so nothing is dropped and every track is properly nested;
- times shifted by each rank's clock offset (``analyzer.analyses.clock``) and rebased so the earliest
  event is at 0 (keeps ns precision in the JSON doubles); the rebase and the offsets are stored
  under the top-level key ``paritytraceMerge`` and in the JSON sidecar;
- flow arrows (cat "collective") link each matched collective across ranks, in the order the
  ranks started it; the sources' own flows (ac2g, fwdbwd) are kept with ids made unique;
- on request, a ``perfetto_manifest`` beside it: the same offsets for Perfetto's own merge of the
  rank traces (analyzer/timeline/perfetto.py).

Raises ``BadInput`` for unusable input (the ingest's refusals, as ``analyzer report`` says
them). Writes atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import bisect
import errno
import gzip
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from analyzer.analyses import clock
from analyzer.ingest import pipeline, ranktables, rundirs
from analyzer.contract import schemas
from analyzer.contract.atomic import atomic_path, write_atomic
from analyzer.timeline import perfetto
from analyzer.timeline.chrome_check import PHASES, check_trace, phase_problem
from analyzer.ingest.decode import decode_bytes, decompress, repair
from analyzer.ingest.fswalk import OUTPUT_MARKER
from analyzer.contract.errors import BadInput, Reason

log = logging.getLogger(__name__)

MERGE_KEY = "paritytraceMerge"
"""Top-level key that marks a merged trace."""


@dataclass(kw_only=True, slots=True)
class MergeOptions:
    """What ``merge_traces`` writes."""

    steps: "StepRanges | tuple[int, ...] | None" = None
    """ProfilerSteps to keep (None: the whole traces): ``parse_steps``' ranges, or step numbers
    (made ``StepRanges`` here)."""
    ref_rank: int | None = None
    """Rank whose clock the others are aligned to (None: the lowest rank)."""
    align: bool = True
    """False: write the traces unshifted (offsets are still estimated and reported)."""
    allow_incomplete: bool = False
    """Merge a run directory without manifest.json (a record that did not finish) as found."""
    perfetto_manifest: bool = False
    """Also write a ``perfetto_manifest`` beside the merged trace (analyzer/timeline/perfetto.py):
    each rank's trace and the offset applied, for Perfetto's ``trace_processor util merge``."""

    def __post_init__(self) -> None:
        if self.steps is not None and not isinstance(self.steps, StepRanges):
            if not self.steps or any(s < 0 for s in self.steps):
                raise ValueError(f"steps must be a non-empty tuple of step numbers >= 0, got {self.steps!r}")
            self.steps = StepRanges.of(self.steps)
        if self.ref_rank is not None and self.ref_rank < 0:
            raise ValueError(f"ref_rank must be >= 0, got {self.ref_rank!r}")


@dataclass(kw_only=True, slots=True)
class RankInput:
    """One rank's trace as read from disk, held while it is written."""

    rank: int
    data: dict[str, Any]
    """The parsed JSON object."""
    events: pd.DataFrame
    """Its complete events as the ingest decodes and classifies them (``api.load_events``'
    table: event_idx, ts_ns, dur_ns, is_gpu, role, step ...)."""
    ts_ns: np.ndarray
    ts_ok: np.ndarray
    """``ts_ns``, ``ts_ok``: ``decode.Decoded.other_times``, by position in traceEvents."""


@dataclass(kw_only=True, slots=True)
class MergeResult:
    """What ``merge_traces`` did."""

    out_path: Path
    """The merged trace."""
    sidecar_path: Path
    """The JSON sidecar with offsets and spreads."""
    manifest_path: Path | None
    """The ``perfetto_manifest`` written beside the merged trace, None when not asked for."""
    ranks: list[ranktables.RankTables]
    """The job's ranks as the ingest read them (``rank``, ``path``, ``rank_source`` ...)."""
    steps: dict[int, list[int]]
    """Rank -> the ProfilerStep numbers the ingest found on it (none in whole-trace mode):
    what ``--steps`` selects from."""
    collectives: pd.DataFrame
    """The ingest's collectives of every rank (``JobTables.collectives``), matched across
    ranks for the offsets and the flow arrows."""
    matched: pd.DataFrame
    """``clock.match_collectives`` of ``collectives``: what the offsets and arrows use."""
    ref_rank: int
    """The rank whose clock is the reference."""
    offsets: pd.DataFrame
    """rank, offset_ns, mad_ns, n_matched (``clock.estimate_offsets``)."""
    spread: pd.DataFrame
    """Per matched collective: end spread before / after alignment (``clock.end_spread``)."""
    t0_ns: int
    """Aligned time (reference clock, ns) written as ts 0."""
    n_events: int
    """Events written (metadata included)."""
    n_moved_to_overlap_tracks: int
    """Complete events moved to "(overlap k)" tracks."""
    warnings: list[str] = field(default_factory=list)
    """One line per thing the user should know (unmatched ranks, steps missing ...)."""


# --- input ---------------------------------------------------------------------------------------

_TREE = msgspec.json.Decoder()


def _read_rank(rt: ranktables.RankTables) -> RankInput:
    """One rank's raw JSON, its event table and its events' exact times, from two reads of
    the JSON: the ingest's decoder (table and times) and a tree of the events to copy.
    Raises ``BadInput`` (the file changed since the ingest read it)."""
    raw = decompress(ranktables.read_trace(rt.path), rt.path)
    dec = decode_bytes(raw, rt.path, other_times=True)
    raw = dec.repaired_json or raw  # the ingest accepted the file: repaired as it was
    while True:  # what the typed decoder skipped may need a repair too (old exporters)
        try:
            data = _TREE.decode(raw)
            break
        except msgspec.DecodeError as exc:
            raw, _ = repair(raw, rt.path, exc)
    events, _ = ranktables.classified(rt.path, dec=dec)
    return RankInput(rank=rt.rank, data=data, events=events, ts_ns=dec.other_times[0],
                     ts_ok=dec.other_times[1])


def _key(ev: dict) -> tuple[str, str]:
    """The source track (pid, tid) of a raw event."""
    return str(ev.get("pid", "")), str(ev.get("tid", ""))


# --- steps ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StepRanges:
    """A ``--steps`` selection as inclusive ranges, sorted and disjoint: never the set of step
    numbers, whose size the user's text alone bounds (``0-100000000000000``). What is kept is
    what a rank's trace holds (``pick``), so memory follows the trace, not the selection."""

    ranges: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, steps) -> "StepRanges":
        """From step numbers (``MergeOptions(steps=(1, 2))``). Raises ValueError."""
        return cls.from_pairs((int(s), int(s)) for s in steps)

    @classmethod
    def from_pairs(cls, pairs) -> "StepRanges":
        """From (lo, hi) pairs in any order, overlapping or adjacent ones joined. Raises
        ValueError for none, a negative step or an end before its start."""
        joined: list[list[int]] = []
        for lo, hi in sorted(pairs):
            if lo < 0 or hi < lo:
                raise ValueError(f"bad step range {lo}-{hi}: steps are >= 0, end not before start")
            if joined and lo <= joined[-1][1] + 1:
                joined[-1][1] = max(joined[-1][1], hi)
            else:
                joined.append([lo, hi])
        if not joined:
            raise ValueError("no step selected")
        return cls(tuple((lo, hi) for lo, hi in joined))

    def __contains__(self, step: int) -> bool:
        k = bisect.bisect_right(self.ranges, (step, _INF)) - 1
        return k >= 0 and self.ranges[k][0] <= step <= self.ranges[k][1]

    def pick(self, steps) -> list[int]:
        """The sorted distinct ``steps`` (a trace's step numbers) inside the selection."""
        return sorted({int(s) for s in steps if int(s) in self})

    def count(self) -> int:
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def without(self, steps: list[int]) -> "list[tuple[int, int]]":
        """The selection's ranges less the sorted distinct ``steps`` (each inside it)."""
        out, drop = [], iter(steps)
        nxt = next(drop, None)
        for lo, hi in self.ranges:
            while nxt is not None and nxt <= hi:
                if nxt > lo:
                    out.append((lo, nxt - 1))
                lo = nxt + 1
                nxt = next(drop, None)
            if lo <= hi:
                out.append((lo, hi))
        return out

    def text(self) -> str:
        """``1-3,7`` (the ranges) for a message."""
        return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in self.ranges)


_INF = float("inf")
_LISTED_STEPS = 32
"""A message lists step numbers up to this many, ranges beyond (``StepRanges.text``)."""


def _steps_text(ranges: list[tuple[int, int]]) -> str:
    """``[3, 4]`` as before for a few steps; ``[3-100000000000000]`` for many."""
    if sum(hi - lo + 1 for lo, hi in ranges) <= _LISTED_STEPS:
        return str([s for lo, hi in ranges for s in range(lo, hi + 1)])
    return "[" + StepRanges(tuple(ranges)).text() + "]"


def parse_steps(text: str) -> StepRanges:
    """``"10"``, ``"10,12"``, ``"10-12"`` -> ``StepRanges`` (ranges, never the numbers: the
    size of ``0-100000000000000`` is not allocated). Raises ValueError naming the bad part."""
    pairs = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad step selection {part!r}: use N, N-M or N,M")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"bad step range {part!r}: end before start")
        pairs.append((lo, hi))
    return StepRanges.from_pairs(pairs)


def _selected(r: RankInput, rt: ranktables.RankTables, found: list[int]) -> set[int]:
    """Positions (in traceEvents) of rank ``r``'s events in the ProfilerSteps ``found`` (the
    chosen steps it has): complete events the ingest puts in one of them (module docstring),
    other events whose time lies in one of their ProfilerStep spans."""
    x = r.events
    keep = set(x.loc[x["step"].isin(found).to_numpy(), "event_idx"].tolist())
    win = rt.steps[rt.steps["step"].isin(found)]
    lo, hi = win["cpu_start_ns"].to_numpy(), win["cpu_end_ns"].to_numpy()
    t = r.ts_ns[:, None]  # instants, counters, flows (the only entries ts_ok holds): by time
    inside = ((lo <= t) & (t < hi)).any(axis=1)
    keep.update(np.flatnonzero(r.ts_ok & inside).tolist())
    return keep


# --- tracks --------------------------------------------------------------------------------------

def assign_lanes(spans: list[tuple[int, int]]) -> list[int]:
    """Lane per span so that each lane is properly nested (no partial overlap).

    Greedy over spans sorted by (start, -end): a span goes to the first lane where it nests in
    the innermost open span (or the lane is empty at its start). Lane 0 keeps every span that
    does not partially overlap; returns one lane index per input span.
    """
    order = sorted(range(len(spans)), key=lambda k: (spans[k][0], -spans[k][1]))
    stacks: list[list[int]] = []
    lanes = [0] * len(spans)
    for j in order:
        start, end = spans[j]
        for lane, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or end <= stack[-1]:
                stack.append(end)
                lanes[j] = lane
                break
        else:
            stacks.append([end])
            lanes[j] = len(stacks) - 1
    return lanes


def _track_names(data: dict, gpu_tracks: set[tuple[str, str]], step_tracks: set[tuple[str, str]]
                 ) -> dict[tuple[str, str], tuple[int, str]]:
    """(pid, tid) -> (sort group, display name) for one rank's source tracks; ``gpu_tracks``
    hold GPU events, ``step_tracks`` ProfilerStep spans (the ingest's rules)."""
    proc_name: dict[str, str] = {}
    proc_label: dict[str, str] = {}
    thread_names: dict[tuple[str, str], list[str]] = {}
    for ev in data["traceEvents"]:
        if not isinstance(ev, dict) or ev.get("ph") != "M":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        pid, tid = str(ev.get("pid", "")), str(ev.get("tid", ""))
        if ev.get("name") == "process_name":
            proc_name[pid] = str(args.get("name", ""))
        elif ev.get("name") == "process_labels":
            proc_label[pid] = str(args.get("labels", ""))
        elif ev.get("name") == "thread_name":
            thread_names.setdefault((pid, tid), []).append(str(args.get("name", "")))
    out: dict[tuple[str, str], tuple[int, str]] = {}
    for pid, tid in _all_tracks(data):
        key = (pid, tid)
        if key in gpu_tracks:
            label = proc_label.get(pid) or f"GPU {pid}"
            out[key] = (2, f"{label} stream {tid}")
        elif pid.isdigit() and tid.lstrip("-").isdigit():
            names = thread_names.get(key, [])
            # Kineto may name one thread twice ("(python3)" and "(pt_gloo_runloop)"): keep the one
            # that is not just the process name
            specific = [n for n in names if proc_name.get(pid) and f"({proc_name[pid]})" not in n]
            name = (specific or names or [f"thread {tid}"])[0].strip()
            out[key] = (0 if key in step_tracks else 1, name)
        else:
            out[key] = (3, " ".join(s for s in (pid, tid) if s) or "profiler")
    return out


def _well_formed(ev: dict) -> bool:
    """The per-event rules of analyzer/timeline/chrome_check.py for a non-metadata source event (its
    name is made a string and its pid / ts rewritten by the caller): events that break them are
    left out of the merged trace rather than written into a file viewers reject."""
    ph = ev.get("ph")
    return (isinstance(ph, str) and ph in PHASES and ph != "M" and "tid" in ev
            and phase_problem(ev) is None)


def _all_tracks(data: dict) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for ev in data["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") != "M":
            seen.setdefault(_key(ev), None)
    return list(seen)


def _us(ns: int) -> int | float:
    """Nanoseconds -> microseconds for JSON: an int when whole, else exact to the ns."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


# --- merge ---------------------------------------------------------------------------------------

def sidecar_path_for(out: Path) -> Path:
    """``merged.trace.json.gz`` -> ``merged.offsets.json`` (same folder)."""
    return perfetto.beside(out, ".offsets.json")


def merge_traces(root: Path | str, out: Path | str, options: MergeOptions | None = None) -> MergeResult:
    """Merge the traces in ``root`` into one aligned Chrome trace at ``out`` (gzip if ``.gz``).

    Also writes the sidecar (``sidecar_path_for(out)``): ref_rank, t0_ns, offsets, spread summary;
    with ``options.perfetto_manifest``, the ``perfetto_manifest`` (``perfetto.manifest_path_for``),
    whose offsets are the ones applied here.
    Alignment rule: the estimated offsets are applied unless they widen the median spread of
    matched collective ends (``alignment_widens``); then the traces are written unshifted, the
    sidecar says ``"aligned": false`` and one warning line gives both medians.
    Raises ``BadInput`` for unusable input, a ``--steps`` selection no rank has, or (with the
    manifest) two ranks' traces of one base name.
    """
    options = options or MergeOptions()
    root, out = Path(root), Path(out)
    run = rundirs.find_job(root, allow_incomplete=options.allow_incomplete)
    _refuse_out_on_input(run, out)
    refuse_without_memory(run.traces)  # one line, before the warning and any reading
    early = size_warning(run.traces)
    if early:
        log.warning("%s", early)  # now, before the minutes of reading
    try:
        with pipeline.load_run(run) as job:  # its spilled tables removed on the way out
            return _merge(root, out, options, job, early)
    except MemoryError:  # the estimate passed, the machine did not: one line, nothing written
        raise BadInput(root, "too_large", "merge ran out of memory (it holds one rank's events "
                       f"as Python objects, about {MERGE_MEMORY_FACTOR}x its JSON)",
                       "run merge on a machine with more free memory, or read the job's "
                       "tables with `analyzer report` / `summary` (they hold no events)") from None


def _merge(root: Path, out: Path, options: MergeOptions, job, early: str | None) -> MergeResult:
    """``merge_traces`` once the input is found, its size said and its tables loaded."""
    ranks = [rt.rank for rt in job.ranks]
    ref_rank = options.ref_rank if options.ref_rank is not None else ranks[0]
    if ref_rank not in ranks:
        raise BadInput(root, "bad_option", f"has no trace of rank {ref_rank} (ranks: {ranks})",
                       "pick one of the ranks present")
    warnings: list[str] = list(job.warnings) + ([early] if early else [])
    matched = clock.match_collectives(job.collectives)
    offsets = clock.estimate_offsets(matched, ranks, ref_rank)
    for row in offsets.itertuples(index=False):
        if row.rank != ref_rank and row.n_matched == 0:
            warnings.append(f"rank {row.rank} shares no collective with rank {ref_rank}: not aligned (offset 0)")
        elif row.clock in ("inconsistent", "unresolved"):  # not applied: 0 (clock.py)
            warnings.append(clock.clock_note(row))
    spread = clock.end_spread(matched, offsets)
    align = options.align
    if align and alignment_widens(spread):
        align = False
        warnings.append(
            "aligning on the matched collectives would widen the spread of their ends across "
            f"ranks (median {_us_text(spread['spread_before_ns'].median())} µs before, "
            f"{_us_text(spread['spread_after_ns'].median())} µs after): traces written "
            "unshifted; try --ref-rank with another rank")
    shift = dict(zip(offsets["rank"], offsets["offset_ns"])) if align else {r: 0 for r in ranks}
    traces = {rt.rank: rt.path for rt in job.ranks}
    if options.perfetto_manifest:
        perfetto.check_names(traces, root)  # before anything is written

    found: dict[int, list[int]] | None = None if options.steps is None else {}
    if found is not None:
        for rt in job.ranks:
            # bounded by the steps the trace holds (the ingest's tables), never by the selection
            found[rt.rank] = [] if rt.whole_trace_mode else options.steps.pick(rt.steps["step"])
            missing = options.steps.without(found[rt.rank])
            if missing:
                warnings.append(f"rank {rt.rank} ({rt.path.name}) has no ProfilerStep "
                                f"{_steps_text(missing)}")
        if not any(found.values()):
            raise BadInput(root, "bad_option", "no trace has ProfilerStep "
                           f"{_steps_text(list(options.steps.ranges))}",
                           "pick steps shown by `analyzer summary`, or omit --steps")

    t0 = min(rt.first_ns - shift[rt.rank] for rt in job.ranks if not rt.empty)
    if options.perfetto_manifest and t0 < 0:  # perfetto-manifest reference: offset_ns WARNING
        warnings.append("the offsets move events before time 0, which Perfetto drops "
                        "(stat trace_sorter_negative_timestamp_dropped)")
    summary = _summary(root, job.ranks, ref_rank, offsets, spread, t0, align, options, warnings)
    wanted = set(zip(matched["rank"].tolist(), matched["event_idx"].tolist()))
    sidecar = sidecar_path_for(out)
    manifest = perfetto.manifest_path_for(out) if options.perfetto_manifest else None
    written: list[Path] = []
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        n_events, n_meta, moved = _stream(root, out, job.ranks, found, shift, t0, matched,
                                          wanted, ref_rank, summary)
        written.append(out)
        write_atomic(sidecar, msgspec.json.format(msgspec.json.encode(summary), indent=2))
        written.append(sidecar)
        if manifest is not None:
            perfetto.write_manifest(manifest, perfetto.build_manifest(traces, shift, ref_rank))
    except OSError as exc:  # reads fail as BadInput: this is the disk the output is written to
        for p in written:  # complete, but without its sidecar / manifest: not left as if whole
            p.unlink(missing_ok=True)
        raise write_failure(exc, out) from None
    log.info("wrote %s (%d events, %d metadata)", out, n_events, n_meta)
    return MergeResult(out_path=out, sidecar_path=sidecar, manifest_path=manifest, ranks=job.ranks,
                       ref_rank=ref_rank,
                       steps={rt.rank: [] if rt.whole_trace_mode else rt.steps["step"].tolist()
                              for rt in job.ranks},
                       collectives=job.collectives, matched=matched,
                       offsets=offsets, spread=spread, t0_ns=t0, n_events=n_events,
                       n_moved_to_overlap_tracks=moved, warnings=warnings)


MERGE_MEMORY_FACTOR = 10
"""Bytes of memory merge needs per byte of the largest rank's JSON (its events as Python
objects): measured by bench/bench_merge_memory.py."""


def available_memory_bytes() -> int:
    """Memory free for this command: ``MemAvailable`` of /proc/meminfo, capped by the machine's
    or cgroup's total (``memory.memory_bytes``); 0 when neither can be read."""
    from analyzer.analyses.memory import memory_bytes

    total = memory_bytes()
    try:
        with open("/proc/meminfo") as fh:
            avail = next((int(line.split()[1]) * 1024 for line in fh
                          if line.startswith("MemAvailable:")), 0)
    except (OSError, ValueError, IndexError):
        avail = 0
    return min(x for x in (total, avail) if x) if (total or avail) else 0


def refuse_without_memory(traces: list[Path]) -> None:
    """Raise ``BadInput`` (``too_large``) before anything is read when the largest of
    ``traces`` needs more memory to merge (``MERGE_MEMORY_FACTOR`` x its JSON, sized as
    ``size_warning`` does) than ``available_memory_bytes``: a one-line refusal, not a
    MemoryError after minutes of reading."""
    avail = available_memory_bytes()
    if not avail or not traces:
        return
    sizes = {p: _json_bytes(p) for p in traces}
    big = max(sizes, key=sizes.get)
    need = MERGE_MEMORY_FACTOR * sizes[big]
    if need > avail:
        raise BadInput(big, "too_large", f"{sizes[big] / 2**20:,.1f} MiB of JSON needs about "
                       f"{need / 2**30:,.1f} GiB to merge ({MERGE_MEMORY_FACTOR}x, one rank at a "
                       f"time) and {avail / 2**30:,.1f} GiB of memory is free",
                       "run merge on a machine with more free memory, or read the job's tables "
                       "with `analyzer report` / `summary` (they hold no events)")


LARGE_RANK_BYTES = 1 << 30
"""A rank with this much trace JSON or more gets the early size warning of ``size_warning``."""
_ENCODE_BATCH = 50_000
"""Events encoded to JSON at a time: the encoded text held is one batch, not one rank."""


def size_warning(traces: list[Path]) -> str | None:
    """One line, said before anything is read, when the largest of ``traces`` holds at least
    ``LARGE_RANK_BYTES`` of JSON (a gzip file's size after gunzip read from its trailer, RFC
    1952 ISIZE: modulo 4 GiB, so never less than the file itself is taken, and ignored when
    above DEFLATE's largest ratio, as in a truncated file's last bytes): merge holds one
    rank's events as Python objects at a time, about 10x its JSON. None otherwise."""
    sizes = {p: _json_bytes(p) for p in traces}
    big = max(sizes, key=sizes.get, default=None)
    if big is None or sizes[big] < LARGE_RANK_BYTES:
        return None
    return (f"{big.name} is {sizes[big] / 2**20:,.1f} MiB of JSON ({len(traces)} trace(s), "
            f"{sum(sizes.values()) / 2**20:,.1f} MiB in all): merge reads one rank at a time and "
            f"needs memory of about 10x the largest rank; this takes a while")


def _json_bytes(p: Path) -> int:
    """The JSON size of trace ``p`` (``size_warning``); 0 when it cannot be read."""
    try:
        with open(p, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != b"\x1f\x8b" or size < 18:
                return size
            fh.seek(-4, os.SEEK_END)
            isize = int.from_bytes(fh.read(4), "little")
            # beyond DEFLATE's largest ratio (1032:1) the trailer is not one: a cut file
            return size if isize > _DEFLATE_MAX_RATIO * size else max(size, isize)
    except OSError:
        return 0  # the ingest names an unreadable file


_DEFLATE_MAX_RATIO = 1032
"""Largest uncompressed / compressed size ratio DEFLATE reaches (zlib's technical details)."""


def _stream(root: Path, out: Path, ranks: list[ranktables.RankTables],
            found: dict[int, list[int]] | None, shift: dict[int, int], t0: int,
            matched: pd.DataFrame, wanted: set[tuple[int, int]], ref_rank: int, summary: dict
            ) -> tuple[int, int, int]:
    """Write the merged trace to ``out`` (atomically; gzip when it ends in ``.gz``) one rank
    at a time: each rank is read, checked (``check_trace``, on its own events: their pids,
    track ids and flow ids are the rank's alone), encoded in batches and dropped before the
    next is read, so memory follows the largest rank, not the sum. Then the collective flow
    arrows, ``deviceProperties`` of ``ref_rank`` and the summary. Returns (events written,
    of them metadata, events moved to overlap tracks). Raises
    ``BadInput`` (``unmergeable``: the file is not left behind)."""
    n_events = n_meta = moved = 0
    locate: dict[tuple[int, int], tuple[int, int, int]] = {}
    n_flows = 0  # flow ids given so far: each rank's start after the previous ranks'
    device_props: Any = []
    with atomic_path(out) as tmp, open(tmp, "wb") as raw_fh:
        fh = gzip.GzipFile(fileobj=raw_fh, mode="wb", compresslevel=6) \
            if out.name.endswith(".gz") else raw_fh
        # the marker first: a folder walk knows this file for ours from its first bytes
        fh.write(b'{"' + OUTPUT_MARKER.encode() + b'":"analyzer merge","schemaVersion":1,'
                 b'"displayTimeUnit":"ms","traceEvents":[')
        first = True

        def put(events: list[dict]) -> None:
            nonlocal first
            for k in range(0, len(events), _ENCODE_BATCH):
                text = msgspec.json.encode(events[k:k + _ENCODE_BATCH])[1:-1]
                if text:
                    fh.write(text if first else b"," + text)
                    first = False

        for rt in ranks:
            r = _read_rank(rt)
            keep = None if found is None else _selected(r, rt, found[rt.rank])
            events, n_moved, n_new = _write_events(r, keep, shift, t0, n_flows, locate, wanted)
            n_flows += n_new
            events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0), -e.get("dur", 0)))
            _refuse_unmergeable(root, check_trace({"traceEvents": events}))
            if rt.rank == ref_rank:
                device_props = r.data.get("deviceProperties", [])
            put(events)
            n_events += len(events)
            n_meta += sum(1 for e in events if e["ph"] == "M")
            moved += n_moved
            del events, r  # before the next rank is read
        flows = _collective_flows(matched, locate, shift, t0)
        _refuse_unmergeable(root, check_trace({"traceEvents": flows}, strict_names=False))
        put(flows)
        n_events += len(flows)
        fh.write(b'],"deviceProperties":' + msgspec.json.encode(device_props)
                 + f',"{MERGE_KEY}":'.encode() + msgspec.json.encode(summary) + b"}")
        if fh is not raw_fh:
            fh.close()
    return n_events, n_meta, moved


def write_failure(exc: OSError, out: Path) -> BadInput:
    """The one line (``unwritable``) for a write of the merged trace, its sidecar or its
    manifest that failed: it names ``out`` and says that nothing half-written is left (the
    atomic writer removes its temp file; ``_merge`` what it wrote before the failure)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return BadInput(out, Reason.UNWRITABLE, f"cannot be written: {os.strerror(exc.errno)} "
                        "(nothing half-written is left)",
                        "free space there, or pass -o a file on another disk")
    return BadInput(out, Reason.UNWRITABLE, f"cannot be written ({exc.strerror or exc}); "
                    "nothing half-written is left",
                    "pass -o a file in a writable folder, e.g. -o /tmp/merged.trace.json.gz")


def _refuse_unmergeable(root: Path, problems: list[str]) -> None:
    """Per-event faults are filtered by ``_well_formed``; what is left comes from how the input
    events relate (an E closing no B, flow ends before its start ...): refuse, say which."""
    if problems:
        raise BadInput(root, "unmergeable", "the merged trace would break the Trace Event "
                       f"Format: {'; '.join(problems[:3])}",
                       "check the input traces with a viewer, or merge a run directory written "
                       "by `tracer record`")


def _refuse_out_on_input(run: rundirs.RunDir, out: Path) -> None:
    """Raise ``BadInput`` (``out_is_input``) when ``out`` or its sidecar is one of the files
    ``run`` is read from (a trace, manifest.json or a file it lists), through any link: the
    write would replace the input it is made of."""
    inputs = list(run.traces)
    if run.manifest is not None:
        inputs += [run.path / schemas.MANIFEST_NAME, *(run.path / f.path for f in run.manifest.files)]
    real = {os.path.realpath(p): p for p in inputs}
    for target in (out, sidecar_path_for(out)):
        hit = real.get(os.path.realpath(target))
        if hit is not None:
            raise BadInput(target, "out_is_input", f"is {hit.name}, one of the files merged "
                           "(writing it would destroy the input)",
                           f"pass -o a new file, e.g. -o {run.path / 'merged.trace.json.gz'}")


def alignment_widens(spread: pd.DataFrame) -> bool:
    """True when the median over matched collectives of ``spread_after_ns`` (``clock.end_spread``)
    is strictly above that of ``spread_before_ns`` (the rule of ``merge_traces``; the median: one
    collective delayed on a rank should not decide). No matched collective: False."""
    if not len(spread):
        return False
    return bool(spread["spread_after_ns"].median() > spread["spread_before_ns"].median())


def _us_text(ns: float) -> str:
    return f"{ns / 1000:,.1f}"


def _tracks(rank: int, names: dict[tuple[str, str], tuple[int, str]],
            key_of: dict[int, tuple[str, str]], row_of: dict[int, tuple[int, int]]
            ) -> tuple[list[dict], dict[int, int], dict[tuple, int], int]:
    """The tracks of ``rank`` in the merged trace: each source track (``names``: (pid, tid) ->
    (sort group, display name), ``_track_names``) gets as many lanes as its complete events
    (``row_of``: event_idx -> (ts, dur) ns) need to nest, then new tids in display order.
    Returns (the process and thread metadata events, event_idx -> lane, (track, lane) -> tid,
    the count of events moved to an overlap lane)."""
    pid, moved = rank + 1, 0
    out: list[dict] = []
    by_track: dict[tuple[str, str], list[int]] = {}
    for i in row_of:
        by_track.setdefault(key_of[i], []).append(i)
    lane_of: dict[int, int] = {}
    n_lanes: dict[tuple[str, str], int] = {}
    for key, members in by_track.items():
        lanes = assign_lanes([(row_of[i][0], row_of[i][0] + row_of[i][1]) for i in members])
        lane_of.update(zip(members, lanes))
        n_lanes[key] = max(lanes) + 1
        moved += sum(1 for lane in lanes if lane)
    order = sorted(names, key=lambda k: (names[k][0], names[k][1], k))
    tid_of: dict[tuple[tuple[str, str], int], int] = {}
    out.append(_meta(pid, 0, "process_name", name=f"rank {rank}"))
    out.append(_meta(pid, 0, "process_sort_index", sort_index=rank))
    for key in order:
        for lane in range(n_lanes.get(key, 1)):
            tid = len(tid_of) + 1
            tid_of[(key, lane)] = tid
            label = names[key][1] + (f" (overlap {lane})" if lane else "")
            out.append(_meta(pid, tid, "thread_name", name=label))
            out.append(_meta(pid, tid, "thread_sort_index", sort_index=tid))
    return out, lane_of, tid_of, moved


def _write_events(r: RankInput, sel: set[int] | None, shift: dict[int, int], t0: int,
                  flow_base: int, locate: dict[tuple[int, int], tuple[int, int, int]],
                  wanted: set[tuple[int, int]]) -> tuple[list[dict], int, int]:
    """Rewritten events of rank ``r`` (``sel``: the positions kept, None for all), the count
    moved to overlap tracks and the count of flow ids given: the rank's source flows get ids
    ``flow_base + 1 ...`` (unique across ranks when each rank starts after the previous ones).
    Fills, for the (rank, event_idx) in ``wanted`` (matched collectives), ``locate``:
    (rank, event_idx) -> (pid, tid, aligned start ns) of the written complete event."""
    flow_ids: dict[tuple, int] = {}
    evs = r.data["traceEvents"]
    x = r.events
    key_of = {i: _key(evs[i]) for i in x["event_idx"].tolist()}
    gpu_tracks = {key_of[i] for i in x.loc[x["is_gpu"].to_numpy(), "event_idx"].tolist()}
    step_tracks = {key_of[i] for i in x.loc[(x["role"] == "step").to_numpy(), "event_idx"]}
    names = _track_names(r.data, gpu_tracks, step_tracks)
    if sel is not None:
        x = x[x["event_idx"].isin(sel).to_numpy()]
    # complete events in the table's order (start, longest first, file order)
    row_of = dict(zip(x["event_idx"].tolist(), zip(x["ts_ns"].tolist(), x["dur_ns"].tolist())))
    pid = r.rank + 1
    out, lane_of, tid_of, moved = _tracks(r.rank, names, key_of, row_of)
    # innermost complete event starting at each (track, ts): flows bind to it
    starts_at: dict[tuple[tuple[str, str], int], tuple[int, int]] = {}
    for i, (ts, dur) in row_of.items():
        k = (key_of[i], ts)
        if k not in starts_at or dur < starts_at[k][0]:
            starts_at[k] = (dur, lane_of[i])
    flows: list[dict] = []
    for i, ev in enumerate(evs):
        if ev.get("ph") == "M" or not _well_formed(ev) or (sel is not None and i not in sel):
            continue
        key = _key(ev)
        new = dict(ev)
        new["pid"] = pid
        if not isinstance(new.get("name"), str):  # the format requires a string name
            new["name"] = "" if new.get("name") is None else str(new["name"])
        if ev.get("ph") == "X":
            row = row_of.get(i)
            if row is None:
                continue  # bad ts / dur: left out (the ingest's warnings count them)
            new["tid"] = tid_of[(key, lane_of[i])]
            start = row[0] - shift[r.rank] - t0
            new["ts"], new["dur"] = _us(start), _us(row[1])
            if (r.rank, i) in wanted:
                locate[(r.rank, i)] = (pid, new["tid"], start)
            out.append(new)
            continue
        if not r.ts_ok[i]:
            continue
        ts = int(r.ts_ns[i])
        new["ts"] = _us(ts - shift[r.rank] - t0)
        lane = starts_at.get((key, ts), (0, 0))[1] if ev.get("ph") in ("s", "t", "f") else 0
        new["tid"] = tid_of.get((key, lane), tid_of.get((key, 0), 0))
        if ev.get("ph") in ("s", "t", "f"):
            fkey = (r.rank, str(ev.get("cat")), str(ev.get("id")))
            new["id"] = flow_ids.setdefault(fkey, flow_base + len(flow_ids) + 1)
            flows.append(new)
            continue
        out.append(new)
    out += _paired_flows(flows)
    return out, moved, len(flow_ids)


def _paired_flows(flows: list[dict]) -> list[dict]:
    """Flow events whose id has both a start and a finish (a step selection can cut one off)."""
    phases: dict[tuple, set[str]] = {}
    for f in flows:
        phases.setdefault((f.get("cat"), f.get("name"), f["id"]), set()).add(f["ph"])
    return [f for f in flows if {"s", "f"} <= phases[(f.get("cat"), f.get("name"), f["id"])]]


def _collective_flows(matched: pd.DataFrame, locate: dict, shift: dict[int, int], t0: int) -> list[dict]:
    """Flow arrows linking each matched collective across ranks, in order of aligned start."""
    out: list[dict] = []
    next_id = 1
    for (pg, kind, seq), g in matched.groupby(["pg", "kind", "seq"], sort=True):
        placed = sorted((locate[(row.rank, row.event_idx)] for row in g.itertuples(index=False)
                         if (row.rank, row.event_idx) in locate), key=lambda p: p[2])
        label = f"{kind} #{seq}" + (f" pg {pg}" if pg else "")
        for (pid_a, tid_a, ts_a), (pid_b, tid_b, ts_b) in zip(placed, placed[1:]):
            fid = 1_000_000_000 + next_id
            next_id += 1
            out.append({"ph": "s", "cat": "collective", "name": label, "id": fid,
                        "pid": pid_a, "tid": tid_a, "ts": _us(ts_a)})
            out.append({"ph": "f", "bp": "e", "cat": "collective", "name": label, "id": fid,
                        "pid": pid_b, "tid": tid_b, "ts": _us(ts_b)})
    return out


def _opt_int(value: Any) -> int | None:
    return None if pd.isna(value) else int(value)


def _summary_steps(steps: StepRanges | None) -> list | None:
    """The sidecar's ``steps``: the step numbers chosen, as ever, for a selection of up to
    ``_LISTED_STEPS``; beyond, its ranges as [lo, hi] pairs (a number list would be the
    selection's size)."""
    if steps is None:
        return None
    if steps.count() <= _LISTED_STEPS:
        return [s for lo, hi in steps.ranges for s in range(lo, hi + 1)]
    return [[lo, hi] for lo, hi in steps.ranges]


def _meta(pid: int, tid: int, kind: str, **args: Any) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _summary(root: Path, inputs: list[ranktables.RankTables], ref_rank: int, offsets: pd.DataFrame,
             spread: pd.DataFrame, t0: int, aligned: bool, options: MergeOptions,
             warnings: list[str]) -> dict:
    files = {r.rank: (r.path.name, r.rank_source) for r in inputs}
    rows = [{"rank": int(row.rank), "file": files[row.rank][0], "rank_source": files[row.rank][1],
             "offset_ns": int(row.offset_ns), "mad_ns": _opt_int(row.mad_ns),
             "lo_ns": _opt_int(row.lo_ns), "hi_ns": _opt_int(row.hi_ns),
             "n_matched": int(row.n_matched), "consistent": bool(row.consistent),
             "estimate_ns": _opt_int(row.estimate_ns), "clock": str(row.clock)}
            for row in offsets.itertuples(index=False)]
    def stat(col: str, fn: str) -> int | None:
        return int(getattr(spread[col], fn)()) if len(spread) else None
    return {
        "source": str(root),
        "ref_rank": ref_rank,
        "aligned": aligned,
        "t0_ns": t0,
        "t0_note": "ts 0 in the merged trace is t0_ns on the reference rank's clock",
        "offset_rule": "aligned time = rank time - offset_ns; offset_ns = median over matched "
                       "collectives of (end on rank - end on ref_rank), clamped into the causality "
                       "bounds [lo_ns, hi_ns] (estimate_ns); mad_ns = median |diff - median|; "
                       "applied only when clock is measured: 0 when |estimate_ns| < mad_ns "
                       "(unresolved) or lo_ns > hi_ns (inconsistent)",
        "steps": _summary_steps(options.steps),
        "offsets": rows,
        "matched_collectives": int(len(spread)),
        "spread_before_ns": {"median": stat("spread_before_ns", "median"), "max": stat("spread_before_ns", "max")},
        "spread_after_ns": {"median": stat("spread_after_ns", "median"), "max": stat("spread_after_ns", "max")},
        "warnings": warnings,
    }
