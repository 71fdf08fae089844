"""torch.profiler setup for one rank, the one-shot trace export, and memory peaks from the trace."""

from __future__ import annotations

import contextlib
import gzip
import json
import shutil
import tempfile
import threading
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from analyzer.contract.atomic import write_atomic
from tracer.config import RecordConfig
from tracer.trace_names import name_tracks


def settle_threads(limit_s: float = 1.0, quiet_polls: int = 3) -> bool:
    """Block until no other thread of this process runs (no ``R`` state in
    ``/proc/self/task/*/stat`` on ``quiet_polls`` polls in a row, 1 ms apart), at most ``limit_s``
    seconds (no /proc: 50 ms); True when they settled. Why: torch 2.13 races a profiler stop
    against a gloo worker thread still finishing a collective the main thread saw complete (its
    record-function end and bookkeeping run after the future is done), and corrupts the heap
    (SIGSEGV, SIGABRT or bad_alloc in ``_disable_profiler``, Flight Recorder on or off).
    tests/tracer/test_profiling_stop.py holds it under glibc's heap checks."""
    tasks, me = Path("/proc/self/task"), str(threading.get_native_id())
    if not tasks.is_dir():
        time.sleep(0.05)
        return False
    deadline, quiet = time.monotonic() + limit_s, 0
    while quiet < quiet_polls and time.monotonic() < deadline:
        states = []
        for task in tasks.iterdir():
            with contextlib.suppress(OSError, IndexError):  # a thread that ended meanwhile
                states.append(task.name != me and (task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        quiet = 0 if "R" in states else quiet + 1
        time.sleep(0.001)
    return quiet >= quiet_polls


class SettledProfile(profile):
    """``torch.profiler.profile`` whose stop first lets the other threads settle
    (``settle_threads``), after the last ``ProfilerStep#N`` range ended: no step window holds it."""

    def stop_trace(self) -> None:
        settle_threads()
        super().stop_trace()


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
        folder = Path(tempfile.mkdtemp(prefix="tracer-export-"))
        raw = folder / "trace.json"
        try:
            prof.export_chrome_trace(str(raw))  # not .gz: Kineto's own plain JSON
            trace = name_tracks(json.loads(raw.read_bytes()))
        finally:  # with Kineto's own temp file (trace.json.tmp), left when its write failed
            shutil.rmtree(folder, ignore_errors=True)
        self.allocated_peaks = peaks_of_events(trace.get("traceEvents", []))
        write_atomic(self.path, gzip.compress(json.dumps(trace).encode("utf-8"), compresslevel=6))
        self.exported = True


def make_profiler(cfg: RecordConfig, device_type: str, trace_path: Path) -> tuple[profile, OneShotExport]:
    """A profiler with schedule(wait, warmup, active, repeat=1), record_shapes, profile_memory,
    no stacks; call ``step()`` after every training step (step 0 is always in ``wait``)."""
    export = OneShotExport(trace_path)
    prof = SettledProfile(
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
