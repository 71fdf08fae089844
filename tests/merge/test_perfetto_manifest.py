"""`analyzer merge --perfetto-manifest`: the manifest beside the merged trace follows Perfetto's
documented format 1 (https://perfetto.dev/docs/reference/perfetto-manifest) and its offsets
place every rank where `analyzer merge` put it, by the documented sign rule."""

from __future__ import annotations

import gzip
import json

import pytest

from analyzer.contract.errors import BadInput
from analyzer.ingest.rundirs import find_job
from analyzer.timeline.merge import MergeOptions, merge_traces
from analyzer.timeline.perfetto import check_names
from tests.inputs import cli
from tests.merge.builders import DLRM, gloo_rank, write

OFFSET_US = {0: 1000.0, 1: 2000.0, 2: 749.5}  # as tests/merge/test_merge_fixture.py
ENDS = {0: [500, 1500, 2500], 1: [501, 1502, 2499], 2: [500, 1500, 2500]}
CLOCKS = ("REALTIME", "REALTIME_COARSE", "MONOTONIC", "MONOTONIC_COARSE", "MONOTONIC_RAW",
          "BOOTTIME")
I64 = (-(2**63), 2**63 - 1)


def check_documented_format(text: str) -> dict:
    """Every rule of the reference page that applies to what we write, or AssertionError.
    Returns the manifest's inner object."""
    assert text.lstrip().startswith("{") and text.lstrip()[1:].lstrip().startswith(
        '"perfetto_manifest"')  # "Detection": contents start with {"perfetto_manifest"
    doc = json.loads(text)
    assert list(doc) == ["perfetto_manifest"]  # "a single top-level perfetto_manifest key"
    m = doc["perfetto_manifest"]
    assert set(m) <= {"version", "trace_time", "files", "attributes"}
    assert type(m["version"]) is int and m["version"] == 1
    assert "trace_time" not in m  # clockless files: no clock to name
    paths = [f["path"] for f in m["files"]]
    for f in m["files"]:
        assert set(f) <= {"path", "machine", "machines", "clocks"}
        assert isinstance(f["path"], str) and f["path"]
        assert not ("machine" in f and "machines" in f)
        if "machine" in f:
            assert set(f["machine"]) == {"name"} and isinstance(f["machine"]["name"], str)
            assert f["machine"]["name"]
        if "clocks" in f:
            c = f["clocks"]
            assert set(c) <= {"clock", "machine", "sync_to", "offset_ns"}
            assert "clock" not in c  # PIN: a clockless (Chrome JSON) file
            assert set(c["sync_to"]) <= {"file", "machine", "clock"}
            assert c["sync_to"]["file"] in paths  # "must match the path of an entry in files"
            assert c["sync_to"].get("clock", "BOOTTIME") in CLOCKS
            off = c.get("offset_ns", 0)
            assert type(off) is int and I64[0] < off <= I64[1]  # integer, not INT64_MIN
    attrs = m.get("attributes", {})
    assert all(k and isinstance(v, (str, int)) and not isinstance(v, bool)
               for k, v in attrs.items())
    return m


def _trace_events(path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)["traceEvents"]


def check_against_merge(res, m: dict) -> None:
    """Every rank once, by its trace's base name, pinned to the reference rank's file; and by
    the documented rule (the source clock reads T when the reference reads T + offset_ns) each
    complete event lands where analyzer merge wrote it (merged ts + t0 on the reference
    clock)."""
    files = {f["path"]: f for f in m["files"]}
    by_rank = {r.rank: r.path for r in res.ranks}
    assert sorted(files) == sorted(p.name for p in by_rank.values())
    assert len(m["files"]) == len(by_rank)
    ref = by_rank[res.ref_rank].name
    assert "clocks" not in files[ref]
    applied = dict(zip(res.offsets["rank"], res.offsets["offset_ns"]))
    merged = [e for e in _trace_events(res.out_path) if e.get("ph") == "X"]
    for rank, path in by_rank.items():
        f = files[path.name]
        assert f["machine"] == {"name": f"rank {rank}"}
        if rank == res.ref_rank:
            continue
        assert f["clocks"]["sync_to"] == {"file": ref}
        offset = f["clocks"]["offset_ns"]
        assert offset == (-int(applied[rank]) if _aligned(res) else 0)
        # each collective of the rank, found in the merged trace by its name and duration
        for src in (e for e in _trace_events(path) if e.get("name") == "gloo:all_reduce"):
            _lands_where_merge_put_it(res, merged, rank, src, offset)


def _lands_where_merge_put_it(res, merged: list[dict], rank: int, src: dict, offset: int):
    got = [e for e in merged if e["pid"] == rank + 1 and e["name"] == src["name"]
           and e["dur"] == src["dur"]]
    assert got, (rank, src["name"])
    on_ref_ns = round(src["ts"] * 1000) + offset  # the documented rule
    assert any(round(e["ts"] * 1000) + res.t0_ns == on_ref_ns for e in got), (rank, src)


def _aligned(res) -> bool:
    return json.loads(res.sidecar_path.read_text())["aligned"]


@pytest.fixture()
def job(tmp_path):
    d = tmp_path / "job"
    for r in range(3):
        write(d / f"rank{r}.trace.json.gz", gloo_rank(r, 3, offset_us=OFFSET_US[r], ends_us=ENDS[r]))
    return d


@pytest.mark.parametrize("align", [True, False], ids=["aligned", "no_align"])
def test_hand_built_job(job, tmp_path, align):
    out = tmp_path / "out" / "merged.json.gz"
    res = merge_traces(job, out, MergeOptions(perfetto_manifest=True, align=align))
    assert res.manifest_path == tmp_path / "out" / "merged.perfetto_manifest.json"
    m = check_documented_format(res.manifest_path.read_text())
    check_against_merge(res, m)
    offsets = {f["path"]: f.get("clocks", {}).get("offset_ns") for f in m["files"]}
    # rank 1's clock runs 1001 us ahead of rank 0's: it moves 1001 us earlier (negative)
    want = {"rank0.trace.json.gz": None, "rank1.trace.json.gz": -1_001_000,
            "rank2.trace.json.gz": 250_500} if align else \
        {"rank0.trace.json.gz": None, "rank1.trace.json.gz": 0, "rank2.trace.json.gz": 0}
    assert offsets == want
    # nothing outside the output's folder, and there only the three outputs (no temp file)
    assert sorted(p.name for p in out.parent.iterdir()) == [
        "merged.json.gz", "merged.offsets.json", "merged.perfetto_manifest.json"]


def test_ref_rank_is_the_files_sync_target(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.json.gz", MergeOptions(perfetto_manifest=True,
                                                                 ref_rank=2))
    m = check_documented_format(res.manifest_path.read_text())
    check_against_merge(res, m)
    assert m["attributes"]["paritytrace.ref_rank"] == 2


def test_without_the_option_no_manifest(job, tmp_path):
    res = merge_traces(job, tmp_path / "m.json.gz")
    assert res.manifest_path is None
    assert not list(tmp_path.glob("*perfetto_manifest*"))


def test_cli_writes_it_beside_the_trace_and_prints_the_command(job, tmp_path):
    out = tmp_path / "o" / "merged.json.gz"
    proc = cli("merge", str(job), "-o", str(out), "--perfetto-manifest")
    assert proc.returncode == 0, proc.stderr
    manifest = tmp_path / "o" / "merged.perfetto_manifest.json"
    check_documented_format(manifest.read_text())
    assert f"trace_processor util merge -o {tmp_path / 'o' / 'merged.perfetto.tar'} " \
           f"--manifest {manifest} {job / 'rank0.trace.json.gz'}" in proc.stdout


def test_the_manifest_in_the_trace_folder_is_not_an_input(job, tmp_path):
    """Merged into the job's own folder (merge's default), the manifest is skipped by every
    later folder walk, as the merged trace and its sidecar are."""
    assert cli("merge", str(job), "--perfetto-manifest").returncode == 0
    assert (job / "merged.perfetto_manifest.json").is_file()
    assert [p.name for p in find_job(job).traces] == [f"rank{r}.trace.json.gz" for r in range(3)]
    assert cli("merge", str(job), "--perfetto-manifest").returncode == 0


def test_same_base_name_is_refused(tmp_path):
    a, b = tmp_path / "a" / "rank.json", tmp_path / "b" / "rank.json"
    with pytest.raises(BadInput) as exc:
        check_names({0: a, 1: b}, tmp_path)
    assert exc.value.reason == "bad_option" and "'rank.json'" in exc.value.message


@pytest.mark.integration
def test_corpus_job(tmp_path):
    if not (DLRM / "worker0.pt.trace.json.gz").exists():
        pytest.skip("PARITYTRACE_CORPUS is not set: no dlrm_ddp_8rank_v100")
    res = merge_traces(DLRM, tmp_path / "dlrm.json.gz", MergeOptions(perfetto_manifest=True))
    m = check_documented_format(res.manifest_path.read_text())
    assert [f["path"] for f in m["files"]] == [f"worker{r}.pt.trace.json.gz" for r in range(8)]
    applied = dict(zip(res.offsets["rank"], res.offsets["offset_ns"]))
    for r, f in enumerate(m["files"]):
        if r == res.ref_rank:
            assert "clocks" not in f
        else:
            assert f["clocks"] == {"sync_to": {"file": "worker0.pt.trace.json.gz"},
                                   "offset_ns": -int(applied[r]) if _aligned(res) else 0}
