"""The one-line decision every output starts with (report.md, report.html, the terminal).

``decision_line(DecisionInput)`` is the interface: it takes the small input below and only
words it. ``decision_input(report)`` builds that input from the report's ranking: the fastest
ranked strategy against the runner-up, with the ratio, 95 % interval and decision of their
``ranking.pairs[]`` entry (analyzer/compare/ranking.py ``decision``, which this mirrors: the
renderers read report.json only).

Below ``Noise.min_repeats`` repeats the line shows the ratio alone, labelled with what it rests
on, never an interval (``Pair.undecided``); a steady gap under 1 + ``Noise.min_difference``
reads "less than 5 % apart". Declared arms (``Ranking.declared``) are named by their strategy
and the settings in which the two differ (analyzer/contract/arms.py), and an arm left out for
its parity is said after the parity status, the decision made among the others. Memory is
compared only where it is measured: arms that differ in a setting whose memory this device's
record cannot see (``ranking.differences``, analyzer/compare/armdiff.py) read "memory not
measurable on this device for ...", never "the same memory per rank". Runs of another experiment
in the report (``ranking.descriptive``) are counted at the end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from analyzer.contract import strategies
from analyzer.contract.arms import pair_labels
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
    verdict: Literal["faster", "within noise", "small difference"] = "within noise"
    """``faster`` only when the measurement resolves the difference (the interval excludes 1);
    ``small difference`` when the interval excludes 1 but the ratio is under 1 +
    ``min_difference`` (what identical records differ by); else ``within noise``."""
    basis: str | None = None
    """Said right after the ratio in place of an interval, its punctuation included: what a
    ratio of too few repeats rests on (``", steps of one run only"``, ``" from 3 repeats, too
    few for an interval"``); None: the interval (or nothing) is shown."""
    min_difference: float = 0.05
    """The smallest ratio beyond 1 called a difference (``Noise.min_difference``)."""
    memory_ratio: float | None = None
    """``best``'s peak memory per rank / ``other``'s (0.62: 38 % less); None: not measured."""
    memory_lower_bound: bool = False
    """Either run's memory is a lower bound (``Memory.peak_lower_bound``: a CPU record sums its
    categories, the allocator keeps no peak): the comparison cannot see transient buffers
    (FSDP's unsharded parameters), and the line says so."""
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
    what: str = "distributed strategy"
    """What ``best`` is when it is alone: ``distributed strategy``, or ``arm`` (declared arms)."""
    left_out: tuple[str, ...] = ()
    """Declared arms left out for their parity (``Ranking.left_out``), said after the parity
    status: ``arm skipgrad failed the parity gate (first divergence in ...), left out``."""
    missing: tuple[str, ...] = ()
    """Declared arms or repeats of the experiment absent from the report (``Ranking.missing``),
    said last: ``arm b: recorded in this experiment, no complete run in this report``, ``arm a: 1 of 4 repeats``.
    With any, a lone arm is "the only arm ranked", never "the only arm in this report"."""
    memory_unseen: tuple[str, ...] = ()
    """The declared settings in which ``best`` and ``other`` differ whose memory effect this
    device's record cannot see (``ranking.differences`` ``memory_unseen``,
    analyzer/compare/armdiff.py): the line says memory is not measurable for them, never "the
    same memory"."""
    other_experiments: int = 0
    """Runs of the report that are of another experiment (``Ranking.descriptive``: recorded by
    another tracer record command), compared in the tables only: said after the parity."""


def decision_line(d: DecisionInput) -> str:
    """One line, plain text (the renderers escape it), e.g. ``fsdp2: 1.31x faster than ddp
    [1.18, 1.45], 38 % less memory per rank; numerics match one device`` or ``No decision:
    ...``. A ratio below 1 never reads "faster": the caller names the faster run ``best``."""
    if d.best is None or d.withheld:
        return f"No decision: {d.withheld or 'no strategy to recommend'}."
    interval = (d.basis if d.basis is not None else f" [{d.ci_low:.2f}, {d.ci_high:.2f}]"
                if d.ci_low is not None and d.ci_high is not None else "")
    note = f" ({d.note})" if d.note else ""
    if d.other is None:
        text = (f"{d.best}: the only {d.what} {'ranked' if d.missing else 'in this report'}"
                f"{note}")
    elif d.verdict == "faster":
        text = f"{d.best}: {fmt.speedup(d.ratio)} faster than {d.other}{interval}{note}"
    elif d.verdict == "small difference":
        text = (f"{d.best} vs {d.other}: less than {100 * d.min_difference:g} % apart "
                f"({fmt.speedup(d.ratio)}{interval}{'; ' + d.note if d.note else ''}: the "
                "difference identical records show on one machine)")
    else:
        text = (f"{d.best} vs {d.other}: within noise at this sample size "
                f"({fmt.speedup(d.ratio)}{interval}{'; ' + d.note if d.note else ''})")
    if d.memory_unseen and d.other is not None:
        text += f", memory not measurable on this device for {', '.join(d.memory_unseen)}"
    elif d.memory_ratio is not None and d.other is not None:
        diff = 1.0 - d.memory_ratio
        text += (", the same memory per rank" if round(100 * diff) == 0 else
                 f", {abs(100 * diff):.0f} % {'less' if diff > 0 else 'more'} memory per rank")
        if d.memory_lower_bound:
            text += " (lower bounds)"
    if d.vs_reference is not None:
        text += f", {fmt.speedup(d.vs_reference)} the single-device speed"
    parity = {"match": "numerics match one device",
              "match recorded reference": "numerics match the reference values recorded with "
                                          "them (no single-device run here)",
              "fail": "numerics differ from one device",
              "not verified": "numerics not verified"}[d.parity]
    left = "".join(f"; {x}, left out" for x in d.left_out)
    n = d.other_experiments
    others = (f"; {n} run{'s' if n != 1 else ''} of another experiment (compared in the tables "
              "only)" if n else "")
    return f"{text}; {parity}{left}{''.join(f'; {x}' for x in d.missing)}{others}."


def _why(pair, min_repeats: int) -> str | None:
    """``Pair.undecided``; for a report.json written before it, from the repeats."""
    if pair.decision == "faster":
        return None
    if pair.undecided is not None:
        return pair.undecided
    if pair.repeats < min_repeats:
        return "one_run" if pair.repeats <= 1 else "few_repeats"
    return "interval_includes_1"


def _note(pair, why: str | None, min_repeats: int) -> str | None:
    """What limits an undecided pair: too few repeats, or how many would resolve it."""
    if why is None:
        return None
    # the number the pair's own sentence gives (analyzer/compare/ranking.py pair_sentence):
    # below min_repeats the spread of the repeats is no basis for a count (a report.json
    # written before that rule may hold one extrapolated from 2 repeats), so the minimum
    need = pair.repeats_needed if pair.repeats >= min_repeats else None
    todo = (f"record with tracer record --repeat {max(min_repeats, need or 0)} or more "
            "to decide")
    if why == "one_run":
        return f"1 run each: {todo}"
    if why == "few_repeats":
        return todo
    if why == "interval_includes_1" and pair.repeats_needed is not None:
        return f"{pair.repeats} repeats; about {pair.repeats_needed} would resolve it"
    return f"{pair.repeats} repeats"


def _basis(pair, why: str | None) -> str | None:
    """The label of a ratio shown without its interval (``DecisionInput.basis``)."""
    if why == "one_run":
        return ", steps of one run only"
    if why == "few_repeats":
        return f" from {pair.repeats} repeats, too few for an interval"
    return None


def _memory_unseen(rk, a, b) -> tuple[str, ...]:
    """The settings in which arms ``a`` and ``b`` differ whose memory this device's record
    cannot see (``ranking.differences`` rows ``memory_unseen``); () when none."""
    differ = {k for k in {*a.settings, *b.settings}
              if k not in a.settings or k not in b.settings or a.settings[k] != b.settings[k]}
    return tuple(dict.fromkeys(k for d in rk.differences or [] if d.what == "memory_unseen"
                               for k in d.settings if k in differ))


def _failed_line(r) -> str:
    return f"{r.name} failed the parity gate" + (
        f" (first divergence in {r.parity.first_divergence.subject})"
        if r.parity.first_divergence else "")


def decision_input(report: Report) -> DecisionInput:
    """``DecisionInput`` from the report's ranking: ``best`` / ``other`` = the first two ranked
    strategies (``ranking.order``; the single-device run is the reference, never ranked),
    ``ratio`` / ``ci_low`` / ``ci_high`` / ``verdict`` from their ``ranking.pairs[]`` entry,
    memory = the strategies' lowest peak allocated per rank (``ranking.arms[]``), vs_reference
    = the reference's median step time / ``best``'s. Declared arms: every arm ranked, named by
    its settings; an arm that failed parity is left out and said, the others decided;
    ``memory_unseen`` from ``ranking.differences``, ``other_experiments`` from
    ``ranking.descriptive``. A hang (a ``hang`` finding) withholds the decision and is said
    first."""
    runs = report.runs
    rk = report.ranking
    hangs = [f for f in report.findings if f.kind == "hang"]
    if hangs:  # a run that never finishes has nothing to rank; what hung it comes first
        return DecisionInput(best=None, parity="not verified", withheld="; ".join(
            f"{', '.join(f.runs)} hung: {f.cause}" for f in hangs) + " (see Hangs)")
    dist = [r for r in runs if not strategies.is_reference(r.strategy) and not r.incomplete
            and r.projection is None]  # projections: the Projected lines (``projected_lines``)
    failed = [r for r in dist if r.parity.status == "fail"]
    missing = [r for r in dist if r.parity.status == "not_recorded"]
    if (failed or missing) and not rk.declared:
        why = "; ".join([_failed_line(r) for r in failed]
                        + [f"{r.name} not verified ({r.parity.reason})" for r in missing])
        return DecisionInput(best=None, parity="fail" if failed else "not verified",
                             withheld=f"{why}: speed figures of a run whose numerics are not "
                                      "verified do not count (see Parity)")
    if rk.status != "ranked":
        if report.settings_warnings and rk.reason.startswith("the runs are not one experiment"):
            # the differences are named under Ranking; not repeated here
            return DecisionInput(best=None, withheld="the runs were not recorded under the same "
                                 "settings, so they are not one experiment (see Ranking)")
        return DecisionInput(best=None, withheld=rk.reason.rstrip("."))
    if not rk.order:
        return DecisionInput(best=None, withheld="no distributed run with a step time")
    arms = {a.name: a for a in rk.arms}
    best = arms[rk.order[0]]
    parity = ("match" if any(strategies.is_reference(r.strategy) for r in runs)
              else "match recorded reference")
    vs_ref = rk.speedup(best)
    extra = (dict(left_out=tuple(rk.left_out), missing=tuple(rk.missing), what="arm")
             if rk.declared else {})
    extra["other_experiments"] = len(rk.descriptive)
    if len(rk.order) < 2:
        return DecisionInput(best=best.label or best.name if rk.declared else best.name,
                             parity=parity, vs_reference=vs_ref, **extra)
    other = arms[rk.order[1]]
    pair = next(p for p in rk.pairs if {p.faster, p.slower} == {best.name, other.name})
    fa, sl = arms[pair.faster], arms[pair.slower]
    min_repeats = rk.noise.min_repeats if rk.noise else 5
    why = _why(pair, min_repeats)
    names = pair_labels(*((a.name, a.strategy, a.settings if rk.declared else None)
                          for a in (fa, sl)))
    pb, po = fa.peak_allocated_bytes, sl.peak_allocated_bytes
    return DecisionInput(best=names[0], other=names[1], ratio=pair.ratio,
                         ci_low=pair.ci_low, ci_high=pair.ci_high,
                         verdict="faster" if why is None else
                         "small difference" if why == "small_difference" else "within noise",
                         basis=_basis(pair, why),
                         min_difference=rk.noise.min_difference if rk.noise else 0.05,
                         memory_ratio=pb / po if pb is not None and po else None,
                         memory_unseen=_memory_unseen(rk, fa, sl),
                         memory_lower_bound=any(r.memory.peak_lower_bound for r in runs
                                                if r.name in fa.runs + sl.runs),
                         parity=parity, vs_reference=vs_ref, note=_note(pair, why, min_repeats),
                         **extra)


def projected_lines(report: Report) -> list[str]:
    """The first screen's lines on the projections (``Report.projections``, issue 44), plain
    text, one per world size: ``at 64 ranks: fsdp2-at-64 (fsdp2) 7.35 ms per step [7.12,
    8.90], the fastest of 2 projections whose numerics a run here verified; 1 more not
    verified, not ranked``; with none verified, each one's step [interval] and why it is not
    ranked; [] without a projected step. Compute measured on one kind of machine and links on
    another are said."""
    out = []
    for world in sorted({p.world_size for p in report.projections}):
        rows = [p for p in report.projections if p.world_size == world]
        ranked = [p for p in rows if p.rank == 1]
        unverified = sum(p.verified_by is None for p in rows)
        verified = len(rows) - unverified
        if not ranked:  # each projection's step, so the first screen holds the figure
            steps = "; ".join(f"{p.run} ({p.strategy}) {fmt.ms(p.step_ns)} per step "
                              f"[{fmt.ms(p.low_ns)}, {fmt.ms(p.high_ns)}]" for p in rows)
            out.append(f"at {world} ranks: {steps}; not ranked: numerics not verified (record "
                       "a run of the same strategy and options beside "
                       f"{'it' if len(rows) == 1 else 'them'}, at a small world) (see Projection)")
            continue
        p = ranked[0]
        what = ("the only projection whose numerics a run here verified" if verified == 1 else
                f"the fastest of {verified} projections whose numerics a run here verified")
        tail = (f"; {unverified} more not verified (no run of the strategy passed parity "
                "here), not ranked" if unverified else "")
        entry = next((r for r in report.runs if r.name == p.run), None)
        mixed = ("; WARNING: " + entry.projected_step.warnings[0]
                 if entry and entry.projected_step and entry.projected_step.warnings else "")
        out.append(f"at {world} ranks: {p.run} ({p.strategy}) {fmt.ms(p.step_ns)} per step "
                   f"[{fmt.ms(p.low_ns)}, {fmt.ms(p.high_ns)}], {what}{tail}{mixed} "
                   "(see Projection)")
    return out
