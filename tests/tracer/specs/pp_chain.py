"""A user's own model with a stage-split hook (``ModelSpec.pp_split``), for
tests/tracer/test_pipeline.py: ``--model tests/tracer/specs/pp_chain.py:build --strategy pp``.
Its forward is a chain: ``embed``, the 4 ``blocks``, ``head``; the input and output widths
differ from the blocks' (8 -> 16 -> 4), so each stage's shapes come from the chain."""

import torch
from torch import nn

from tracer import ModelSpec, split_module_list


class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4))
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Skip(Chain):
    """Not a chain: the head also reads the embedding (a skip across stages)."""

    def forward(self, x):
        e = self.embed(x)
        h = e
        for block in self.blocks:
            h = block(h)
        return self.head(h + e)


def _batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 8, generator=gen), torch.randn(batch_size, 4, generator=gen)


def build() -> ModelSpec:
    return ModelSpec(model=Chain(), make_batch=_batch, loss=nn.functional.mse_loss, units=(nn.Linear,),
                     pp_split=split_module_list("blocks", first=("embed",), last=("head",)))


def build_skip() -> ModelSpec:
    return ModelSpec(model=Skip(), make_batch=_batch, loss=nn.functional.mse_loss, units=(nn.Linear,),
                     pp_split=split_module_list("blocks", first=("embed",), last=("head",)))
