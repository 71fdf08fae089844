"""The user docs: every relative link resolves, and the generated references are up to date.

README.md, docs/**/*.md, bench/RESULTS.md and ARCHITECTURE.md: each relative link names a file
that exists, and its ``#anchor`` a heading of the target (GitHub's slug rule). docs/cli.md is
what scripts/cli_reference.py generates from the commands' ``--help`` now, and that is what
``--help`` prints; docs/report-reference.md is what scripts/report_reference.py generates from
the contract, with a meaning for every field.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import cli_reference  # noqa: E402
import report_reference  # noqa: E402

DOCS = sorted([REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "bench" / "RESULTS.md",
               *(REPO / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^()\s]+)\)")


def _strip_code(text: str) -> str:
    """The text without fenced blocks and inline code (a link shown as code is not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation other than - and _
    dropped, each space a -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())  # a link: its text
    text = text.replace("`", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's slug in a Markdown file, repeated ones numbered as GitHub does (-1, -2)."""
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    for line in text.splitlines():
        m = re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        out.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return out


def links(path: Path) -> list[str]:
    return [t for t in LINK.findall(_strip_code(path.read_text()))
            if not re.match(r"[a-z][a-z0-9+.-]*:", t)]  # https:, mailto: ...


def test_slug_follows_githubs_rule():
    assert slug("Reading the report") == "reading-the-report"
    assert slug("`tracer record`: what it does") == "tracer-record-what-it-does"
    assert slug("How to: HSDP, FSDP2 + TP") == "how-to-hsdp-fsdp2--tp"
    assert slug("Beyond one machine (Dask)") == "beyond-one-machine-dask"


def test_link_check_finds_a_broken_link(tmp_path):
    (tmp_path / "a.md").write_text("# Top\n\n[ok](#top) [bad](b.md) [anchor](a.md#nowhere)\n")
    found = links(tmp_path / "a.md")
    assert found == ["#top", "b.md", "a.md#nowhere"]
    assert "nowhere" not in anchors(tmp_path / "a.md") and "top" in anchors(tmp_path / "a.md")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(doc):
    broken = []
    for target in links(doc):
        file, _, anchor = target.partition("#")
        dest = (doc.parent / file).resolve() if file else doc
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(REPO)}")
    assert not broken, broken


def test_readme_is_short_and_keeps_the_two_commands():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert ("python3 -m pip install torch==2.13.0 -e '.[record]' && tracer record --strategy all "
            "&& analyzer report traces/") in text
    assert "python3 -m pip install torch==2.13.0 -e '.[record,hta,dev,hf]' && python3 -m pytest -q" in text
    ci = (REPO / ".ci" / "run").read_text()
    assert "torch==2.13.0 -e '.[record,hta,dev,hf]'" in ci and "\npython3 -m pytest -q" in ci  # the same


def test_cli_reference_is_what_the_script_generates():
    assert (REPO / "docs" / "cli.md").read_text() == cli_reference.render(), \
        "docs/cli.md is out of date: run PYTHONPATH=. python3 scripts/cli_reference.py"


@pytest.mark.integration
@pytest.mark.parametrize("argv", [["tracer", "record"], ["analyzer", "report"], ["analyzer", "gate"]])
def test_cli_reference_is_what_help_prints(argv):
    """In an 80-column terminal, as a user runs it (the prog name aside: ``python -m X``)."""
    proc = subprocess.run([sys.executable, "-m", argv[0], *argv[1:], "--help"], cwd=REPO,
                          capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": str(cli_reference.WIDTH),
                               "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    printed = proc.stdout.replace(f"python -m {argv[0]}", argv[0], 1)
    pages = dict(cli_reference.pages())
    assert pages[" ".join(argv) + " --help"] + "\n" == printed  # click.echo adds the newline


def test_report_reference_is_generated_and_documents_every_field():
    assert (REPO / "docs" / "report-reference.md").read_text() == report_reference.render(), \
        "docs/report-reference.md is out of date: run PYTHONPATH=. python3 scripts/report_reference.py"
    assert report_reference.undocumented() == []


def test_report_reference_lists_every_report_field():
    import typing

    import msgspec

    from analyzer.contract import report_types as rt
    text = (REPO / "docs" / "report-reference.md").read_text()
    seen, todo = set(), [rt.Report]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        section = text.split(f"\n## {cls.__name__}\n", 1)[1].split("\n## ", 1)[0]
        for name, hint in typing.get_type_hints(cls).items():
            if name in cls.__struct_fields__:
                assert f"| `{name}` |" in section, f"{cls.__name__}.{name}"
                todo += list(report_reference._structs(hint))
    assert all(issubclass(c, msgspec.Struct) for c in seen) and len(seen) > 30
