"""``--model hf:gpt2`` and ``--model hf:llama``: real model families, tiny and offline, resizable.

``GPT2LMHeadModel`` / ``LlamaForCausalLM`` from ``transformers`` (the ``hf`` extra), built from a
config object in code: no weights or files are downloaded and ``HF_HUB_OFFLINE=1`` is set before
transformers is imported. Tiny by default (2 blocks, hidden 64, 2 heads, vocabulary 256,
sequence 16: tracer/specform.py ``HF_TINY``), so a CPU record of every strategy takes seconds;
the structure is the real one: GPT-2 ties its token embedding and its LM head (one FQN,
``transformer.wte.weight``), Llama has RMSNorm, rotary embeddings (buffers) and a gated MLP.
Dropout is 0 (each rank and the baseline would draw different masks); the KV cache is off
(``use_cache=False``: training needs none, and activation checkpointing's recompute would
append a second time to it). FSDP units: the decoder blocks (``GPT2Block``,
``LlamaDecoderLayer``), as torchtitan and the transformers FSDP docs wrap them.

Sizes, family-independent: ``hf:llama?layers=4,hidden=256,heads=4,vocab=512,seq=32`` (also
``kv_heads``, Llama's key / value heads, and ``ffn``, the MLP's inner width; each is the
family's config key, tracer/specform.py ``HF_SIZE_NAMES``). Any config key too:
``hf:gpt2?n_layer=4,n_embd=128`` sets those keys over the tiny ones (a key the config does not
have is refused, naming the valid ones). Derived sizes follow the given ones unless set:
Llama's ``intermediate_size`` = 2 x hidden and ``num_key_value_heads`` = heads (ours), GPT-2's
MLP 4 x hidden (transformers'). The manifest's ``model.spec`` keeps the SPEC as given and
``model.config`` the config of the model as built (``built_config``).

Batch: random token ids in [0, vocab_size) from ``torch.Generator().manual_seed(seed + 1)``,
shape [batch, seq + 1], seq the model's position count (``n_positions`` /
``max_position_embeddings``: the model trains at its whole context); inputs are tokens
0..seq-1, targets tokens 1..seq. Loss: causal-LM cross-entropy, the mean over every target
token of the rows given (fp32 logits).

Tensor parallel (``--strategy fsdp2_tp``): Llama's plan is transformers' own
(``LlamaConfig.base_model_tp_plan``: q / k / v / gate / up colwise, o / down rowwise, the
embeddings, norms and LM head replicated), ``llama_tp_plan``. GPT-2 has none (its ``Conv1D``
keeps weights as [in, out], which ColwiseParallel's Shard(0) would split the wrong way).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from tracer.modelspec import ModelSpec, SpecError
from tracer.specform import HF_TINY, SpecForm, hf_sizes

VOCAB = HF_TINY["vocab"]
HIDDEN = HF_TINY["hidden"]
LAYERS = HF_TINY["layers"]
HEADS = HF_TINY["heads"]
SEQ = HF_TINY["seq"]


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


def make_tokens(batch_size: int, seed: int, vocab: int = VOCAB, seq: int = SEQ
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets): [batch, seq] int64 token ids in [0, vocab) each, targets shifted by
    one."""
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
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


_BOOKKEEPING = ("transformers_version", "architectures", "id2label", "label2id", "return_dict",
                "output_hidden_states", "output_attentions", "problem_type", "dtype")


def built_config(model) -> dict[str, Any]:
    """The manifest's ``model.config``: the built model's ``config.to_dict()`` (what
    transformers resolved: ``head_dim``, the rope parameters, the norms' epsilon), without
    transformers' bookkeeping (``_*``, ``_BOOKKEEPING``: labels, output flags)."""
    return {k: v for k, v in model.config.to_dict().items()
            if not k.startswith("_") and k not in _BOOKKEEPING}


def _spec(model, config, units: tuple, tp_plan=None) -> ModelSpec:
    vocab, seq = int(config.vocab_size), int(config.max_position_embeddings)
    return ModelSpec(model=model, make_batch=lambda b, seed: make_tokens(b, seed, vocab, seq),
                     loss=causal_lm_loss, units=units, tp_plan=tp_plan, config=built_config(model))


def _sizes(family: str, overrides: dict[str, Any] | None) -> dict[str, int]:
    return hf_sizes(SpecForm(kind="hf", where=family, overrides=tuple((overrides or {}).items())))


def gpt2(overrides: dict[str, Any] | None = None, spec: str | None = None) -> ModelSpec:
    """Tiny GPT2LMHeadModel (tied embedding and head); units: GPT2Block. ``overrides``: config
    keys set over the tiny ones (``hf:gpt2?n_layer=4``, or by size name, tracer/specform.py
    translates ``layers=4`` to ``n_layer``; ``spec`` names it in a refusal). No TP plan."""
    tf = _transformers("gpt2")
    from transformers.models.gpt2.modeling_gpt2 import GPT2Block

    n = _sizes("gpt2", overrides)
    config = _config(tf.GPT2Config, "gpt2", dict(
        vocab_size=n["vocab"], n_positions=n["seq"], n_embd=n["hidden"], n_layer=n["layers"],
        n_head=n["heads"], resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
        eos_token_id=0, attn_implementation="eager", use_cache=False), overrides, spec)
    return _spec(_model(tf.GPT2LMHeadModel, config, spec, "gpt2"), config, (GPT2Block,))


def llama(overrides: dict[str, Any] | None = None, spec: str | None = None) -> ModelSpec:
    """Tiny LlamaForCausalLM (untied head, RMSNorm, rotary buffers); units: LlamaDecoderLayer;
    TP plan: ``llama_tp_plan``. ``overrides``: config keys set over the tiny ones
    (``hf:llama?num_hidden_layers=4``, or ``layers=4``)."""
    tf = _transformers("llama")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    n = _sizes("llama", overrides)
    config = _config(tf.LlamaConfig, "llama", dict(
        vocab_size=n["vocab"], hidden_size=n["hidden"], intermediate_size=n["ffn"],
        num_hidden_layers=n["layers"], num_attention_heads=n["heads"],
        num_key_value_heads=n["kv_heads"], max_position_embeddings=n["seq"],
        attention_dropout=0.0, bos_token_id=0, eos_token_id=0, attn_implementation="eager",
        use_cache=False), overrides, spec)
    return _spec(_model(tf.LlamaForCausalLM, config, spec, "llama"), config,
                 (LlamaDecoderLayer,), tp_plan=llama_tp_plan)


def llama_tp_plan(model, tp_mesh) -> dict[str, Any]:
    """``ModelSpec.tp_plan`` of ``LlamaForCausalLM``: transformers' own plan for it
    (``model.config.base_model_tp_plan``, FQNs under ``model.``, ``layers.*`` expanded per
    decoder layer): ``self_attn.q_proj`` / ``k_proj`` / ``v_proj`` and ``mlp.gate_proj`` /
    ``up_proj`` ColwiseParallel (each rank computes heads / T whole heads: LlamaAttention views
    the projections as [.., -1, head_dim], so the local head count follows from the local
    rows; its ``num_key_value_groups`` = heads / kv_heads is the same on every rank),
    ``self_attn.o_proj`` / ``mlp.down_proj`` RowwiseParallel (fwd all_reduce of the [b, s, h]
    partial sums). Embeddings, RMSNorms and the LM head stay replicated. Raises ``ValueError``
    for a style other than colwise / rowwise (a later transformers plan: add its style here).
    tracer/specform.py ``hf_tp_refusal`` refuses sizes that do not divide by T, before any
    worker."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    plan = {}
    for i in range(len(model.model.layers)):
        for pattern, style in model.config.base_model_tp_plan.items():
            if style not in styles:
                raise ValueError(f"LlamaConfig.base_model_tp_plan[{pattern!r}] is {style!r}; "
                                 f"tracer/hf.py maps only {', '.join(styles)}")
            if pattern.startswith("layers.*."):
                plan[f"model.layers.{i}.{pattern[len('layers.*.'):]}"] = styles[style]()
    return plan
