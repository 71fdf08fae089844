"""`analyzer merge` and `analyzer report` agree on what a step and a collective are.

On every corpus job merge accepts (the DLRM 8-rank folder, the tb_plugin nccl and gloo pairs,
each single trace as a one-file job) and on a recorded run: the ProfilerStep numbers of each
rank, the collective count and bytes per rank and kind that merge used (``MergeResult.steps``,
``.collectives``; and every collective it matched across ranks for the offsets and arrows)
equal those of the tables the report reads (``api.load_tables``, computed afresh: no cache).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from analyzer import api
from analyzer.analyses.clock import MATCHABLE_KINDS
from analyzer.timeline.merge import merge_traces
from tests.corpus import CORPUS, need, params
from tests.inputs import TINY


def _jobs() -> list[tuple[str, list[str]]]:
    """(job name, corpus files) of every corpus job."""
    if not CORPUS.exists():
        return []
    out = [("dlrm", [f"dlrm_ddp_8rank_v100/worker{r}.pt.trace.json.gz" for r in range(8)])]
    out += [(f"tb_{b}", [f"tbplugin_2rank/{b}__worker{r}.json" for r in (0, 1)])
            for b in ("nccl", "gloo_cpu")]
    out += [(p.name.split(".")[0], [f"single/{p.name}"])
            for p in sorted((CORPUS / "single").glob("*.json.gz"))]
    return out


def _per_kind(coll: pd.DataFrame) -> dict[tuple[int, str], tuple[int, int]]:
    """(rank, kind) -> (count, bytes summed over the instances whose bytes are known)."""
    known = coll.assign(bytes=coll["bytes"].where(coll["bytes"] >= 0, 0))
    g = known.groupby([coll["rank"].astype(int), coll["kind"].astype(str)])
    return {k: (int(n), int(b)) for k, n, b in zip(g.size().index, g.size(), g["bytes"].sum())}


def _check(folder: Path, tmp: Path, monkeypatch) -> tuple:
    res = merge_traces(folder, tmp / "merged.trace.json.gz")
    for p in folder.glob("*.tables.msgpack"):  # the report's tables computed afresh
        p.unlink()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "fresh-cache"))
    job = api.load_tables(folder)
    assert not any(rt.cache_hit for rt in job.ranks)
    assert [r.rank for r in res.ranks] == [rt.rank for rt in job.ranks]
    assert [r.rank_source for r in res.ranks] == [rt.rank_source for rt in job.ranks]
    # steps: the report's breakdown has one row per ProfilerStep of each rank (whole-trace
    # mode: one row, step 0, and no ProfilerStep for merge to select)
    bd = job.breakdown
    for rt in job.ranks:
        steps = sorted(bd.loc[(bd["rank"] == rt.rank) & (bd["step"] >= 0), "step"].tolist())
        assert res.steps[rt.rank] == ([] if rt.whole_trace_mode else steps), rt.rank
    # collectives: count and bytes per rank and kind
    want = _per_kind(job.collectives)
    assert _per_kind(res.collectives) == want
    # what merge matched across ranks are the report's collectives, of the report's kind
    m = res.matched
    if len(m):
        ids = job.collectives[["rank", "event_idx", "kind"]].astype({"kind": str})
        both = m.astype({"kind": str}).merge(ids, on=["rank", "event_idx"], how="left",
                                             suffixes=("", "_report"))
        assert (both["kind"] == both["kind_report"]).all()
    # every rank ran the same collectives (SPMD): merge matched every one of them
    n_ranks = len(job.ranks)
    counts = {k: n for (_, k), (n, _) in want.items()}
    spmd = [k for k in counts if k in MATCHABLE_KINDS
            and len({n for (_, kk), (n, _) in want.items() if kk == k}) == 1
            and sum(1 for (_, kk) in want if kk == k) == n_ranks]
    if n_ranks > 1:
        matched = m.groupby(["rank", "kind"]).size().to_dict() if len(m) else {}
        for k in spmd:
            for rt in job.ranks:
                assert matched.get((rt.rank, k), 0) == counts[k], (rt.rank, k)
    return res, job


@pytest.mark.parametrize("name, files", params([pytest.param(j, f, id=j) for j, f in _jobs()], 2))
def test_corpus_job(name, files, tmp_path, monkeypatch):
    folder = tmp_path / name
    folder.mkdir()
    for rel in files:
        shutil.copy(need(CORPUS / rel), folder)
    _check(folder, tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory) -> Path:
    """A real 2-rank gloo DDP run directory written by `tracer record`."""
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("agree") / "traces"
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", *TINY, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / "ddp"


@pytest.mark.slow
def test_recorded_run(recorded_run, tmp_path, monkeypatch):
    run = tmp_path / "ddp"
    shutil.copytree(recorded_run, run)
    res, job = _check(run, tmp_path, monkeypatch)
    assert len(job.ranks) == 2 and not job.whole_trace_mode
    assert len(res.matched) and all(res.steps.values())


def test_the_check_can_fail(tmp_path, monkeypatch):
    """A merge that took another rule for one collective's kind is caught."""
    import types

    import analyzer.timeline.merge as merge
    from analyzer.ingest import pipeline

    def other_kind(*args, **kwargs):
        job = pipeline.load_run(*args, **kwargs)
        job.ranks[0].collectives.loc[0, "kind"] = "barrier"  # the trace runs no barrier
        return job

    folder = tmp_path / "tb"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(need(CORPUS / f"tbplugin_2rank/nccl__worker{r}.json"), folder)
    monkeypatch.setattr(merge, "pipeline", types.SimpleNamespace(
        load_run=other_kind, read_trace=pipeline.read_trace, classified=pipeline.classified))
    with pytest.raises(AssertionError):
        _check(folder, tmp_path, monkeypatch)
