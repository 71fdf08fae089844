"""A run's memory entry of the report (``report_types.Memory``), every figure with its source.

Sources, in the order the run's peak is taken from (``peak_source`` says which one was):
1. ``memory_categories.parquet`` (records of this version): bytes per rank by category; its
   ``peak`` row is the CUDA allocator's peak or, on CPU, the sum of the categories.
2. The traces' ``[memory]`` events (any trace, foreign ones included): peak allocated / reserved
   per device (``memory.device_peaks``); accelerator devices first, CPU only when no other.
3. ``steps.parquet`` (older records): the CUDA peak, else the profiler-window peak.
Process RSS (steps.parquet, ru_maxrss) is the whole process -- torch, Python, libraries -- and is
kept apart (``peak_rss_bytes``, ``ranks``), never a peak of what the model needs.
"""

from __future__ import annotations

import pandas as pd

from analyzer.analyses import memory, sharding
from analyzer.contract import schemas
from analyzer.contract.report_types import (Allocation, AnalysisOptions, DeviceMemory, Memory,
                                            MemoryCategory, MemoryFit, MemoryRank,
                                            ShardingPrediction, ShardingRank, SnapshotCategory,
                                            SnapshotTotal)
from analyzer.ingest import rundirs

CATEGORY_SOURCE = {"cuda_max_allocated": "memory_categories.parquet: torch.cuda.max_memory_allocated "
                                         "(peak stats reset at each step's start, steps after step 0)",
                   "sum_of_categories": "memory_categories.parquet: parameters + gradients + "
                                        "optimizer state + activations (CPU: the allocator keeps no peak)"}


def run_memory(run: rundirs.RunDir, steps: pd.DataFrame | None, tables, options: AnalysisOptions
               ) -> Memory:
    """The memory entry of ``run``: ``steps`` its steps.parquet (``memory.read_steps``; None
    when absent), ``tables`` its traces' per-rank tables (None without traces). Raises
    ``BadInput`` for a malformed memory file."""
    out = Memory()
    recorded = run.manifest is not None
    snap = run.path / schemas.MEMORY_DIR / schemas.MEMORY_PARQUET_NAME
    if recorded and snap.exists():
        mem = memory.read_memory(snap)
        out.snapshot_by_category = [SnapshotCategory(**r) for r in
                                    memory.memory_by_category(mem).to_dict("records")]
        out.snapshot_totals = [SnapshotTotal(**r) for r in memory.snapshot_totals(mem).to_dict("records")]
        out.largest = [Allocation(**r) for r in memory.largest_allocations(mem).to_dict("records")]
    cats = run.path / schemas.MEMORY_CATEGORIES_NAME
    if recorded and cats.exists():
        df = memory.read_categories(cats)
        out.by_category = [MemoryCategory(rank=int(r.rank), category=r.category, bytes=int(r.bytes),
                                          reserved_bytes=None if pd.isna(r.reserved_bytes) else int(r.reserved_bytes),
                                          source=r.source) for r in df.itertuples()]
        if recorded and snap.exists():
            agree = memory.snapshot_agreement(df, memory.snapshot_totals(mem)).set_index("rank")
            for t in out.snapshot_totals:
                if t.rank in agree.index:
                    t.held_bytes = int(agree.at[t.rank, "held_bytes"])
                    t.agrees = bool(agree.at[t.rank, "agrees"])
    if tables is not None:
        out.devices = [DeviceMemory(rank=rt.rank, device=_device(d), events=int(d["events"]),
                                    peak_allocated_bytes=int(d["peak_allocated_bytes"]),
                                    peak_reserved_bytes=None if d["peak_reserved_bytes"] < 0
                                    else int(d["peak_reserved_bytes"]),
                                    start_bytes=int(d["start_bytes"]), source=str(d["source"]))
                       for rt in tables.ranks for d in rt.table("device_memory").to_pylist()]
    if steps is not None and len(steps):
        peaks = memory.rank_peaks(steps)
        out.ranks = [MemoryRank(**r) for r in peaks.to_dict("records")]
        rss = peaks["peak_rss_bytes"].max()
        out.peak_rss_bytes = None if pd.isna(rss) else int(rss)
    _choose_peak(out, steps)
    if recorded:
        out.sharding = sharding_entry(run.manifest, out.by_category)
    if options.device_memory_bytes is not None:
        out.fit = fit(out, options.device_memory_bytes)
    return out


def _device(d: dict) -> str:
    name = memory.DEVICE_TYPES.get(int(d["device_type"]), f"device type {d['device_type']}")
    return f"{name}:{d['device_id']}" if d["device_id"] >= 0 else name


def _choose_peak(out: Memory, steps: pd.DataFrame | None) -> None:
    """Fill ``peak_allocated_bytes`` / ``peak_reserved_bytes`` / ``peak_source`` (module
    docstring order)."""
    peak = [c for c in out.by_category if c.category == "peak"]
    if peak:
        top = max(peak, key=lambda c: c.bytes)
        out.peak_allocated_bytes = top.bytes
        reserved = [c.reserved_bytes for c in peak if c.reserved_bytes is not None]
        out.peak_reserved_bytes = max(reserved) if reserved else None
        out.peak_source = CATEGORY_SOURCE.get(top.source, f"memory_categories.parquet: {top.source}")
        out.peak_lower_bound = top.source == "sum_of_categories"
        return
    devs = [d for d in out.devices if not d.device.startswith("cpu")] or out.devices
    if devs:
        top = max(devs, key=lambda d: d.peak_allocated_bytes)
        out.peak_allocated_bytes = top.peak_allocated_bytes
        reserved = [d.peak_reserved_bytes for d in devs if d.peak_reserved_bytes is not None]
        out.peak_reserved_bytes = max(reserved) if reserved else None
        cpu = " (CPU: counts only what was allocated while profiling)" if top.device.startswith("cpu") else ""
        out.peak_lower_bound = bool(cpu)
        out.peak_source = f"trace [memory] events: {top.source}, largest device ({top.device}){cpu}"
        return
    if steps is not None and len(steps):
        peaks = memory.rank_peaks(steps)
        out.peak_allocated_bytes = memory.peak_allocated_bytes(peaks)
        res = peaks["cuda_max_reserved_bytes"].max()
        out.peak_reserved_bytes = None if pd.isna(res) else int(res)
        if out.peak_allocated_bytes is not None:
            cuda = peaks["cuda_max_allocated_bytes"].notna().any()
            out.peak_lower_bound = not cuda
            out.peak_source = ("steps.parquet: torch.cuda.max_memory_allocated" if cuda else
                               "steps.parquet: profiler window only (a record without "
                               "memory_categories.parquet; misses what was allocated before profiling)")


def fit(mem: Memory, device_bytes: int) -> MemoryFit:
    """Does ``mem``'s largest per-rank peak fit in ``device_bytes``? The needed figure is the
    peak reserved when known (what the CUDA caching allocator took from the device), else the
    peak allocated. A peak that is only a lower bound (``Memory.peak_lower_bound``: a CPU
    record's sum of categories, a profiler-window peak) proves "does not fit" when it is
    above the device, and nothing when it is below: fits is then None (not known)."""
    if mem.peak_reserved_bytes is not None:
        needed, basis, lower = mem.peak_reserved_bytes, "peak reserved", False
    elif mem.peak_allocated_bytes is not None:
        needed, basis, lower = mem.peak_allocated_bytes, "peak allocated", mem.peak_lower_bound
    else:
        return MemoryFit(device_bytes=device_bytes, needed_bytes=None, basis="no memory figure",
                         fits=None, spare_bytes=None)
    fits = needed <= device_bytes
    return MemoryFit(device_bytes=device_bytes, needed_bytes=needed, basis=basis,
                     fits=None if lower and fits else fits, spare_bytes=device_bytes - needed,
                     lower_bound=lower)


def sharding_entry(manifest: schemas.Manifest, by_category: list[MemoryCategory]
                   ) -> ShardingPrediction | None:
    """What the run's sharding predicts (analyzer/analyses/sharding.py ``predict``) with each
    rank's measured ``parameters`` bytes and its ``check``; None without a prediction."""
    pred = sharding.predict(manifest)
    if pred is None:
        return None
    measured = {(c.rank, c.category): c.bytes for c in by_category}
    per = sharding.BYTES_PER_ELEMENT
    opt = (manifest.training.optimizer.get("name", "sgd") if manifest.training is not None
           else "sgd")  # records before issue 18: plain SGD
    ranks = []
    for r in pred["ranks"]:
        exp = r["expected_elements"] * per
        padded = None if r["padded_elements"] is None else r["padded_elements"] * per
        got = measured.get((r["rank"], "parameters"))
        grads = measured.get((r["rank"], "gradients"))
        state, state_exact = sharding.optimizer_state_elements(
            opt, r.get("unpadded_elements"), r["expected_elements"], r.get("tensors"))
        held = measured.get((r["rank"], "optimizer_state"))
        ranks.append(ShardingRank(
            rank=r["rank"], stage=r["stage"], expected_elements=r["expected_elements"],
            expected_bytes=exp, padded_bytes=padded, measured_bytes=got,
            check=sharding.check(exp, padded, got),
            gradients_expected_bytes=padded if padded is not None else exp,
            gradients_measured_bytes=grads, gradients_check=sharding.check(exp, padded, grads),
            optimizer_state_expected_bytes=state, optimizer_state_measured_bytes=held,
            optimizer_state_check=("not_measured" if state is None else sharding.check(
                state, round(state) if state_exact else None, held))))
    return ShardingPrediction(formula=pred["formula"], ratio=pred["ratio"],
                              largest_rank=pred["largest_rank"], exact=pred["exact"],
                              basis=pred["basis"], bytes_per_element=per, ranks=ranks)
