"""`analyzer merge` on the published DLRM 8-rank set (corpus), and HTA loading what we write."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from analyzer.timeline.chrome_check import check_trace
from analyzer.timeline.merge import merge_traces
from tests.corpus import needs_corpus
from tests.merge.builders import DLRM, read

pytestmark = [pytest.mark.integration, needs_corpus]

# injected per-rank clock shifts (whole us, so the shifted JSON stays exact)
SHIFT_US = {r: (r * 1237 - 3000) * (1 if r % 2 else -1) for r in range(8)}


def raw(rank):
    return json.loads(gzip.decompress((DLRM / f"worker{rank}.pt.trace.json.gz").read_bytes()))


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    out = tmp_path_factory.mktemp("dlrm") / "merged.trace.json.gz"
    return merge_traces(DLRM, out)


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    d = tmp_path_factory.mktemp("dlrm_shifted")
    for r in range(8):
        data = raw(r)
        for e in data["traceEvents"]:
            if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float)):
                e["ts"] += SHIFT_US[r]
        (d / f"worker{r}.pt.trace.json.gz").write_bytes(gzip.compress(json.dumps(data).encode()))
    return merge_traces(d, d / "out" / "merged.trace.json.gz")


def test_merged_dlrm_passes_the_structural_check_and_keeps_every_event(dlrm):
    merged = read(dlrm.out_path)
    assert check_trace(merged) == []
    n_in = sum(sum(1 for e in raw(r)["traceEvents"] if e.get("ph") == "X") for r in range(8))
    assert sum(1 for e in merged["traceEvents"] if e["ph"] == "X") == n_in
    names = sorted(e["args"]["name"] for e in merged["traceEvents"]
                   if e["ph"] == "M" and e["name"] == "process_name")
    assert names == [f"rank {r}" for r in range(8)]


def test_offsets_are_reported_for_every_rank(dlrm):
    side = read(dlrm.sidecar_path)
    # every NCCL kernel of a rank is a collective all ranks run (3 AllReduce, 5 SendRecv of all_to_all)
    n_nccl = {r: sum(1 for e in raw(r)["traceEvents"]
                     if e.get("cat") == "kernel" and e["name"].startswith("ncclKernel_")) for r in range(8)}
    assert {o["rank"]: o["n_matched"] for o in side["offsets"]} == n_nccl
    assert all(o["mad_ns"] is not None and o["lo_ns"] <= o["offset_ns"] <= o["hi_ns"]
               for o in side["offsets"])


def test_matched_all_reduce_ends_do_not_spread_after_alignment(dlrm):
    # one host, one clock: alignment may only tighten what is already aligned
    sp = dlrm.spread
    ar = sp[sp["kind"] == "all_reduce"]
    assert len(ar) == 3 and (ar["n_ranks"] == 8).all()
    assert sp["spread_after_ns"].sum() <= sp["spread_before_ns"].sum()


def test_injected_clock_shifts_are_recovered_exactly(dlrm, shifted):
    base = dlrm.offsets.set_index("rank")["offset_ns"]
    got = shifted.offsets.set_index("rank")["offset_ns"]
    for r in range(8):
        assert got[r] - base[r] == (SHIFT_US[r] - SHIFT_US[0]) * 1000
    ar_before = shifted.spread[shifted.spread["kind"] == "all_reduce"]["spread_before_ns"]
    ar_after = shifted.spread[shifted.spread["kind"] == "all_reduce"]["spread_after_ns"]
    biggest = max(SHIFT_US.values()) - min(SHIFT_US.values())
    assert (ar_before >= biggest * 1000 - 10_000).all()  # the shifts dominate before alignment
    assert list(ar_after) == list(dlrm.spread[dlrm.spread["kind"] == "all_reduce"]["spread_after_ns"])
    assert check_trace(read(shifted.out_path)) == []


def test_hta_loads_the_merged_trace(dlrm):
    pytest.importorskip("hta.trace_analysis")
    from tests.merge.builders import hta_trace_facts

    got = hta_trace_facts({0: str(dlrm.out_path)}, str(dlrm.out_path.parent))[0]
    assert got["pids"] == list(range(1, 9))
    assert sum(1 for n in got["names"] if re.match(r"^ncclKernel_", n)) == 8 * 8


def test_tbplugin_nccl_pair_with_old_kernel_category(tmp_path):
    # kineto tb_plugin test traces: no distributedInfo (rank from the file name), cat "Kernel";
    # the plugin's published expectations list 1 broadcast and 1 all_reduce per worker
    from tests.merge.builders import CORPUS
    d = tmp_path / "tb"
    d.mkdir()
    for r in (0, 1):
        (d / f"nccl__worker{r}.json").write_bytes((CORPUS / "tbplugin_2rank" / f"nccl__worker{r}.json").read_bytes())
    res = merge_traces(d, tmp_path / "m.json")
    assert sorted(res.spread["kind"]) == ["all_reduce", "broadcast"]
    assert [r.rank_source for r in res.ranks] == ["file name", "file name"]
    assert check_trace(read(res.out_path)) == []
