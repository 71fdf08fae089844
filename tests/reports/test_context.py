"""The context list on the first screen (issue 42, reports/context.py): a busy or
oversubscribed machine, CPU / gloo, a partial rank set and unaligned clocks, one line each with
its count of runs, in report.md and report.html before the findings. Exact lines."""

from __future__ import annotations

import msgspec

from analyzer.contract.report_types import TraceInfo
from reports import context, html, markdown
from tests.analyzer.test_findings import rank, report, run
from tests.reports.builders import context as md_context

OVER = {"load_avg": [18.0, 9.0, 4.0], "cpu_count": 2, "usable_cpus": 2, "threads_per_rank": 1,
        "ranks_on_host": 4, "oversubscribed": True}
"""4 ranks of one thread on 2 CPUs, load 18: the new user's machine."""
QUIET = {**OVER, "load_avg": [0.5, 0.5, 0.5], "ranks_on_host": 2, "oversubscribed": False}


def _gloo(name, machine, **kw):
    return msgspec.structs.replace(run(name=name, strategy=name, machine=machine,
                                       backend="gloo", **kw), device="cpu")


def test_four_ranks_on_two_cores_say_cpu_contention_first():
    rep = report(run(name="single", strategy="single", machine=QUIET),
                 _gloo("hsdp", OVER), _gloo("ddp", QUIET))
    assert context.lines(rep) == [
        "Busy machine (1 of 3 runs): 1-minute load up to 18 on 2 usable CPUs; oversubscribed "
        "(1): 4 ranks x 1 thread(s) on 2 CPUs, so ranks wait for cores: CPU contention, not a "
        "device to rebalance.",
        "CPU with gloo (2 of 3 runs): timings carry +-30-50 % noise, memory is a lower bound: "
        "the order of strategies here says little about GPUs."]
    md = markdown.render(rep)
    assert md_context(md) == [markdown.escape(x) for x in context.lines(rep)]
    assert md.index("**Context:**") < md.index("Findings")
    page = html.render(rep)
    assert html.e(context.lines(rep)[0]) in page[page.index('id="context"'):page.index('id="findings"')]


def test_partial_ranks_and_unaligned_clocks_are_counted():
    part = msgspec.structs.replace(run(name="dlrm", strategy="ddp", world_size=8), trace_info=TraceInfo(
        whole_trace_mode=False, rank_sources=["file name"], missing_ranks=[3, 5, 6, 7, 8],
        device_kind="gpu", trace_warnings=[]))
    skew = run(name="hsdp", strategy="hsdp", ranks=[
        msgspec.structs.replace(rank(r), clock=c)
        for r, c in enumerate(["reference", "measured", "unresolved", "inconsistent"])])
    assert context.lines(report(part, skew)) == [
        "Partial rank set (1 of 2 runs): dlrm: 5 of 8 ranks missing; cross-rank figures cover "
        "the traced ranks only.",
        "Unaligned clocks (1 of 2 runs): offsets not measured for hsdp: 2 of 4 ranks (0 "
        "applied); waits across ranks on them are approximate."]


def test_a_quiet_gpu_run_has_no_context_list():
    rep = report(run(device="gpu", backend="nccl", machine=QUIET))
    assert context.lines(rep) == [] and "**Context:**" not in markdown.render(rep)


def test_a_projection_says_what_it_holds_and_no_partial_rank_set():
    proj = msgspec.structs.replace(run(name="p8", strategy="fsdp2", world_size=8), projection={
        "world_size": 8, "roles_run": [0], "device": "cpu", "fake_process_group": True},
        trace_info=TraceInfo(whole_trace_mode=False, rank_sources=["distributedInfo"],
                             missing_ranks=[1, 2, 3, 4, 5, 6, 7], device_kind="cpu",
                             trace_warnings=[]))
    assert context.lines(report(proj)) == [
        "Projected (1 of 1 run): p8: world 8 from ranks 0, on the fake process group: shapes, "
        "collectives and memory per rank are the job's; no data moves, so times and numerics "
        "are not."]


def test_measured_time_tables_say_a_projections_rows_are_one_process_on_the_fake_group():
    proj = msgspec.structs.replace(run(name="p8", strategy="fsdp2", world_size=8), projection={
        "world_size": 8, "roles_run": [0], "device": "cpu", "fake_process_group": True})
    said = ("Projection rows (p8) are one process on torch's fake process group: their "
            "collectives moved no data and their times are that process's, not a step at N ranks "
            "(that is the projected step, under Projection at N ranks).")
    md = markdown.render(report(run(name="ddp"), proj))
    assert md.count(said) == 2  # under Communication and under Time per step
    from html import escape

    assert html.render(report(run(name="ddp"), proj)).count(escape(said)) == 2
    assert said not in markdown.render(report(run(name="ddp")))  # no projection: not said
