"""Benchmark of the per-rank map on a Dask cluster (issue 21). Prints tables; asserts nothing.

1. **Thousands of ranks.** The corpus' 8-rank DLRM set (``dlrm_ddp_8rank_v100``, ~55 kB gzip
   per rank), each trace written again for ranks r, r+8, r+16 ... with its
   ``distributedInfo.rank`` / ``world_size`` rewritten (as bench/bench_scale.py does), into one
   folder per size (``--ranks``, default 1024, 2048, 4096). For each size, cold (no cache):
   ``analyzer report DIR --scheduler ADDR --tables-out DS`` against a cluster started with the
   real commands (``dask scheduler``; ``dask worker ADDR --nworkers W --nthreads 1``), and
   (``--local``) the same report with the local process pool. Measured: wall time, CPU time
   of every process (the client's tree from ``wait4``, the cluster's from psutil before and
   after: less sensitive than wall time to other load), the client's peak RSS (the
   ``analyzer`` process alone: what must stay <= 2 GiB), the cluster's peak RSS (scheduler +
   nanny + workers, polled likewise), and the ratio of each size's wall and CPU time to the
   smallest's (linear: 2.0 and 4.0).
2. **DLRM x50 against HTA.** The 8-rank set tiled 50 times (bench/tile.py via
   bench/bench_scale.py ``build``: ~42 MB of JSON per rank): the local pool, a 2-worker Dask
   cluster on this machine (processes, one thread each) and HTA (``TraceAnalysis`` +
   ``get_comm_comp_overlap``) in one table, cold, median of ``--repeat``.
3. **Collective-heavy ranks.** The cross-rank phase with every rank's collectives held in
   memory against the default budget (analyzer/ingest/spill.py, ``PARITYTRACE_TABLES_MEMORY``).
   For each size N (``--heavy``, default 256, 512, 1024): N synthetic gloo ranks of world N
   (tests/analyzer/helpers.py ``gloo_rank``; ``--heavy-collectives`` C per rank, two thirds
   all_reduces on the world group, a third all_gathers on a 3-rank group that ranks 0, 2, 4
   run, so the other ranks hold 2C/3), gzip ``.json.gz``. One cold ``analyzer report DIR
   --format json`` fills the per-rank table caches (timed; its report.json is the one both
   others must equal); then, report cache dropped and table caches kept (so that reading the
   caches and the cross-rank phase are the work), the same report with
   ``PARITYTRACE_TABLES_MEMORY=1T`` (every rank held: the report before the spill) and with it
   unset (default 256 MiB). Measured: wall time and the client's peak RSS (tree); printed
   with the bytes of the job's collectives table (``spill.frame_bytes``: what pandas holds,
   summed over the ranks, read in this process one rank at a time), the ratios default /
   held, whether report.json is the same, and per mode the peak RSS growth per 1,000 ranks
   between consecutive sizes. Each all_reduce row carries its
   group's ranks as text (``pg_ranks``, "[0, 1, ..., N-1]", as PyTorch writes "Process Group
   Ranks"): about 5 N bytes, so a rank's table grows with N and the job's with N^2 (at
   1,024 ranks ~97 % of it). C is kept small (default 300) so that 1,024 ranks hold ~1 GiB
   and the section takes ~6 minutes on 2 cores.

Peak RSS is polled every 5 ms from /proc (bench/bench_scale.py ``measure``). Timings on a
shared 2-core machine vary by 30-50 %; the load average is printed alongside.

Usage: ``python3 bench/dask_scale.py [--ranks 1024,2048,4096] [--workers 2] [--local]
[--repeat 1] [--no-scale] [--no-x50] [--no-hta] [--heavy 256,512,1024]
[--heavy-collectives 300] [--no-heavy] [--keep DIR]``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import msgspec
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_scale import (CORPUS, HTA_SCRIPT, _rss_bytes, _tree_pids, build,  # noqa: E402
                               drop_caches, gib, measure, median_run)


def build_ranks(dst: Path, ranks: int) -> int:
    """Write ``ranks`` gzip traces ``rank<N>.json.gz`` into ``dst`` from the 8 corpus ranks;
    return total bytes."""
    dst.mkdir(parents=True, exist_ok=True)
    sources = sorted(CORPUS.glob("worker*.pt.trace.json.gz"))
    total = 0
    for i, src in enumerate(sources):
        trace = msgspec.json.decode(gzip.decompress(src.read_bytes()))
        for r in range(i, ranks, len(sources)):
            di = dict(trace.get("distributedInfo") or {})
            di["rank"], di["world_size"] = r, ranks
            trace["distributedInfo"] = di
            path = dst / f"rank{r}.json.gz"
            path.write_bytes(gzip.compress(msgspec.json.encode(trace), 1))
            total += path.stat().st_size
    return total


class Cluster:
    """``dask scheduler`` and ``dask worker ADDR --nworkers N --nthreads 1`` as subprocesses
    (their own process group); ``peak_rss_bytes`` of their trees, polled while ``polling``."""

    def __init__(self, workers: int, tmp: Path) -> None:
        self.file = tmp / "scheduler.json"
        env = dict(os.environ)
        dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
        self.procs = [subprocess.Popen([*dask, "--host", "127.0.0.1", "--port", "0",
                                        "--dashboard-address", ":0", "--scheduler-file",
                                        str(self.file)], stdout=subprocess.DEVNULL,
                                       stderr=subprocess.DEVNULL, start_new_session=True,
                                       env=env)]
        deadline = time.monotonic() + 120
        while not self.file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.address = json.loads(self.file.read_text())["address"]
        self.procs.append(subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", self.address, "--nworkers",
             str(workers), "--nthreads", "1", "--memory-limit", "0", "--dashboard-address",
             ":0", "--host", "127.0.0.1"], stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True, env=env))
        from distributed import Client

        with Client(self.address, timeout=120) as c:
            c.wait_for_workers(workers, timeout=120)
        self.peak_rss_bytes = 0
        self._stop = threading.Event()

    def cpu_s(self) -> float:
        """User + system CPU seconds used so far by the scheduler, nannies and workers."""
        total = 0.0
        for proc in self.procs:
            for pid in _tree_pids(proc.pid):
                try:
                    t = psutil.Process(pid).cpu_times()
                    total += t.user + t.system
                except psutil.NoSuchProcess:
                    pass
        return total

    def poll(self) -> None:
        self.peak_rss_bytes = 0
        self.cpu_start_s = self.cpu_s()
        self._stop.clear()

        def run() -> None:
            while not self._stop.is_set():
                pids = [p for proc in self.procs for p in _tree_pids(proc.pid)]
                self.peak_rss_bytes = max(self.peak_rss_bytes, sum(map(_rss_bytes, pids)))
                time.sleep(0.005)
        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def stop_poll(self) -> int:
        self._stop.set()
        self._thread.join()
        self.used_cpu_s = self.cpu_s() - self.cpu_start_s
        return self.peak_rss_bytes

    def close(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for p in reversed(self.procs):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def report_cmd(traces: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "analyzer", "report", str(traces), "--out", str(out),
            "--format", "json", *extra]


def overlap_by_rank(out: Path) -> dict[int, float]:
    return {int(x["rank"]): float(x["overlap_frac"])
            for x in json.loads((out / "report.json").read_text())["runs"][0]["ranks"]}


def scale(args, tmp: Path, xdg: Path, cl: Cluster) -> None:
    sizes = [int(s) for s in args.ranks.split(",")]
    rows = []
    for n in sizes:
        traces = tmp / f"ranks{n}"
        t0 = time.perf_counter()
        total = build_ranks(traces, n)
        print(f"built {n} ranks ({total / 1e6:.0f} MB gzip) in {time.perf_counter() - t0:.0f} s",
              flush=True)
        modes = [("dask", ("--scheduler", cl.address, "--tables-out", str(tmp / f"ds{n}")))]
        if args.local:
            modes.append(("local", ("--scheduler", "local")))
        for mode, extra in modes:
            drop_caches(xdg)
            shutil.rmtree(tmp / f"ds{n}", ignore_errors=True)
            if mode == "dask":
                cl.poll()
            r = measure(report_cmd(traces, tmp / f"out-{mode}{n}", *extra))
            cluster_rss = cl.stop_poll() if mode == "dask" else 0
            cpu = r.cpu_s + (cl.used_cpu_s if mode == "dask" else 0)
            ov = overlap_by_rank(tmp / f"out-{mode}{n}")
            rows.append((n, mode, r, cluster_rss, len(ov), cpu))
            print(f"  {n} ranks, {mode}: {r.wall_s:.1f} s, CPU {cpu:.1f} s, client "
                  f"{gib(r.tree_rss_bytes)}, load {os.getloadavg()[0]:.1f}", flush=True)
        if not args.keep:
            shutil.rmtree(traces, ignore_errors=True)
            shutil.rmtree(tmp / f"ds{n}", ignore_errors=True)
    print()
    print(f"| ranks | map | wall s | wall vs {sizes[0]} | CPU s, all processes | CPU vs "
          f"{sizes[0]} | client peak RSS (tree) | cluster peak RSS | ranks in report.json |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    base = {mode: (r.wall_s, cpu) for n, mode, r, _, _, cpu in rows if n == sizes[0]}
    for n, mode, r, crss, nr, cpu in rows:
        print(f"| {n} | {mode} | {r.wall_s:.1f} | {r.wall_s / base[mode][0]:.2f} | {cpu:.1f} | "
              f"{cpu / base[mode][1]:.2f} | {gib(r.tree_rss_bytes)} | "
              f"{gib(crss) if crss else '-'} | {nr} |")
    print(f"(linear: {', '.join(f'{n / sizes[0]:.1f}' for n in sizes)}; the dask rows also "
          "write --tables-out)")
    print()


def x50(args, tmp: Path, xdg: Path, cl: Cluster) -> None:
    traces = tmp / "x50"
    traces.mkdir(exist_ok=True)
    t0 = time.perf_counter()
    total = build(traces, k=50, ranks=8)
    print(f"built DLRM x50, 8 ranks, {total / 8 / 1e6:.1f} MB per rank, in "
          f"{time.perf_counter() - t0:.0f} s", flush=True)
    runs: dict[str, list] = {"analyzer report, local pool": [],
                             f"analyzer report, Dask ({args.workers} workers)": []}
    if not args.no_hta:
        runs["HTA load + get_comm_comp_overlap"] = []
    cluster_rss, cluster_cpu = [], []
    for i in range(args.repeat):
        drop_caches(xdg)
        runs["analyzer report, local pool"].append(
            measure(report_cmd(traces, tmp / "x50-local", "--scheduler", "local")))
        drop_caches(xdg)
        cl.poll()
        runs[f"analyzer report, Dask ({args.workers} workers)"].append(
            measure(report_cmd(traces, tmp / "x50-dask", "--scheduler", cl.address)))
        cluster_rss.append(cl.stop_poll())
        cluster_cpu.append(cl.used_cpu_s)
        if not args.no_hta:
            runs["HTA load + get_comm_comp_overlap"].append(
                measure([sys.executable, "-c", HTA_SCRIPT, str(traces)]))
        print(f"  run {i + 1}: " + ", ".join(f"{k.split(',')[-1].strip()} {v[-1].wall_s:.1f} s"
                                             for k, v in runs.items()), flush=True)
    same = overlap_by_rank(tmp / "x50-local") == overlap_by_rank(tmp / "x50-dask")
    med = {k: median_run(v) for k, v in runs.items()}
    ref = med.get("HTA load + get_comm_comp_overlap")
    print()
    print(f"| 8 ranks x {total / 8 / 1e6:.0f} MB, cold (median of {args.repeat}) | wall s | "
          "CPU s, client tree | CPU s, cluster | peak RSS, client tree | peak RSS, cluster | "
          "wall vs HTA |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, r in med.items():
        dask = "Dask" in k
        crss = gib(sorted(cluster_rss)[len(cluster_rss) // 2]) if dask else "-"
        ccpu = f"{sorted(cluster_cpu)[len(cluster_cpu) // 2]:.1f}" if dask else "-"
        vs = f"{r.wall_s / ref.wall_s:.2f}" if ref else "-"
        print(f"| {k} | {r.wall_s:.1f} | {r.cpu_s:.1f} | {ccpu} | {gib(r.tree_rss_bytes)} | "
              f"{crss} | {vs} |")
    print()
    print(f"per-rank overlap, local pool vs Dask report.json: {'identical' if same else 'DIFFER'}")
    if ref:
        ours = overlap_by_rank(tmp / "x50-dask")
        theirs = {int(k): v for k, v in json.loads(ref.stdout.strip().splitlines()[-1]).items()}
        worst = max(abs(100 * ours[r] - theirs[r]) for r in theirs)
        print(f"per-rank overlap, Dask report vs HTA: largest difference {worst:.3f} "
              "percentage points")


def _write_heavy(job: tuple[Path, int, int, int, int]) -> int:
    """Write rank ``r`` of world ``n`` (``gloo_rank`` of tests/analyzer/helpers.py) as gzip
    JSON; return its bytes."""
    from tests.analyzer.helpers import gloo_rank
    from tests.merge.builders import write

    folder, r, n, n_reduce, n_gather = job
    return write(folder / f"rank{r}.json.gz", gloo_rank(r, n, n_reduce, n_gather)).stat().st_size


def collectives_bytes(traces: Path) -> int:
    """Bytes of the job's collectives table (``spill.frame_bytes``), one rank at a time."""
    from analyzer.contract import settings
    from analyzer.ingest import spill
    from analyzer.ingest.pipeline import load_tables

    os.environ[settings.TABLES_MEMORY.name] = "0"  # every rank on disk: this process holds one at a time
    try:
        job = load_tables(traces)
        return sum(spill.frame_bytes(c) for _, c in job.each("collectives"))
    finally:
        os.environ.pop(settings.TABLES_MEMORY.name)


def heavy(args, tmp: Path, xdg: Path) -> None:
    sizes = [int(s) for s in args.heavy.split(",")]
    c = args.heavy_collectives
    n_reduce, n_gather = c - c // 3, c // 3
    os.environ.pop("PARITYTRACE_TABLES_MEMORY", None)  # the subprocesses' budget: default
    rows = []
    for n in sizes:
        traces = tmp / f"heavy{n}"
        traces.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        with ProcessPoolExecutor(os.cpu_count()) as ex:
            total = sum(ex.map(_write_heavy, [(traces, r, n, n_reduce, n_gather)
                                              for r in range(n)], chunksize=16))
        print(f"built {n} ranks x {c} collectives ({total / 1e6:.0f} MB gzip) in "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        drop_caches(xdg)
        cold = measure(report_cmd(traces, tmp / f"heavy-cold{n}"))
        coll = collectives_bytes(traces)
        print(f"  cold (fills the table caches): {cold.wall_s:.1f} s, client "
              f"{gib(cold.tree_rss_bytes)}; collectives table {coll / 2**20:.0f} MiB", flush=True)
        runs = {}
        for mode, budget in (("held", "1T"), ("default", None)):
            drop_caches(xdg, tables=False)
            if budget:
                os.environ["PARITYTRACE_TABLES_MEMORY"] = budget
            try:
                runs[mode] = measure(report_cmd(traces, tmp / f"heavy-{mode}{n}"))
            finally:
                os.environ.pop("PARITYTRACE_TABLES_MEMORY", None)
            print(f"  warm, {mode}: {runs[mode].wall_s:.1f} s, client "
                  f"{gib(runs[mode].tree_rss_bytes)}, load {os.getloadavg()[0]:.1f}", flush=True)
        same = all(json.loads((tmp / f"heavy-{m}{n}" / "report.json").read_text()) ==
                   json.loads((tmp / f"heavy-cold{n}" / "report.json").read_text())
                   for m in runs)
        rows.append((n, coll, cold, runs["held"], runs["default"], same))
        if not args.keep:
            shutil.rmtree(traces, ignore_errors=True)
    print()
    print(f"| ranks (world N, {c} collectives each) | collectives table | cold s | "
          "warm s, held | warm s, default | wall held / default | peak RSS, held | "
          "peak RSS, default | RSS default / held | report.json same |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for n, coll, cold, h, d, same in rows:
        print(f"| {n} | {coll / 2**20:.0f} MiB | {cold.wall_s:.1f} | {h.wall_s:.1f} | "
              f"{d.wall_s:.1f} | {h.wall_s / d.wall_s:.2f} | {gib(h.tree_rss_bytes)} | "
              f"{gib(d.tree_rss_bytes)} | {d.tree_rss_bytes / h.tree_rss_bytes:.2f} | "
              f"{'yes' if same else 'NO'} |")
    for i, mode in ((3, "held"), (4, "default")):
        slopes = [(a[0], b[0], (b[i].tree_rss_bytes - a[i].tree_rss_bytes) / (b[0] - a[0]))
                  for a, b in zip(rows, rows[1:])]
        slopes = [f"{a}->{b}: {d * 1000 / 2**20:+.0f}" for a, b, d in slopes]
        print(f"peak RSS growth per 1,000 ranks, {mode}: {', '.join(slopes) or '-'} MiB")
    print("(warm: per-rank table caches kept, report cache dropped; held: "
          "PARITYTRACE_TABLES_MEMORY=1T; default: unset, 256 MiB; report.json compared with "
          "the cold run's)")
    print()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="1024,2048,4096", help="comma-separated sizes")
    ap.add_argument("--workers", type=int, default=2, help="Dask worker processes (default 2)")
    ap.add_argument("--local", action="store_true", help="also the local pool at each size")
    ap.add_argument("--repeat", type=int, default=1, help="runs of the x50 table (default 1)")
    ap.add_argument("--no-x50", action="store_true", help="skip the DLRM x50 table")
    ap.add_argument("--no-scale", action="store_true", help="skip the thousands-of-ranks table")
    ap.add_argument("--no-hta", action="store_true", help="skip HTA")
    ap.add_argument("--heavy", default="256,512,1024",
                    help="comma-separated sizes of the collective-heavy table")
    ap.add_argument("--heavy-collectives", type=int, default=300,
                    help="collectives per rank of the collective-heavy table (default 300)")
    ap.add_argument("--no-heavy", action="store_true", help="skip the collective-heavy table")
    ap.add_argument("--keep", type=Path, help="work here and keep the files")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"{gib(psutil.virtual_memory().total)} RAM, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d')}; load average before: {os.getloadavg()[0]:.2f}",
          flush=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "analyzer"),
                    str(REPO / "reports")], check=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster is stopped below
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-dask-"))
    tmp.mkdir(parents=True, exist_ok=True)
    xdg = tmp / "xdg-cache"
    os.environ["XDG_CACHE_HOME"] = str(xdg)  # every subprocess's caches, ours to drop
    cl = None
    try:
        if not (args.no_scale and args.no_x50):
            cl = Cluster(args.workers, tmp)
            print(f"cluster: {cl.address}, {args.workers} worker processes x 1 thread",
                  flush=True)
        if not args.no_scale:
            scale(args, tmp, xdg, cl)
        if not args.no_x50:
            x50(args, tmp, xdg, cl)
        if not args.no_heavy:
            heavy(args, tmp, xdg)
    finally:
        if cl is not None:
            cl.close()
        print(f"load average after: {os.getloadavg()[0]:.2f}")
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
