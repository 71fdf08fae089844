"""Per-rank tables (analyzer/ingest/ranktables.py) and the whole-report cache (reports/cache.py).

Oracle: the same quantities computed a second way, by the analyses run in the test on each
rank's full event table (``api.load_events``: breakdown, collectives, timeline, prefetch,
whole-trace overlap), cold and from the caches; and report outputs rendered without any cache.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from analyzer import api
from analyzer.analyses.breakdown import (comm_shares, rank_breakdown, timeline_rows,
                                         whole_trace_overlap)
from analyzer.analyses.collectives import rank_collectives
from analyzer.contract.errors import BadInput
from analyzer.ingest.ranktables import rank_tables
from analyzer.analyses.prefetch import prefetch_table
from analyzer.analyses.straggler import gap_parts
from tests.corpus import CORPUS, need

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]


def _copy_dlrm(tmp_path: Path) -> Path:
    dst = tmp_path / "dlrm"
    dst.mkdir()
    for p in sorted(need(CORPUS / "dlrm_ddp_8rank_v100").glob("worker[0-3].pt.trace.json.gz")):
        shutil.copy(p, dst / p.name)
    return dst


def _same_as_events(tt, ranks: list[int], world_size: int) -> None:
    bd, coll, pf = [], [], []
    for rt in tt.ranks:
        ev, steps = api.load_events(rt.path)
        kind, main = ev.attrs["device_kind"], ev.attrs["main_tid"]
        bd.append(rank_breakdown(rt.rank, ev, steps, kind, main))
        c = rank_collectives(rt.rank, ev, comm_shares(ev, steps, kind, main))
        gaps = gap_parts(ev, c, steps, kind, main)  # the ingest fills them (ranktables.py)
        coll.append(c.assign(**{k: gaps[k].to_numpy() for k in gaps.columns}))
        pf.append(prefetch_table(ev, rank=rt.rank))
        assert rt.timeline_step == int(steps["step"].min())
        win = steps[steps["step"] == rt.timeline_step].iloc[0]
        pd.testing.assert_frame_equal(
            tt.timeline(rt.rank, rt.timeline_step),
            timeline_rows(ev[ev["step"] == rt.timeline_step], kind, main, int(win["start_ns"]),
                          int(win["end_ns"]), ev["end_ns"].to_numpy()))
        assert (rt.whole_overlap_ns, rt.whole_comm_ns) == whole_trace_overlap(ev)
    pd.testing.assert_frame_equal(tt.breakdown, pd.concat(bd, ignore_index=True))
    pd.testing.assert_frame_equal(tt.collectives, pd.concat(coll, ignore_index=True))
    pf = [t for t in pf if not t.empty]
    if pf:
        pd.testing.assert_frame_equal(tt.prefetch, pd.concat(pf, ignore_index=True))
    else:
        assert tt.prefetch.empty
    assert [r.rank for r in tt.ranks] == ranks
    assert tt.world_size == world_size
    assert tt.missing_ranks == [r for r in range(world_size) if r not in ranks]


def test_tables_equal_the_event_analyses_cold_and_cached(tmp_path):
    root = _copy_dlrm(tmp_path)
    cold = api.load_tables(root, jobs=2)
    assert not any(r.cache_hit for r in cold.ranks)
    _same_as_events(cold, [0, 1, 2, 3], 8)
    warm = api.load_tables(root, jobs=2)
    assert all(r.cache_hit for r in warm.ranks)
    _same_as_events(warm, [0, 1, 2, 3], 8)


def test_fsdp_prefetch_rows_survive_the_cache(tmp_path):
    src = REPO / "fixtures" / "gpu_shaped" / "fsdp2" / "rank0.trace.json"
    (tmp_path / "fsdp2").mkdir()
    shutil.copy(src, tmp_path / "fsdp2" / "rank0.json")
    root = tmp_path / "fsdp2"
    cold = api.load_tables(root)
    assert len(cold.prefetch) > 0
    warm = api.load_tables(root)
    assert warm.ranks[0].cache_hit
    pd.testing.assert_frame_equal(warm.prefetch, cold.prefetch)
    _same_as_events(warm, [0], 2)  # rank 0 of the 2 its distributedInfo says


def test_changed_trace_is_reparsed_touched_one_is_not(tmp_path):
    root = _copy_dlrm(tmp_path)
    api.load_tables(root)
    f = root / "worker0.pt.trace.json.gz"
    os.utime(f, ns=(1, 1))  # new stat signature, same bytes: the content key still matches
    again = api.load_tables(root)
    assert all(r.cache_hit for r in again.ranks)
    # replace rank 0 by rank 1's trace under rank 0's name: different bytes -> recomputed
    shutil.copy(root / "worker1.pt.trace.json.gz", f)
    with pytest.raises(BadInput) as err:  # now two files claim rank 1
        api.load_tables(root)
    assert "rank 1" in str(err.value)
    redone, other = rank_tables(f), rank_tables(root / "worker1.pt.trace.json.gz")
    assert redone.cache_hit and other.cache_hit  # written by the failed load, per file
    pd.testing.assert_frame_equal(redone.breakdown, other.breakdown)


def test_same_size_edit_with_the_mtime_set_back_is_not_served_from_the_cache(tmp_path):
    """An edit that keeps the size, then ``os.utime`` back to the old mtime (what ``cp -p`` or
    ``touch -d`` do): the ctime still moved, so the trace is hashed again (found by a new-user
    trial: the stale tables, and their SHA-256, were used)."""
    root = _copy_dlrm(tmp_path)
    f = root / "worker0.pt.trace.json.gz"
    before = next(r for r in api.load_tables(root).ranks if r.path == f)
    st = f.stat()
    raw = bytearray(f.read_bytes())
    raw[5] ^= 0xFF  # the gzip header's mtime: other bytes, same size, same trace inside
    f.write_bytes(bytes(raw))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    after = next(r for r in api.load_tables(root).ranks if r.path == f)
    assert not after.cache_hit and after.sha256 != before.sha256
    pd.testing.assert_frame_equal(after.breakdown, before.breakdown)  # the same trace inside


def test_a_cached_report_renders_without_pandas_or_pyarrow(tmp_path):
    """The warm path imports neither (reports/cache.py): importing them costs ~0.4 s, which
    a report module importing analyzer.analyses.parity once brought back (caught by bench_scale: warm
    0.13 -> 0.57 s). Rendered for the corpus and for a hand-built failed run, whose verdict
    names the first divergence."""
    import subprocess
    import sys

    from tests.reports.builders import build_root

    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    probe = ("import sys\nfrom analyzer.cli.app import main\nsys.argv = ['analyzer', 'report', "
             "sys.argv[1], '--out', sys.argv[2]]\ntry:\n    main()\nexcept SystemExit:\n"
             "    pass\nprint('HEAVY', sorted(m for m in ('pandas', 'pyarrow', 'numpy') "
             "if m in sys.modules), file=sys.stderr)")
    for root in (_copy_dlrm(tmp_path), build_root(tmp_path / "bad", fault=True)):
        out = tmp_path / f"out-{root.name}"
        cold = subprocess.run([sys.executable, "-m", "analyzer", "report", str(root), "--out",
                               str(out)], env=env, capture_output=True, text=True)
        assert cold.returncode in (0, 3), cold.stderr
        warm = subprocess.run([sys.executable, "-c", probe, str(root), str(out)], env=env,
                              capture_output=True, text=True)
        assert "HEAVY []" in warm.stderr, warm.stderr[-2000:]
        assert warm.stdout == cold.stdout


def test_report_cache_hit_is_identical_and_a_change_misses(tmp_path, monkeypatch):
    from analyzer.compare.reportfiles import write_report
    from analyzer.contract.report_types import AnalysisOptions, ToleranceOverride
    from reports import cache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = _copy_dlrm(tmp_path)
    out = tmp_path / "out"
    opts = dict(out=out, formats=["md", "json", "html"], options=AnalysisOptions())
    write_report(root, **opts)
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    key = cache.key(root, out, AnalysisOptions())
    assert cache.load_entry(root, out, key) is not None
    write_report(root, **opts)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    # another option, or a file under DIR removed: a different key, so a fresh analysis
    assert cache.key(root, out, AnalysisOptions(tolerance=ToleranceOverride(rtol=0.1))) != key
    (root / "worker3.pt.trace.json.gz").unlink()
    assert cache.key(root, out, AnalysisOptions()) != key
    rep, _ = write_report(root, **opts)
    assert [r.rank for r in rep.runs[0].ranks] == [0, 1, 2]
