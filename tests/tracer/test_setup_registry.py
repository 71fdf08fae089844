"""The tracer applies a strategy through its row of the table and one registry of setup hooks
(tracer/strategies.py ``SETUP``): every row has a hook, every hook a row, and a new row (a copy of
ddp under another name) is configured from the row alone."""

from __future__ import annotations

import dataclasses

import pytest

from analyzer.contract import schemas, strategies


def test_the_registry_and_the_table_name_the_same_strategies():
    from tracer.strategies import SETUP

    assert set(SETUP) == set(strategies.TABLE)


def test_a_second_hook_for_one_strategy_is_refused():
    from tracer.strategies import registers

    with pytest.raises(ValueError, match="strategy ddp: a setup hook is already registered"):
        registers("ddp")(lambda *args: None)


@pytest.fixture
def ddp2(monkeypatch):
    """A toy row: ddp's under the name ddp2, in the table and the names the contract derives."""
    table = {**strategies.TABLE, "ddp2": dataclasses.replace(strategies.TABLE["ddp"], name="ddp2")}
    monkeypatch.setattr(strategies, "TABLE", table)
    monkeypatch.setattr(schemas, "STRATEGIES", tuple(table))


def test_a_new_row_takes_its_options_and_faults_from_the_table(ddp2):
    from tracer.config import RecordConfig

    cfg = RecordConfig(strategy="ddp2", nproc=2, bucket_cap_mb=10.0, fault="skip-grad-sync")
    assert cfg.strategy_options() == RecordConfig(strategy="ddp", nproc=2,
                                                  bucket_cap_mb=10.0).strategy_options()
    assert (cfg.world_size, cfg.mesh_shape, cfg.tp_degree, cfg.pp_degree) == (2, (2,), 1, 1)
    with pytest.raises(ValueError, match=r"--sharding-strategy: --strategy ddp2 does not take it "
                                         r"\(only fsdp, fsdp2, hsdp, fsdp2_tp\)"):
        RecordConfig(strategy="ddp2", sharding_strategy="no_shard")
    with pytest.raises(ValueError, match=r"not available for --strategy fsdp \(only ddp, ddp2\)"):
        RecordConfig(strategy="fsdp", fault="skip-grad-sync")


def test_mesh_degrees_come_from_the_rows_dimensions():
    from tracer.config import RecordConfig

    tp = RecordConfig(strategy="fsdp2_tp", nproc=8, tp=4)
    pp = RecordConfig(strategy="pp", nproc=4, layers=2)
    hsdp = RecordConfig(strategy="hsdp", nproc=6, mesh="3,2", batch=12)
    assert (tp.mesh_shape, tp.tp_degree, tp.pp_degree, tp.dp_size) == ((2, 4), 4, 1, 2)
    assert (pp.mesh_shape, pp.tp_degree, pp.pp_degree, pp.dp_size) == ((2, 2), 1, 2, 2)
    assert (hsdp.mesh_shape, hsdp.tp_degree, hsdp.pp_degree, hsdp.dp_size) == ((3, 2), 1, 1, 6)
    assert RecordConfig(strategy="single", nproc=4).world_size == 1
