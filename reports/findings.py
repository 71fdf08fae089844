"""The findings on the report's first screen (issue 28): ``Report.findings`` (analyzer/analyses/
findings.py), most severe first, each one line -- what, the step time at stake, its evidence
(figures with units), its cause or "cause not established", the action to try -- and, later,
each finding's evidence with its place in report.json and the rule behind its cause. Pure
functions of the report; plain text (the renderers escape it)."""

from __future__ import annotations

from analyzer.contract.report_types import CAUSE_THRESHOLD, Evidence, Finding, Report
from reports import fmt

TOP = 3
"""Findings to act on (a cause or a "try") shown on the first screen; the rest are counted there
and listed under "Findings in full"."""
NO_CAUSE = "cause not established"
KIND_LABELS = {"parity_failed": "parity failed", "straggler": "straggler",
               "exposed_communication": "exposed communication", "prefetch_late": "prefetch late",
               "input_bound": "input-bound", "host_bound": "host-bound",
               "imbalance": "imbalance across ranks", "memory_does_not_fit": "memory does not fit",
               "low_busbw": "low busbw", "mesh_dimension": "mesh dimension", "hang": "hang",
               "pipeline_bubble": "pipeline bubble"}


def ordered(report: Report) -> list[Finding]:
    """The findings: hangs first, then by severity (step time at stake), largest first; those
    without one last, in the analysis' order."""
    return sorted(report.findings, key=lambda f: (f.kind != "hang", -(f.severity_ns or 0.0)
                  if f.severity_ns is not None else float("inf")))


def established(f: Finding) -> bool:
    """A cause explains at least ``CAUSE_THRESHOLD`` of the effect (or needs no share: a hang)."""
    return bool(f.cause) and (f.explained_frac is None or f.explained_frac >= CAUSE_THRESHOLD)


def to_act_on(f: Finding) -> bool:
    """A finding the first screen shows: one with an established cause or an action to try."""
    return established(f) or bool(f.action)


def value(ev: Evidence) -> str:
    """One evidence figure in display units (``fmt.figure``)."""
    return fmt.figure(ev.value, ev.unit)


FIRST_SCREEN_EVIDENCE = 3
"""Evidence figures a first-screen line shows; every figure is under "Findings in full"."""


def evidence(f: Finding, limit: int | None = None) -> str:
    """``exposed communication 3.20 ms, overlap 12.0 %``: the figures a finding rests on (the
    first ``limit`` of them, and how many more, when given)."""
    shown = f.evidence if limit is None else f.evidence[:limit]
    more = len(f.evidence) - len(shown)
    text = ", ".join(f"{ev.figure} {value(ev)}" for ev in shown) or "no figure"
    return text + (f" (+{more} more in full)" if more else "")


def cause(f: Finding) -> str:
    """``cause: host-side delay (explains 86 %)`` or ``cause not established``: a cause is
    named only when it explains at least ``CAUSE_THRESHOLD`` of the effect."""
    if established(f):
        share = f" (explains {fmt.pct(f.explained_frac)})" if f.explained_frac is not None else ""
        return f"cause: {f.cause}{share}"
    return NO_CAUSE


def stake(f: Finding) -> str:
    """``3.20 ms/step at stake``; a hang without a step: ``the run does not finish``; else
    ``stake not measured``."""
    if f.severity_ns is None:
        return "the run does not finish" if f.kind == "hang" else "stake not measured"
    return f"{fmt.ms(f.severity_ns)}/step at stake"


def line(f: Finding) -> str:
    """The finding's one line: ``straggler (4.20 ms/step at stake): <title>; evidence: ...;
    cause ...; try: ...``."""
    title = f.title.removesuffix(f": {NO_CAUSE}").removesuffix(f" ({NO_CAUSE})")  # said once, below
    text = (f"{KIND_LABELS.get(f.kind, f.kind)} ({stake(f)}): {title}; evidence: "
            f"{evidence(f, FIRST_SCREEN_EVIDENCE)}; {cause(f)}")
    return text + (f"; try: {f.action}" if f.action else "")


def first_screen(report: Report) -> tuple[list[str], str | None]:
    """(the lines of the first ``TOP`` findings to act on, in ``ordered`` order; the line that
    counts the rest, None when nothing is left out)."""
    found = ordered(report)
    act = [f for f in found if to_act_on(f)]
    shown = act[:TOP]
    more = len(act) - len(shown)
    observed = [f for f in found if not to_act_on(f)]
    parts = ([f"{more} more with a cause or a try"] if more else [])
    if observed:  # the largest at stake is named: a folded finding may outweigh those shown
        top = observed[0]
        parts.append(f"{len(observed)} observation{'s' if len(observed) > 1 else ''} without "
                     "an established cause" + (
                         f" (largest: {KIND_LABELS.get(top.kind, top.kind)} in "
                         f"{', '.join(top.runs)}, {stake(top)})"
                         if top.severity_ns is not None and top.runs else ""))
    return [line(f) for f in shown], " and ".join(parts) or None


def head(report: Report) -> str:
    """The line over the list."""
    n = len(report.findings)
    if not n:
        return "Findings: none drawn from these figures."
    act = sum(map(to_act_on, report.findings))
    if not act:
        return (f"Findings: {n}, none with an established cause or an action to try.")
    return (f"Findings to act on, most step time at stake first ({act} of {n} have a cause "
            f"that explains at least {fmt.pct(CAUSE_THRESHOLD)} of the effect or an action to "
            "try):")


def full(f: Finding) -> list[str]:
    """A finding in full: its line, what it concerns, each evidence figure with its JSON
    pointer in report.json, the cause's rule."""
    about = "; ".join(p for p in (
        f"runs {', '.join(f.runs)}" if f.runs else "",
        f"ranks {', '.join(str(r) for r in f.ranks)}" if f.ranks else "",
        f"units {', '.join(f.units)}" if f.units else "",
        f"mesh dimensions {', '.join(f.mesh_dims)}" if f.mesh_dims else "") if p)
    out = [line(f)]
    if about:
        out.append(f"concerns: {about}")
    out += [f"{ev.figure} = {value(ev)}: report.json {ev.path or '(no pointer)'}" for ev in f.evidence]
    if f.cause_rule:
        share = f", explains {fmt.pct(f.explained_frac)}" if f.explained_frac is not None else ""
        out.append(f"rule: {f.cause_rule}{share}")
    return out
