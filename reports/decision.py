"""The one-line decision every output starts with (report.md, report.html, the terminal).

``decision_line(DecisionInput)`` is the interface: it takes the small input below and only
words it. ``decision_input(report)`` builds that input from the report's ranking: the fastest
ranked strategy against the runner-up, with the ratio, 95 % interval and decision of their
``ranking.pairs[]`` entry (analyzer/compare/ranking.py ``decision``, which this mirrors: the
renderers read report.json only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analyzer.contract.report_types import Report
from reports import fmt

@dataclass(frozen=True, kw_only=True, slots=True)
class DecisionInput:
    """What the decision line says, already decided; every figure dimensionless."""

    best: str | None
    """The strategy (run name) recommended: the fastest ranked distributed run. None: no
    decision (``withheld`` says why)."""
    other: str | None = None
    """The run ``best`` is compared with (the runner-up); None when ``best`` is the only
    distributed run."""
    ratio: float | None = None
    """``other``'s median step time / ``best``'s (>= 1: ``best`` is faster)."""
    ci_low: float | None = None
    """Lower end of the ratio's 95 % confidence interval; None: no interval."""
    ci_high: float | None = None
    """Upper end of the interval; None: no interval."""
    verdict: Literal["faster", "within noise"] = "within noise"
    """``faster`` only when the measurement resolves the difference (the interval excludes 1);
    else ``within noise``."""
    memory_ratio: float | None = None
    """``best``'s peak memory per rank / ``other``'s (0.62: 38 % less); None: not measured."""
    parity: Literal["match", "match recorded reference", "fail", "not verified"] = "match"
    """``match``: every distributed run matches the single-device run within tolerance;
    ``match recorded reference``: they match the reference values recorded with them (no
    single-device run in the report); ``fail`` / ``not verified``: no decision."""
    withheld: str | None = None
    """Why there is no decision (parity failed, not one experiment, no step time); None when
    there is one."""
    vs_reference: float | None = None
    """The single-device run's median step time / ``best``'s (0.18: one device is faster);
    None without a comparable single-device run."""
    note: str | None = None
    """Said in parentheses after the ratio: the repeats, what would resolve a within-noise pair."""


def decision_line(d: DecisionInput) -> str:
    """One line, plain text (the renderers escape it), e.g. ``fsdp2: 1.31x faster than ddp
    [1.18, 1.45], 38 % less memory per rank; numerics match one device`` or ``No decision:
    ...``. A ratio below 1 never reads "faster": the caller names the faster run ``best``."""
    if d.best is None or d.withheld:
        return f"No decision: {d.withheld or 'no strategy to recommend'}."
    interval = (f" [{d.ci_low:.2f}, {d.ci_high:.2f}]"
                if d.ci_low is not None and d.ci_high is not None else "")
    note = f" ({d.note})" if d.note else ""
    if d.other is None:
        text = f"{d.best}: the only distributed strategy in this report{note}"
    elif d.verdict == "faster":
        text = f"{d.best}: {fmt.speedup(d.ratio)} faster than {d.other}{interval}{note}"
    else:
        text = (f"{d.best} vs {d.other}: within noise at this sample size "
                f"({fmt.speedup(d.ratio)}{interval}{'; ' + d.note if d.note else ''})")
    if d.memory_ratio is not None and d.other is not None:
        diff = 1.0 - d.memory_ratio
        text += (", the same memory per rank" if round(100 * diff) == 0 else
                 f", {abs(100 * diff):.0f} % {'less' if diff > 0 else 'more'} memory per rank")
    if d.vs_reference is not None:
        text += f", {fmt.speedup(d.vs_reference)} the single-device speed"
    parity = {"match": "numerics match one device",
              "match recorded reference": "numerics match the reference values recorded with "
                                          "them (no single-device run here)",
              "fail": "numerics differ from one device",
              "not verified": "numerics not verified"}[d.parity]
    return f"{text}; {parity}."


def _note(pair) -> str | None:
    """What limits a within-noise pair: too few repeats, or how many would resolve it."""
    if pair.decision == "faster":
        return None
    if pair.repeats < 5:
        return (f"{pair.repeats} run{'s' if pair.repeats != 1 else ''} each: record with "
                "tracer record --repeat 5 to decide")
    if pair.repeats_needed is not None:
        return f"{pair.repeats} repeats; about {pair.repeats_needed} would resolve it"
    return f"{pair.repeats} repeats"


def decision_input(report: Report) -> DecisionInput:
    """``DecisionInput`` from the report's ranking: ``best`` / ``other`` = the first two ranked
    strategies (``ranking.order``; the single-device run is the reference, never ranked),
    ``ratio`` / ``ci_low`` / ``ci_high`` / ``verdict`` from their ``ranking.pairs[]`` entry,
    memory = the strategies' lowest peak allocated per rank (``ranking.arms[]``), vs_reference
    = the reference's median step time / ``best``'s."""
    runs = report.runs
    dist = [r for r in runs if r.strategy != "single" and not r.incomplete]
    failed = [r for r in dist if r.parity.status == "fail"]
    missing = [r for r in dist if r.parity.status == "not_recorded"]
    rk = report.ranking
    if failed or missing:
        why = "; ".join([f"{r.name} failed the parity gate" + (
            f" (first divergence in {r.parity.first_divergence.subject})"
            if r.parity.first_divergence else "") for r in failed]
            + [f"{r.name} not verified ({r.parity.reason})" for r in missing])
        return DecisionInput(best=None, parity="fail" if failed else "not verified",
                             withheld=f"{why}: speed figures of a run whose numerics are not "
                                      "verified do not count (see Parity)")
    if rk.status != "ranked":
        if report.settings_warnings:  # named under Ranking; not repeated here
            return DecisionInput(best=None, withheld="the runs were not recorded under the same "
                                 "settings, so they are not one experiment (see Ranking)")
        return DecisionInput(best=None, withheld=rk.reason.rstrip("."))
    if not rk.order:
        return DecisionInput(best=None, withheld="no distributed run with a step time")
    arms = {a.name: a for a in rk.arms}
    best = arms[rk.order[0]]
    ref = arms.get(rk.reference) if rk.reference else None
    parity = "match" if any(r.strategy == "single" for r in runs) else "match recorded reference"
    vs_ref = (ref.median_ns / best.median_ns if ref is not None and ref.median_ns
              and best.median_ns else None)
    if len(rk.order) < 2:
        return DecisionInput(best=best.name, parity=parity, vs_reference=vs_ref)
    other = arms[rk.order[1]]
    pair = next(p for p in rk.pairs if {p.faster, p.slower} == {best.name, other.name})
    pb, po = best.peak_allocated_bytes, other.peak_allocated_bytes
    return DecisionInput(best=pair.faster, other=pair.slower, ratio=pair.ratio,
                         ci_low=pair.ci_low, ci_high=pair.ci_high,
                         verdict="faster" if pair.decision == "faster" else "within noise",
                         memory_ratio=pb / po if pb is not None and po else None,
                         parity=parity, vs_reference=vs_ref, note=_note(pair))
