"""Recipe: record a torchtitan model (``torchtitan.models.llama3``, flavor ``debugmodel``) through
``tracer.ModelSpec`` (docs/howto/your-model.md, "A torchtitan model").

    tracer record --strategy fsdp2 --device cuda --model examples/torchtitan_llama3.py:build

torchtitan 0.3.0 is not a dependency of paritytrace, and it does not train on CPU (checked beside
torch 2.13.0+cpu): ``import torchtitan.models.llama3`` needs ``triton`` (imported by
torchtitan/distributed/minimal_async_ep/kernels.py, not a declared requirement), and its
attention backends are ``flex`` (torch: "FlexAttention does not support backward on CPU") and
``varlen`` (``aten::_flash_attention_forward`` has no CPU kernel); ``sdpa`` is refused by
torchtitan itself. Record it on CUDA.

What the recipe does, and why (``wrap``):

- torchtitan builds a model from its config (``model_registry(flavor).model.build()``) and
  initialises it with ``init_states()``: called in the factory, after tracer's
  ``torch.manual_seed(--seed)``, so every process builds the same structure (the ranks then
  load the baseline's parameters by FQN anyway).
- Its decoder's forward is ``model(tokens, positions, attention_masks)``, with the masks made
  by ``model.get_attention_masks(positions)``; tracer calls ``model(inputs)``, so ``TitanLM``
  makes the positions (0..seq-1 per row: one document per row) and the masks in its forward.
- FSDP units: torchtitan's own choice, each transformer block (the class of
  ``model.layers["0"]``), as its ``parallelize_fn`` wraps them; tracer applies its own
  strategies, so torchtitan's ``parallelize_fn`` (TP, FSDP, compile together) is not used.
- No TP plan: the debugmodel fuses q / k / v into one Linear (``fuse_qkv=True``), which a
  ColwiseParallel would split across the q | k | v boundaries; ``--strategy fsdp2_tp`` is
  refused for it (ModelSpec.tp_plan is None).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tracer import ModelSpec
from tracer.modelspec import SpecError

SEQ = 16
"""Tokens per row: short, so a record takes seconds (torchtitan's debugmodel takes 131,072)."""


class TitanLM(nn.Module):
    """A torchtitan decoder called as tracer calls a model: ``forward(tokens [B, S] int64) ->
    logits [B, S, vocab]``, the positions (0..S-1 in every row) and attention masks made here."""

    def __init__(self, titan: nn.Module) -> None:
        super().__init__()
        self.titan = titan

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device).expand(tokens.shape[0], -1)
        return self.titan(tokens, positions, self.titan.get_attention_masks(positions))


def wrap(titan_spec: Any, seq: int = SEQ) -> ModelSpec:
    """The ``ModelSpec`` of a torchtitan ``ModelSpec`` (``model_registry(flavor)``: its
    ``model`` is the model's config, with ``build()`` and ``vocab_size``). Batch: token ids in
    [0, vocab_size) from ``torch.Generator().manual_seed(seed)``, [batch, seq + 1], inputs
    tokens 0..seq-1 and targets 1..seq; loss: mean causal-LM cross-entropy (fp32 logits)."""
    config = titan_spec.model
    titan = config.build()
    titan.init_states()
    vocab = int(config.vocab_size)

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    block = type(next(iter(titan.layers.values())))
    return ModelSpec(model=TitanLM(titan), make_batch=make_batch, loss=loss, units=(block,),
                     config={"torchtitan": f"{titan_spec.name}:{titan_spec.flavor}",
                             "layers": len(titan.layers), "vocab_size": vocab, "seq": seq})


def build() -> ModelSpec:
    """torchtitan's llama3 ``debugmodel`` (6 layers, dim 256, 16 heads, vocabulary 2,048).
    Raises ``SpecError`` (one line, naming the pip command) when torchtitan cannot be imported."""
    try:
        from torchtitan.models.llama3 import model_registry
    except ModuleNotFoundError:
        raise SpecError("torchtitan is not installed; pip install torchtitan==0.3.0 triton, on a "
                        "CUDA machine (torchtitan's attention has no CPU backward)") from None
    return wrap(model_registry("debugmodel", attn_backend="flex"))
