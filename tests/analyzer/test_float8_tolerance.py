"""A --float8 record's parity tolerance (issue 45, analyzer/contract/tolerance.py
``float8_tolerance``), chosen by the manifest's ``strategy_options.float8``."""

from __future__ import annotations

from analyzer.analyses import parity
from analyzer.contract.tolerance import float8_tolerance
from tests.reports.builders import loss_rows, manifest, tensor_rows, typed, write_numerics


def test_a_float8_record_is_checked_at_the_float8_tolerance(tmp_path):
    # float8 casts of a batch shard and of the global batch differ (tolerance.float8_tolerance):
    # a gradient 10 % off its max passes at rtol 0.375, fails at fp32's, and 50 % fails both
    float8 = typed(manifest(run_name="f8", strategy="fsdp2", world_size=1, options={"float8": True}))
    fp32 = typed(manifest(run_name="f32", strategy="fsdp2", world_size=1))
    for diff, verdicts in ((0.1, ("pass", "fail")), (0.5, ("fail", "fail"))):
        write_numerics(tmp_path / "numerics.parquet",
                       tensor_rows(rank=0, kind="grad", tensor="w", seq=0, max_abs_diff=diff)
                       + loss_rows(rank=0, step=0, value=2.0, ref=2.0))
        res = parity.check_run(tmp_path, float8)
        assert (res.status, parity.check_run(tmp_path, fp32).status) == verdicts
        assert res.tolerance == float8_tolerance()
