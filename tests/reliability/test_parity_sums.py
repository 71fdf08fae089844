"""The gate refuses numerics no record can hold and does not pass a tensor nobody checked
(issue 33 item 19, first half).

Oracles: a real record (``ddp_run``, copied) whose numerics.parquet the test edits, manifest
refreshed as an attacker would; the baseline's own tensor list (kept.parquet) for what must be
there; float64 sums of squares, which hold their largest term (max_abs^2 <= sum)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from analyzer.contract import schemas
from tests.inputs import bad_input, cli, copy_run
from tests.remanifest import refresh_manifest

TENSOR = "layers.0.mlp.0.weight"


def _rewrite(run, fn):
    path = run / schemas.NUMERICS_NAME
    df = pq.read_table(path).to_pandas()
    df = fn(df)
    pq.write_table(pa.Table.from_pandas(df, schema=schemas.NUMERICS_SCHEMA, preserve_index=False),
                   path)
    refresh_manifest(run)


def _at(df, metric, kind="grad", rank=None):
    sel = (df["kind"] == kind) & (df["tensor"] == TENSOR) & (df["metric"] == metric)
    return sel if rank is None else sel & (df["rank"] == rank)


def test_a_tensor_removed_from_every_rank_is_not_verified(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")
    assert cli("gate", str(run)).returncode == 0
    _rewrite(run, lambda df: df[~((df["kind"] == "grad") & (df["tensor"] == TENSOR))])
    proc = cli("gate", str(run))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "not verified" in proc.stdout and f"grad {TENSOR}" in proc.stdout, proc.stdout


def test_a_negative_sum_of_squares_is_refused(tmp_path, ddp_run):
    run = copy_run(ddp_run, tmp_path / "ddp")

    def edit(df):
        df.loc[_at(df, "sq_sum", rank=0), "value"] = -1.0
        return df

    _rewrite(run, edit)
    bad_input(cli("gate", str(run)), "numerics.parquet", f"grad {TENSOR} on rank 0",
              "a sum of squares is negative", "re-record")


def test_a_maximum_the_sums_cannot_hold_is_refused(tmp_path, ddp_run):
    # a max_abs_ref inflated past sqrt(ref_sq_sum) widens the limit: a wrong gradient would pass
    run = copy_run(ddp_run, tmp_path / "ddp")

    def edit(df):
        df.loc[_at(df, "max_abs_diff"), "value"] = 1.0
        df.loc[_at(df, "max_abs_ref"), "value"] = 1e9
        return df

    _rewrite(run, edit)
    bad_input(cli("gate", str(run)), "numerics.parquet", f"grad {TENSOR}",
              "above sqrt(", "re-record")


def test_real_records_hold_possible_sums(ddp_run, fsdp_run):
    for run in (ddp_run, fsdp_run):
        proc = cli("gate", str(run))
        assert proc.returncode == 0, proc.stdout + proc.stderr
