"""Run-level data supply (analyzer/analyses/datasupply.py) and its report sentence, on hand-made tables
whose answers are worked out in the comments."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.analyses.datasupply import data_summary, rank_data
from analyzer.contract.report_types import DataSupply
from reports import fmt
from reports.verdict import input_bound_sentence
from tests.reports.builders import manifest, typed


def _bd(rows):
    cols = ["rank", "step", "step_ns", "data_wait_ns", "exposed_comm_ns", "input_bound"]
    return pd.DataFrame(rows, columns=cols)


BD = _bd([
    # rank 0: steps of 100 and 300 ns, waits 10 and 20 -> 30 / 400 = 0.075
    (0, 1, 100, 10, 50, False), (0, 2, 300, 20, 60, False),
    # rank 1: waits 50 of 100 and 30 of 100 -> 80 / 200 = 0.4; exposed 10 / 200 = 0.05
    (1, 1, 100, 50, 5, True), (1, 2, 100, 30, 5, True),
    (1, -1, 999, 999, 0, True),  # outside every step: ignored
])


def test_rank_data_is_time_weighted():
    r = rank_data(BD).set_index("rank")
    assert list(r["steps"]) == [2, 2]
    assert r.loc[0, "data_wait_frac"] == pytest.approx(30 / 400)  # not the mean of 0.1, 0.0667
    assert r.loc[1, "data_wait_frac"] == pytest.approx(0.4)
    assert r.loc[1, "exposed_comm_frac"] == pytest.approx(0.05)
    assert list(r["input_bound_steps"]) == [0, 2]


def test_data_summary_worst_rank_and_source():
    m = typed(manifest(run_name="ddp", strategy="ddp"),
              data={"source": "loader", "workers": 2, "sample_cost_ms": 5.0, "pin_memory": False})
    d = data_summary(BD, m)
    assert (d.source, d.workers, d.sample_cost_ms) == ("loader", 2, 5.0)
    assert d.data_wait_frac == pytest.approx(110 / 600)  # (30 + 80) / (400 + 200)
    assert (d.worst_rank, d.input_bound) == (1, True)
    assert d.worst_rank_frac == pytest.approx(0.4)
    assert (d.input_bound_steps, d.steps) == (2, 4)
    # foreign traces / older records: no source; no table: no figures
    assert data_summary(BD, None).source is None
    empty = data_summary(None, typed(manifest(run_name="ddp", strategy="ddp"), data={"source": "memory"}))
    assert empty.source == "memory" and empty.data_wait_frac is None and not empty.input_bound


def test_sentence_names_the_rank_and_the_share():
    d = data_summary(BD, None)
    s = input_bound_sentence("ddp", d)
    assert s == ("Input-bound: in ddp, rank 1 waited 40.0 % of step time for data; communication "
                 "figures for this run are not the bottleneck.")
    # exposed communication as large as the wait: both are named
    d.worst_rank_exposed_comm_frac = 0.5
    assert "and 50.0 % on exposed communication" in input_bound_sentence("x", d)
    assert input_bound_sentence("y", data_summary(BD[BD["rank"] == 0], None)) is None
    assert input_bound_sentence("z", None) is None


def test_data_supply_cell():
    def supply(**kw):
        return DataSupply(threshold_frac=0.2, **kw)
    assert fmt.data_supply(supply(source="loader", workers=2, sample_cost_ms=20.0,
                                  data_wait_frac=0.38)) == "38.0 % (loader, 2 workers, 20 ms/sample)"
    assert fmt.data_supply(supply(source="memory", data_wait_frac=0.0)) == "0.0 % (memory)"
    assert fmt.data_supply(supply(source=None, data_wait_frac=0.05)) == "5.0 %"
    assert fmt.data_supply(None) == "-"
