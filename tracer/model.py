"""The reference transformer and its deterministic synthetic batch.

``SimpleTransformerLayer`` is exactly the seed's layer: ``h = norm(x + attn(x)); return h + mlp(h)``
with attn = Linear(h, h), mlp = Linear(h, 4h) -> GELU -> Linear(4h, h), norm = LayerNorm(h).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class SimpleTransformerLayer(nn.Module):
    """One block. Input and output: [batch, seq, hidden] floats."""

    def __init__(self, hidden: int):
        super().__init__()
        self.attn = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x + self.attn(x))
        return h + self.mlp(h)


class SimpleTransformer(nn.Module):
    """``layers`` SimpleTransformerLayer blocks in ``self.layers`` (a ModuleList), applied in order."""

    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.layers = nn.ModuleList(SimpleTransformerLayer(hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def build_model(hidden: int, layers: int, seed: int) -> SimpleTransformer:
    """The model with its initial weights drawn from ``torch.manual_seed(seed)`` (on CPU)."""
    torch.manual_seed(seed)
    return SimpleTransformer(hidden, layers)


def make_batch(batch: int, seq: int, hidden: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The fixed synthetic batch: inputs and MSE targets, each [batch, seq, hidden] fp32.

    Both come from a generator seeded with ``seed + 1`` (separate from the weights' seed), so the
    same batch is used at every step and by every process.
    """
    gen = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(batch, seq, hidden, generator=gen)
    y = torch.randn(batch, seq, hidden, generator=gen)
    return x, y


def rank_rows(batch: int, world_size: int, rank: int) -> slice:
    """Rows of the global batch that rank ``rank`` trains on: [r*B/W, (r+1)*B/W).

    Raises ``ValueError`` when ``batch`` does not divide by ``world_size``.
    """
    if batch % world_size:
        raise ValueError(f"global batch {batch} does not divide by world size {world_size}")
    per_rank = batch // world_size
    return slice(rank * per_rank, (rank + 1) * per_rank)


def tp_plan(model: SimpleTransformer, tp_mesh) -> dict:
    """The reference model's tensor-parallel plan (``ModelSpec.tp_plan``), per layer i, as
    torchtitan splits its blocks: ``layers.i.attn`` ColwiseParallel(output_layouts=Replicate())
    (its output features split over tp, gathered back: fwd all_gather, bwd all_reduce of the
    input gradient), ``layers.i.mlp.0`` ColwiseParallel (a local [b, s, 4h/T] output; bwd
    all_reduce of the input gradient), ``layers.i.mlp.2`` RowwiseParallel (input features split,
    fwd all_reduce of the [b, s, h] partial sums). The LayerNorm stays replicated."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {}
    for i in range(len(model.layers)):
        plan[f"layers.{i}.attn"] = ColwiseParallel(output_layouts=Replicate())
        plan[f"layers.{i}.mlp.0"] = ColwiseParallel()
        plan[f"layers.{i}.mlp.2"] = RowwiseParallel()
    return plan


def precision_context(precision: str, device_type: str) -> contextlib.AbstractContextManager:
    """The one precision policy, applied identically to the baseline and every strategy.

    fp32: nothing. bf16: ``torch.autocast(device_type, torch.bfloat16)`` around forward and
    loss; parameters, gradients, the gradient reduction and the optimizer stay fp32 (fp32 master
    weights). Chosen over FSDP ``MixedPrecision`` because DDP, FSDP1, FSDP2 and the one-process
    baseline all run it unchanged, so a parity difference cannot come from four emulations of
    one policy.
    """
    if precision == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def loss_fn(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over all elements (fp32 under autocast)."""
    return nn.functional.mse_loss(out.float(), target)
