"""Record a tiny 2-rank CPU/gloo DDP or FSDP job under torch.profiler (test fixture helper).

Run as ``python3 gloo_record.py OUT_DIR``; writes ``OUT_DIR/{ddp,fsdp}/rank<r>.trace.json``
(Kineto Chrome traces with distributedInfo), both strategies in the same two processes. Kept tiny: 2 profiled steps, one torch thread
per rank. Not a test module (no ``test_`` prefix); the tests run it in a subprocess.
"""

from __future__ import annotations

import os
import sys


def _worker(rank: int, world: int, out: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for strategy in ("ddp", "fsdp"):
        os.makedirs(os.path.join(out, strategy), exist_ok=True)
        _record(rank, os.path.join(out, strategy), strategy)
    dist.barrier()
    dist.destroy_process_group()


def _record(rank: int, out: str, strategy: str) -> None:
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                          nn.Linear(128, 8))
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, bucket_cap_mb=0.02)
    else:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}),
                     device_id=torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    y = torch.randn(16, 8)
    sched = torch.profiler.schedule(wait=0, warmup=1, active=2, repeat=1)

    def handler(prof):
        prof.export_chrome_trace(os.path.join(out, f"rank{rank}.trace.json"))

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                schedule=sched, on_trace_ready=handler,
                                record_shapes=True) as prof:
        for _ in range(3):
            opt.zero_grad()
            loss = ((model(x) - y) ** 2).mean()
            loss.backward()
            opt.step()
            prof.step()


def main() -> None:
    import socket

    import torch.multiprocessing as mp

    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(2, out, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
