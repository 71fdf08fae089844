"""A stand-in for ``torchtitan.models.llama3`` (torchtitan 0.3.0 does not train on CPU:
examples/torchtitan_llama3.py says why), with the interface the recipe uses and nothing more:
``model_registry(flavor)`` returns a spec whose ``model`` config has ``build()`` and
``vocab_size``; the built decoder has ``init_states()``, ``layers`` (a ``ModuleDict`` of blocks
keyed "0", "1", ...), ``get_attention_masks(positions)`` and ``forward(tokens, positions,
attention_masks)``, as torchtitan/models/common/decoder.py ``Decoder`` does. Its attention is
causal SDPA (the CPU has it), the masks None."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from torch import nn

from examples.torchtitan_llama3 import wrap


class StandInBlock(nn.Module):
    """Pre-norm block: fused qkv attention (as the debugmodel's ``fuse_qkv=True``) and an MLP."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.attention_norm = nn.RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = nn.RMSNorm(dim)
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, h, attention_masks, positions):
        b, s, d = h.shape
        q, k, v = self.wqkv(self.attention_norm(h)).view(b, s, 3, self.n_heads, -1).unbind(2)
        att = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        h = h + self.wo(att.transpose(1, 2).reshape(b, s, d))
        return h + self.w2(nn.functional.silu(self.w1(self.ffn_norm(h))))


class StandInDecoder(nn.Module):
    def __init__(self, config: "StandInConfig") -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.dim)
        self.layers = nn.ModuleDict({str(i): StandInBlock(config.dim, config.n_heads)
                                     for i in range(config.n_layers)})
        self.norm = nn.RMSNorm(config.dim)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)

    def init_states(self) -> None:
        for p in self.parameters():
            nn.init.normal_(p, std=0.02) if p.dim() > 1 else nn.init.ones_(p)

    def get_attention_masks(self, positions):
        return None

    def forward(self, tokens, positions=None, attention_masks=None):
        h = self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, attention_masks, positions)
        return self.lm_head(self.norm(h))


@dataclass
class StandInConfig:
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    vocab_size: int = 128

    def build(self) -> StandInDecoder:
        return StandInDecoder(self)


def model_registry(flavor: str) -> SimpleNamespace:
    return SimpleNamespace(name="llama3", flavor=flavor, model=StandInConfig())


def build():
    """The recipe's ``wrap`` on the stand-in: ``--model tests.tracer.specs.titan_standin:build``."""
    return wrap(model_registry("debugmodel"))
