"""The report's "Projection at N ranks" section (issue 44, Deliver 3), for report.md and
report.html: per projection with a projected step (``Report.projections``, ranked in
analyzer/compare/projection.py), its step with the interval, tokens/s per device, exposed
communication per mesh dimension, memory per rank and the fits line, whether its numerics are
verified, then the assumptions and link sources once. Pure functions of the report."""

from __future__ import annotations

from typing import Any

from analyzer.contract.report_types import Report, RunEntry
from reports import fmt

NOT_VERIFIED = "not verified: no run of this strategy and options passed parity here (not ranked)"


def _entry(report: Report, name: str) -> RunEntry | None:
    return next((r for r in report.runs if r.name == name), None)


def heading(report: Report) -> str:
    """``Projection at 8 ranks`` (or ``at 8, 64 ranks`` when the worlds differ)."""
    worlds = sorted({p.world_size for p in report.projections})
    return f"Projection at {', '.join(map(str, worlds))} ranks"


def rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """One row per projection, in ranking order."""
    heads = ["rank", "projection", "strategy", "world", "step [interval]", "tokens/s per device",
             "exposed comm (per mesh dim)", "params + grads + optimizer per rank", "peak per rank",
             "fits", "numerics"]
    out = []
    for p in report.projections:
        run = _entry(report, p.run)
        dims = run.projected_step.exposed_by_dim_ns if run and run.projected_step else {}
        exposed = fmt.ms(p.exposed_comm_ns) + (
            " (" + ", ".join(f"{d} {fmt.ms(v)}" for d, v in dims.items()) + ")" if dims else "")
        ps = run.projected_step if run else None
        flags = (["sizes outside the link curves"] if ps and ps.outside_sizes else []) + (
            ["mixed devices"] if ps and ps.warnings else [])
        out.append([
            "-" if p.rank is None else p.rank, p.run, p.strategy, p.world_size,
            f"{fmt.ms(p.step_ns)} [{fmt.ms(p.low_ns)}, {fmt.ms(p.high_ns)}]"
            + (f" ({', '.join(flags)}: see below)" if flags else ""),
            "-" if p.tokens_per_s_per_device is None else f"{p.tokens_per_s_per_device:,.0f}",
            exposed, "-" if p.state_bytes is None else fmt.data_bytes(p.state_bytes),
            "-" if p.peak_bytes is None else fmt.data_bytes(p.peak_bytes),
            {True: "fits", False: "DOES NOT FIT", None: "-"}[p.fits],
            f"verified by {p.verified_by}" + _world_of(report, p.verified_by)
            if p.verified_by else NOT_VERIFIED])
        if any(x.measured_run for x in report.projections):
            out[-1].insert(5, "-" if p.measured_run is None else
                           f"{fmt.ms(p.measured_median_ns)} ({p.measured_run}): "
                           f"{p.error:+.1%}, {'inside' if p.inside else 'outside'}")
    if any(x.measured_run for x in report.projections):
        heads.insert(5, "measured (error, interval)")
    return heads, out


def _world_of(report: Report, name: str) -> str:
    run = _entry(report, name)
    return f" (at {run.world_size} ranks)" if run and run.world_size else ""


def notes(report: Report) -> list[str]:
    """The lines under the table: overlap rule, link sources, flagged sizes, assumptions, each
    said once across the projections."""
    seen: dict[str, None] = {}
    for p in report.projections:
        ps = _entry(report, p.run).projected_step
        for w in ps.warnings:
            seen[f"WARNING: {p.run}: {w}."] = None
        seen[f"Overlap: {ps.overlap}."] = None
        for s in ps.link_sources:
            seen[f"Link model: {s}."] = None
        if ps.outside_sizes:
            seen[f"{p.run}: calls outside the link curves' measured sizes, not measured: below "
                 "the smallest size its time, above the largest its bandwidth held (time x "
                 f"bytes / its bytes): {', '.join(ps.outside_sizes)}."] = None
        for a in ps.assumptions:
            seen[f"Assumed: {a}."] = None
    return [*seen, "Step: the median over the projection's profiled steps of the replayed step "
            "(its roles' compute in trace order, each collective's link time, waited for where "
            "the overlap rule says); the interval: the fastest step with each link row's low "
            "time to the slowest with its high. Exposed communication: the step less its "
            "compute, a pipeline's bubble included. Ranked among the projections of one world "
            "size, batch, model and setup; verified by a run of the same strategy and options "
            "(the mesh's shape aside) whose parity passed, at any world. Collective calls and "
            "bytes and memory per rank are exact (analyzer grade checks them against the real "
            "run)."]


def markdown(report: Report, table, escape) -> list[str]:
    """The section's report.md lines (none without a projected step)."""
    if not report.projections:
        return []
    heads, body = rows(report)
    return [f"## {heading(report)}", "", table(heads, body), "",
            *[f"- {escape(n)}" for n in notes(report)], ""]


def html(report: Report, table, e) -> list[str]:
    """The section's report.html parts."""
    if not report.projections:
        return []
    heads, body = rows(report)
    return [f"<h2>{e(heading(report))}</h2>", table(heads, body),
            "<ul>" + "".join(f"<li>{e(n)}</li>" for n in notes(report)) + "</ul>"]
