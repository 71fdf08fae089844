"""How a first divergence is named in text (analyzer/parity.py finds it).

Kept apart from parity.py, which imports pandas: the report renderers use it too, and a cached
report renders without importing pandas (reports/cache.py)."""

from __future__ import annotations

from typing import Any


def divergence_subject(div: dict[str, Any]) -> str:
    """What diverged, named once: ``grad layers.0.attn.weight``, or ``the loss`` for the loss
    (its kind and tensor are both "loss": "loss loss" read as a typo). ``div`` is a
    ``first_divergence`` dict (parity.py or report.json)."""
    if div["kind"] == "loss":
        return "the loss"
    return f"{div['kind']} {div['tensor']}"
