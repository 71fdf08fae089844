"""Every place ``--help`` and the tracer / CLI docstrings send a reader exists (issue 42): a docs
path names a file, a quoted section a heading of that file, an ``#anchor`` a heading's slug.

Read: docs/cli.md (every command's ``--help`` as printed: tests/test_docs.py keeps it current),
tracer/*.py and analyzer/cli/*.py. Forms: ``docs/x.md`` or ``README`` (README.md) or any
``NAME.md``, optionally followed by ``"Section"`` (a heading that starts with it, after its
``#`` marks) or ``#anchor``."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_docs import anchors

REPO = Path(__file__).resolve().parents[2]
SOURCES = [REPO / "docs" / "cli.md", *sorted((REPO / "tracer").glob("*.py")),
           *sorted((REPO / "analyzer").rglob("*.py")), *sorted((REPO / "reports").glob("*.py"))]
POINTER = re.compile(r'(?<![\w/.-])(README(?:\.md)?|(?:[\w-]+/)*[\w-]+\.md)(#[\w-]+)?'
                     r'(?:[ ,(]*"([^"\n]{2,80})")?')
EXCEPT = {"report.md", "doc/PERFORMANCE.md"}
"""Names of outputs or of other projects' files, not docs here (``analyzer report`` writes
report.md; doc/PERFORMANCE.md is nccl-tests')."""


def _target(source: Path, name: str) -> Path | None:
    """The file a pointer names: README -> README.md at the root; a path relative to the
    repository, to docs/, or (docs/cli.md's links) to the source's folder."""
    name = "README.md" if name == "README" else name
    for base in (REPO, REPO / "docs", source.parent):
        if (base / name).is_file():
            return base / name
    return None


def _headings(path: Path) -> list[str]:
    """Its headings, and the bold or italic words that open a paragraph or a list item (the
    docs name a rule's paragraph so: ``**Tolerances of the training setup**``)."""
    text = path.read_text()
    return [m.group(1).strip() for m in re.finditer(r"^#{1,6} (.+?)\s*$", text, re.M)] + [
        m.group(1).strip() for m in re.finditer(r"^(?:- )?[*_]{1,2}([^*_\n]+)[*_]{1,2}", text, re.M)]


def pointers() -> list[tuple[Path, str, str | None, str | None]]:
    """(source, file named, #anchor or None, quoted section or None) of every pointer."""
    out = []
    for source in SOURCES:
        text = re.sub(r"\s+", " ", source.read_text())  # help text wraps across lines
        for m in POINTER.finditer(text):
            if m.group(1) not in EXCEPT:
                out.append((source, m.group(1), m.group(2), m.group(3)))
    return out


def test_help_and_docstrings_point_at_files_and_sections_that_exist():
    found = pointers()
    assert len(found) >= 8  # the help's docs links, the docstrings' sections: the scan works
    missing = []
    for source, name, anchor, section in found:
        where = f"{source.relative_to(REPO)}: {name}{anchor or ''}{f' {section!r}' if section else ''}"
        target = _target(source, name)
        if target is None:
            missing.append(f"{where}: no such file")
        elif anchor and anchor[1:] not in anchors(target):
            missing.append(f"{where}: no such heading")
        elif section and not any(h.startswith(section) for h in _headings(target)):
            missing.append(f"{where}: no heading {section!r}")
    assert missing == []


def test_help_and_docstrings_name_source_files_that_exist():
    named = {m.group(0) for source in SOURCES for m in re.finditer(
        r"(?<![\w/.-])(?:tracer|analyzer|reports|scripts|tests|examples)/[\w/]+\.py", source.read_text())}
    assert len(named) >= 10
    assert sorted(n for n in named if not (REPO / n).is_file()) == []
