"""Name every track of an exported Kineto trace, so viewers and the structural check agree.

Kineto (torch 2.13) writes no ``process_name`` for its ``Spans`` / ``Traces`` pseudo-processes and
names a gloo thread twice ("thread N (pt_gloo_runloop)" and "thread N (python3.11)"); Perfetto then
shows whichever came last. This module only adds or removes ``M`` metadata events; it never touches
a timed event. No torch import, so it is tested on hand-built traces.
"""

from __future__ import annotations

from typing import Any


def name_tracks(trace: dict[str, Any]) -> dict[str, Any]:
    """Make ``trace["traceEvents"]`` name every pid and (pid, tid) with events exactly once.

    - a pid with events but no ``process_name`` gets one: its pid text, or "(no pid)" for "";
    - a (pid, tid) with ``X`` events but no ``thread_name`` gets "thread <tid>";
    - a (pid, tid) named several times keeps one name: the first that does not merely repeat the
      process's executable name (the specific one, e.g. "pt_gloo_runloop"), else the first.
    Returns ``trace``, changed in place. Rules from the Trace Event Format's metadata events.
    """
    events = trace.get("traceEvents")
    if not isinstance(events, list):
        return trace
    process_names: dict[Any, str] = {}
    thread_names: dict[tuple, list[str]] = {}
    timed = [ev for ev in events if isinstance(ev, dict) and ev.get("ph") != "M"]
    for ev in events:  # names first: a name written after the events still counts
        if not isinstance(ev, dict) or ev.get("ph") != "M":
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        if ev.get("name") == "process_name":
            process_names.setdefault(ev.get("pid"), str(args.get("name", "")))
        elif ev.get("name") == "thread_name":
            thread_names.setdefault((ev.get("pid"), ev.get("tid")), []).append(str(args.get("name", "")))
    # unnamed tracks in order of first appearance (dict keys keep it)
    timed_pids = list(dict.fromkeys(ev.get("pid") for ev in timed
                                    if ev.get("pid") not in process_names))
    timed_threads = list(dict.fromkeys((ev.get("pid"), ev.get("tid")) for ev in timed
                                       if ev.get("ph") == "X"
                                       and (ev.get("pid"), ev.get("tid")) not in thread_names))

    keep = {key: _pick(names, process_names.get(key[0], "")) for key, names in thread_names.items()}
    out = []
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "thread_name":
            key = (ev.get("pid"), ev.get("tid"))
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            if str(args.get("name", "")) != keep[key]:
                continue
            keep[key] = None  # keep only the first event that carries the chosen name
        out.append(ev)
    out += [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
             "args": {"name": str(pid) if pid != "" else "(no pid)"}} for pid in timed_pids]
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
             "args": {"name": f"thread {tid}"}} for pid, tid in timed_threads]
    trace["traceEvents"] = out
    return trace


def _pick(names: list[str], process_name: str) -> str:
    """The first name that is not just "thread N (<process executable>)", else the first."""
    for name in names:
        if not process_name or f"({process_name})" not in name:
            return name
    return names[0]
