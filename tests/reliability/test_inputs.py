"""Issue 5, "Inputs that must be handled": one test per input, each built from a real corpus
trace or a real `tracer record` run directory corrupted in tmp_path. Every CLI path turns bad
input into one line naming the file, what is wrong and what to do (exit 2, no traceback); the
library raises the typed error (``BadInput`` with a stable ``reason``)."""

from __future__ import annotations

import os
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyzer.api import load_events, load_tables
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import AnalysisOptions
from analyzer.compare.runs import analyse
from tests.remanifest import refresh_manifest
from tests.reliability.conftest import (DLRM, bad_input, cli, cli_proc, copy_run, load,
                                        need, save)

IDENTITY = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]
ALL_CMDS = ("summary", "report", "merge")  # the commands that read traces


def _every_cli_refuses(folder, *must, reason=None):
    for cmd in ALL_CMDS:
        extra = ["--out", str(folder.parent / f"out-{cmd}")] if cmd == "report" else (
            ["-o", str(folder.parent / "m.json.gz")] if cmd == "merge" else [])
        bad_input(cli(cmd, str(folder), *extra), *must)
    if reason:
        with pytest.raises(BadInput) as exc:
            load_tables(folder)
        assert exc.value.reason == reason


def test_truncated_json_gz(tmp_path):
    raw = need(DLRM / "worker0.pt.trace.json.gz").read_bytes()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "worker0.json.gz").write_bytes(raw[: len(raw) // 2])
    _every_cli_refuses(tmp_path / "job", "worker0.json.gz", "truncated", reason="truncated")


def test_truncated_json(tmp_path):
    text = load(need(DLRM / "worker0.pt.trace.json.gz"))
    import json
    data = json.dumps(text).encode()
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "worker0.json").write_bytes(data[: len(data) * 2 // 3])
    _every_cli_refuses(tmp_path / "job", "worker0.json", reason="truncated")


@pytest.mark.parametrize("name", ["rank0.json", "rank0.json.gz"])
def test_empty_file(tmp_path, name):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / name).write_bytes(b"")
    _every_cli_refuses(tmp_path / "job", name)


@pytest.mark.parametrize("payload", [b'{"lr": 0.1, "epochs": 3}', b"[1, 2, 3]", b'"text"'])
def test_json_that_is_not_a_trace(tmp_path, payload):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "rank0.json").write_bytes(payload)
    _every_cli_refuses(tmp_path / "job", "rank0.json")


def test_random_bytes_named_json_gz(tmp_path):
    (tmp_path / "job").mkdir()
    rng = __import__("random").Random(5)
    for name, head in (("rank0.json.gz", b""), ("rank1.json.gz", b"\x1f\x8b")):
        (tmp_path / "job" / name).write_bytes(head + bytes(rng.randrange(256) for _ in range(4000)))
    # both files are named: the folder's problems are listed, one per line
    for cmd in ("summary", "report"):
        proc = cli(cmd, str(tmp_path / "job"), *(["--out", str(tmp_path / "o")] if cmd == "report" else []))
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines[0].endswith("2 problems, one per line below")
        assert any("rank0.json.gz" in ln for ln in lines[1:]) and any("rank1.json.gz" in ln for ln in lines[1:])
    with pytest.raises(BadInput) as exc:
        load_tables(tmp_path / "job")
    # random bytes do not start like JSON (not a trace); a cut gzip stream is truncated
    assert {os.path.basename(p.path): p.reason for p in exc.value.problems} == {
        "rank0.json.gz": "not_a_trace", "rank1.json.gz": "truncated"}


@pytest.mark.parametrize("value", [{"a": 1}, "oops", 7, [1, "x", None]])
def test_trace_events_of_the_wrong_type(tmp_path, value):
    t = load(need(DLRM / "worker0.pt.trace.json.gz"))
    t["traceEvents"] = value
    save(tmp_path / "job" / "worker0.json.gz", t)
    _every_cli_refuses(tmp_path / "job", "worker0.json.gz")


def test_events_with_bad_ts_or_dur_are_skipped_counted_and_said(tmp_path):
    t = load(need(DLRM / "worker0.pt.trace.json.gz"))
    xs = [e for e in t["traceEvents"] if e.get("ph") == "X"]
    n_x = len(xs)
    del xs[0]["ts"]
    xs[1]["ts"] = -5
    xs[2]["ts"] = "abc"
    xs[3]["dur"] = None
    xs[4]["dur"] = -1
    xs[5]["dur"] = [1]
    save(tmp_path / "job" / "worker0.json.gz", t)
    ts = load_tables(tmp_path / "job")
    rank = ts.ranks[0]
    # the rest is analysed: exactly six events fewer than the file's complete events
    assert len(load_events(rank.path)[0]) == n_x - 6
    assert any("skipped 3 complete events" in w and "ts" in w for w in rank.warnings)
    assert any("skipped 3 complete events" in w and "dur" in w for w in rank.warnings)
    b = ts.breakdown
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    proc = cli("summary", str(tmp_path / "job"))
    assert proc.returncode == 0 and "skipped 3 complete events" in proc.stdout
    proc = cli("report", str(tmp_path / "job"), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0 and "skipped 3 complete events" in proc.stdout


def test_duplicate_ranks(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(need(DLRM), job)
    shutil.copy(job / "worker3.pt.trace.json.gz", job / "worker3_again.pt.trace.json.gz")
    _every_cli_refuses(job, "worker3.pt.trace.json.gz", "worker3_again.pt.trace.json.gz",
                       "rank 3", reason="duplicate_rank")


def test_missing_ranks_are_said_and_the_report_is_not_presented_as_complete(tmp_path):
    job = tmp_path / "job"
    shutil.copytree(need(DLRM), job)
    (job / "worker5.pt.trace.json.gz").unlink()
    ts = load_tables(job)
    assert ts.world_size == 8 and ts.missing_ranks == [5]
    proc = cli("summary", str(job))
    assert proc.returncode == 0 and "7 of 8 ranks" in proc.stdout and "[5]" in proc.stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0
    verdict = proc.stdout.splitlines()[2]
    assert "Caveat: job: partial: ranks [5] of 8 have no trace" in verdict


def test_ranks_from_different_jobs_world_size(tmp_path, ddp_run):
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(need(DLRM / "worker0.pt.trace.json.gz"), job / "a.json.gz")  # 8 ranks, nccl
    shutil.copy(ddp_run / "rank1.trace.json.gz", job / "b.json.gz")  # 2 ranks, gloo
    proc = cli("summary", str(job))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines[0].endswith("2 problems, one per line below") and len(lines) == 3
    assert any("world sizes disagree: 2 in" in ln and "8 in" in ln for ln in lines)
    assert any("backends disagree" in ln for ln in lines)


def test_ranks_from_different_jobs_process_groups(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank1.trace.json.gz")
    t["distributedInfo"]["pg_config"][0]["ranks"] = [0, 1, 2]
    save(job / "rank1.trace.json.gz", t)
    for cmd in ("summary", "report", "merge"):
        extra = {"report": ["--out", str(tmp_path / "o")], "merge": ["-o", str(tmp_path / "m.json.gz")]}
        bad_input(cli(cmd, str(job), *extra.get(cmd, [])), "process group '0' has different members",
                  "rank1.trace.json.gz", "rank0.trace.json.gz")
    with pytest.raises(BadInput) as exc:
        load_tables(job)
    assert exc.value.reason == "mixed_jobs"


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(tmp_path / "empty")), str(tmp_path / "empty"), "no ")


def test_path_that_does_not_exist(tmp_path):
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(tmp_path / "nope")), "nope", "no such file or folder")
    # and through a fresh interpreter, exactly as typed in a shell
    bad_input(cli_proc("report", str(tmp_path / "nope")), "nope", "no such file or folder")


def test_single_file_instead_of_folder(tmp_path):
    f = need(DLRM / "worker0.pt.trace.json.gz")
    for cmd in ("report", "gate", "merge"):
        bad_input(cli(cmd, str(f)), "worker0.pt.trace.json.gz", "is a file, not a folder")
    # summary takes one trace file on purpose (README): rank 0 of the 8 the trace says
    proc = cli("summary", str(f))
    assert proc.returncode == 0 and "1 of 8 ranks" in proc.stdout


def test_names_with_html_quotes_backslashes_and_invalid_utf8(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    evil = '<script>alert("x")</script> | a\\b \'q\' \udcff'
    n = 0
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e["name"].startswith("aten::"):
            e["name"] = evil
            n += 1
    assert n
    raw = __import__("json").dumps(t, ensure_ascii=False).encode("utf-8", "surrogateescape")
    assert b"\xff" in raw  # the file really holds a byte that is not UTF-8
    save(job / "rank0.trace.json.gz", raw)
    ts = load_tables(job)
    names = set(load_events(ts.ranks[0].path)[0]["name"].astype(str))
    assert evil.replace("\udcff", "\ufffd") in names
    assert any("invalid UTF-8" in w for w in ts.ranks[0].warnings)
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "<script>" not in (tmp_path / "o" / "report.html").read_text()
    proc = cli("merge", str(job), "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0, proc.stderr


def test_nan_and_infinity_times_are_skipped_and_counted(tmp_path, ddp_run):
    """Python's json writes NaN / Infinity (not JSON): those events are skipped and counted,
    the rest of the rank analysed, as for any other non-numeric time."""
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    xs = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"
          and e["name"].startswith("aten::")]
    xs[0]["ts"], xs[1]["dur"], xs[2]["dur"] = float("nan"), float("inf"), float("-inf")
    xs[3]["name"] = "NaN"  # the word in a string stays a name
    save(job / "rank0.trace.json.gz", t)
    assert b"NaN" in load_bytes(job / "rank0.trace.json.gz")
    ts = load_tables(job)
    rank = ts.ranks[0]
    events = load_events(rank.path)[0]
    assert any("NaN / Infinity" in w for w in rank.warnings)
    assert any("skipped 1 complete events" in w and "ts" in w for w in rank.warnings)
    assert any("skipped 2 complete events" in w and "dur" in w for w in rank.warnings)
    assert "NaN" in set(events["name"].astype(str))
    n_clean = len(load_events(copy_run(ddp_run, tmp_path / "clean") / "rank0.trace.json.gz")[0])
    assert len(events) == n_clean - 3
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr


def load_bytes(path) -> bytes:
    import gzip
    return gzip.decompress(path.read_bytes())


def test_integers_beyond_int64_in_args(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    big = 0
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and isinstance(e.get("args"), dict):
            e["args"]["External id"] = 2**70  # beyond int64 and uint64
            e["args"]["correlation"] = 2**63 + 5  # fits uint64, not int64
            big += 1
        if "c10d" in str(e.get("name", "")) or "gloo" in str(e.get("name", "")):
            e.setdefault("args", {})["In msg nelems"] = 2**65
            e["args"]["Group size"] = 10**30
    assert big
    save(job / "rank0.trace.json.gz", t)
    ts = load_tables(job)
    ev = load_events(ts.ranks[0].path)[0]
    assert (ev["external_id"] == -1).all() and (ev["correlation"] == -1).all()  # unknown, not wrapped
    for cmd in ("summary", "report", "merge"):
        extra = {"report": ["--out", str(tmp_path / "o")], "merge": ["-o", str(tmp_path / "m.json.gz")]}
        proc = cli(cmd, str(job), *extra.get(cmd, []))
        assert proc.returncode == 0, proc.stderr


def test_no_profiler_step_is_whole_trace_mode_and_said(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    for r in (0, 1):
        t = load(job / f"rank{r}.trace.json.gz")
        t["traceEvents"] = [e for e in t["traceEvents"]
                            if not str(e.get("name", "")).startswith("ProfilerStep")]
        save(job / f"rank{r}.trace.json.gz", t)
    ts = load_tables(job)
    assert ts.whole_trace_mode
    b = ts.breakdown
    assert list(b["step"]) == [0, 0]
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    assert "whole-trace mode" in cli("summary", str(job)).stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0 and "whole-trace mode" in proc.stdout.splitlines()[2]
    assert "whole-trace mode" in (tmp_path / "o" / "report.html").read_text()


def test_improperly_nested_events_on_one_thread(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank0.trace.json.gz")
    ops = [e for e in t["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    for a, b in zip(ops[::2], ops[1::2]):  # b starts inside a and ends after it
        b["tid"], b["ts"], b["dur"] = a["tid"], a["ts"] + max(1, a["dur"] // 2), a["dur"] * 3 + 5
    save(job / "rank0.trace.json.gz", t)
    ts = load_tables(job)
    b = ts.breakdown
    assert (b[IDENTITY].sum(axis=1) == b["step_ns"]).all()
    assert cli("report", str(job), "--out", str(tmp_path / "o")).returncode == 0
    proc = cli("merge", str(job), "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0
    # Perfetto would drop partially overlapping events: merge moves them to overlap tracks
    moved = re.search(r"(\d+) on overlap tracks", proc.stdout)
    assert moved and int(moved.group(1)) > 0, proc.stdout


def test_rank_with_only_metadata_events(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    t = load(job / "rank1.trace.json.gz")
    t["traceEvents"] = [e for e in t["traceEvents"] if e.get("ph") == "M"]
    assert t["traceEvents"]
    save(job / "rank1.trace.json.gz", t)
    _every_cli_refuses(job, "rank1.trace.json.gz", "no complete (ph X) events", reason="no_events")


def test_run_directory_without_manifest(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "manifest.json").unlink()
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(job)), str(job), "incomplete run", "--allow-incomplete")
    with pytest.raises(BadInput) as exc:
        analyse(job)
    assert exc.value.reason == "incomplete_run"
    proc = cli("report", str(job), "--allow-incomplete", "--out", str(tmp_path / "o"))
    assert proc.returncode == 0
    assert "Caveat: ddp: incomplete run (no manifest.json)" in proc.stdout.splitlines()[2]
    rep = analyse(job, AnalysisOptions(allow_incomplete=True))
    run = rep.runs[0]
    assert run.incomplete and run.parity.status == "not_recorded"
    assert rep.ranking.status == "withheld"
    proc = cli("gate", str(job), "--allow-incomplete")
    assert proc.returncode == 3 and "incomplete run" in proc.stdout
    proc = cli("merge", str(job), "--allow-incomplete", "-o", str(tmp_path / "m.json.gz"))
    assert proc.returncode == 0 and "incomplete run" in proc.stdout


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_numerics_with_nan_or_inf_fail_parity_naming_the_tensor(tmp_path, ddp_run, bad):
    job = copy_run(ddp_run, tmp_path / "ddp")
    table = pq.read_table(job / "numerics.parquet")
    df = table.to_pandas()
    grads = df[(df["kind"] == "grad") & (df["metric"] == "diff_sq_sum")]
    victim = str(grads["tensor"].iloc[2])
    df.loc[grads.index[2], "value"] = bad
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False),
                   job / "numerics.parquet")
    refresh_manifest(job)
    proc = cli("gate", str(job))
    assert proc.returncode == 3 and f"grad {victim}" in proc.stdout and "NaN/inf" in proc.stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert f"FAILED for ddp" in proc.stdout and victim in proc.stdout.splitlines()[2]


def test_newer_schema_version_is_refused(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "m")
    m = load(job / "manifest.json")
    m["schema_version"] = 99
    (job / "manifest.json").write_text(__import__("json").dumps(m))
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(job)), "manifest.json", "schema_version 99 is newer", "upgrade")
    for name in ("numerics.parquet", "steps.parquet"):
        job = copy_run(ddp_run, tmp_path / name)
        table = pq.read_table(job / name)
        pq.write_table(table.replace_schema_metadata({b"paritytrace.schema_version": b"99"}), job / name)
        refresh_manifest(job)
        bad_input(cli("report", str(job), "--out", str(tmp_path / "o")), name,
                  "schema_version 99 is newer", "upgrade")
    bad_input(cli("gate", str(tmp_path / "numerics.parquet")), "numerics.parquet", "newer")


def test_trace_edited_since_recorded_same_size_is_refused(tmp_path, ddp_run):
    """A trace whose bytes changed but not its size (here: the gzip header's mtime) is caught by
    the sha256 each parse computes (the parent no longer reads traces a second time to hash
    them), by the commands that read traces, after the per-rank caches were written."""
    run = copy_run(ddp_run, tmp_path / "ddp")
    assert cli("report", str(run), "--out", str(tmp_path / "o1")).returncode == 0  # caches now
    p = run / "rank1.trace.json.gz"
    raw = bytearray(p.read_bytes())
    raw[4:8] = bytes(b ^ 0xFF for b in raw[4:8])  # gzip MTIME: still a valid gzip, same size
    p.write_bytes(bytes(raw))
    for cmd in (["report", str(run), "--out", str(tmp_path / "o2")], ["summary", str(run)]):
        line = bad_input(cli(*cmd), "rank1.trace.json.gz", "sha256 differs from manifest.json",
                         "re-record")
        assert "changed since it was recorded" in line
    with pytest.raises(BadInput) as exc:
        load_tables(run)
    assert exc.value.reason == "file_changed"
