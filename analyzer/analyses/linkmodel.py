"""The link model (issue 44, Deliver 2): the time of a collective of B bytes on g ranks over n
nodes, per kind, from curves that each keep their source.

A curve is a table: its source, the collective kind (all_reduce, all_gather, reduce_scatter,
all_to_all, send_recv), the group size g and node count n it was measured on, the dtype, and
rows (bytes, time_ns) in ascending bytes. Bytes follow nccl-tests (doc/PERFORMANCE.md, as
analyzer/analyses/collectives.py counts them: all_gather and reduce_scatter the whole buffer,
all_reduce and all_to_all the buffer); algbw and busbw of a row are nccl-tests' and reuse
``collectives.busbw_factor`` (``algbw_gbps``, ``busbw_gbps``).

Curves come from
(a) nccl-tests output files (``parse_nccl_tests``: ``all_reduce_perf``, ``all_gather_perf``,
    ``reduce_scatter_perf``, ``alltoall_perf``, ``sendrecv_perf``; the out-of-place time), and
(b) the transfer times already measured in a report's runs (``curves_from_report``: the part of
    each collective after its group's last rank started, analyzer/analyses/commsplit.py).
The table form is JSON (``dump_curves`` / ``load_curves``), what the link benchmark on this
machine writes too (tracer/linkbench.py: gloo on CPU, NCCL on GPUs; it needs torch), with, on
gloo, the arrival wait of ranks sharing CPU cores per group size and compute segment
(``ArrivalCurve``, ``arrival_wait``: analyzer/analyses/projstep.py adds it to a collective's
start).

``lookup`` interpolates in log-log between the measured sizes of the one curve of the same kind
and span (g, n); there are no built-in numbers. A span no curve has is refused (``BadInput``
``no_link_curve``); a size outside the curve's measured sizes is flagged in the answer
(``LinkTime.outside``), or refused with ``outside="refuse"``: never extrapolated silently.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import Counter
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Literal

import msgspec

from analyzer.analyses.collectives import busbw_factor
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import Report

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
"""The collective kinds a curve may hold (the analyzer's kind names, analyzer/ingest/commid.py)."""

NCCL_TESTS_KINDS = {"all_reduce_perf": "all_reduce", "all_gather_perf": "all_gather",
                    "reduce_scatter_perf": "reduce_scatter", "alltoall_perf": "all_to_all",
                    "sendrecv_perf": "send_recv"}
"""nccl-tests binary -> kind (the binaries NVIDIA/nccl-tests builds from src/*.cu)."""


class LinkRow(msgspec.Struct, kw_only=True, frozen=True):
    """One measured size of a curve."""

    bytes: int
    """nccl-tests bytes of the collective (> 0)."""
    time_ns: int
    """Its time (> 0): nccl-tests' out-of-place time, or the measured transfer time."""
    low_ns: int | None = None
    """The low end of its spread (0 < low_ns <= time_ns), None where the source gives none:
    nccl-tests' smaller of the out-of-place and in-place times; the link benchmark's 10th
    percentile of the per-call times over its iterations and ranks."""
    high_ns: int | None = None
    """The high end (high_ns >= time_ns): nccl-tests' larger of the two times; the link
    benchmark's 90th percentile."""


class LinkCurve(msgspec.Struct, kw_only=True, frozen=True):
    """One measured curve of the link model (the table form; JSON by ``dump_curves``)."""

    source: str
    """Where the rows come from: ``nccl-tests file PATH``, ``measured in run NAME (report
    ROOT)``, ``link benchmark on this machine DATE``."""
    kind: str
    """One of ``KINDS``."""
    group_size: int
    """Ranks of the group it was measured on (g)."""
    nodes: int
    """Nodes the group spans (n)."""
    dtype: str
    """Element type as the source writes it (nccl-tests ``float``, ``bfloat16``; a trace's
    dtype); "" unknown."""
    rows: list[LinkRow]
    """Ascending, distinct bytes."""


class ArrivalRow(msgspec.Struct, kw_only=True, frozen=True):
    """One compute segment of an arrival curve."""

    segment_ns: int
    """The compute before each call (> 0; ns of a rank's CPU time)."""
    wait_ns: int
    """The mean wait (>= 0) for the group's last rank beyond the compute and the call's time."""
    low_ns: int | None = None
    """The 10th percentile of the waits (0 <= low_ns <= wait_ns), None where not measured."""
    high_ns: int | None = None
    """The 90th percentile (high_ns >= wait_ns)."""
    below_zero_ns: int | None = None
    """The mean wait where it came out below 0 (the load changed between the benchmark's
    series: noise, said when measured), ``wait_ns`` then 0; None otherwise."""


class ArrivalCurve(msgspec.Struct, kw_only=True, frozen=True):
    """The arrival wait of a collective on g ranks over n nodes whose ranks share CPU cores
    (tracer/linkbench.py measures it on gloo: a rank blocked in a call gives its core to another,
    so the last member arrives a scheduler slice late), per compute segment between calls."""

    source: str
    group_size: int
    nodes: int
    rows: list[ArrivalRow]
    """Ascending, distinct segments."""


class LinkTable(msgspec.Struct, kw_only=True, frozen=True):
    """The table form as the link benchmark writes it: curves and arrival waits."""

    curves: list[LinkCurve]
    arrival: list[ArrivalCurve] = []


class LinkTime(msgspec.Struct, kw_only=True, frozen=True):
    """The answer of ``lookup``."""

    time_ns: float
    source: str
    """The curve's ``source``: every figure says where it comes from."""
    outside: Literal["", "below", "above"] = ""
    """"" inside the measured sizes (interpolated, or a measured size); "below": under the
    smallest measured size, ``time_ns`` is the smallest size's time (an upper bound: a
    collective's time does not fall as its size grows); "above": over the largest, the largest
    size's algbw held (``time_ns`` = its time x B / its bytes): an extrapolation, flagged."""
    low_ns: float | None = None
    """The low end of the spread at this size: the rows' ``low_ns`` interpolated (and flagged)
    as ``time_ns`` is; None where either row around the size has none."""
    high_ns: float | None = None
    """The high end, likewise from the rows' ``high_ns``."""


def algbw_gbps(row: LinkRow) -> float:
    """nccl-tests algbw of a row: bytes / time, GB/s (10^9 bytes/s)."""
    return row.bytes / row.time_ns


def busbw_gbps(curve: LinkCurve, row: LinkRow) -> float:
    """nccl-tests busbw of a row: algbw x the kind's factor on the curve's group size
    (``collectives.busbw_factor``; NaN where the factor is undefined)."""
    return algbw_gbps(row) * busbw_factor(curve.kind, curve.group_size)


# --- (a) nccl-tests output -----------------------------------------------------------------

# mpirun --tag-output / srun --label put "[1,0]<stdout>:" or "0: " before every line
_PREFIX = re.compile(r"^\s*(?:\[\d+,\d+\]<std(?:out|err)>:|\d+:\s)")
# "#  Rank  0 Group  0 Pid   6899 on host device  0 [0x07] NVIDIA H100" (2.13+: with Group);
# "#   Rank  0 Pid  21284 on host device  0 [...]" (older)
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\b")
_STARTING = re.compile(r"^#\s*Collective test starting:\s*(\w+)")
_NOT_NCCL_TESTS_FIX = ("pass the output of an nccl-tests binary (all_reduce_perf, all_gather_perf, "
                       "reduce_scatter_perf, alltoall_perf, sendrecv_perf) as it printed it")


def _not_nccl_tests(path: Path | str, problem: str) -> BadInput:
    return BadInput(path, "not_nccl_tests", f"not nccl-tests output: {problem}",
                    _NOT_NCCL_TESTS_FIX)


def _time_ns(text: str) -> int | None:
    """nccl-tests' time column (microseconds, "%7.2f" or "%7.0f" by magnitude) -> int ns
    exactly (Decimal: no float rounding); None for "N/A" or anything not a positive number."""
    try:
        us = Decimal(text)
    except InvalidOperation:
        return None
    return int((us * 1000).to_integral_value()) if us.is_finite() and us > 0 else None


def parse_nccl_tests(path: Path | str, *, kind: str | None = None) -> list[LinkCurve]:
    """The curves of one nccl-tests output file: one per dtype the table holds (``-d all``
    prints several), rows (size, out-of-place time) in ascending size; each row's spread
    (``low_ns``, ``high_ns``) the smaller and the larger of its out-of-place and in-place times
    (the two measurements nccl-tests makes of a size), None where the in-place time is "N/A".

    Format (NVIDIA/nccl-tests src/common.cu, its README's sample output): "#  Rank  r Group  k
    Pid p on HOST device d [...]" lines name the ranks (g: the ranks of group 0; n: the
    distinct hosts among them); the column header "#  size  count  type  redop  root  time
    algbw  busbw #wrong  time ..." gives the columns (the first ``time`` is the out-of-place
    one, in microseconds, the second the in-place one); data rows follow, possibly interleaved with NCCL INFO lines and
    prefixed by mpirun's "[1,0]<stdout>:". Rows of size 0 are left out (no log of 0); with
    several reduction ops (``-o all``) the rows of "sum" are kept, else of the first op seen.
    The kind: ``kind`` (one of ``KINDS``), else the "# Collective test starting: X_perf" line,
    else the file name (``all_reduce_perf.txt``).

    Raises ``BadInput`` (``not_nccl_tests``) naming the file when it has no nccl-tests column
    header, no data row, no "Rank ... on HOST device" lines, groups of unequal size, no kind
    to tell, or a size twice for one dtype (two runs in one file); ``missing`` / ``unreadable``
    when it cannot be read.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        raise BadInput(path, "missing", "no such file or folder", "check the path") from None
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})") from None
    lines = [_PREFIX.sub("", line, count=1) for line in text.splitlines()]

    # the header is a comment line; quoted outputs sometimes lose the "#", so it is not required
    header = next((cells for cells in (line.strip().lstrip("#").split() for line in lines)
                   if _is_header(cells)), None)
    if header is None:
        raise _not_nccl_tests(path, 'no column header ("#  size  count  type ... time  algbw  '
                              'busbw")')
    col = {name: header.index(name) for name in ("size", "type", "time")}
    in_place_at = next((i for i in range(col["time"] + 1, len(header)) if header[i] == "time"),
                       None)
    redop_at = header.index("redop") if "redop" in header else None

    # dtype -> (redop, bytes, time_ns, in-place time_ns or None)
    rows: dict[str, list[tuple[str, int, int, int | None]]] = {}
    for line in lines:
        cells = line.split()
        if len(cells) <= col["time"] or not cells[col["size"]].isdigit():
            continue
        if len(cells) != len(header):
            continue  # not a row of this table (an NCCL INFO line starting with a number)
        t_ns = _time_ns(cells[col["time"]])
        size = int(cells[col["size"]])
        if t_ns is None or size == 0:
            continue
        redop = cells[redop_at] if redop_at is not None else ""
        t_in_ns = None if in_place_at is None else _time_ns(cells[in_place_at])
        rows.setdefault(cells[col["type"]], []).append((redop, size, t_ns, t_in_ns))
    if not rows:
        raise _not_nccl_tests(path, "a column header but no data row under it")

    g, n = _group_and_nodes(lines, path)
    kind = kind or _kind_of(lines, path)
    if kind not in KINDS:
        raise _not_nccl_tests(path, "cannot tell which collective it measured; name the file "
                              "after the test (all_reduce_perf.txt, ...) or give its kind")
    curves = []
    for dtype, found in rows.items():
        ops = [op for op, _, _, _ in found]
        keep = "sum" if "sum" in ops else ops[0]
        sizes = [(b, t, t_in) for op, b, t, t_in in found if op == keep]
        twice = [b for b, c in Counter(b for b, _, _ in sizes).items() if c > 1]
        if twice:
            raise _not_nccl_tests(path, f"size {twice[0]} appears twice for {dtype}: two runs in "
                                  "one file; pass one run per file")
        curves.append(LinkCurve(source=f"nccl-tests file {path}", kind=kind, group_size=g,
                                nodes=n, dtype=dtype,
                                rows=[_nccl_row(*size) for size in sorted(sizes)]))
    return curves


def _nccl_row(size: int, t_ns: int, t_in_ns: int | None) -> LinkRow:
    """A row: the out-of-place time; its spread the two times' min and max (None without an
    in-place time)."""
    if t_in_ns is None:
        return LinkRow(bytes=size, time_ns=t_ns)
    return LinkRow(bytes=size, time_ns=t_ns, low_ns=min(t_ns, t_in_ns),
                   high_ns=max(t_ns, t_in_ns))


def _group_and_nodes(lines: list[str], path: Path) -> tuple[int, int]:
    """(g, n) from the "Rank r [Group k] Pid p on HOST device" lines: the ranks of the lowest
    group (src/common.cu prints the split ``color``: a run split by NCCL_TESTS_SPLIT_MASK runs
    the collective within each group) and the distinct hosts among them."""
    ranks = [m.groups() for m in map(_RANK.match, lines) if m]
    if not ranks:
        raise _not_nccl_tests(path, 'no "#  Rank  0 Group  0 Pid ... on HOST device ..." lines '
                              "to tell the group size and nodes")
    per_group = Counter(g or "0" for _, g, _ in ranks)
    if len(set(per_group.values())) != 1:
        raise _not_nccl_tests(path, f"groups of unequal size ({dict(per_group)})")
    first = min(per_group, key=int)
    return (per_group[first],
            len({host for _, grp, host in ranks if (grp or "0") == first}))


def _is_header(cells: list[str]) -> bool:
    """The nccl-tests column header: size, count, type, then time, algbw, busbw."""
    return (cells[:3] == ["size", "count", "type"] and "time" in cells and "algbw" in cells
            and "busbw" in cells)


def _kind_of(lines: list[str], path: Path) -> str | None:
    """The kind from the "Collective test starting" line (nccl-tests 2.14+), else the name."""
    for line in lines:
        m = _STARTING.match(line)
        if m:
            return NCCL_TESTS_KINDS.get(m.group(1))
    stem = path.name.lower()
    found = [k for b, k in NCCL_TESTS_KINDS.items() if b.removesuffix("_perf") in stem]
    return found[0] if len(found) == 1 else None


# --- (b) transfer times measured in a report's runs --------------------------------------

def curves_from_report(report: Report, *, nodes: int | None = None
                       ) -> tuple[list[LinkCurve], list[str]]:
    """Curves from the transfer times a report measured (analyzer/analyses/commsplit.py: from
    the group's last rank's start to the end, so the wait for a late rank is not link time).

    One point per (run, kind): bytes = ``communication[kind].bytes / .count`` (the mean
    nccl-tests bytes of an instance), time_ns = the kind's summed ``comm_ranks[].transfer_ns``
    over its summed ``measured`` instances (the mean transfer of a measured instance), rounded
    to ns. A mean is a point of the curve where time is affine in bytes (time = a + B / bw:
    the mean of the times is the time of the mean size). g: the ``comm_groups`` of the kind,
    which must agree on one size; n: 1 when the run's ranks were all on one host
    (``machine.ranks_on_host`` >= ``world_size``), else the hosts the group's ``pg_ranks``
    span with ``ranks_on_host`` consecutive ranks per host (torchrun's placement); a run whose
    manifest does not say (foreign traces): ``nodes`` when given (the caller knows where the
    traces were recorded), else the kind is left out. Points of
    the same (kind, g, n, dtype) from several runs make one curve; runs at the same bytes
    give their median time.

    Returns (curves, notes): a kind left out is said in a note (unknown bytes, nothing
    measured, groups of several sizes, nodes unknown); nothing is raised.
    """
    points: dict[tuple[str, int, int, str], dict[int, list[int]]] = {}
    runs: dict[tuple[str, int, int, str], list[str]] = {}
    notes = []
    for run in report.runs:
        if run.projection is not None:
            continue  # the fake group's calls: no transfer measured
        for kind, figs in sorted(run.communication.items()):
            if kind not in KINDS:
                continue
            why, key = _span(run, kind, nodes)
            measured = sum(r.measured for r in run.comm_ranks if r.kind == kind)
            transfer = sum(r.transfer_ns or 0 for r in run.comm_ranks if r.kind == kind)
            if why is None and (figs.bytes is None or figs.unknown_bytes or not figs.count):
                why = "the trace does not tell the bytes of every instance"
            if why is None and not measured:
                why = "no instance measured (no match across ranks)"
            if why is not None:
                notes.append(f"run {run.name}: {kind} left out of the link model: {why}")
                continue
            size = round(figs.bytes / figs.count)
            if size <= 0 or transfer <= 0:
                notes.append(f"run {run.name}: {kind} left out of the link model: "
                             "zero bytes or zero transfer time")
                continue
            points.setdefault(key, {}).setdefault(size, []).append(round(transfer / measured))
            runs.setdefault(key, []).append(run.name)
    curves = [LinkCurve(source=f"measured in run {', '.join(dict.fromkeys(runs[key]))} "
                               f"(report {report.root})",
                        kind=key[0], group_size=key[1], nodes=key[2], dtype=key[3],
                        rows=[LinkRow(bytes=b, time_ns=round(statistics.median(ts)))
                              for b, ts in sorted(by_size.items())])
              for key, by_size in points.items()]
    return curves, notes


def _span(run, kind: str, nodes: int | None) -> tuple[str | None, tuple[str, int, int, str]]:
    """(why the kind is left out or None, (kind, g, n, dtype)) of a run's kind."""
    groups = [grp for grp in run.comm_groups if grp.kind == kind]
    sizes = {grp.group_size for grp in groups}
    if not groups or None in sizes:
        return "its group size is unknown", (kind, 0, 0, "")
    if len(sizes) > 1:
        return (f"it runs on groups of sizes {sorted(sizes)}, which its per-kind times mix",
                (kind, 0, 0, ""))
    g = sizes.pop()
    per_host = (run.machine or {}).get("ranks_on_host")
    world = run.world_size
    if per_host and world and per_host >= world:
        n = 1
    elif not per_host and nodes is not None:
        n = nodes
    else:
        spans = {len({int(r) // per_host for r in re.findall(r"\d+", grp.pg_ranks)})
                 for grp in groups} if per_host else set()
        if len(spans) != 1 or 0 in spans:
            return ("the nodes its groups span are unknown (no ranks per host in the "
                    "manifest: give the node count)"), (kind, g, 0, "")
        n = spans.pop()
    dtypes = {grp.dtype for grp in groups}
    return None, (kind, g, n, dtypes.pop() if len(dtypes) == 1 else "")


# --- the table form and the lookup ---------------------------------------------------------

def dump_curves(curves: list[LinkCurve]) -> str:
    """The table form as JSON text (a list of curves, indented, final newline)."""
    return msgspec.json.format(msgspec.json.encode(curves), indent=2).decode() + "\n"


def load_curves(path: Path | str) -> list[LinkCurve]:
    """Curves from a JSON file of the table form (``dump_curves``'s list, or a link
    benchmark's ``LinkTable``). Raises ``BadInput`` (``bad_run_file``) when it does not have
    that shape or a curve's kind or rows are invalid."""
    return load_table(path).curves


def load_table(path: Path | str) -> LinkTable:
    """``load_curves``, with the arrival curves where the file has them (a ``LinkTable``;
    none in a plain list of curves). Raises ``BadInput`` (``bad_run_file``) also for an
    arrival curve whose rows are not ascending distinct segments > 0 with
    0 <= low <= wait <= high."""
    path = Path(path)
    try:
        got = msgspec.json.decode(path.read_bytes(), type=list[LinkCurve] | LinkTable)
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})") from None
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise BadInput(path, "bad_run_file", f"not a link-model table ({exc})",
                       "pass a file tracer linkbench wrote") from None
    table = LinkTable(curves=got) if isinstance(got, list) else got
    for a in table.arrival:
        segs = [r.segment_ns for r in a.rows]
        if (a.group_size < 1 or a.nodes < 1 or not a.rows or segs != sorted(set(segs))
                or min(segs) <= 0 or not all(
                    0 <= (r.low_ns if r.low_ns is not None else r.wait_ns) <= r.wait_ns
                    <= (r.high_ns if r.high_ns is not None else r.wait_ns) for r in a.rows)):
            raise BadInput(path, "bad_run_file", f"arrival curve of g={a.group_size} from "
                           f"{a.source!r} is not valid (g >= 1, n >= 1, rows of ascending "
                           "distinct segments > 0 and 0 <= low <= wait <= high)",
                           "pass a file tracer linkbench wrote")
    for c in table.curves:
        sizes = [r.bytes for r in c.rows]
        if (c.kind not in KINDS or c.group_size < 1 or c.nodes < 1 or not c.rows
                or sizes != sorted(set(sizes)) or min(sizes) <= 0
                or min(r.time_ns for r in c.rows) <= 0
                or not all(map(_spread_valid, c.rows))):
            raise BadInput(path, "bad_run_file", f"curve {c.kind!r} from {c.source!r} is not "
                           "valid (kind, g >= 1, n >= 1, rows of ascending distinct bytes > 0 "
                           "and 0 < low <= time <= high)",
                           "pass a file tracer linkbench wrote")
    return table


def _spread_valid(row: LinkRow) -> bool:
    """0 < low_ns <= time_ns <= high_ns, each end where given."""
    return ((row.low_ns is None or 0 < row.low_ns <= row.time_ns)
            and (row.high_ns is None or row.high_ns >= row.time_ns))


def lookup(curves: list[LinkCurve], kind: str, size_bytes: int, group_size: int, nodes: int,
           *, dtype: str | None = None,
           outside: Literal["flag", "refuse"] = "flag") -> LinkTime:
    """Time of a ``kind`` collective of ``size_bytes`` (nccl-tests bytes) on ``group_size``
    ranks over ``nodes`` nodes, from the first curve in ``curves`` of that kind and span (and
    ``dtype`` when given): a measured size gives its row's time; between two measured sizes
    B0 < B < B1 with times t0, t1, the log-log interpolation
    t = t0 x (B / B0) ** (log(t1 / t0) / log(B1 / B0)); the spread's ends (``low_ns``,
    ``high_ns``) each the same way from the rows' ends (None where a row has none).
    Outside the measured sizes: flagged (``LinkTime.outside``), or with ``outside="refuse"``
    raised. Raises ``BadInput`` (``no_link_curve``) when no curve has the span, or the size is
    outside and ``outside="refuse"``; ``ValueError`` for ``size_bytes`` <= 0."""
    if size_bytes <= 0:
        raise ValueError(f"size_bytes must be > 0, got {size_bytes!r}")
    match = [c for c in curves if (c.kind, c.group_size, c.nodes) == (kind, group_size, nodes)
             and (dtype is None or c.dtype == dtype)]
    if not match:
        have = sorted({(c.group_size, c.nodes) for c in curves if c.kind == kind})
        spans = ", ".join(f"g={g} n={n}" for g, n in have) or "none"
        raise BadInput(f"{kind} g={group_size} n={nodes}", "no_link_curve",
                       f"no link curve measured on this group span (curves of {kind}: {spans})",
                       f"pass nccl-tests output ({_binary(kind)}) measured on {group_size} ranks "
                       f"over {nodes} node(s), or run the link benchmark on such a group")
    curve = match[0]
    rows = curve.rows
    lo, hi = rows[0], rows[-1]
    if size_bytes < lo.bytes or size_bytes > hi.bytes:
        if outside == "refuse":
            raise BadInput(f"{kind} g={group_size} n={nodes}", "no_link_curve",
                           f"{size_bytes} bytes is outside the measured sizes {lo.bytes}.."
                           f"{hi.bytes} of {curve.source}",
                           "measure the curve over the sizes the projection needs")
        if size_bytes < lo.bytes:
            return LinkTime(time_ns=float(lo.time_ns), source=curve.source, outside="below",
                            low_ns=_scaled(lo.low_ns, 1.0), high_ns=_scaled(lo.high_ns, 1.0))
        scale = size_bytes / hi.bytes
        return LinkTime(time_ns=hi.time_ns * scale, source=curve.source, outside="above",
                        low_ns=_scaled(hi.low_ns, scale), high_ns=_scaled(hi.high_ns, scale))
    i = next(i for i, r in enumerate(rows) if r.bytes >= size_bytes)
    if rows[i].bytes == size_bytes:
        r = rows[i]
        return LinkTime(time_ns=float(r.time_ns), source=curve.source,
                        low_ns=_scaled(r.low_ns, 1.0), high_ns=_scaled(r.high_ns, 1.0))
    b0, b1 = rows[i - 1], rows[i]
    at = math.log(size_bytes / b0.bytes) / math.log(b1.bytes / b0.bytes)  # 0..1 in log(bytes)
    return LinkTime(time_ns=_log_log(b0.time_ns, b1.time_ns, at), source=curve.source,
                    low_ns=_log_log(b0.low_ns, b1.low_ns, at),
                    high_ns=_log_log(b0.high_ns, b1.high_ns, at))


def _scaled(t_ns: int | None, scale: float) -> float | None:
    return None if t_ns is None else t_ns * scale


def _log_log(t0: int | None, t1: int | None, at: float) -> float | None:
    """t0 x (t1 / t0) ** at: the log-log line through (B0, t0) and (B1, t1) at the size whose
    log lies ``at`` of the way from B0 to B1 (the same t as t0 (B / B0) ** slope); None where
    a time is None."""
    if t0 is None or t1 is None:
        return None
    return t0 * (t1 / t0) ** at


def _binary(kind: str) -> str:
    return next(b for b, k in NCCL_TESTS_KINDS.items() if k == kind) if kind in KINDS else kind


def read_link_model(paths: list[Path | str] | tuple[Path | str, ...]) -> list[LinkCurve]:
    """The curves of ``read_link_table(paths)``. Raises as it does."""
    return read_link_table(paths).curves


def read_link_table(paths: list[Path | str] | tuple[Path | str, ...]) -> LinkTable:
    """The curves and arrival curves of every file in ``paths``, in order: the table form (a
    link benchmark's ``LinkTable`` object, or a JSON list of curves as ``dump_curves`` and
    older benchmarks write it), a report.json (the transfers its runs measured,
    ``curves_from_report``: (b) of the module docstring) or nccl-tests output
    (``parse_nccl_tests``); only a link benchmark's file has arrival curves. Raises
    ``BadInput``: a file missing or unreadable (``bad_run_file``), a report.json with no
    measured transfer, two curves of one kind, span and dtype or two arrival curves of one span
    (``no_link_curve``), not a curve table and not nccl-tests output (``not_nccl_tests``)."""
    curves: list[LinkCurve] = []
    arrival: list[ArrivalCurve] = []
    for path in paths:
        p = Path(path)
        try:
            head = p.read_bytes()[:64].lstrip()
        except OSError as exc:
            raise BadInput(p, "bad_run_file", f"cannot read it ({exc.strerror or exc})",
                           "pass a link benchmark's JSON or nccl-tests output") from None
        if head.startswith(b"[") or head.startswith(b"{") and _is_table(p):
            table = load_table(p)
            curves += table.curves
            arrival += table.arrival
        elif head.startswith(b"{"):
            curves += _report_curves(p)
        else:
            curves += parse_nccl_tests(p)
    where = paths[0] if len(paths) == 1 else ", ".join(map(str, paths))
    seen: dict[tuple, LinkCurve] = {}
    for c in curves:  # lookup takes the first of a span: two would be chosen by file order
        key = (c.kind, c.group_size, c.nodes, c.dtype)
        if key in seen:
            raise BadInput(where, "no_link_curve", f"two curves of {c.kind} on g={c.group_size} "
                           f"n={c.nodes} ({c.dtype or 'dtype unknown'}): {seen[key].source}; "
                           f"{c.source}", "pass one measurement of each kind and group span "
                           "(the one taken on the target's ranks)")
        seen[key] = c
    spans: dict[tuple, ArrivalCurve] = {}
    for a in arrival:
        key = (a.group_size, a.nodes)
        if key in spans:
            raise BadInput(where, "no_link_curve", f"two arrival curves on g={a.group_size} "
                           f"n={a.nodes}: {spans[key].source}; {a.source}",
                           "pass one link benchmark per group span (the one taken on the "
                           "target's ranks)")
        spans[key] = a
    return LinkTable(curves=curves, arrival=arrival)


def _is_table(path: Path) -> bool:
    """A JSON object without "runs": meant as a link benchmark's table (``load_table`` says
    what it lacks), not a report.json, which always has its runs."""
    try:
        keys = msgspec.json.decode(path.read_bytes(), type=dict[str, msgspec.Raw])
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return False  # read as a report.json, which says what is wrong
    return "runs" not in keys


def arrival_wait(arrival: list[ArrivalCurve], group_size: int, nodes: int, segment_ns: float
                 ) -> tuple[float, float, float] | None:
    """(wait, low, high) in ns of a collective on ``group_size`` ranks over ``nodes`` nodes
    after ``segment_ns`` of compute, from the first arrival curve of that span: linear in
    log(segment) between two measured segments, the nearest row's outside them (the wait is a
    scheduler slice's order whatever the segment: not extrapolated); a row's missing spread is
    its wait. None when no curve has the span (nccl-tests, a report's transfers, an older link
    benchmark, NCCL: no wait added)."""
    curve = next((a for a in arrival if (a.group_size, a.nodes) == (group_size, nodes)), None)
    if curve is None:
        return None

    def ends(r: ArrivalRow) -> tuple[float, float, float]:
        return (float(r.wait_ns), float(r.wait_ns if r.low_ns is None else r.low_ns),
                float(r.wait_ns if r.high_ns is None else r.high_ns))

    rows = curve.rows
    if segment_ns <= rows[0].segment_ns:
        return ends(rows[0])
    if segment_ns >= rows[-1].segment_ns:
        return ends(rows[-1])
    i = next(i for i, r in enumerate(rows) if r.segment_ns >= segment_ns)
    a, b = ends(rows[i - 1]), ends(rows[i])
    at = math.log(segment_ns / rows[i - 1].segment_ns) / math.log(rows[i].segment_ns
                                                                    / rows[i - 1].segment_ns)
    return tuple(x + (y - x) * at for x, y in zip(a, b))  # type: ignore[return-value]


def _report_curves(path: Path) -> list[LinkCurve]:
    """``curves_from_report`` of the report.json at ``path``."""
    from analyzer.contract.report_types import decode

    try:
        report = decode(path.read_bytes())
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise BadInput(path, "bad_run_file", f"not a report.json the analyzer wrote ({exc})",
                       "pass a link benchmark's JSON, nccl-tests output or a report.json") from None
    curves, notes = curves_from_report(report)
    if not curves:
        raise BadInput(path, "no_link_curve", "its runs measured no transfer the link model can "
                       "use" + (f" ({notes[0]})" if notes else ""),
                       "pass the report of multi-rank records, or nccl-tests output")
    return curves
