"""The report's layout (issue 20 item 4): a one-line decision first, then parity, memory,
communication; the single-device run shown as the reference, never ranked; one step-time
figure; one colour per strategy in every plot; communication split into transfer and waiting
on a real gloo DDP record."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal

import pytest

from analyzer.compare.runs import analyse
from analyzer.contract import strategies
from reports import html, markdown, palette
from reports.decision import DecisionInput, decision_line

NO_CI = "no confidence interval"  # any note: said in parentheses
from tests.inputs import cli, copy_run
from tests.reports.builders import build_root, decision, write_run

MS = 1_000_000


def test_decision_line_words_the_pair_with_its_interval():
    d = DecisionInput(best="fsdp2", other="ddp", ratio=1.31, ci_low=1.18, ci_high=1.45,
                      verdict="faster", memory_ratio=0.62)
    assert decision_line(d) == ("fsdp2: 1.31x faster than ddp [1.18, 1.45], 38 % less memory "
                                "per rank; numerics match one device.")
    d = DecisionInput(best="ddp", other="fsdp", ratio=1.03, ci_low=0.97, ci_high=1.10,
                      verdict="within noise", memory_ratio=1.25, vs_reference=0.5)
    assert decision_line(d) == ("ddp vs fsdp: within noise at this sample size (1.03x "
                                "[0.97, 1.10]), 25 % more memory per rank, 0.50x the "
                                "single-device speed; numerics match one device.")
    d = DecisionInput(best="ddp", other="fsdp", ratio=1.6, verdict="faster", note=NO_CI,
                      parity="match recorded reference")
    assert decision_line(d) == (f"ddp: 1.60x faster than fsdp ({NO_CI}); numerics match the "
                                "reference values recorded with them (no single-device run "
                                "here).")
    assert decision_line(DecisionInput(best="ddp")) == (
        "ddp: the only distributed strategy in this report; numerics match one device.")
    assert decision_line(DecisionInput(best=None, parity="fail", withheld="ddp failed")) == \
        "No decision: ddp failed."


def _sections(text: str, tag: str) -> list[str]:
    return re.findall(rf"^{tag}(.+?)$" if tag == "## " else rf"<h2>(.+?)</h2>", text, re.M)


def test_decision_first_then_parity_memory_communication(tmp_path):
    root = build_root(tmp_path / "t")
    rep = analyse(root)
    md = markdown.render(rep)
    assert md.splitlines()[2].startswith("**Decision:** ddp vs fsdp2: within noise")
    order = ["Parity", "Memory per rank", "Communication", "Ranking by step time"]
    assert [s for s in _sections(md, "## ") if s in order] == order
    page = html.render(rep)
    assert [s for s in _sections(page, "h2") if s in order] == order
    assert page.index('class="decision"') < page.index("<h2>")
    assert "Decision: ddp vs fsdp2: within noise" in page
    # the terminal prints report.md: the decision is its first line after the title
    proc = cli("report", str(root), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert decision(proc.stdout) == decision(md)


def test_reference_is_shown_and_never_ranked(tmp_path):
    # single is the fastest (5 ms) of the three: it is still not ranked first
    root = tmp_path / "t"
    write_run(root / "single", strategy="single", walls={0: (1,), 1: (5 * MS,), 2: (5 * MS,)})
    write_run(root / "ddp", strategy="ddp", walls={0: (1, 1), 1: (7 * MS, 6 * MS), 2: (7 * MS, 7 * MS)})
    write_run(root / "fsdp2", strategy="fsdp2", walls={0: (1, 1), 1: (9 * MS, 9 * MS), 2: (9 * MS, 9 * MS)})
    rep = analyse(root)
    heads, rows = markdown.ranking_rows(rep)
    assert [(r[0], r[1]) for r in rows] == [("1", "ddp"), ("2", "fsdp2"), ("reference", "single")]
    assert rows[2][heads.index("median step time")] == "5.00 ms"
    md = markdown.render(rep)
    assert "| reference | single | single | reference | 5.00 ms | 1.00x |" in md
    assert "Fastest: ddp" in md and "Reference (not ranked): single" in md
    assert decision(md).startswith("ddp vs fsdp2:") and "0.71x the single-device speed" in decision(md)
    page = html.render(rep)
    assert "single (reference)" in page  # the step-time plot's label
    assert "1. ddp" in page and "1. single" not in page


def test_one_step_time_figure_is_shown(tmp_path):
    rep = analyse(build_root(tmp_path / "t"))
    ddp = {r.name: r for r in rep.runs}["ddp"]
    # ddp's profiled steps: slowest rank 6 and 8 ms -> median 7 ms, p90 7.8 ms, min 6, max 8
    assert (ddp.step_time_ns.median, ddp.step_time_ns.p90) == (7 * MS, pytest.approx(7.8 * MS))
    md, page = markdown.render(rep), html.render(rep)
    for text in (md, page):
        assert "7.00 ms" in text and "7.80 ms" not in text  # the median, never the p90
        assert "Step time, the one step-time figure of this report" in text
    assert "median step time" in md and "| median step |" not in md


def test_real_record_has_no_second_step_figure(ddp_run, tmp_path):
    rep = analyse(copy_run(ddp_run, tmp_path / "ddp"))
    run = rep.runs[0]
    md = markdown.render(rep)
    # a finding may cite a rank's traced step as evidence, named so ("rank 1's traced step")
    unnamed = "\n".join(re.sub(r"traced step[^,;]*? \d+\.\d\d ms", "", ln) for ln in md.splitlines())
    shown = {m.group(0) for m in re.finditer(r"\d+\.\d\d ms", unnamed)}
    traced = {f"{k.step_ns / 1e6:.2f} ms" for k in run.ranks} - {
        f"{v / 1e6:.2f} ms" for k in run.ranks for v in (k.compute_ns, k.comm_ns, k.exposed_comm_ns,
                                                        k.other_ns, k.idle_ns, k.data_wait_ns)}
    assert f"{run.step_time_ns.median / 1e6:.2f} ms" in shown
    assert not traced & shown - {f"{run.step_time_ns.median / 1e6:.2f} ms"}, traced & shown


def _fills(page: str) -> list[tuple[str, str]]:
    """(title text, fill) of every plotted rect that names what it shows."""
    return re.findall(r'<rect [^>]*fill="(#[0-9a-f]{6})"[^>]*><title>([^<]*)</title>', page)


def test_every_plot_colours_a_run_by_its_strategy(ddp_run, fsdp_run, tmp_path):
    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    copy_run(fsdp_run, root / "fsdp")
    rep = analyse(root)
    page = html.render(rep)
    fills = _fills(page)
    seen = {title.split(" ")[0] for _, title in fills}
    assert {"ddp", "fsdp"} <= seen, seen
    for fill, title in fills:
        run = title.split(" ")[0]
        if run in ("ddp", "fsdp"):
            assert fill == palette.strategy_color(run), (title, fill)
    # the loss curves too: each run's line in its strategy colour
    for name in ("ddp", "fsdp"):
        assert re.search(rf'stroke="{palette.strategy_color(name)}"[^>]*><title>{name} loss', page)
    # no other hue anywhere: every fill is a run's strategy colour or the shade swatch
    assert set(re.findall(r'fill="(#[0-9a-f]{6})"', page)) == {
        palette.strategy_color("ddp"), palette.strategy_color("fsdp"), palette.SHADE_SWATCH}
    # a colour means one strategy: no two strategies share one, none is the swatch
    colors = [*(s.colour for s in strategies.TABLE.values()), *palette.OTHER_COLORS, palette.SHADE_SWATCH]
    assert len(set(colors)) == len(colors)


def _gloo_durations_ns(run_dir) -> dict[tuple[int, str], int]:
    """Sum of the gloo work's durations per (rank, kind), read from the trace files with
    exact decimal arithmetic (not the analyzer): the communication time of a CPU rank."""
    out: dict[tuple[int, str], int] = {}
    for path in sorted(run_dir.glob("rank*.trace.json")) + sorted(run_dir.glob("rank*.trace.json.gz")):
        raw = path.read_bytes()
        data = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw,
                          parse_float=Decimal)
        rank = data["distributedInfo"]["rank"]
        for ev in data["traceEvents"]:
            if ev.get("ph") == "X" and str(ev.get("name", "")).startswith("gloo:"):
                key = (rank, ev["name"].split(":", 1)[1])
                out[key] = out.get(key, 0) + int(Decimal(ev["dur"]) * 1000)
    return out


def test_wait_plus_transfer_is_the_comm_time_on_a_recorded_ddp_run(ddp_run, tmp_path):
    run_dir = copy_run(ddp_run, tmp_path / "ddp")
    run = analyse(run_dir).runs[0]
    want = _gloo_durations_ns(run_dir)
    got = {(c.rank, c.kind): c for c in run.comm_ranks}
    assert set(got) == set(want) and {r for r, _ in got} == {0, 1}
    for key, c in got.items():  # instances outside the one-instance bound: not measured
        assert c.measured + c.inconsistent + c.unmatched == c.count
        if not c.measured:  # a loaded machine can leave a clock not measured: none split
            assert c.wait_ns is None and c.transfer_ns is None
            assert c.not_measured_ns == c.time_ns == want[key], key
            continue
        assert c.wait_ns + c.transfer_ns + c.not_measured_ns == c.time_ns == want[key], key
        assert c.wait_ns >= 0 and c.transfer_ns >= 0
    # per kind, the per-rank means add up too, and when every instance is measured busbw
    # from transfer is at least the one over whole durations (same bytes, less time)
    for kind, k in run.communication.items():
        moved = (k.wait_ns or 0) + (k.transfer_ns or 0)
        assert moved + k.not_measured_ns == pytest.approx(k.time_ns, abs=1)
        if not k.not_measured_ns:
            assert k.transfer_busbw_gbps >= k.busbw_gbps
    md = markdown.render(analyse(run_dir))
    c = got[0, "all_reduce"]
    if not c.measured:
        return
    assert f"| ddp | 0 | all_reduce | {c.time_ns_per_step / 1e6:.2f} ms | " \
           f"{c.transfer_ns_per_step / 1e6:.2f} ms | {c.wait_ns_per_step / 1e6:.2f} ms |" in md
