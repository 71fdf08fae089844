"""The one-line decision every output starts with (report.md, report.html, the terminal).

``decision_line(DecisionInput)`` is the interface: it takes the small input below and only
words it. ``decision_input(report)`` builds that input from the report as it is; the ranking
by pairs with confidence intervals (``ranking.pairs[]``: faster, slower, ratio, ci_low,
ci_high) is meant to feed the same ``DecisionInput`` (``ratio``, ``ci_low``, ``ci_high``,
``verdict``) in place of the median-only comparison used here, which has no interval and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analyzer.contract.report_types import Report, RunEntry
from reports import fmt

NO_CI = ("no confidence interval yet: medians of the profiled steps, and the ranking's noise "
         "rule for the verdict")
"""``DecisionInput.note`` while the ranking has no interval."""


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
    """Said in parentheses after the ratio, e.g. ``NO_CI``."""


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


def _peak(run: RunEntry) -> int | None:
    return run.memory.peak_allocated_bytes


def decision_input(report: Report) -> DecisionInput:
    """``DecisionInput`` from the report's current ranking (``ranking.order``, fastest first,
    and its noise rule): ``best`` / ``other`` = the first two ranked distributed runs,
    ``ratio`` = their median step times, no interval (``note`` ``NO_CI``), ``verdict``
    ``faster`` when the noise rule calls that pair decisive; memory = peak allocated per rank
    (``memory.peak_allocated_bytes``: CUDA when recorded, else the profiler's)."""
    runs = report.runs
    by = {r.name: r for r in runs}
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
    order = [by[n] for n in rk.order if by[n].strategy != "single"]
    if not order:
        return DecisionInput(best=None, withheld="no distributed run with a step time")
    best = order[0]
    other = order[1] if len(order) > 1 else None
    ref = next((r for r in runs if r.strategy == "single"), None)
    parity = "match" if ref is not None else "match recorded reference"
    if other is None:
        return DecisionInput(best=best.name, parity=parity, vs_reference=best.speedup_vs_single)
    decisive = bool(rk.noise) and not any({a, b} == {best.name, other.name}
                                          for a, b, *_ in rk.noise.close_pairs)
    ratio = other.step_time_ns.median / best.step_time_ns.median
    pb, po = _peak(best), _peak(other)
    return DecisionInput(best=best.name, other=other.name, ratio=ratio,
                         verdict="faster" if decisive else "within noise",
                         memory_ratio=pb / po if pb is not None and po else None,
                         parity=parity, vs_reference=best.speedup_vs_single, note=NO_CI)
