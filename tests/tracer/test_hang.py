"""Hangs and the Flight Recorder (issue 30 item 5): ``--fault hang`` fails the record naming
rank 1, every rank leaves a JSON Flight Recorder dump in the run dir, ``analyzer report
--allow-incomplete`` names the collective rank 1 never entered, and a re-record removes the
dumps. Also the run-dir contract of the dump files and the membership the tracer adds."""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys

import pytest

from analyzer.contract import schemas
from tests.tracer.helpers import REPO, TINY, alive_with_tag, run_tracer
from tracer import flightrec
from tracer.config import RecordConfig
from tracer.rundir import clear_run_dir, is_tracer_file, unlock_run_dir

HANG_TIMEOUT_S = 20
"""The record's collective timeout: generous for a loaded machine (rank 0 waits this long)."""


def test_dump_files_are_the_tracers_and_a_rerecord_removes_them(tmp_path):
    assert is_tracer_file("rank1.flightrec.json") and schemas.flightrec_name(3) == "rank3.flightrec.json"
    assert not is_tracer_file("rank1.flightrec.json.tables.msgpack")
    run_dir = tmp_path / "ddp"
    run_dir.mkdir()
    (run_dir / schemas.RECORDING_NAME).write_text("1\n")  # a failed record's run dir
    (run_dir / "rank1.flightrec.json").write_text("{}")
    (run_dir / "notes.json").write_text("{}")  # the user's: stays
    clear_run_dir(run_dir)
    unlock_run_dir(run_dir)
    assert not (run_dir / "rank1.flightrec.json").exists() and (run_dir / "notes.json").exists()


def test_gloo_membership_is_added_to_pg_config():
    """torch 2.13's gloo dumps name no member: pg_config holds one entry "" (often with no
    ranks); the tracer adds each group's ranks and keeps what torch filled."""
    dump = {"pg_config": {"": {"desc": "", "name": "", "ranks": "[]"},
                          "1": {"desc": "tp", "name": "1", "ranks": "[0, 2]"}}}
    got = flightrec.supplement_pg_config(dump, {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                                                "1": {"name": "1", "desc": "tp", "ranks": "[9]"}})
    assert got["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                                "1": {"desc": "tp", "name": "1", "ranks": "[0, 2]"}}


def test_hang_is_a_ddp_canary_only():
    RecordConfig(strategy="ddp", fault="hang")
    with pytest.raises(ValueError, match="hang"):
        RecordConfig(strategy="fsdp2", fault="hang")


@pytest.mark.record
def test_hang_record_fails_naming_rank_1_and_the_report_names_the_collective(tmp_path):
    args = ["--strategy", "ddp", "--fault", "hang", "--timeout", str(HANG_TIMEOUT_S), "--out", str(tmp_path)]
    proc, tag = run_tracer(args + TINY, tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert alive_with_tag(tag) == []
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "rank 1 hung at '1 step'" in lines[0] and "timed out" in lines[0], lines[0]
    assert "Flight Recorder dumps of rank(s) 0, 1 in the run dir" in lines[0], lines[0]
    run_dir = tmp_path / "ddp"
    assert not (run_dir / schemas.MANIFEST_NAME).exists()
    assert (run_dir / schemas.RECORDING_NAME).exists()

    # The dumps, read here with json alone: torch's schema, rank 1 stopped one all_reduce short.
    dumps = {r: json.loads((run_dir / f"rank{r}.flightrec.json").read_text()) for r in (0, 1)}
    seqs = {r: {e["collective_seq_id"]: e for e in d["entries"] if e["process_group"][0] == "0"}
            for r, d in dumps.items()}
    n = max(seqs[1]) + 1
    assert seqs[0][n]["profiling_name"] == "gloo:all_reduce"
    assert int(dumps[1]["pg_status"]["0"]["last_enqueued_collective"]) == n - 1
    assert all(seqs[0][s]["profiling_name"] == seqs[1][s]["profiling_name"] for s in seqs[1])
    assert dumps[0]["pg_config"]["0"]["ranks"] == "[0, 1]"

    rep = subprocess.run([sys.executable, "-m", "analyzer", "report", str(run_dir), "--allow-incomplete"],
                         cwd=REPO, capture_output=True, text=True)
    assert rep.returncode == 0, rep.stderr[-3000:]
    line = f"ddp: rank 1 never entered all_reduce #{n} of process group 0; rank 0 waited in it"
    md = (run_dir / "report" / "report.md").read_text()
    # rank 0's all_reduce ended in error or not yet, as its dump came before or after gloo
    # retired it: "... waited in it" or "... waited in it until it failed (...)" (issue 42)
    assert f"- **{line}" in md
    # the hang is the decision and finding 1 (issue 42)
    head = md.splitlines()
    assert head[2].startswith(f"**Decision:** No decision: {line.replace(':', ' hung:', 1)}")
    assert next(x for x in head if x.startswith("1. ")).startswith(
        "1. hang (the run does not finish): ddp hung in process group 0 (default_pg)")
    report = json.loads((run_dir / "report" / "report.json").read_text())
    (group,) = report["runs"][0]["flight_recorder"]["groups"]
    assert (group["next_seq"], group["never_entered"], group["entered"]) == (n, [1], [0])
    # gloo marks a collective completed in pg_status on its own thread after wait() returns (right
    # after a broadcast's wait, 52 of 300 dumps still showed the one before): the report holds
    # what the dumps say, and rank 1 completed at least the collective before its last one.
    completed = {r: int(d["pg_status"]["0"]["last_completed_collective"]) for r, d in dumps.items()}
    assert group["last_completed_seq"] == min(completed.values()) and completed[1] >= n - 2
    # #n, which rank 1 never entered, cannot have completed: where rank 0's pg_status counts it
    # (gloo retires a failed collective too), the report says it failed there (issue 42)
    assert [x["last_completed_seq"] for x in group["per_rank"]] == [min(completed[0], n - 1),
                                                                    completed[1]]
    assert group["per_rank"][0].get("failed_seq") == (n if completed[0] >= n else None)
    assert re.search(r"rank 1 never entered all_reduce #\d+ of process group 0", (
        run_dir / "report" / "report.html").read_text())

    # A re-record into the same run dir (no fault) completes and removes the dumps.
    proc, tag = run_tracer(["--strategy", "ddp", "--out", str(tmp_path)] + TINY, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(run_dir.glob("*.flightrec.json"))
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert not any("flightrec" in f.path for f in manifest.files)
    with gzip.open(run_dir / "rank0.trace.json.gz") as f:
        assert json.load(f)["traceEvents"]


@pytest.mark.record
def test_watchdog_asks_every_hung_rank_for_its_dump(tmp_path):
    """Both ranks stuck in Python, outside any collective (no collective timeout can fire):
    the hang watchdog stops the record, and first every rank answers the dump request."""
    # the watchdog fires after 2 x 20 + 30 s without a heartbeat; a shorter --timeout (it is the
    # rendezvous timeout too) can end a loaded machine's record before the injected hang
    args = ["--strategy", "ddp", "--timeout", str(HANG_TIMEOUT_S), "--out", str(tmp_path)] + TINY
    proc, tag = run_tracer(args, tmp_path, env_extra={"PARITYTRACE_INJECT": "hang@*:1"})
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert alive_with_tag(tag) == []
    assert "hung: no progress for" in proc.stderr and "Flight Recorder dumps of rank(s) 0, 1" in proc.stderr
    dumps = [json.loads((tmp_path / "ddp" / f"rank{r}.flightrec.json").read_text()) for r in (0, 1)]
    # neither rank is inside a collective: both completed the same last one of the default group
    status = [d["pg_status"]["0"] for d in dumps]
    assert status[0] == status[1] and status[0]["last_completed_collective"] == status[0]["last_enqueued_collective"]


@pytest.mark.record
def test_a_finished_record_keeps_no_dump_pipe_open(tmp_path, monkeypatch):
    """The launcher's dump-request pipes are closed when the workers succeed, not only when
    they are killed: ``--repeat 100`` must not keep a descriptor per finished worker."""
    import os

    from tests.tracer.test_gated_start import TINY as TINY_KW, _worker_env
    from tracer.baseline import BASELINE_NAME, write_baseline
    from tracer.launch import run_workers

    tag = _worker_env(monkeypatch, tmp_path)
    cfg = RecordConfig(strategy="single", device="cpu", out=str(tmp_path / "out"), timeout_s=60, **TINY_KW)
    cfg.run_dir.mkdir(parents=True)
    before = set(os.listdir("/proc/self/fd"))
    def prepare():  # as the launcher does: the baseline lands once the worker waits for it
        # (placed earlier, the worker's own check of the run dir finds a folder not its own)
        import time

        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not any(
                "wait_for_launcher" in hb.read_text() for hb in tmp_path.glob("tracer-single-*/rank0.hb")):
            time.sleep(0.05)
        write_baseline(cfg, "cpu", cfg.run_dir / BASELINE_NAME)

    run_workers(cfg, prepare=prepare)
    assert (cfg.run_dir / schemas.MANIFEST_NAME).exists()
    assert set(os.listdir("/proc/self/fd")) - before == set()
    assert alive_with_tag(tag) == []
