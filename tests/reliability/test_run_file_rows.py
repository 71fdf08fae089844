"""Run-directory Parquet files are bounded before they are read (issue 33 item 9) and typed by
the contract, not by their own pandas metadata (item 14).

Oracles: a real record (``ddp_run``, copied) whose numerics.parquet the test replaces with a
small file of more rows than its manifest allows (world_size x tensors x metrics, the bound
``schemas.max_run_file_rows`` computes from the manifest's own numbers), its manifest entry
refreshed as an attacker would; ``gate`` runs in a fresh interpreter under a 1 GiB address
space limit, so reading the rows could not pass unnoticed."""

from __future__ import annotations

import pytest

import json
import resource
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.contract import schemas
from tests.inputs import bad_input, cli, copy_run
from tests.remanifest import refresh_manifest


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _many_rows(path, groups: int, per_group: int) -> None:
    """numerics.parquet of groups x per_group identical loss rows, one row group at a time."""
    n = per_group
    kind = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["loss"]))
    tensor = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["loss"]))
    metric = pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["value"]))
    zeros = pa.array([0] * n, pa.int32())
    table = pa.Table.from_arrays([zeros, zeros, kind, tensor, zeros, metric,
                                  pa.array([1.0] * n, pa.float64())],
                                 schema=schemas.NUMERICS_SCHEMA)
    with pq.ParquetWriter(path, schemas.NUMERICS_SCHEMA, compression="zstd") as w:
        for _ in range(groups):
            w.write_table(table)


@pytest.mark.integration
def test_numerics_with_more_rows_than_the_manifest_allows_is_refused_unread(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    manifest = schemas.read_manifest(run / schemas.MANIFEST_NAME)
    most = schemas.max_run_file_rows(manifest, schemas.NUMERICS_NAME)
    groups, per = 16, 2_000_000
    assert groups * per > most  # 32M rows; the tiny model allows ~21M
    path = run / schemas.NUMERICS_NAME
    path.unlink()
    _many_rows(path, groups, per)
    assert path.stat().st_size < 8 << 20  # a few MB on disk
    refresh_manifest(run)
    proc = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(run)],
                          capture_output=True, text=True, preexec_fn=_capped)
    bad_input(proc, "numerics.parquet", f"{groups * per:,} rows", "its manifest allows",
              "re-record")


RECORDED = Path(__file__).parents[2] / "fixtures" / "recorded"


@pytest.mark.parametrize("manifest_path", sorted(RECORDED.glob("*/*/manifest.json")),
                         ids=lambda p: f"{p.parent.parent.name}/{p.parent.name}")
def test_the_bound_admits_every_committed_record(manifest_path):
    run = manifest_path.parent
    manifest = schemas.read_manifest(manifest_path)
    for name in (schemas.NUMERICS_NAME, schemas.STEPS_NAME, schemas.KEPT_NAME,
                 schemas.GOLDEN_NAME, schemas.MEMORY_CATEGORIES_NAME):
        if (run / name).is_file():
            rows = pq.ParquetFile(run / name).metadata.num_rows
            assert 0 < rows <= schemas.max_run_file_rows(manifest, name), name


def test_the_bound_is_a_bound_on_memory_for_the_tiny_record(ddp_run):
    """The bound let a numerics.parquet of 22.8M rows (3.7 MB) through for this record, which
    writes 748: gate ran 375 s to 5.15 GB. It now counts what the tracer writes -- grad and
    param rows per parameter, activations per module, the golden metrics only with --golden,
    two loss rows a step, no doubling -- so the rows it admits fit in well under 1 GiB."""
    from analyzer.analyses.memory import ROW_BYTES

    manifest = schemas.read_manifest(ddp_run / schemas.MANIFEST_NAME)
    most = schemas.max_run_file_rows(manifest, schemas.NUMERICS_NAME)
    assert most < 22_837_440 // 10
    assert most * ROW_BYTES < 1 << 30
    assert schemas.max_run_file_rows(manifest, schemas.STEPS_NAME) == 2 * 4  # world x steps+1


@pytest.mark.integration
def test_numerics_of_the_probes_rows_is_refused_unread(tmp_path, ddp_run):
    """The probe's case at a tenth of its rows (2.3M identical rows, a few MB; the old bound
    admitted 22.8M for this record, which writes 748): refused in one line, unread."""
    run = copy_run(ddp_run, tmp_path / "ddp")
    groups, per = 4, 22_837_440 // 40
    path = run / schemas.NUMERICS_NAME
    path.unlink()
    _many_rows(path, groups, per)
    refresh_manifest(run)
    proc = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(run)],
                          capture_output=True, text=True, preexec_fn=_capped)
    bad_input(proc, "numerics.parquet", f"{groups * per:,} rows", "its manifest allows",
              "re-record")


def test_crafted_pandas_metadata_in_a_run_file_is_ignored(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    assert cli("gate", str(run)).returncode == 0
    for name in (schemas.NUMERICS_NAME, schemas.STEPS_NAME):
        table = pq.read_table(run / name)
        meta = dict(table.schema.metadata or {})
        meta[b"pandas"] = json.dumps({"index_columns": [{"kind": "range", "start": 0,
                                                         "stop": 10**15, "step": 1}],
                                      "columns": 7, "column_indexes": "x"}).encode()
        pq.write_table(table.replace_schema_metadata(meta), run / name)
    refresh_manifest(run)
    proc = cli("gate", str(run))
    assert proc.returncode == 0, proc.stderr
