"""Tile a rank's profiled window K times: a bigger trace with the same per-step figures.

Used by the tiling test (every per-step figure must be unchanged) and by the benchmarks of
issue 6 (8 ranks x 40 MB). Copy i (0-based) shifts every timestamp by i x (trace span + gap)
and offsets every id that links events (External id, correlation, flow ``id``, Ev Idx,
Record function id) by i x (largest id + 1), and renumbers ``ProfilerStep#N`` to
``N + i x (number of steps spanned)``. Timestamps are handled as exact decimals
(``msgspec`` ``float_hook=Decimal``), so sub-microsecond epoch timestamps survive unchanged.
"""

from __future__ import annotations

import gzip
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

_ID_ARGS = ("External id", "external id", "correlation", "Ev Idx", "Record function id")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def read_trace(path: Path) -> dict[str, Any]:
    """Read a .json / .json.gz trace with exact decimal numbers."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return msgspec.json.Decoder(float_hook=Decimal).decode(raw)


def write_trace(trace: dict[str, Any], path: Path) -> None:
    """Write a trace (gzip when the name ends in .gz), decimals as JSON numbers."""
    data = msgspec.json.Encoder(decimal_format="number").encode(trace)
    path.write_bytes(gzip.compress(data, 1) if path.name.endswith(".gz") else data)


def tile(trace: dict[str, Any], k: int, *, gap_us: int = 1000) -> dict[str, Any]:
    """Return a new trace whose events are ``k`` shifted copies of ``trace``'s (see module).

    ``k`` >= 1; metadata events (ph "M") are kept once. Raises ValueError for k < 1 or a trace
    without timed events."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    events = trace["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") != "M"]
    if not timed:
        raise ValueError("trace has no timed events")
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + e.get("dur", 0) for e in timed)
    shift = int(hi - lo) + 1 + gap_us  # whole µs: exact on decimals and ints alike
    max_id = 0
    for e in timed:
        a = e.get("args") or {}
        for key in _ID_ARGS:
            if isinstance(a.get(key), int):
                max_id = max(max_id, a[key])
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    id_off = max_id + 1
    steps = [int(m.group(1)) for e in timed if (m := _STEP.match(str(e.get("name", ""))))]
    step_off = (max(steps) - min(steps) + 1) if steps else 0
    out_events = [e for e in events if e.get("ph") == "M" or "ts" not in e]
    for i in range(k):
        for e in timed:
            c = dict(e)
            c["ts"] = e["ts"] + i * shift
            if i:
                if isinstance(e.get("id"), int):
                    c["id"] = e["id"] + i * id_off
                a = e.get("args")
                if a:
                    a = dict(a)
                    for key in _ID_ARGS:
                        if isinstance(a.get(key), int) and a[key] >= 0:
                            a[key] = a[key] + i * id_off
                    c["args"] = a
                m = _STEP.match(str(e.get("name", "")))
                if m:
                    c["name"] = f"ProfilerStep#{int(m.group(1)) + i * step_off}"
            out_events.append(c)
    out = dict(trace)
    out["traceEvents"] = out_events
    return out


def tile_file(src: Path, dst: Path, k: int, *, gap_us: int = 1000) -> None:
    """Tile the trace at ``src`` ``k`` times into ``dst``."""
    write_trace(tile(read_trace(src), k, gap_us=gap_us), dst)
