"""Structural check of a Chrome trace, written from the Trace Event Format specification.

Source: "Trace Event Format" (Google, the chrome://tracing JSON spec; also what Perfetto's JSON
importer reads). The rules checked, per event phase ``ph``:

- every event: ``ph`` a string; ``pid`` and ``tid`` present (int or string); ``ts`` a finite
  number of microseconds (optional only for metadata ``M``); ``name`` a string.
- ``X`` complete events: ``dur`` a finite number of microseconds, >= 0.
- ``B``/``E`` duration events: every ``E`` closes an open ``B`` on its (pid, tid).
- ``i``/``I`` instant events: scope ``s``, when present, is one of ``g``, ``p``, ``t``.
- ``s``/``t``/``f`` flow events: ``id`` (or ``id2``) present; ``bp``, when present, is ``e``; every
  flow start has a finish with the same (cat, name, id) at or after it, and vice versa.
- ``b``/``n``/``e`` async events: ``id`` (or ``id2``) present.
- ``C`` counter events: every value in ``args`` is a number.
- ``M`` metadata: name one of process_name, process_labels, process_sort_index, thread_name,
  thread_sort_index, with ``args.name`` / ``args.labels`` a string, ``args.sort_index`` an int.

Viewer rules beyond the spec text (Perfetto drops or moves what breaks them):

- ``X`` events on one (pid, tid) are properly nested: no event starts inside another and ends
  after it (a *partial overlap*). Times are compared in integer nanoseconds, rounded from the
  microsecond numbers as a viewer converts them.
- names (``strict_names``): every pid with events has a ``process_name``, every (pid, tid) with
  ``X`` events has a ``thread_name``, and no (pid, tid) has two different thread names.

``check_trace`` returns every problem found (one line each); an empty list means the trace passes.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

METADATA_NAMES = {
    "process_name": ("name", str),
    "process_labels": ("labels", str),
    "process_sort_index": ("sort_index", int),
    "thread_name": ("name", str),
    "thread_sort_index": ("sort_index", int),
}
PHASES = set("XBEiIstfbneCMPONDcRv")
"""Phases the spec defines (``P`` sample, ``O``/``N``/``D`` object, ``c``/``R``/``v`` mark/memory)."""
MAX_PROBLEMS_PER_KIND = 20
"""A problem kind is listed this many times, then summarised with a count."""


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _to_ns(value_us: float) -> int:
    return round(value_us * 1000)


def partial_overlaps(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Pairs (i, j) of spans on one track where span j starts inside span i and ends after it.

    ``spans`` are (start_ns, end_ns). Uses a stack over spans sorted by (start, -end), the order
    in which a viewer nests them. Returns indices into ``spans``; empty when properly nested.
    """
    order = sorted(range(len(spans)), key=lambda k: (spans[k][0], -spans[k][1]))
    stack: list[int] = []
    bad: list[tuple[int, int]] = []
    for j in order:
        start, end = spans[j]
        while stack and spans[stack[-1]][1] <= start:
            stack.pop()
        if stack and end > spans[stack[-1]][1]:
            bad.append((stack[-1], j))
            continue  # a viewer drops or moves j; keep checking the rest against the stack
        stack.append(j)
    return bad


class _Problems:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts: dict[str, int] = defaultdict(int)

    def add(self, kind: str, text: str) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= MAX_PROBLEMS_PER_KIND:
            self.lines.append(f"{kind}: {text}")

    def result(self) -> list[str]:
        more = [f"{kind}: {n - MAX_PROBLEMS_PER_KIND} more" for kind, n in self.counts.items()
                if n > MAX_PROBLEMS_PER_KIND]
        return self.lines + more


def _check_pairs(spans: dict, names_at: dict, open_b: dict, flows: dict, out: _Problems) -> None:
    """The checks across events of one track or flow, once every event is read: X events that
    partly overlap, B events never closed, flows without a start or finish or that go back."""
    for key, items in spans.items():
        for a, b in partial_overlaps(items):
            na, nb = names_at[key][a], names_at[key][b]
            out.add("partial_overlap", f"pid {key[0]!r} tid {key[1]!r}: {nb!r} "
                    f"[{items[b][0]}, {items[b][1]}] ns starts inside {na!r} "
                    f"[{items[a][0]}, {items[a][1]}] ns and ends after it")
    for key, n in open_b.items():
        if n:
            out.add("unmatched_B", f"pid {key[0]!r} tid {key[1]!r}: {n} B events never closed")
    for key, items in flows.items():
        starts = [t for ph, t in items if ph == "s"]
        ends = [t for ph, t in items if ph == "f"]
        if not starts or not ends:
            out.add("flow_unpaired", f"flow {key!r} has {len(starts)} start(s), {len(ends)} finish(es)")
        elif max(ends) < min(starts):
            out.add("flow_backwards", f"flow {key!r} finishes before it starts")


def _check_names(pids_used: set, spans: dict, process_names: set, thread_names: dict,
                 out: _Problems) -> None:
    """``strict_names``'s checks: each pid with events has a process_name, each track with X
    events a thread_name, and no track two different names."""
    for pid in sorted(pids_used, key=str):
        if pid not in process_names:
            out.add("process_name", f"pid {pid!r} has events but no process_name metadata")
    for key in sorted(spans, key=str):
        if key not in thread_names:
            out.add("thread_name", f"pid {key[0]!r} tid {key[1]!r} has X events but no thread_name")
    for key, names in thread_names.items():
        if len(names) > 1:
            out.add("thread_name", f"pid {key[0]!r} tid {key[1]!r} has {len(names)} different "
                    f"names {sorted(names)!r}")


def check_trace(trace: Any, *, strict_names: bool = True) -> list[str]:
    """Check a parsed Chrome trace (object or array form); return one line per problem found.

    ``strict_names`` also requires process/thread name metadata (see the module docstring).
    Problems of one kind beyond ``MAX_PROBLEMS_PER_KIND`` are summarised as a count.
    """
    out = _Problems()
    if isinstance(trace, dict):
        events = trace.get("traceEvents")
        unit = trace.get("displayTimeUnit")
        if unit is not None and unit not in ("ms", "ns"):
            out.add("top_level", f"displayTimeUnit {unit!r} is not 'ms' or 'ns'")
    else:
        events = trace
    if not isinstance(events, list):
        return ["top_level: no traceEvents list"]

    spans: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    names_at: dict[tuple, list[str]] = defaultdict(list)
    open_b: dict[tuple, int] = defaultdict(int)
    flows: dict[tuple, list[tuple[str, int]]] = defaultdict(list)
    process_names: set = set()
    thread_names: dict[tuple, set[str]] = defaultdict(set)
    pids_used: set = set()

    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            out.add("event", f"#{i} is not an object")
            continue
        ph = ev.get("ph")
        if not isinstance(ph, str) or ph not in PHASES:
            out.add("phase", f"#{i} has ph {ph!r}")
            continue
        if "pid" not in ev or "tid" not in ev:
            out.add("pid_tid", f"#{i} ({ph} {ev.get('name')!r}) lacks pid or tid")
            continue
        pid, tid = ev["pid"], ev["tid"]
        if not isinstance(ev.get("name"), str):
            out.add("name", f"#{i} ({ph}) has name {ev.get('name')!r}")
        if ph == "M":
            _check_metadata(i, ev, out, process_names, thread_names)
            continue
        pids_used.add(pid)
        ts = ev.get("ts")
        if not _is_number(ts):
            out.add("ts", f"#{i} ({ph} {ev.get('name')!r}) has ts {ts!r}, not a number of microseconds")
            continue
        if ph == "X":
            dur = ev.get("dur")
            if not _is_number(dur) or dur < 0:
                out.add("dur", f"#{i} (X {ev.get('name')!r}) has dur {dur!r}, not a number >= 0")
                continue
            start = _to_ns(ts)
            spans[(pid, tid)].append((start, start + _to_ns(dur)))
            names_at[(pid, tid)].append(str(ev.get("name")))
        elif ph == "B":
            open_b[(pid, tid)] += 1
        elif ph == "E":
            if open_b[(pid, tid)] == 0:
                out.add("unmatched_E", f"#{i} closes no open B on pid {pid!r} tid {tid!r}")
            else:
                open_b[(pid, tid)] -= 1
        else:
            problem = phase_problem(ev)
            if problem:
                out.add(problem[0], f"#{i} {problem[1]}")
            if ph in "stf" and ("id" in ev or "id2" in ev):
                key = (ev.get("cat"), ev.get("name"), str(ev.get("id", ev.get("id2"))))
                flows[key].append((ph, _to_ns(ts)))

    _check_pairs(spans, names_at, open_b, flows, out)
    if strict_names:
        _check_names(pids_used, spans, process_names, thread_names, out)
    return out.result()


def phase_problem(ev: dict) -> tuple[str, str] | None:
    """(problem kind, what) of the first rule of its phase (module docstring: ``i``/``I``
    scope, flow and async ids, flow ``bp``, counter values) that ``ev`` breaks; None if none."""
    ph = ev["ph"]
    if ph in "iI" and ev.get("s", "t") not in ("g", "p", "t"):
        return "instant_scope", f"has scope {ev.get('s')!r}"
    if ph in "stfbne" and "id" not in ev and "id2" not in ev:
        return ("flow_id" if ph in "stf" else "async_id"), f"({ph}) has no id"
    if ph == "f" and ev.get("bp", "e") != "e":
        return "flow_bp", f"has bp {ev.get('bp')!r}"
    args = ev.get("args")
    if ph == "C" and not (isinstance(args, dict) and all(_is_number(v) for v in args.values())):
        return "counter", f"(C {ev.get('name')!r}) args are not all numbers"
    return None


def _check_metadata(i: int, ev: dict, out: _Problems, process_names: set,
                    thread_names: dict[tuple, set[str]]) -> None:
    name = ev.get("name")
    if name not in METADATA_NAMES:
        return  # the spec allows other metadata; viewers ignore it
    key, kind = METADATA_NAMES[name]
    args = ev.get("args")
    value = args.get(key) if isinstance(args, dict) else None
    ok = isinstance(value, kind) and not isinstance(value, bool)
    if not ok:
        out.add("metadata", f"#{i} ({name}) has args.{key} {value!r}, not a {kind.__name__}")
        return
    if name == "process_name":
        process_names.add(ev["pid"])
    elif name == "thread_name":
        thread_names[(ev["pid"], ev["tid"])].add(value)
