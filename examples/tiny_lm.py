"""A user's own model for ``tracer record --model examples/tiny_lm.py:build`` (README "Your own model").

A 3-symbol language model: token ids in, next-token logits out. The head is tied to the embedding
(one parameter, one FQN: ``embed.weight``), whose 3 rows do not divide over 2 FSDP2 ranks.
"""
import torch
from torch import nn

from tracer import ModelSpec


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm, self.mlp = nn.LayerNorm(width), nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, h):
        return h + self.mlp(self.norm(h))


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 3, width: int = 32):
        super().__init__()
        self.embed, self.blocks = nn.Embedding(vocab, width), nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.embed.weight  # tied

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def build() -> ModelSpec:
    def make_batch(batch_size: int, seed: int):
        ids = torch.randint(0, 3, (batch_size, 9), generator=torch.Generator().manual_seed(seed))
        return ids[:, :-1], ids[:, 1:]

    def loss(logits, targets):
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return ModelSpec(model=TinyLM(), make_batch=make_batch, loss=loss, units=(Block,))
