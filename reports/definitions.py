"""Definitions and rules, written once (issue 28): report.md gathers every one a table cites in
its closing "How each figure is measured" part and links each table to its entries (Markdown
anchors); report.html puts them behind a ``<details>`` disclosure under the table.

The texts live beside the tables they define (reports/markdown.py, notes.py, memory.py,
pipeline.py); this module only names them (``Definition``), makes their anchors (``slug``, the
rule GitHub applies to a heading) and keeps the order a report cites them in (``Cited``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PART = "How each figure is measured"
"""The heading of report.md's closing part."""


def slug(title: str) -> str:
    """A heading's anchor as GitHub (and most Markdown renderers) make it: lower case, every
    character that is not a letter, digit, ``-``, ``_`` or space dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@dataclass(frozen=True, slots=True)
class Definition:
    """One entry of the part: a ``title`` (its heading, so its anchor) and its paragraphs,
    plain text; ``raw``: written into report.md as is (the text is already Markdown-safe and
    tests read it verbatim), else through ``markdown.escape``."""

    title: str
    paragraphs: tuple[str, ...]
    raw: bool = False

    @property
    def anchor(self) -> str:
        return slug(self.title)


def define(title: str, *paragraphs: str, raw: bool = False) -> Definition:
    """A ``Definition`` of the non-empty ``paragraphs``."""
    return Definition(title, tuple(p for p in paragraphs if p), raw)


@dataclass(slots=True)
class Cited:
    """The definitions one rendering cites, in first-cited order, each once (a title cited
    twice keeps its first text)."""

    entries: dict[str, Definition] = field(default_factory=dict)

    def cite(self, *defs: Definition) -> list[Definition]:
        """Record ``defs``; returns them (the ones a table links to)."""
        for d in defs:
            self.entries.setdefault(d.title, d)
        return list(defs)

    def __iter__(self):
        return iter(self.entries.values())
