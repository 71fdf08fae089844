"""Follow-ups of the second new-user trial: every command refuses what ``report`` refuses
(merge, summary, gate), sane tolerance bounds, foreign trace folders under a root, and the
notes of a cached report. Inputs are real records (a tiny gloo DDP run and a tiny gloo FSDP run
with the wrong-grad-scale fault) and the read-only corpus."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.contract.errors import BadInput

from tests.reliability.conftest import DLRM, TBPLUGIN, TINY, bad_input, cli, copy_run, need


@pytest.fixture(scope="module")
def fsdp_fault_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo FSDP run directory recorded with ``--fault wrong-grad-scale``
    (gradients divided by the world size once more: relative error 0.5)."""
    out = tmp_path_factory.mktemp("fu-fsdp") / "traces"
    args = [a if a != "ddp" else "fsdp" for a in TINY]
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *args, "--fault",
                           "wrong-grad-scale", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "fsdp"


# 1. merge refuses what report refuses

def test_merge_refuses_mixed_jobs_like_report(ddp_run, fsdp_fault_run, tmp_path):
    folder = tmp_path / "mix"
    folder.mkdir()
    shutil.copy(ddp_run / "rank0.trace.json.gz", folder / "rank0.trace.json.gz")
    shutil.copy(fsdp_fault_run / "rank1.trace.json.gz", folder / "rank1.trace.json.gz")
    want = bad_input(cli("report", str(folder), "--out", str(tmp_path / "rep")), "different jobs")
    out = tmp_path / "m.trace.json.gz"
    got = bad_input(cli("merge", str(folder), "-o", str(out)), "different jobs")
    assert got == want  # the same one line, the same exit code (bad_input: 2)
    assert not out.exists()


def test_merge_refuses_a_run_whose_listed_trace_is_missing(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "ddp")
    (run / "rank1.trace.json.gz").unlink()
    want = bad_input(cli("report", str(run), "--out", str(tmp_path / "rep")),
                     "rank1.trace.json.gz listed in manifest.json but missing")
    assert bad_input(cli("merge", str(run), "-o", str(tmp_path / "m.json.gz"))) == want


def test_merge_refuses_a_trace_changed_since_the_record(ddp_run, tmp_path):
    import gzip

    run = copy_run(ddp_run, tmp_path / "ddp")
    path = run / "rank1.trace.json.gz"
    raw = bytearray(path.read_bytes())
    raw[4:8] = b"\x01\x02\x03\x04"  # gzip header mtime: same size, same trace, other sha256
    path.write_bytes(bytes(raw))
    assert gzip.decompress(bytes(raw))  # still a readable trace
    want = bad_input(cli("report", str(run), "--out", str(tmp_path / "rep")),
                     "rank1.trace.json.gz", "sha256 differs from manifest.json")
    assert bad_input(cli("merge", str(run), "-o", str(tmp_path / "m.json.gz"))) == want


# 2. summary refuses a run directory whose manifest lists a trace that is gone

def test_summary_refuses_a_run_whose_listed_trace_is_missing(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "ddp")
    (run / "rank1.trace.json.gz").unlink()
    want = bad_input(cli("gate", str(run)), "rank1.trace.json.gz listed in manifest.json but missing")
    assert bad_input(cli("report", str(run), "--out", str(tmp_path / "rep"))) == want
    # --allow-incomplete is about a run without a manifest; report refuses this run with it too
    assert bad_input(cli("report", str(run), "--allow-incomplete", "--out", str(tmp_path / "r2"))) == want
    for extra in ([], ["--allow-incomplete"], ["--format", "json"]):
        proc = cli("summary", str(run), *extra)
        assert bad_input(proc) == want, extra
        assert "1 of 2 ranks" not in proc.stdout
    # the library refuses it too, with the same reason (was: "1 of 2 ranks")
    from analyzer.api import load_tables
    for allow in (False, True):
        with pytest.raises(BadInput) as exc:
            load_tables(run, allow_incomplete=allow)
        assert exc.value.reason == "missing_file" and "rank1.trace.json.gz" in str(exc.value)


# 3. gate on a folder of broken foreign traces: bad input (2), not a parity failure (3)

def test_gate_on_broken_foreign_traces_is_bad_input(tmp_path):
    folder = tmp_path / "tb"
    folder.mkdir()
    for r in (0, 1):
        raw = need(TBPLUGIN / f"nccl__worker{r}.json").read_bytes()
        (folder / f"nccl__worker{r}.json").write_bytes(raw if r == 0 else raw[: len(raw) // 2])
    want = bad_input(cli("report", str(folder), "--out", str(tmp_path / "rep")),
                     "nccl__worker1.json", "truncated or invalid JSON")
    assert bad_input(cli("gate", str(folder))) == want
    # the same folder with both traces whole: readable, no numerics -> FAIL (3), as before
    shutil.copy(TBPLUGIN / "nccl__worker1.json", folder / "nccl__worker1.json")
    proc = cli("gate", str(folder))
    assert proc.returncode == 3 and "FAIL tb: not_recorded" in proc.stdout, proc.stderr


# 4. a root holding folders of foreign traces: the advice fits foreign traces

def test_root_of_foreign_trace_folders_advises_one_folder_at_a_time(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    dlrm = root / "dlrm"
    shutil.copytree(need(DLRM), dlrm)
    tb = root / "tb_nccl"
    tb.mkdir()
    for r in (0, 1):
        shutil.copy(need(TBPLUGIN / f"nccl__worker{r}.json"), tb)
    for extra in ([], ["--allow-incomplete"]):
        for cmd in ("report", "gate"):
            proc = cli(cmd, str(root), *extra)
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
            assert len(lines) == 2, lines  # one per folder
            for line, sub in zip(lines, (dlrm, tb)):
                assert line.startswith(f"analyzer: {sub}: ") and "did not write" in line
                assert f"`analyzer report {sub}`" in line
                assert "re-record" not in line and "did not complete" not in line
    # the advice works: the folder alone is analysed (foreign: parity not recorded)
    proc = cli("report", str(tb), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0 and "not_recorded" in proc.stdout, proc.stderr
    # a sub-folder with a trace named as the tracer names them is still an incomplete run,
    # refused with the re-record advice unless --allow-incomplete
    inc = root / "ddp"
    inc.mkdir()
    shutil.copy(tb / "nccl__worker0.json", inc / "rank0.trace.json.gz")
    proc = cli("report", str(root))
    assert f"analyzer: {inc}: has traces but no manifest.json" in proc.stderr
    assert "re-record it, or pass --allow-incomplete to analyse it as found" in proc.stderr


def _help(cmd: str) -> str:
    """``analyzer CMD --help`` as one line of words (rich's box characters removed)."""
    import re

    return " ".join(re.sub(r"[\u2500-\u257f]", " ", cli(cmd, "--help").stdout).split())


def test_allow_incomplete_help_says_what_it_does():
    for cmd in ("report", "gate"):
        text = _help(cmd)
        assert "Skip runs without a manifest" not in text and "partial rank sets" not in text
    assert "as found: marked incomplete, parity not checked" in _help("report")
    assert "Folders of foreign traces need no flag" in _help("report")
    assert "listed SKIP, not gated" in _help("gate")


# 5. absurd tolerances are refused, with the bound

@pytest.mark.parametrize("opt,value", [("--rtol", "1e300"), ("--rtol", "0.5"), ("--atol", "1e300"),
                                       ("--atol", "0.1")])
def test_tolerance_above_the_bound_is_refused(fsdp_fault_run, tmp_path, opt, value):
    from analyzer.contract.report_types import MAX_OVERRIDE

    bound = f"{MAX_OVERRIDE[opt[2:]]:g}"
    for args in (["gate", str(fsdp_fault_run)], ["drift", str(fsdp_fault_run), str(fsdp_fault_run)],
                 ["report", str(fsdp_fault_run), "--out", str(tmp_path / "rep")]):
        bad_input(cli(*args, opt, value), opt, f"above the bound {bound}", f"{opt} <= {bound}")


@pytest.fixture(scope="session")
def ddp_default_fault_run(tmp_path_factory) -> Path:
    """``--fault wrong-grad-scale`` at the default model shapes (smaller gradients than TINY's:
    where the first atol bound, 1e-2, let the fault pass the gate)."""
    out = tmp_path_factory.mktemp("fu-ddp-default") / "traces"
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", "--strategy", "ddp",
                           "--warmup", "0", "--active", "2", "--fault", "wrong-grad-scale",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "ddp"


@pytest.mark.parametrize("which", ["tiny_fsdp", "default_ddp"])
def test_faulted_run_still_fails_at_the_bounds(which, request):
    from analyzer.contract.report_types import MAX_OVERRIDE

    run = request.getfixturevalue("fsdp_fault_run" if which == "tiny_fsdp"
                                  else "ddp_default_fault_run")
    # the fault halves every gradient (relative error 0.5): the looser tolerances refused
    # above would have let it through, the bounds do not
    proc = cli("gate", str(run), "--rtol", str(MAX_OVERRIDE["rtol"]),
               "--atol", str(MAX_OVERRIDE["atol"]))
    assert proc.returncode == 3 and f"FAIL {run.name}: fail" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "rel L2 0.5" in proc.stdout
    from analyzer.analyses.parity import evaluate, read_numerics, tolerance_for

    numerics = read_numerics(run / "numerics.parquet")
    for name, loose in (("rtol", 0.5), ("atol", 0.1)):  # the library still computes them
        res = evaluate(numerics, tolerance_for("fp32", **{name: loose}))
        assert res.status == "pass", (name, res.reason)  # why such values must be refused


# 7. a cached report says again what the analysis said on stderr

def test_cached_report_repeats_the_stderr_notes(ddp_run, fsdp_fault_run, tmp_path, monkeypatch):
    from analyzer.compare import runs
    from analyzer.contract.report_types import AnalysisOptions
    from reports import cache

    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    inc = copy_run(fsdp_fault_run, root / "fsdp")
    (inc / "manifest.json").unlink()  # a record that did not finish
    args = ("report", str(root), "--allow-incomplete", "--out", str(tmp_path / "rep"))
    cold = cli(*args)
    assert cold.returncode == 0, cold.stderr
    note = f"{inc}: has traces but no manifest.json: the run did not complete; analysed as found"
    assert cold.stderr.splitlines() == [note]
    assert note in cold.stdout  # also a note of the report itself

    def no_analysis(*a, **k):
        raise AssertionError("the warm report must come from the cache")

    monkeypatch.setattr(runs, "analyse", no_analysis)
    warm = cli(*args)
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr == cold.stderr and warm.stdout == cold.stdout
    key = cache.key(root, tmp_path / "rep", AnalysisOptions(allow_incomplete=True))
    assert cache.load_entry(root, tmp_path / "rep", key)[1] == [note]


# 8. README "Caches": where the caches are and how to clear them, checked on a real run

README = Path(__file__).parents[2] / "README.md"


def test_readme_cache_locations_and_clearing(ddp_run, tmp_path, monkeypatch):
    import os
    import re

    xdg = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    runs = {}
    for name in ("writable", "readonly"):
        run = copy_run(ddp_run, tmp_path / "traces" / name)
        for p in run.glob("*.tables.msgpack"):
            p.unlink()
        runs[name] = run
    runs["readonly"].chmod(0o555)  # marked read-only: root could still write, the analyzer must not
    try:
        for name, run in runs.items():
            assert cli("summary", str(run)).returncode == 0
            assert cli("report", str(run), "--out", str(tmp_path / f"rep-{name}")).returncode == 0
        beside = sorted(p.name for p in runs["writable"].iterdir() if p.name.startswith("rank"))
        assert beside == ["rank0.trace.json.gz", "rank0.trace.json.gz.tables.msgpack",
                          "rank1.trace.json.gz", "rank1.trace.json.gz.tables.msgpack"]
        assert sorted(p.name for p in runs["readonly"].iterdir() if p.name.startswith("rank")) == \
            ["rank0.trace.json.gz", "rank1.trace.json.gz"]
        user = xdg / "paritytrace"
        assert len(list(user.glob("*.tables.msgpack"))) == 2  # the read-only run's two ranks
        assert not list(user.glob("*.parquet"))  # one cache of trace analyses
        assert len(list((user / "reports").glob("*.json"))) == 2  # one per report, both runs
        text = README.read_text()
        section = text[text.index("## Caches"):text.index("## Exit codes and errors")]
        for said in ("`<trace>.tables.msgpack` beside", "$XDG_CACHE_HOME/paritytrace/reports/",
                     "defaults to `~/.cache`"):
            assert said in section, said
        script = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
        script = script.replace("find DIR", f"find {tmp_path / 'traces'}")
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                              env={**os.environ, "XDG_CACHE_HOME": str(xdg)})
        assert proc.returncode == 0, proc.stderr
        left = [p for p in (tmp_path / "traces").rglob("*")
                if p.name.endswith(".tables.msgpack")]
        assert left == [] and not user.exists()
    finally:
        runs["readonly"].chmod(0o755)


# 9. FSDP1 unit names "#k" are defined where they appear

def test_fsdp1_unit_names_are_defined(fsdp_fault_run, tmp_path):
    out = tmp_path / "rep"
    proc = cli("report", str(fsdp_fault_run), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    md = proc.stdout
    section = md[md.index("## FSDP prefetch"):md.index("## Recorded settings")]
    units = {row.split("|")[2].strip() for row in section.splitlines()
             if row.startswith("| forward") or row.startswith("| backward")}
    assert units and all(u.startswith("#") for u in units)  # FSDP1: numbered, not named
    assert "#0" in units
    definition = '"#k" is the all_gather issued k-th (from #0) in that phase'
    assert definition in section
    html = (out / "report.html").read_text().replace("&quot;", '"')
    assert definition in html and html.index("#0</td>") < html.index(definition)


# 10. the noise statement follows the measured spread (real run, rule recomputed here)

def _profiled_step_ns(run: Path) -> list[int]:
    """Slowest rank's wall time of each profiled step, read with pyarrow (not the analyzer)."""
    import pyarrow.parquet as pq

    t = pq.read_table(run / "steps.parquet").to_pylist()
    by_step: dict[int, int] = {}
    for row in t:
        if row["profiled"]:
            by_step[row["step"]] = max(by_step.get(row["step"], 0), row["wall_ns"])
    return [by_step[s] for s in sorted(by_step)]


def test_noise_statement_follows_the_measured_spread(ddp_run, tmp_path):
    import json
    import statistics

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.remanifest import refresh_manifest

    root = tmp_path / "traces"
    fast = copy_run(ddp_run, root / "ddp")
    a = _profiled_step_ns(fast)
    for name, k in (("ddp-slow", max(1.67, 1.01 * max(a) / min(a))), ("ddp-close", 1.2)):
        run = copy_run(ddp_run, root / name)
        table = pq.read_table(run / "steps.parquet")
        walls = [int(w * k) for w in table.column("wall_ns").to_pylist()]
        table = table.set_column(table.schema.get_field_index("wall_ns"), "wall_ns",
                                 pa.array(walls, table.schema.field("wall_ns").type))
        pq.write_table(table, run / "steps.parquet")
        m = json.loads((run / "manifest.json").read_text())
        m["run_name"] = name
        (run / "manifest.json").write_text(json.dumps(m))
        refresh_manifest(run)
        sub = root.parent / f"only-{name}"  # this copy and the real run, two runs to rank
        sub.mkdir()
        shutil.copytree(fast, sub / "ddp")
        shutil.copytree(run, sub / name)
        proc = cli("report", str(sub), "--out", str(tmp_path / f"rep-{name}"))
        assert proc.returncode == 0, proc.stderr
        verdict = proc.stdout.splitlines()[2]
        b = _profiled_step_ns(run)
        gap = (statistics.median(b) - statistics.median(a)) / statistics.median(a)
        noise = max(a) >= min(b) or gap < 0.5  # the rule, CPU floor 50 %
        assert ("within measurement noise" in verdict) == noise, (name, a, b, verdict)
        if name == "ddp-slow":  # >= 1.67x and beyond the run's own spread: not noise
            assert not noise and "beyond the measured spread" in verdict
        else:  # 1.2x: below the CPU floor at least
            assert noise and "ddp vs ddp-close" in verdict
