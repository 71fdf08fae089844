"""Memory and step-time summaries from ``steps.parquet`` and ``memory/memory.parquet``.

Per run and rank: CPU peak RSS (ru_maxrss high-water mark) and profiler-allocated peak; CUDA
peak allocated / reserved; and, when the CUDA allocator snapshot was converted, the largest live
allocations and bytes by category. Step time of a distributed step = the slowest rank's
``wall_ns`` (every rank waits for it at the next collective).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput

PEAK_COLUMNS = ("peak_rss_bytes", "profiler_allocated_peak_bytes", "cuda_max_allocated_bytes",
                "cuda_max_reserved_bytes")


def read_parquet(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """The columns of ``schema`` from a run directory's Parquet file ``path``. Raises
    ``BadInput`` (reason ``bad_run_file``) naming the file when it is unreadable, written by a
    newer schema or lacks a column."""
    try:
        schemas.check_parquet_version(path, schema)
        table = pq.read_table(path)
    except schemas.SchemaError as exc:
        raise BadInput(path, "bad_run_file", str(exc).split(": ", 1)[-1]) from None
    except (OSError, pa.ArrowInvalid) as exc:
        raise BadInput(path, "bad_run_file", f"not a readable Parquet file ({exc})",
                       "re-record the run") from None
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise BadInput(path, "bad_run_file", f"lacks column(s) {', '.join(missing)}",
                       "re-record the run with this version of tracer")
    return table.select(schema.names).to_pandas()


def read_steps(path: Path | str) -> pd.DataFrame:
    """Read ``steps.parquet``: columns of ``schemas.STEPS_SCHEMA``; byte columns as nullable
    ``Int64``. Raises ``BadInput`` naming the file when unreadable or incomplete."""
    df = read_parquet(Path(path), schemas.STEPS_SCHEMA)
    for c in ("rank", "step", "wall_ns"):
        df[c] = df[c].astype("int64")
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
