"""The ranking's noise statement follows the runs' measured step-time spread (hand-built runs
with exact answers, and copies of a real record slowed down), not a blanket "CPU orders are
noise"."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from analyzer.compare.runs import analyse
from reports import markdown
from tests.inputs import cli, copy_run
from tests.reports.builders import details, write_run

MS = 1_000_000


def _report(tmp_path, steps_ms: dict[str, list[float]], device: str = "cpu"):
    """A root with one run per name; ``steps_ms`` = the slowest rank's wall time of each
    profiled step (step 0, unprofiled, is 1 ns)."""
    root = tmp_path / device
    for name, walls in steps_ms.items():
        w = {0: (1, 1), **{i + 1: (int(ms * MS), int(ms * MS) - 1) for i, ms in enumerate(walls)}}
        write_run(root / name, strategy=name, walls=w, device=device)
    rep = analyse(root)
    return rep, details(markdown.render(rep))


def test_cpu_order_beyond_the_spread_is_not_called_noise(tmp_path):
    # fsdp 1.67x ddp, every step: ranges [6, 6] and [10, 10] ms do not overlap, gap 67 % > 50 %
    rep, verdict = _report(tmp_path, {"ddp": [6, 6, 6], "fsdp": [10, 10, 10]})
    run = {r.name: r for r in rep.runs}
    assert run["ddp"].step_time_ns.min == run["ddp"].step_time_ns.max == 6 * MS
    noise = rep.ranking.noise
    assert rep.ranking.order == ["ddp", "fsdp"] and noise.cpu
    assert noise.decisive is True and noise.close_pairs == []
    assert "within measurement noise" not in verdict
    assert "beyond the measured spread" in verdict and "50.0 % (the CPU floor)" in verdict
    assert "timings carry +-30-50 % noise" in verdict  # the CPU caveat stays


def test_cpu_order_whose_steps_overlap_is_noise(tmp_path):
    # the same medians (6 and 10 ms), but ddp's slowest step (11 ms) is slower than fsdp's
    # fastest (9 ms): the order could flip from one step to the next
    rep, verdict = _report(tmp_path, {"ddp": [4, 6, 11], "fsdp": [9, 10, 12]})
    noise = rep.ranking.noise
    assert noise.decisive is False
    (a, b, gap, why), = noise.close_pairs
    assert (a, b) == ("ddp", "fsdp") and gap == pytest.approx(4 / 6)
    assert why == "their step times overlap: ddp's slowest step 11.00 ms, fsdp's fastest 9.00 ms"
    assert "within measurement noise (ddp vs fsdp: 66.7 % apart, their step times overlap" in verdict
    assert "rule: neighbours are within noise when their step times overlap" in verdict


def test_small_gap_without_overlap_is_below_the_floor(tmp_path):
    # CPU: 6 -> 8 ms (33 %), no overlap, but identical CPU records differ by up to 50 %
    rep, _ = _report(tmp_path, {"ddp": [6, 6], "fsdp": [8, 8]})
    (_, _, gap, why), = rep.ranking.noise.close_pairs
    assert gap == pytest.approx(2 / 6) and why == "below the 50 % CPU floor"
    # GPU: the same 33 % gap without overlap is decisive (floor 5 %)
    rep, verdict = _report(tmp_path, {"ddp": [6, 6], "fsdp": [8, 8]}, device="cuda")
    assert rep.ranking.noise.decisive is True
    assert "within measurement noise" not in verdict and "(the GPU floor)" in verdict


# on a real record: copies slowed down 1.2x (noise) and beyond its spread (not noise)

def _profiled_step_ns(run: Path) -> list[int]:
    """Slowest rank's wall time of each profiled step, read with pyarrow (not the analyzer)."""
    import pyarrow.parquet as pq

    t = pq.read_table(run / "steps.parquet").to_pylist()
    by_step: dict[int, int] = {}
    for row in t:
        if row["profiled"]:
            by_step[row["step"]] = max(by_step.get(row["step"], 0), row["wall_ns"])
    return [by_step[s] for s in sorted(by_step)]


def test_noise_statement_follows_the_measured_spread(ddp_run, tmp_path):
    import json
    import statistics

    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.remanifest import refresh_manifest

    root = tmp_path / "traces"
    fast = copy_run(ddp_run, root / "ddp")
    a = _profiled_step_ns(fast)
    for name, k in (("ddp-slow", max(1.67, 1.01 * max(a) / min(a))), ("ddp-close", 1.2)):
        run = copy_run(ddp_run, root / name)
        table = pq.read_table(run / "steps.parquet")
        walls = [int(w * k) for w in table.column("wall_ns").to_pylist()]
        table = table.set_column(table.schema.get_field_index("wall_ns"), "wall_ns",
                                 pa.array(walls, table.schema.field("wall_ns").type))
        pq.write_table(table, run / "steps.parquet")
        m = json.loads((run / "manifest.json").read_text())
        m["run_name"] = name
        (run / "manifest.json").write_text(json.dumps(m))
        refresh_manifest(run)
        sub = root.parent / f"only-{name}"  # this copy and the real run, two runs to rank
        sub.mkdir()
        shutil.copytree(fast, sub / "ddp")
        shutil.copytree(run, sub / name)
        proc = cli("report", str(sub), "--out", str(tmp_path / f"rep-{name}"))
        assert proc.returncode == 0, proc.stderr
        verdict = details(proc.stdout)
        b = _profiled_step_ns(run)
        gap = (statistics.median(b) - statistics.median(a)) / statistics.median(a)
        noise = max(a) >= min(b) or gap < 0.5  # the rule, CPU floor 50 %
        assert ("within measurement noise" in verdict) == noise, (name, a, b, verdict)
        if name == "ddp-slow":  # >= 1.67x and beyond the run's own spread: not noise
            assert not noise and "beyond the measured spread" in verdict
        else:  # 1.2x: below the CPU floor at least
            assert noise and "ddp vs ddp-close" in verdict
