"""A user's own model with a tensor-parallel plan (``ModelSpec.tp_plan``), for
tests/tracer/test_mesh2d.py: ``--model tests/tracer/specs/tp_mlp.py:build --strategy fsdp2_tp``."""

import torch
from torch import nn

from tracer import ModelSpec


def _batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 8, generator=gen)


def _plan(model, tp_mesh):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {"0": ColwiseParallel(), "2": RowwiseParallel()}


def build() -> ModelSpec:
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    return ModelSpec(model=model, make_batch=_batch, loss=nn.functional.mse_loss, units=(nn.Linear,),
                     tp_plan=_plan)
