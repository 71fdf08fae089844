"""Merge every rank's trace into one aligned Chrome trace (``analyzer merge``, issue 8).

Output layout (Perfetto / chrome://tracing):
- one process per rank: pid = rank + 1, ``process_name`` "rank N", ``process_sort_index`` N;
- one thread track per source (pid, tid) of that rank: CPU threads ("thread 123 (python3)",
  the thread holding ProfilerStep first), GPU streams ("GPU 0 stream 7"), profiler spans; named
  with ``thread_name`` and ordered with ``thread_sort_index``;
- complete events that partially overlap an earlier one on their track (real traces have them,
  e.g. on GPU streams or gloo threads; Perfetto drops or moves them) go to an "(overlap k)" track
  next to it, so nothing is dropped and every track is properly nested;
- times shifted by each rank's clock offset (``analyzer.clock``) and rebased so the earliest
  event is at 0 (keeps ns precision in the JSON doubles); the rebase and the offsets are stored
  under the top-level key ``paritytraceMerge`` and in the JSON sidecar;
- flow arrows (cat "collective") link each matched collective across ranks, in the order the
  ranks started it; the sources' own flows (ac2g, fwdbwd) are kept with ids made unique.

Raises ``BadInput`` for unusable input. Writes atomically (temp file + ``os.replace``).
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pandas as pd

from analyzer import clock
from analyzer.atomic import write_atomic
from analyzer.chrome_check import PHASES, check_trace
from analyzer.errors import BadInput

log = logging.getLogger(__name__)

MERGE_KEY = "paritytraceMerge"
"""Top-level key that marks a merged trace (such files are never merged again)."""
GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "gpu_sync"})
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass(kw_only=True, slots=True)
class MergeOptions:
    """What ``merge_traces`` writes."""

    steps: tuple[int, ...] | None = None
    """ProfilerStep numbers to keep (None: the whole traces)."""
    ref_rank: int | None = None
    """Rank whose clock the others are aligned to (None: the lowest rank)."""
    align: bool = True
    """False: write the traces unshifted (offsets are still estimated and reported)."""

    def __post_init__(self) -> None:
        if self.steps is not None and (not self.steps or any(s < 0 for s in self.steps)):
            raise ValueError(f"steps must be a non-empty tuple of step numbers >= 0, got {self.steps!r}")
        if self.ref_rank is not None and self.ref_rank < 0:
            raise ValueError(f"ref_rank must be >= 0, got {self.ref_rank!r}")


@dataclass(kw_only=True, slots=True)
class RankInput:
    """One rank's trace as read from disk."""

    rank: int
    """Rank number."""
    path: Path
    """The trace file."""
    rank_source: str
    """How the rank was found: "distributedInfo", "file name", "single file"."""
    data: dict[str, Any]
    """The parsed JSON object."""


@dataclass(kw_only=True, slots=True)
class MergeResult:
    """What ``merge_traces`` did."""

    out_path: Path
    """The merged trace."""
    sidecar_path: Path
    """The JSON sidecar with offsets and spreads."""
    ranks: list[RankInput]
    """Inputs, sorted by rank (``data`` dropped after the merge to free memory)."""
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

def _read_json(path: Path) -> Any:
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        try:
            return msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            if "UTF-8" not in str(exc):
                raise
            # names with bytes that are not UTF-8: replaced by U+FFFD, the rest is kept
            return msgspec.json.decode(raw.decode("utf-8", errors="replace").encode("utf-8"))
    except (OSError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise BadInput(path, "unreadable", f"cannot read the trace ({exc})",
                       "check the file is complete, or remove it from the folder") from None
    except msgspec.DecodeError as exc:
        raise BadInput(path, "not_a_trace", f"not valid JSON ({exc})",
                       "re-export the trace or remove it from the folder") from None


def discover(root: Path, skipped: list[str] | None = None) -> list[Path]:
    """Trace files in ``root``: ``*.json`` / ``*.json.gz`` except the manifest, hidden files and
    our own outputs (``analyzer.fswalk.not_an_input``). One line per file left out is appended
    to ``skipped``."""
    if not root.exists():
        raise BadInput(root, "missing", "no such file or folder", "check the path")
    if not root.is_dir():
        raise BadInput(root, "not_a_folder", "is a file, not a folder",
                       "pass the run directory or folder of traces that holds it")
    from analyzer.load import find_trace_files

    return find_trace_files(root, run_dir=False, skipped=skipped)


def read_inputs(root: Path, skipped: list[str] | None = None) -> list[RankInput]:
    """Read every trace in ``root`` and resolve its rank with the loader's rule (DESIGN.md
    "Trace semantics", ``analyzer.load.assign_ranks``). Raises ``BadInput`` (all problems at
    once) for duplicates, mixes and unreadable files.
    """
    problems: list[BadInput] = []
    loaded: list[tuple[Path, dict]] = []
    for path in discover(root, skipped):
        try:
            data = _read_json(path)
        except BadInput as exc:
            problems.append(exc)
            continue
        if isinstance(data, dict) and MERGE_KEY in data:
            log.info("skipping %s: already a merged trace", path)
            continue
        if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
            problems.append(BadInput(path, "not_a_trace", "has no traceEvents list",
                                     "pass a folder of PyTorch profiler (Chrome JSON) traces"))
            continue
        if not any(isinstance(ev, dict) and ev.get("ph") == "X" and _to_ns(ev.get("ts")) is not None
                   and _to_ns(ev.get("dur")) is not None for ev in data["traceEvents"]):
            problems.append(BadInput(path, "no_events", "holds no complete (ph X) events with a "
                                     "valid ts and dur: this rank recorded nothing",
                                     "re-record it, or move the file out of the folder"))
            continue
        loaded.append((path, data))
    if problems:
        raise BadInput(root, problems[0].reason, f"{len(problems)} unusable trace file(s): "
                       f"{problems[0].one_line()}", "fix or remove them", problems=problems[1:])
    if not loaded:
        raise BadInput(root, "no_traces", "holds no *.json / *.json.gz trace",
                       "pass a run directory (traces/<run>) or a folder of profiler traces")
    inputs = _resolve_ranks(root, loaded)
    return sorted(inputs, key=lambda r: r.rank)


def _resolve_ranks(root: Path, loaded: list[tuple[Path, dict]]) -> list[RankInput]:
    """The loader's rank rule (``analyzer.load.assign_ranks``) applied to raw JSON traces."""
    from analyzer.load import ParsedFile, assign_ranks

    by_path = {path: data for path, data in loaded}
    stubs = [ParsedFile(path=path, events=pd.DataFrame(), device_kind="", main_tid=None,
                        whole_trace_mode=False, steps=pd.DataFrame(),
                        distributed_info=data.get("distributedInfo") if isinstance(
                            data.get("distributedInfo"), dict) else None)
             for path, data in loaded]
    assigned, _world, problems = assign_ranks(stubs)
    if problems:
        raise BadInput(problems[0].path, problems[0].reason, problems[0].message, problems[0].fix,
                       problems=problems[1:])
    return [RankInput(rank=r, path=f.path, rank_source=source, data=by_path[f.path])
            for r, source, f in assigned]


def _to_ns(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not -_MAX_US < value < _MAX_US:  # also NaN and inf: beyond int64 ns
        return None
    if isinstance(value, int):
        return value * 1000
    return round(value * 1000)


_MAX_US = (2**63 - 1) // 1000 - 1


def complete_events(events: list) -> pd.DataFrame:
    """Complete (``X``) events of one trace as a table.

    Columns: idx (position in traceEvents), name, cat, pid, tid (str), ts_ns, dur_ns (int64),
    correlation (int64, -1 absent), pg_arg, coll_arg (record_param_comms "Process Group Name" /
    "Collective name", "" absent). Events with a non-numeric ts or dur are left out.
    """
    cols: dict[str, list] = {k: [] for k in ("idx", "name", "cat", "pid", "tid", "ts_ns", "dur_ns",
                                             "correlation", "pg_arg", "coll_arg")}
    for i, ev in enumerate(events):
        if not isinstance(ev, dict) or ev.get("ph") != "X":
            continue
        ts, dur = _to_ns(ev.get("ts")), _to_ns(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        corr = args.get("correlation", -1)
        cols["idx"].append(i)
        cols["name"].append(str(ev.get("name", "")))
        cols["cat"].append(str(ev.get("cat", "")))
        cols["pid"].append(str(ev.get("pid", "")))
        cols["tid"].append(str(ev.get("tid", "")))
        cols["ts_ns"].append(ts)
        cols["dur_ns"].append(dur)
        cols["correlation"].append(corr if isinstance(corr, int) and not isinstance(corr, bool)
                                   and -(2**63) <= corr < 2**63 else -1)
        cols["pg_arg"].append(str(args.get("Process Group Name", "") or ""))
        cols["coll_arg"].append(str(args.get("Collective name", "") or ""))
    df = pd.DataFrame(cols)
    return df.astype({"idx": "int64", "ts_ns": "int64", "dur_ns": "int64", "correlation": "int64"})


def _default_pg(data: dict) -> str:
    info = data.get("distributedInfo")
    pgs = info.get("pg_config") if isinstance(info, dict) else None
    if isinstance(pgs, list) and len(pgs) == 1 and isinstance(pgs[0], dict):
        return str(pgs[0].get("pg_name", ""))
    return ""


# --- steps ---------------------------------------------------------------------------------------

def parse_steps(text: str) -> tuple[int, ...]:
    """``"10"``, ``"10,12"``, ``"10-12"`` -> step numbers. Raises ValueError naming the bad part."""
    steps: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"bad step selection {part!r}: use N, N-M or N,M")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"bad step range {part!r}: end before start")
        steps.update(range(lo, hi + 1))
    return tuple(sorted(steps))


def _selected(x: pd.DataFrame, events: list, steps: tuple[int, ...]) -> tuple[set[int], list[int]]:
    """Indices of the events inside the chosen ProfilerSteps, and the steps found on this rank.

    CPU-side events: start inside a chosen step. GPU events: launched (``correlation``) by a
    selected CPU event, else start inside a chosen step.
    """
    names = x["name"].astype(object)
    step_no = names.str.extract(_STEP_RE, expand=False)
    spans = x[step_no.notna()].assign(step=step_no.dropna().astype(int))
    spans = spans[spans["step"].isin(steps)]
    windows = list(zip(spans["ts_ns"], spans["ts_ns"] + spans["dur_ns"]))

    def inside(ts_ns: int) -> bool:
        return any(a <= ts_ns < b for a, b in windows)

    keep: set[int] = set()
    launched: set[int] = set()
    for r in x[~x["cat"].str.lower().isin(GPU_CATS)].itertuples(index=False):
        if inside(r.ts_ns):
            keep.add(r.idx)
            if r.correlation >= 0:
                launched.add(r.correlation)
    for r in x[x["cat"].str.lower().isin(GPU_CATS)].itertuples(index=False):
        if r.correlation in launched or (r.correlation < 0 and inside(r.ts_ns)):
            keep.add(r.idx)
    for i, ev in enumerate(events):  # instants, counters, flows: by time
        if isinstance(ev, dict) and ev.get("ph") not in ("X", "M"):
            ts = _to_ns(ev.get("ts"))
            if ts is not None and inside(ts):
                keep.add(i)
    return keep, sorted(set(spans["step"].tolist()))


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


def _track_names(data: dict, x: pd.DataFrame) -> dict[tuple[str, str], tuple[int, str]]:
    """(pid, tid) -> (sort group, display name) for one rank's source tracks."""
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
    gpu_tracks = set(map(tuple, x.loc[x["cat"].str.lower().isin(GPU_CATS), ["pid", "tid"]].drop_duplicates().to_numpy()))
    step_tracks = set(map(tuple, x.loc[x["name"].astype(object).str.match(_STEP_RE), ["pid", "tid"]]
                          .drop_duplicates().to_numpy()))
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
    """The per-event rules of analyzer/chrome_check.py for a non-metadata source event (its
    name is made a string and its pid / ts rewritten by the caller): events that break them are
    left out of the merged trace rather than written into a file viewers reject."""
    ph = ev.get("ph")
    if not isinstance(ph, str) or ph not in PHASES or ph == "M" or "tid" not in ev:
        return False
    if ph in "iI":
        return ev.get("s", "t") in ("g", "p", "t")
    if ph in "stfbne":
        return ("id" in ev or "id2" in ev) and (ph != "f" or ev.get("bp", "e") == "e")
    if ph == "C":
        args = ev.get("args")
        return isinstance(args, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in args.values())
    return True


def _all_tracks(data: dict) -> list[tuple[str, str]]:
    seen: dict[tuple[str, str], None] = {}
    for ev in data["traceEvents"]:
        if isinstance(ev, dict) and ev.get("ph") != "M":  # same key as complete_events
            seen.setdefault((str(ev.get("pid", "")), str(ev.get("tid", ""))), None)
    return list(seen)


def _us(ns: int) -> int | float:
    """Nanoseconds -> microseconds for JSON: an int when whole, else exact to the ns."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


# --- merge ---------------------------------------------------------------------------------------

def sidecar_path_for(out: Path) -> Path:
    """``merged.trace.json.gz`` -> ``merged.offsets.json`` (same folder)."""
    name = out.name
    for suffix in (".trace.json.gz", ".json.gz", ".trace.json", ".json", ".gz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return out.with_name(name + ".offsets.json")


def merge_traces(root: Path | str, out: Path | str, options: MergeOptions | None = None) -> MergeResult:
    """Merge the traces in ``root`` into one aligned Chrome trace at ``out`` (gzip if ``.gz``).

    Also writes the sidecar (``sidecar_path_for(out)``): ref_rank, t0_ns, offsets, spread summary.
    Alignment rule: the estimated offsets are applied unless they widen the median spread of
    matched collective ends (``alignment_widens``); then the traces are written unshifted, the
    sidecar says ``"aligned": false`` and one warning line gives both medians.
    Raises ``BadInput`` for unusable input or a ``--steps`` selection no rank has.
    """
    options = options or MergeOptions()
    root, out = Path(root), Path(out)
    skipped: list[str] = []
    inputs = read_inputs(root, skipped)
    ranks = [r.rank for r in inputs]
    ref_rank = options.ref_rank if options.ref_rank is not None else ranks[0]
    if ref_rank not in ranks:
        raise BadInput(root, "bad_ref_rank", f"has no trace of rank {ref_rank} (ranks: {ranks})",
                       "pick one of the ranks present")
    warnings: list[str] = list(skipped)
    tables = {r.rank: complete_events(r.data["traceEvents"]) for r in inputs}

    per_rank = {r.rank: clock.collective_events(tables[r.rank], default_pg=_default_pg(r.data)) for r in inputs}
    matched = clock.match_collectives(per_rank)
    offsets = clock.estimate_offsets(matched, ranks, ref_rank)
    for row in offsets.itertuples(index=False):
        if row.rank != ref_rank and row.n_matched == 0:
            warnings.append(f"rank {row.rank} shares no collective with rank {ref_rank}: not aligned (offset 0)")
        elif not row.consistent:
            warnings.append(f"rank {row.rank}: matched collectives give contradictory bounds "
                            f"(lo {row.lo_ns} ns > hi {row.hi_ns} ns); collectives may be mismatched, "
                            "offset is the plain median")
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

    keep: dict[int, set[int] | None] = {r: None for r in ranks}
    if options.steps is not None:
        found_any = False
        for r in inputs:
            keep[r.rank], found = _selected(tables[r.rank], r.data["traceEvents"], options.steps)
            found_any |= bool(found)
            missing = sorted(set(options.steps) - set(found))
            if missing:
                warnings.append(f"rank {r.rank} ({r.path.name}) has no ProfilerStep {missing}")
        if not found_any:
            raise BadInput(root, "no_such_step", f"no trace has ProfilerStep {list(options.steps)}",
                           "pick steps shown by `analyzer summary`, or omit --steps")

    t0 = min((int(t["ts_ns"].min()) - shift[rank] for rank, t in tables.items() if len(t)), default=0)
    events, moved, locate = _write_events(inputs, tables, keep, shift, t0)
    events += _collective_flows(matched, locate, shift, t0)
    n_meta = sum(1 for e in events if e["ph"] == "M")
    events.sort(key=lambda e: (e["ph"] != "M", e.get("ts", 0), -e.get("dur", 0)))

    summary = _summary(root, inputs, ref_rank, offsets, spread, t0, align, options, warnings)
    merged = {
        "schemaVersion": 1,
        "displayTimeUnit": "ms",
        "deviceProperties": inputs[ranks.index(ref_rank)].data.get("deviceProperties", []),
        MERGE_KEY: summary,
        "traceEvents": events,
    }
    problems = check_trace(merged)
    if problems:  # per-event faults are filtered above; what is left comes from how the input
        # events relate (an E closing no B, flow ends before its start ...): refuse, say which
        raise BadInput(root, "unmergeable", "the merged trace would break the Trace Event "
                       f"Format: {'; '.join(problems[:3])}",
                       "check the input traces with a viewer, or merge a run directory written "
                       "by `tracer record`")
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = msgspec.json.encode(merged)
    write_atomic(out, gzip.compress(payload, compresslevel=6) if out.name.endswith(".gz") else payload)
    sidecar = sidecar_path_for(out)
    write_atomic(sidecar, msgspec.json.format(msgspec.json.encode(summary), indent=2))
    for r in inputs:
        r.data = {}
    log.info("wrote %s (%d events, %d metadata)", out, len(events), n_meta)
    return MergeResult(out_path=out, sidecar_path=sidecar, ranks=inputs, ref_rank=ref_rank,
                       offsets=offsets, spread=spread, t0_ns=t0, n_events=len(events),
                       n_moved_to_overlap_tracks=moved, warnings=warnings)


def alignment_widens(spread: pd.DataFrame) -> bool:
    """True when the estimated offsets make matched collectives end further apart than the raw
    clocks do: the median over matched collectives of ``spread_after_ns`` (``clock.end_spread``)
    is strictly above the median of ``spread_before_ns``. Then ``merge_traces`` keeps the
    unaligned times (offset 0 for every rank; the estimated offsets are still reported) and says
    so in one warning line. The median, as printed by ``analyzer merge``: one collective delayed
    on a rank should not decide. No matched collective: False (nothing to compare)."""
    if not len(spread):
        return False
    return bool(spread["spread_after_ns"].median() > spread["spread_before_ns"].median())


def _us_text(ns: float) -> str:
    return f"{ns / 1000:,.1f}"


def _write_events(inputs: list[RankInput], tables: dict[int, pd.DataFrame],
                  keep: dict[int, set[int] | None], shift: dict[int, int], t0: int
                  ) -> tuple[list[dict], int, dict[tuple[int, int], tuple[int, int, int]]]:
    """Rewritten events of every rank, the count moved to overlap tracks, and
    (rank, source idx) -> (pid, tid, aligned start ns) of each written complete event."""
    out: list[dict] = []
    moved = 0
    locate: dict[tuple[int, int], tuple[int, int, int]] = {}
    flow_ids: dict[tuple, int] = {}
    for r in inputs:
        x = tables[r.rank]
        sel = keep[r.rank]
        if sel is not None:
            x = x[x["idx"].isin(sel)]
        pid = r.rank + 1
        names = _track_names(r.data, tables[r.rank])
        # lanes per source track, then new tids in display order
        lane_of: dict[int, int] = {}
        n_lanes: dict[tuple[str, str], int] = {}
        for key, g in x.groupby(["pid", "tid"], sort=False):
            spans = list(zip(g["ts_ns"].tolist(), (g["ts_ns"] + g["dur_ns"]).tolist()))
            lanes = assign_lanes(spans)
            lane_of.update(zip(g["idx"].tolist(), lanes))
            n_lanes[key] = max(lanes) + 1
            moved += sum(1 for lane in lanes if lane)
        order = sorted(names, key=lambda k: (names[k][0], names[k][1], k))
        tid_of: dict[tuple[tuple[str, str], int], int] = {}
        out.append(_meta(pid, 0, "process_name", name=f"rank {r.rank}"))
        out.append(_meta(pid, 0, "process_sort_index", sort_index=r.rank))
        for key in order:
            for lane in range(n_lanes.get(key, 1)):
                tid = len(tid_of) + 1
                tid_of[(key, lane)] = tid
                label = names[key][1] + (f" (overlap {lane})" if lane else "")
                out.append(_meta(pid, tid, "thread_name", name=label))
                out.append(_meta(pid, tid, "thread_sort_index", sort_index=tid))
        # innermost complete event starting at each (track, ts): flows bind to it
        starts_at: dict[tuple[tuple[str, str], int], tuple[int, int]] = {}
        for row in x.itertuples(index=False):
            k = ((row.pid, row.tid), row.ts_ns)
            if k not in starts_at or row.dur_ns < starts_at[k][0]:
                starts_at[k] = (row.dur_ns, lane_of[row.idx])
        x_idx = {row.idx: row for row in x.itertuples(index=False)}
        flows: list[dict] = []
        for i, ev in enumerate(r.data["traceEvents"]):
            if not isinstance(ev, dict) or ev.get("ph") == "M" or not _well_formed(ev):
                continue
            if sel is not None and i not in sel:
                continue
            key = (str(ev.get("pid", "")), str(ev.get("tid", "")))
            new = dict(ev)
            new["pid"] = pid
            if not isinstance(new.get("name"), str):  # the format requires a string name
                new["name"] = "" if new.get("name") is None else str(new["name"])
            if ev.get("ph") == "X":
                row = x_idx.get(i)
                if row is None:
                    continue  # bad ts / dur: left out (counted by the loader's warnings)
                new["tid"] = tid_of[(key, lane_of[i])]
                start = row.ts_ns - shift[r.rank] - t0
                new["ts"], new["dur"] = _us(start), _us(row.dur_ns)
                locate[(r.rank, i)] = (pid, new["tid"], start)
                out.append(new)
                continue
            ts = _to_ns(ev.get("ts"))
            if ts is None:
                continue
            new["ts"] = _us(ts - shift[r.rank] - t0)
            lane = starts_at.get((key, ts), (0, 0))[1] if ev.get("ph") in ("s", "t", "f") else 0
            new["tid"] = tid_of.get((key, lane), tid_of.get((key, 0), 0))
            if ev.get("ph") in ("s", "t", "f"):
                fkey = (r.rank, str(ev.get("cat")), str(ev.get("id")))
                new["id"] = flow_ids.setdefault(fkey, len(flow_ids) + 1)
                flows.append(new)
                continue
            out.append(new)
        out += _paired_flows(flows)
    return out, moved, locate


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
    for (pg, backend, kind, seq), g in matched.groupby(["pg", "backend", "kind", "seq"], sort=True):
        placed = sorted((locate[(row.rank, row.idx)] for row in g.itertuples(index=False)
                         if (row.rank, row.idx) in locate), key=lambda p: p[2])
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


def _meta(pid: int, tid: int, kind: str, **args: Any) -> dict:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def _summary(root: Path, inputs: list[RankInput], ref_rank: int, offsets: pd.DataFrame,
             spread: pd.DataFrame, t0: int, aligned: bool, options: MergeOptions,
             warnings: list[str]) -> dict:
    files = {r.rank: (r.path.name, r.rank_source) for r in inputs}
    rows = []
    for row in offsets.itertuples(index=False):
        rows.append({"rank": int(row.rank), "file": files[row.rank][0], "rank_source": files[row.rank][1],
                     "offset_ns": int(row.offset_ns),
                     "mad_ns": _opt_int(row.mad_ns), "lo_ns": _opt_int(row.lo_ns),
                     "hi_ns": _opt_int(row.hi_ns), "n_matched": int(row.n_matched),
                     "consistent": bool(row.consistent)})
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
                       "bounds [lo_ns, hi_ns]; mad_ns = median |diff - median|",
        "steps": list(options.steps) if options.steps is not None else None,
        "offsets": rows,
        "matched_collectives": int(len(spread)),
        "spread_before_ns": {"median": stat("spread_before_ns", "median"), "max": stat("spread_before_ns", "max")},
        "spread_after_ns": {"median": stat("spread_after_ns", "median"), "max": stat("spread_after_ns", "max")},
        "warnings": warnings,
    }
