"""Two gloo DDP ranks that start and stop the profiler many times, each stop right after a
step's collectives complete (tests/tracer/test_profiling_stop.py runs it under glibc's heap
checks). ``python -m tests.tracer.stop_ranks OUT CYCLES KIND``; KIND ``settled``: the tracer's
``SettledProfile``, ``plain``: ``torch.profiler.profile``, with the tracer's options.

Each rank writes ``OUT/rank<r>.done`` after its last cycle.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.profiler import ProfilerActivity, profile


def _rank(rank: int, out: str, cycles: int, kind: str) -> None:
    from tracer.profiling import SettledProfile

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.LayerNorm(32)),
        bucket_cap_mb=0.001)  # a bucket per parameter: several all_reduce per step
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 8, 32)
    cls = SettledProfile if kind == "settled" else profile
    for _ in range(cycles):
        prof = cls(activities=[ProfilerActivity.CPU], record_shapes=True, profile_memory=True)
        prof.start()
        for _ in range(2):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        prof.stop()
    dist.destroy_process_group()
    Path(out, f"rank{rank}.done").write_text("ok\n")


if __name__ == "__main__":
    mp.spawn(_rank, args=(sys.argv[1], int(sys.argv[2]), sys.argv[3]), nprocs=2)
