"""Overhead of the process-group tags (tracer/pgtag.py; not a test: prints numbers, asserts nothing).

One process, a 1-rank gloo group (the call path of every rank: the Python wrapper, the
``record_function`` it opens, then torch's own function), under an active CPU profiler as in a
record's active window. Per round, N calls each of ``dist.all_reduce`` (FSDP2's HSDP path) and
``funcol.all_reduce`` + ``wait_tensor`` (DTensor / TP's path) on a 1 KiB tensor, untagged then
inside ``tag_collectives()``, rounds interleaved (A B A B ...) so machine noise hits both.
The same again with no profiler running (a record's wait steps: the wrapper opens no tag).
Prints per call: the median ns untagged and tagged, their ratio, and the added ns; then what
that adds to a step of the tiny fsdp2_tp record (13 collectives a step, see
tests/tracer/test_mesh2d.py) as a fraction of its median step time when ``--run DIR`` names
one. Collectives of a real step move far more than 1 KiB, so the ratio per call is an upper
bound of the relative cost.

Usage: ``python3 bench/bench_pgtag.py [--calls N] [--rounds R] [--run RUN_DIR]``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist


def _time_calls(fn, calls: int) -> float:
    t0 = time.perf_counter_ns()
    for _ in range(calls):
        fn()
    return (time.perf_counter_ns() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--run", default=None, help="a recorded run dir: its median step wall_ns")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp, 'store')}",
                                rank=0, world_size=1)
        import torch.distributed._functional_collectives as funcol

        from tracer.pgtag import tag_collectives

        x = torch.ones(256)
        cases = {
            "dist.all_reduce": lambda: dist.all_reduce(x),
            "funcol.all_reduce+wait": lambda: funcol.wait_tensor(
                funcol.all_reduce(x, "sum", dist.group.WORLD)),
        }
        results: dict[tuple[str, bool], dict[str, list[float]]] = {}
        for profiling in (True, False):  # in the active window; outside it (no tag opened)
            prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            with prof if profiling else contextlib.nullcontext():
                for _ in range(args.rounds):
                    for name, fn in cases.items():
                        r = results.setdefault((name, profiling), {"plain": [], "tagged": []})
                        fn()  # warm
                        r["plain"].append(_time_calls(fn, args.calls))
                        with tag_collectives():
                            r["tagged"].append(_time_calls(lambda: cases[name](), args.calls))
        dist.destroy_process_group()
    added = []
    for (name, profiling), r in results.items():
        plain, tagged = statistics.median(r["plain"]), statistics.median(r["tagged"])
        if profiling:
            added.append(tagged - plain)
        print(f"{name:24s} {'profiled  ' if profiling else 'unprofiled'} untagged {plain:8.0f} ns/call  "
              f"tagged {tagged:8.0f} ns/call  ratio {tagged / plain:5.3f}  added {tagged - plain:6.0f} ns")
    if args.run:
        import pandas as pd

        steps = pd.read_parquet(os.path.join(args.run, "steps.parquet"))
        step_ns = float(steps[steps["profiled"]]["wall_ns"].median())
        per_step = 13 * max(added)
        print(f"tiny fsdp2_tp step {step_ns / 1e6:.1f} ms: 13 tagged calls add {per_step / 1e3:.0f} us "
              f"= {per_step / step_ns:.4f} of the step")


if __name__ == "__main__":
    main()
