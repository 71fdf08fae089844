"""Hand-built run-directory pieces with exact answers, shared by the report tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analyzer import schemas


def tensor_rows(*, rank, kind, tensor, seq, step=0, numel=4.0, sq_sum=1.0, ref_sq_sum=1.0,
                diff_sq_sum=0.0, max_abs_diff=0.0, max_abs_ref=1.0, nonfinite=0.0,
                replicated=1.0):
    """The eight metric rows of one tensor on one rank."""
    vals = dict(numel=numel, sq_sum=sq_sum, ref_sq_sum=ref_sq_sum, diff_sq_sum=diff_sq_sum,
                max_abs_diff=max_abs_diff, max_abs_ref=max_abs_ref, nonfinite=nonfinite,
                replicated=replicated)
    return [dict(rank=rank, step=step, kind=kind, tensor=tensor, seq=seq, metric=m, value=v)
            for m, v in vals.items()]


def loss_rows(*, rank, step, value, ref):
    return [dict(rank=rank, step=step, kind="loss", tensor="loss", seq=0, metric="value", value=value),
            dict(rank=rank, step=step, kind="loss", tensor="loss", seq=0, metric="ref_value", value=ref)]


def write_numerics(path: Path, rows: list[dict]) -> None:
    cols = {n: [r[n] for r in rows] for n in schemas.NUMERICS_SCHEMA.names}
    table = pa.Table.from_pydict(
        {"rank": pa.array(cols["rank"], pa.int32()), "step": pa.array(cols["step"], pa.int32()),
         "kind": pa.array(cols["kind"]).dictionary_encode(),
         "tensor": pa.array(cols["tensor"]).dictionary_encode(),
         "seq": pa.array(cols["seq"], pa.int32()),
         "metric": pa.array(cols["metric"]).dictionary_encode(),
         "value": pa.array(cols["value"], pa.float64())}).cast(schemas.NUMERICS_SCHEMA)
    pq.write_table(table, path)


def write_steps(path: Path, rows: list[dict]) -> None:
    data = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schemas.STEPS_SCHEMA}
    pq.write_table(pa.Table.from_pydict(data, schema=schemas.STEPS_SCHEMA), path)


def write_memory(path: Path, rows: list[dict]) -> None:
    data = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schemas.MEMORY_SCHEMA}
    pq.write_table(pa.Table.from_pydict(data, schema=schemas.MEMORY_SCHEMA), path)


def manifest(*, run_name, strategy, world_size=2, precision="fp32", fault=None, options=None,
             device="cpu", torch_version="2.13.0", global_batch=8, seed=0, method="spawn"):
    return {
        "schema_version": schemas.SCHEMA_VERSION, "run_id": f"id-{run_name}", "run_name": run_name,
        "created_utc": "2026-01-01T00:00:00Z", "strategy": strategy,
        "strategy_options": options or {}, "fault": fault, "precision": precision,
        "world_size": 1 if strategy == "single" else world_size,
        "backend": None if strategy == "single" else ("gloo" if device == "cpu" else "nccl"),
        "device": {"type": device, "name": device.upper(), "count": 1},
        "launch": {"method": "single" if strategy == "single" else method, "nnodes": 1,
                   "master_addr": None, "master_port": None},
        "versions": {"python": "3.11.7", "torch": torch_version, "cuda": None, "cudnn": None,
                     "nccl": None, "paritytrace": "0.1.0"},
        "model": {"name": "SimpleTransformer", "hidden": 16, "layers": 2, "num_params": 100},
        "batch": {"global_batch": global_batch, "seq_len": 4,
                  "per_rank_batch": global_batch if strategy == "single" else global_batch // world_size,
                  "hidden": 16},
        "seed": seed, "steps": 3,
        "profiler": {"wait": 0, "warmup": 1, "active": 2, "activities": ["cpu"],
                     "record_shapes": False, "profile_memory": True},
        "tolerance": {**schemas.TOLERANCES[precision], "source": schemas.TOLERANCE_SOURCE},
        "baseline": {"kind": "in-process", "description": "hand-built"},
        "files": [],
    }


def write_manifest(run_dir: Path, data: dict) -> None:
    (run_dir / schemas.MANIFEST_NAME).write_text(json.dumps(data, indent=1), encoding="utf-8")


FP32 = schemas.TOLERANCES["fp32"]


def limit(max_abs_ref: float) -> float:
    """atol + rtol * max_abs_ref for fp32 (the oracle, written out independently)."""
    return 1e-5 + 1.3e-6 * max_abs_ref


__all__ = ["tensor_rows", "loss_rows", "write_numerics", "write_steps", "write_memory",
           "manifest", "write_manifest", "limit", "math"]


def event(name, ts, end, *, role="compute", cat="cpu_op", tid="1", is_gpu=False, stream=-1,
          correlation=-1, coll_kind=None, step=0, bytes_=-1):
    """One row of the api event table (analyzer/api.py columns), times in ns."""
    return dict(name=name, cat=cat, pid="1", tid=tid, ts_ns=ts, dur_ns=end - ts, end_ns=end,
                is_gpu=is_gpu, stream=stream, correlation=correlation, external_id=-1, step=step,
                role=role, coll_kind=coll_kind, bytes=bytes_, pg=None, rule="hand-built")


def events(rows):
    import pandas as pd

    df = pd.DataFrame(rows)
    for c in ("ts_ns", "dur_ns", "end_ns", "stream", "correlation", "external_id", "step", "bytes"):
        df[c] = df[c].astype("int64")
    return df
