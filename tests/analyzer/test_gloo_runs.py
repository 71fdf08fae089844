"""Our own 2-rank CPU/gloo DDP and FSDP runs (real torch traces): collective times, kinds and
overlap equal an independent computation written here from the raw JSON.

The independent side works on elementary segments (every event boundary of the step, sorted)
with one boolean per segment per set: no interval algebra from the analyzer, no pandas.
"""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import numpy as np
import pytest

from analyzer.api import load_tables
from tests.inputs import copy_run

pytestmark = pytest.mark.record

GLOO_FOR = {"c10d::allreduce_": "gloo:all_reduce", "c10d::_reduce_scatter_base_": "gloo:all_reduce",
            "c10d::allgather_": "gloo:all_gather", "c10d::_allgather_base_": "gloo:all_gather",
            "c10d::broadcast_": "gloo:broadcast"}
KIND_OF = {"c10d::allreduce_": "all_reduce", "c10d::_reduce_scatter_base_": "reduce_scatter",
           "c10d::allgather_": "all_gather", "c10d::_allgather_base_": "all_gather",
           "c10d::broadcast_": "broadcast"}


def ns(x) -> int:
    return int((Decimal(str(x)) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def raw_events(path: Path):
    data = json.loads(path.read_text(), parse_float=Decimal)
    out = []
    for e in data["traceEvents"]:
        if e.get("ph") == "X":
            s = ns(e["ts"])
            out.append({"name": e["name"], "cat": e.get("cat"), "tid": str(e["tid"]), "s": s,
                        "e": s + ns(e["dur"])})
    return out


def independent(path: Path):
    """Per step: (window, C, K, overlap, collectives [(start, dur, kind)]) from the raw JSON."""
    ev = raw_events(path)
    steps = [e for e in ev if e["name"].startswith("ProfilerStep#")]
    main = steps[0]["tid"]
    gloo = sorted((e for e in ev if e["name"].startswith("gloo:")), key=lambda e: e["s"])
    c10d = sorted((e for e in ev if e["name"].startswith("c10d::") and e["tid"] == main),
                  key=lambda e: e["s"])
    # pairing: the n-th enqueue of a gloo kind with the n-th gloo op of that kind
    queues: dict[str, list] = {}
    for g in gloo:
        queues.setdefault(g["name"], []).append(g)
    pairs = []
    for c in c10d:
        q = queues.get(GLOO_FOR.get(c["name"], ""), [])
        if q:
            pairs.append((c, q.pop(0)))
    kind_of_gloo = {id(g): KIND_OF[c["name"]] for c, g in pairs}
    ops = [e for e in ev if e["tid"] == main and e["cat"] == "cpu_op"
           and not e["name"].startswith("c10d::")]
    out = {}
    starts = sorted(s["s"] for s in steps)
    spans = [e for e in ev if e["cat"] == "Trace"]  # Kineto's span of the profiled window
    opened = None
    if spans:
        t0 = min(e["s"] for e in spans)
        first = min((st for st in steps if st["s"] >= t0), key=lambda st: st["s"], default=None)
        if first is not None and not any(t0 <= e["s"] < first["s"] for e in ev
                                         if e not in steps and e["cat"] != "Trace"):
            opened = first
    for st in steps:
        n = int(st["name"].split("#")[1])
        mine = [(c, g) for c, g in pairs if st["s"] <= c["s"] < st["e"]]
        gl = [g for _, g in mine]
        # the span extended to its gloo work's end, never past the next span's start (a DDP
        # bucket's all_reduce can still run when the next ProfilerStep begins)
        later = [t for t in starts if t > st["s"]]
        lo, hi = st["s"], max([st["e"]] + [g["e"] for g in gl])
        # the step Kineto's window span opens starts at its first event (the profiler's start-up)
        if st is opened:
            lo = min(e["s"] for e in ev if e["s"] >= st["s"] and e not in steps
                     and e["cat"] != "Trace")
        hi = min([hi] + later[:1])
        pts = sorted({lo, hi} | {x for e in ev for x in (e["s"], e["e"]) if lo <= x <= hi})
        pts = np.array(pts, dtype=object)
        seg_len = np.array([b - a for a, b in zip(pts[:-1], pts[1:])], dtype=object)
        index = {p: i for i, p in enumerate(pts)}

        def cover(items):
            m = np.zeros(len(pts) - 1, bool)
            for a, b in items:
                a, b = max(a, lo), min(b, hi)
                if b > a:
                    m[index[a]:index[b]] = True
            return m

        step_ops = [o for o in ops if st["s"] <= o["s"] < st["e"]]
        K = cover((o["s"], o["e"]) for o in step_ops)
        K &= ~cover((c["s"], c["e"]) for c in c10d if st["s"] <= c["s"] < st["e"])
        for c, g in mine:
            others = cover((o["s"], o["e"]) for o in step_ops
                           if not (o["s"] <= c["s"] and o["e"] >= c["e"]))
            K &= ~(cover([(c["e"], g["e"])]) & ~others)
        C = cover((g["s"], g["e"]) for g in gl)

        def length(m):
            return int(sum(seg_len[m]))

        out[n] = {"step_ns": hi - lo, "comm_ns": length(C), "compute_ns": length(K),
                  "overlap_ns": length(C & K),
                  "coll": sorted((g["s"], g["e"] - g["s"], kind_of_gloo[id(g)]) for g in gl)}
    return out


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_gloo_run_matches_independent_computation(gloo_runs, strategy, tmp_path):
    ts = load_tables(copy_run(gloo_runs / strategy, tmp_path / strategy))  # caches land there
    assert [(r.rank, r.rank_source, r.device_kind) for r in ts.ranks] == \
        [(0, "distributedInfo", "cpu"), (1, "distributedInfo", "cpu")]
    b = ts.breakdown
    c = ts.collectives
    kinds = set()
    for rt in ts.ranks:
        want = independent(rt.path)
        mine = b[b["rank"] == rt.rank].set_index("step")
        assert sorted(mine.index) == sorted(want)
        for step, w in want.items():
            got = mine.loc[step]
            for k in ("step_ns", "comm_ns", "compute_ns", "overlap_ns"):
                assert got[k] == w[k], (rt.rank, step, k)
            cc = c[(c["rank"] == rt.rank) & (c["step"] == step)]
            assert sorted(zip(cc["start_ns"], cc["dur_ns"], cc["kind"])) == w["coll"]
            kinds |= {k for _, _, k in w["coll"]}
    assert (b["compute_ns"] + b["exposed_comm_ns"] + b["data_wait_ns"] + b["other_ns"] + b["idle_ns"]
            == b["step_ns"]).all()
    if strategy == "fsdp":
        assert {"all_gather", "reduce_scatter"} <= kinds
    else:
        assert "all_reduce" in kinds
