"""End to end: `tracer record` -> `analyzer report` / `analyzer gate`, and foreign traces.

Records are shared with the rest of the suite (tests/records.py: a clean `--strategy all`, one run
per fault canary), copied here before a report is written into them. Numbers are checked against values computed a second way
here (steps.parquet read directly) or published by another tool (corpus README, HTA).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from analyzer.contract import report_types
from tests.corpus import CORPUS, need
from tests.records import COMMITTED, committed, recorded

DLRM = CORPUS / "dlrm_ddp_8rank_v100"
pytestmark = pytest.mark.record


def cli(*args: str, check_rc: int | None = 0) -> subprocess.CompletedProcess:
    mod = "tracer" if args[0] == "tracer" else "analyzer"
    proc = subprocess.run([sys.executable, "-m", mod, *args[1:]], capture_output=True, text=True)
    if check_rc is not None:
        assert proc.returncode == check_rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="session")
def clean_root(tmp_path_factory) -> Path:
    """A copy of the shared tiny ``--strategy all`` record (the reports are written into it)."""
    root = tmp_path_factory.mktemp("clean") / "traces"
    shutil.copytree(recorded("tiny", tmp_path_factory), root)
    return root


FAULTS = {"skip-grad-sync": "ddp", "wrong-grad-scale": "fsdp", "unsynced-init": "fsdp2"}
"""Each fault canary on one strategy: tests.records names them ``<strategy>-<fault>``."""


@pytest.fixture(scope="session")
def canary_roots(tmp_path_factory) -> dict[str, Path]:
    """A copy of the shared record of each fault canary (the committed one where there is one)."""
    out = {}
    for fault, strategy in FAULTS.items():
        name = f"{strategy}-{fault}"
        src = committed(name) if name in COMMITTED else recorded(name, tmp_path_factory)
        out[fault] = tmp_path_factory.mktemp(fault) / "traces"
        shutil.copytree(src, out[fault])
    return out


def _report(root: Path, *extra: str) -> tuple[dict, str]:
    proc = cli("analyzer", "report", str(root), *extra)
    text = (root / "report" / "report.json").read_text()
    report_types.decode(text)  # report.json has the report's shape and types
    return json.loads(text), proc.stdout


def test_clean_record_is_ranked_and_passes_the_gate(clean_root):
    rep, stdout = _report(clean_root)
    assert stdout.startswith("# paritytrace report")
    assert "Parity: all 3 distributed run(s) match the single-device baseline" in stdout
    by = {r["name"]: r for r in rep["runs"]}
    assert set(by) == {"single", "ddp", "fsdp", "fsdp2"}
    assert {n: r["parity"]["status"] for n, r in by.items()} == {
        "single": "reference", "ddp": "pass", "fsdp": "pass", "fsdp2": "pass"}
    assert rep["ranking"]["status"] == "ranked" and rep["ranking"]["reference"] == "single"
    assert sorted(rep["ranking"]["order"]) == sorted(set(by) - {"single"})  # the reference: not ranked
    assert len(rep["ranking"]["pairs"]) == 3  # one record each: within noise, never "faster"
    assert {p["decision"] for p in rep["ranking"]["pairs"]} == {"within_noise"}
    medians = [by[n]["step_time_ns"]["median"] for n in rep["ranking"]["order"]]
    assert medians == sorted(medians)
    for name, run in by.items():
        # second way: slowest rank per profiled step, straight from steps.parquet
        steps = pq.read_table(clean_root / name / "steps.parquet").to_pandas()
        t = steps[steps["profiled"]]
        assert run["step_time_ns"]["median"] == float(np.median(t.groupby("step")["wall_ns"].max()))
        assert run["memory"]["peak_rss_bytes"] == int(steps["peak_rss_bytes"].max())
        for k in run["ranks"]:
            parts = (k["compute_ns"] + k["exposed_comm_ns"] + k["data_wait_ns"] + k["other_ns"]
                     + k["idle_ns"])
            assert parts == pytest.approx(k["step_ns"], abs=1.0)
    assert by["ddp"]["prefetch"] is None and by["ddp"]["communication"]["all_reduce"]["count"] > 0
    for name in ("fsdp", "fsdp2"):
        p = by[name]["prefetch"]
        assert p is not None and p["all_gathers"] > 0 and p["note"]
        assert set(by[name]["communication"]) >= {"all_gather", "reduce_scatter"}
    assert {u["unit"] for u in by["fsdp2"]["prefetch"]["units"]} >= {"layers.0", "layers.1"}
    html = (clean_root / "report" / "report.html").read_text()
    assert "<script" not in html.lower() and "ui.perfetto.dev" in html
    gate = cli("analyzer", "gate", str(clean_root))
    assert "gate: passed" in gate.stdout


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_canary_withholds_the_ranking_and_fails_the_gate(canary_roots, fault):
    root = canary_roots[fault]
    rep, stdout = _report(root)
    run = rep["runs"][0]
    assert run["strategy"] == FAULTS[fault] and run["parity"]["status"] == "fail"
    fd = run["parity"]["first_divergence"]
    assert fd is not None and fd["tensor"] and fd["kind"] in ("activation", "grad", "param", "loss")
    assert fd["rel_l2"] > 0 and fd["tolerance"]["rtol"] == 1.3e-6
    assert rep["ranking"]["status"] == "withheld" and fd["tensor"] in rep["ranking"]["reason"]
    assert "Ranking withheld" in stdout and fd["tensor"] in stdout
    html = (root / "report" / "report.html").read_text()
    assert "Withheld." in html
    gate = cli("analyzer", "gate", str(root), check_rc=3)
    assert fd["tensor"] in gate.stdout


# HTA 0.5.0 get_comm_comp_overlap on this set, percent of communication time (corpus README)
HTA_OVERLAP_PCT = [4.50, 2.47, 7.88, 3.31, 0.56, 0.64, 7.56, 9.51]


def test_foreign_traces_not_recorded_but_communication_reported(tmp_path):
    need(DLRM)
    out = tmp_path / "rep"
    proc = cli("analyzer", "report", str(DLRM), "--out", str(out))
    rep = json.loads((out / "report.json").read_text())
    report_types.decode((out / "report.json").read_text())  # the report's shape and types
    run = rep["runs"][0]
    assert run["parity"]["status"] == "not_recorded" and run["world_size"] == 8
    assert rep["ranking"]["status"] == "withheld"
    assert "no parity verdict" in rep["ranking"]["reason"] and run["name"] in rep["ranking"]["reason"]
    assert set(run["communication"]) == {"all_reduce", "all_to_all"}
    got = [k["overlap_frac"] * 100 for k in sorted(run["ranks"], key=lambda k: k["rank"])]
    assert got == pytest.approx(HTA_OVERLAP_PCT, abs=0.1)  # 0.001 as a fraction
    assert "Ranking withheld" in proc.stdout
    assert cli("analyzer", "gate", str(DLRM), check_rc=3).returncode == 3
    # the read-only corpus is never written to
    assert not (DLRM / "report").exists()
    assert cli("analyzer", "report", str(DLRM), check_rc=2).returncode == 2
