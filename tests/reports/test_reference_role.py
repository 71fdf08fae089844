"""The reference role and the speedup over it (issue 41): defined once in the contract
(``RunEntry.is_reference``, ``Ranking.speedup``), written by the ranking and read, never
re-derived, by the ranking table, the plots' labels and the decision and verdict lines."""

from __future__ import annotations

import pytest

from analyzer.compare.ranking import rank_runs
from analyzer.contract.report_types import Arm, Parity, Ranking, Report, RunEntry, StepTime
from reports import markdown, palette, verdict
from reports.decision import decision_input

MS = 1_000_000


def run(name, strategy, median_ms, settings=None):
    exp = {"id": "e1", "arm": name, "repeat": 1, "repeats": 1}
    if settings is not None:
        exp["settings"] = settings
    status = "reference" if strategy == "single" else "pass"
    return RunEntry(name=name, strategy=strategy, settings={"seed": 0}, experiment=exp,
                    parity=Parity(status=status, reason="hand-built"),
                    step_time_ns=StepTime(median=median_ms * MS, n=3,
                                          values_ns=[median_ms * MS] * 3))


@pytest.mark.parametrize("strategy,settings,reference", [
    ("single", None, True), ("single", {"strategy": "single"}, False), ("ddp", None, False),
    ("a-foreign-tool", None, False), ("unknown", None, False)])
def test_the_reference_is_the_reference_row_unless_a_declared_arm(strategy, settings, reference):
    assert run("x", strategy, 10, settings).is_reference is reference


def test_ranking_speedup_is_the_reference_median_over_the_arm():
    rk = Ranking(status="ranked", order=["ddp"], reason="", rule="", reference="single",
                 arms=[Arm(name="ddp", strategy="ddp", runs=["ddp"], median_ns=5.0, steps=3),
                       Arm(name="single", strategy="single", runs=["single"], median_ns=20.0,
                           steps=3)])
    assert rk.speedup(rk.arms[0]) == 4.0
    assert Ranking(status="ranked", order=["ddp"], reason="", rule="", arms=rk.arms[:1]
                   ).speedup(rk.arms[0]) is None  # no reference arm


def _report(runs):
    return Report(root="/x", layout="root", runs=runs, ranking=rank_runs(runs))


def test_every_renderer_reads_the_reference_the_ranking_wrote():
    rep = _report([run("single", "single", 20), run("ddp", "ddp", 10), run("fsdp", "fsdp", 5)])
    assert rep.ranking.reference == "single" and rep.ranking.order == ["fsdp", "ddp"]
    rows = {row[1]: row[0] for row in markdown.ranking_rows(rep)[1]}
    assert rows == {"fsdp": "1", "ddp": "2", "single": markdown.REFERENCE}
    assert [palette.run_label(r) for r in rep.runs] == ["single (reference)", "ddp", "fsdp"]
    assert decision_input(rep).vs_reference == 4.0
    assert any("4.00x speedup over the single-device run" in s for s in verdict.verdict(rep))


def test_a_declared_single_arm_is_ranked_not_the_reference():
    arms = [run("one", "single", 20, {"strategy": "single"}),
            run("two", "ddp", 10, {"strategy": "ddp"})]
    rep = _report(arms)
    assert rep.ranking.declared and rep.ranking.reference is None
    assert rep.ranking.order == ["two", "one"]
    rows = {row[1]: row[0] for row in markdown.ranking_rows(rep)[1]}
    assert rows == {"two": "1", "one": "2"}
    assert [palette.run_label(r) for r in rep.runs] == ["one", "two"]
    assert decision_input(rep).vs_reference is None
