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

Sizes: ``hf:gpt2?n_layer=4,n_embd=128`` sets those keys of the config over the tiny ones
(tracer/specform.py parses the text; a key the config does not have is refused, naming the valid
ones); the manifest's ``model.spec`` keeps the SPEC as given, overrides included.

Batch: random token ids in [0, 256) (in [0, vocab_size) when an override makes it smaller) from ``torch.Generator().manual_seed(seed + 1)``, shape
[batch, 17]; inputs are tokens 0..15, targets tokens 1..16. Loss: causal-LM cross-entropy, the
mean over every target token of the rows given (fp32 logits).
"""

from __future__ import annotations

import os
from typing import Any

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


def make_tokens(batch_size: int, seed: int, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): [batch, SEQ] int64 token ids in [0, min(vocab, VOCAB)) each, targets
    shifted by one."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, min(vocab, VOCAB), (batch_size, SEQ + 1), generator=gen)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def causal_lm_loss(outputs, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``outputs.logits`` [B, S, V] against ``targets`` [B, S] (fp32)."""
    logits = outputs.logits.float()
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def config_keys(config_class) -> list[str]:
    """The keys ``hf:FAMILY?KEY=VALUE`` may set: the config's own fields (``to_dict`` of a
    default config, transformers' bookkeeping ``_*`` and ``transformers_version`` left out)
    and their standard aliases (``attribute_map``: ``hidden_size`` for GPT-2's ``n_embd``)."""
    keys = {k for k in config_class().to_dict() if not k.startswith("_") and k != "transformers_version"}
    return sorted(keys | set(getattr(config_class, "attribute_map", {})))


_KINDS = {bool: "true or false", int: "a whole number", float: "a number"}


def _typed(config_class, key: str, value: Any, ours: dict[str, Any]) -> Any:
    """``value`` of override ``key`` as the config's field takes it, judged by the type of the
    field's value in our tiny config or the class's default (bool, int or float; ``1`` is a
    float field's 1.0); any other field (None default, text) is left to the config. Raises
    ``ValueError`` naming the kind expected."""
    default = ours.get(key, getattr(config_class(), key, None))
    kind = next((k for k in _KINDS if type(default) is k), None)
    if kind is None or type(value) is kind:
        return value
    if kind is float and type(value) is int:
        return float(value)
    raise ValueError(f"{key}={value} is not {_KINDS[kind]} ({config_class.__name__}'s {key} "
                     f"is {type(default).__name__})")


def _refused(name: str, spec: str, exc: Exception) -> SpecError:
    """``--model SPEC: NAME refused it: <its whole message, on one line>; change the override``:
    transformers refusing a combination of overrides (``n_embd`` not divisible by ``n_head``)."""
    text = " ".join(str(exc).split()).rstrip(".")
    if isinstance(exc, (KeyError, IndexError)) or not text:  # KeyError 'nope' says little alone
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return SpecError(f"--model {spec}: {name} refused it: {text}; change the override")


def _config(config_class, family: str, ours: dict[str, Any], overrides: dict[str, Any] | None,
            spec: str | None):
    """``config_class(**ours)`` with ``overrides`` set over ours. Raises ``SpecError`` (one
    line) for a key the config does not have (naming the valid ones), a value not of the
    field's type (``_typed``; the sizes' range: tracer/specform.py ``HF_SIZE_KEYS``) and a
    combination the config refuses (its whole message)."""
    overrides = overrides or {}
    spec = spec or "hf:" + family
    valid = config_keys(config_class)
    unknown = [k for k in overrides if k not in valid]
    if unknown:
        raise SpecError(f"--model {spec}: {config_class.__name__} has no key "
                        f"{unknown[0]!r}; valid keys: {', '.join(valid)}")
    typed = {}
    for key, value in overrides.items():
        try:
            typed[key] = _typed(config_class, key, value, ours)
        except ValueError as exc:
            raise SpecError(f"--model {spec}: {exc}; change the override") from None
    try:
        return config_class(**{**ours, **typed})
    except Exception as exc:  # transformers' validation: ValueError, StrictDataclass... errors
        raise _refused(config_class.__name__, spec, exc) from None


def _model(model_class, config, spec: str | None, family: str):
    """``model_class(config)``; a combination the model's layers refuse (GPT2Attention:
    ``embed_dim`` must be divisible by ``num_heads``) is a ``SpecError`` naming the override."""
    if spec is None or "?" not in spec:
        return model_class(config)  # the tiny config builds: a failure is ours, not the user's
    try:
        return model_class(config)
    except Exception as exc:  # noqa: BLE001 -- any: the tiny config alone builds
        raise _refused(model_class.__name__, spec, exc) from None


def _spec(model, config, units: tuple) -> ModelSpec:
    vocab = int(config.vocab_size)
    return ModelSpec(model=model, make_batch=lambda b, seed: make_tokens(b, seed, vocab),
                     loss=causal_lm_loss, units=units)


def gpt2(overrides: dict[str, Any] | None = None, spec: str | None = None) -> ModelSpec:
    """Tiny GPT2LMHeadModel (tied embedding and head); units: GPT2Block. ``overrides``: config
    keys set over the tiny ones (``hf:gpt2?n_layer=4``; ``spec`` names it in a refusal)."""
    tf = _transformers("gpt2")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    config = _config(tf.GPT2Config, "gpt2", dict(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager", use_cache=False), overrides, spec)
    return _spec(_model(tf.GPT2LMHeadModel, config, spec, "gpt2"), config, (GPT2Block,))


def llama(overrides: dict[str, Any] | None = None, spec: str | None = None) -> ModelSpec:
    """Tiny LlamaForCausalLM (untied head, RMSNorm, rotary buffers); units: LlamaDecoderLayer.
    ``overrides``: config keys set over the tiny ones (``hf:llama?num_hidden_layers=4``)."""
    tf = _transformers("llama")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    config = _config(tf.LlamaConfig, "llama", dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        max_position_embeddings=SEQ, attention_dropout=0.0, bos_token_id=0, eos_token_id=0,
        attn_implementation="eager", use_cache=False), overrides, spec)
    return _spec(_model(tf.LlamaForCausalLM, config, spec, "llama"), config,
                 (LlamaDecoderLayer,))
