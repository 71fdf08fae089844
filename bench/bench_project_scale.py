"""How `tracer project` scales with the world size (issue 44: "world 1,024 FSDP2 of the
reference model projected in under a minute within this machine's memory").

    python3 bench/bench_project_scale.py [--worlds 8,64,1024] [--strategy fsdp2] [--repeat 1]
                                         [--repo CHECKOUT]

Per world N: `tracer project --strategy S --nproc N --batch N` (the reference model's other
defaults: hidden 256, 2 layers, seq 128; one row of the batch per rank, so each role's work is
the same at every N) in a child process, one after another; wall seconds and the peak RSS of
the largest process of its tree (``os.wait4``'s ``ru_maxrss``: the command or a role's child,
whichever is larger), and both as a ratio to the first world of the same run. With
``--repeat`` > 1 the worlds are interleaved and the median is printed.
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

REPO = Path(__file__).resolve().parents[1]


def project_once(strategy: str, world: int, out: Path, extra: list[str],
                 repo: Path = REPO) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes of the largest process) of one projection at ``world``.
    Raises ``RuntimeError`` with the command's stderr when it fails."""
    cmd = [sys.executable, "-m", "tracer", "project", "--strategy", strategy, "--nproc", str(world),
           "--batch", str(world), "--out", str(out), "--name", f"{strategy}-{world}", *extra]
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    err = out / f"{strategy}-{world}.stderr"
    with open(err, "wb") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=stderr, env=env, cwd=out)
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"world {world}: exit {proc.returncode}: {err.read_text()[-2000:]}")
    return wall_s, usage.ru_maxrss * 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="8,64,1024")
    ap.add_argument("--strategy", default="fsdp2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--keep", type=Path, default=None, help="keep the run dirs here")
    ap.add_argument("--repo", type=Path, default=REPO,
                    help="the checkout whose tracer runs (default this one; another for a before/after)")
    ap.add_argument("extra", nargs="*", help="more `tracer project` options, after --")
    args = ap.parse_args(argv)
    worlds = [int(w) for w in args.worlds.split(",")]
    out = args.keep or Path(tempfile.mkdtemp(prefix="bench-project-"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict[int, list[tuple[float, int]]] = {w: [] for w in worlds}
    try:
        for _ in range(args.repeat):
            for w in worlds:
                results[w].append(project_once(args.strategy, w, out, args.extra, args.repo.resolve()))
    finally:
        if args.keep is None:
            shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()
    print(f"{args.repo.resolve()}: tracer project --strategy {args.strategy} --nproc N --batch N "
          f"{' '.join(args.extra)}(median of {args.repeat}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"{os.cpu_count()} CPUs)")
    print("| world N | wall s | peak RSS MiB (largest process) | wall / world "
          f"{worlds[0]} | peak RSS / world {worlds[0]} |")
    print("|---:|---:|---:|---:|---:|")
    first = None
    for w in worlds:
        wall_s = statistics.median(r[0] for r in results[w])
        rss = statistics.median(r[1] for r in results[w])
        first = first or (wall_s, rss)
        print(f"| {w:,} | {wall_s:.1f} | {rss / 2**20:,.0f} | {wall_s / first[0]:.2f} | "
              f"{rss / first[1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
