"""Benchmark of ``tracer record`` (not a test: prints numbers, asserts nothing).

1. Wall time of ``tracer record --strategy all`` on defaults (hidden 256, 2 layers, batch 8 x 128,
   2 ranks, 5 steps), the README's main job. Target: <= 60 s on 2 cores.
2. Profiler overhead, from one record per strategy with unprofiled steps on both sides of the
   active window (``--wait 5 --warmup 1 --active 5 --steps 16``): median wall_ns of the active
   (profiled) steps / median wall_ns of the unprofiled steps 1..4 and 11..15 (step 0 carries the
   numerics and warm-up; the warmup step is traced too, so it is in neither group), per rank,
   then the median over ranks. Target: <= 1.15.

Usage: ``python3 bench/bench_record.py [--skip-all]``. Timings on a shared 2-core machine vary by
30-50 %; the load average is printed alongside.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

SCHEDULE = ["--wait", "5", "--warmup", "1", "--active", "5", "--steps", "16"]


def record(out: Path, args: list[str]) -> float:
    """Run ``python -m tracer record ARGS --out OUT``; return its wall time in seconds."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *args, "--out", str(out)],
                          capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"record failed: {proc.stderr.strip()}")
    return elapsed


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
    skip_all = "--skip-all" in sys.argv[1:]
    print(f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})")
    with tempfile.TemporaryDirectory(prefix="bench-record-") as tmp:
        tmp = Path(tmp)
        if not skip_all:
            wall = record(tmp / "defaults", ["--strategy", "all"])
            print(f"tracer record --strategy all (defaults): {wall:.1f} s wall")
        wall = record(tmp / "overhead", ["--strategy", "all", *SCHEDULE])
        print(f"overhead record ({' '.join(SCHEDULE)}, all strategies): {wall:.1f} s wall")
        for strategy in ("single", "ddp", "fsdp", "fsdp2"):
            steps = pd.read_parquet(tmp / "overhead" / strategy / "steps.parquet")
            unprof = steps.loc[(~steps["profiled"]) & (steps["step"] > 0) & (steps["step"] != 5), "wall_ns"]
            print(f"  {strategy:7s} profiled/unprofiled step time = {overhead_ratio(steps):.3f} "
                  f"(unprofiled median {unprof.median() / 1e6:.1f} ms)")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
