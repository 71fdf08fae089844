"""A short link benchmark on this machine (issue 44, Deliver 2 (c)): the time of each collective
kind at sizes 2^10..2^24 bytes on groups of every size g that divides the ``world`` local
processes (g >= 2), gloo on CPU or NCCL on GPUs, written in the link model's table form
(analyzer/analyses/linkmodel.py ``LinkCurve``: a JSON list of curves with source, kind,
group_size, nodes, dtype, rows of bytes, time_ns, low_ns and high_ns).

All groups at once: at group size g the world splits into world / g groups of g contiguous
ranks (0..g-1, g..2g-1, ...) and every group runs its collective at the same time, as in a real
job where every rank is busy, so the curve at g carries the contention of all ``world``
processes on this machine (a pair of a 4-rank job shares the cores and links with the other
pair, and the projection asks for that pair, not a lone one). ``layout="strided"`` groups ranks
k, k + world/g, ... instead (the replicate dimension of a 2-D mesh); on one machine it makes
no difference the benchmark could tell from its spread (bench/RESULTS.md), so it is an option,
not a second curve of the same span.

Measured as nccl-tests measures (NVIDIA/nccl-tests src/common.cu, doc/PERFORMANCE.md): bytes
in its convention (all_gather: the whole gathered buffer, each rank contributing bytes / g;
reduce_scatter: the whole input, each rank keeping bytes / g; all_reduce, all_to_all: the
buffer; send_recv: each rank sends bytes to the next rank of its group and receives as many
from the previous one, at once), warm-up calls first, each rank's time per call, the ranks'
times averaged; here the mean of every timed call of every rank (nccl-tests' time is a mean
over its iterations too). A mean, not a median: a step is a sum of many calls, and a sum's
typical value follows its parts' means; on a shared CPU a call's time is heavy-tailed (most
calls fast, some a scheduler time slice longer: measured here, p10 0.4 ms and p90 3.7 ms at
1 MiB on 2 vCPUs), so a median of a few calls misses the tail every real step pays (a real
2-rank fsdp2 record's calls averaged 1.5-2.5x the benchmark's median). Every call after a barrier of the whole world so that the time is transfer, not a
wait for a late rank, and all groups start together. A row's spread: the 10th and 90th
percentiles of every per-call time of the size (all iterations, all ranks), widened to hold
the row's time.

Arrival waits (gloo only): where ranks share a CPU's cores, a rank that reaches a collective
first blocks, its core goes to another rank, and the group's last member arrives late by up to
a scheduler slice; a replay whose ranks compute at the work-conserving share (compute x ranks /
CPUs) and start each call when its last member issues it misses that time (4-7 ms a call in a
4-rank fsdp2 record on 2 vCPUs, bench/RESULTS.md). Measured per group size g, with every group
at once: per compute segment S of ``ARRIVAL_SEGMENTS_NS`` (CPU time of each rank), the wall time
of S of compute alone, then of S of compute followed by a small all_reduce on the group, with
no barrier between iterations, and the all_reduce alone after a barrier; the wait is (compute +
call) - compute - call, the mean over every iteration of every rank, at least 0 (a row's
spread: the 10th and 90th percentiles of the per-iteration waits). The replay adds it to the
start of each collective of g ranks (analyzer/analyses/projstep.py).

The file is the link model's table form: ``{"curves": [...], "arrival": [...]}``
(``linkmodel.LinkTable``; a plain list of curves, what older benchmarks wrote, still reads).
Needs torch; the analyzer reads the file with ``linkmodel.read_link_model``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time
from pathlib import Path
from typing import Literal

from analyzer.contract.atomic import write_atomic

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
SIZES_BYTES = tuple(2**k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB, x4
_ELEMENT_BYTES = 4  # float32
LAYOUTS = ("contiguous", "strided")
ARRIVAL_SEGMENTS_NS = (1_000_000, 4_000_000, 16_000_000)
"""Compute segments before each call of the arrival measurement (ns of a rank's CPU time):
the spacing of a small model's collectives (the reference model's fsdp2 step on CPU: 6 calls in
~25 ms of compute) to a large one's."""
ARRIVAL_BYTES = 4096
"""The all_reduce of the arrival measurement: small, so that its time is the arrival's."""
ARRIVAL_ITERS = 20
"""Iterations per segment and series at least (a wait is a few ms against a spread as wide)."""


def group_sizes(world: int) -> list[int]:
    """The group sizes measured on ``world`` processes: every divisor g >= 2, ascending."""
    return [g for g in range(2, world + 1) if world % g == 0]


def groups_of(world: int, g: int, layout: str = "contiguous") -> list[list[int]]:
    """The world / g groups of size g the world splits into: contiguous ranks
    ([0..g-1], [g..2g-1], ...) or strided (ranks k, k + world/g, ..., k + (g-1) world/g)."""
    count = world // g
    if layout == "strided":
        return [[k + j * count for j in range(g)] for k in range(count)]
    return [list(range(k * g, (k + 1) * g)) for k in range(count)]


def _one_call(dist, torch, kind: str, size_bytes: int, ranks: list[int], pg, rank: int, device):
    """A callable that runs one ``kind`` collective of ``size_bytes`` (nccl-tests bytes) on the
    group ``pg`` of global ``ranks`` (this ``rank`` among them)."""
    g = len(ranks)
    n = size_bytes // _ELEMENT_BYTES
    full = torch.ones(n, dtype=torch.float32, device=device)
    part = torch.ones(n // g, dtype=torch.float32, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=pg)
    # torch 2.13 names them *_single (the *_tensor names warn); older torch has only *_tensor
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part, group=pg)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full, group=pg)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=pg)
    recv = torch.empty_like(full)
    at = ranks.index(rank)  # P2POp's peers are global ranks
    ops = [dist.P2POp(dist.isend, full, ranks[(at + 1) % g], group=pg),
           dist.P2POp(dist.irecv, recv, ranks[(at - 1) % g], group=pg)]

    def send_recv():
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return send_recv


def _compute(torch, cpu_ns: int) -> None:
    """Compute for ``cpu_ns`` of this thread's CPU time (small matmuls, one thread: a rank's
    compute), however long the scheduler makes it take."""
    a = torch.full((32, 32), 0.01)
    t0 = time.thread_time_ns()
    while time.thread_time_ns() - t0 < cpu_ns:
        a = torch.tanh(a @ a)


def _arrival(dist, torch, call, iters: int) -> dict[int, dict[str, list[int]]]:
    """This rank's arrival timings (module docstring) on the group of ``call``: per segment
    {"compute": wall ns of each iteration of compute alone, "both": of compute then ``call``,
    "call": of ``call`` alone after a barrier}."""
    out = {}
    for seg in ARRIVAL_SEGMENTS_NS:
        got: dict[str, list[int]] = {"compute": [], "both": [], "call": []}
        _compute(torch, seg)  # warm-up
        call()
        for what in ("compute", "both", "call"):
            dist.barrier()  # the whole world enters each series together
            for _ in range(iters):
                if what == "call":
                    dist.barrier()
                t0 = time.perf_counter_ns()
                if what != "call":
                    _compute(torch, seg)
                if what != "compute":
                    call()
                got[what].append(time.perf_counter_ns() - t0)
        out[seg] = got
    return out


def _worker(rank: int, world: int, port: int, backend: str, iters: int, kinds: tuple[str, ...],
            sizes: tuple[int, ...], layout: str, out_dir: str) -> None:
    """One rank: every (group size, kind, size), its per-call times (ns), and on gloo the
    arrival timings per group size (``_arrival``), written to rank<r>.json as
    {"calls": {g: {kind: {size: [ns, ...]}}}, "arrival": {g: {segment: {...}}}}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # as a record's rank: the machine's cores are the ranks'
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    times: dict[int, dict[str, dict[int, list[int]]]] = {}
    arrival: dict[int, dict] = {}
    try:
        for g in group_sizes(world):
            mine, pg = None, None
            for ranks in groups_of(world, g, layout):  # every rank creates every group
                made = dist.group.WORLD if g == world else dist.new_group(ranks)
                if rank in ranks:
                    mine, pg = ranks, made
            for kind in kinds:
                for size in sizes:
                    call = _one_call(dist, torch, kind, size, mine, pg, rank, device)
                    call()  # warm-up: connections, buffers
                    sync()
                    per_call = []
                    for _ in range(iters):
                        dist.barrier()  # the whole world: every group starts together
                        sync()
                        t0 = time.perf_counter_ns()
                        call()
                        sync()
                        per_call.append(time.perf_counter_ns() - t0)
                    times.setdefault(g, {}).setdefault(kind, {})[size] = per_call
            if backend == "gloo":  # time-sharing a CPU's cores (module docstring)
                small = _one_call(dist, torch, "all_reduce", ARRIVAL_BYTES, mine, pg, rank, device)
                arrival[g] = _arrival(dist, torch, small, max(iters, ARRIVAL_ITERS))
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"calls": times,
                                                             "arrival": arrival}))


def check_options(world: int, iters: int, sizes: tuple[int, ...], kinds: tuple[str, ...],
                  layout: str = "contiguous") -> None:
    """Refuse what the benchmark cannot measure (``ValueError``, one line naming the value):
    ``world`` < 2, ``iters`` < 1, no size, a size <= 0 or not a multiple of 4 x ``world``
    bytes (float32 elements, split evenly over every group size), repeated sizes, a kind or
    layout not known."""
    step = _ELEMENT_BYTES * world
    if world < 2:
        raise ValueError(f"--nproc {world}: the link benchmark needs at least 2 processes")
    if iters < 1:
        raise ValueError(f"--iters {iters}: time at least 1 call per size")
    if not sizes or any(s <= 0 or s % step for s in sizes) or len(set(sizes)) != len(sizes):
        raise ValueError(f"--sizes {','.join(map(str, sizes))}: distinct sizes in bytes, each a "
                         f"positive multiple of {step} (4-byte elements split over up to "
                         f"{world} ranks)")
    if set(kinds) - set(KINDS) or not kinds:
        raise ValueError(f"kinds {', '.join(kinds)}: choose among {', '.join(KINDS)}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}: one of {', '.join(LAYOUTS)}")


def spread_ns(per_call_ns: list[int], time_ns: int) -> tuple[int, int]:
    """(low_ns, high_ns): the 10th and 90th percentiles of ``per_call_ns`` (statistics'
    "inclusive" method: linear between order statistics), rounded, widened to hold
    ``time_ns``; one call: that call's time, widened."""
    if len(per_call_ns) == 1:
        lo = hi = per_call_ns[0]
    else:
        cuts = statistics.quantiles(per_call_ns, n=10, method="inclusive")
        lo, hi = round(cuts[0]), round(cuts[-1])
    return min(lo, time_ns), max(hi, time_ns)


def curves_of(per_rank: list[dict], source: str, kinds: tuple[str, ...],
              sizes: tuple[int, ...]) -> list[dict]:
    """The table form from the ranks' per-call times (``_worker``'s files, JSON-decoded: keys
    are strings): one curve per (group size, kind), rows (bytes, time_ns = the mean of all
    calls of all ranks, rounded (module docstring); ``spread_ns`` of the same calls)."""
    curves = []
    for g in sorted({int(g) for r in per_rank for g in r}):
        for kind in kinds:
            rows = []
            for size in sizes:
                calls = [r[str(g)][kind][str(size)] for r in per_rank]
                pooled = [ns for c in calls for ns in c]
                t = round(statistics.fmean(pooled))
                lo, hi = spread_ns(pooled, t)
                rows.append({"bytes": size, "time_ns": t, "low_ns": lo, "high_ns": hi})
            curves.append({"source": source.format(groups=len(per_rank) // g, g=g), "kind": kind,
                           "group_size": g, "nodes": 1, "dtype": "float32", "rows": rows})
    return curves


def arrival_of(per_rank: list[dict], source: str) -> list[dict]:
    """The arrival curves from the ranks' arrival timings (``_arrival``'s, JSON-decoded: keys
    are strings): one per group size, rows (segment_ns, wait_ns = max(0, mean(compute + call) -
    mean(compute) - mean(call)) over every iteration of every rank, rounded; low_ns / high_ns
    the 10th and 90th percentiles of the per-iteration waits (each iteration's compute + call
    less the two means), at least 0, widened to hold wait_ns; below_zero_ns, only where the
    mean was below 0, that mean: compute and call took less than compute alone, so the load
    changed between the series, said by ``arrival_noise``)."""
    out = []
    for g in sorted({int(g) for r in per_rank for g in r}):
        rows = []
        for seg in sorted({int(s) for r in per_rank for s in r[str(g)]}):
            series = [r[str(g)][str(seg)] for r in per_rank]
            compute = statistics.fmean(ns for s in series for ns in s["compute"])
            call = statistics.fmean(ns for s in series for ns in s["call"])
            waits = [ns - compute - call for s in series for ns in s["both"]]
            mean = round(statistics.fmean(waits))
            wait = max(0, mean)
            lo, hi = spread_ns([max(0, round(w)) for w in waits], wait)
            rows.append({"segment_ns": seg, "wait_ns": wait, "low_ns": lo, "high_ns": hi,
                         **({"below_zero_ns": mean} if mean < 0 else {})})
        out.append({"source": source.format(groups=len(per_rank) // g, g=g), "group_size": g,
                    "nodes": 1, "rows": rows})
    return out


def run_linkbench(out: Path | str, *, world: int = 2, backend: str | None = None,
                  iters: int = 5, kinds: tuple[str, ...] = KINDS,
                  sizes: tuple[int, ...] = SIZES_BYTES,
                  layout: Literal["contiguous", "strided"] = "contiguous") -> dict:
    """Run the benchmark on ``world`` local processes (``backend`` None: NCCL when ``world``
    GPUs are visible, else gloo) and write its table to ``out`` (JSON, atomically); returns it:
    {"curves": one per (group size g of ``group_sizes(world)``, kind): nodes 1, dtype
    "float32", rows (bytes, time_ns, low_ns, high_ns) (``curves_of``), measured with all
    world / g groups at once; "arrival": on gloo one per g (``arrival_of``), else none}
    (module docstring). Raises ``ValueError`` (``check_options``); ``RuntimeError`` from
    torch's process start when a rank fails."""
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    check_options(world, iters, tuple(sizes), tuple(kinds), layout)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world \
            else "gloo"
    # the store is served here, on loopback, on a port it picked itself (no free-port race)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    device = (torch.cuda.get_device_name(0) if backend == "nccl" else "CPU")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="paritytrace-linkbench-") as tmp:
        mp.start_processes(_worker, args=(world, store.port, backend, iters, tuple(kinds),
                                          tuple(sizes), layout, tmp),
                           nprocs=world, join=True, start_method="spawn")
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    where = (f"link benchmark on this machine {socket.gethostname()} {when} ({backend}, "
             f"{device}, {world} processes, {{groups}} {layout} group(s) of {{g}} at once, ")
    table = {"curves": curves_of([r["calls"] for r in per_rank], where + f"mean of {iters} calls "
                                 "per rank, spread p10..p90)", tuple(kinds), tuple(sizes)),
             "arrival": arrival_of([r["arrival"] for r in per_rank], where + f"{max(iters, ARRIVAL_ITERS)} "
                                   f"compute + all_reduce of {ARRIVAL_BYTES} B per rank and segment, "
                                   "spread p10..p90)")}
    write_atomic(out, json.dumps(table, indent=2) + "\n")
    del store
    return table


if __name__ == "__main__":  # python -m tracer.linkbench OUT.json [WORLD]
    import sys

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_linkbench(sys.argv[1], world=int(sys.argv[2]) if len(sys.argv) > 2 else 2)


def arrival_noise(arrival: list[dict]) -> list[str]:
    """One line per arrival row whose mean wait came out below 0 (``arrival_of``'s
    below_zero_ns): iterations with the call ran faster than those without, which only a
    machine whose load changed between the series gives; its wait of 0 is noise, not a
    measured zero."""
    return [f"arrival wait g={a['group_size']} after {r['segment_ns'] / 1e6:g} ms of compute: "
            f"compute + call took {-r['below_zero_ns'] / 1e6:.2g} ms less than compute alone "
            "(the load changed between the series), so its 0 ms is noise; rerun on a quiet "
            "machine or with more --iters"
            for a in arrival for r in a["rows"] if "below_zero_ns" in r]


def falling(curves: list[dict]) -> list[str]:
    """One line per curve whose time falls by more than half as the size grows: a collective's
    time does not fall with its size, so the smaller size's time is noise (a busy machine)."""
    out = []
    for c in curves:
        rows = c["rows"]
        for a, b in zip(rows, rows[1:]):
            if b["time_ns"] < a["time_ns"] / 2:
                out.append(f"{c['kind']} g={c['group_size']}: {a['time_ns'] / 1e6:.3g} ms at "
                           f"{a['bytes']:,} B but {b['time_ns'] / 1e6:.3g} ms at {b['bytes']:,} B: "
                           "noise; rerun on a quiet machine or with more --iters")
                break
    return out
