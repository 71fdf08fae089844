"""``tracer record --model SPEC`` read as text: its form, parsed without torch or the user's code,
so that a SPEC that cannot name a model (a missing file, an unknown family, a malformed
``hf:`` override) is refused in one line before torch is imported (tracer/cli.py
``_check_before_start``, issue 42). tracer/specload.py builds the model from the same parse.

Forms: ``reference``; ``hf:FAMILY`` or ``hf:FAMILY?KEY=VALUE,...`` (a tiny transformers model,
tracer/hf.py, its config's KEY set to VALUE: ``hf:gpt2?n_layer=4,n_embd=128``; the keys are
checked against the config when it is built); ``package.module:factory``;
``path/to/file.py:factory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

REFERENCE = "reference"
HF_PREFIX = "hf:"
HF_FAMILIES = ("gpt2", "llama")
"""``hf:<name>``: the factory ``name`` of tracer/hf.py."""
HF_TINY = {"layers": 2, "hidden": 64, "heads": 2, "vocab": 256, "seq": 16}
"""The tiny ``hf:`` models' sizes (tracer/hf.py builds them), by family-independent name."""
HF_SIZE_NAMES = {
    "layers": {"gpt2": "n_layer", "llama": "num_hidden_layers"},
    "hidden": {"gpt2": "n_embd", "llama": "hidden_size"},
    "heads": {"gpt2": "n_head", "llama": "num_attention_heads"},
    "kv_heads": {"llama": "num_key_value_heads"},
    "ffn": {"gpt2": "n_inner", "llama": "intermediate_size"},
    "vocab": {"gpt2": "vocab_size", "llama": "vocab_size"},
    "seq": {"gpt2": "n_positions", "llama": "max_position_embeddings"},
}
"""``hf:FAMILY?layers=4,hidden=256,heads=4,vocab=512,seq=32``: family-independent size names,
each the family's config key (``kv_heads``: Llama's key / value heads, grouped-query attention;
``ffn``: the MLP's inner width). ``seq`` is the batch's sequence length too (tracer/hf.py trains
at the model's whole context)."""
HF_CONFIG_ALIASES = {"gpt2": {"hidden_size": "n_embd", "max_position_embeddings": "n_positions",
                              "num_attention_heads": "n_head", "num_hidden_layers": "n_layer"},
                     "llama": {}}
"""Each family's config ``attribute_map`` (transformers' GPT2Config: ``hidden_size`` reads
``n_embd``), so that ``hidden=`` and ``hidden_size=`` are known as one size, given twice."""
HF_SIZE_KEYS = ("n_layer", "n_embd", "n_head", "n_positions", "n_inner", "num_hidden_layers",
                "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim")
"""``hf:`` config keys that are sizes (counts of layers, heads, features, tokens) of GPT2Config
or LlamaConfig (and their aliases, ``attribute_map``): a whole number >= 1, as are the
``HF_SIZE_NAMES``. Checked here, before torch: transformers takes ``n_layer=0`` (a model of no
blocks) and ``n_layer=-1`` alike."""
FORMS = ("use reference, hf:gpt2, hf:llama (resized: hf:llama?layers=4,hidden=256), "
         "package.module:factory or path/to/file.py:factory")


class SpecError(ValueError):
    """A SPEC that cannot be used: one line naming the spec, the problem and what to do."""


def bad_spec(spec: str, problem: str, fix: str) -> SpecError:
    """``--model SPEC: PROBLEM; FIX`` as a ``SpecError``."""
    return SpecError(f"--model {spec}: {problem}; {fix}")


@dataclass(frozen=True, kw_only=True, slots=True)
class SpecForm:
    """What a SPEC names, before anything is imported."""

    kind: Literal["reference", "hf", "file", "module"]
    where: str = ""
    """hf: the family (``gpt2``); file: the path as given; module: the module's dotted name."""
    factory: str = ""
    """file / module: the factory's name."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """hf: (config key, value) in the order given; values int, float, bool or text."""


def _value(text: str) -> Any:
    """``4`` -> 4, ``1e-5`` -> 1e-05, ``true`` / ``false`` -> bool, anything else the text."""
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _hf(spec: str, rest: str) -> SpecForm:
    family, sep, query = rest.partition("?")
    if family not in HF_FAMILIES:
        raise bad_spec(spec, f"unknown family {family!r}", f"use one of hf:{', hf:'.join(HF_FAMILIES)}")
    overrides: dict[str, Any] = {}
    given: dict[str, str] = {}  # config key (attribute_map resolved) -> the name as written
    for part in query.split(",") if sep else []:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.isidentifier() or not value:
            raise bad_spec(spec, f"{part!r} is not KEY=VALUE",
                           f"write hf:{family}?KEY=VALUE,... (e.g. hf:gpt2?n_layer=4,n_embd=128)")
        size = _value(value)
        if (key in HF_SIZE_KEYS or key in HF_SIZE_NAMES) and (type(size) is not int or size < 1):
            raise bad_spec(spec, f"{key}={value} is not a size (a whole number >= 1)",
                           "change the override")
        named = key
        if key in HF_SIZE_NAMES:
            if family not in HF_SIZE_NAMES[key]:
                raise bad_spec(spec, f"hf:{family} has no size {key}", "use one of " + ", ".join(
                    n for n, keys in HF_SIZE_NAMES.items() if family in keys))
            key = HF_SIZE_NAMES[key][family]
        canonical = HF_CONFIG_ALIASES[family].get(key, key)
        if canonical in given:
            first = given[canonical]
            raise bad_spec(spec, f"{key} is given twice" if first == named else
                           f"{first} and {named} both set {canonical}", "give each config key once")
        given[canonical] = named
        overrides[key] = size
    form = SpecForm(kind="hf", where=family, overrides=tuple(overrides.items()))
    sizes = hf_sizes(form)
    if sizes["heads"] % sizes["kv_heads"]:
        raise bad_spec(spec, f"heads {sizes['heads']} do not divide by kv_heads "
                       f"{sizes['kv_heads']} (each key / value head serves heads / kv_heads query "
                       "heads: transformers' LlamaAttention.num_key_value_groups, repeat_kv)",
                       "change the override")
    return form


def hf_sizes(form: SpecForm) -> dict[str, int]:
    """The sizes of the ``hf:`` model ``form`` names, by ``HF_SIZE_NAMES`` name, plus
    ``head_dim``: each override (by its name or its config key) over ``HF_TINY``, and the
    derived ones as tracer/hf.py and transformers derive them: ``kv_heads`` = heads (Llama:
    ours; GPT-2 has no grouped-query attention), ``ffn`` = 4 x hidden (GPT-2: GPT2MLP, when
    ``n_inner`` is None) or 2 x hidden (Llama: ours), ``head_dim`` = hidden // heads
    (GPT2Attention; LlamaConfig when ``head_dim`` is not given). Reads no config: the values of
    a well-formed form (``_hf`` checked each size is a whole number >= 1)."""
    family = form.where
    given = {HF_CONFIG_ALIASES[family].get(k, k): v for k, v in form.overrides}
    sizes = {}
    for name, keys in HF_SIZE_NAMES.items():
        key = keys.get(family)
        if key in given:
            sizes[name] = given[key]
        elif name in HF_TINY:
            sizes[name] = HF_TINY[name]
    sizes.setdefault("kv_heads", sizes["heads"])
    sizes.setdefault("ffn", (4 if family == "gpt2" else 2) * sizes["hidden"])
    sizes["head_dim"] = given.get("head_dim", sizes["hidden"] // sizes["heads"])
    return sizes


def hf_tp_refusal(spec: str, tp: int) -> str | None:
    """Why ``--tp tp`` cannot split the ``hf:`` model ``spec`` (its Llama TP plan, tracer/hf.py
    ``llama_tp_plan``: q / k / v / gate / up colwise, o / down rowwise), or None. Each rank must
    hold whole heads (LlamaAttention views its q / k / v outputs as [.., -1, head_dim], so a
    rank's local head count is its share of the projection's rows) and an equal share of the
    MLP: heads, kv_heads and ffn must divide by ``tp``. None for another family (GPT-2 has no TP
    plan: tracer/specload.py ``check_spec`` refuses it) or a spec that is not ``hf:``."""
    if not spec.startswith(HF_PREFIX):
        return None
    form = parse_spec(spec)
    if form.where != "llama":
        return None
    sizes = hf_sizes(form)
    for name in ("heads", "kv_heads", "ffn"):
        if sizes[name] % tp:
            return (f"must divide the model's {name} {sizes[name]} (the TP plan gives each rank "
                    f"{name} / T of q / k / v and gate / up / down)")
    return None


def parse_spec(spec: str) -> SpecForm:
    """The form of ``spec`` (module docstring). Raises ``SpecError`` (one line) for text that
    is none of the forms, an unknown ``hf:`` family, a malformed override or a size override
    that is not a whole number >= 1 (``HF_SIZE_KEYS``), a ``path/to/file.py:factory`` whose
    file does not exist, and a path (an existing file, or text with a ``/``) that is not a
    ``.py`` file (it would be read as a module name: "no module 'notpy'"). Reads no file,
    imports nothing."""
    if spec == REFERENCE:
        return SpecForm(kind="reference")
    if spec.startswith(HF_PREFIX):
        return _hf(spec, spec[len(HF_PREFIX):])
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise bad_spec(spec, "not a model spec", FORMS)
    if where.endswith(".py"):
        path = Path(where).expanduser()
        if not path.is_file():
            raise bad_spec(spec, f"no such file {path}", "pass the path of your .py file")
        return SpecForm(kind="file", where=where, factory=attr)
    if "/" in where or Path(where).expanduser().is_file():  # a path, which no module name is
        raise bad_spec(spec, f"{where} is not a .py file", "pass the path of your .py file "
                       "(path/to/file.py:factory) or package.module:factory")
    return SpecForm(kind="module", where=where, factory=attr)
