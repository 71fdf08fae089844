"""The report's projection rows (analyzer/compare/projection.py ``projection_rows``): verified
only by a passing run of the same strategy and options, ranked among the verified by projected
step, graded against a run of the same configuration at the same world. Hand-built entries."""

from __future__ import annotations

from analyzer.compare.projection import projection_rows
from analyzer.contract.report_types import Parity, ProjectedStep, RunEntry, StepTime

SETTINGS = {"model": {"name": "SimpleTransformer"}, "batch": {"global_batch": 8},
            "precision": "fp32", "training": {"optimizer": {"name": "adamw"}}, "versions": None,
            "device": None, "seed": None, "launch": None, "data": None}


def _proj(name, strategy, world, step_ns, low, high):
    return RunEntry(name=name, strategy=strategy, world_size=world, settings=dict(SETTINGS),
                    parity=Parity(status="not_recorded", reason="projection"),
                    projection={"world_size": world},
                    projected_step=ProjectedStep(world_size=world, steps=3, step_ns=step_ns,
                                                 low_ns=low, high_ns=high, compute_ns=step_ns,
                                                 comm_ns=0, exposed_comm_ns=0))


def _run(name, strategy, world, status="pass", median=None, settings=SETTINGS):
    return RunEntry(name=name, strategy=strategy, world_size=world, settings=dict(settings),
                    parity=Parity(status=status, reason=""),
                    step_time_ns=StepTime(median=median, n=3 if median else 0))


def test_only_projections_a_passing_run_verifies_are_ranked_fastest_first():
    runs = [_proj("hsdp-64", "hsdp", 64, 300, 250, 350), _proj("fsdp2-64", "fsdp2", 64, 200, 190, 260),
            _proj("ddp-64", "ddp", 64, 100, 90, 110),
            _run("hsdp", "hsdp", 4), _run("fsdp2", "fsdp2", 4), _run("ddp", "ddp", 4, "fail")]
    rows = projection_rows(runs)
    # ddp-64 is fastest but its strategy's run failed parity: listed last, not ranked
    assert [(r.run, r.rank, r.verified_by) for r in rows] == [
        ("fsdp2-64", 1, "fsdp2"), ("hsdp-64", 2, "hsdp"), ("ddp-64", None, None)]
    assert all(r.measured_run is None for r in rows)  # no run at world 64


def test_a_run_of_the_same_configuration_and_world_grades_the_projection():
    runs = [_proj("fsdp2-4", "fsdp2", 4, 110, 100, 130),
            _run("fsdp2-other", "fsdp2", 4, median=100.0, settings={**SETTINGS, "precision": "bf16"}),
            _run("fsdp2", "fsdp2", 4, median=100.0)]
    (row,) = projection_rows(runs)
    # the bf16 run is another configuration: the fp32 one grades: +10 %, inside [100, 130]
    assert (row.measured_run, row.measured_median_ns, row.inside) == ("fsdp2", 100.0, True)
    assert row.error == (110 - 100) / 100
    # verification: the same strategy, options, model, precision, training: not the bf16 run
    assert row.verified_by == "fsdp2"


def test_projections_rank_within_their_world_and_a_mesh_of_another_shape_verifies():
    small = _run("hsdp", "hsdp", 4)
    small.options = {"mesh": "2x2", "sharding_strategy": "full_shard"}
    at64 = _proj("hsdp-64", "hsdp", 64, 300, 250, 350)
    at64.options = {"mesh": "8x8", "sharding_strategy": "full_shard"}
    at4 = _proj("hsdp-4", "hsdp", 4, 900, 800, 950)
    at4.options = dict(small.options)
    faulted = _proj("hsdp-4-fault", "hsdp", 4, 100, 90, 110)
    faulted.options, faulted.fault = dict(small.options), "wrong-grad-scale"
    rows = projection_rows([at64, at4, faulted, small])
    # the mesh's shape follows the world: the 2x2 record verifies the 8x8 projection; each is
    # first of its world; the faulted one is not verified by a run without the fault
    assert [(r.run, r.world_size, r.rank, r.verified_by) for r in rows] == [
        ("hsdp-4", 4, 1, "hsdp"), ("hsdp-4-fault", 4, None, None), ("hsdp-64", 64, 1, "hsdp")]


def test_cpu_compute_with_gpu_links_is_a_warning():
    from analyzer.compare.projection import _mixed_devices

    assert _mixed_devices("cpu", ["link benchmark on this machine vm (gloo, CPU, 4 processes)"]) == []
    (w,) = _mixed_devices("cpu", ["nccl-tests file all_reduce_perf.txt (8 ranks on 1 host)"])
    assert w.startswith("compute measured on this machine's CPU, links from GPUs")
    (w,) = _mixed_devices("cuda", ["link benchmark on this machine vm (gloo, CPU, 2 processes)"])
    assert w.startswith("compute measured on a GPU, links from CPU / gloo")


def test_the_projection_section_and_first_screen_line_render_in_md_and_html():
    from analyzer.compare.projection import projection_rows
    from analyzer.contract.report_types import Ranking, Report
    from reports import html, markdown

    runs = [_proj("fsdp2-64", "fsdp2", 64, 7_350_000, 7_120_000, 8_900_000), _run("fsdp2", "fsdp2", 4)]
    runs[0].projected_step.assumptions = ["8 ranks per node (--ranks-per-node)"]
    report = Report(root="/t", layout="root", runs=runs, ranking=Ranking(
        status="withheld", order=[], reason="no run has a measured step time", rule=""))
    report.projections = projection_rows(runs)
    md = markdown.render(report)
    assert ("**Projected** at 64 ranks: fsdp2-64 (fsdp2) 7.35 ms per step \\[7.12 ms, 8.90 ms\\], "
            "the only projection whose numerics a run here verified (see Projection)") in md
    assert "## Projection at 64 ranks" in md
    assert "| 1 | fsdp2-64 | fsdp2 | 64 | 7.35 ms \\[7.12 ms, 8.90 ms\\] |" in md
    assert "- Assumed: 8 ranks per node (--ranks-per-node)." in md
    page = html.render(report)
    assert "<h2>Projection at 64 ranks</h2>" in page and "verified by fsdp2 (at 4 ranks)" in page


def test_an_unverified_projection_gives_its_step_and_why_not_ranked_on_the_first_screen():
    from analyzer.compare.projection import projection_rows
    from analyzer.contract.report_types import Ranking, Report
    from reports import markdown

    runs = [_proj("p4", "fsdp2", 4, 149_420_000, 114_250_000, 174_840_000)]
    report = Report(root="/t", layout="root", runs=runs, ranking=Ranking(
        status="withheld", order=[], reason="no run has a measured step time", rule=""))
    report.projections = projection_rows(runs)
    assert ("**Projected** at 4 ranks: p4 (fsdp2) 149.42 ms per step \\[114.25 ms, 174.84 ms\\]; not "
            "ranked: numerics not verified (record a run of the same strategy and options "
            "beside it, at a small world) (see Projection)") in markdown.render(report)


def test_repeats_of_the_configuration_are_pooled_as_grade_pools_them():
    runs = [_proj("fsdp2-4", "fsdp2", 4, 110, 100, 130), _run("fsdp2.r1", "fsdp2", 4, median=90.0),
            _run("fsdp2.r2", "fsdp2", 4, median=200.0)]
    runs[1].step_time_ns.values_ns = [80, 90, 100]
    runs[2].step_time_ns.values_ns = [120, 200, 210]
    (row,) = projection_rows(runs)
    # pooled 80, 90, 100, 120, 200, 210: median 110 (not the first repeat's 90): error 0, inside
    assert (row.measured_run, row.measured_median_ns, row.error, row.inside) == (
        "fsdp2.r1, fsdp2.r2", 110.0, 0.0, True)
