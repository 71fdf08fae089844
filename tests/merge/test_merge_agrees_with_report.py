"""`analyzer merge` and `analyzer report` agree with the raw traces on steps and collectives.

Both commands read the ingest's tables (merge returns them as ``MergeResult.collectives``), so
comparing one with the other proves nothing. Each is compared instead with an oracle read
straight from the raw JSON (``_raw_facts``, a few lines that share no code with the analyzer):
the ProfilerStep numbers of each rank and its communication events counted by name. The report
side is ``api.load_tables`` (the tables every report section reads, computed afresh); the merge
side is the merged trace file merge wrote: per rank process, its ProfilerStep events, its
collective events and the flow arrows linking one collective across ranks.

Jobs: every corpus job merge accepts (the DLRM 8-rank folder, the tb_plugin nccl and gloo
pairs, each single trace as a one-file job) and a recorded 2-rank gloo run.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from analyzer import api
from analyzer.timeline.merge import merge_traces
from tests.corpus import CORPUS, need, params

pytestmark = pytest.mark.integration

KERNEL_KIND = {"AllReduce": "all_reduce", "AllGather": "all_gather", "Broadcast": "broadcast",
               "ReduceScatter": "reduce_scatter",
               "SendRecv": "all_to_all"}  # the corpus's SendRecv kernels are all all_to_all
"""Collective kind of an NCCL kernel (``ncclKernel_<Kind>_...`` / ``ncclDevKernel_<Kind>_...``)."""
SPMD_KINDS = {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"}
"""Kinds every rank of the group runs once per call: one arrow links each rank to the next."""


def _raw_kind(ev: dict) -> str | None:
    """The collective kind of one raw complete event by its name alone, None for the rest:
    NCCL kernels, torch symmetric-memory all_reduce kernels and gloo's ``gloo:<kind>`` work."""
    name, cat = str(ev.get("name", "")), str(ev.get("cat", "")).lower()
    if cat == "kernel":
        m = re.match(r"nccl(?:Dev)?Kernel_([A-Za-z]+?)(?:_|\(|$)", name)
        if m:
            return KERNEL_KIND[m.group(1)]
        return "all_reduce" if "multimem_all_reduce_kernel" in name else None
    return name[len("gloo:"):] if name.startswith("gloo:") else None


def _load(path: Path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def _raw_facts(events: list[dict]) -> tuple[list[int], Counter]:
    """(sorted ProfilerStep numbers of the CPU step spans, Counter of collective kinds)."""
    steps = sorted(int(e["name"].split("#")[1]) for e in events
                   if e.get("ph") == "X" and e.get("cat") == "user_annotation"
                   and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name"))))
    kinds = Counter(k for e in events if e.get("ph") == "X" and (k := _raw_kind(e)))
    return steps, kinds


def _raw_rank(path: Path, data_rank: int | None, n_files: int) -> int:
    """The rank rule of DESIGN.md, for the corpus's cases: distributedInfo.rank, else the
    ``worker<N>`` in the file name of a multi-file job, else 0."""
    if data_rank is not None:
        return data_rank
    m = re.search(r"worker(\d+)", path.name)
    return int(m.group(1)) if m and n_files > 1 else 0


def _oracle(folder: Path) -> dict[int, tuple[list[int], Counter]]:
    """rank -> (steps, collective kinds) of each trace in ``folder``, from the raw JSON (a
    trace: a JSON file holding ``traceEvents``; a run directory's manifest.json is none)."""
    traces = {}
    for p in sorted(folder.iterdir()):
        if p.name.endswith((".json", ".json.gz")):
            data = _load(p)
            if isinstance(data, dict) and "traceEvents" in data:
                traces[p] = data
    return {_raw_rank(p, d.get("distributedInfo", {}).get("rank"), len(traces)):
            _raw_facts(d["traceEvents"]) for p, d in traces.items()}


def _check(folder: Path, tmp: Path, monkeypatch) -> None:
    oracle = _oracle(folder)
    merged = tmp / "merged.trace.json.gz"
    res = merge_traces(folder, merged)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp / "fresh-cache"))
    job = api.load_tables(folder)
    assert not any(rt.cache_hit for rt in job.ranks)

    # the report's tables: ranks, step numbers, collectives per rank and kind
    assert [rt.rank for rt in job.ranks] == sorted(oracle)
    bd, coll = job.breakdown, job.collectives
    for rt in job.ranks:
        steps, kinds = oracle[rt.rank]
        assert rt.whole_trace_mode == (not steps), rt.rank
        if steps:
            assert sorted(bd.loc[bd["rank"] == rt.rank, "step"].tolist()) == steps, rt.rank
        mine = coll[coll["rank"] == rt.rank]
        assert Counter(mine["kind"].astype(str).tolist()) == kinds, rt.rank

    # merge's own answer and the file it wrote: one process per rank (pid rank + 1)
    assert res.steps == {r: s for r, (s, _) in oracle.items()}
    written = _load(merged)["traceEvents"]
    for rank, (steps, kinds) in oracle.items():
        mine = [e for e in written if e.get("pid") == rank + 1]
        assert _raw_facts(mine) == (steps, kinds), rank
    # the arrows: each collective every rank ran is linked rank to rank (n_ranks - 1 arrows)
    n = len(oracle)
    common = Counter()
    for kind in SPMD_KINDS:
        per_rank = {k[kind] for _, k in oracle.values()}
        if n > 1 and len(per_rank) == 1:
            common[kind] = per_rank.pop() * (n - 1)
    starts = [e for e in written if e.get("cat") == "collective" and e.get("ph") == "s"]
    assert Counter(e["name"].split(" #")[0] for e in starts) == +common
    # ... and each arrow leaves from a collective event of its kind
    at = {(e["pid"], e["tid"], e["ts"]): _raw_kind(e) for e in written if e.get("ph") == "X"}
    for e in starts:
        assert at.get((e["pid"], e["tid"], e["ts"])) == e["name"].split(" #")[0], e


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


@pytest.mark.parametrize("name, files", params([pytest.param(j, f, id=j) for j, f in _jobs()], 2))
def test_corpus_job(name, files, tmp_path, monkeypatch):
    folder = tmp_path / name
    folder.mkdir()
    for rel in files:
        shutil.copy(need(CORPUS / rel), folder)
    _check(folder, tmp_path, monkeypatch)


def test_recorded_run(ddp_run, tmp_path, monkeypatch):
    run = tmp_path / "ddp"
    shutil.copytree(ddp_run, run)
    oracle = _oracle(run)
    assert len(oracle) == 2 and all(steps and kinds for steps, kinds in oracle.values())
    _check(run, tmp_path, monkeypatch)


def test_the_check_can_fail(tmp_path, monkeypatch):
    """A merge that took another rule for one collective's kind is caught."""
    import types

    import analyzer.timeline.merge as merge
    from analyzer.ingest import pipeline

    def other_kind(*args, **kwargs):
        from analyzer.ingest.ranktables import arrow

        job = pipeline.load_run(*args, **kwargs)
        rt = job.ranks[0]
        coll = rt.frame("collectives")
        coll.loc[0, "kind"] = "barrier"  # the trace runs no barrier
        rt.tables["collectives"] = arrow(coll)
        return job

    folder = tmp_path / "tb"
    folder.mkdir()
    for r in (0, 1):
        shutil.copy(need(CORPUS / f"tbplugin_2rank/nccl__worker{r}.json"), folder)
    monkeypatch.setattr(merge, "pipeline", types.SimpleNamespace(load_run=other_kind))
    with pytest.raises(AssertionError):
        _check(folder, tmp_path, monkeypatch)
