"""Benchmark of ``tracer record`` (not a test: prints numbers, asserts nothing).

1. Wall time and CPU time of ``tracer record --strategy all`` on defaults (hidden 256, 2 layers,
   batch 8 x 128, 2 ranks, 5 steps), the README's main job, ``--repeat`` times (default 3);
   prints every run and the medians. CPU = user + system seconds of the whole process tree
   (launcher, baseline, every rank: ``getrusage(RUSAGE_CHILDREN)`` before and after), which
   varies less than wall time on a shared machine. Target: <= 60 s wall on 2 cores.
2. Profiler overhead, from one record per strategy with unprofiled steps on both sides of the
   active window (``--wait 5 --warmup 1 --active 5 --steps 16``): median wall_ns of the active
   (profiled) steps / median wall_ns of the unprofiled steps 1..4 and 11..15 (step 0 carries the
   numerics and warm-up; the warmup step is traced too, so it is in neither group), per rank,
   then the median over ranks. Target: <= 1.15.

Usage: ``python3 bench/bench_record.py [--skip-all] [--skip-overhead] [--repeat N] [--src DIR]``.
``--src DIR`` records with the tracer of another checkout (DIR holds ``tracer/`` and
``analyzer/``; it becomes the records' working directory and leads PYTHONPATH), e.g. an export of
an older commit, for a before/after run on the same machine state. Timings on a shared 2-core
machine vary by 30-50 %; the load average is printed alongside.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

SCHEDULE = ["--wait", "5", "--warmup", "1", "--active", "5", "--steps", "16"]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def record(out: Path, args: list[str], src: Path | None = None) -> tuple[float, float]:
    """Run ``python -m tracer record ARGS --out OUT`` (with the tracer under ``src`` when given);
    return (wall seconds, CPU seconds of its whole process tree)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    cpu0 = _children_cpu_s()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *args, "--out", str(out)],
                          capture_output=True, text=True, env=env, cwd=src)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"record failed: {proc.stderr.strip()}")
    return elapsed, _children_cpu_s() - cpu0


def overhead_ratio(steps: pd.DataFrame) -> float:
    """Median over ranks of median(profiled wall_ns) / median(unprofiled wall_ns, steps > 0 and
    not warmup)."""
    ratios = []
    for _, g in steps.groupby("rank"):
        prof = g.loc[g["profiled"], "wall_ns"]
        unprof = g.loc[(~g["profiled"]) & (g["step"] > 0) & (g["step"] != 5), "wall_ns"]
        ratios.append(prof.median() / unprof.median())
    return statistics.median(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-all", action="store_true", help="skip the defaults record")
    ap.add_argument("--skip-overhead", action="store_true", help="skip the profiler-overhead record")
    ap.add_argument("--repeat", type=int, default=3, help="defaults records to run (median printed)")
    ap.add_argument("--src", type=Path, default=None, help="checkout whose tracer records")
    opts = ap.parse_args()
    src = opts.src.resolve() if opts.src is not None else None
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})"
          + (f"; tracer from {src}" if src else ""))
    with tempfile.TemporaryDirectory(prefix="bench-record-") as tmp:
        tmp = Path(tmp)
        if not opts.skip_all:
            walls, cpus = [], []
            for i in range(opts.repeat):
                wall, cpu = record(tmp / f"defaults{i}", ["--strategy", "all"], src)
                walls.append(wall)
                cpus.append(cpu)
                print(f"  run {i + 1}: {wall:.1f} s wall, {cpu:.1f} s CPU "
                      f"(load {os.getloadavg()[0]:.2f})")
            print(f"tracer record --strategy all (defaults), median of {opts.repeat}: "
                  f"{statistics.median(walls):.1f} s wall, {statistics.median(cpus):.1f} s CPU")
        if not opts.skip_overhead:
            wall, cpu = record(tmp / "overhead", ["--strategy", "all", *SCHEDULE], src)
            print(f"overhead record ({' '.join(SCHEDULE)}, all strategies): {wall:.1f} s wall, "
                  f"{cpu:.1f} s CPU")
            for strategy in ("single", "ddp", "fsdp", "fsdp2"):
                steps = pd.read_parquet(tmp / "overhead" / strategy / "steps.parquet")
                unprof = steps.loc[(~steps["profiled"]) & (steps["step"] > 0) & (steps["step"] != 5), "wall_ns"]
                print(f"  {strategy:7s} profiled/unprofiled step time = {overhead_ratio(steps):.3f} "
                      f"(unprofiled median {unprof.median() / 1e6:.1f} ms)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
