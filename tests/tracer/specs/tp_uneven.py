"""A model whose tensor-parallel split is uneven, for tests/tracer/test_project.py:
``--model tests/tracer/specs/tp_uneven.py:build --strategy fsdp2_tp --tp 3``. Its first Linear's
10 output features split over 3 tp ranks as ``torch.chunk`` does (4, 4, 2 rows), its output
gathered back whole (``ColwiseParallel(output_layouts=Replicate())``, as the reference model's
attention); the second Linear stays replicated (a RowwiseParallel layer with uneven input
features fails in torch 2.13 itself: ``DTensor.from_local`` takes its local shape as even)."""

import torch
from torch import nn

from tracer import ModelSpec


def _batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 8, generator=gen)


def _plan(model, tp_mesh):
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel

    return {"0": ColwiseParallel(output_layouts=Replicate())}


def build() -> ModelSpec:
    model = nn.Sequential(nn.Linear(8, 10), nn.GELU(), nn.Linear(10, 8))
    return ModelSpec(model=model, make_batch=_batch, loss=nn.functional.mse_loss, units=(nn.Linear,),
                     tp_plan=_plan)
