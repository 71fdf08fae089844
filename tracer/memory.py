"""CUDA allocator snapshots: recorded per rank, kept as the pickle memory_viz opens, and converted
to ``memory/memory.parquet`` (MEMORY_SCHEMA) at record time so the analyzer never unpickles.

Only the tracer (which produced the snapshot in this very process) pickles; nothing here loads a
pickle. ``snapshot_to_rows`` works on the dict ``torch.cuda.memory._snapshot()`` returns (keys
as documented in torch 2.11 / 2.13 ``torch/cuda/memory.py`` ``_snapshot`` and written by
``torch/csrc/cuda/memory_snapshot.cpp``)::

    {"segments": [{"device", "address", "total_size", "allocated_size", "active_size",
                   "requested_size", "stream", "segment_type": "small"|"large",
                   "segment_pool_id": (int, int), "is_expandable", "frames",
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated"|"active_pending_free"|"inactive",
                               "frames": [{"filename", "line", "name"}, ...]}]}],
     "device_traces": [[{"action", "addr", "size", "stream", "time_us", "frames"}, ...]],
     "allocator_settings": {...}}

Frames are innermost first. Only ``segments`` is converted (the state when the snapshot was
taken); ``device_traces`` (the allocation history) stays in the pickle for memory_viz.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa

from analyzer.contract.atomic import write_atomic
from analyzer.contract.schemas import MEMORY_SCHEMA
from tracer.numerics import rows_to_table

SNAPSHOT_PICKLE_PROTOCOL = 4
"""Pickle protocol of the snapshot file: 4 is read by every Python torch supports (3.4+), so
memory_viz opens the file whatever Python writes or reads it (3.14 pickles with 5 by default)."""
MAX_ENTRIES = 100_000
"""Allocator events kept by ``_record_memory_history``."""


def start_history(device_type: str) -> None:
    """Start recording allocator history of the current CUDA device (no-op on CPU): every
    allocation with its Python stack, the last ``MAX_ENTRIES`` events kept."""
    if device_type == "cuda":
        import torch

        # Python stacks only: symbolising C++ frames (stacks="all") can make _snapshot() take
        # minutes on a long history, and the converter keeps Python frames only anyway.
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES, stacks="python")


def _top_frame(frames: list[dict[str, Any]]) -> str | None:
    """Innermost frame in user Python code ("file:line:func"), skipping torch internals."""
    for fr in frames or []:
        filename = str(fr.get("filename", ""))
        if filename.endswith(".py") and "/torch/" not in filename:
            return f"{filename}:{fr.get('line')}:{fr.get('name')}"
    return None


def snapshot_to_rows(snapshot: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    """One MEMORY_SCHEMA row per block of every segment. ``category`` is null: the allocator
    snapshot does not classify blocks (memory_viz's categories come from the profiler)."""
    return [{"rank": rank, "segment_address": seg.get("address"), "block_size_bytes": int(block["size"]),
             "requested_size_bytes": block.get("requested_size"),
             "state": str(block.get("state", "unknown")), "stream": seg.get("stream"),
             "category": block.get("category"), "top_frame": _top_frame(block.get("frames", []))}
            for seg in snapshot.get("segments", []) for block in seg.get("blocks", [])]


def snapshot_to_table(snapshot: dict[str, Any], rank: int) -> pa.Table:
    """``snapshot_to_rows`` as a MEMORY_SCHEMA table."""
    return rows_to_table(snapshot_to_rows(snapshot, rank), MEMORY_SCHEMA)


def dump_snapshot(device_type: str, path: Path, rank: int) -> pa.Table | None:
    """CUDA: take this process's snapshot, write the pickle for memory_viz atomically to ``path``,
    stop recording, and return its table. CPU: None."""
    if device_type != "cuda":
        return None
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    write_atomic(path, pickle.dumps(snapshot, protocol=SNAPSHOT_PICKLE_PROTOCOL))
    return snapshot_to_table(snapshot, rank)
