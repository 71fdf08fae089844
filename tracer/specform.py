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
HF_SIZE_KEYS = ("n_layer", "n_embd", "n_head", "n_positions", "n_inner", "num_hidden_layers",
                "hidden_size", "intermediate_size", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "max_position_embeddings", "head_dim")
"""``hf:`` config keys that are sizes (counts of layers, heads, features, tokens) of GPT2Config
or LlamaConfig (and their aliases, ``attribute_map``): a whole number >= 1. Checked here, before
torch: transformers takes ``n_layer=0`` (a model of no blocks) and ``n_layer=-1`` alike."""
FORMS = ("use reference, hf:gpt2, hf:llama (resized: hf:gpt2?n_layer=4,n_embd=128), "
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
    for part in query.split(",") if sep else []:
        key, eq, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not key.isidentifier() or not value:
            raise bad_spec(spec, f"{part!r} is not KEY=VALUE",
                           f"write hf:{family}?KEY=VALUE,... (e.g. hf:gpt2?n_layer=4,n_embd=128)")
        if key in overrides:
            raise bad_spec(spec, f"{key} is given twice", "give each config key once")
        overrides[key] = _value(value)
        size = overrides[key]
        if key in HF_SIZE_KEYS and (type(size) is not int or size < 1):
            raise bad_spec(spec, f"{key}={value} is not a size (a whole number >= 1)",
                           "change the override")
    return SpecForm(kind="hf", where=family, overrides=tuple(overrides.items()))


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
