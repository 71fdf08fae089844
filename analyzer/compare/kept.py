"""Read a run's kept tensors (baseline.safetensors, kept.parquet) without torch, and verify them.

Contract: analyzer/contract/schemas.py, "kept tensors". Tensors are read with safetensors' numpy API;
bfloat16, which numpy lacks, is widened exactly to float32 from its raw bytes (a bf16 value is the
upper 16 bits of the float32 with the same value). Every value is returned as float64.

Verification (``open_kept``): kept.parquet's sha256 must equal the manifest's entry; every tensor
of baseline.safetensors must hash to its kept.parquet row. Any mismatch is ``BadInput`` (reason
``file_changed``) naming the file and each changed tensor.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.contract import schemas
from analyzer.contract.errors import BadInput
from analyzer.analyses.memory import read_parquet

log = logging.getLogger(__name__)

_NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                 "I8": "i1", "U8": "u1", "BOOL": "?"}


@dataclass(kw_only=True, slots=True)
class KeptRun:
    """One run directory's manifest and kept tensors."""

    path: Path
    """The run directory."""
    manifest: schemas.Manifest
    """Its manifest.json."""
    kept: pd.DataFrame
    """kept.parquet (KEPT_SCHEMA columns; shape as a tuple), one row per kept tensor."""
    tensors: dict[str, np.ndarray] | None
    """Kept tensors as float64 arrays of their shape; None with ``--keep-tensors summaries``."""


def read_safetensors(path: Path) -> dict[str, tuple[str, list[int], bytes, np.ndarray]]:
    """``{name: (dtype code, shape, raw bytes, float64 values of that shape)}`` of a safetensors
    file. Raises ``BadInput`` (reason ``bad_run_file``) when it is not a readable safetensors file
    or holds a dtype other than floats, ints, bool and BF16."""
    from safetensors import SafetensorError, safe_open

    try:
        data = path.read_bytes()
        n = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + n])
        with safe_open(str(path), framework="numpy") as f:
            names = list(f.keys())
    except (OSError, ValueError, SafetensorError) as exc:
        raise BadInput(path, "bad_run_file", f"not a readable safetensors file ({exc})",
                       "re-record the run") from None
    except RecursionError:  # a header nested deeper than any safetensors writer makes
        raise BadInput(path, "bad_run_file", "not a readable safetensors file (its JSON "
                       "header is nested too deeply)", "re-record the run") from None
    body = memoryview(data)[8 + n:]
    out = {}
    for name in names:
        try:
            info = header[name]
            dtype, shape = info["dtype"], [int(d) for d in info["shape"]]
            start, end = (int(x) for x in info["data_offsets"])
            raw = bytes(body[start:end])
            if dtype == "BF16":
                values = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
            elif dtype in _NUMPY_DTYPES:
                values = np.frombuffer(raw, _NUMPY_DTYPES[dtype])
            else:
                raise BadInput(path, "bad_run_file", f"tensor {name} has unsupported dtype "
                               f"{str(dtype)[:40]}", "keep float tensors")
            out[name] = (dtype, shape, raw, values.astype(np.float64).reshape(shape))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(path, "bad_run_file", f"not a readable safetensors file (tensor "
                           f"{name[:80]}: {type(exc).__name__} {str(exc)[:80]})",
                           "re-record the run") from None
    return out


def open_kept(run_dir: Path | str) -> KeptRun:
    """Read and verify ``run_dir``'s kept tensors (module docstring).

    Raises ``BadInput``: no manifest or kept.parquet (reason ``no_kept``: recorded before tensors
    were kept), a file whose sha256 differs from the manifest or a tensor whose sha256 differs
    from kept.parquet (reason ``file_changed``: the first changed tensor in the message, every further
    one in ``problems``).
    """
    run_dir = Path(run_dir)
    mpath = run_dir / schemas.MANIFEST_NAME
    if not run_dir.exists():
        raise BadInput(run_dir, "missing", "no such file or folder", "check the path")
    if not mpath.is_file():
        raise BadInput(run_dir, "incomplete_run", "has no manifest.json (not a completed run directory)",
                       "pass a run directory written by tracer record")
    try:
        manifest = schemas.read_manifest(mpath)
    except schemas.SchemaError as exc:
        raise BadInput(mpath, "bad_run_file", str(exc).split(": ", 1)[-1]) from None
    kpath = run_dir / schemas.KEPT_NAME
    entry = manifest.file(schemas.KEPT_NAME)
    if entry is None or not kpath.is_file():
        raise BadInput(run_dir, "no_kept", f"keeps no {schemas.KEPT_NAME} (recorded before tensors "
                       "were kept)", "re-record the run with this version of tracer")
    if schemas.sha256_file(kpath) != entry.sha256:
        raise BadInput(kpath, "file_changed", "sha256 differs from the manifest (changed after the record)",
                       "re-record the run")
    kept = read_parquet(kpath, schemas.KEPT_SCHEMA)
    kept["shape"] = [tuple(int(d) for d in s) for s in kept["shape"]]
    tpath = run_dir / schemas.KEPT_TENSORS_NAME
    tentry = manifest.file(schemas.KEPT_TENSORS_NAME)
    if tentry is None:
        return KeptRun(path=run_dir, manifest=manifest, kept=kept, tensors=None)
    if not tpath.is_file():
        raise BadInput(tpath, "missing_file", "is listed in the manifest but missing", "re-record the run")
    read = read_safetensors(tpath)
    problems = _tensor_problems(tpath, read, kept)
    if problems:
        more = f" (and {len(problems) - 1} more, below)" if len(problems) > 1 else ""
        raise BadInput(tpath, "file_changed", problems[0].message + more, "re-record the run",
                       problems=problems[1:])  # errors.py: ``problems`` are the further ones
    if schemas.sha256_file(tpath) != tentry.sha256:  # header / metadata changed, tensors intact
        raise BadInput(tpath, "file_changed", "sha256 differs from the manifest although every tensor "
                       "matches kept.parquet (header or metadata changed)", "re-record the run")
    return KeptRun(path=run_dir, manifest=manifest, kept=kept,
                   tensors={k: v[3] for k, v in read.items()})


def _tensor_problems(tpath: Path, read: dict, kept: pd.DataFrame) -> list[BadInput]:
    """One ``BadInput`` per tensor that is missing, extra or whose bytes changed."""
    problems = []
    expected = dict(zip(kept["tensor"], kept["sha256"]))
    for name in sorted(set(expected) | set(read)):
        if name not in read:
            why = f"tensor {name} listed in kept.parquet is missing"
        elif name not in expected:
            why = f"tensor {name} is not listed in kept.parquet"
        elif schemas.kept_row(name, read[name][0], read[name][1], read[name][2], read[name][3])["sha256"] != expected[name]:
            why = f"tensor {name} changed after the record (sha256 differs from kept.parquet)"
        else:
            continue
        problems.append(BadInput(tpath, "file_changed", why, "re-record the run"))
    return problems
