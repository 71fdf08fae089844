"""Issue 5, fuzzing: mutate real corpus traces (drop, duplicate, retype and truncate fields and
bytes); the analyzer either succeeds or raises a ``ParityTraceError`` subclass, never anything
else. Bounded: a fixed number of examples per seed trace, well under a minute in all."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer import api
from analyzer.analyses.clock import clock_offsets
from analyzer.analyses.collectives import by_kind, match_ranks
from analyzer.contract.errors import ParityTraceError
from analyzer.timeline.merge import MergeOptions, merge_traces
from tests.corpus import skip_reason
from tests.inputs import DLRM, TBPLUGIN, load

FIELDS = ["ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "External id", "correlation",
          "stream", "Collective name", "In msg nelems", "Process Group Name", "Input Dims"]
ODD = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8),
                st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


def _seeds() -> list[dict]:
    out = []
    if (TBPLUGIN / "nccl__worker0.json").exists():
        out.append(load(TBPLUGIN / "nccl__worker0.json"))
        out.append(load(TBPLUGIN / "gloo_cpu__worker1.json"))
    if (DLRM / "worker2.pt.trace.json.gz").exists():
        t = load(DLRM / "worker2.pt.trace.json.gz")
        # a slice keeps each example fast: metadata + ProfilerStep + the first NCCL kernels
        keep = [e for e in t["traceEvents"] if e.get("ph") == "M" or "ProfilerStep" in str(e.get("name"))]
        keep += [e for e in t["traceEvents"] if e.get("ph") == "X"][:250]
        t["traceEvents"] = keep
        out.append(t)
    return out


SEEDS = _seeds()


def _targets(ev: dict) -> list[tuple[dict, str]]:
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    return [(ev, k) for k in ev] + [(args, k) for k in args]


@st.composite
def mutated(draw) -> bytes:
    trace = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    events = trace["traceEvents"]
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["drop", "dup", "retype", "add", "truncate_list", "top"]))
        if not events:
            break
        i = draw(st.integers(0, len(events) - 1))
        ev = events[i]
        if op == "dup":
            events.insert(i, json.loads(json.dumps(ev)))
        elif op == "truncate_list":
            del events[draw(st.integers(0, len(events))):]
        elif op == "top":
            key = draw(st.sampled_from(["traceEvents", "distributedInfo", "deviceProperties"]))
            if draw(st.booleans()):
                trace.pop(key, None)
            else:
                trace[key] = draw(ODD)
            events = trace["traceEvents"] if isinstance(trace.get("traceEvents"), list) else []
        elif isinstance(ev, dict):
            spots = _targets(ev)
            if op == "drop" and spots:
                obj, key = draw(st.sampled_from(spots))
                obj.pop(key, None)
            elif op == "retype" and spots:
                obj, key = draw(st.sampled_from(spots))
                obj[key] = draw(ODD)
            elif op == "add":
                ev[draw(st.sampled_from(FIELDS))] = draw(ODD)
    data = json.dumps(trace).encode()
    byte_op = draw(st.sampled_from(["none", "none", "truncate", "flip"]))
    if byte_op == "truncate":
        data = data[: draw(st.integers(0, len(data)))]
    elif byte_op == "flip" and data:
        pos = draw(st.integers(0, len(data) - 1))
        data = data[:pos] + bytes([draw(st.integers(0, 255))]) + data[pos + 1:]
    if draw(st.booleans()):
        data = gzip.compress(data)
        if draw(st.booleans()):
            data = data[: draw(st.integers(0, len(data)))]
    return data


def _analyse(folder: Path) -> None:
    ts = api.load_tables(folder, jobs=1)
    by_kind(ts.collectives)
    match_ranks(ts.collectives, clock_offsets(ts.collectives))
    for rt in ts.ranks:
        api.load_events(rt.path)


@pytest.mark.skipif(not SEEDS, reason=skip_reason())
@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=mutated())
def test_mutated_traces_succeed_or_raise_the_typed_error(data):
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "job"
        folder.mkdir()
        (folder / "rank0.trace.json.gz").write_bytes(data)
        try:
            _analyse(folder)
        except ParityTraceError:
            pass
        try:
            merge_traces(folder, Path(tmp) / "m.json.gz", MergeOptions())
        except ParityTraceError:
            pass
