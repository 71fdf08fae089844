"""report.html: one self-contained file (inline CSS and SVG, no script, no external resource).

Every string that comes from a trace, a manifest or a path goes through ``html.escape``. The
tables are report.md's, row for row (reports/markdown.py ``*_rows``); trace links are relative
to the report's folder, so the report and its traces can be moved or served together.
"""

from __future__ import annotations

import html
import math
import os
from pathlib import Path
from urllib.parse import quote
from typing import Any

from analyzer.contract.report_types import Report, RunEntry
from analyzer.contract.text import show_bidi
from reports import armdiff, context
from reports import findings as findings_text
from reports import fmt, notes, palette
from reports import hangs as hangs_section
from reports import memory as memory_section
from reports import pipeline as pipeline_section
from reports import projection as projection_section
from reports import markdown as md_rows
from reports.decision import decision_input, decision_line, projected_lines
from reports.palette import run_label
from reports.markdown import (COMM_GROUP_HEADERS, PERFETTO_HINT, REFERENCE, comm_group_rows,
                              comparison_rows)
from reports.verdict import verdict

LABELS = {"compute_ns": "compute", "exposed_comm_ns": "exposed communication",
          "data_wait_ns": "data wait", "other_ns": "other", "idle_ns": "idle"}
"""Parts of a step bar; each drawn in the run's strategy colour at its shade
(reports/palette.py ``SHADES``)."""
CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}
th{background:#f3f3f3}.decision{font-size:17px;font-weight:bold;background:#f7f7ff;padding:1em;border-left:4px solid #4e79a7}
.withheld{color:#b00;font-weight:bold}svg{font-size:11px;background:#fff;display:block;margin:.5em 0}
code{background:#f3f3f3}h1{margin:.2em 0;font-size:24px}.decision{margin:.4em 0}
.findings{font-size:14px;margin:.4em 0}.findings ol{margin:.2em 0;padding-left:1.6em}.findings li{margin:.15em 0}
.findings p{margin:.3em 0;font-weight:bold}.verdict{font-size:13px}
.context{font-size:13px;margin:.3em 0}.context p{margin:.2em 0;font-weight:bold}.context ul{margin:.1em 0}
details.measured{margin:.3em 0 1em;font-size:13px;color:#444}details.measured summary{cursor:pointer;color:#4e79a7}"""


def e(v: Any) -> str:
    """Escape any value for HTML text or attribute context; bidirectional controls shown as
    their ``\\uXXXX`` escape (analyzer/contract/text.py)."""
    return html.escape(show_bidi(str(v)), quote=True)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend_places(items: list[tuple[str, str, float]], width: int = 900
                   ) -> list[tuple[float, int]]:
    """(x, row) of each swatch: left to right, a new row where the next would pass ``width``."""
    out, x, row = [], 10, 0
    for label, _, _ in items:
        w = 20 + 7 * len(label)
        if x + w > width and x > 10:
            x, row = 10, row + 1
        out.append((x, row))
        x += w
    return out


def legend_rows(items: list[tuple[str, str, float]], width: int = 900) -> int:
    """How many rows ``_legend`` takes."""
    return 1 + max((r for _, r in _legend_places(items, width)), default=0)


def _legend(items: list[tuple[str, str, float]], y: int, width: int = 900) -> str:
    """Swatches (label, colour, opacity) from ``y`` down, wrapped at ``width`` (16 px a row)."""
    out = []
    for (label, color, alpha), (x, row) in zip(items, _legend_places(items, width)):
        yy = y + 16 * row
        out.append(f'<rect x="{x}" y="{yy}" width="10" height="10" fill="{color}" '
                   f'fill-opacity="{alpha}" stroke="#999"/><text x="{x + 14}" y="{yy + 9}">{e(label)}</text>')
    return "".join(out)


Part = tuple[str, float, str, float]
"""One segment of a bar: (part name, value, colour, opacity)."""


def _hbars(title: str, rows: list[tuple[str, list[Part]]], unit: str, scale_div: float,
           legend: list[tuple[str, str, float]], *, totals: bool = True) -> str:
    """Horizontal stacked bars: rows of (label, parts); a total after each bar when
    ``totals``; ``legend`` swatches under the plot."""
    if not rows:
        return ""
    width, left, bar_h = 900, 220, 16
    top = max((sum(v for _, v, _, _ in parts) for _, parts in rows), default=0) or 1
    h = 40 + len(rows) * (bar_h + 6) + 34 + 16 * legend_rows(legend, width)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img" '
           f'class="plot">'
           f'<title>{e(title)}</title><text x="10" y="15" font-weight="bold">{e(title)}</text>']
    for i, (label, parts) in enumerate(rows):
        y = 28 + i * (bar_h + 6)
        out.append(f'<text x="10" y="{y + 12}">{e(label)}</text>')
        x = float(left)
        total = 0.0
        for part, v, color, alpha in parts:
            w = (width - left - 90) * v / top
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar_h}" '
                           f'fill="{color}" fill-opacity="{alpha}" stroke="{color}">'
                           f'<title>{e(label)} {e(part)}: {v / scale_div:.3f} {e(unit)}</title></rect>')
            x += w
            total += v
        if totals:
            out.append(f'<text x="{x + 4:.1f}" y="{y + 12}">{total / scale_div:.2f} {e(unit)}</text>')
    out.append(_legend(legend, h - 24 - 16 * legend_rows(legend, width) + 10))
    out.append("</svg>")
    return "".join(out)


def step_time_bars(report: Report) -> str:
    """Median step time per run (the report's one step-time figure), in ranking order, the
    single-device run last and marked as the reference."""
    col = palette.run_colors(report.runs)
    rows = [(f"{row[0]}. {row[1]}" if row[0] not in ("-", REFERENCE) else run_label(r),
             [("median step time", r.step_time_ns.median or 0, col[r.name], 1.0)])
            for row in md_rows.ranking_rows(report)[1]
            for r in report.runs if r.name == row[1]]
    return _hbars("Median step time (ranking; the reference is not ranked)", rows, "ms", 1e6,
                  palette.legend(report.runs, []))


def step_bars(report: Report) -> str:
    """Per run and step: compute / exposed communication / data wait / other / idle (mean over
    ranks), in the run's strategy colour, one shade per part; no total (the step time shown
    is the median under Ranking)."""
    col = palette.run_colors(report.runs)
    rows = [(f"{run_label(r)} step {s.step}",
             [(LABELS[k], getattr(s, k) or 0, col[r.name], palette.SHADES[LABELS[k]]) for k in LABELS])
            for r in report.runs for s in r.steps]
    return _hbars("Where the time of a step goes (per rank, mean over ranks)", rows, "ms", 1e6,
                  palette.legend(report.runs, list(LABELS.values())), totals=False)


def comm_bars(report: Report) -> str:
    """Per run, rank and collective kind: transfer and waiting for the slowest rank, per
    profiled step, in the run's strategy colour (waiting lighter)."""
    col = palette.run_colors(report.runs)
    rows = [(f"{r.name} rank {c.rank} {c.kind}",
             [("transfer", c.transfer_ns_per_step or 0, col[r.name], palette.SHADES["transfer"]),
              ("wait", c.wait_ns_per_step or 0, col[r.name], palette.SHADES["wait"])])
            for r in report.runs for c in r.comm_ranks]
    return _hbars("Communication per profiled step: transfer and waiting for the slowest rank",
                  rows, "ms", 1e6, palette.legend(report.runs, ["transfer", "wait"]))


def mesh_dim_bars(report: Report) -> str:
    """One plot per mesh dimension (``markdown.mesh_runs``' runs): per run, the dimension's
    communication per profiled step (per rank, mean over the ranks that ran it): its exposed
    part and the part computation overlaps, in the run's strategy colour."""
    col = palette.run_colors(report.runs)
    runs = md_rows.mesh_runs(report)
    names = list(dict.fromkeys(d.name for r in runs for d in r.mesh_dims))
    out = []
    for name in names:
        rows = []
        for r in runs:
            for d in r.mesh_dims:
                if d.name != name:
                    continue
                union, exposed = d.union_ns_per_step or 0, d.exposed_ns_per_step or 0
                rows.append((f"{r.name} {d.name}",
                             [("exposed communication", exposed, col[r.name],
                               palette.SHADES["exposed communication"]),
                              ("overlapped communication", max(union - exposed, 0), col[r.name],
                               palette.SHADES["overlapped communication"])]))
        out.append(_hbars(f"Mesh dimension {name}: communication per profiled step (union), "
                          "exposed and overlapped", rows, "ms", 1e6,
                          palette.legend(report.runs, ["exposed communication",
                                                       "overlapped communication"])))
    return "".join(out)


def _gaps(ivs: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """[lo, hi) minus the union of ``ivs``: a rank's idle time in its step window."""
    out, at = [], lo
    for s, t in sorted(ivs):
        if s > at:
            out.append((at, min(s, hi)))
        at = max(at, t)
        if at >= hi:
            break
    if at < hi:
        out.append((at, hi))
    return [(a, b) for a, b in out if b > a]


def rank_timelines(run: RunEntry) -> list:
    """The run's per-rank timelines (``RunEntry.rank_timelines``); an older report.json's one
    rank (``timeline``) where it has none."""
    if run.rank_timelines:
        return run.rank_timelines
    return [run.timeline] if run.timeline and run.timeline.intervals else []


def timeline_svg(run: RunEntry, color: str) -> str:
    """One profiled step of every rank (``rank_timelines``), ranks stacked on one time axis
    (aligned clocks: each rank's step placed at its ``start_ns``), each with a compute lane, a
    lane per collective kind and an idle lane (the step window covered by neither), in the
    run's strategy colour ``color`` at each lane's shade (reports/palette.py ``SHADES``)."""
    tls = rank_timelines(run)
    if not tls:
        return ""
    kinds = sorted({iv.kind or "communication" for tl in tls for iv in tl.intervals
                    if iv.lane == "comm"})
    lanes = [("compute", "compute")] + [(k, "communication") for k in kinds] + [("idle", "idle")]
    width, left, lane_h, gap = 900, 170, 11, 8
    span = max(max(tl.start_ns + max(tl.step_ns, max((i.end_ns for i in tl.intervals), default=0))
                   for tl in tls), 1)
    sx = (width - left - 20) / span
    block = len(lanes) * (lane_h + 2) + gap
    legend = [(run.strategy, color, 1.0)] + [(f"shade: {p}", palette.SHADE_SWATCH, palette.SHADES[p])
                                             for p in ("compute", "communication", "idle")]
    h = 30 + len(tls) * block + 30 + 16 * legend_rows(legend, width)
    step = tls[0].step
    title = (f"{run_label(run)}: step {step} on every rank (aligned clocks), lanes compute / "
             "communication by kind / idle")
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img" '
           f'class="plot timeline"><title>{e(title)}</title>'
           f'<text x="10" y="15" font-weight="bold">{e(title)}</text>']
    for n, tl in enumerate(tls):
        y0 = 28 + n * block
        busy = [(tl.start_ns + i.start_ns, tl.start_ns + i.end_ns) for i in tl.intervals]
        spans = {"compute": [], "idle": _gaps(busy, tl.start_ns, tl.start_ns + tl.step_ns)}
        for iv in tl.intervals:
            key = "compute" if iv.lane == "compute" else iv.kind or "communication"
            spans.setdefault(key, []).append((tl.start_ns + iv.start_ns, tl.start_ns + iv.end_ns))
        for j, (lane, shade) in enumerate(lanes):
            y = y0 + j * (lane_h + 2)
            label = f"rank {tl.rank} {lane}" if j == 0 else lane
            out.append(f'<text x="10" y="{y + 9}">{e(label)}</text>')
            for a, b in spans.get(lane, []):
                x = left + max(a, 0) * sx
                w = max((b - max(a, 0)) * sx, 0.5)
                edge = (f' stroke="{color}" stroke-opacity="0.4" stroke-width="0.5"'
                        if lane == "idle" else "")
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_h}" '
                           f'fill="{color}" fill-opacity="{palette.SHADES[shade]}"{edge}>'
                           f'<title>{e(run.name)} rank {tl.rank} {e(lane)} '
                           f'{fmt.ms(b - a, ".3f")}</title></rect>')
    axis = 30 + len(tls) * block + 8
    out.append(f'<text x="{left}" y="{axis}">0</text><text x="{width - 90}" y="{axis}">'
               f'{e(fmt.ms(span))}</text>')
    out.append(_legend(legend, axis + 10))
    out.append("</svg>")
    return "".join(out)


def breakdown_bars(report: Report) -> str:
    """The time breakdown per strategy: one stacked bar per run -- compute, exposed
    communication, data wait, other, idle per profiled step (per rank, mean over its ranks:
    ``ranks[]``), adding up to the traced step -- in the run's strategy colour, one shade per
    part."""
    col = palette.run_colors(report.runs)
    rows = []
    for r in report.runs:
        if not r.ranks:
            continue
        n = len(r.ranks)
        rows.append((run_label(r), [(LABELS[k], sum(getattr(x, k) or 0 for x in r.ranks) / n,
                                      col[r.name], palette.SHADES[LABELS[k]]) for k in LABELS]))
    return _hbars("Time breakdown per strategy (per rank and profiled step, mean over ranks)",
                  rows, "ms", 1e6, palette.legend(report.runs, list(LABELS.values())))


def loss_svg(report: Report) -> str:
    """Loss curves: one line per run (its loss, mean over ranks) and, dashed in the same
    colour, the baseline's loss for the same steps; x = step, y = loss (linear)."""
    runs = [r for r in report.runs if r.parity.loss_curve]
    points = [(s.step, v) for r in runs for s in r.parity.loss_curve for v in (s.loss, s.ref)
              if math.isfinite(v)]
    if not points:
        return ""
    width, height, left, top, bottom = 900, 260, 70, 20, 40
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    sx = (width - left - 160) / max(x1 - x0, 1)
    sy = (height - top - bottom) / (y1 - y0 if y1 > y0 else 1.0)

    def xy(step: int, v: float) -> str:
        return f"{left + (step - x0) * sx:.1f},{height - bottom - (v - y0) * sy:.1f}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
           'class="plot">'
           '<title>loss per step</title>',
           f'<text x="10" y="{top}">{e(fmt.num(y1, ".6g"))}</text>',
           f'<text x="10" y="{height - bottom}">{e(fmt.num(y0, ".6g"))}</text>',
           f'<text x="{left}" y="{height - 10}">step {x0}</text>',
           f'<text x="{width - 200}" y="{height - 10}">step {x1}</text>']
    col = palette.run_colors(report.runs)
    for k, r in enumerate(runs):
        color = col[r.name]
        curve = [s for s in r.parity.loss_curve if math.isfinite(s.loss) and math.isfinite(s.ref)]
        for attr, dash in (("loss", ""), ("ref", ' stroke-dasharray="4 3"')):
            pts = " ".join(xy(s.step, getattr(s, attr)) for s in curve)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}"{dash}>'
                       f'<title>{e(run_label(r))} {"baseline" if attr == "ref" else "loss"}</title>'
                       "</polyline>")
        out.append(f'<text x="{width - 150}" y="{top + 16 * k}" fill="{color}">{e(run_label(r))}</text>')
    out.append("</svg>")
    return "".join(out)


def _details(defs) -> str:
    """A table's definitions behind one disclosure (closed; its summary names them)."""
    defs = [d for d in defs if d.paragraphs]
    if not defs:
        return ""
    body = "".join(f"<h4>{e(d.title)}</h4>" + "".join(f"<p>{e(p)}</p>" for p in d.paragraphs)
                   for d in defs)
    return (f'<details class="measured"><summary>How it is measured: '
            f'{e(", ".join(d.title for d in defs))}</summary>{body}</details>')


def first_screen(report: Report) -> list[str]:
    """The part above the fold (1400 x 900), as report.md's (reports/markdown.py
    ``first_screen``): the decision line, what differs between declared arms, the context, the
    findings to act on, one line each (reports/findings.py), the rest counted, then the
    verdict's details."""
    lines, rest = findings_text.first_screen(report)
    items = "".join(f"<li>{e(x)}</li>" for x in lines)
    ctx = context.lines(report)
    folded = (f'<p>{"Also" if lines else "Folded:"} {e(rest)}: '
              '<a href="#findings-in-full">Findings in full</a>.</p>' if rest else "")
    return [f'<p class="decision" id="decision">Decision: '
            f'{e(decision_line(decision_input(report)))}</p>',
            *[f'<p class="decision">Projected {e(line)}</p>' for line in projected_lines(report)],
            *([f'<section id="arm-differences" class="context"><p>{e(md_rows.DIFFERS)}</p><ul>'
               + "".join(f"<li>{e(x)}</li>" for x in diff) + "</ul></section>"]
              if (diff := armdiff.lines(report)) else []),
            *(['<section id="context" class="context"><p>Context:</p><ul>'
               + "".join(f"<li>{e(x)}</li>" for x in ctx) + "</ul></section>"] if ctx else []),
            f'<section id="findings" class="findings"><p>{e(findings_text.head(report))}</p>'
            + (f"<ol>{items}</ol>" if items else "") + folded + "</section>",

            '<ul class="verdict">' + "".join(f"<li>{e(s)}</li>" for s in verdict(report)) + "</ul>"]


def render(report: Report, out_dir: Path | str | None = None) -> str:
    """The whole report.html text, in report.md's order (reports/markdown.py ``render``): the
    first screen (decision, top findings), then the sections, each table's definitions behind
    a disclosure under it, plots in one colour per strategy and one shade per category
    (reports/palette.py); ``out_dir``: the folder it is written to (trace links are relative
    to it; absolute ``file:`` URLs when None). Long because it lays out the report's sections
    in reading order, a few lines each: read whole, the order can be checked against
    report.md's."""
    runs = report.runs
    rk = report.ranking
    col = palette.run_colors(report.runs)
    defs = md_rows.definitions(report)

    def measured(*keys: str) -> str:
        return _details([defs[k] for k in keys])

    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>paritytrace report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>paritytrace report</h1>", *first_screen(report)]
    parts += hangs_section.html(report, _table, e)  # issue 30: a hung record's cause first
    parts += ["<h2>Parity</h2>", _table(*md_rows.parity_rows(report)), measured("parity")]
    heads, rows = md_rows.loss_rows(report)
    if rows:
        parts += ["<h3>Loss per step</h3>", loss_svg(report),
                  "<p>Solid: the run's loss; dashed, same colour: the baseline's.</p>",
                  _table(heads, rows), measured("loss")]
    parts += memory_section.html(report, _table, _hbars, e, measured)
    heads, rows = md_rows.comm_split_rows(report)
    fake = notes.projection_times(runs)
    parts += ["<h2>Communication</h2>", *([f"<p>{e(fake)}</p>"] if fake else []),
              "<h3>Transfer and waiting for the slowest rank (per rank, mean per profiled step)</h3>",
              _table(heads, rows) if rows else "<p>No collectives found.</p>", comm_bars(report),
              measured("split")]
    heads, rows = md_rows.comm_kind_rows(report)
    if rows:
        parts += ["<h3>By collective kind (per rank, mean per profiled step)</h3>",
                  _table(heads, rows), measured("busbw")]
    groups = comm_group_rows(report)
    if groups:
        parts += ["<h3>By process group and dtype (per rank, all profiled steps)</h3>",
                  _table(COMM_GROUP_HEADERS, groups), measured("groups")]
    heads, rows = md_rows.mesh_dim_rows(report)
    if rows:
        parts += ["<h3>Communication per mesh dimension (per rank, all profiled steps)</h3>",
                  _table(heads, rows), mesh_dim_bars(report), measured("mesh")]
    parts.append("<h2>Ranking by step time</h2>")
    if rk.status != "ranked":
        parts.append(f'<p class="withheld">Withheld. {e(rk.reason)}</p>')
    parts.append(_table(*md_rows.ranking_rows(report)))
    if rk.pairs:
        parts.append("<ul>" + "".join(f"<li>{e(p.sentence)}</li>" for p in rk.pairs) + "</ul>")
    parts += [step_time_bars(report),
              *projection_section.html(report, _table, e),
              f"<p>Step-time source: {e('; '.join(notes.step_sources([r for r in runs if r.projection is None])))}.</p>",
              measured("step_time", "speedup", "ranking")]
    parts += ["<h2>Time per step (per rank, mean per profiled step)</h2>",
              _table(*comparison_rows(report)), *([f"<p>{e(fake)}</p>"] if fake else []),
              breakdown_bars(report), step_bars(report), measured("windows")]
    heads, rows = md_rows.rank_rows(report)
    parts += ["<h2>Time per rank (mean per step)</h2>",
              _table(heads, rows) if rows else "<p>No traces.</p>",
              *[timeline_svg(r, col[r.name]) for r in runs],
              measured("clock", "identity")]
    parts += pipeline_section.html(report, _table, e, lambda: measured("bubble", "pairs"))
    pf = [r for r in runs if r.prefetch and r.projection is None]  # fake all_gathers
    if pf:
        parts.append("<h2>FSDP prefetch</h2>")
        for r in pf:
            parts.append(f"<h3>{e(r.name)}</h3><p>{e(notes.prefetch_sentence(r))}</p>")
            parts.append(_table(*md_rows.prefetch_rows(r)))
        for group in report.prefetch_comparisons:
            parts += ["<p>Prefetch settings side by side (runs differ only in them):</p>",
                      _table(*md_rows.prefetch_group_rows(report, group))]
        parts.append(measured("prefetch_cpu", "units", "slack"))
    parts += ["<h2>Recorded settings</h2>", _table(*md_rows.settings_rows(report))]
    bd = report.baseline_drift
    if bd and not bd.comparisons:  # declared arms, each checked against its own baseline
        parts += ["<h2>Baseline drift</h2>", f"<p>{e(bd.note[0].upper() + bd.note[1:])}.</p>"]
    elif bd:
        parts += ["<h2>Baseline drift</h2>",
                  f"<p>{e(bd.note[0].upper() + bd.note[1:])}. Reference: {e(bd.reference)}.</p>",
                  _table(*md_rows.drift_rows(report)),
                  "<p>Per-tensor figures: <code>analyzer drift REFERENCE RUN</code>.</p>"]
    parts += [f"<p>Note: {e(w)}</p>" for w in report.warnings]
    caveats = [f"<li>{e(r.name)}: {e(c)}</li>" for r in runs for c in r.caveats]
    if caveats:
        parts += ['<h2 id="caveats">Caveats</h2><ul>', *caveats, "</ul>"]
    parts.append(f"<h2>Trace files</h2><p>Each is a Chrome trace; {e(PERFETTO_HINT)}.</p><ul>")
    parts += [f'<li>{e(r.name)}: <a href="{e(trace_href(t, out_dir))}">{e(t)}</a></li>'
              for r in runs for t in r.traces]
    parts.append("</ul>")
    found = findings_text.ordered(report)
    if found:
        parts.append('<h2 id="findings-in-full">Findings in full</h2><ol>')
        for f in found:
            first, *rest = findings_text.full(f)
            parts.append(f"<li>{e(first)}<ul>" + "".join(f"<li>{e(x)}</li>" for x in rest)
                         + "</ul></li>")
        parts.append("</ol>")
    parts.append("</body></html>")
    return "\n".join(parts)


def trace_href(path: str, out_dir: Path | str | None) -> str:
    """The link to a trace: its path relative to ``out_dir`` (the report's folder), percent-
    encoded (RFC 3986: a space, ``#`` or ``?`` in a name stays part of the path), so the
    link works wherever the folders are moved or served from together; a ``file:`` URL of the
    absolute path when ``out_dir`` is None (a relative ``file://traces/...`` would name a host)."""
    if out_dir is None:
        return Path(path).absolute().as_uri()
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(out_dir))
    return quote(Path(rel).as_posix(), safe="/")
