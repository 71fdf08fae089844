"""The report's Pipeline section (issue 27), for report.md and report.html: per ``pp`` run, each
stage's bubble beside the schedule's ideal one, and the send / recv traffic between stages
(``RunEntry.pipeline``). Pure functions of the report."""

from __future__ import annotations

from typing import Any

from analyzer.contract.report_types import Report, RunEntry
from reports import fmt

PAIR_NOTE = (
    "Per profiled step, over the ranks of both stages: a send counts on the rank that sends, a "
    "recv on the rank that receives (a complete trace has as many of each; calls beyond both "
    "have no direction in their name). Time is the sum of the calls' durations: a recv's "
    "includes its wait for the other stage. Stages found from: the peer rank the tracer's "
    "paritytrace::pg annotation names (peer), the mesh when no peer is named and there are two "
    "stages (mesh), else unknown.")


def runs(report: Report) -> list[RunEntry]:
    """The runs with a pipeline entry, in report order."""
    return [r for r in report.runs if r.pipeline is not None]


def head_line(run: RunEntry) -> str:
    """``pp: 2 stages x 4 microbatches, schedule gpipe, dp 2; ideal bubble 20.0 % ((P - 1) /
    (M + P - 1) ...: its source)``."""
    p = run.pipeline
    mb = "? microbatches" if p.microbatches is None else f"{p.microbatches} microbatches"
    v = p.virtual_stages
    stages = f"{p.stages} stages" if v == 1 else f"{p.stages * v} stages ({v} per rank on {p.stages} ranks)"
    return (f"{run.name}: {stages} x {mb}, schedule {p.schedule or 'unknown'}, dp "
            f"{p.dp}; ideal bubble {fmt.pct(p.ideal_bubble_frac)} ({p.ideal_source})")


def stage_rows(run: RunEntry) -> tuple[list[str], list[list[Any]]]:
    """Per pp rank (``per_stage`` is one row per pp coordinate, all its V stages together): the
    stages it ran (``Pipeline.stage_ids``; its coordinate in runs with one stage per rank),
    ranks, step, compute, bubble (means per rank and step), bubble share and the ideal share."""
    p = run.pipeline
    heads = ["pp rank", "stages", "ranks", "rank-steps", "step", "compute", "bubble",
             "bubble share", "ideal bubble"]
    return heads, [[s.stage, _stage_ids(p, s.stage), ", ".join(str(r) for r in s.ranks),
                    s.rank_steps, fmt.ms(s.step_ns),
                    fmt.ms(s.compute_ns), fmt.ms(s.bubble_ns), fmt.pct(s.bubble_frac),
                    fmt.pct(p.ideal_bubble_frac)] for s in p.per_stage]


def _stage_ids(p, coordinate: int) -> str:
    """The global stages pp rank ``coordinate`` ran: ``0, 7`` (zbv, P = 4)."""
    if 0 <= coordinate < len(p.stage_ids):
        return ", ".join(str(i) for i in p.stage_ids[coordinate])
    return str(coordinate)


def _stage(s: int) -> str:
    return "?" if s < 0 else str(s)


def pair_rows(run: RunEntry) -> tuple[list[str], list[list[Any]]]:
    """Per (src -> dst stage, peer source): calls, sends, recvs, bytes, time per step."""
    heads = ["src -> dst", "stages found from", "calls", "sends", "recvs", "bytes sent", "bytes received",
             "time", "send time", "recv time"]
    return heads, [[f"{_stage(q.src_stage)} -> {_stage(q.dst_stage)}", q.peer_source,
                    fmt.count(q.calls), fmt.count(q.sends), fmt.count(q.recvs),
                    "-" if q.send_bytes is None else fmt.data_bytes(q.send_bytes),
                    "-" if q.recv_bytes is None else fmt.data_bytes(q.recv_bytes),
                    fmt.ms(q.time_ns), fmt.ms(q.send_ns), fmt.ms(q.recv_ns)]
                   for q in run.pipeline.pairs]


def markdown(report: Report, table, escape, link: str = "") -> list[str]:
    """The section's report.md lines (none without a ``pp`` run); ``table`` / ``escape`` are
    reports/markdown.py's; ``link``: the line linking to the section's definitions (the
    bubble rule, ``PAIR_NOTE``) in report.md's closing part."""
    pp = runs(report)
    if not pp:
        return []
    out = ["## Pipeline", ""]
    for r in pp:
        out += [escape(head_line(r)), "", table(*stage_rows(r)), ""]
        heads, rows = pair_rows(r)
        out += ["Send / recv between stages (per profiled step):", "",
                table(heads, rows) if rows else "No send / recv in the traces.", ""]
    return out + ([link, ""] if link else [])


def html(report: Report, table, e, measured=lambda: "") -> list[str]:
    """The section's report.html parts; ``table`` / ``e`` are reports/html.py's; ``measured()``:
    the disclosure holding the section's definitions."""
    pp = runs(report)
    if not pp:
        return []
    parts = ["<h2>Pipeline</h2>"]
    for r in pp:
        heads, rows = pair_rows(r)
        parts += [f"<p>{e(head_line(r))}</p>", table(*stage_rows(r)),
                  "<p>Send / recv between stages (per profiled step):</p>",
                  table(heads, rows) if rows else "<p>No send / recv in the traces.</p>"]
    return parts + [measured()]
