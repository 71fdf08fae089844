"""Bad traces and trace folders are refused by every command that reads them (summary, report,
merge, gate), each with one line naming the file, what is wrong and what to do (exit 2, no
traceback), and by the library with a typed ``BadInput`` and its stable reason code. Inputs are
real corpus traces and real records, corrupted copy by copy in tmp_path."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from analyzer.api import load_tables
from analyzer.contract.errors import BadInput
from tests.inputs import DLRM, TBPLUGIN, bad_input, cli, cli_proc, copy_run, load, need, save

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


# one bad input per row: how its folder is made, what the one line names, the reason code

def _job(tmp_path, name: str, data: bytes):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / name).write_bytes(data)
    return tmp_path / "job"


def _truncated_json_gz(tmp_path, request):
    raw = need(DLRM / "worker0.pt.trace.json.gz").read_bytes()
    return _job(tmp_path, "worker0.json.gz", raw[: len(raw) // 2])


def _truncated_json(tmp_path, request):
    data = json.dumps(load(need(DLRM / "worker0.pt.trace.json.gz"))).encode()
    return _job(tmp_path, "worker0.json", data[: len(data) * 2 // 3])


def _file(name: str, data: bytes):
    return lambda tmp_path, request: _job(tmp_path, name, data)


def _trace_events(value):
    def build(tmp_path, request):
        t = load(need(DLRM / "worker0.pt.trace.json.gz"))
        t["traceEvents"] = value
        save(tmp_path / "job" / "worker0.json.gz", t)
        return tmp_path / "job"
    return build


def _duplicate_rank(tmp_path, request):
    job = tmp_path / "job"
    shutil.copytree(need(DLRM), job)
    shutil.copy(job / "worker3.pt.trace.json.gz", job / "worker3_again.pt.trace.json.gz")
    return job


def _only_metadata_events(tmp_path, request):
    # a single metadata-only file is refused; beside other ranks it is an empty rank
    # (tests/analyzer/test_device_steps.py)
    t = load(request.getfixturevalue("ddp_run") / "rank1.trace.json.gz")
    t["traceEvents"] = [e for e in t["traceEvents"] if e.get("ph") == "M"]
    assert t["traceEvents"]
    (tmp_path / "ddp").mkdir()
    save(tmp_path / "ddp" / "rank1.trace.json.gz", t)
    return tmp_path / "ddp"


REFUSED = [
    pytest.param("truncated", _truncated_json_gz, ["worker0.json.gz", "truncated"],
                 id="truncated-json_gz"),
    pytest.param("truncated", _truncated_json, ["worker0.json"], id="truncated-json"),
    *[pytest.param("not_a_trace", _file(name, b""), [name], id=f"not_a_trace-empty_{name}")
      for name in ("rank0.json", "rank0.json.gz")],
    *[pytest.param("not_a_trace", _file("rank0.json", payload), ["rank0.json"],
                   id=f"not_a_trace-json_{kind}")
      for kind, payload in (("object", b'{"lr": 0.1, "epochs": 3}'), ("list", b"[1, 2, 3]"),
                            ("string", b'"text"'))],
    *[pytest.param("not_a_trace", _trace_events(value), ["worker0.json.gz"],
                   id=f"not_a_trace-traceEvents_{type(value).__name__}")
      for value in ({"a": 1}, "oops", 7, [1, "x", None])],
    pytest.param("duplicate_rank", _duplicate_rank,
                 ["worker3.pt.trace.json.gz", "worker3_again.pt.trace.json.gz", "rank 3"],
                 id="duplicate_rank"),
    pytest.param("no_events", _only_metadata_events,
                 ["rank1.trace.json.gz", "no complete (ph X) events"], id="no_events-only_metadata"),
]


@pytest.mark.integration
@pytest.mark.parametrize("reason,build,must", REFUSED)
def test_every_command_refuses(tmp_path, request, reason, build, must):
    _every_cli_refuses(build(tmp_path, request), *must, reason=reason)


# a folder with several problems: all said, one per line

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


# what is not a trace

def test_text_file_is_not_json(tmp_path):
    txt = tmp_path / "file.txt"
    txt.write_text("hello world\nthis is not a trace\n")
    line = bad_input(cli("summary", str(txt)), str(txt), "not JSON", "not a Chrome/Kineto trace")
    assert "truncated" not in line and "copy the trace again" not in line
    cut = tmp_path / "cut.json"
    cut.write_text('{"traceEvents": [{"ph": "X", "name": "a"')
    assert "truncated" in bad_input(cli("summary", str(cut)), str(cut))


def test_stray_json_next_to_the_traces(tmp_path, ddp_run):  # config.json in the trace folder
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        shutil.copy(ddp_run / f"rank{r}.trace.json.gz", job)
    (job / "config.json").write_text('{"lr": 0.1}')
    bad_input(cli("summary", str(job)), "config.json", "not a Chrome/Kineto trace")


def test_pointing_at_the_manifest_or_a_parquet_file(tmp_path, ddp_run):
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(ddp_run / "manifest.json")), "manifest.json",
                  "is a run directory's manifest, not a trace")
    bad_input(cli("summary", str(ddp_run / "steps.parquet")), "steps.parquet")


# paths: missing, empty, a file where a folder is needed

@pytest.mark.integration
def test_path_that_does_not_exist(tmp_path):
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(tmp_path / "nope")), "nope", "no such file or folder")
    # and through a fresh interpreter, exactly as typed in a shell
    bad_input(cli_proc("report", str(tmp_path / "nope")), "nope", "no such file or folder")


def test_empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    for cmd in ("summary", "report", "gate", "merge"):
        bad_input(cli(cmd, str(tmp_path / "empty")), str(tmp_path / "empty"), "no ")


@pytest.mark.integration
def test_one_trace_file_is_a_job_for_every_command(tmp_path):
    # as summary and HTA do: rank 0 of the 8 the trace says (corpus README), before refused
    # by report, gate and merge as "is a file, not a folder"
    f = tmp_path / "worker0.pt.trace.json.gz"
    shutil.copy(need(DLRM / "worker0.pt.trace.json.gz"), f)
    proc = cli("summary", str(f))
    assert proc.returncode == 0 and "1 of 8 ranks" in proc.stdout
    proc = cli("report", str(f))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines()[-1].endswith(f"to {f}.report")  # says where it wrote
    assert "partial: 1 of 8 ranks have a trace (no trace: ranks 1, 2, 3, 4, 5, 6, 7)" in (
        tmp_path / "worker0.pt.trace.json.gz.report" / "report.md").read_text()
    proc = cli("gate", str(f))  # foreign traces carry no numerics: not verified
    assert proc.returncode == 3 and "not verified" in proc.stdout.splitlines()[-1]
    assert "not numerically equivalent" not in proc.stdout
    proc = cli("merge", str(f))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "merged.trace.json.gz").is_file()
    proc = cli("report", str(tmp_path))  # the folder: the merged trace and FILE.report skipped
    assert proc.returncode == 0, proc.stderr


# ranks of different jobs, ranks beyond the world size

@pytest.mark.integration
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


def test_mixed_jobs_refused(ddp_run, fsdp_run, tmp_path):
    folder = tmp_path / "mix"
    folder.mkdir()
    shutil.copy(ddp_run / "rank0.trace.json.gz", folder / "ddp_rank0.json.gz")
    shutil.copy(fsdp_run / "rank1.trace.json.gz", folder / "fsdp_rank1.json.gz")
    for cmd, extra in (("summary", []), ("report", ["--out", str(tmp_path / "rep")])):
        line = bad_input(cli(cmd, str(folder), *extra), "different jobs", "ddp_rank0.json.gz",
                         "fsdp_rank1.json.gz")
        assert "all_reduce" in line and "all_gather" in line  # the evidence
    from analyzer.api import load_tables

    with pytest.raises(BadInput) as exc:
        load_tables(folder)
    assert exc.value.reason == "mixed_jobs"


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


@pytest.mark.integration
def test_same_job_sets_still_load(ddp_run, fsdp_run, tmp_path):
    from analyzer.api import load_tables

    folders = [copy_run(ddp_run, tmp_path / "ddp"), copy_run(fsdp_run, tmp_path / "fsdp")]
    if DLRM.exists():
        folders.append(DLRM)
    for backend in ("gloo_cpu", "nccl"):
        pair = tmp_path / f"tb_{backend}"
        pair.mkdir()
        for r in (0, 1):
            shutil.copy(need(TBPLUGIN / f"{backend}__worker{r}.json"), pair)
        folders.append(pair)
    for folder in folders:
        ts = load_tables(folder)
        assert len(ts.ranks) == (8 if folder == DLRM else 2), folder


def test_rank_beyond_the_world_size(tmp_path, ddp_run):  # traces of a 2-rank and an 8-rank job
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(ddp_run / "rank0.trace.json.gz", job)
    t = load(ddp_run / "rank1.trace.json.gz")
    t["distributedInfo"]["rank"] = 5
    save(job / "rank1.trace.json.gz", t)
    bad_input(cli("summary", str(job)), "rank1.trace.json.gz", "rank 5 but world size 2")


# gate on broken foreign traces: bad input (2), not a parity failure (3)

@pytest.mark.integration
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
