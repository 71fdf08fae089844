"""The parity gate on hand-built numerics with exact answers (oracle: the rule written out), and
on a real record whose numerics hold a NaN or an inf (the tensor is named)."""

from __future__ import annotations

import math

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analyzer.analyses import parity
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import ToleranceOverride
from tests.inputs import cli, copy_run
from tests.remanifest import refresh_manifest
from tests.reports.builders import limit, loss_rows, manifest, tensor_rows, typed, write_numerics

FP32 = parity.tolerance_for("fp32")


def frame(rows):
    return pd.DataFrame(rows)


def clean_loss(steps=(0,), ranks=(0, 1)):
    return [r for s in steps for k in ranks for r in loss_rows(rank=k, step=s, value=2.0, ref=2.0)]


def test_tolerances_come_from_torch_testing_defaults():
    assert (FP32.rtol, FP32.atol) == (1.3e-6, 1e-5)
    bf16 = parity.tolerance_for("bf16")
    assert (bf16.rtol, bf16.atol) == (1.6e-2, 1e-5)
    assert "torch.testing" in FP32.source
    over = parity.tolerance_for("fp32", rtol=1e-3)
    assert (over.rtol, over.atol) == (1e-3, 1e-5) and "rtol set by the user" in over.source
    with pytest.raises(ValueError, match="atol"):
        parity.tolerance_for("fp32", atol=-1.0)
    with pytest.raises(ValueError, match="fp16"):
        parity.tolerance_for("fp16")


@pytest.mark.parametrize("diff,ok", [(1.25e-5, True), (1.27e-5, False)])
def test_tensor_just_inside_and_just_outside(diff, ok):
    # max_abs_ref 2.0 -> limit = 1e-5 + 1.3e-6 * 2 = 1.26e-5
    rows = [*tensor_rows(rank=0, kind="grad", tensor="w", seq=0, max_abs_diff=diff, max_abs_ref=2.0,
                         diff_sq_sum=diff**2, ref_sq_sum=4.0)] + clean_loss(ranks=(0,))
    res = parity.evaluate(frame(rows), FP32)
    assert res.status == ("pass" if ok else "fail")
    t = parity.check_tensors(frame(rows), FP32).iloc[0]
    assert t["limit"] == pytest.approx(1.26e-5, rel=1e-12)
    assert t["rel_l2"] == pytest.approx(diff / 2.0, rel=1e-12)
    if not ok:
        fd = res.first_divergence
        assert (fd.tensor, fd.kind, fd.subject) == ("w", "grad", "grad w")
        assert fd.max_abs_diff == diff and fd.limit == pytest.approx(limit(2.0))
        assert "w" in res.reason and "1.27e-05" in res.reason


def test_nan_fails_and_is_named_even_when_the_count_says_zero():
    rows = (tensor_rows(rank=0, kind="grad", tensor="a", seq=0)
            + tensor_rows(rank=0, kind="grad", tensor="b", seq=1, nonfinite=3.0, max_abs_diff=0.0)
            + clean_loss(ranks=(0,)))
    res = parity.evaluate(frame(rows), FP32)
    assert res.status == "fail" and res.first_divergence.tensor == "b"
    assert "NaN/inf" in res.reason
    # A NaN error metric with nonfinite == 0: never trust the count.
    rows = (tensor_rows(rank=0, kind="grad", tensor="c", seq=0, max_abs_diff=math.nan)
            + clean_loss(ranks=(0,)))
    res = parity.evaluate(frame(rows), FP32)
    assert res.status == "fail" and res.first_divergence.tensor == "c"


def test_nan_loss_fails():
    rows = tensor_rows(rank=0, kind="grad", tensor="a", seq=0) + loss_rows(
        rank=0, step=0, value=2.0, ref=2.0) + loss_rows(rank=0, step=1, value=math.nan, ref=1.0)
    res = parity.evaluate(frame(rows), FP32)
    assert res.status == "fail"
    assert res.first_divergence.kind == "loss" and res.first_divergence.step == 1
    assert res.first_divergence.subject == "the loss"


def _two_rank(replicated):
    # rank 0: big values, diff 1e-4 within its own limit 1e-5 + 1.3e-4;
    # rank 1: small values, diff 5e-5 over its own limit 1e-5 + 1.3e-7.
    return (tensor_rows(rank=0, kind="grad", tensor="w", seq=0, max_abs_diff=1e-4, max_abs_ref=100.0,
                        diff_sq_sum=9e-8, ref_sq_sum=16.0, replicated=replicated)
            + tensor_rows(rank=1, kind="grad", tensor="w", seq=0, max_abs_diff=5e-5, max_abs_ref=0.1,
                          diff_sq_sum=16e-8, ref_sq_sum=9.0, replicated=replicated)
            + clean_loss())


def test_sharded_reduction_sums_sums_and_maxes_maxima():
    res = parity.evaluate(frame(_two_rank(0.0)), FP32)
    t = parity.check_tensors(frame(_two_rank(0.0)), FP32).iloc[0]
    assert t["reduction"] == "sharded" and t["worst_rank"] == -1
    assert t["diff_sq_sum"] == pytest.approx(25e-8) and t["ref_sq_sum"] == pytest.approx(25.0)
    assert t["rel_l2"] == pytest.approx(math.sqrt(25e-8) / 5.0)  # 1e-4
    assert t["max_abs_diff"] == 1e-4 and t["max_abs_ref"] == 100.0
    assert t["numel"] == 8.0
    assert res.status == "pass"  # 1e-4 <= 1e-5 + 1.3e-6 * 100


def test_replicated_reduction_takes_the_worst_rank():
    res = parity.evaluate(frame(_two_rank(1.0)), FP32)
    t = parity.check_tensors(frame(_two_rank(1.0)), FP32).iloc[0]
    assert t["reduction"] == "replicated" and t["worst_rank"] == 1
    assert t["max_abs_diff"] == 5e-5 and t["rel_l2"] == pytest.approx(4e-4 / 3.0)
    assert res.status == "fail" and res.max_grad_rel_l2 == pytest.approx(4e-4 / 3.0)


def test_mixed_replication_flag_is_bad_input():
    rows = (tensor_rows(rank=0, kind="grad", tensor="w", seq=0, replicated=1.0)
            + tensor_rows(rank=1, kind="grad", tensor="w", seq=0, replicated=0.0) + clean_loss())
    with pytest.raises(BadInput, match="replicated on some ranks"):
        parity.evaluate(frame(rows), FP32)


def test_first_divergence_order_activation_seq_then_grad_then_param_then_loss():
    bad = dict(max_abs_diff=1.0, diff_sq_sum=1.0)
    rows = (tensor_rows(rank=0, kind="param", tensor="p", seq=0, step=0, **bad)
            + tensor_rows(rank=0, kind="grad", tensor="aaa", seq=0, **bad)
            + tensor_rows(rank=0, kind="activation", tensor="zz.late", seq=5, **bad)
            + tensor_rows(rank=0, kind="activation", tensor="zz.early", seq=2, **bad)
            + tensor_rows(rank=0, kind="activation", tensor="aa.ok", seq=1)
            + loss_rows(rank=0, step=0, value=1.0, ref=2.0))
    res = parity.evaluate(frame(rows), FP32)
    assert res.first_divergence.tensor == "zz.early"
    assert list(parity.check_tensors(frame(rows), FP32)["tensor"]) == ["aa.ok", "zz.early", "zz.late", "aaa", "p"]
    # without activations the gradient comes first, then params, then loss
    rows2 = [r for r in rows if r["kind"] != "activation"]
    assert parity.evaluate(frame(rows2), FP32).first_divergence.tensor == "aaa"
    # the gradient now agrees: the param comes first
    rows3 = [r for r in rows2 if r["kind"] != "grad"] + tensor_rows(
        rank=0, kind="grad", tensor="aaa", seq=0)
    assert parity.evaluate(frame(rows3), FP32).first_divergence.tensor == "p"
    rows4 = [r for r in rows3 if r["kind"] != "param"]
    fd = parity.evaluate(frame(rows4), FP32).first_divergence
    assert (fd.kind, fd.max_abs_diff) == ("loss", 1.0)


def test_loss_is_the_mean_over_ranks():
    # ranks see 1.0 and 3.0 on their halves; the distributed loss is 2.0. Step 1's limit is the
    # envelope's 2 x (1e-5 + 1.3e-6 x 2.0) = 2.52e-5: 2.5e-5 passes, 2.54e-5 fails.
    rows = (tensor_rows(rank=0, kind="grad", tensor="w", seq=0)
            + tensor_rows(rank=1, kind="grad", tensor="w", seq=0)
            + loss_rows(rank=0, step=0, value=1.0, ref=2.0) + loss_rows(rank=1, step=0, value=3.0, ref=2.0)
            + loss_rows(rank=0, step=1, value=2.0 + 2.5e-5, ref=2.0)
            + loss_rows(rank=1, step=1, value=2.0 + 2.5e-5, ref=2.0))
    res = parity.evaluate(frame(rows), FP32)
    assert list(parity.check_loss(frame(rows), FP32)["loss"]) == [2.0, pytest.approx(2.0 + 2.5e-5)]
    assert res.status == "pass"
    assert res.loss_max_rel_diff == pytest.approx(2.5e-5 / 2.0, rel=1e-6)
    rows[-2]["value"] = rows[-4]["value"] = 2.0 + 2.54e-5  # the two "value" rows of step 1
    assert parity.evaluate(frame(rows), FP32).status == "fail"


def test_rel_l2_is_zero_when_both_are_zero():
    rows = tensor_rows(rank=0, kind="grad", tensor="z", seq=0, ref_sq_sum=0.0, diff_sq_sum=0.0,
                       max_abs_ref=0.0) + clean_loss(ranks=(0,))
    res = parity.evaluate(frame(rows), FP32)
    assert parity.check_tensors(frame(rows), FP32).iloc[0]["rel_l2"] == 0.0 and res.status == "pass"


def test_check_run_statuses(tmp_path):
    assert parity.check_run(tmp_path, None).status == "not_recorded"
    m = typed(manifest(run_name="ddp", strategy="ddp", world_size=1))
    res = parity.check_run(tmp_path, m)
    assert res.status == "not_recorded" and "numerics.parquet" in res.reason
    write_numerics(tmp_path / "numerics.parquet", clean_loss(ranks=(0,)))
    assert parity.check_run(tmp_path, typed(manifest(run_name="single", strategy="single"))).status == "reference"
    assert parity.check_run(tmp_path, m).status == "not_recorded"  # no gradient rows
    write_numerics(tmp_path / "numerics.parquet",
                   tensor_rows(rank=0, kind="grad", tensor="w", seq=0, max_abs_diff=2e-5)
                   + clean_loss(ranks=(0,)))
    assert parity.check_run(tmp_path, m).status == "fail"
    assert parity.check_run(tmp_path, m, ToleranceOverride(atol=1e-4)).status == "pass"


def test_a_rank_missing_from_numerics_fails_the_gate_as_not_verified(tmp_path):
    # world size 2, rank 1 wrote nothing: the check over rank 0 alone passes, but the run is
    # unverified (oracle: the rule -- every rank writes every tensor and the loss)
    m = typed(manifest(run_name="ddp", strategy="ddp", world_size=2))
    write_numerics(tmp_path / "numerics.parquet",
                   tensor_rows(rank=0, kind="grad", tensor="w", seq=0) + clean_loss(ranks=(0,)))
    res = parity.check_run(tmp_path, m)
    assert res.status == "not_recorded"
    assert res.reason.startswith("not verified:") and "no rows of rank(s) 1 (world size 2)" in res.reason


def test_a_tensor_missing_from_one_rank_fails_the_gate_naming_it():
    rows = (tensor_rows(rank=0, kind="grad", tensor="w", seq=0)
            + tensor_rows(rank=1, kind="grad", tensor="w", seq=0)
            + tensor_rows(rank=0, kind="grad", tensor="b", seq=1) + clean_loss())
    res = parity.evaluate(frame(rows), FP32, world_size=2)
    assert res.status == "not_recorded"
    assert "lacks grad b (step 0) on rank(s) 1" in res.reason
    # a real divergence stays a failure, the gap said after it
    bad = [dict(r, value=1.0) if r["metric"] == "max_abs_diff" and r["tensor"] == "w" else r
           for r in rows]
    res = parity.evaluate(frame(bad), FP32, world_size=2)
    assert res.status == "fail" and "not verified: " in res.reason and "grad b" in res.reason


def test_gate_says_not_verified_for_a_tensor_missing_from_one_rank(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    table = pq.read_table(job / "numerics.parquet")
    df = table.to_pandas()
    victim = str(df.loc[df["kind"] == "grad", "tensor"].iloc[0])
    df = df[~((df["rank"] == 1) & (df["kind"] == "grad") & (df["tensor"] == victim))]
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False),
                   job / "numerics.parquet")
    refresh_manifest(job)
    proc = cli("gate", str(job))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert f"lacks grad {victim} (step 0) on rank(s) 1" in proc.stdout
    assert "not verified" in proc.stdout.splitlines()[-1]
    assert "not numerically equivalent" not in proc.stdout


def test_unreadable_numerics_is_bad_input(tmp_path):
    (tmp_path / "numerics.parquet").write_bytes(b"not parquet")
    with pytest.raises(BadInput, match="numerics.parquet"):
        parity.check_run(tmp_path, typed(manifest(run_name="ddp", strategy="ddp")))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_numerics_with_nan_or_inf_fail_parity_naming_the_tensor(tmp_path, ddp_run, bad):
    job = copy_run(ddp_run, tmp_path / "ddp")
    table = pq.read_table(job / "numerics.parquet")
    df = table.to_pandas()
    grads = df[(df["kind"] == "grad") & (df["metric"] == "diff_sq_sum")]
    victim = str(grads["tensor"].iloc[2])
    df.loc[grads.index[2], "value"] = bad
    pq.write_table(pa.Table.from_pandas(df, schema=table.schema, preserve_index=False),
                   job / "numerics.parquet")
    refresh_manifest(job)
    proc = cli("gate", str(job))
    assert proc.returncode == 3 and f"grad {victim}" in proc.stdout and "NaN/inf" in proc.stdout
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    assert "FAILED for ddp" in proc.stdout and victim in proc.stdout.splitlines()[2]
