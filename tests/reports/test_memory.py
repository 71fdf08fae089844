"""Memory and step-time summaries on hand-built steps/memory Parquet (exact answers)."""

from __future__ import annotations

import pytest

from analyzer.analyses import memory
from analyzer.contract.errors import BadInput
from tests.reports.builders import write_memory, write_steps

MiB = 1 << 20


def _steps():
    rows = []
    # rank 0 / rank 1 wall times (ns); step 0 unprofiled
    walls = {0: (900, 1000), 1: (100, 300), 2: (250, 200), 3: (400, 500)}
    for step, pair in walls.items():
        for rank, w in enumerate(pair):
            rows.append(dict(rank=rank, step=step, profiled=step > 0, wall_ns=w,
                             peak_rss_bytes=(100 + step + rank) * MiB,
                             profiler_allocated_peak_bytes=None if step == 0 else (10 * step + rank) * MiB))
    return rows


def test_step_times_take_the_slowest_rank_and_peaks_the_max(tmp_path):
    write_steps(tmp_path / "steps.parquet", _steps())
    steps = memory.read_steps(tmp_path / "steps.parquet")
    st = memory.step_times(steps)
    assert list(st["step_ns"]) == [1000, 300, 250, 500]
    assert list(st["slowest_rank"]) == [1, 1, 0, 1]
    prof = st[st["profiled"]]["step_ns"]
    stats = memory.step_stats(prof)
    assert stats["median"] == 300.0 and stats["n"] == 3
    assert stats["p90"] == pytest.approx(300 + 0.8 * 200)  # linear between 300 and 500
    peaks = memory.rank_peaks(steps)
    assert list(peaks["peak_rss_bytes"]) == [103 * MiB, 104 * MiB]
    assert list(peaks["profiler_allocated_peak_bytes"]) == [30 * MiB, 31 * MiB]
    assert peaks["cuda_max_allocated_bytes"].isna().all()
    assert memory.peak_allocated_bytes(peaks) == 31 * MiB


def test_memory_parquet_summary(tmp_path):
    rows = [
        dict(rank=0, block_size_bytes=8 * MiB, state="active_allocated", category="parameter", top_frame="m.py:1:f"),
        dict(rank=0, block_size_bytes=2 * MiB, state="active_allocated", category="parameter"),
        dict(rank=0, block_size_bytes=6 * MiB, state="active_allocated", category=None),
        dict(rank=0, block_size_bytes=50 * MiB, state="inactive", category="activation"),
        dict(rank=1, block_size_bytes=1 * MiB, state="active_allocated", category="gradient"),
    ]
    write_memory(tmp_path / "memory.parquet", rows)
    mem = memory.read_memory(tmp_path / "memory.parquet")
    cat = memory.memory_by_category(mem)
    r0 = cat[cat["rank"] == 0]
    assert list(zip(r0["category"], r0["bytes"], r0["blocks"])) == [("parameter", 10 * MiB, 2), ("unknown", 6 * MiB, 1)]
    top = memory.largest_allocations(mem, n=2)
    assert list(top[top["rank"] == 0]["block_size_bytes"]) == [8 * MiB, 6 * MiB]
    assert list(top[top["rank"] == 1]["category"]) == ["gradient"]


def test_bad_steps_file_is_bad_input(tmp_path):
    p = tmp_path / "steps.parquet"
    p.write_text("x")
    with pytest.raises(BadInput, match="steps.parquet"):
        memory.read_steps(p)


@pytest.mark.parametrize("column", ["wall_ns", "step", "rank"])
def test_a_negative_step_figure_is_bad_input_not_the_fastest_run(tmp_path, column):
    rows = _steps()
    rows[3][column] = -rows[3][column] or -1
    p = tmp_path / "steps.parquet"
    write_steps(p, rows)
    with pytest.raises(BadInput, match=f"steps.parquet.*negative {column}") as caught:
        memory.read_steps(p)
    assert caught.value.reason == "bad_run_file"
