"""Ten-plus bad inputs beyond issue 5's list, as a new user with only the README would hit them.
Each gets one clear line (file, what is wrong, what to do), exit 2, no traceback -- or, where
the input is fine after all, a normal result."""

from __future__ import annotations

import gzip
import json
import shutil

from tests.remanifest import refresh_manifest
from tests.reliability.conftest import (TBPLUGIN, bad_input, cli, cli_proc, copy_run, load,
                                        need, save)


def test_manifest_that_is_not_json(tmp_path, ddp_run):  # 1: editor crash / half-copied file
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "manifest.json").write_text('{"schema_version": 1, "run')
    for cmd in ("report", "gate", "summary"):
        bad_input(cli(cmd, str(job)), "manifest.json", "not a readable JSON manifest", "re-record")


def test_manifest_from_an_older_tracer_lacking_keys(tmp_path, ddp_run):  # 2
    job = copy_run(ddp_run, tmp_path / "ddp")
    m = load(job / "manifest.json")
    del m["tolerance"], m["baseline"]
    (job / "manifest.json").write_text(json.dumps(m))
    bad_input(cli("report", str(job)), "manifest.json", "lacks tolerance, baseline", "re-record")


def test_manifest_with_a_wrong_type_or_unknown_strategy_and_with_extra_keys(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    m = load(job / "manifest.json")
    for key, sub, value, where in (("world_size", None, "2", "$.world_size"),
                                   ("device", "count", None, "$.device.count"),
                                   ("strategy", None, "zero3", "$.strategy")):
        bad = json.loads(json.dumps(m))
        if sub is None:
            bad[key] = value
        else:
            bad[key][sub] = value
        (job / "manifest.json").write_text(json.dumps(bad))
        bad_input(cli("report", str(job)), "manifest.json", where, "re-record")
    # keys this reader does not know (a newer tracer's additions) are ignored
    (job / "manifest.json").write_text(json.dumps({**m, "new_key": 1, "device": {**m["device"], "x": 2}}))
    assert cli("gate", str(job)).returncode == 0


def test_truncated_numerics_parquet(tmp_path, ddp_run):  # 3: copy interrupted
    job = copy_run(ddp_run, tmp_path / "ddp")
    raw = (job / "numerics.parquet").read_bytes()
    (job / "numerics.parquet").write_bytes(raw[: len(raw) // 3])
    # the manifest's size check alone catches it ...
    bad_input(cli("gate", str(job)), "numerics.parquet", "changed since it was recorded")
    refresh_manifest(job)  # ... and so does the Parquet reader
    bad_input(cli("gate", str(job)), "numerics.parquet", "not a readable Parquet file")


def test_file_listed_in_manifest_but_deleted(tmp_path, ddp_run):  # 4: "cleaned up" steps.parquet
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "steps.parquet").unlink()
    bad_input(cli("report", str(job)), "steps.parquet", "listed in manifest.json but missing",
              "restore")


def test_two_runs_with_the_same_name_under_one_root(tmp_path, ddp_run):  # 5: copied ddp to ddp2
    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    copy_run(ddp_run, root / "ddp_copy")
    bad_input(cli("gate", str(root)), str(root), "run name(s) ddp appear twice", "distinct run_name")


def test_negative_or_nan_tolerance(tmp_path, ddp_run):  # 6
    for value in ("-1", "nan"):
        line = bad_input(cli("gate", str(ddp_run), "--rtol", value), "--rtol", "finite number >= 0")
        assert "manifest" not in line  # the option is wrong, not the run


def test_unknown_report_format_and_missing_argument(tmp_path, ddp_run):  # 7: usage errors
    bad_input(cli("report", str(ddp_run), "--format", "pdf", "--out", str(tmp_path / "o")),
              "unknown format(s) pdf", "analyzer report --help")
    bad_input(cli("report"), "Missing argument", "--help")
    bad_input(cli_proc("sumary", str(ddp_run)), "No such command 'sumary'")


def test_stray_json_next_to_the_traces(tmp_path, ddp_run):  # 8: config.json in the trace folder
    job = tmp_path / "job"
    job.mkdir()
    for r in (0, 1):
        shutil.copy(ddp_run / f"rank{r}.trace.json.gz", job)
    (job / "config.json").write_text('{"lr": 0.1}')
    bad_input(cli("summary", str(job)), "config.json", "not a Chrome/Kineto trace")


def test_rank_beyond_the_world_size(tmp_path, ddp_run):  # 9: traces of a 2-rank and an 8-rank job
    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(ddp_run / "rank0.trace.json.gz", job)
    t = load(ddp_run / "rank1.trace.json.gz")
    t["distributedInfo"]["rank"] = 5
    save(job / "rank1.trace.json.gz", t)
    bad_input(cli("summary", str(job)), "rank1.trace.json.gz", "rank 5 but world size 2")


def test_merge_options_that_match_nothing(tmp_path, ddp_run):  # 10
    out = str(tmp_path / "m.json.gz")
    bad_input(cli("merge", str(ddp_run), "-o", out, "--steps", "99"), "no trace has ProfilerStep [99]")
    bad_input(cli("merge", str(ddp_run), "-o", out, "--ref-rank", "7"), "no trace of rank 7")
    bad_input(cli("merge", str(ddp_run), "-o", out, "--steps", "two"), "--steps")


def test_report_out_is_an_existing_file(tmp_path, ddp_run):  # 11
    (tmp_path / "notes.txt").write_text("mine")
    bad_input(cli("report", str(ddp_run), "--out", str(tmp_path / "notes.txt")),
              "is a file, not a folder", "--out")
    assert (tmp_path / "notes.txt").read_text() == "mine"  # nothing of the user's is overwritten


def test_gzip_named_json_and_plain_json_named_gz_just_work(tmp_path):  # 12: not an error at all
    job = tmp_path / "job"
    job.mkdir()
    (job / "worker0.json").write_bytes(gzip.compress(need(TBPLUGIN / "nccl__worker0.json").read_bytes()))
    (job / "worker1.json.gz").write_bytes((TBPLUGIN / "nccl__worker1.json").read_bytes())
    proc = cli("summary", str(job))
    assert proc.returncode == 0 and "2 of 2 ranks, rank from file name" in proc.stdout


def test_pointing_at_the_manifest_or_a_parquet_file(tmp_path, ddp_run):  # 13
    bad_input(cli("summary", str(ddp_run / "manifest.json")), "manifest.json", "not a Chrome/Kineto trace")
    bad_input(cli("summary", str(ddp_run / "steps.parquet")), "steps.parquet")
    bad_input(cli("report", str(ddp_run / "manifest.json")), "is a file, not a folder")
