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
from reports import fmt, notes, palette
from reports import memory as memory_section
from reports import pipeline as pipeline_section
from reports import markdown as md_rows
from reports.decision import decision_input, decision_line
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
.withheld{color:#b00;font-weight:bold}svg{font-size:11px;background:#fff}code{background:#f3f3f3}"""


def e(v: Any) -> str:
    """Escape any value for HTML text or attribute context; bidirectional controls shown as
    their ``\\uXXXX`` escape (analyzer/contract/text.py)."""
    return html.escape(show_bidi(str(v)), quote=True)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _legend(items: list[tuple[str, str, float]], y: int) -> str:
    """Swatches (label, colour, opacity) in one row at ``y``."""
    out, x = [], 10
    for label, color, alpha in items:
        out.append(f'<rect x="{x}" y="{y}" width="10" height="10" fill="{color}" '
                   f'fill-opacity="{alpha}" stroke="#999"/><text x="{x + 14}" y="{y + 9}">{e(label)}</text>')
        x += 20 + 7 * len(label)
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
    h = 40 + len(rows) * (bar_h + 6) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{h}" role="img">'
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
    out.append(_legend(legend, h - 40))
    out.append("</svg>")
    return "".join(out)


def _colors(report: Report) -> dict[str, str]:
    """{run name: its strategy's colour} (reports/palette.py), for every plot."""
    return palette.run_colors([(r.name, r.strategy) for r in report.runs])


def _run_label(r: RunEntry) -> str:
    """A run's name in plots; the single-device run marked as the reference."""
    return f"{r.name} ({REFERENCE})" if r.strategy == "single" else r.name


def _legend_for(report: Report, parts: list[str]) -> list[tuple[str, str, float]]:
    """The report's strategies in their colours, then ``parts`` as shades (palette.legend)."""
    return palette.legend([r.strategy for r in report.runs], parts)


def step_time_bars(report: Report) -> str:
    """Median step time per run (the report's one step-time figure), in ranking order, the
    single-device run last and marked as the reference."""
    col = _colors(report)
    rows = [(f"{row[0]}. {row[1]}" if row[0] not in ("-", REFERENCE) else
             f"{row[1]} ({REFERENCE})" if row[0] == REFERENCE else row[1],
             [("median step time", r.step_time_ns.median or 0, col[r.name], 1.0)])
            for row in md_rows.ranking_rows(report)[1]
            for r in report.runs if r.name == row[1]]
    return _hbars("Median step time (ranking; the reference is not ranked)", rows, "ms", 1e6,
                  _legend_for(report, []))


def step_bars(report: Report) -> str:
    """Per run and step: compute / exposed communication / data wait / other / idle (mean over
    ranks), in the run's strategy colour, one shade per part; no total (the step time shown
    is the median under Ranking)."""
    col = _colors(report)
    rows = [(f"{_run_label(r)} step {s.step}",
             [(LABELS[k], getattr(s, k) or 0, col[r.name], palette.SHADES[LABELS[k]]) for k in LABELS])
            for r in report.runs for s in r.steps]
    return _hbars("Where the time of a step goes (per rank, mean over ranks)", rows, "ms", 1e6,
                  _legend_for(report, list(LABELS.values())), totals=False)


def comm_bars(report: Report) -> str:
    """Per run, rank and collective kind: transfer and waiting for the slowest rank, per
    profiled step, in the run's strategy colour (waiting lighter)."""
    col = _colors(report)
    rows = [(f"{r.name} rank {c.rank} {c.kind}",
             [("transfer", c.transfer_ns_per_step or 0, col[r.name], palette.SHADES["transfer"]),
              ("wait", c.wait_ns_per_step or 0, col[r.name], palette.SHADES["wait"])])
            for r in report.runs for c in r.comm_ranks]
    return _hbars("Communication per profiled step: transfer and waiting for the slowest rank",
                  rows, "ms", 1e6, _legend_for(report, ["transfer", "wait"]))


def mesh_dim_bars(report: Report) -> str:
    """One plot per mesh dimension (``markdown.mesh_runs``' runs): per run, the dimension's
    communication per profiled step (per rank, mean over the ranks that ran it): its exposed
    part and the part computation overlaps, in the run's strategy colour."""
    col = _colors(report)
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
                          _legend_for(report, ["exposed communication",
                                               "overlapped communication"])))
    return "".join(out)


def timeline_svg(run: RunEntry, color: str = palette.STRATEGY_COLORS["ddp"]) -> str:
    """One step of one rank: compute and communication lanes, in the run's strategy colour
    ``color`` (communication lighter)."""
    tl = run.timeline
    if not tl or not tl.intervals:
        return ""
    width, left = 900, 120
    span = max(tl.step_ns, max(i.end_ns for i in tl.intervals), 1)
    sx = (width - left - 20) / span
    title = f"{_run_label(run)}: rank {tl.rank}, step {tl.step}"
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="110" role="img">'
           f'<title>{e(title)}</title><text x="10" y="15" font-weight="bold">{e(title)}</text>']
    for lane, y, alpha in (("compute", 30, palette.SHADES["compute"]),
                           ("comm", 60, palette.SHADES["communication"])):
        out.append(f'<text x="10" y="{y + 13}">{e(lane)}</text>')
        for iv in tl.intervals:
            if iv.lane != lane:
                continue
            x = left + max(iv.start_ns, 0) * sx
            w = max((iv.end_ns - max(iv.start_ns, 0)) * sx, 0.5)
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="20" fill="{color}" '
                       f'fill-opacity="{alpha}"><title>{e(iv.kind or lane)} '
                       f'{fmt.ms(iv.end_ns - iv.start_ns)}</title></rect>')
    out.append(f'<text x="{left}" y="100">0</text><text x="{width - 80}" y="100">{e(fmt.ms(span))}</text>')
    out.append("</svg>")
    return "".join(out)


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

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img">'
           '<title>loss per step</title>',
           f'<text x="10" y="{top}">{e(fmt.num(y1, ".6g"))}</text>',
           f'<text x="10" y="{height - bottom}">{e(fmt.num(y0, ".6g"))}</text>',
           f'<text x="{left}" y="{height - 10}">step {x0}</text>',
           f'<text x="{width - 200}" y="{height - 10}">step {x1}</text>']
    col = _colors(report)
    for k, r in enumerate(runs):
        color = col[r.name]
        curve = [s for s in r.parity.loss_curve if math.isfinite(s.loss) and math.isfinite(s.ref)]
        for attr, dash in (("loss", ""), ("ref", ' stroke-dasharray="4 3"')):
            pts = " ".join(xy(s.step, getattr(s, attr)) for s in curve)
            out.append(f'<polyline points="{pts}" fill="none" stroke="{color}"{dash}>'
                       f'<title>{e(_run_label(r))} {"baseline" if attr == "ref" else "loss"}</title>'
                       "</polyline>")
        out.append(f'<text x="{width - 150}" y="{top + 16 * k}" fill="{color}">{e(_run_label(r))}</text>')
    out.append("</svg>")
    return "".join(out)


def render(report: Report, out_dir: Path | str | None = None) -> str:
    """The whole report.html text, in report.md's order (reports/markdown.py ``render``), with
    plots in one colour per strategy (reports/palette.py); ``out_dir``: the folder it is
    written to (trace links are relative to it; absolute ``file:`` URLs when None)."""
    runs = report.runs
    rk = report.ranking
    col = _colors(report)
    parts = ["<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
             "<title>paritytrace report</title>", f"<style>{CSS}</style></head><body>",
             "<h1>paritytrace report</h1>",
             f'<p class="decision">Decision: {e(decision_line(decision_input(report)))}</p>',
             "<ul>" + "".join(f"<li>{e(s)}</li>" for s in verdict(report)) + "</ul>"]
    parts += ["<h2>Parity</h2>", _table(*md_rows.parity_rows(report)),
              f"<p>{e(md_rows.PARITY_RULE)}</p>"]
    heads, rows = md_rows.loss_rows(report)
    if rows:
        parts += ["<h3>Loss per step</h3>", loss_svg(report),
                  "<p>Solid: the run's loss; dashed, same colour: the baseline's.</p>",
                  _table(heads, rows), f"<p>{e(md_rows.LOSS_NOTE)}</p>"]
    parts += memory_section.html(report, _table, _hbars, e)
    heads, rows = md_rows.comm_split_rows(report)
    parts += ["<h2>Communication</h2>",
              "<h3>Transfer and waiting for the slowest rank (per rank, mean per profiled step)</h3>",
              _table(heads, rows) if rows else "<p>No collectives found.</p>", comm_bars(report),
              f"<p>{e(md_rows.SPLIT_NOTE)}</p>"]
    heads, rows = md_rows.comm_kind_rows(report)
    if rows:
        parts += ["<h3>By collective kind (per rank, mean per profiled step)</h3>",
                  _table(heads, rows), f"<p>{e(md_rows.BUSBW_NOTE)}</p>"]
    groups = comm_group_rows(report)
    if groups:
        parts += ["<h3>By process group and dtype (per rank, all profiled steps)</h3>",
                  _table(COMM_GROUP_HEADERS, groups), f"<p>{e(notes.COMM_GROUPS)}</p>"]
    heads, rows = md_rows.mesh_dim_rows(report)
    if rows:
        parts += ["<h3>Communication per mesh dimension (per rank, all profiled steps)</h3>",
                  _table(heads, rows), mesh_dim_bars(report), f"<p>{e(md_rows.MESH_DIM_NOTE)}</p>"]
    parts.append("<h2>Ranking by step time</h2>")
    if rk.status != "ranked":
        parts.append(f'<p class="withheld">Withheld. {e(rk.reason)}</p>')
    parts.append(_table(*md_rows.ranking_rows(report)))
    if rk.pairs:
        parts.append("<ul>" + "".join(f"<li>{e(p.sentence)}</li>" for p in rk.pairs) + "</ul>")
    parts += [step_time_bars(report),
              f"<p>{e(notes.STEP_TIME)}</p>",
              f"<p>Step-time source: {e('; '.join(notes.step_sources(runs)))}.</p>",
              f"<p>Rule: {e(rk.rule)}</p>"]
    parts += ["<h2>Time per step (per rank, mean per profiled step)</h2>",
              _table(*comparison_rows(report)),
              f"<p>{e(notes.windows(runs))} {e(md_rows.COMPARISON_NOTE)}</p>", step_bars(report)]
    parts += [timeline_svg(r, col[r.name]) for r in runs]
    heads, rows = md_rows.rank_rows(report)
    parts += ["<h2>Time per rank (mean per step)</h2>",
              _table(heads, rows) if rows else "<p>No traces.</p>",
              f"<p>{e(notes.CLOCK_OFFSET)}</p>", f"<p>{e(md_rows.IDENTITY_NOTE + notes.OTHER_IDLE)}</p>"]
    parts += pipeline_section.html(report, _table, e)
    pf = [r for r in runs if r.prefetch]
    if pf:
        parts.append("<h2>FSDP prefetch</h2>")
        for r in pf:
            parts.append(f"<h3>{e(r.name)}</h3><p>{e(notes.prefetch_sentence(r))}</p>")
            parts.append(_table(*md_rows.prefetch_rows(r)))
            if r.prefetch.note:
                parts.append(f"<p>{e(r.prefetch.note)}</p>")
        for group in report.prefetch_comparisons:
            parts += ["<p>Prefetch settings side by side (runs differ only in them):</p>",
                      _table(*md_rows.prefetch_group_rows(report, group))]
        parts.append(f"<p>{e(notes.UNIT_NAMES)}</p><p>{e(notes.SLACK)}</p>")
    parts += ["<h2>Recorded settings</h2>", _table(*md_rows.settings_rows(report))]
    bd = report.baseline_drift
    if bd:
        parts += ["<h2>Baseline drift</h2>",
                  f"<p>{e(bd.note[0].upper() + bd.note[1:])}. Reference: {e(bd.reference)}.</p>",
                  _table(*md_rows.drift_rows(report)),
                  "<p>Per-tensor figures: <code>analyzer drift REFERENCE RUN</code>.</p>"]
    parts += [f"<p>Note: {e(w)}</p>" for w in report.warnings]
    parts.append(f"<h2>Trace files</h2><p>Each is a Chrome trace; {e(PERFETTO_HINT)}.</p><ul>")
    parts += [f'<li>{e(r.name)}: <a href="{e(trace_href(t, out_dir))}">{e(t)}</a></li>'
              for r in runs for t in r.traces]
    parts.append("</ul>")
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
