"""CPU time of the collective-identity stage against the number of steps (issue 46). Prints a
table; asserts nothing.

Tiles rank 0 of the corpus' DLRM set (``$PARITYTRACE_CORPUS/dlrm_ddp_8rank_v100``, one
ProfilerStep, 8 NCCL kernels) ``--steps`` times (bench/tile.py) into a temporary folder, then, in
a child process per checkout and trace, decodes the trace once and runs ``classify`` ``--repeat``
times, timing the stage with ``time.process_time`` (CPU seconds of the process): from the entry
of ``_Identity.__init__`` to the return of ``_fake_calls`` (launching ops, the kernels', gloo
ops', enqueue ops' and fake calls' identity), plus ``_Identity.table``. The median of the
repeats is printed for this checkout ("new") and, with ``--base DIR``, for another checkout
run with ``PYTHONPATH=DIR`` ("old"; e.g. ``git worktree add /tmp/base 8821002``), with the
ratio of the largest to the smallest step count for each: linear in the steps is about the
ratio of the step counts (10 for 400 and 4,000).

By default only the events the stage reads are kept before tiling (``--keep comm``: the
ProfilerStep, comm kernels, their runtime launches and the comm enqueue ops: 46 events a step,
the stage's scaling without the rest of a rank's cost); ``--keep all`` tiles the whole rank
(about 2,500 events a step: 4,000 steps are 10 million events, several GB to decode).
``--trace PATH`` (repeatable) times the stage on traces as they are as well (e.g. a 41 MB tiled
DLRM rank of bench/bench_scale.py).

Usage: ``python3 bench/bench_identity.py [--steps 400 4000] [--base DIR] [--repeat 3]
[--keep comm|all] [--trace PATH ...]``. Timings on a shared 2-core machine vary by 30-50 %;
compare the ratios of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.tile import read_trace, tile, write_trace  # noqa: E402

CORPUS = Path(os.environ.get("PARITYTRACE_CORPUS") or REPO / ".." / "shared" / "corpus"
              ).resolve() / "dlrm_ddp_8rank_v100"
"""The source trace's folder: ``$PARITYTRACE_CORPUS`` (as the tests), else ../shared/corpus."""

_COMM_CPU = re.compile(r"^(?:record_param_comms$|c10d::|_c10d_functional::|nccl:|gloo:)")
_NCCL = re.compile(r"^nccl.*kernel|^nccl::", re.IGNORECASE)

CHILD = r"""
import json, statistics, sys, time
from pathlib import Path
from analyzer.ingest import classify as C
from analyzer.ingest.decode import decode_bytes, decompress
from analyzer.ingest.distinfo import read as read_distinfo

path, repeat = Path(sys.argv[1]), int(sys.argv[2])
dec = decode_bytes(decompress(path.read_bytes(), path), path)
d = read_distinfo(dec.distributed_info)
clock = {}
init, fake, table = C._Identity.__init__, C._fake_calls, C._Identity.table

def timed_init(self, *a, **k):
    clock["start"] = time.process_time()
    return init(self, *a, **k)

def timed_fake(*a, **k):
    out = fake(*a, **k)
    clock["stage"] = time.process_time() - clock["start"]
    return out

def timed_table(self, *a, **k):
    t0 = time.process_time()
    out = table(self, *a, **k)
    clock["stage"] += time.process_time() - t0
    return out

C._Identity.__init__, C._fake_calls, C._Identity.table = timed_init, timed_fake, timed_table
stage, whole = [], []
for _ in range(repeat):
    t0 = time.process_time()
    events, _ = C.classify(dec.events, world_size=d.world_size, pg_sizes=d.sizes(),
                           pg_ranks=d.ranks_text(), pg_descs=d.descs(), backend=d.backend)
    whole.append(time.process_time() - t0)
    stage.append(clock["stage"])
print(json.dumps({"events": len(events), "comm": int((events["role"] == "comm").sum()),
                  "stage_s": statistics.median(stage), "classify_s": statistics.median(whole)}))
"""


def comm_only(trace: dict) -> dict:
    """``trace`` with only the events the identity stage reads: metadata, ProfilerSteps, comm
    enqueue ops, comm kernels and their runtime launches (by correlation id)."""
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and _NCCL.match(str(e.get("name")))]
    corr = {(e.get("args") or {}).get("correlation") for e in kernels}
    keep = [e for e in events if e.get("ph") == "M" or e in kernels
            or str(e.get("name", "")).startswith("ProfilerStep#")
            or (e.get("cat") == "cpu_op" or e.get("cat") == "user_annotation")
            and _COMM_CPU.match(str(e.get("name", "")))
            or e.get("cat") == "cuda_runtime" and (e.get("args") or {}).get("correlation") in corr]
    return {**trace, "traceEvents": keep}


def stage_time(checkout: Path, path: Path, repeat: int) -> dict:
    """The child's figures for ``path`` with the analyzer of ``checkout``."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(repeat)], env=env,
                         check=True, capture_output=True, text=True, cwd=checkout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[400, 4000])
    ap.add_argument("--base", type=Path, help="another checkout to time (old)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--keep", choices=("comm", "all"), default="comm")
    ap.add_argument("--trace", type=Path, action="append", default=[])
    a = ap.parse_args()
    checkouts = [("new", REPO)] + ([("old", a.base.resolve())] if a.base else [])
    src = read_trace(CORPUS / "worker0.pt.trace.json.gz")
    if a.keep == "comm":
        src = comm_only(src)
    print(f"load average {os.getloadavg()[0]:.2f}; {a.repeat} repeats, median; CPU s of the "
          f"collective-identity stage (classify in brackets); events kept: {a.keep}")
    with tempfile.TemporaryDirectory(prefix="bench_identity_") as tmp:
        inputs = []
        for k in sorted(a.steps):
            path = Path(tmp) / f"dlrm_x{k}.json"
            write_trace(tile(src, k), path)
            inputs.append((f"{k} steps", path))
        inputs += [(str(p), p) for p in a.trace]
        rows = {}
        for label, path in inputs:
            for name, checkout in checkouts:
                r = stage_time(checkout, path, a.repeat)
                rows[label, name] = r
                print(f"{label:>12} {name}: {r['events']:>9,} events, {r['comm']:>7,} comm rows, "
                      f"stage {r['stage_s']:8.3f} s  (classify {r['classify_s']:8.3f} s)",
                      flush=True)
    lo, hi = f"{min(a.steps)} steps", f"{max(a.steps)} steps"
    if lo != hi:
        for name, _ in checkouts:
            ratio = rows[hi, name]["stage_s"] / max(rows[lo, name]["stage_s"], 1e-9)
            print(f"{name}: stage {hi} / {lo} = {ratio:.1f} (linear: "
                  f"{max(a.steps) / min(a.steps):.0f})")
    if a.base:
        for label, _ in inputs:
            print(f"{label:>12}: old / new stage = "
                  f"{rows[label, 'old']['stage_s'] / max(rows[label, 'new']['stage_s'], 1e-9):.1f}")


if __name__ == "__main__":
    main()
