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
