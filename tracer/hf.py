"""``--model hf:gpt2`` and ``--model hf:llama``: real model families, tiny and offline.

``GPT2LMHeadModel`` / ``LlamaForCausalLM`` from ``transformers`` (the ``hf`` extra), built from a
config object in code: no weights or files are downloaded and ``HF_HUB_OFFLINE=1`` is set before
transformers is imported. Tiny on purpose (2 blocks, hidden 64, vocabulary 256, sequence 16), so
a CPU record of every strategy takes seconds; the structure is the real one: GPT-2 ties its
token embedding and its LM head (one FQN, ``transformer.wte.weight``), Llama has RMSNorm, rotary
embeddings (buffers) and a gated MLP. Dropout is 0 (each rank and the baseline would draw
different masks); the KV cache is off (``use_cache=False``: training needs none, and activation
checkpointing's recompute would append a second time to it). FSDP units: the decoder blocks (``GPT2Block``, ``LlamaDecoderLayer``), as
torchtitan and the transformers FSDP docs wrap them.

Batch: random token ids in [0, 256) from ``torch.Generator().manual_seed(seed + 1)``, shape
[batch, 17]; inputs are tokens 0..15, targets tokens 1..16. Loss: causal-LM cross-entropy, the
mean over every target token of the rows given (fp32 logits).
"""

from __future__ import annotations

import os
import torch
from torch import nn

from tracer.modelspec import ModelSpec, SpecError

VOCAB = 256
HIDDEN = 64
LAYERS = 2
HEADS = 2
SEQ = 16


def _transformers(family: str):
    """Import transformers offline; ``SpecError`` (one line) when the extra is missing."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ModuleNotFoundError:
        raise SpecError(f"--model hf:{family}: transformers is not installed; "
                        "pip install 'paritytrace[hf]'") from None
    transformers.logging.set_verbosity_error()  # tiny vocabularies draw config warnings
    return transformers


def make_tokens(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): [batch, SEQ] int64 token ids each, targets shifted by one."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, VOCAB, (batch_size, SEQ + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def causal_lm_loss(outputs, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``outputs.logits`` [B, S, V] against ``targets`` [B, S] (fp32)."""
    logits = outputs.logits.float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def gpt2() -> ModelSpec:
    """Tiny GPT2LMHeadModel (tied embedding and head); units: GPT2Block."""
    tf = _transformers("gpt2")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = tf.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS,
                           n_head=HEADS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                           bos_token_id=0, eos_token_id=0, attn_implementation="eager",
                           use_cache=False)
    return ModelSpec(model=tf.GPT2LMHeadModel(config), make_batch=make_tokens,
                     loss=causal_lm_loss, units=(GPT2Block,))


def llama() -> ModelSpec:
    """Tiny LlamaForCausalLM (untied head, RMSNorm, rotary buffers); units: LlamaDecoderLayer."""
    tf = _transformers("llama")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
                            num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                            num_key_value_heads=HEADS, max_position_embeddings=SEQ,
                            attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
                            attn_implementation="eager", use_cache=False)
    return ModelSpec(model=tf.LlamaForCausalLM(config), make_batch=make_tokens,
                     loss=causal_lm_loss, units=(LlamaDecoderLayer,))

