"""Dependency floors stay above the versions known advisories name, and the one pickle the
tracer writes (the CUDA memory snapshot, for memory_viz) uses an explicit protocol.

Advisories checked (2026-12-01): pyarrow CVE-2023-47248 (< 14.0.1 unpickles Parquet extension
metadata), setuptools CVE-2025-47273 (< 78.1.1, PackageIndex path traversal), torch
CVE-2025-32434 (< 2.6.0, torch.load weights_only bypass; paritytrace never calls torch.load,
and the floor is 2.6 anyway). numpy >= 1.24, pandas >= 2.0, msgspec, rich, typer, safetensors
>= 0.4: no advisory affects the floors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
FIXED = {"pyarrow": "14.0.1", "setuptools": "78.1.1", "torch": "2.6.0"}


def _requirements() -> dict[str, Requirement]:
    tomllib = pytest.importorskip("tomllib")
    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = list(doc["build-system"]["requires"]) + list(doc["project"]["dependencies"])
    for extra in doc["project"]["optional-dependencies"].values():
        reqs += extra
    return {Requirement(r).name.lower(): Requirement(r) for r in reqs}


@pytest.mark.parametrize("name", sorted(FIXED))
def test_dependency_floor_excludes_versions_with_known_advisories(name):
    req = _requirements()[name]
    floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==")]
    assert floors, f"{name} has no floor"
    assert min(floors) >= Version(FIXED[name]), f"{name}: {req} admits < {FIXED[name]}"


def test_memory_snapshot_pickle_protocol_is_explicit(tmp_path, monkeypatch):
    """dump_snapshot writes protocol 4 (readable by every Python torch supports), also where
    the interpreter's default is 5 (Python 3.14): ``pickle`` is replaced in the module by one
    whose default is 5; torch.cuda is replaced by a stub (no GPU in CI)."""
    import types

    torch = pytest.importorskip("torch")
    from tracer import memory

    def dumps_py314(obj, protocol=None):
        return pickle.dumps(obj, protocol=5 if protocol is None else protocol)

    snap = {"segments": [], "device_traces": [[]]}
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda: snap)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **k: None)
    monkeypatch.setattr(memory, "pickle", types.SimpleNamespace(dumps=dumps_py314))
    monkeypatch.setattr(memory, "snapshot_to_table", lambda s, r: None)
    out = tmp_path / "rank0.snapshot.pickle"
    memory.dump_snapshot("cuda", out, 0)
    raw = out.read_bytes()
    assert raw[:2] == b"\x80\x04"  # PROTO opcode, protocol 4
    assert pickle.loads(raw) == snap  # the file the tracer itself just wrote
