"""The caches, through the commands: where the per-rank tables and report caches are written
(docs/caches.md, and its clearing recipe run on a real record), and a report served from the
cache says again the notes the analysis said on stderr."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.inputs import cli, copy_run


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
    note = (f"{inc}: no manifest.json (the tracer writes it last): the record did not complete "
            "(failed, interrupted or still running); analysed as found")
    assert cold.stderr.splitlines() == [note, f"analyzer: wrote report.md, report.json, "
                                              f"report.html to {tmp_path / 'rep'}"]
    assert note in cold.stdout  # also a note of the report itself

    def no_analysis(*a, **k):
        raise AssertionError("the warm report must come from the cache")

    monkeypatch.setattr(runs, "analyse", no_analysis)
    warm = cli(*args)
    assert warm.returncode == 0, warm.stderr
    assert warm.stderr == cold.stderr and warm.stdout == cold.stdout
    key = cache.key(root, tmp_path / "rep", AnalysisOptions(allow_incomplete=True))
    assert cache.load_entry(root, tmp_path / "rep", key)[1] == [note]


CACHES_DOC = Path(__file__).parents[2] / "docs" / "caches.md"


def test_documented_cache_locations_and_clearing(ddp_run, tmp_path, monkeypatch):
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
        reports = sorted((user / "reports").glob("*.json"))
        written = [p for p in reports if p.name.endswith(".written.json")]
        assert len(reports) - len(written) == 2  # one per report, both runs
        assert len(written) == 2  # what each report wrote, by SHA-256
        section = CACHES_DOC.read_text()
        for said in ("`<trace>.tables.msgpack` beside", "$XDG_CACHE_HOME/paritytrace/reports/",
                     ".written.json",
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


def test_cached_report_follows_a_re_recorded_run_behind_a_symlink(ddp_run, fsdp_run,
                                                                   fsdp_fault_run, tmp_path):
    """The documented "folder of symlinks to run dirs": a linked run re-recorded (here with
    --fault wrong-grad-scale) must not be served the cached report of the run it replaced."""
    import json
    import shutil

    store, links = tmp_path / "store", tmp_path / "links"
    copy_run(ddp_run, store / "ddp")
    copy_run(fsdp_run, store / "fsdp")
    links.mkdir()
    for name in ("ddp", "fsdp"):
        (links / name).symlink_to(store / name, target_is_directory=True)
    args = ("report", str(links), "--out", str(tmp_path / "rep"), "--format", "json")

    def fsdp_parity() -> str:
        data = json.loads((tmp_path / "rep" / "report.json").read_text())
        return next(r for r in data["runs"] if r["name"] == "fsdp")["parity"]["status"]

    assert cli(*args).returncode == 0
    assert fsdp_parity() == "pass"
    shutil.rmtree(store / "fsdp")  # re-recorded in place, as `tracer record` does
    copy_run(fsdp_fault_run, store / "fsdp")
    assert cli(*args).returncode == 0
    assert fsdp_parity() == "fail"
    assert cli("gate", str(links)).returncode == 3


def test_report_cache_key_survives_a_symlink_cycle(tmp_path):
    from reports import cache

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.json").write_text("{}")
    (tmp_path / "a" / "loop").symlink_to(tmp_path / "a", target_is_directory=True)
    rows = cache._files(tmp_path, tmp_path / "out")
    assert [r[0] for r in rows] == ["a/f.json", "a/loop"]
