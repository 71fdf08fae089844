"""Benchmark of the analyzer at scale against HTA (issue 6), on plain JSON and on .json.gz
(issue 46). Prints tables; asserts nothing.

Builds a trace set by tiling the corpus' 8-rank DLRM set (``../shared/corpus/dlrm_ddp_8rank_v100``):
each rank's profiled window repeated ``--k`` times (bench/tile.py), laid out as Kineto writes it
(DLRM x50: about 41 MB of JSON per rank), in the formats of ``--formats`` (default both): plain
``rank<N>.json`` in ``json/`` and the same bytes gzipped, ``rank<N>.json.gz`` in ``gz/``: one gzip
member at level ``--gzip-level`` (default 6, as the tracer writes its traces, tracer/profiling.py;
torch's ``export_chrome_trace`` to a ``.gz`` name writes one member at ``gzip.open``'s level 9).
With ``--ranks`` above 8 the 8 tiled traces are reused for ranks r, r+8, r+16 ... with their
``distributedInfo.rank`` / ``world_size`` rewritten. Then, in the same run, each format on its own
files, one format after the other within each repeat and in the other order in the next (every
ratio compares commands run at most minutes apart):

* the floor (``FLOOR_SCRIPT``): what any tool must spend to read these traces: read + gunzip (of a
  .json.gz) + msgspec decode of every rank, in as many processes as the report uses, nothing
  else. Its gunzip is the product's inflate library (``INFLATE``, analyzer/ingest/decode.py:
  ISA-L's ``isal.isal_zlib`` where it imports, else ``zlib``), one ``decompressobj(wbits=31)``
  call per file, as ``decompress`` inflates a one-member file; the library is printed;
* ``analyzer report DIR --out OUT`` as a subprocess: cold (no cache at all), warm (the same
  command again: the whole-report cache, reports/cache.py, answers) and with only the per-rank
  tables cached (analyzer/ingest/pipeline.py; report cache dropped: what a change of options costs);
* HTA 0.5.0 (it reads .json and .json.gz): ``TraceAnalysis(trace_dir=DIR)`` +
  ``get_comm_comp_overlap()`` as a subprocess (skipped with ``--no-hta``).

Then, once per format: the peak RSS of parsing the largest rank as a worker does, as a multiple
of its JSON (``PEAK_SCRIPT``), and one more cold report under bench/stage_probe.py, whose CPU
seconds per stage (start-up, read + SHA-256, gunzip, decode, columns, classify, steps, collective
identity, per-rank tables, cache write, cross-rank phase, report build, rendering) are printed in
one table, a column per format, with their shares of that run's CPU time.

Both run from compiled .pyc files, as installed packages do (the analyzer's are compiled first).

Each command is measured for wall time, CPU time (user + system of the process and its
waited-for children, from ``wait4``: less sensitive than wall time to other load on the
machine) and peak RSS of its whole process tree: the sum of the RSS of the process and all its
descendants, polled from /proc every 5 ms (``peak tree``), and the largest single process,
polled likewise. Each measurement is repeated ``--repeat`` times and the median is shown;
ratios compare medians of the same run and format.

Agreement check, per format: report.json's per-rank overlap (overlap / communication over the
rank's ProfilerSteps) against HTA's per-rank ``comp_comm_overlap_pctg`` (within 0.1 percentage
point, as tests/e2e does), and every tiled step's overlap_ns / comm_ns against the untiled corpus
step of that rank (exactly: tiling copies the step, so each copy must give the same figures).

With ``--sub-us`` every timestamp is written 0.125 µs later, as a decimal
(``1694128201421108.125``): Kineto since 2023 writes sub-µs times, which the analyzer parses
from the decimal text (analyzer/ingest/decode.py) rather than as whole-µs integers; every duration and
per-step figure stays the same.

Usage: ``python3 bench/bench_scale.py [--k 50] [--ranks 8] [--repeat 3] [--formats json,gz]
[--gzip-level 6] [--no-hta] [--no-check] [--keep DIR] [--sub-us]``. With ``--keep DIR`` the
traces stay in ``DIR/json`` and ``DIR/gz``, and ``DIR/.built.json`` says what each holds: they
are reused while it matches; a ``gz/`` to build beside a matching ``json/`` is
gzipped from it, not tiled again. Timings on a shared 2-core machine vary by 30-50 %; the load
average is printed alongside.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import msgspec
import psutil

REPO = Path(__file__).resolve().parents[1]
CORPUS = Path(os.environ.get("PARITYTRACE_CORPUS") or REPO / ".." / "shared" / "corpus"
              ) / "dlrm_ddp_8rank_v100"
"""The source traces: ``$PARITYTRACE_CORPUS`` (as the tests), else ../shared/corpus."""
sys.path.insert(0, str(REPO))

from bench.tile import read_trace, tile  # noqa: E402

HTA_SCRIPT = """
import json, logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
df = a.get_comm_comp_overlap(visualize=False)
print(json.dumps({int(r): float(p) for r, p in zip(df["rank"], df["comp_comm_overlap_pctg"])}))
"""

FLOOR_SCRIPT = """
import json, multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
import msgspec
try:  # the product's choice (analyzer/ingest/decode.py INFLATE), without importing the analyzer
    from isal import isal_zlib as inflate
except ImportError:
    import zlib as inflate
class Event(msgspec.Struct):  # what any analysis of a trace reads of each event
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: float = -1
    dur: float = -1
    args: msgspec.Raw = msgspec.Raw(b"null")
class Trace(msgspec.Struct):
    traceEvents: list[Event]
decoder = msgspec.json.Decoder(Trace)
def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\\x1f\\x8b":  # one gzip member, in one call
        d = inflate.decompressobj(wbits=31)
        data = d.decompress(data)
        if not d.eof:
            raise SystemExit(f"{path}: gzip cut short")
    return len(decoder.decode(data).traceEvents)
if __name__ == "__main__":
    files = sorted(sys.argv[2:], key=os.path.getsize, reverse=True)
    with ProcessPoolExecutor(int(sys.argv[1]), multiprocessing.get_context("fork")) as ex:
        events = sum(ex.map(read, files))
    print(json.dumps({"events": events, "gunzip": inflate.__name__}))
"""
"""The floor: read, gunzip (a gzip file: the product's inflate library, ``decode.INFLATE``, one
``decompressobj(wbits=31)`` call per file, as ``decompress`` inflates a one-member file, less
its size cap) and decode every rank's JSON with msgspec into typed events (the fields every
analysis reads; ``args`` left as raw JSON), in as many processes as the report parses with
(``decode.cpu_count()``, largest file first), nothing else. It does not import the analyzer
(whose imports are the report's cost, not the floor's). Prints ``{"events": N, "gunzip":
module name}``."""

PEAK_SCRIPT = """
import gc, json, resource, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from analyzer.ingest import ranktables, tablecache
import analyzer.analyses.breakdown, analyzer.analyses.collectives, analyzer.analyses.memory
import analyzer.analyses.prefetch, analyzer.analyses.straggler, analyzer.ingest.classify
path = Path(sys.argv[2])
tablecache.tables_cache_path(path).unlink(missing_ok=True)  # parsed, not read from a cache
gc.collect()
with open("/proc/self/statm", "rb") as f:
    before = int(f.read().split()[1]) * resource.getpagesize()
ranktables.rank_tables(path)
tablecache.tables_cache_path(path).unlink(missing_ok=True)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"before": before, "peak": peak}))
"""
"""One rank parsed as a worker parses it (``rank_tables``), in a process that imported what a
worker imports: its RSS after the imports and its peak RSS (``ru_maxrss``)."""


@dataclass(slots=True)
class Run:
    """One measured command: wall seconds, CPU seconds (user + system, the process and its
    waited-for children), peak tree RSS and peak RSS of its largest single process (both
    polled: ``ru_maxrss`` would also count the benchmark's own pages from before ``exec``)."""

    wall_s: float
    cpu_s: float
    tree_rss_bytes: int
    max_proc_rss_bytes: int
    stdout: str


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, from /proc/PID/task/TID/children (Linux with
    CONFIG_PROC_CHILDREN: about 0.05 ms per poll here, against 1.2 ms for psutil's scan of every
    process); psutil where that file is missing."""
    try:
        out, i = [pid], 0
        while i < len(out):
            p, i = out[i], i + 1
            try:
                for task in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                        out += [int(c) for c in f.read().split()]
            except ProcessLookupError:
                continue
            except FileNotFoundError:
                if p == pid or os.path.exists(f"/proc/{p}"):
                    raise
        return out
    except FileNotFoundError:
        try:
            ps = psutil.Process(pid)
            return [pid, *(c.pid for c in ps.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []


def _rss_bytes(pid: int) -> int:
    """Resident set of ``pid`` (/proc/PID/statm, as psutil reads it); 0 once it has ended."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return 0


def measure(cmd: list[str], *, poll_s: float = 0.005) -> Run:
    """Run ``cmd``; poll the RSS of its process tree every ``poll_s`` until it exits (a poll
    reads a few /proc files: ~0.05 ms of CPU, 1 % of a core at 5 ms; psutil's scan cost 1.2 ms,
    which at 10 ms took ~12 % of a core from whichever command kept both cores busy). Raises
    SystemExit when it fails."""
    start = time.perf_counter()
    out = tempfile.TemporaryFile()
    err = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=out, stderr=err)
    peak = peak_one = 0
    while True:
        try:
            pid, status, ru = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:
            raise SystemExit(f"lost child of {cmd}") from None
        if pid:
            break
        sizes = [_rss_bytes(p) for p in _tree_pids(proc.pid)]
        peak = max(peak, sum(sizes))
        peak_one = max(peak_one, max(sizes, default=0))
        time.sleep(poll_s)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    err.seek(0)
    stdout, stderr = out.read().decode(), err.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {stderr.strip()[-2000:]}")
    return Run(wall_s=wall, cpu_s=ru.ru_utime + ru.ru_stime, tree_rss_bytes=peak, max_proc_rss_bytes=peak_one,
               stdout=stdout)


def kineto_bytes(trace: dict, enc: msgspec.json.Encoder) -> bytes:
    """JSON laid out as Kineto writes it: header keys indented, one event per line, a space
    after every ``:`` and ``,`` (HTA finds the rank with the regex ``"rank":\\s+(\\d+)``)."""
    head = {k: v for k, v in trace.items() if k != "traceEvents"}
    head_txt = msgspec.json.format(enc.encode(head), indent=2)
    events = b",\n".join(msgspec.json.format(enc.encode(e), indent=0)
                          for e in trace["traceEvents"])
    return head_txt[:-2] + b',\n  "traceEvents": [\n' + events + b"\n]}\n"


FORMATS = {"json": ("plain JSON", ".json"), "gz": (".json.gz", ".json.gz")}
"""The trace formats: key (``--formats``, the sub-folder's name) -> (label, file suffix)."""


def rank_files(folder: Path, fmt: str) -> list[Path]:
    """``folder``'s ``rank<N>`` traces of format ``fmt`` (a key of ``FORMATS``), sorted."""
    return sorted(folder.glob(f"rank*{FORMATS[fmt][1]}"))


def gzip_bytes(data: bytes, level: int) -> bytes:
    """``data`` as one gzip member at ``level`` (1-9), as the tracer writes a trace
    (tracer/profiling.py: ``gzip.compress``, level 6) and torch's ``export_chrome_trace`` writes
    to a ``.gz`` name (``gzip.open``: one member, level 9)."""
    return gzip.compress(data, compresslevel=level)


def build(dst: dict[str, Path], *, k: int, ranks: int, sub_us: bool = False, gzip_level: int = 6
          ) -> None:
    """Write ``ranks`` tiled DLRM traces ``rank<N><suffix>`` into ``dst[fmt]`` for each format
    of ``dst`` (keys of ``FORMATS``; with ``sub_us``, every ts 0.125 µs later, written as a
    decimal): the same Kineto-laid-out JSON in each, gzipped at ``gzip_level`` for ``gz``."""
    enc = msgspec.json.Encoder(decimal_format="number")
    sources = sorted(CORPUS.glob("worker*.pt.trace.json.gz"))
    for i, src in enumerate(sources):
        tiled = tile(read_trace(src), k)
        if sub_us:
            for e in tiled["traceEvents"]:
                if "ts" in e:
                    e["ts"] = Decimal(e["ts"]) + Decimal("0.125")
        for r in range(i, ranks, len(sources)):
            di = dict(tiled.get("distributedInfo") or {})
            di["rank"], di["world_size"] = r, ranks
            tiled["distributedInfo"] = di
            data = kineto_bytes(tiled, enc)
            for fmt, folder in dst.items():
                (folder / f"rank{r}{FORMATS[fmt][1]}").write_bytes(
                    gzip_bytes(data, gzip_level) if fmt == "gz" else data)
        del tiled


def stamp_of(fmt: str, *, k: int, ranks: int, sub_us: bool, gzip_level: int) -> dict:
    """What a folder of format ``fmt`` holds, as the stamp (``prepare``) says it."""
    built = {"k": k, "ranks": ranks, "sub_us": sub_us}
    return {**built, "gzip_level": gzip_level} if fmt == "gz" else built


STAMP = ".built.json"
"""The stamp of a bench-built folder ``root``: ``root/.built.json``, {format: ``stamp_of``} for
each complete format folder ``root/<fmt>``. It stays out of those folders: HTA reads every
``*.json`` of its folder as a trace (hta/common/trace_file.py), a stamp among them included."""


def prepare(root: Path, formats: list[str], *, k: int, ranks: int, sub_us: bool,
            gzip_level: int) -> dict[str, Path]:
    """{format: its folder ``root/<fmt>``} for each of ``formats``, built or reused. A folder is
    reused when ``root``'s ``STAMP`` says it holds ``stamp_of`` and it holds ``ranks`` traces; a
    ``gz`` to build beside a reusable ``json`` is gzipped from its files (no tiling); anything
    else is tiled again (``build``). A format's stamp is dropped before its folder is touched and
    written after, so a build cut short is never reused. Prints what it did."""
    want = {f: stamp_of(f, k=k, ranks=ranks, sub_us=sub_us, gzip_level=gzip_level)
            for f in FORMATS}
    dirs = {f: root / f for f in FORMATS}
    stamp = root / STAMP
    stamps = json.loads(stamp.read_text()) if stamp.exists() else {}
    stamps = {f: v for f, v in stamps.items() if f in FORMATS}  # this bench's older layout: none

    def usable(fmt: str) -> bool:
        return stamps.get(fmt) == want[fmt] and len(rank_files(dirs[fmt], fmt)) == ranks

    def write_stamp() -> None:
        stamp.write_text(json.dumps({"built_by": "bench/bench_scale.py", **stamps}))

    todo = [f for f in formats if not usable(f)]
    reused = [f for f in formats if f not in todo]
    if reused:
        print(f"reusing {ranks} traces in {', '.join(str(dirs[f]) for f in reused)}")
    for fmt in todo:
        stamps.pop(fmt, None)
    write_stamp()
    for fmt in todo:
        dirs[fmt].mkdir(parents=True, exist_ok=True)
        for p in rank_files(dirs[fmt], fmt):
            p.unlink()
    t0 = time.perf_counter()
    if todo == ["gz"] and usable("json"):
        for src in rank_files(dirs["json"], "json"):
            (dirs["gz"] / (src.name + ".gz")).write_bytes(gzip_bytes(src.read_bytes(), gzip_level))
        print(f"gzipped {ranks} ranks from {dirs['json']} (level {gzip_level}) in "
              f"{time.perf_counter() - t0:.1f} s")
    elif todo:
        build({f: dirs[f] for f in todo}, k=k, ranks=ranks, sub_us=sub_us, gzip_level=gzip_level)
        print(f"built {ranks} ranks x DLRM x{k} as {' and '.join(FORMATS[f][0] for f in todo)} "
              f"in {time.perf_counter() - t0:.1f} s")
    stamps.update({f: want[f] for f in todo})
    write_stamp()
    return {f: dirs[f] for f in formats}


def drop_caches(xdg: Path, *, tables: bool = True) -> None:
    """Remove the analyzer's caches under ``xdg`` (the subprocesses' XDG_CACHE_HOME): the
    whole-report cache and, with ``tables``, the per-rank tables caches
    (``paritytrace/tables/``) and the cache key that signs them. Without ``tables`` the key
    stays: the tables caches are signed with it (analyzer/ingest/cachekey.py), and a new key
    would make them all misses."""
    shutil.rmtree(xdg if tables else xdg / "paritytrace" / "reports", ignore_errors=True)


def median_run(runs: list[Run]) -> Run:
    """Median of each figure independently (stdout of the last run)."""
    return Run(wall_s=statistics.median(r.wall_s for r in runs),
               cpu_s=statistics.median(r.cpu_s for r in runs),
               tree_rss_bytes=int(statistics.median(r.tree_rss_bytes for r in runs)),
               max_proc_rss_bytes=int(statistics.median(r.max_proc_rss_bytes for r in runs)),
               stdout=runs[-1].stdout)


def check_steps(traces: Path, k: int) -> tuple[int, int]:
    """(steps checked, steps that differ): every tiled step's overlap_ns and comm_ns against the
    untiled corpus rank (source rank = rank mod 8)."""
    from analyzer import api

    ref = api.load_tables(CORPUS).breakdown
    ref = ref[ref["step"] >= 0]
    got = api.load_tables(traces).breakdown
    got = got[got["step"] >= 0]
    n_src = ref["rank"].nunique()
    bad = 0
    for row in got.itertuples():
        want = ref[ref["rank"] == row.rank % n_src]
        if len(want) != 1 or (int(want["overlap_ns"].iat[0]), int(want["comm_ns"].iat[0])) != (
                row.overlap_ns, row.comm_ns):
            bad += 1
    expected = k * got["rank"].nunique()
    return len(got), bad + abs(expected - len(got))


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def stages(traces: Path, out: Path, xdg: Path, log: Path
           ) -> tuple[Run, list[tuple[str, float, float]]]:
    """One more cold report of ``traces`` into ``out`` under bench/stage_probe.py, which logs to
    ``log``: (its run, its stage table)."""
    from bench.stage_probe import stage_table

    drop_caches(xdg)
    log.unlink(missing_ok=True)
    run = measure([sys.executable, str(REPO / "bench" / "stage_probe.py"), str(log), str(traces),
                   "--out", str(out)])
    return run, stage_table(log, run.cpu_s)


def parse_peak(files: list[Path]) -> tuple[int, int, int, int]:
    """(bytes of the largest of ``files``, bytes of its JSON, RSS after a worker's imports, peak
    RSS of parsing that rank): ``PEAK_SCRIPT`` in a subprocess."""
    from analyzer.ingest.decode import decompress

    largest = max(files, key=lambda p: p.stat().st_size)
    json_bytes = len(decompress(largest.read_bytes(), largest, 1 << 40))
    r = measure([sys.executable, "-c", PEAK_SCRIPT, str(REPO), str(largest)])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return largest.stat().st_size, json_bytes, got["before"], got["peak"]


def gunzip_library() -> tuple[str, str]:
    """(the product's inflate module, analyzer/ingest/decode.py ``INFLATE``; its library's
    version)."""
    import zlib

    from analyzer.ingest.decode import INFLATE

    if INFLATE is zlib:
        return "zlib", f"zlib {zlib.ZLIB_RUNTIME_VERSION}"
    import isal

    return INFLATE.__name__, f"python-isal {isal.__version__}"


def formats_arg(text: str) -> list[str]:
    """``--formats``: keys of ``FORMATS``, comma-separated; returned in ``FORMATS``' order.
    Raises ``argparse.ArgumentTypeError`` for anything else."""
    got = {f.strip() for f in text.split(",") if f.strip()}
    if not got or got - FORMATS.keys():
        raise argparse.ArgumentTypeError(f"{text!r}: give json, gz or json,gz")
    return [f for f in FORMATS if f in got]


@dataclass(slots=True)
class Runs:
    """One format's measurements: a run per repeat each (HTA's list empty with ``--no-hta``)."""

    floor: list[Run] = field(default_factory=list)
    cold: list[Run] = field(default_factory=list)
    warm: list[Run] = field(default_factory=list)
    tables: list[Run] = field(default_factory=list)
    hta: list[Run] = field(default_factory=list)


ROW_NAMES = {"floor": "floor: read + decode, {procs} processes",
             "floor_gz": "floor: read + gunzip + decode, {procs} processes",
             "cold": "analyzer report, cold (no cache)",
             "warm": "analyzer report, warm (report cached)",
             "tables": "analyzer report, per-rank tables cached",
             "hta": "HTA load + get_comm_comp_overlap"}
"""The summary table's measurement column, by ``Runs`` field (``floor_gz``: the .json.gz floor)."""


def ratio(a: float, b: float | None, digits: int = 3) -> str:
    """``a / b`` to ``digits`` decimals; "-" without ``b``."""
    return f"{a / b:.{digits}f}" if b else "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=50, help="copies of each rank's window (default 50)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks to write (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    ap.add_argument("--formats", type=formats_arg, default=list(FORMATS),
                    help="the trace formats measured: json (plain), gz (.json.gz) or json,gz "
                    "(default)")
    ap.add_argument("--gzip-level", type=int, default=6,
                    help="gzip level of the .json.gz traces (default 6, as the tracer writes)")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA")
    ap.add_argument("--no-check", action="store_true", help="skip the per-step agreement check")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the traces in this new or "
                    "bench-built folder DIR (DIR/json, DIR/gz) and keep them; the reports, "
                    "caches and stage logs go in DIR.bench-work beside it")
    ap.add_argument("--sub-us", action="store_true",
                    help="write times with sub-µs decimals, as Kineto since 2023 does")
    args = ap.parse_args()
    for name in ("k", "ranks", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not 1 <= args.gzip_level <= 9:
        ap.error(f"--gzip-level must be 1 to 9, got {args.gzip_level}")
    if not any(CORPUS.glob("worker*.pt.trace.json.gz")):
        raise SystemExit(f"bench_scale: no DLRM traces (worker*.pt.trace.json.gz) in {CORPUS}: set "
                         "PARITYTRACE_CORPUS to the corpus folder (../shared/corpus/README.md)")
    if args.keep and args.keep.exists() and (not args.keep.is_dir() or any(args.keep.iterdir())
                                             and not (args.keep / STAMP).exists()):
        raise SystemExit(f"bench_scale: --keep {args.keep} is not a folder this bench built (no "
                         ".built.json): give a new or empty folder, nothing in it is replaced")

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{gib(psutil.virtual_memory().total)} RAM, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    tmp = None
    if args.keep:
        root = args.keep
        root.mkdir(parents=True, exist_ok=True)
        for old in rank_files(root, "json"):  # this bench's layout before json/ and gz/
            old.unlink()
    else:
        tmp = tempfile.mkdtemp(prefix="bench-scale-")
        root = Path(tmp) / "traces"
        root.mkdir()
    try:
        dirs = prepare(root, args.formats, k=args.k, ranks=args.ranks, sub_us=args.sub_us,
                       gzip_level=args.gzip_level)
        files = {f: rank_files(d, f) for f, d in dirs.items()}
        label = {f: FORMATS[f][0] for f in dirs}
        for f, fs in files.items():
            size = sum(p.stat().st_size for p in fs)
            print(f"trace set, {label[f]}: {args.ranks} files in {dirs[f]}, "
                  f"{size / args.ranks / 1e6:.1f} MB per rank, {size / 1e9:.2f} GB in all"
                  + (f", one gzip member each at level {args.gzip_level}" if f == "gz" else "")
                  + f"; times in {'sub-µs decimals' if args.sub_us else 'whole µs'}")
        # pip compiles an installed package's .pyc (HTA's are there); an editable checkout on a
        # machine with PYTHONDONTWRITEBYTECODE would otherwise compile our sources on every run
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "analyzer"),
                        str(REPO / "reports")], check=True)
        work = root.with_name(root.name + ".bench-work")  # the bench's own files, beside
        work.mkdir(exist_ok=True)
        out = {f: work / f"report-out-{f}" for f in dirs}
        xdg = work / "xdg-cache"
        os.environ["XDG_CACHE_HOME"] = str(xdg)  # the subprocesses' report cache, ours to drop
        # the subprocesses run this checkout's analyzer, wherever the bench is started from
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                                 os.environ.get("PYTHONPATH")]))
        from analyzer.ingest.decode import cpu_count

        procs = min(cpu_count(), args.ranks)  # the report's processes (analyzer/ingest/pool.py)
        runs = {f: Runs() for f in dirs}
        for i in range(args.repeat):
            # one format after the other, the order reversed every other repeat: neither
            # format always runs first (on a page cache or a machine the other just warmed)
            for f in list(runs)[::-1 if i % 2 else 1]:
                m = runs[f]
                report = [sys.executable, "-m", "analyzer", "report", str(dirs[f]), "--out",
                          str(out[f])]
                m.floor.append(measure([sys.executable, "-c", FLOOR_SCRIPT, str(procs),
                                        *map(str, files[f])]))
                drop_caches(xdg)
                m.cold.append(measure(report))
                m.warm.append(measure(report))
                drop_caches(xdg, tables=False)
                m.tables.append(measure(report))
                if not args.no_hta:
                    m.hta.append(measure([sys.executable, "-c", HTA_SCRIPT, str(dirs[f])]))
                print(f"  run {i + 1}, {label[f]}: floor {m.floor[-1].wall_s:.2f} s, "
                      f"cold {m.cold[-1].wall_s:.2f} s, warm {m.warm[-1].wall_s:.2f} s, "
                      f"tables cached {m.tables[-1].wall_s:.2f} s"
                      + (f", HTA {m.hta[-1].wall_s:.2f} s" if m.hta else ""))
        if "gz" in runs:
            product, version = gunzip_library()
            used = json.loads(runs["gz"].floor[-1].stdout.strip().splitlines()[-1])["gunzip"]
            print(f"\ngunzip: the report's {product}, {version} (analyzer/ingest/decode.py "
                  f"INFLATE); the floor's {used}, one decompressobj(wbits=31) call per file"
                  + ("" if product == used else " (NOT the report's library)"))
        print()
        print(f"| {args.ranks} ranks x DLRM x{args.k}, median of {args.repeat} | measurement "
              "| wall s | CPU s | peak RSS, tree | largest process | CPU / floor | wall / HTA "
              "| CPU / HTA | RSS / HTA, tree |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        med: dict[str, dict[str, Run]] = {}
        for f, m in runs.items():
            med[f] = {name: median_run(getattr(m, name)) for name in Runs.__slots__
                      if getattr(m, name)}
            fl, ref = med[f]["floor"], med[f].get("hta")
            for name, r in med[f].items():
                row = ROW_NAMES["floor_gz" if (name, f) == ("floor", "gz") else name]
                print(f"| {label[f]} | {row.format(procs=procs)} | {r.wall_s:.2f} | "
                      f"{r.cpu_s:.2f} | {gib(r.tree_rss_bytes)} | {gib(r.max_proc_rss_bytes)} | "
                      f"{ratio(r.cpu_s, fl.cpu_s, 2)} | {ratio(r.wall_s, ref and ref.wall_s)} | "
                      f"{ratio(r.cpu_s, ref and ref.cpu_s)} | "
                      f"{ratio(r.tree_rss_bytes, ref and ref.tree_rss_bytes)} |")
        print()
        for f in runs:
            fl, co, ref = med[f]["floor"], med[f]["cold"], med[f].get("hta")
            print(f"{label[f]}: cold / floor: wall {co.wall_s / fl.wall_s:.2f}, CPU "
                  f"{co.cpu_s / fl.cpu_s:.2f}" + (
                      f"; cold / HTA: wall {co.wall_s / ref.wall_s:.3f}; peak RSS, tree "
                      f"{co.tree_rss_bytes / ref.tree_rss_bytes:.3f}, largest process "
                      f"{co.max_proc_rss_bytes / ref.max_proc_rss_bytes:.3f}" if ref else ""))
        for f in runs:
            file_bytes, json_bytes, before, peak = parse_peak(files[f])
            print(f"{label[f]}: parse of the largest rank ({file_bytes / 1e6:.1f} MB file, "
                  f"{json_bytes / 1e6:.1f} MB of JSON): RSS {gib(before)} after a worker's "
                  f"imports, peak {gib(peak)}: the parse adds {(peak - before) / json_bytes:.2f}"
                  " x its JSON size to the RSS (fixed costs dominate this multiple for ranks of "
                  "a few MB)")
        probe = {f: stages(dirs[f], out[f], xdg, work / f"stages-{f}.jsonl") for f in runs}
        print("\nWhere a cold report's time goes (bench/stage_probe.py, one more cold run per "
              "format: " + "; ".join(f"{label[f]} wall {r.wall_s:.2f} s, CPU {r.cpu_s:.2f} s"
                                      for f, (r, _) in probe.items())
              + f"; CPU seconds summed over the {procs} processes, share of that run's CPU)\n")
        print("| stage | " + " | ".join(f"{label[f]}: CPU s (share)" for f in probe) + " |")
        print("|---|" + "---:|" * len(probe))
        for row in zip(*(table for _, table in probe.values())):
            print(f"| {row[0][0]} | " + " | ".join(f"{sec:.2f} ({100 * share:.1f} %)"
                                                   for _, sec, share in row) + " |")
        print()
        for f, m in runs.items():
            if m.hta:
                ours = {int(x["rank"]): 100.0 * x["overlap_frac"] for x in
                        json.loads((out[f] / "report.json").read_text())["runs"][0]["ranks"]}
                theirs = {int(k): v for k, v in
                          json.loads(m.hta[-1].stdout.strip().splitlines()[-1]).items()}
                worst = max(abs(ours[r] - theirs[r]) for r in theirs)
                agree = set(ours) == set(theirs) and worst <= 0.1
                print(f"{label[f]}: overlap per rank, report vs HTA: "
                      f"{'agree' if agree else 'DISAGREE'} (largest difference {worst:.3f} "
                      f"percentage points over {len(theirs)} ranks)")
            if not args.no_check:
                n, bad = check_steps(dirs[f], args.k)
                print(f"{label[f]}: per-step overlap of every tiled step vs the untiled corpus "
                      f"step: {n} steps, {bad} differ")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)



if __name__ == "__main__":
    main()
