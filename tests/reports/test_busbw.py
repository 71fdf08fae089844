"""A run's busbw combines the ranks as nccl-tests does (src/common.cu: the ranks' times are
averaged, then algbw = S / t and busbw = algbw x factor), not as a mean of per-rank busbw."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from analyzer.analyses.collectives import by_kind, run_busbw_gbps
from analyzer.compare.runs import analyse
from tests.corpus import CORPUS, need

TBPLUGIN = CORPUS / "tbplugin_2rank"


def _coll(rows):
    cols = ["rank", "step", "pg", "seq", "kind", "start_ns", "end_ns", "dur_ns", "bytes", "rule",
            "name", "group_size", "enqueue_start_ns", "enqueue_end_ns"]
    return pd.DataFrame([{**dict.fromkeys(cols, -1), "pg": "0", "rule": "r", "name": "n", **r}
                         for r in rows], columns=cols)


def test_hand_built_two_ranks():
    # one 1 MB all_reduce on 2 ranks (factor 2(n-1)/n = 1): rank 0 took 1 ms, rank 1 3 ms.
    # nccl-tests: mean time 2 ms -> algbw = 1e6 B / 2e-3 s = 0.5 GB/s = busbw.
    # The mean of per-rank busbw would say (1.0 + 0.333) / 2 = 0.667 GB/s.
    coll = _coll([{"rank": 0, "kind": "all_reduce", "dur_ns": 1_000_000, "bytes": 1_000_000,
                   "group_size": 2},
                  {"rank": 1, "kind": "all_reduce", "dur_ns": 3_000_000, "bytes": 1_000_000,
                   "group_size": 2}])
    k = by_kind(coll)
    assert k["busbw_gbps"].tolist() == pytest.approx([1.0, 1 / 3])  # per rank
    assert k["bus_bytes"].tolist() == [1e6, 1e6] and k["bus_time_ns"].tolist() == [1e6, 3e6]
    assert run_busbw_gbps(k["bus_bytes"], k["bus_time_ns"]) == pytest.approx(0.5)
    # 4 ranks, all_gather (factor 3/4), 2 instances of 8 MB each, times per rank (ms)
    times = {0: (2, 2), 1: (2, 4), 2: (3, 3), 3: (6, 8)}
    coll = _coll([{"rank": r, "kind": "all_gather", "dur_ns": t * 1_000_000, "bytes": 8_000_000,
                   "group_size": 4} for r, ts in times.items() for t in ts])
    k = by_kind(coll)
    # mean time per rank for the two instances: (4 + 6 + 6 + 14) / 4 = 7.5 ms for 16 MB
    assert run_busbw_gbps(k["bus_bytes"], k["bus_time_ns"]) == pytest.approx(16e6 * 0.75 / 7.5e6)


@pytest.mark.integration
def test_report_on_real_nccl_traces(tmp_path):
    need(TBPLUGIN)
    folder = tmp_path / "nccl"
    folder.mkdir()
    as_found = tmp_path / "as_found"
    as_found.mkdir()
    want: dict[str, tuple[int, list[float]]] = {}
    for w in (0, 1):
        src = TBPLUGIN / f"nccl__worker{w}.json"
        shutil.copy(src, as_found / src.name)
        doc = json.loads(src.read_text())
        # the tb_plugin traces say nothing of their process group; the copy says what a newer
        # torch writes for a 2-rank job with only the default group (distributedInfo.pg_config)
        doc["distributedInfo"] = {"backend": "nccl", "rank": w, "world_size": 2, "pg_count": 1,
                                  "pg_config": [{"pg_name": "0", "pg_size": 2,
                                                 "ranks": [0, 1]}]}
        (folder / src.name).write_text(json.dumps(doc))
        events = doc["traceEvents"]
        ops = {e["args"]["External id"]: e for e in events if e["name"].startswith("nccl:")}
        for e in events:
            if e["name"].startswith("ncclKernel_"):
                op = ops[e["args"]["external id"]]
                kind = op["name"].split(":")[1]
                nbytes = op["args"]["Input Dims"][0][0] * 4  # float
                want.setdefault(kind, (nbytes, []))[1].append(e["dur"] * 1000.0)
    # published by the tb_plugin (corpus README): all_reduce 8,196,000 bytes, broadcast 212,480
    assert want["all_reduce"][0] == 8_196_000 and want["broadcast"][0] == 212_480
    comm = analyse(folder).runs[0].communication
    for kind, factor in (("all_reduce", 2 * (2 - 1) / 2), ("broadcast", 1.0)):
        nbytes, durs = want[kind]
        mean_ns = sum(durs) / len(durs)  # 1556/1058 us and 16/31 us
        assert comm[kind].busbw_gbps == pytest.approx(nbytes * factor / mean_ns, rel=1e-12)
        per_rank_mean = sum(nbytes * factor / d for d in durs) / len(durs)
        assert comm[kind].busbw_gbps != pytest.approx(per_rank_mean, rel=1e-3)
    # as found, nothing in the traces sizes the group: all_reduce busbw unknown, never the
    # world assumed; broadcast's factor is 1 whatever the group, so its busbw stands
    found = analyse(as_found).runs[0].communication
    assert found["all_reduce"].busbw_gbps is None
    assert found["broadcast"].busbw_gbps == pytest.approx(comm["broadcast"].busbw_gbps, rel=1e-12)
    assert found["all_reduce"].bytes == want["all_reduce"][0]
