"""A short link benchmark on this machine (issue 44, Deliver 2 (c)): the time of each collective
kind at sizes 2^10..2^24 bytes on ``world`` local processes, gloo on CPU or NCCL on GPUs, written
in the link model's table form (analyzer/analyses/linkmodel.py ``LinkCurve``: a JSON list of
curves with source, kind, group_size, nodes, dtype, rows of bytes and time_ns).

Measured as nccl-tests measures (NVIDIA/nccl-tests src/common.cu, doc/PERFORMANCE.md): bytes
in its convention (all_gather: the whole gathered buffer, each rank contributing bytes / g;
reduce_scatter: the whole input, each rank keeping bytes / g; all_reduce, all_to_all: the
buffer; send_recv: each rank sends bytes to the next rank and receives as many from the
previous one, at once), warm-up calls first, each rank's time per call, the ranks' times
averaged; here each rank's median over ``iters`` timed calls (a shared machine's outliers),
every call after a barrier so that the time is transfer, not a wait for a late rank.

Needs torch; the analyzer reads the file with ``linkmodel.load_curves``.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import time
from pathlib import Path

from analyzer.contract.atomic import write_atomic

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
SIZES_BYTES = tuple(2**k for k in range(10, 25, 2))  # 1 KiB .. 16 MiB, x4
_ELEMENT_BYTES = 4  # float32


def _one_call(dist, torch, kind: str, size_bytes: int, rank: int, world: int, device):
    """A callable that runs one ``kind`` collective of ``size_bytes`` (nccl-tests bytes)."""
    n = size_bytes // _ELEMENT_BYTES
    full = torch.ones(n, dtype=torch.float32, device=device)
    part = torch.ones(n // world, dtype=torch.float32, device=device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full)
    # torch 2.13 names them *_single (the *_tensor names warn); older torch has only *_tensor
    if kind == "all_gather":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part)
    if kind == "reduce_scatter":
        scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        return lambda: scatter(part, full)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)
    recv = torch.empty_like(full)
    ops = [dist.P2POp(dist.isend, full, (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]

    def send_recv():
        for req in dist.batch_isend_irecv(ops):
            req.wait()
    return send_recv


def _worker(rank: int, world: int, port: int, backend: str, iters: int, kinds: tuple[str, ...],
            sizes: tuple[int, ...], out_dir: str) -> None:
    """One rank: every (kind, size), its median time per call written to rank<r>.json."""
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    store = dist.TCPStore("127.0.0.1", port, world, is_master=False)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world)
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    times: dict[str, dict[int, int]] = {}
    try:
        for kind in kinds:
            for size in sizes:
                call = _one_call(dist, torch, kind, size, rank, world, device)
                call()  # warm-up: connections, buffers
                sync()
                per_call = []
                for _ in range(iters):
                    dist.barrier()
                    sync()
                    t0 = time.perf_counter_ns()
                    call()
                    sync()
                    per_call.append(time.perf_counter_ns() - t0)
                times.setdefault(kind, {})[size] = int(statistics.median(per_call))
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(times))


def run_linkbench(out: Path | str, *, world: int = 2, backend: str | None = None,
                  iters: int = 5, kinds: tuple[str, ...] = KINDS,
                  sizes: tuple[int, ...] = SIZES_BYTES) -> list[dict]:
    """Run the benchmark on ``world`` local processes (``backend`` None: NCCL when ``world``
    GPUs are visible, else gloo) and write its curves to ``out`` (JSON, atomically); returns
    them. One curve per kind: group_size ``world``, nodes 1, dtype "float32", rows (bytes,
    time_ns) with time_ns the ranks' mean of their median call. ``sizes`` must be multiples of
    4 x ``world`` bytes. Raises ``ValueError`` for a bad ``world`` / ``sizes`` / ``kinds``."""
    import tempfile

    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if world < 2 or any(s % (_ELEMENT_BYTES * world) for s in sizes) or set(kinds) - set(KINDS):
        raise ValueError(f"world >= 2, sizes multiples of {_ELEMENT_BYTES * world} bytes and "
                         f"kinds among {KINDS}; got {world}, {sizes}, {kinds}")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world \
            else "gloo"
    # the store is served here, on loopback, on a port it picked itself (no free-port race)
    store = dist.TCPStore("127.0.0.1", 0, world + 1, is_master=True, wait_for_workers=False)
    device = (torch.cuda.get_device_name(0) if backend == "nccl" else "CPU")
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory(prefix="paritytrace-linkbench-") as tmp:
        mp.start_processes(_worker, args=(world, store.port, backend, iters, tuple(kinds),
                                          tuple(sizes), tmp),
                           nprocs=world, join=True, start_method="spawn")
        per_rank = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(world)]
    source = (f"link benchmark on this machine {socket.gethostname()} {when} "
              f"({backend}, {device}, {world} processes, median of {iters} calls)")
    curves = [{"source": source, "kind": kind, "group_size": world, "nodes": 1,
               "dtype": "float32",
               "rows": [{"bytes": size,
                         "time_ns": round(statistics.fmean(r[kind][str(size)] for r in per_rank))}
                        for size in sizes]}
              for kind in kinds]
    write_atomic(out, json.dumps(curves, indent=2) + "\n")
    del store
    return curves


if __name__ == "__main__":  # python -m tracer.linkbench OUT.json [WORLD]
    import sys

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_linkbench(sys.argv[1], world=int(sys.argv[2]) if len(sys.argv) > 2 else 2)
