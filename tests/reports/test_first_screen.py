"""The report's layout of issue 28: the decision and the top findings by severity on the first
screen (report.md's first 25 lines, report.html's first 1400x900), every definition written
once in "How each figure is measured" (report.md) or behind a disclosure (report.html) and
linked from its table; the pictures of report.html."""

from __future__ import annotations

import re

import msgspec
import pytest

from analyzer.compare.runs import analyse
from reports import definitions, findings as findings_text, html, markdown, notes, palette
from reports import memory as memory_section
from tests.inputs import copy_run
from tests.reports import geometry
from tests.reports.builders import FINDING_LINES, build_root, details, findings

MS = 1_000_000


@pytest.fixture
def report(tmp_path):
    """The hand-built root (tests/reports/builders.py) carrying the hand-built findings."""
    return msgspec.structs.replace(analyse(build_root(tmp_path / "t")), findings=findings())


def test_first_25_lines_hold_the_decision_and_the_findings_by_severity(report):
    md = markdown.render(report)
    head = md.splitlines()[:25]
    assert head[2].startswith("**Decision:** ddp vs fsdp2: within noise")
    shown = [line for line in head if re.match(r"\d+\. ", line)]
    # those with a cause or a try, by severity; the one without either is counted, not shown
    acted = [FINDING_LINES[i] for i in (0, 1, 3)]
    assert shown == [f"{i}. {markdown.escape(x)}" for i, x in enumerate(acted, 1)]
    assert head[head.index(shown[-1]) + 2] == (
        "Also 1 observation without an established cause (largest: low busbw in fsdp2, 0.20 "
        "ms/step at stake): [Findings in full](#findings-in-full).")
    assert head[head.index(shown[0]) - 2].startswith("Findings to act on, most step time at "
                                                     "stake first (3 of 4 have a cause ")
    verdict_at = max(i for i, line in enumerate(head) if line.startswith("- "))
    assert head.index(shown[0]) < verdict_at
    assert not any(line.startswith("## ") for line in md.splitlines()[:head.index(shown[-1])])
    assert "Fastest: ddp" in details(md)  # the verdict's details follow the findings


def test_a_cause_is_named_only_at_the_threshold(report):
    f = findings()[0]
    assert findings_text.cause(f) == "cause not established"  # explains 70 %
    f = msgspec.structs.replace(f, explained_frac=0.8)
    assert findings_text.cause(f) == "cause: bucket too large (explains 80.0 %)"
    assert findings_text.cause(msgspec.structs.replace(f, cause=None)) == "cause not established"


def test_more_findings_than_the_first_screen_holds_are_listed_in_full(report):
    many = [msgspec.structs.replace(findings()[1], severity_ns=float(k * MS), title=f"f{k}")
            for k in range(1, 12)]
    md = markdown.render(msgspec.structs.replace(report, findings=many))
    head = md.splitlines()[:25]
    numbered = [line for line in head if re.match(r"\d+\. ", line)]
    assert len(numbered) == findings_text.TOP == 3 and "f11" in numbered[0]
    assert head[head.index(numbered[-1]) + 2] == ("Also 8 more with a cause or a try: "
                                                  "[Findings in full](#findings-in-full).")
    full = md[md.index("## Findings in full"):md.index("## " + definitions.PART)]
    assert full.count("all\\_to\\_all waits") == 0 and "f1;" in full  # every finding, escaped titles
    assert "late = 4.20 ms: report.json /runs/1/stragglers/0/late_ns" in full
    assert "rule: host delay &gt;= 80 % of the lateness, explains 86.0 %" in full


def test_no_findings_says_so_in_one_line(tmp_path):
    md = markdown.render(analyse(build_root(tmp_path / "t")))
    lines = md.splitlines()
    assert lines[4] == "**Context:**"  # then the findings' one line, after the context list
    assert lines[lines.index("", 6) + 1] == "Findings: none drawn from these figures."
    assert "## Findings in full" not in md


def _anchors(md: str) -> list[str]:
    """The anchors of report.md's headings (GitHub's rule, ``definitions.slug``)."""
    return [definitions.slug(m) for m in re.findall(r"^#+ (.+)$", md, re.M)]


def test_every_definition_is_written_once_at_the_end_and_linked(report, ddp_run, fsdp_run, tmp_path):
    copy_run(ddp_run, tmp_path / "traces" / "ddp")
    copy_run(fsdp_run, tmp_path / "traces" / "fsdp")
    for rep in (report, analyse(tmp_path / "traces")):
        md = markdown.render(rep)
        part = md.index("## " + definitions.PART)
        anchors = _anchors(md)
        assert len(anchors) == len(set(anchors))  # no heading shadows another's anchor
        links = re.findall(r"\]\(#([^)]+)\)", md)
        assert links and set(links) <= set(anchors)
        defs = markdown.definitions(rep)
        cited = {d.anchor for d in defs.values()} & set(links)
        for d in defs.values():
            if d.anchor not in cited:
                continue
            for p in d.paragraphs:
                text = p if d.raw else markdown.escape(p)
                assert md.count(text) == 1 and md.index(text) > part, d.title
        # the paragraphs that used to follow the tables: none is left before the part
        for text in (markdown.PARITY_RULE, markdown.SPLIT_NOTE, notes.STEP_TIME,
                     memory_section.RSS_NOTE):
            assert markdown.escape(text) in md[part:] and markdown.escape(text) not in md[:part]


def test_html_puts_each_tables_definitions_behind_a_disclosure(report):
    page = html.render(report)
    boxes = re.findall(r'<details class="measured"><summary>(.*?)</summary>(.*?)</details>', page)
    assert boxes
    inside = " ".join(body for _, body in boxes)
    for text in (markdown.PARITY_RULE, markdown.LOSS_NOTE, markdown.SPLIT_NOTE, notes.STEP_TIME,
                 notes.CLOCK_OFFSET, memory_section.RSS_NOTE):
        assert html.e(text) in inside and page.count(html.e(text)) == 1
    assert "How it is measured: Parity rule" in boxes[0][0]


def test_html_first_screen_is_decision_then_findings(report):
    page = html.render(report)
    assert page.index('id="decision"') < page.index('id="findings"') < page.index("<h2>")
    items = re.findall(r"<li>(.*?)</li>", page[page.index('id="findings"'):page.index("</section>", page.index('id="findings"'))])
    assert items == [html.e(FINDING_LINES[i]) for i in (0, 1, 3)]
    assert page.index('id="decision"') < page.index('id="context"') < page.index('id="findings"')


def test_gaps_are_the_step_minus_the_busy_union():
    assert html._gaps([(2, 4), (3, 6), (8, 9)], 0, 10) == [(0, 2), (6, 8), (9, 10)]
    assert html._gaps([], 0, 5) == [(0, 5)]
    assert html._gaps([(0, 5)], 0, 5) == []


def test_rank_timelines_put_every_rank_of_one_step_on_aligned_clocks(ddp_run, tmp_path):
    run = analyse(copy_run(ddp_run, tmp_path / "ddp")).runs[0]
    tls = run.rank_timelines
    assert [t.rank for t in tls] == [0, 1] and {t.step for t in tls} == {run.timeline.step}
    assert min(t.start_ns for t in tls) == 0
    assert tls[0].intervals == run.timeline.intervals  # rank 0's is the one timeline shown
    for t in tls:
        assert all(0 <= i.start_ns <= i.end_ns <= t.step_ns for i in t.intervals)
    svg = html.timeline_svg(run, palette.strategy_color("ddp"))
    for t in tls:  # every rank's compute, its collectives by kind, its idle time
        assert f"ddp rank {t.rank} compute " in svg and f"ddp rank {t.rank} idle " in svg
        for kind in {i.kind for i in t.intervals if i.lane == "comm"}:
            assert f"ddp rank {t.rank} {kind} " in svg


def test_every_plot_has_a_size_and_the_breakdown_adds_up(report, ddp_run, tmp_path):
    rep = analyse(copy_run(ddp_run, tmp_path / "ddp"))
    page = html.render(rep)
    svgs = re.findall(r"<svg [^>]*>", page)
    assert len(svgs) >= 5  # loss, memory, RSS, step time, breakdown, steps, timeline ...
    for tag in svgs:
        w, h = (float(re.search(rf'{a}="([\d.]+)"', tag).group(1)) for a in ("width", "height"))
        assert w > 0 and h > 0 and 'class="plot' in tag
    bars = html.breakdown_bars(rep)
    run = rep.runs[0]
    parts = [sum(getattr(k, c) for k in run.ranks) / len(run.ranks) / 1e6 for c in html.LABELS]
    for label, v in zip(html.LABELS.values(), parts):  # a part of no time draws no segment
        assert (f"ddp {label}: {v:.3f} ms" in bars) == (v > 0), label
    step = sum(k.step_ns for k in run.ranks) / len(run.ranks) / 1e6
    assert sum(parts) == pytest.approx(step, rel=1e-9)  # the identity: parts = traced step


GOOD = {"viewport": [1400, 900],
        "decision": {"x": 32, "y": 70, "width": 1200, "height": 60},
        "findings": {"x": 32, "y": 140, "width": 1200, "height": 200},
        "finding_items": [{"x": 60, "y": 170 + 24 * i, "width": 1100, "height": 20}
                          for i in range(4)],
        "plots": [{"title": "loss per step", "rect": {"x": 32, "y": 2000, "width": 900,
                                                       "height": 260}}]}


def test_geometry_check_on_hand_made_dumps():
    assert geometry.problems(GOOD, plots=1) == []
    low = {**GOOD, "finding_items": GOOD["finding_items"] + [
        {"x": 60, "y": 890, "width": 1100, "height": 20}]}
    assert geometry.problems(low, plots=1) == [
        "finding 5 not wholly in the first viewport: "
        "{'x': 60, 'y': 890, 'width': 1100, 'height': 20}"]
    flat = {**GOOD, "plots": [{"title": "t", "rect": {"x": 0, "y": 0, "width": 900, "height": 0}}]}
    assert geometry.problems(flat, plots=1) == [
        "plot drawn with zero size: 't' {'x': 0, 'y': 0, 'width': 900, 'height': 0}"]
    assert geometry.problems({**GOOD, "decision": None}, plots=2) == [
        "decision not wholly in the first 1400x900 viewport: None", "1 plots drawn, the page has 2"]
    assert geometry.problems({**GOOD, "viewport": [1200, 2000]}, plots=1) == [
        "viewport [1200, 2000] is not 1400 wide"]
    assert geometry.problems({**GOOD, "viewport": [1400, 757]}, plots=1) == []


def test_geometry_reads_back_from_a_dumped_dom(report):
    page = geometry.instrument(html.render(report))
    assert page.count("<script>") == 1 and page.index("<script>") > page.index('id="findings"')
    dom = (f'<html><body><p>x</p><pre id="{geometry.GEOMETRY_ID}">'
           '{"viewport":[1400,900],"plots":[{"title":"a &amp; b","rect":null}]}</pre></body></html>')
    assert geometry.geometry_from_dom(dom) == {"viewport": [1400, 900],
                                               "plots": [{"title": "a & b", "rect": None}]}
    with pytest.raises(ValueError, match="did not run"):
        geometry.geometry_from_dom("<html></html>")
