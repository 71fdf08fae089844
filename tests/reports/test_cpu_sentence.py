"""The context's "CPU with gloo" line is said only where the evidence says gloo:
a record's manifest, or in foreign traces distributedInfo.backend or gloo runloop ops. A trace
whose device work the analyzer does not understand (MTIA, a CUPTI range profile) is CPU-side
only for the analyzer, not a gloo record."""

from __future__ import annotations

import pytest

import json
from pathlib import Path

from analyzer.compare.runs import analyse
from reports import context
from tests.inputs import CORPUS, need

SENTENCE = "CPU with gloo ("


def _trace(path: Path, events: list[dict], distributed_info: dict | None = None) -> Path:
    doc = {"schemaVersion": 1, "traceEvents": events}
    if distributed_info is not None:
        doc["distributedInfo"] = distributed_info
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def _step(ts: int, dur: int) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
            "ts": ts, "dur": dur}


def _op(name: str, ts: int, dur: int, tid: int = 1, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def _lines(root: Path) -> str:
    report = analyse(root)
    return " ".join(context.lines(report))


def test_gloo_ops_in_foreign_traces_say_cpu_with_gloo(tmp_path):
    ev = [_step(0, 100), _op("aten::mm", 1, 20), _op("c10d::allreduce_", 30, 5),
          _op("gloo:all_reduce", 31, 40, tid=9)]
    for r in (0, 1):
        _trace(tmp_path / "job" / f"rank{r}.json", ev)
    assert analyse(tmp_path / "job").runs[0].backend == "gloo"
    assert SENTENCE in _lines(tmp_path / "job")


def test_device_events_not_understood_do_not_say_gloo(tmp_path):
    """No kernel the analyzer knows, device work in a category it does not: device kind "cpu"
    for the analysis, and no claim about how it was recorded."""
    ev = [_op("aten::mm", 1, 20), _op("mtia_kernel", 5, 30, tid=3, cat="mtia_ccp_events")]
    _trace(tmp_path / "job" / "trace.json", ev)
    run = analyse(tmp_path / "job").runs[0]
    assert run.device == "cpu" and run.backend is None
    assert SENTENCE not in _lines(tmp_path / "job")


def test_distributed_info_backend_is_the_foreign_runs_backend(tmp_path):
    ev = [_op("aten::mm", 1, 20)]
    _trace(tmp_path / "job" / "trace.json", ev, {"backend": "nccl", "rank": 0, "world_size": 1})
    assert analyse(tmp_path / "job").runs[0].backend == "nccl"


@pytest.mark.integration
def test_corpus_mtia_and_cupti_traces_are_not_called_gloo_records():
    need(CORPUS)
    for name in ("mtia_inference_rank0.json.gz", "cupti_range_profiler.json.gz"):
        assert SENTENCE not in _lines(CORPUS / "single" / name), name
    assert SENTENCE in _lines(CORPUS / "single" / "cpu_gloo_ddp_rank34.json.gz")
