"""The manifest's ``strategy_options`` checked when it is read (analyzer/contract/schemas.py
``strategy_options_problem``): only the options the strategy's row takes
(analyzer/contract/strategies.py), a ddp bucket size that a record can write."""

from __future__ import annotations

import json

import pytest

from analyzer.contract import schemas
from tests.reports.builders import manifest

DDP = {"bucket_cap_mb": 25.0, "gradient_as_bucket_view": False, "static_graph": False}
FSDP = {"sharding_strategy": "full_shard", "auto_wrap_min_num_params": 1000,
        "backward_prefetch": "backward_pre", "forward_prefetch": False,
        "reshard_after_forward": True, "fsdp_units": ["layers.0"]}


def _read(tmp_path, strategy, options):
    path = tmp_path / schemas.MANIFEST_NAME
    fields = manifest(run_name=strategy, strategy=strategy, options=options)
    fields["files"] = [{"path": schemas.STEPS_NAME, "size_bytes": 0, "sha256": "0" * 64}]
    path.write_text(json.dumps(fields))
    return schemas.read_manifest(path)


@pytest.mark.parametrize("strategy, options", [
    ("ddp", DDP), ("ddp", {**DDP, "bucket_cap_mb": "default"}), ("ddp", {**DDP, "bucket_cap_mb": 5}),
    ("fsdp", FSDP), ("fsdp2", {**FSDP, "fsdp_unit_classes": ["Block"]}), ("single", {}),
])
def test_options_a_record_writes_are_read(tmp_path, strategy, options):
    assert _read(tmp_path, strategy, options).strategy_options == options


@pytest.mark.parametrize("strategy, options, says", [
    ("fsdp", DDP, "$.strategy_options lists bucket_cap_mb, gradient_as_bucket_view, "
     "static_graph, which fsdp does not take: the strategy or its options were edited; "
     "re-record the run"),
    ("ddp", {**DDP, "sharding_strategy": "full_shard"}, "$.strategy_options lists "
     "sharding_strategy, which ddp does not take"),
    ("single", {"bucket_cap_mb": 25.0}, "lists bucket_cap_mb, which single does not take"),
    ("ddp", {**DDP, "bucket_cap_mb": -1}, "$.strategy_options.bucket_cap_mb -1 is neither a "
     'positive number of MiB nor "default"; re-record the run'),
    ("ddp", {**DDP, "bucket_cap_mb": 0.0}, "bucket_cap_mb 0.0 is neither"),
    ("ddp", {**DDP, "bucket_cap_mb": "defaultx"}, 'bucket_cap_mb "defaultx" is neither'),
    ("ddp", {**DDP, "bucket_cap_mb": "DEFAULT"}, 'bucket_cap_mb "DEFAULT" is neither'),
    ("ddp", {**DDP, "bucket_cap_mb": True}, "bucket_cap_mb true is neither"),
    ("ddp", {**DDP, "bucket_cap_mb": None}, "bucket_cap_mb null is neither"),
])
def test_options_no_record_writes_are_refused(tmp_path, strategy, options, says):
    with pytest.raises(schemas.SchemaError) as err:
        _read(tmp_path, strategy, options)
    assert str(err.value).startswith(str(tmp_path / "manifest.json") + ": manifest ")
    assert says in str(err.value)
