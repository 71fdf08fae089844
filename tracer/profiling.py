"""torch.profiler setup for one rank, the one-shot trace export, and memory peaks from the trace."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from analyzer.contract.atomic import write_atomic
from tracer.config import RecordConfig
from tracer.trace_names import name_tracks


def activities(device_type: str) -> list[ProfilerActivity]:
    """CPU, plus CUDA on a CUDA device."""
    acts = [ProfilerActivity.CPU]
    if device_type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    return acts


class OneShotExport:
    """``on_trace_ready`` handler: exports the trace once, atomically, to ``path`` (.json.gz),
    and keeps its per-step memory peaks (``allocated_peaks``, {ProfilerStep N: bytes}).

    Kineto writes plain JSON to a temp file outside the run dir (as ``export_chrome_trace``
    does itself for a ``.gz`` name); it is parsed once, its tracks named (tracer/trace_names.py),
    its peaks taken, and it is gzipped (level 6) atomically to ``path``. A second call raises
    ``RuntimeError`` (the schedule has ``repeat=1``, so it never should).
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self.exported = False
        self.cancelled = False
        self.allocated_peaks: dict[int, int] = {}

    def cancel(self) -> None:
        """A failed rank writes no trace (the profiler's exit would export a partial one)."""
        self.cancelled = True

    def __call__(self, prof: profile) -> None:
        if self.cancelled:
            return
        if self.exported:
            raise RuntimeError(f"{self.path}: trace already exported once")
        fd, raw_name = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        raw = Path(raw_name)
        try:
            prof.export_chrome_trace(str(raw))  # not .gz: Kineto's own plain JSON
            trace = name_tracks(json.loads(raw.read_bytes()))
        finally:
            raw.unlink(missing_ok=True)
        self.allocated_peaks = peaks_of_events(trace.get("traceEvents", []))
        write_atomic(self.path, gzip.compress(json.dumps(trace).encode("utf-8"), compresslevel=6))
        self.exported = True


def make_profiler(cfg: RecordConfig, device_type: str, trace_path: Path) -> tuple[profile, OneShotExport]:
    """A profiler with schedule(wait, warmup, active, repeat=1), record_shapes, profile_memory,
    no stacks; call ``step()`` after every training step (step 0 is always in ``wait``)."""
    export = OneShotExport(trace_path)
    prof = profile(
        activities=activities(device_type),
        schedule=schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active, repeat=1),
        on_trace_ready=export,
        record_shapes=True,
        profile_memory=True,
        with_stack=False,
    )
    return prof, export


def peaks_of_events(events: list[dict], device_type: int = 0) -> dict[int, int]:
    """Peak of the profiler's ``[memory]`` "Total Allocated" (bytes) inside each ``ProfilerStep#N``.

    ``events``: a Chrome trace's ``traceEvents``. ``device_type`` filters the memory events'
    "Device Type" arg (0 = CPU in Kineto's encoding). Returns {step N: peak bytes} for the
    steps that have memory events.
    """
    steps = []
    for e in events:
        name = e.get("name", "")
        if e.get("ph") == "X" and name.startswith("ProfilerStep#"):
            steps.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), int(name.split("#")[1])))
    peaks: dict[int, int] = {}
    for e in events:
        if e.get("name") != "[memory]":
            continue
        args = e.get("args", {})
        if args.get("Device Type", 0) != device_type or "Total Allocated" not in args:
            continue
        ts = float(e["ts"])
        for start, end, step in steps:
            if start <= ts <= end:
                peaks[step] = max(peaks.get(step, 0), int(args["Total Allocated"]))
                break
    return peaks


def cuda_sync(device: torch.device) -> None:
    """Wait for queued device work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
