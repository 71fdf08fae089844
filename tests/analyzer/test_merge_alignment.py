"""`analyzer merge`'s clock alignment on a real record: applied when it narrows the spread of
matched collective ends (a clock 1 s ahead), not applied when it would widen it (a wrong
estimate: the ranks keep their raw clocks, and merge says so)."""

from __future__ import annotations

import json

from tests.inputs import cli, copy_run, load, save


def _first_step_ts_ns(trace: dict) -> int:
    return min(round(ev["ts"] * 1000) for ev in trace["traceEvents"]
               if ev.get("ph") == "X" and str(ev.get("name", "")).startswith("ProfilerStep#"))


def test_merge_keeps_raw_clocks_when_alignment_widens_spread(ddp_run, tmp_path, monkeypatch):
    from analyzer.analyses import clock

    real = clock.estimate_offsets

    def off_by_50_ms(*args, **kwargs):
        # a wrong estimate: rank 1 off by 50 ms, far beyond the natural spread of collective
        # ends on a loaded 2-core machine (up to a few ms), so aligning must widen it
        df = real(*args, **kwargs)
        df.loc[df["rank"] == 1, "offset_ns"] += 50_000_000
        return df

    monkeypatch.setattr(clock, "estimate_offsets", off_by_50_ms)
    run = copy_run(ddp_run, tmp_path / "ddp")
    target = tmp_path / "out" / "m.trace.json.gz"
    proc = cli("merge", str(run), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    warn = [ln for ln in proc.stdout.splitlines() if "widen" in ln]
    assert len(warn) == 1 and "unshifted" in warn[0], proc.stdout
    side = json.loads((tmp_path / "out" / "m.offsets.json").read_text())
    assert side["aligned"] is False
    assert side["spread_after_ns"]["median"] > side["spread_before_ns"]["median"]
    # oracle: the source traces themselves, rebased on their earliest complete event
    src = {r: load(run / f"rank{r}.trace.json.gz") for r in (0, 1)}
    t0 = min(round(ev["ts"] * 1000) for t in src.values() for ev in t["traceEvents"]
             if ev.get("ph") == "X" and isinstance(ev.get("ts"), (int, float)))
    merged = load(target)
    for r in (0, 1):
        got = [round(ev["ts"] * 1000) for ev in merged["traceEvents"] if ev.get("pid") == r + 1
               and ev.get("ph") == "X" and str(ev.get("name", "")).startswith("ProfilerStep#")]
        assert min(got) == _first_step_ts_ns(src[r]) - t0


def test_merge_still_aligns_a_skewed_clock(ddp_run, tmp_path):
    """Control: rank 1's clock 1 s ahead -- alignment narrows the spread and is applied."""
    run = copy_run(ddp_run, tmp_path / "ddp")
    p = run / "rank1.trace.json.gz"
    trace = load(p)
    for ev in trace["traceEvents"]:
        if isinstance(ev.get("ts"), (int, float)) and not isinstance(ev.get("ts"), bool):
            ev["ts"] += 1_000_000  # µs
    save(p, trace)
    target = tmp_path / "out" / "m.trace.json.gz"
    proc = cli("merge", str(run), "-o", str(target))
    assert proc.returncode == 0, proc.stderr
    assert "widen" not in proc.stdout
    side = json.loads((tmp_path / "out" / "m.offsets.json").read_text())
    assert side["aligned"] is True
    off1 = next(o["offset_ns"] for o in side["offsets"] if o["rank"] == 1)
    assert abs(off1 - 1_000_000_000) < 5_000_000  # 1 s within the ±5 ms of a shared-CPU run
