"""The pipeline table's rows are pp ranks, each with the stages it ran (reports/pipeline.py)."""
from types import SimpleNamespace

from analyzer.contract.report_types import Pipeline, PipelineStage
from reports import pipeline as pipeline_section


def _zbv_run():
    per_stage = [PipelineStage(stage=c, ranks=[c], rank_steps=1, step_ns=1e6, compute_ns=5e5,
                               bubble_ns=5e5, bubble_frac=0.5) for c in range(4)]
    p = Pipeline(stages=4, microbatches=8, schedule="zbv", dp=1, ideal_bubble_frac=None,
                 ideal_source="-", bubble_rule="-", per_stage=per_stage, virtual_stages=2,
                 stage_ids=[[0, 7], [1, 6], [2, 5], [3, 4]])
    return SimpleNamespace(name="zbv", pipeline=p)


def test_zbv_rows_are_pp_ranks_with_their_stage_ids():
    heads, rows = pipeline_section.stage_rows(_zbv_run())
    assert heads[:3] == ["pp rank", "stages", "ranks"]
    assert [r[:3] for r in rows] == [[0, "0, 7", "0"], [1, "1, 6", "1"], [2, "2, 5", "2"],
                                     [3, "3, 4", "3"]]
    assert "8 stages (2 per rank on 4 ranks)" in pipeline_section.head_line(_zbv_run())
