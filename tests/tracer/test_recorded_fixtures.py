"""fixtures/recorded holds what today's tracer writes: the fast layer reads those run directories
instead of recording, so each is recorded anew here and compared with the committed one.

What must be equal: the run directories and their files; the manifest's fields and every value
that does not change between two records of one configuration (ids, times, ports, file sizes and
digests, versions and the machine aside); the Parquet tables' schemas and row keys; the traces'
top-level fields, ``distributedInfo``, event categories and profiled steps. When the tracer's
output changes on purpose, regenerate: ``python3 -m tests.records fixtures/recorded``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.records import COMMITTED, committed, recorded

pytestmark = pytest.mark.record

VOLATILE = {"run_id", "created_utc", "launch", "versions", "device", "files", "machine"}
"""Manifest fields that differ between two records of one configuration (and ``experiment.id``)."""
KEYS = {"numerics.parquet": ["rank", "step", "tensor", "kind", "metric"],
        "steps.parquet": ["rank", "step"]}
STALE = "fixtures/recorded is stale: regenerate it with python3 -m tests.records fixtures/recorded"


def _shape(value):
    """The key structure of a JSON value (dict keys nested; lists by their first item)."""
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shape(value[0])] if value else []
    return type(value).__name__ if value is not None else None


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _steady(manifest: dict) -> dict:
    out = {k: v for k, v in manifest.items() if k not in VOLATILE}
    out["experiment"] = {k: v for k, v in (out.get("experiment") or {}).items() if k != "id"}
    return out


def _trace(path: Path) -> dict:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc.pop("traceEvents")
    return {"fields": sorted(doc), "distributedInfo": doc.get("distributedInfo"),
            "categories": sorted({e.get("cat", "") for e in events}),
            "steps": sorted(e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#"))}


def _runs(root: Path) -> dict[str, list[str]]:
    return {r.name: sorted(f.relative_to(r).as_posix() for f in r.rglob("*") if f.is_file())
            for r in sorted(root.iterdir()) if r.is_dir()}


@pytest.mark.parametrize("name", COMMITTED)
def test_committed_run_directories_are_what_the_tracer_records_today(name, tmp_path_factory):
    fresh, kept = recorded(name, tmp_path_factory), committed(name)
    assert _runs(fresh) == _runs(kept), STALE
    for run, files in _runs(kept).items():
        new, old = _manifest(fresh / run), _manifest(kept / run)
        assert _shape(new) == _shape(old), f"{run}/manifest.json fields: {STALE}"
        assert _steady(new) == _steady(old), f"{run}/manifest.json values: {STALE}"
        for f in files:
            if f.endswith(".parquet"):
                a, b = pq.read_table(fresh / run / f), pq.read_table(kept / run / f)
                assert a.schema == b.schema, f"{run}/{f} schema: {STALE}"
                cols = [c for c in KEYS.get(f, []) if c in a.column_names]
                if cols:
                    assert a.select(cols).to_pylist() == b.select(cols).to_pylist(), \
                        f"{run}/{f} rows: {STALE}"
            elif f.endswith(".trace.json.gz"):
                assert _trace(fresh / run / f) == _trace(kept / run / f), f"{run}/{f}: {STALE}"
