"""The "Hangs (Flight Recorder)" section: per run with Flight Recorder dumps (issue 30), the line
naming who never entered which collective, then one row per process group. Placed right after
the first screen: when a record hung, it is the first thing to read. Pure function of the
report; the escaping and table functions are the caller's (markdown or HTML)."""

from __future__ import annotations

from typing import Any

from analyzer.contract.report_types import FlightRecorderGroup, Report, RunEntry

TITLE = "Hangs (Flight Recorder)"
HEADERS = ["run", "process group", "ranks", "last completed by every dumped rank", "never entered",
           "waited in it", "each rank: last entered / completed", "mismatch",
           "send / recv never matched"]


def runs(report: Report) -> list[RunEntry]:
    """The runs whose Flight Recorder dumps were read."""
    return [r for r in report.runs if r.flight_recorder is not None]


def lines(run: RunEntry) -> list[str]:
    """The statements of the run's groups that have a verdict (a rank never entered or did not
    complete a collective, a mismatch, a never-matched send / recv), prefixed by the run's
    name; every group's summary when none has one."""
    fr = run.flight_recorder
    bad = [g.statement for g in fr.groups if g.verdict]
    return [f"{run.name}: {x}" for x in (bad or [g.summary for g in fr.groups])]


def _missing(run: RunEntry, g: FlightRecorderGroup) -> str:
    """The group's members without a dump read: "1: no dump, unknown", "1: pickle, not read"."""
    pick = [r for r in g.missing_dumps if r in run.flight_recorder.pickled_ranks]
    none = [r for r in g.missing_dumps if r not in pick]
    return "; ".join([f"{', '.join(map(str, none))}: no dump, unknown"] * bool(none)
                     + [f"{', '.join(map(str, pick))}: pickle, not read"] * bool(pick))


def _row(run: RunEntry, g: FlightRecorderGroup) -> list[Any]:
    what = f"{g.next_kind or 'collective'} #{g.next_seq}" if g.next_seq is not None else "-"
    mism = "; ".join(f"{m.mismatch} at {m.kind} #{m.seq}: rank {m.rank} {m.detail}" for m in g.mismatches)
    return [run.name, f"{g.pg} ({g.desc})" if g.desc else g.pg, ", ".join(map(str, g.ranks)),
            "-" if g.last_completed_seq is None else f"#{g.last_completed_seq}" + (
                f" ({_missing(run, g)})"
                if g.missing_dumps else ""),
            f"{', '.join(map(str, g.never_entered))}: {what}" if g.never_entered else "-",
            ", ".join(map(str, g.entered)) or "-",
            "; ".join(f"{x.rank}: #{x.last_enqueued_seq} / #{x.last_completed_seq}"
                      + (f" (#{x.failed_seq} failed)" if x.failed_seq is not None else "") for x in g.per_rank),
            mism or "-",
            "; ".join(f"{x.rank} {x.op} #{x.p2p_seq} {'to' if x.op == 'send' else 'from'} {x.peer}"
                      for x in g.p2p_pending) or "-"]


def rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    return HEADERS, [_row(r, g) for r in runs(report) for g in r.flight_recorder.groups]


def _notes(report: Report) -> list[str]:
    out = []
    for r in runs(report):
        dumped = ", ".join(map(str, r.flight_recorder.ranks))
        out.append(" ".join([f"{r.name}: dumps of rank(s) {dumped}." if dumped else f"{r.name}: no JSON dump.",
                             *r.flight_recorder.notes]))
    if out:
        out.append("Rule: " + runs(report)[0].flight_recorder.rule + ".")
    return out


def markdown(report: Report, table, escape) -> list[str]:
    """The section's Markdown lines; [] when no run has dumps."""
    if not runs(report):
        return []
    out = [f"## {TITLE}", ""]
    bold = [f"- **{escape(x)}**" for r in runs(report) for x in lines(r)]
    out += bold + [""] if bold else []
    headers, body = rows(report)
    out += [table(headers, body), ""] if body else []  # dumps without entries: no group
    out += [escape(n) for n in _notes(report)] + [""]
    return out


def html(report: Report, table, e) -> list[str]:
    """The section's HTML parts; [] when no run has dumps."""
    if not runs(report):
        return []
    items = "".join(f"<li><strong>{e(x)}</strong></li>" for r in runs(report) for x in lines(r))
    headers, body = rows(report)
    return [f'<h2 id="hangs">{e(TITLE)}</h2>', *([f"<ul>{items}</ul>"] if items else []),
            *([table(headers, body)] if body else []), *(f"<p>{e(n)}</p>" for n in _notes(report))]
