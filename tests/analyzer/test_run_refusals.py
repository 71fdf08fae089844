"""Bad run directories are refused by every command alike, with one line naming the file
(exit 2, no traceback) and a stable reason code: a manifest that is not JSON, lacks keys or is
of a newer schema; a listed file missing, truncated or changed since the record (also a kept
tensor); two runs with one name under a root."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from analyzer.api import load_tables
from analyzer.contract.errors import BadInput
from tests.inputs import bad_input, cli, copy_run, load
from tests.remanifest import refresh_manifest


# the manifest

def test_manifest_that_is_not_json(tmp_path, ddp_run):  # editor crash / half-copied file
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "manifest.json").write_text('{"schema_version": 1, "run')
    for cmd in ("report", "gate", "summary"):
        bad_input(cli(cmd, str(job)), "manifest.json", "not a readable JSON manifest", "re-record")


def test_manifest_from_an_older_tracer_lacking_keys(tmp_path, ddp_run):
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


@pytest.mark.parametrize("edit, says", [
    ({"strategy": "fsdp"}, "manifest.json: manifest $.strategy_options lists bucket_cap_mb, "
     "gradient_as_bucket_view, static_graph, which fsdp does not take: the strategy or its "
     "options were edited; re-record the run"),
    ({"bucket_cap_mb": -1}, "manifest.json: manifest $.strategy_options.bucket_cap_mb -1 is "
     'neither a positive number of MiB nor "default"; re-record the run'),
    ({"bucket_cap_mb": "defaultx"}, 'manifest.json: manifest $.strategy_options.bucket_cap_mb '
     '"defaultx" is neither a positive number of MiB nor "default"; re-record the run'),
])
def test_strategy_options_the_strategy_does_not_take_are_refused_when_read(tmp_path, ddp_run,
                                                                          edit, says):
    """A finished ddp run's manifest edited to say fsdp (keeping ddp's options), or its bucket
    size to one no record writes: refused when the manifest is read, one line, exit 2, from
    report, gate and summary alike (report used to rank "fsdp (bucket_cap_mb=25.0, ...)")."""
    job = copy_run(ddp_run, tmp_path / "ddp")
    m = load(job / "manifest.json")
    if "strategy" in edit:
        m["strategy"] = edit["strategy"]
    else:
        m["strategy_options"].update(edit)
    (job / "manifest.json").write_text(json.dumps(m))
    for cmd in ("report", "gate", "summary"):
        bad_input(cli(cmd, str(job)), says)


@pytest.mark.parametrize("strategy, mesh, says", [
    ("hsdp", None, "is missing"),
    ("hsdp", {"shape": [2, 3], "dim_names": ["replicate", "shard"]}, "holds 6 ranks, not world_size 2"),
    ("hsdp", {"shape": [0, 2], "dim_names": ["replicate", "shard"]}, "not a list of positive sizes"),
    ("fsdp2_tp", {"shape": [1, 2], "dim_names": ["tp", "tp"]}, "are not ['dp', 'tp']"),
    ("hsdp", {"shape": [2], "dim_names": ["replicate"]}, "are not ['replicate', 'shard']"),
    ("pp", {"shape": [1, 2], "dim_names": ["dp", "pp"], "microbatches": 0,
            "pp_stages": [["layers.0"], ["layers.1"]], "stage_params": [1, 1]}, "microbatches 0"),
    ("pp", {"shape": [1, 2], "dim_names": ["dp", "pp"], "microbatches": 2, "pp_stages": [],
            "stage_params": [1, 1]}, "pp_stages lists 0 stages, not the 2"),
])
def test_a_mesh_that_cannot_describe_the_ranks_is_refused(tmp_path, ddp_run, strategy, mesh, says):
    """A mesh strategy's manifest mesh is checked before any figure is drawn from it: one line,
    exit 2, from report and gate alike (it would otherwise crash or show shares of a wrong
    world)."""
    job = copy_run(ddp_run, tmp_path / "ddp")
    m = load(job / "manifest.json")
    m["strategy"] = strategy
    if mesh is not None:
        m["mesh"] = mesh
    (job / "manifest.json").write_text(json.dumps(m))
    for cmd in ("report", "gate"):
        bad_input(cli(cmd, str(job)), "manifest.json", "$.mesh", says, "re-record")


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


def test_two_runs_with_the_same_name_under_one_root(tmp_path, ddp_run):  # copied ddp to ddp2
    root = tmp_path / "traces"
    copy_run(ddp_run, root / "ddp")
    copy_run(ddp_run, root / "ddp_copy")
    bad_input(cli("gate", str(root)), str(root), "run name(s) ddp appear twice", "distinct run_name")


# a file listed in the manifest: missing, truncated

def test_file_listed_in_manifest_but_deleted(tmp_path, ddp_run):  # "cleaned up" steps.parquet
    job = copy_run(ddp_run, tmp_path / "ddp")
    (job / "steps.parquet").unlink()
    bad_input(cli("report", str(job)), "steps.parquet", "listed in manifest.json but missing",
              "restore")


def test_merge_refuses_a_run_whose_listed_trace_is_missing(ddp_run, tmp_path):
    run = copy_run(ddp_run, tmp_path / "ddp")
    (run / "rank1.trace.json.gz").unlink()
    want = bad_input(cli("report", str(run), "--out", str(tmp_path / "rep")),
                     "rank1.trace.json.gz listed in manifest.json but missing")
    assert bad_input(cli("merge", str(run), "-o", str(tmp_path / "m.json.gz"))) == want


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


def test_truncated_numerics_parquet(tmp_path, ddp_run):  # copy interrupted
    job = copy_run(ddp_run, tmp_path / "ddp")
    raw = (job / "numerics.parquet").read_bytes()
    (job / "numerics.parquet").write_bytes(raw[: len(raw) // 3])
    # the manifest's size check alone catches it ...
    bad_input(cli("gate", str(job)), "numerics.parquet", "changed since it was recorded")
    refresh_manifest(job)  # ... and so does the Parquet reader
    bad_input(cli("gate", str(job)), "numerics.parquet", "not a readable Parquet file")


# a file changed since the record

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


def test_plain_json_trace_of_a_run_is_checked_against_the_manifest(tmp_path, ddp_run):
    """A run's trace stored as plain JSON is not hashed by its parse (docs/caches.md), but by
    the manifest check: checked unchanged, refused once edited, cached or not."""
    import gzip

    run = copy_run(ddp_run, tmp_path / "ddp")
    p = run / "rank1.trace.json.gz"
    p.write_bytes(gzip.decompress(p.read_bytes()))  # the same trace, stored plain
    refresh_manifest(run)
    for _ in range(2):  # parsed, then from its cache
        with load_tables(run) as job:
            assert [r.sha256 == "" for r in job.ranks] == [False, True]
    text = p.read_bytes()
    assert b'"cpu_op"' in text
    p.write_bytes(text.replace(b'"cpu_op"', b'"cpu_oq"', 1))  # same size: only the hash sees it
    with pytest.raises(BadInput) as exc:
        load_tables(run)
    assert exc.value.reason == "file_changed" and "sha256 differs" in str(exc.value)


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


def test_tamper_error_printed_once(ddp_run, tmp_path):
    from safetensors.numpy import load_file, save_file

    a = copy_run(ddp_run, tmp_path / "a")
    b = copy_run(ddp_run, tmp_path / "b")
    path = b / "baseline.safetensors"
    tensors = load_file(str(path))
    name = sorted(tensors)[0]
    changed = tensors[name].copy()
    changed.view(np.uint8).flat[0] ^= 1  # one byte
    tensors[name] = changed
    save_file(tensors, str(path))
    line = bad_input(cli("drift", str(a), str(b)), str(path), f"tensor {name} changed")
    assert line.count("changed after the record") == 1
