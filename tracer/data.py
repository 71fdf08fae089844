"""Input supply of a record (issue 10): the fixed batch from memory, or through a DataLoader.

``--data memory`` (default): each rank takes its rows ``model.rank_rows`` of the fixed global
batch once, before the steps; every step reuses them, so no step waits for input.

``--data loader``: every step fetches the same rows through a real
``torch.utils.data.DataLoader`` with a ``DistributedSampler(shuffle=False)``, ``--data-workers``
worker processes, pinned memory on CUDA and an optional sleep of ``--data-sample-cost-ms`` per
sample (standing for decoding / augmentation; a sleep costs wall time, not a CPU core, so it
does not slow the other ranks on a small machine). The fetch happens inside the step, so the
step's wall time and its trace include it; the DataLoader records its
``enumerate(DataLoader)#...__next__`` range, which the analyzer counts as data supply.

Why the rows must be the memory path's rows exactly: parity compares each rank's step-0
activations with the baseline's rows of that rank's contiguous slice, DDP / FSDP average
gradients of exactly that partition, and the first-step loss is bitwise the memory path's only
for the same rows in the same order. ``DistributedSampler`` does not hand out contiguous slices:
with ``shuffle=False`` rank r gets indices ``r, r + W, r + 2W, ...``
(torch/utils/data/distributed.py, ``indices[rank:total_size:num_replicas]``). So
``FixedBatchDataset`` lays its items out rank-major: item k is global row
``(k mod W) * b + (k div W) mod b`` (b = B / W rows per rank). The sampler's j-th index for rank
r is ``r + jW``, i.e. row ``r * b + j mod b``: batch s of rank r (j in [s*b, (s+1)*b)) is rows
``r*b .. r*b + b - 1`` in order, the memory path's slice. The dataset is ``steps`` batches long
(one epoch covers the run), so a multi-process loader can prefetch across steps as it would in
training, and no padding occurs (B divides by W, checked by the config).
"""

from __future__ import annotations

import time
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from analyzer.contract.schemas import Data
from tracer.config import RecordConfig
from tracer.model import rank_rows


class FixedBatchDataset(Dataset):
    """``steps * B`` items of the fixed global batch in rank-major order (module docstring).

    ``x``, ``y``: [B, seq, hidden] tensors; an item is ``(x[row], y[row])``, each [seq, hidden].
    ``sample_cost_s``: seconds slept per item (0: none). Raises ``ValueError`` when B does not
    divide by ``world_size``.
    """

    def __init__(self, x: torch.Tensor, y: torch.Tensor, *, world_size: int, steps: int,
                 sample_cost_s: float = 0.0):
        if x.shape[0] % world_size:
            raise ValueError(f"global batch {x.shape[0]} does not divide by world size {world_size}")
        self.x, self.y = x, y
        self.world = world_size
        self.per_rank = x.shape[0] // world_size
        self.length = steps * x.shape[0]
        self.sample_cost_s = sample_cost_s

    def __len__(self) -> int:
        return self.length

    def row(self, k: int) -> int:
        """Global batch row of item ``k``."""
        return (k % self.world) * self.per_rank + (k // self.world) % self.per_rank

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= k < self.length:
            raise IndexError(k)
        if self.sample_cost_s > 0:
            time.sleep(self.sample_cost_s)
        r = self.row(k)
        return self.x[r], self.y[r]


def make_loader(cfg: RecordConfig, x: torch.Tensor, y: torch.Tensor, *, rank: int, world_size: int,
                device: torch.device) -> DataLoader:
    """The DataLoader of ``--data loader`` for this rank (module docstring)."""
    ds = FixedBatchDataset(x, y, world_size=world_size, steps=cfg.total_steps,
                           sample_cost_s=cfg.data_sample_cost_ms / 1e3)
    sampler = DistributedSampler(ds, num_replicas=world_size, rank=rank, shuffle=False,
                                 drop_last=False)
    return DataLoader(ds, batch_size=ds.per_rank, sampler=sampler, num_workers=cfg.data_workers,
                      pin_memory=device.type == "cuda", persistent_workers=cfg.data_workers > 0,
                      drop_last=False)


class Batches:
    """Per step, this rank's (inputs, targets) on ``device``, [B / W, seq, hidden] each.

    ``rank`` / ``world_size`` are the data-parallel index and size (tracer/loop.py
    ``dp_coords``): the world for the flat strategies and hsdp; world / T for
    fsdp2_tp, whose T tensor-parallel ranks of one dp group train the same rows.

    ``start()`` before the profiler (a multi-process loader forks its workers there);
    ``next()`` inside the step; ``close()`` stops the loader's workers.
    """

    def __init__(self, cfg: RecordConfig, x: torch.Tensor, y: torch.Tensor, *, rank: int,
                 world_size: int, device: torch.device):
        self.device = device
        self.loader = None
        self.it: Iterator | None = None
        if cfg.data == "loader":
            self.loader = make_loader(cfg, x, y, rank=rank, world_size=world_size, device=device)
        else:
            rows = rank_rows(x.shape[0], world_size, rank)
            self.fixed = (x[rows].to(device), y[rows].to(device))

    def start(self) -> None:
        """Create the loader's iterator (starts its workers)."""
        if self.loader is not None:
            self.it = iter(self.loader)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This step's batch."""
        if self.loader is None:
            return self.fixed
        xb, yb = next(self.it)
        pinned = self.loader.pin_memory
        return xb.to(self.device, non_blocking=pinned), yb.to(self.device, non_blocking=pinned)

    def close(self) -> None:
        """Stop the loader's worker processes (no-op for memory)."""
        it, self.it = self.it, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def data_manifest(cfg: RecordConfig, device_type: str) -> Data:
    """The manifest's ``data`` entry (analyzer/contract/schemas.py)."""
    if cfg.data == "memory":
        return Data(source="memory")
    return Data(source="loader", workers=cfg.data_workers, pin_memory=device_type == "cuda",
                sample_cost_ms=cfg.data_sample_cost_ms,
                sampler="DistributedSampler(shuffle=False) over a rank-major item layout: each rank "
                        "gets its contiguous rows, as --data memory")
