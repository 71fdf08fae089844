"""`analyzer summary`: tables, JSON output, typed errors -> exit 2, HTA cross-check."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from analyzer.cli.app import app
from tests.analyzer.helpers import corpus, link_folder

runner = CliRunner()


def test_summary_json_matches_library(tmp_path, fixture_copy):
    p = fixture_copy("gpu_rules.json")
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["summary", str(p), "--format", "json", "--output", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    (row,) = data["breakdown"]
    # device window [20,120) (test_rules.test_gpu_rules_breakdown)
    assert (row["step_ns"], row["overlap_ns"], row["idle_ns"]) == (100_000, 15_000, 10_000)
    assert {k["kind"] for k in data["by_kind"]} == {"all_gather", "all_to_all", "reduce_scatter"}
    assert "1 of 2 ranks" in data["headline"][0] and "distributedInfo" in data["headline"][0]


@pytest.mark.integration
def test_summary_table_partial_and_whole_trace(tmp_path):
    files = sorted(corpus("tbplugin_2rank").glob("nccl__worker*.json"))
    res = runner.invoke(app, ["summary", str(link_folder(tmp_path / "nccl", files[:1]))])
    assert res.exit_code == 0, res.output
    assert "1 of 1 ranks, rank from single file" in res.output
    assert "whole-trace mode" in res.output
    assert "Per rank and step" in res.output


def test_summary_bad_input_exit_2(tmp_path):
    (tmp_path / "x.json").write_text('{"traceEvents": [')
    res = runner.invoke(app, ["summary", str(tmp_path / "x.json")])
    assert res.exit_code == 2
    assert "truncated" in res.output and "Traceback" not in res.output


@pytest.mark.integration
def test_summary_crosscheck_hta():
    pytest.importorskip("hta", reason="HolisticTraceAnalysis not installed")
    res = runner.invoke(app, ["summary", str(corpus("dlrm_ddp_8rank_v100")), "--format", "json",
                              "--crosscheck", "hta"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    rows = data["crosscheck_hta"]
    assert [r["hta_overlap_pct"] for r in rows] == [4.50, 2.47, 7.88, 3.31, 0.56, 0.64, 7.56, 9.51]
    assert all(abs(r["diff_pct"]) <= 0.005 + 1e-9 for r in rows)


def test_summary_tables_write_bandwidth_as_gb_per_s_and_fit_80_columns(fixture_copy):
    """Every bandwidth header says GB/s (never gbps), and the tables fit an 80-column terminal
    (no table line longer than 80; prose notes are left to the terminal to wrap)."""
    import os

    env = dict(os.environ, COLUMNS="80")
    res = runner.invoke(app, ["summary", str(fixture_copy("gpu_rules.json"))], env=env)
    assert res.exit_code == 0, res.output
    assert "GB/s" in res.output and "gbps" not in res.output.lower()
    rows = [ln for ln in res.output.splitlines() if any(c in ln for c in "│─┃━")]
    assert rows and max(len(ln) for ln in rows) <= 80


def _busbw_job(folder):
    """Two gloo ranks, one all_reduce of 1,000,000 floats (4 MB) in one step: rank 0 starts it
    at 10 µs, rank 1 at 50 µs, both end at 90 µs (same clock). Exact answers, all_reduce on 2
    ranks (factor 2(n-1)/n = 1): whole durations 80 and 40 µs -> busbw 4e6 / 80e3 ns = 50 GB/s
    and 100 GB/s; transfer 40 µs on both (from the last start, 50 µs) -> 100 GB/s on both."""
    from tests.analyzer.helpers import write

    for rank, start in ((0, 10), (1, 50)):
        ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
               "ts": 0, "dur": 100},
              {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": 1, "tid": 1,
               "ts": start - 2, "dur": 1, "args": {"Process Group Name": "0", "Group size": 2}},
              {"ph": "X", "cat": "cpu_op", "name": "gloo:all_reduce", "pid": 1, "tid": 2,
               "ts": start, "dur": 90 - start,  # its shape as torch 2.13's gloo ops record it
               "args": {"Input type": ["float"], "Input Dims": [[1_000_000]]}}]
        write(folder / f"rank{rank}.trace.json",
              {"schemaVersion": 1, "traceEvents": ev,
               "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2}})
    return folder


def test_summary_names_each_busbw_by_the_time_it_divides_by(tmp_path):
    job = _busbw_job(tmp_path / "job")
    res = runner.invoke(app, ["summary", str(job), "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = {r["rank"]: r for r in json.loads(res.output)["by_kind"]}
    assert rows[0]["busbw_gbps"] == pytest.approx(50.0) and rows[1]["busbw_gbps"] == pytest.approx(100.0)
    assert [rows[r]["transfer_busbw_gbps"] for r in (0, 1)] == pytest.approx([100.0, 100.0])
    table = runner.invoke(app, ["summary", str(job)], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert "whole" in table.output and "transfer" in table.output
    assert "whole duration: the time is each collective's whole duration" in table.output


def test_summary_and_report_agree_on_busbw_from_transfer(tmp_path):
    """The report's run-level busbw from transfer = the ranks' bus bytes over their summed
    transfer time: 2 x 4e6 bytes / 80 µs = 100 GB/s, the summary's per-rank figure here."""
    from analyzer.compare.runs import analyse

    job = _busbw_job(tmp_path / "job")
    kind = analyse(job).runs[0].communication["all_reduce"]
    assert kind.transfer_busbw_gbps == pytest.approx(100.0)
    assert kind.busbw_gbps == pytest.approx(8e6 / 120e3)  # whole durations: 80 + 40 µs
