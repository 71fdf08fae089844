"""Test-only model specs (tests/tracer/test_modelspec.py): the shapes numerics must survive, and
factories that go wrong in each way ``--model`` refuses."""

import torch
from torch import nn

from tracer import ModelSpec


class Odd(nn.Module):
    """Token ids -> 5 logits. ``embed`` [5, 8] is tied to ``head`` (one FQN); ``gate`` has 3 rows
    (FSDP2 on 2 ranks: chunks of 2 and 1 rows); ``bn`` is a BatchNorm with running-stat buffers."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(5, 8)
        self.proj = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.gate = nn.Linear(8, 3)
        self.mix = nn.Linear(3, 8)
        self.head = nn.Linear(8, 5, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        h = self.proj(self.embed(tokens).mean(1))
        return self.head(h + self.mix(self.gate(self.bn(h))))


def _batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 5, (batch_size, 4), generator=gen), torch.randint(0, 5, (batch_size,), generator=gen)


def build() -> ModelSpec:
    return ModelSpec(model=Odd(), make_batch=_batch, loss=nn.functional.cross_entropy)


def raises() -> ModelSpec:
    raise RuntimeError("no GPU here")


def not_a_spec():
    return nn.Linear(2, 2)


def bad_batch() -> ModelSpec:
    return ModelSpec(model=Odd(), make_batch=lambda b, s: _batch(b + 1, s), loss=nn.functional.cross_entropy)


def forward_raises() -> ModelSpec:
    return ModelSpec(model=nn.Linear(3, 3), make_batch=_batch, loss=nn.functional.cross_entropy)


def with_dropout() -> ModelSpec:
    return ModelSpec(model=nn.Sequential(nn.Embedding(5, 8), nn.Dropout(0.1)), make_batch=_batch,
                     loss=lambda out, y: out.sum())
