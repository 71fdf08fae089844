"""Fault canaries: each deliberate bug is recorded in the manifest and shows in the numerics.

skip-grad-sync is checked in test_failures (the rerun record).
"""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES
from tests.tracer.helpers import TINY, run_tracer, tensor_rel_l2

pytestmark = pytest.mark.record
RTOL = TOLERANCES["fp32"].rtol


# The canary records also exercise non-default FSDP options (recorded in the manifest).
FSDP_OPTIONS = {
    "ddp": ([], {}),
    "fsdp": (["--sharding-strategy", "shard_grad_op", "--backward-prefetch", "post", "--forward-prefetch",
              "--wrap-min-params", "1000"],
             {"sharding_strategy": "shard_grad_op", "backward_prefetch": "post", "forward_prefetch": True,
              "reshard_after_forward": False, "auto_wrap_min_num_params": 1000}),
    "fsdp2": (["--forward-prefetch", "--no-reshard-after-forward"],
              {"forward_prefetch": True, "reshard_after_forward": False}),
}


def _record(tmp_path, strategy, fault):
    extra, expected_options = FSDP_OPTIONS[strategy]
    proc, _ = run_tracer(["--strategy", strategy, "--fault", fault, "--out", str(tmp_path)] + TINY + extra,
                         tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_dir = tmp_path / strategy
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    assert manifest.fault == fault
    for key, value in expected_options.items():
        assert manifest.strategy_options[key] == value, key
    return pd.read_parquet(run_dir / schemas.NUMERICS_NAME)


def test_wrong_grad_scale_halves_fsdp_gradients(tmp_path):
    numerics = _record(tmp_path, "fsdp", "wrong-grad-scale")
    # --wrap-min-params 1000 on hidden 32: attn (1056), mlp.0 (4224), mlp.2 (4128) of each layer
    units = schemas.read_manifest(tmp_path / "fsdp" / schemas.MANIFEST_NAME).strategy_options["fsdp_units"]
    assert units == [f"layers.{i}.{m}" for i in range(2) for m in ("attn", "mlp.0", "mlp.2")]
    grads = tensor_rel_l2(numerics, "grad")
    # g / 2 against g: |g/2 - g| / |g| = 1/2 for every parameter (world size 2).
    assert all(abs(v - 0.5) < 1e-4 for v in grads.values()), grads
    assert max(tensor_rel_l2(numerics, "activation").values()) == 0.0


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_unsynced_init_diverges(tmp_path, strategy):
    numerics = _record(tmp_path, strategy, "unsynced-init")
    for kind in ("activation", "grad", "param"):
        assert max(tensor_rel_l2(numerics, kind).values()) > 1000 * RTOL, kind
    if strategy == "ddp":  # rank 0 keeps the true weights, only rank 1's forward diverges
        act = numerics[(numerics["kind"] == "activation") & (numerics["metric"] == "diff_sq_sum")]
        by_rank = act.groupby("rank")["value"].max()
        assert by_rank[0] == 0.0 and by_rank[1] > 0.0
