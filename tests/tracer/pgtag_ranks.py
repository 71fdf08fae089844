"""Two gloo ranks issuing each kind of call tracer/pgtag.py wraps, under the profiler
(tests/tracer/test_mesh2d.py reads what they write). ``python -m tests.tracer.pgtag_ranks OUT``.

Per rank r: ``OUT/rank<r>.json`` (the chrome trace) and ``OUT/rank<r>.restored`` (written only
when every wrapped name is the original function again after ``tag_collectives``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, out: str) -> None:
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.distributed_c10d as c10d

    from tracer.pgtag import C10D_FUNCTIONS, FUNCOL_FUNCTIONS, tag_collectives

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    before = {n: getattr(c10d, n, None) for n in C10D_FUNCTIONS + ("batch_isend_irecv",)}
    before_funcol = {n: getattr(funcol, n, None) for n in FUNCOL_FUNCTIONS}
    pair = dist.new_group([0, 1])  # a second group: its own pg_name
    peer = 1 - rank
    early = dist.P2POp(dist.isend if rank == 0 else dist.irecv, torch.ones(3), peer)  # pre-patch op
    x = torch.ones(4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with tag_collectives():
            dist.all_reduce(x)  # default group
            dist.all_gather_into_tensor(torch.empty(8), x, group=pair)  # nests all_gather_single
            dist.reduce_scatter_tensor(torch.empty(2), x, group=pair)
            if rank == 0:
                dist.send(x, dst=1)
                dist.isend(x, group_dst=1, group=pair).wait()
            else:
                dist.recv(x, src=0)
                dist.irecv(x, group_src=0, group=pair).wait()
            late = dist.P2POp(dist.isend if rank == 1 else dist.irecv, torch.ones(3), peer, group=pair)
            for work in dist.batch_isend_irecv([early]) + dist.batch_isend_irecv([late]):
                work.wait()
            funcol.wait_tensor(funcol.all_reduce(x, "sum", pair))
            funcol.wait_tensor(funcol.all_gather_tensor(x, 0, [0, 1]))
            dist.barrier(group=pair)
    prof.export_chrome_trace(f"{out}/rank{rank}.json")
    restored = (all(getattr(c10d, n, None) is f for n, f in before.items())
                and all(getattr(funcol, n, None) is f for n, f in before_funcol.items())
                and dist.all_reduce is before["all_reduce"] and dist.isend is before["isend"])
    if restored:
        Path(f"{out}/rank{rank}.restored").touch()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_rank, args=(sys.argv[1],), nprocs=2, join=True)
