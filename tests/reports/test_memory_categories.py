"""Memory by category in the report (issue 19): the rows of report.json, the ratio to DDP beside
sharding's prediction, ``--device-memory``, the ranking's tie-break, and the peaks read from any
trace's ``[memory]`` events. Every expected number is worked out by hand from the fixture."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analyzer.analyses import memory
from analyzer.compare.runs import analyse
from analyzer.contract import report_types, schemas
from analyzer.contract.errors import BadInput
from analyzer.contract.schemas import NO_VALUE
from analyzer.contract.report_types import AnalysisOptions
from reports import html, markdown
from reports import memory as memory_section
from tests.inputs import CORPUS, bad_input, cli, need
from tests.remanifest import refresh_manifest
from tests.reports.builders import write_categories, write_run

MiB = 1 << 20
GiB = 1 << 30
MS = 1_000_000
FIX = Path(__file__).resolve().parents[2] / "fixtures" / "core" / "memory_events.json"


def _root(tmp_path: Path) -> Path:
    """ddp and fsdp2 tie on step time (7 ms); the profiler-window peak (steps.parquet) says ddp
    is smaller (10 MiB vs 50 MiB), what the ranks hold says fsdp2 is (its sharded state)."""
    root = tmp_path / "traces"
    walls = {0: (1, 1), 1: (7 * MS, 7 * MS), 2: (7 * MS, 7 * MS)}
    ddp = {"parameters": 400 * MiB, "gradients": 400 * MiB, "optimizer_state": 800 * MiB,
           "activations": 100 * MiB}
    half = {"parameters": 200 * MiB, "gradients": 200 * MiB, "optimizer_state": 400 * MiB,
            "activations": 100 * MiB}
    write_run(root / "single", strategy="single", walls={0: (1,), 1: (20 * MS,), 2: (20 * MS,)},
              categories={0: {**ddp, "activations": 200 * MiB}})
    write_run(root / "ddp", strategy="ddp", walls=walls, peak_alloc=10 * MiB,
              categories={0: ddp, 1: ddp})
    write_run(root / "fsdp2", strategy="fsdp2", walls=walls, peak_alloc=50 * MiB,
              options={"reshard_after_forward": True}, categories={0: half, 1: {**half, "parameters": 201 * MiB}})
    return root


def test_report_holds_the_categories_per_rank_with_their_names(tmp_path):
    rep = analyse(_root(tmp_path))
    assert report_types.decode(report_types.encode(rep)) == rep
    data = json.loads(report_types.encode(rep))
    ddp = next(r for r in data["runs"] if r["name"] == "ddp")
    rows = ddp["memory"]["by_category"]
    assert {r["category"] for r in rows} == set(schemas.MEMORY_CATEGORIES)
    assert {(r["rank"], r["category"]): r["bytes"] for r in rows} == {
        (rank, c): b for rank in (0, 1) for c, b in (
            ("parameters", 400 * MiB), ("gradients", 400 * MiB), ("optimizer_state", 800 * MiB),
            ("activations", 100 * MiB), ("peak", 1700 * MiB))}
    assert ddp["memory"]["peak_allocated_bytes"] == 1700 * MiB
    assert "parameters + gradients + optimizer state + activations" in ddp["memory"]["peak_source"]


def test_ranking_tie_break_uses_the_held_peak_not_the_profiler_window(tmp_path):
    """Equal medians: fsdp2 (peak 901 MiB on rank 1) before ddp (1700 MiB), though the
    profiler-window figures (10 vs 50 MiB) say the opposite."""
    rep = analyse(_root(tmp_path))
    by = {r.name: r for r in rep.runs}
    assert by["fsdp2"].memory.peak_allocated_bytes == (201 + 200 + 400 + 100) * MiB
    assert by["ddp"].memory.ranks[0].profiler_allocated_peak_bytes == 10 * MiB
    assert rep.ranking.order[:2] == ["fsdp2", "ddp"]


def test_ratio_to_ddp_beside_the_sharding_prediction(tmp_path):
    rep = analyse(_root(tmp_path))
    heads, rows = memory_section.ratio_rows(rep)
    got = {(r[0], r[1]): (r[4], r[5]) for r in rows}
    assert got[("fsdp2", "parameters")] == (f"{201 / 400:.3f}", "1/2 = 0.500")
    assert got[("fsdp2", "optimizer state")] == ("0.500", "1/2 = 0.500")
    assert got[("fsdp2", "activations")] == ("1.000", "1.000")
    assert got[("single", "activations")] == ("2.000", "2.000")  # the whole global batch
    assert got[("fsdp2", "peak")][1] == "-"
    md = markdown.render(rep)
    assert "### Ratio to DDP" in md and "1/2 = 0.500" in md
    page = html.render(rep)
    assert "Memory per rank by category" in page and "<svg" in page
    assert "Process peak RSS per rank" in page  # RSS apart, labelled


def test_device_memory_from_a_cpu_record_is_a_lower_bound(tmp_path):
    """A CPU record's peak is the sum of what the rank holds, a lower bound: below the device
    it proves nothing (fits not known, said as such), above it proves "does not fit"."""
    rep = analyse(_root(tmp_path), AnalysisOptions(device_memory_bytes=GiB))
    fits = {r.name: r.memory.fit for r in rep.runs}
    assert fits["fsdp2"].fits is None and fits["fsdp2"].lower_bound
    assert fits["fsdp2"].spare_bytes == GiB - 901 * MiB
    assert fits["ddp"].fits is False and fits["ddp"].spare_bytes == GiB - 1700 * MiB
    lines = memory_section.fit_lines(rep)
    assert lines[2].startswith("fsdp2: not known whether it fits one 1.00 GiB device (lower "
                               "bound, CPU record: sum of categories 901.0 MiB on its largest "
                               "rank, "
                               "123.0 MiB under the device")
    assert "to spare" not in " ".join(lines)
    assert lines[1].startswith("ddp: does not fit at this batch on one 1.00 GiB device: needs "
                               "676.0 MiB more even by a lower bound (lower bound, CPU record")


def test_device_memory_from_a_cuda_peak_says_fits_or_not_with_the_margin(tmp_path):
    """The allocator's own peak (CUDA max_memory_allocated) is the peak: fits, with the margin."""
    root = tmp_path / "traces"
    walls = {0: (1, 1), 1: (7 * MS, 7 * MS)}
    cats = {"parameters": 200 * MiB, "gradients": 200 * MiB, "optimizer_state": 400 * MiB,
            "activations": 100 * MiB}
    write_run(root / "fsdp2", strategy="fsdp2", walls=walls, device="cuda")
    write_categories(root / "fsdp2" / schemas.MEMORY_CATEGORIES_NAME, {0: cats, 1: cats},
                     source="cuda_max_allocated")
    refresh_manifest(root / "fsdp2")
    rep = analyse(root, AnalysisOptions(device_memory_bytes=GiB))
    f = rep.runs[0].memory.fit
    assert f.fits is True and not f.lower_bound and f.spare_bytes == GiB - 900 * MiB
    assert memory_section.fit_lines(rep) == [
        "fsdp2: fits at this batch on one 1.00 GiB device, with 124.0 MiB to spare (peak "
        "allocated 900.0 MiB on its largest rank)"]


def test_device_memory_option_on_the_command_line(tmp_path):
    root = _root(tmp_path)
    proc = cli("report", str(root), "--device-memory", "80GiB", "--format", "md")
    assert proc.returncode == 0, proc.stderr
    assert ("ddp: not known whether it fits one 80.00 GiB device (lower bound, CPU record: "
            "sum of categories 1.66 GiB on its largest rank, 78.34 GiB under the device") in proc.stdout
    bad_input(cli("report", str(root), "--device-memory", "eighty"), "--device-memory", "80GiB")
    bad_input(cli("report", str(root), "--device-memory", "80"), "--device-memory", "80GiB")  # unit?
    assert report_types.parse_bytes("0.5KB") == 500 and report_types.parse_bytes("80GiB") == 80 * 2**30


def test_unknown_category_is_bad_input(tmp_path):
    p = tmp_path / schemas.MEMORY_CATEGORIES_NAME
    write_categories(p, {0: {"params": 1}})
    with pytest.raises(BadInput, match="memory_categories.parquet.*params"):
        memory.read_categories(p)


def test_peak_from_memory_events_is_the_largest_total_allocated(tmp_path):
    """fixtures/core/memory_events.json: cuda:0 Total Allocated 10, 6, 18, 6 MiB (a free of a
    block from before the window at the second event), reserved up to 32 MiB; the CPU's 1 KiB."""
    trace = json.loads(FIX.read_text())
    oracle = max(e["args"]["Total Allocated"] for e in trace["traceEvents"]
                 if e["name"] == "[memory]" and e["args"]["Device Type"] == 1)
    assert oracle == 18 * MiB
    shutil.copy(FIX, tmp_path / "rank0.trace.json")
    rep = analyse(tmp_path / "rank0.trace.json")
    mem = rep.runs[0].memory
    assert mem.peak_allocated_bytes == oracle and mem.peak_reserved_bytes == 32 * MiB
    assert "[memory]" in mem.peak_source and "Total Allocated" in mem.peak_source
    assert [(d.device, d.events, d.peak_allocated_bytes, d.start_bytes) for d in mem.devices] == [
        ("cpu", 2, 1024, 0), ("cuda:0", 4, 18 * MiB, 0)]
    assert "Peaks from the traces" in markdown.render(rep)


def _events(nbytes, total=None):
    n = len(nbytes)
    return pd.DataFrame({"ts_ns": range(n), "device_type": [1] * n, "device_id": [0] * n,
                         "total_allocated": total or [NO_VALUE] * n, "total_reserved": [NO_VALUE] * n,
                         "bytes": nbytes})


def test_frees_before_the_window_never_make_a_negative_running_total():
    """Bytes only: -100, +50, -20, +200 -> running sums -100, -50, -70, 130: 100 bytes were live
    before the window, so the totals are 0, 50, 30, 230 and the peak 230. Totals relative to
    the window (-40, 10) likewise start at 40: peak 50."""
    got = memory.device_peaks(_events([-100, 50, -20, 200])).iloc[0]
    assert (got["start_bytes"], got["peak_allocated_bytes"], got["source"]) == (100, 230, "running sum of Bytes")
    got = memory.device_peaks(_events([-40, 50], total=[-40, 10])).iloc[0]
    assert (got["start_bytes"], got["peak_allocated_bytes"]) == (40, 50)
    got = memory.device_peaks(_events([10, -10])).iloc[0]  # nothing before the window
    assert (got["start_bytes"], got["peak_allocated_bytes"]) == (0, 10)


def test_bytes_only_trace_through_the_report(tmp_path):
    trace = json.loads(FIX.read_text())
    for e in trace["traceEvents"]:
        if e["name"] == "[memory]":
            del e["args"]["Total Allocated"], e["args"]["Total Reserved"]
    (tmp_path / "rank0.trace.json").write_text(json.dumps(trace))
    mem = analyse(tmp_path / "rank0.trace.json").runs[0].memory
    cuda = next(d for d in mem.devices if d.device == "cuda:0")
    # Bytes +2, -4, +12, -12 MiB: sums 2, -2, 10, -2 -> 2 MiB live before, peak 12 MiB
    assert (cuda.start_bytes, cuda.peak_allocated_bytes, cuda.peak_reserved_bytes) == (2 * MiB, 12 * MiB, None)
    assert "running sum of Bytes" in mem.peak_source


@pytest.mark.integration
def test_corpus_trace_memory_events(tmp_path):
    """The corpus's one trace with [memory] events (sglang, 1,014 of them on HIP device 0):
    the peak equals the largest "Total Allocated" read here with json."""
    src = need(CORPUS / "single" / "sglang_cudagraph_capture.json.gz")
    events = [e for e in json.loads(gzip.decompress(src.read_bytes()))["traceEvents"]
              if e.get("name") == "[memory]"]
    shutil.copy(src, tmp_path / src.name)
    mem = analyse(tmp_path / src.name).runs[0].memory
    (dev,) = mem.devices
    assert dev.device == "hip:0" and dev.events == len(events) == 1014
    assert dev.peak_allocated_bytes == max(e["args"]["Total Allocated"] for e in events)
    assert dev.peak_reserved_bytes == max(e["args"]["Total Reserved"] for e in events)
    assert mem.peak_allocated_bytes == dev.peak_allocated_bytes
