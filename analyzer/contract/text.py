"""Characters of a trace, manifest or path that must not reach a reader as they are.

Bidirectional formatting controls (Unicode UAX #9: U+202A..U+202E embeddings and overrides,
U+2066..U+2069 isolates, U+200E / U+200F / U+061C marks) reorder the text around them when it is
displayed: a run or kernel name holding U+202E shows its neighbours backwards in a terminal, a
Markdown viewer or a browser (the "Trojan Source" class, CVE-2021-42574). Every renderer
(reports/markdown.py, reports/html.py, analyzer/cli/richout.py) shows each one as its escape,
``\\u202e``, so the reader sees that it is there and what it is, and the text keeps its order.
"""

from __future__ import annotations

import re

BIDI_CONTROLS = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
"""The bidirectional formatting characters of UAX #9 (module docstring)."""


def show_bidi(text: str) -> str:
    """``text`` with every ``BIDI_CONTROLS`` character written as its ``\\uXXXX`` escape."""
    return BIDI_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")


def one_line(text: str) -> str:
    """``text`` as one terminal line: newlines shown as ``\\n`` (and ``\\r``), other C0/C1
    controls dropped, bidirectional controls shown as their escape (``show_bidi``); for the
    lines the tracer prints around a run name (analyzer/cli/richout.py ``clean`` does the same
    for the analyzer)."""
    s = show_bidi(text).replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")
    return _CONTROLS.sub("", s.replace("\t", " "))
