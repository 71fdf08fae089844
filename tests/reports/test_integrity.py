"""Manifest size+sha256 check, speedup only where comparable, --allow-incomplete on a root,
ranking noise, and the report's wording (hand-built runs, exact answers)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.compare import ranking as compare
from analyzer.ingest import rundirs
from analyzer.cli.app import app
from analyzer.contract.errors import BadInput, ExitCode
from analyzer.contract.report_types import AnalysisOptions
from analyzer.compare.runs import analyse
from reports import fmt, html, markdown
from tests.remanifest import refresh_manifest
from tests.reports.builders import build_root, details, write_run
from tests.corpus import CORPUS, need

runner = CliRunner()
MS = 1_000_000


def _list_files(run_dir: Path) -> None:
    """List numerics.parquet and steps.parquet in the manifest as the tracer does (hashlib)."""
    refresh = json.loads((run_dir / "manifest.json").read_text())
    refresh["files"] = [{"path": n, "size_bytes": 0, "sha256": ""}
                        for n in ("numerics.parquet", "steps.parquet")]
    (run_dir / "manifest.json").write_text(json.dumps(refresh))
    refresh_manifest(run_dir)
    m = json.loads((run_dir / "manifest.json").read_text())
    raw = (run_dir / "numerics.parquet").read_bytes()
    assert m["files"][0] == {"path": "numerics.parquet", "size_bytes": len(raw),
                             "sha256": hashlib.sha256(raw).hexdigest()}


@pytest.fixture()
def roots(tmp_path):
    ok = build_root(tmp_path / "ok")
    bad = build_root(tmp_path / "bad", fault=True)
    for root in (ok, bad):
        for run in ("single", "ddp", "fsdp2"):
            _list_files(root / run)
    return ok, bad


def test_numerics_copied_from_another_run_is_refused(roots):
    ok, bad = roots
    res = runner.invoke(app, ["gate", str(bad / "ddp")])
    assert res.exit_code == 3, res.output  # the fault run fails the gate on its own numerics
    shutil.copy(ok / "ddp" / "numerics.parquet", bad / "ddp" / "numerics.parquet")
    for cmd in (["gate", str(bad / "ddp")], ["gate", str(bad)], ["report", str(bad)]):
        res = runner.invoke(app, cmd)
        assert res.exit_code == ExitCode.BAD_INPUT, (cmd, res.output)
        assert "PASS" not in res.output
        line = [x for x in res.output.splitlines() if "numerics.parquet" in x]
        assert line and "sha256 differs from manifest.json" in line[0] and "re-record" in line[0]
    with pytest.raises(BadInput) as exc:
        rundirs.discover(bad / "ddp")
    assert exc.value.reason == "file_changed" and exc.value.path.endswith("numerics.parquet")


def test_size_change_and_same_size_edit_are_both_caught(roots):
    ok, _ = roots
    p = ok / "fsdp2" / "steps.parquet"
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # same size, one byte differs
    p.write_bytes(bytes(raw))
    with pytest.raises(BadInput, match="sha256 differs"):
        rundirs.discover(ok)
    p.write_bytes(bytes(raw) + b"x")
    with pytest.raises(BadInput, match="size .* differs"):
        rundirs.discover(ok)
    refresh_manifest(ok / "fsdp2")  # a re-recorded manifest: accepted again (only the hash check)
    assert [r.name for r in rundirs.discover(ok).runs] == ["single", "ddp", "fsdp2"]


def test_report_cache_is_not_served_after_a_same_size_same_mtime_edit(roots, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    ok, bad = roots
    out = tmp_path / "out"
    assert runner.invoke(app, ["report", str(ok), "--out", str(out)]).exit_code == 0
    target = ok / "ddp" / "numerics.parquet"
    st = os.stat(target)
    new = (bad / "ddp" / "numerics.parquet").read_bytes()
    assert len(new) == st.st_size  # the fault run's numerics: same size, other content
    with open(target, "r+b") as fh:  # in place: same inode
        fh.write(new)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # as `cp -p` would
    assert os.stat(target).st_ino == st.st_ino and os.stat(target).st_mtime_ns == st.st_mtime_ns
    res = runner.invoke(app, ["report", str(ok), "--out", str(out)])
    assert res.exit_code == ExitCode.BAD_INPUT and "sha256 differs" in res.output


def test_speedup_only_for_comparable_runs(tmp_path):
    rep = analyse(build_root(tmp_path / "f", fault=True))
    by = {r.name: r for r in rep.runs}
    assert by["ddp"].parity.status == "fail" and by["ddp"].speedup_vs_single is None
    assert by["fsdp2"].speedup_vs_single == pytest.approx(10 / 9)  # passed, same settings
    assert by["single"].speedup_vs_single == pytest.approx(1.0)
    headers, rows = markdown.ranking_rows(rep)
    col = headers.index("speedup vs single")
    assert {r[1]: r[col] for r in rows} == {"single": "1.00x", "ddp": "-", "fsdp2": "1.11x"}
    # different settings from the reference (global batch): no speedup either
    root = build_root(tmp_path / "s")
    write_run(root / "fsdp2", strategy="fsdp2", walls={0: (1, 1), 1: (9 * MS, 8 * MS), 2: (9 * MS, 9 * MS)},
              global_batch=16)
    rep = analyse(root)
    by = {r.name: r for r in rep.runs}
    assert by["fsdp2"].speedup_vs_single is None
    assert by["ddp"].speedup_vs_single == pytest.approx(10 / 7)


def test_allow_incomplete_root_includes_the_run_marked(tmp_path):
    root = build_root(tmp_path)
    (root / "fsdp").mkdir()
    shutil.copy(root / "ddp" / "numerics.parquet", root / "fsdp" / "numerics.parquet")
    with pytest.raises(BadInput, match="no manifest.json"):
        analyse(root)
    rep = analyse(root, AnalysisOptions(allow_incomplete=True))
    by = {r.name: r for r in rep.runs}
    assert set(by) == {"single", "ddp", "fsdp2", "fsdp"}
    assert by["fsdp"].incomplete is True and by["fsdp"].parity.status == "not_recorded"
    assert rep.ranking.status == "ranked" and rep.ranking.order == ["ddp", "fsdp2"] and rep.ranking.reference == "single"
    assert "fsdp" in rep.ranking.reason and "incomplete" in rep.ranking.reason
    md = markdown.render(rep)
    assert "1 caveat on how figures were measured: see Caveats." in details(md)
    assert "## Caveats\n\n- fsdp: incomplete run" in md
    res = runner.invoke(app, ["gate", str(root), "--allow-incomplete"])
    assert res.exit_code == 0 and "SKIP fsdp: not_recorded" in res.output


def test_wording(tmp_path):
    assert fmt.count(6.0) == "6" and fmt.count(2.5) == "2.5" and fmt.count(None) == "-"
    root = build_root(tmp_path)
    shutil.rmtree(root / "single")
    rep = analyse(root)
    md = markdown.render(rep)
    assert "match the single-device baseline" not in md
    assert "no single-device run" in details(md)
    assert "(source per run below)" not in md
    assert "ddp: steps.parquet: profiled steps, slowest rank's wall time; median over 2 step(s)" in md
    for text in ("Other = ", "idle = ", "The profiler-window peak is ", "Process RSS is the whole process"):
        assert text in md and text in html.render(rep).replace("&quot;", '"')
    # a precision difference is stated once (under Ranking), without Python dict reprs
    write_run(root / "fsdp2", strategy="fsdp2", walls={0: (1, 1), 1: (9 * MS, 8 * MS), 2: (9 * MS, 9 * MS)},
              precision="bf16", device="cpu")
    rep = analyse(root)
    md = markdown.render(rep)
    assert md.count("precision (") == 1 and "{'" not in md
    diffs = compare.settings_differences(rep.runs)
    assert diffs == ["runs differ in precision (ddp: fp32; fsdp2: bf16)"]


A100 = CORPUS / "single" / "a100_ddp_rank0_nccl_args.json.gz"


@pytest.mark.integration
def test_communication_per_profiled_step_against_the_corpus_readme(tmp_path):
    need(A100)
    (tmp_path / "job").mkdir()
    shutil.copy(A100, tmp_path / "job" / A100.name)
    rep = analyse(tmp_path / "job")
    run = rep.runs[0]
    comm = run.communication
    # corpus README: 21 NCCL kernels = 7 collectives x 3 steps
    assert run.profiled_steps == 3
    assert sum(v.count_per_step for v in comm.values()) == 7
    assert sum(v.count for v in comm.values()) == 21
    for v in comm.values():  # every collective lies inside a step: per step x 3 = the total
        assert v.time_ns_per_step * 3 == pytest.approx(v.time_ns)
    md = markdown.render(rep)
    rows = [ln for ln in md.splitlines()
            if ln.startswith(f"| {markdown.escape(run.name)} | all_reduce | 3 |")]
    assert rows and rows[0].split(" | ")[3] == "5"  # calls / step, an integer
    assert "per profiled step" in md
