"""Hand-built run directories with kept tensors (no torch): exact answers for analyzer drift.

A run dir here is what the contract (analyzer/contract/schemas.py, "kept tensors") asks for: kept tensors
in baseline.safetensors (written with safetensors' numpy API, BF16 by hand), kept.parquet rows
computed here with hashlib / numpy (not with the code under test), and a manifest listing both
files with their sha256.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.contract import schemas


def manifest(name: str, *, precision: str = "fp32", torch_version: str = "2.13.0",
             strategy: str = "single", world_size: int = 1) -> dict:
    """Every required Manifest field, with the settings drift looks at."""
    return {
        "schema_version": schemas.SCHEMA_VERSION, "run_id": f"id-{name}", "run_name": name,
        "created_utc": "2025-01-01T00:00:00+00:00", "strategy": strategy, "strategy_options": {},
        "fault": None, "precision": precision, "world_size": world_size, "backend": None,
        "device": {"type": "cpu", "name": "test cpu", "count": 2},
        "launch": {"method": "single", "nnodes": 1, "master_addr": None, "master_port": None},
        "versions": {"python": "3.11", "torch": torch_version, "cuda": None, "cudnn": None,
                     "nccl": None, "paritytrace": "0.1.0"},
        "model": {"name": "SimpleTransformer", "hidden": 2, "layers": 1, "num_params": 4},
        "batch": {"global_batch": 1, "seq_len": 1, "per_rank_batch": 1, "hidden": 2},
        "seed": 0, "steps": 2, "profiler": {}, "baseline": {}, "files": [],
        "tolerance": {"rtol": 1.3e-6, "atol": 1e-5, "source": "torch.testing.assert_close defaults"},
    }


def bf16_bytes(values: np.ndarray) -> bytes:
    """bfloat16 bytes of float32 values that bf16 holds exactly (upper 16 bits of the float32)."""
    bits = np.asarray(values, np.float32).view(np.uint32)
    assert (bits & 0xFFFF == 0).all(), "value not exactly representable in bf16"
    return (bits >> 16).astype("<u2").tobytes()


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], bytes]]) -> None:
    """A safetensors file written from the format description (8-byte header length, JSON
    header with dtype / shape / data_offsets, data block), so BF16 needs no torch."""
    header, blob, off = {}, b"", 0
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        blob += raw
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + blob)


def kept_rows(tensors: dict[str, tuple[str, list[int], bytes]], values: dict[str, np.ndarray]) -> list[dict]:
    rows = []
    for name in sorted(tensors):
        dtype, shape, raw = tensors[name]
        v = np.asarray(values[name], np.float64).reshape(-1)
        rows.append({"group": name.split(".")[0], "tensor": name, "dtype": dtype, "shape": shape,
                     "numel": v.size, "sha256": hashlib.sha256(raw).hexdigest(),
                     "sum": float(v.sum()), "sq_sum": float((v * v).sum()), "min": float(v.min()),
                     "max": float(v.max()), "max_abs": float(np.abs(v).max()), "nonfinite": 0})
    return rows


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_dir(root: Path, name: str, values: dict[str, np.ndarray], *, bf16: tuple[str, ...] = (),
            keep: str = "full", **manifest_kw) -> Path:
    """A run directory keeping ``values`` (name -> float array; names in ``bf16`` stored as BF16,
    the rest F32)."""
    d = root / name
    d.mkdir(parents=True)
    tensors = {}
    for k, v in values.items():
        v = np.asarray(v, np.float32)
        raw = bf16_bytes(v) if k in bf16 else v.astype("<f4").tobytes()
        tensors[k] = ("BF16" if k in bf16 else "F32", list(v.shape), raw)
    rows = kept_rows(tensors, values)
    pq.write_table(pa.Table.from_pylist(rows, schema=schemas.KEPT_SCHEMA), d / schemas.KEPT_NAME)
    files = [{"path": schemas.KEPT_NAME, "size_bytes": 0, "sha256": sha(d / schemas.KEPT_NAME)}]
    if keep == "full":
        write_safetensors(d / schemas.KEPT_TENSORS_NAME, tensors)
        files.append({"path": schemas.KEPT_TENSORS_NAME, "size_bytes": 0,
                      "sha256": sha(d / schemas.KEPT_TENSORS_NAME)})
    m = manifest(name, **manifest_kw)
    m["files"] = files
    (d / schemas.MANIFEST_NAME).write_text(json.dumps(m))
    return d
