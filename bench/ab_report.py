"""Two checkouts' cold analyzer reports of one job, interleaved, compared as ratios.

Asserts nothing.

``python3 bench/ab_report.py BASE NEW TRACES [--pairs N]`` runs ``analyzer report TRACES`` from
checkout BASE (``PYTHONPATH=BASE``) and from checkout NEW, N times each, alternating which goes
first in each pair, every run cold: a fresh ``XDG_CACHE_HOME`` and a fresh ``--out`` (no parse
cache, no report cache). It prints each run's CPU seconds (user + system of the report's whole
process tree, from ``wait4``), wall seconds and peak RSS of its largest process, then the
medians and NEW / BASE ratios of the medians. On a shared machine whose speed moves by a third
within minutes, interleaving makes the ratio the figure to read: both checkouts see the same
moments. ``git worktree add /tmp/base <commit>`` makes a BASE.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cold_run(repo: Path, traces: Path, work: Path) -> tuple[float, float, int]:
    """(CPU s of the process tree, wall s, peak RSS bytes of its largest process) of one cold
    ``analyzer report`` of ``traces`` by the checkout ``repo``."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = dict(os.environ, XDG_CACHE_HOME=str(work / "cache"), PYTHONPATH=str(repo))
    start = time.perf_counter()
    with open(work / "stderr", "wb") as err:  # a file: a pipe fills and blocks the report
        proc = subprocess.Popen([sys.executable, "-m", "analyzer", "report", str(traces),
                                 "--out", str(work / "out")], env=env, cwd=repo,
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        tail = (work / "stderr").read_bytes().decode(errors="replace")[-500:]
        raise SystemExit(f"{repo}: analyzer report failed: {tail}")
    # ru_maxrss of wait4: the largest of the process and its waited-for descendants, in KiB
    return usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss * 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("base", type=Path, help="the checkout to compare against")
    ap.add_argument("new", type=Path, help="the checkout measured")
    ap.add_argument("traces", type=Path, help="the job: a run directory or folder of traces")
    ap.add_argument("--pairs", type=int, default=6, help="runs of each checkout (default 6)")
    args = ap.parse_args()
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    args.traces = args.traces.resolve()  # the reports run from each checkout
    for name in ("base", "new"):
        repo = getattr(args, name).resolve()
        if not (repo / "analyzer" / "__init__.py").is_file():
            ap.error(f"{repo} is not a paritytrace checkout (no analyzer/__init__.py)")
        setattr(args, name, repo)
    runs: dict[str, list[tuple[float, float, int]]] = {"base": [], "new": []}
    with tempfile.TemporaryDirectory(prefix="ab-report-") as tmp:
        for i in range(args.pairs):
            order = ("base", "new") if i % 2 == 0 else ("new", "base")
            for name in order:
                cpu, wall, rss = cold_run(getattr(args, name), args.traces, Path(tmp) / name)
                runs[name].append((cpu, wall, rss))
                print(f"pair {i + 1} {name}: CPU {cpu:.2f} s, wall {wall:.2f} s, "
                      f"largest process {rss / 2**20:.0f} MiB", flush=True)
    med = {name: [statistics.median(r[k] for r in rs) for k in range(3)]
           for name, rs in runs.items()}
    print(f"\n| median of {args.pairs} | CPU s | wall s | largest process MiB |")
    print("|---|---:|---:|---:|")
    for name in ("base", "new"):
        cpu, wall, rss = med[name]
        print(f"| {name}: {getattr(args, name)} | {cpu:.2f} | {wall:.2f} | {rss / 2**20:.0f} |")
    ratios = [n / b for n, b in zip(med["new"], med["base"])]
    print(f"| new / base | {ratios[0]:.3f} | {ratios[1]:.3f} | {ratios[2]:.3f} |")


if __name__ == "__main__":
    main()
