"""``tracer record --golden PATH``: check and load an earlier run's kept tensors (issue 9).

The golden run's batch and initial state replace the seeded ones (tracer/baseline.py), so the new
record differs from the golden one only in what changed since (torch, device, precision policy,
sharding, world size). The new baseline and the new distributed run are compared with the golden
tensors (golden.parquet and the ``golden_*`` numerics metrics, analyzer/contract/schemas.py).
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from analyzer.contract.schemas import (KEPT_NAME, KEPT_TENSORS_NAME, MANIFEST_NAME, FileEntry, Golden, Manifest,
                                       SchemaError, read_manifest)
from tracer.config import RecordConfig
from tracer.rundir import sha256_file


def _golden_manifest(path: Path) -> Manifest:
    if not path.exists():
        raise ValueError(f"--golden {path}: no such run directory; pass a run directory written by "
                         "tracer record")
    if not path.is_dir():
        raise ValueError(f"--golden {path}: is a file, not a run directory; pass the folder that "
                         f"holds its {MANIFEST_NAME}")
    if not (path / MANIFEST_NAME).is_file():
        raise ValueError(f"--golden {path}: no {MANIFEST_NAME} (not a completed run directory); "
                         "pass a run directory written by tracer record")
    try:
        return read_manifest(path / MANIFEST_NAME)
    except SchemaError as exc:
        raise ValueError(f"--golden {exc}") from None
    except OSError as exc:
        raise ValueError(f"--golden {path / MANIFEST_NAME}: cannot be read ({exc.strerror or exc}); "
                         "check its permissions") from None


def _check_readable(path: Path) -> None:
    """Refuse a golden run whose kept files do not open: baseline.safetensors' header (read,
    not the tensors: cheap) must parse and name the batch and initial state; kept.parquet
    must be Parquet. A corrupt file whose manifest entry was rewritten to match, or a copy
    cut short before its manifest was made, ends here with one line, not in a rank."""
    from safetensors import safe_open

    file = path / KEPT_TENSORS_NAME
    try:
        with safe_open(str(file), framework="pt") as f:
            names = set(f.keys())
    except Exception as exc:  # SafetensorError (truncated, not safetensors), OSError
        raise _unreadable(file, "safetensors", exc) from None
    lacking = [n for n in ("batch.x", "batch.y") if n not in names]
    if lacking or not any(n.startswith("init.") for n in names):
        raise ValueError(f"--golden {file}: lacks {', '.join(lacking) or 'init.*'} (not a tracer "
                         "baseline); re-record the golden run")
    kept = path / KEPT_NAME
    try:
        pq.ParquetFile(kept).close()
    except Exception as exc:  # ArrowInvalid (not Parquet), OSError
        raise _unreadable(kept, "Parquet", exc) from None


def _unreadable(file: Path, kind: str, exc: Exception) -> ValueError:
    lines = str(exc).strip().splitlines()
    return ValueError(f"--golden {file}: not a readable {kind} file ({lines[0] if lines else type(exc).__name__}); "
                      "re-record the golden run")


def _kept_entry(path: Path, manifest: Manifest) -> FileEntry:
    entry = manifest.file(KEPT_TENSORS_NAME)
    if entry is None or not (path / KEPT_TENSORS_NAME).is_file():
        raise ValueError(f"--golden {path}: keeps no {KEPT_TENSORS_NAME} (recorded with "
                         "--keep-tensors summaries, or before tensors were kept); record the golden "
                         "run with --keep-tensors full")
    return entry


def check_golden(cfg: RecordConfig) -> Manifest:
    """Refuse (``ValueError``, one line naming PATH and what differs) unless ``cfg.golden`` is a
    completed run directory with kept tensors of this config's model (--model; for the reference
    model hidden, layers, sequence length), global batch and seed, which is not the run directory this record
    would clear. Returns the golden manifest."""
    path = Path(cfg.golden)
    if path.resolve() == cfg.run_dir.resolve():
        raise ValueError(f"--golden {path}: is the run directory this record writes; pick another "
                         "--out or --name")
    m = _golden_manifest(path)
    _kept_entry(path, m)
    _check_readable(path)
    theirs = {"model": m.model.spec, "hidden": m.model.hidden, "layers": m.model.layers,
              "batch": m.batch.global_batch, "seq": m.batch.seq_len, "seed": m.seed}
    ours = {"model": cfg.model, "hidden": cfg.hidden, "layers": cfg.layers, "batch": cfg.batch,
            "seq": cfg.seq, "seed": cfg.seed}
    if cfg.model != "reference":  # hidden / layers / seq are the reference model's options
        for k in ("hidden", "layers", "seq"):
            theirs.pop(k), ours.pop(k)
    differ = [k for k in ours if ours[k] != theirs[k]]
    if differ:
        raise ValueError(f"--golden {path}: recorded with "
                         + ", ".join(f"--{k} {theirs[k]}" for k in differ) + "; this record has "
                         + ", ".join(f"--{k} {ours[k]}" for k in differ)
                         + "; record with the golden run's model and batch shape")
    return m


def load_golden(path: str | Path) -> dict:
    """The golden run's kept tensors (CPU). Raises ``ValueError`` naming the file when its
    sha256 no longer matches the golden manifest (changed since it was recorded)."""
    from safetensors.torch import load_file

    path = Path(path)
    m = _golden_manifest(path)
    entry = _kept_entry(path, m)
    file = path / KEPT_TENSORS_NAME
    if sha256_file(file) != entry.sha256:
        raise ValueError(f"--golden {file}: sha256 differs from its manifest (changed after the "
                         "record); re-record the golden run")
    try:
        return load_file(str(file))
    except Exception as exc:  # corrupt although its manifest matches (rewritten with it)
        raise _unreadable(file, "safetensors", exc) from None


def golden_section(cfg: RecordConfig, run_dir: Path) -> Golden | None:
    """The manifest's ``golden`` section (analyzer/contract/schemas.py), or None without ``--golden``.

    ``batch_sha256_equal`` / ``init_sha256_equal``: every batch.* / init.* tensor's sha256 in this
    run's kept.parquet equals the golden run's (and both hold the same names)."""
    if cfg.golden is None:
        return None
    path = Path(cfg.golden)
    m = _golden_manifest(path)

    def shas(folder: Path, group: str) -> dict[str, str]:
        t = pq.read_table(folder / KEPT_NAME, columns=["group", "tensor", "sha256"]).to_pylist()
        return {r["tensor"]: r["sha256"] for r in t if r["group"] == group}

    return Golden(path=str(path.resolve()), run_id=m.run_id, run_name=m.run_name, strategy=m.strategy,
                  precision=m.precision, versions=m.versions, device=m.device,
                  kept_sha256=_kept_entry(path, m).sha256,
                  batch_sha256_equal=shas(run_dir, "batch") == shas(path, "batch"),
                  init_sha256_equal=shas(run_dir, "init") == shas(path, "init"))
