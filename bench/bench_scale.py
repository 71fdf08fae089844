"""Benchmark of the analyzer at scale against HTA (issue 6). Prints a table; asserts nothing.

Builds a trace set in a temporary folder by tiling the corpus' 8-rank DLRM set
(``../shared/corpus/dlrm_ddp_8rank_v100``): each rank's profiled window repeated ``--k`` times
(bench/tile.py), written as plain ``.json`` laid out as Kineto writes it (DLRM x50: about
42 MB per rank). With ``--ranks``
above 8 the 8 tiled traces are reused for ranks r, r+8, r+16 ... with their
``distributedInfo.rank`` / ``world_size`` rewritten. Then, in the same run and on the same files:

* ``analyzer report DIR --out OUT`` as a subprocess: cold (no cache at all), warm (the same
  command again: the whole-report cache, reports/cache.py, answers) and with only the per-rank
  tables cached (analyzer/ingest/pipeline.py; report cache dropped: what a change of options costs);
* HTA 0.5.0: ``TraceAnalysis(trace_dir=DIR)`` + ``get_comm_comp_overlap()`` as a subprocess
  (skipped with ``--no-hta``);
* the floor (``FLOOR_SCRIPT``): what any tool must spend to read these traces, read + gunzip +
  msgspec decode of every rank, in as many processes as the report uses, nothing else.

Then, once: the peak RSS of parsing the largest rank as a worker does, as a multiple of its
JSON (``PEAK_SCRIPT``), and one more cold report under bench/stage_probe.py, whose CPU seconds
per stage (start-up, read + SHA-256, decode, columns, classify, steps, collective identity,
per-rank tables, cache write, cross-rank phase, report build, rendering) are printed as a
table with their shares of the run's CPU time.

Both run from compiled .pyc files, as installed packages do (the analyzer's are compiled first).

Each command is measured for wall time, CPU time (user + system of the process and its
waited-for children, from ``wait4``: less sensitive than wall time to other load on the
machine) and peak RSS of its whole process tree: the sum of the RSS of the process and all its
descendants, polled from /proc every 5 ms (``peak tree``), and the largest single process,
polled likewise. Each measurement is repeated ``--repeat`` times and the median is shown;
ratios compare medians of the same run.

Agreement check: report.json's per-rank overlap (overlap / communication over the rank's
ProfilerSteps) against HTA's per-rank ``comp_comm_overlap_pctg`` (within 0.1 percentage point,
as tests/e2e does), and every tiled step's overlap_ns / comm_ns against the untiled corpus
step of that rank (exactly: tiling copies the step, so each copy must give the same figures).

With ``--sub-us`` every timestamp is written 0.125 µs later, as a decimal
(``1694128201421108.125``): Kineto since 2023 writes sub-µs times, which the analyzer parses
from the decimal text (analyzer/ingest/decode.py) rather than as whole-µs integers; every duration and
per-step figure stays the same.

Usage: ``python3 bench/bench_scale.py [--k 50] [--ranks 8] [--repeat 3] [--no-hta]
[--keep DIR] [--sub-us]``.  Timings on a shared 2-core machine vary by 30-50 %; the load average is
printed alongside.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
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
import gzip, multiprocessing, os, sys
from concurrent.futures import ProcessPoolExecutor
import msgspec
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
    if data[:2] == b"\\x1f\\x8b":
        data = gzip.decompress(data)
    return len(decoder.decode(data).traceEvents)
if __name__ == "__main__":
    files = sorted(sys.argv[2:], key=os.path.getsize, reverse=True)
    with ProcessPoolExecutor(int(sys.argv[1]), multiprocessing.get_context("fork")) as ex:
        print(sum(ex.map(read, files)))
"""
"""The floor: read, gunzip (when gzip) and decode every rank's JSON with msgspec into typed
events (the fields every analysis reads; ``args`` left as raw JSON), in as many processes as
the report parses with (``decode.cpu_count()``, largest file first), nothing else."""

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


def build(dst: Path, *, k: int, ranks: int, sub_us: bool = False) -> int:
    """Write ``ranks`` tiled DLRM traces ``rank<N>.json`` into ``dst`` (with ``sub_us``, every
    ts 0.125 µs later, written as a decimal); return total bytes."""
    enc = msgspec.json.Encoder(decimal_format="number")
    sources = sorted(CORPUS.glob("worker*.pt.trace.json.gz"))
    total = 0
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
            path = dst / f"rank{r}.json"
            path.write_bytes(kineto_bytes(tiled, enc))
            total += path.stat().st_size
        del tiled
    return total


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


def stages(traces: Path, out: Path, xdg: Path) -> tuple[Run, list[tuple[str, float, float]]]:
    """One more cold report, under bench/stage_probe.py: (its run, its stage table)."""
    from bench.stage_probe import stage_table

    drop_caches(xdg)
    log = out.parent / "stages.jsonl"
    log.unlink(missing_ok=True)
    run = measure([sys.executable, str(REPO / "bench" / "stage_probe.py"), str(log), str(traces),
                   "--out", str(out)])
    return run, stage_table(log, run.cpu_s)


def parse_peak(traces: Path) -> tuple[int, int, int]:
    """(bytes of the largest rank's JSON, RSS after a worker's imports, peak RSS of parsing that
    rank): ``PEAK_SCRIPT`` in a subprocess."""
    from analyzer.ingest.decode import decompress

    largest = max(sorted(traces.glob("rank*.json")), key=lambda p: p.stat().st_size)
    json_bytes = len(decompress(largest.read_bytes(), largest, 1 << 40))
    r = measure([sys.executable, "-c", PEAK_SCRIPT, str(REPO), str(largest)])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    return json_bytes, got["before"], got["peak"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=50, help="copies of each rank's window (default 50)")
    ap.add_argument("--ranks", type=int, default=8, help="ranks to write (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per measurement (default 3)")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA")
    ap.add_argument("--no-check", action="store_true", help="skip the per-step agreement check")
    ap.add_argument("--keep", type=Path, help="build (or reuse) the traces in this new or "
                    "bench-built folder DIR and keep them; the reports, caches and stage log go "
                    "in DIR.bench-work beside it")
    ap.add_argument("--sub-us", action="store_true",
                    help="write times with sub-µs decimals, as Kineto since 2023 does")
    args = ap.parse_args()
    for name in ("k", "ranks", "repeat"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not any(CORPUS.glob("worker*.pt.trace.json.gz")):
        raise SystemExit(f"bench_scale: no DLRM traces (worker*.pt.trace.json.gz) in {CORPUS}: set "
                         "PARITYTRACE_CORPUS to the corpus folder (../shared/corpus/README.md)")
    if args.keep and args.keep.exists() and (not args.keep.is_dir() or any(args.keep.iterdir())
                                             and not (args.keep / ".built.json").exists()):
        raise SystemExit(f"bench_scale: --keep {args.keep} is not a folder this bench built (no "
                         ".built.json): give a new or empty folder, nothing in it is replaced")

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{gib(psutil.virtual_memory().total)} RAM, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    tmp = None
    if args.keep:
        traces = args.keep
        traces.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.mkdtemp(prefix="bench-scale-")
        traces = Path(tmp) / "traces"
        traces.mkdir()
    try:
        existing = sorted(traces.glob("rank*.json"))
        built = {"k": args.k, "ranks": args.ranks, "sub_us": args.sub_us}
        stamp = traces / ".built.json"
        if len(existing) == args.ranks and stamp.exists() and json.loads(stamp.read_text()) == built:
            total = sum(p.stat().st_size for p in existing)
            print(f"reusing {args.ranks} traces in {traces}")
        else:
            for p in existing:
                p.unlink()
            t0 = time.perf_counter()
            stamp.unlink(missing_ok=True)
            total = build(traces, k=args.k, ranks=args.ranks, sub_us=args.sub_us)
            stamp.write_text(json.dumps(built))
            print(f"built {args.ranks} ranks x DLRM x{args.k} in {time.perf_counter() - t0:.1f} s")
        print(f"trace set: {args.ranks} files, {total / args.ranks / 1e6:.1f} MB per rank, "
              f"{total / 1e9:.2f} GB in all, times in "
              f"{'sub-µs decimals' if args.sub_us else 'whole µs'}")
        # pip compiles an installed package's .pyc (HTA's are there); an editable checkout on a
        # machine with PYTHONDONTWRITEBYTECODE would otherwise compile our sources on every run
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "analyzer"),
                        str(REPO / "reports")], check=True)
        work = traces.with_name(traces.name + ".bench-work")  # the bench's own files, beside
        work.mkdir(exist_ok=True)
        out = work / "report-out"
        report = [sys.executable, "-m", "analyzer", "report", str(traces), "--out", str(out)]
        xdg = work / "xdg-cache"
        os.environ["XDG_CACHE_HOME"] = str(xdg)  # the subprocesses' report cache, ours to drop
        # the subprocesses run this checkout's analyzer, wherever the bench is started from
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO),
                                                                 os.environ.get("PYTHONPATH")]))
        from analyzer.ingest.decode import cpu_count

        procs = min(cpu_count(), args.ranks)  # the report's processes (analyzer/ingest/pool.py)
        floor_cmd = [sys.executable, "-c", FLOOR_SCRIPT, str(procs),
                     *map(str, sorted(traces.glob("rank*.json")))]
        cold, warm, tables, hta, floor = [], [], [], [], []
        for i in range(args.repeat):
            floor.append(measure(floor_cmd))
            drop_caches(xdg)
            cold.append(measure(report))
            warm.append(measure(report))
            drop_caches(xdg, tables=False)
            tables.append(measure(report))
            if not args.no_hta:
                hta.append(measure([sys.executable, "-c", HTA_SCRIPT, str(traces)]))
            print(f"  run {i + 1}: floor {floor[-1].wall_s:.2f} s, "
                  f"cold {cold[-1].wall_s:.2f} s, warm {warm[-1].wall_s:.2f} s, "
                  f"tables cached {tables[-1].wall_s:.2f} s"
                  + (f", HTA {hta[-1].wall_s:.2f} s" if hta else ""))
        rows = [(f"floor: read + decode every rank, {procs} processes", median_run(floor)),
                ("analyzer report, cold (no cache)", median_run(cold)),
                ("analyzer report, warm (report cached)", median_run(warm)),
                ("analyzer report, per-rank tables cached", median_run(tables))]
        if hta:
            rows.append(("HTA load + get_comm_comp_overlap", median_run(hta)))
        ref = rows[-1][1] if hta else None
        print()
        print(f"| {args.ranks} ranks x {total / args.ranks / 1e6:.0f} MB (median of {args.repeat}) "
              "| wall s | CPU s | peak RSS, tree | largest process | wall vs HTA | CPU vs HTA "
              "| RSS vs HTA |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for name, r in rows:
            ratio_w = f"{r.wall_s / ref.wall_s:.3f}" if ref else "-"
            ratio_c = f"{r.cpu_s / ref.cpu_s:.3f}" if ref else "-"
            ratio_m = f"{r.tree_rss_bytes / ref.tree_rss_bytes:.3f}" if ref else "-"
            print(f"| {name} | {r.wall_s:.2f} | {r.cpu_s:.2f} | {gib(r.tree_rss_bytes)} | "
                  f"{gib(r.max_proc_rss_bytes)} | {ratio_w} | {ratio_c} | {ratio_m} |")
        print()
        fl, co = rows[0][1], rows[1][1]
        print(f"cold / floor: wall {co.wall_s / fl.wall_s:.2f}, CPU {co.cpu_s / fl.cpu_s:.2f}")
        if hta:
            print(f"cold / HTA: wall {co.wall_s / ref.wall_s:.3f}; peak RSS, tree "
                  f"{co.tree_rss_bytes / ref.tree_rss_bytes:.3f}, largest process "
                  f"{co.max_proc_rss_bytes / ref.max_proc_rss_bytes:.3f}")
        json_bytes, before, peak = parse_peak(traces)
        print(f"parse of the largest rank ({json_bytes / 1e6:.1f} MB of JSON): RSS {gib(before)} "
              f"after a worker's imports, peak {gib(peak)}: the parse adds "
              f"{(peak - before) / json_bytes:.2f} x its JSON size to the RSS (fixed costs "
              "dominate this multiple for ranks of a few MB)")
        run, table = stages(traces, out, xdg)
        print(f"\nWhere a cold report's time goes (bench/stage_probe.py, one more cold run: wall "
              f"{run.wall_s:.2f} s, CPU {run.cpu_s:.2f} s; CPU seconds summed over the "
              f"{procs} processes)\n")
        print("| stage | CPU s | share |")
        print("|---|---:|---:|")
        for name, sec, share in table:
            print(f"| {name} | {sec:.2f} | {100 * share:.1f} % |")
        print()
        if hta:
            ours = {int(x["rank"]): 100.0 * x["overlap_frac"]
                    for x in json.loads((out / "report.json").read_text())["runs"][0]["ranks"]}
            theirs = {int(k): v for k, v in json.loads(hta[-1].stdout.strip().splitlines()[-1]).items()}
            worst = max(abs(ours[r] - theirs[r]) for r in theirs)
            agree = set(ours) == set(theirs) and worst <= 0.1
            print(f"overlap per rank, report vs HTA: {'agree' if agree else 'DISAGREE'} "
                  f"(largest difference {worst:.3f} percentage points over {len(theirs)} ranks)")
        if not args.no_check:
            n, bad = check_steps(traces, args.k)
            print(f"per-step overlap of every tiled step vs the untiled corpus step: {n} steps, "
                  f"{bad} differ")
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
