"""Memory and step-time summaries from ``steps.parquet``, ``memory_categories.parquet``,
``memory/memory.parquet`` and the traces' ``[memory]`` events.

Per run and rank: bytes by category (parameters, gradients, optimizer state, activations, peak:
what the rank holds, schemas.MEMORY_CATEGORIES_SCHEMA); CPU peak RSS (ru_maxrss high-water mark,
the whole process) and the profiler-window allocated peak; CUDA peak allocated / reserved; when
the CUDA allocator snapshot was converted, the largest live allocations and bytes by the
snapshot's category; from any trace, peak allocated / reserved per device (``device_peaks``).
Step time of a distributed step = the slowest rank's ``wall_ns`` (every rank waits for it at
the next collective).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.contract.schemas import NO_VALUE

PEAK_COLUMNS = ("peak_rss_bytes", "profiler_allocated_peak_bytes", "cuda_max_allocated_bytes",
                "cuda_max_reserved_bytes")


ROW_BYTES = 256
"""A generous cost of one row of a run file as pandas holds it: ``read_parquet`` refuses a file
whose rows would take more than a quarter of the memory at this cost (``memory_bytes``)."""


def memory_bytes() -> int:
    """The memory this process may use: physical RAM, or the cgroup (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) limit when that is smaller; 0 when neither can be read."""
    import os

    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        total = 0
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and 0 < int(text) and (not total or int(text) < total):
            total = int(text)
    return total


def _run_manifest(path: Path) -> schemas.Manifest | None:
    """The manifest of the run directory holding run file ``path`` (beside it, or one folder up
    for memory/), None when there is none or it cannot be read (discovery has said why)."""
    for folder in (path.parent, path.parent.parent):
        m = folder / schemas.MANIFEST_NAME
        if m.is_file():
            try:
                return schemas.read_manifest(m)
            except schemas.SchemaError:
                return None
    return None


def _too_many_rows(path: Path, rows: int) -> str | None:
    """Why ``rows`` (the file's footer says) is more than run file ``path`` can hold: over what
    its record's manifest allows (``schemas.max_run_file_rows``) or over what the memory
    affords at ``ROW_BYTES`` a row; None when it is not."""
    manifest = _run_manifest(path)
    most = schemas.max_run_file_rows(manifest, path.name) if manifest is not None else None
    if most is not None and rows > most:
        return (f"holds {rows:,} rows, more than the {most:,} its manifest allows (world_size "
                f"{manifest.world_size}, {manifest.steps} steps, {manifest.model.num_params:,} "
                "parameters)")
    mem = memory_bytes()
    if mem and rows * ROW_BYTES > mem // 4:
        return (f"holds {rows:,} rows, more than this machine's memory can hold "
                f"({mem // 4 // ROW_BYTES:,})")
    return None


def read_parquet(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """The columns of ``schema`` from a run directory's Parquet file ``path``. The row count in
    the file's footer is checked first (``_too_many_rows``), and the file's own pandas metadata
    is dropped (the columns are typed by ``schema``, not by what the file claims). Raises
    ``BadInput`` (reason ``bad_run_file``) naming the file when it is unreadable, written by a
    newer schema, lacks a column or holds more rows than its record can have."""
    try:
        schemas.check_parquet_version(path, schema)
        rows = pq.ParquetFile(path).metadata.num_rows
        if why := _too_many_rows(path, rows):
            raise BadInput(path, "bad_run_file", why, "re-record the run")
        table = pq.read_table(path, columns=[n for n in schema.names
                                             if n in pq.read_schema(path).names])
    except schemas.SchemaError as exc:
        raise BadInput(path, "bad_run_file", str(exc).split(": ", 1)[-1]) from None
    except (OSError, pa.ArrowException) as exc:
        raise BadInput(path, "bad_run_file", f"not a readable Parquet file ({exc})",
                       "re-record the run") from None
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise BadInput(path, "bad_run_file", f"lacks column(s) {', '.join(missing)}",
                       "re-record the run with this version of tracer")
    return table.select(schema.names).replace_schema_metadata(None).to_pandas()


def read_steps(path: Path | str) -> pd.DataFrame:
    """Read ``steps.parquet``: columns of ``schemas.STEPS_SCHEMA``; byte columns as nullable
    ``Int64``. Raises ``BadInput`` naming the file when unreadable or incomplete, or when a
    rank, step or wall time is negative (the tracer writes none: a step time below zero would
    be ranked as the fastest)."""
    df = read_parquet(Path(path), schemas.STEPS_SCHEMA)
    for c in ("rank", "step", "wall_ns"):
        df[c] = df[c].astype("int64")
        if (df[c] < 0).any():
            raise BadInput(path, "bad_run_file", f"holds a negative {c} ({int(df[c].min())})",
                           "re-record the run")
    for c in PEAK_COLUMNS:
        df[c] = df[c].astype("Int64")
    df["profiled"] = df["profiled"].astype(bool)
    return df


def step_times(steps: pd.DataFrame) -> pd.DataFrame:
    """Distributed step time per step: step, profiled, step_ns (max over ranks of wall_ns),
    slowest_rank (lowest rank on ties), n_ranks."""
    if steps.empty:
        return pd.DataFrame(columns=["step", "profiled", "step_ns", "slowest_rank", "n_ranks"])
    s = steps.sort_values(["step", "wall_ns", "rank"], ascending=[True, False, True])
    first = s.groupby("step", sort=True).head(1).set_index("step")
    out = pd.DataFrame({
        "step": first.index.astype("int64"),
        "profiled": steps.groupby("step")["profiled"].any().reindex(first.index).to_numpy(),
        "step_ns": first["wall_ns"].to_numpy("int64"),
        "slowest_rank": first["rank"].to_numpy("int64"),
        "n_ranks": steps.groupby("step")["rank"].nunique().reindex(first.index).to_numpy("int64"),
    })
    return out.reset_index(drop=True)


def step_stats(step_ns: pd.Series | np.ndarray | list) -> dict[str, float | int | None]:
    """``{median, p90, n}`` of step times in ns (numpy's linear-interpolation percentile);
    None values when there is no step."""
    arr = np.asarray(step_ns, dtype="float64")
    if arr.size == 0:
        return {"median": None, "p90": None, "n": 0}
    return {"median": float(np.median(arr)), "p90": float(np.percentile(arr, 90)), "n": int(arr.size)}


def rank_peaks(steps: pd.DataFrame) -> pd.DataFrame:
    """Per rank the maxima over steps of ``PEAK_COLUMNS`` (nullable Int64: <NA> when never
    recorded, e.g. CUDA columns on CPU)."""
    if steps.empty:
        return pd.DataFrame(columns=["rank", *PEAK_COLUMNS])
    out = steps.groupby("rank", sort=True)[list(PEAK_COLUMNS)].max().reset_index()
    for c in PEAK_COLUMNS:
        out[c] = out[c].astype("Int64")
    out["rank"] = out["rank"].astype("int64")
    return out


def peak_allocated_bytes(peaks: pd.DataFrame) -> int | None:
    """The run's peak allocated memory: max over ranks of the CUDA peak when recorded, else of the
    profiler-allocated peak; None when neither was recorded."""
    for c in ("cuda_max_allocated_bytes", "profiler_allocated_peak_bytes"):
        if c in peaks and peaks[c].notna().any():
            return int(peaks[c].max())
    return None


def read_memory(path: Path | str) -> pd.DataFrame:
    """Read ``memory/memory.parquet`` (``schemas.MEMORY_SCHEMA``). Raises ``BadInput``."""
    df = read_parquet(Path(path), schemas.MEMORY_SCHEMA)
    df["rank"] = df["rank"].astype("int64")
    df["block_size_bytes"] = df["block_size_bytes"].astype("int64")
    df["category"] = df["category"].astype(object).where(df["category"].notna(), "unknown")
    return df


def memory_by_category(mem: pd.DataFrame) -> pd.DataFrame:
    """Live (``active_allocated``) bytes per rank and category: rank, category, blocks, bytes;
    largest first within each rank."""
    live = mem[mem["state"] == "active_allocated"]
    out = (live.groupby(["rank", "category"], sort=False)["block_size_bytes"]
           .agg(blocks="count", bytes="sum").reset_index())
    return out.sort_values(["rank", "bytes", "category"], ascending=[True, False, True]).reset_index(drop=True)


def largest_allocations(mem: pd.DataFrame, n: int = 5) -> pd.DataFrame:
    """The ``n`` largest live blocks of each rank: rank, block_size_bytes, requested_size_bytes,
    category, top_frame."""
    live = mem[mem["state"] == "active_allocated"]
    live = live.sort_values(["rank", "block_size_bytes"], ascending=[True, False], kind="stable")
    cols = ["rank", "block_size_bytes", "requested_size_bytes", "category", "top_frame"]
    return live.groupby("rank", sort=True).head(n)[cols].reset_index(drop=True)


def read_categories(path: Path | str) -> pd.DataFrame:
    """Read ``memory_categories.parquet`` (``schemas.MEMORY_CATEGORIES_SCHEMA``): rank, category,
    bytes (int64), reserved_bytes (nullable Int64), source. Raises ``BadInput`` naming the file
    when unreadable, incomplete, or holding a category outside ``schemas.MEMORY_CATEGORIES``."""
    path = Path(path)
    df = read_parquet(path, schemas.MEMORY_CATEGORIES_SCHEMA)
    odd = sorted(set(df["category"]) - set(schemas.MEMORY_CATEGORIES))
    if odd:
        raise BadInput(path, "bad_run_file", f"has unknown memory categories {', '.join(odd)}",
                       "re-record the run with this version of tracer")
    df["rank"] = df["rank"].astype("int64")
    df["bytes"] = df["bytes"].astype("int64")
    df["reserved_bytes"] = df["reserved_bytes"].astype("Int64")
    return df.sort_values(["rank", "category"], kind="stable").reset_index(drop=True)


def snapshot_totals(mem: pd.DataFrame) -> pd.DataFrame:
    """Per rank of a CUDA allocator snapshot (``read_memory``): allocated_bytes (live
    ``active_allocated`` blocks) and reserved_bytes (every block of every segment: what the
    caching allocator holds), the figures torch.cuda.memory_allocated / memory_reserved give
    when the snapshot is taken."""
    live = mem["state"] == "active_allocated"
    out = pd.DataFrame({
        "allocated_bytes": mem["block_size_bytes"].where(live, 0).groupby(mem["rank"]).sum(),
        "reserved_bytes": mem.groupby("rank")["block_size_bytes"].sum()})
    return out.astype("int64").rename_axis("rank").reset_index()


DEVICE_TYPES = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia", 20: "privateuse1"}
"""Kineto's ``Device Type`` numbers (c10::DeviceType) as names; others are shown as numbers."""


def device_peaks(events: pd.DataFrame) -> pd.DataFrame:
    """Peak memory per device of one rank's ``[memory]`` events (``decode.memory_events``;
    ``NO_VALUE`` where an event does not say):
    ``schemas.DEVICE_MEMORY_SCHEMA`` rows, one per (device_type, device_id), in that order.

    Peak allocated = the largest "Total Allocated" the allocator reported after an event
    (source ``Total Allocated``); events without it: the running sum of their signed "Bytes"
    (source ``running sum of Bytes``). Either way the series starts from the smallest
    live amount that keeps it from going negative (``start_bytes``): a free of a block allocated
    before the profiler's window (Bytes < 0, or a window-relative total below 0) says that much
    was live already, so no running total is negative and the peak includes it. Peak reserved =
    the largest "Total Reserved" (-1 when no event says)."""
    cols = schemas.DEVICE_MEMORY_SCHEMA.names
    if events.empty:
        return schemas.DEVICE_MEMORY_SCHEMA.empty_table().to_pandas()
    rows = []
    ev = events.sort_values("ts_ns", kind="stable")
    for (dtype, did), g in ev.groupby(["device_type", "device_id"], sort=True):
        total = g["total_allocated"].to_numpy()
        if (total != NO_VALUE).any():
            series, source = total[total != NO_VALUE], "Total Allocated"
        else:
            known = g["bytes"].to_numpy()
            series, source = np.cumsum(known[known != NO_VALUE]), "running sum of Bytes"
        if series.size == 0:
            continue
        start = max(0, -int(series.min()))
        peak = start + max(0, int(series.max()))
        reserved = g["total_reserved"].to_numpy()
        reserved = reserved[reserved != NO_VALUE]
        rows.append({"device_type": int(dtype), "device_id": int(did), "events": len(g),
                     "peak_allocated_bytes": peak,
                     "peak_reserved_bytes": int(reserved.max()) if reserved.size else -1,
                     "start_bytes": start, "source": source})
    if not rows:
        return schemas.DEVICE_MEMORY_SCHEMA.empty_table().to_pandas()
    out = pd.DataFrame(rows, columns=cols)
    for c in cols[:-1]:
        out[c] = out[c].astype("int64")
    return out


def snapshot_agreement(categories: pd.DataFrame, totals: pd.DataFrame) -> pd.DataFrame:
    """The categories (``read_categories``) beside a CUDA snapshot's totals
    (``snapshot_totals``), per rank: held_bytes (parameters + optimizer state: what lives between
    steps, after zero_grad freed the gradients -- when the snapshot is taken), allocated_bytes,
    other_live_bytes (allocated - held: buffers, the batch, caches), reserved_bytes, peak_bytes,
    peak_reserved_bytes and ``agrees``: held <= allocated <= peak and reserved <= peak reserved
    (when known). Ranks in both tables only."""
    wide = categories.pivot_table(index="rank", columns="category", values="bytes", aggfunc="max")
    res = categories[categories["category"] == "peak"].set_index("rank")["reserved_bytes"]
    out = totals.set_index("rank").join(wide, how="inner")
    held = out.get("parameters", 0) + out.get("optimizer_state", 0)
    df = pd.DataFrame({
        "held_bytes": held.astype("int64"), "allocated_bytes": out["allocated_bytes"],
        "other_live_bytes": (out["allocated_bytes"] - held).astype("int64"),
        "reserved_bytes": out["reserved_bytes"], "peak_bytes": out["peak"].astype("int64"),
        "peak_reserved_bytes": res.reindex(out.index).astype("Int64")})
    known = df["peak_reserved_bytes"].notna()
    df["agrees"] = ((df["held_bytes"] <= df["allocated_bytes"]) & (df["allocated_bytes"] <= df["peak_bytes"])
                    & (~known | (df["reserved_bytes"] <= df["peak_reserved_bytes"].fillna(0))))
    return df.rename_axis("rank").reset_index()
