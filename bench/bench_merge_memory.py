"""Peak memory of ``analyzer merge`` against the number of ranks (issue 17 item 6). Prints a
table; asserts nothing.

Builds N identical ranks from one corpus trace (default
``$PARITYTRACE_CORPUS/single/a100_ddp_rank0_nccl_args.json.gz``, tiled ``--k`` times with
bench/tile.py to make one rank large against the interpreter's own ~200 MB), each with its
``distributedInfo.rank`` / ``world_size`` rewritten, then runs ``analyzer merge DIR -o OUT`` in
a fresh interpreter per N and reads the peak RSS of the largest process it started
(``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a wrapper that runs only that command). Each
merge runs twice and the second is measured: the per-rank tables are then cached, so no parse
worker runs and the peak is the merge process's own (reading, aligning and writing the raw
events), not the first parse of a rank.

If merge held every rank at once (it did before issue 17: ~20 GB for a 2 GB rank), the peak
grows by about one rank's worth per rank added; holding one rank at a time, the ratio of the
peak at N ranks to the peak at 1 rank stays near 1.

    python3 bench/bench_merge_memory.py --ranks 1,2,4,8 --k 4
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tile import read_trace, tile, write_trace  # noqa: E402

_WRAP = ("import resource, subprocess, sys; "
         "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
         "print(rc, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def build(src: Path, folder: Path, n: int, k: int) -> int:
    """``n`` ranks of ``src`` tiled ``k`` times in ``folder``; returns one rank's JSON bytes."""
    trace = read_trace(src)
    if k > 1:
        trace = tile(trace, k)
    folder.mkdir(parents=True)
    for r in range(n):
        trace["distributedInfo"] = {**(trace.get("distributedInfo") or {}), "rank": r,
                                    "world_size": n}
        write_trace(trace, folder / f"rank{r}.json")
    return (folder / "rank0.json").stat().st_size


def peak_rss_bytes(folder: Path, out: Path) -> int:
    cmd = [sys.executable, "-c", "import sys; from analyzer.cli.app import run; "
           "sys.argv[0] = 'analyzer'; run()", "merge", str(folder), "-o", str(out)]
    # cwd outside any checkout: ``python -c`` puts the cwd first on sys.path, so PYTHONPATH
    # chooses the code measured (e.g. PYTHONPATH=<an older checkout> for the before figure)
    proc = subprocess.run([sys.executable, "-c", _WRAP, *cmd], capture_output=True, text=True,
                          check=True, cwd=out.parent,
                          env={**os.environ, "XDG_CACHE_HOME": str(out.parent)})
    rc, kib = proc.stdout.split()
    if rc != "0":
        raise SystemExit(f"merge of {folder} failed (exit {rc})")
    return int(kib) * 1024  # Linux: ru_maxrss in KiB


def main() -> None:
    corpus = Path(os.environ.get("PARITYTRACE_CORPUS", "../shared/corpus"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", type=Path,
                    default=corpus / "single" / "a100_ddp_rank0_nccl_args.json.gz")
    ap.add_argument("--ranks", default="1,2,4,8")
    ap.add_argument("--k", type=int, default=4, help="tile the trace K times (bench/tile.py)")
    args = ap.parse_args()
    counts = [int(x) for x in args.ranks.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in counts:
            folder = Path(tmp) / f"n{n}"
            size = build(args.trace, folder, n, args.k)
            peak_rss_bytes(folder, Path(tmp) / f"m{n}.json.gz")  # caches the per-rank tables
            rows.append((n, size, peak_rss_bytes(folder, Path(tmp) / f"m{n}.json.gz")))
    base = rows[0][2]
    print(f"one rank: {rows[0][1] / 2**20:,.1f} MiB of JSON ({args.trace.name} x{args.k})")
    print(f"{'ranks':>5} {'peak RSS MiB':>13} {'vs 1 rank':>10}")
    for n, _, peak in rows:
        print(f"{n:>5} {peak / 2**20:>13,.0f} {peak / base:>10.2f}")
    print(msgspec.json.encode({"ranks": [r[0] for r in rows],
                               "peak_rss_bytes": [r[2] for r in rows]}).decode())


if __name__ == "__main__":
    main()
