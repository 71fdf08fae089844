"""The short verdict paragraph every output format starts with."""

from __future__ import annotations

from analyzer.contract import strategies
from analyzer.contract.report_types import DataSupply, Report
from reports import fmt


def input_bound_sentence(name: str, d: DataSupply | None) -> str | None:
    """"Input-bound: in ddp, rank 1 waited 38.0 % of step time for data; communication figures
    for this run are not the bottleneck." when run ``name`` with data supply ``d`` is
    input-bound (analyzer/analyses/datasupply.py), else None. The communication clause says so only when
    that rank's exposed communication share is below its data wait share; otherwise both are
    named."""
    if d is None or not d.input_bound:
        return None
    text = (f"Input-bound: in {name}, rank {d.worst_rank} waited {fmt.pct(d.worst_rank_frac)} "
            "of step time for data")
    comm = d.worst_rank_exposed_comm_frac
    if comm is None or comm < d.worst_rank_frac:
        return text + "; communication figures for this run are not the bottleneck."
    return text + f" and {fmt.pct(comm)} on exposed communication; both limit it."


def verdict(report: Report) -> list[str]:
    """Plain-language sentences under the decision line (reports/decision.py): parity first,
    then the ranking of the distributed runs and the single-device reference beside it (or
    why the ranking is withheld), then what CPU records measured, differing settings, and how
    many caveats the Caveats section holds."""
    return _parity(report.runs) + _ranking(report.ranking) + _caveats(report)


def _parity(runs) -> list[str]:
    """The parity sentences: each failed run with its first divergence, the unverified runs,
    else that every distributed run matches."""
    dist = [r for r in runs if not strategies.is_reference(r.strategy)]
    out: list[str] = []
    failed = [r for r in runs if r.parity.status == "fail"]
    missing = [r for r in runs if r.parity.status == "not_recorded"]
    passed = [r for r in dist if r.parity.status == "pass"]

    def tol_text(of) -> str:  # the tolerances of runs ``of``, each named once
        tols = [r.parity.tolerance for r in of if r.parity.tolerance]
        if not tols:
            return "tolerance"
        return (f"{'/'.join(sorted({t.precision for t in tols}))} tolerance "
                f"({'; '.join(sorted({fmt.tolerance_line(t) for t in tols}))})")

    if failed:
        for r in failed:  # its own tolerance, never another arm's
            fd = r.parity.first_divergence
            out.append(f"Parity: FAILED for {r.name} -- its numbers differ from the "
                       f"single-device baseline beyond {tol_text([r])}. First divergence: "
                       f"{fd.describe(limit_terms=False) if fd else r.parity.reason}.")
        if passed:
            out.append(f"Parity passed for {', '.join(r.name for r in passed)}.")
    if missing:
        names = ", ".join(r.name for r in missing)
        out.append(f"Parity: not verified for {names} ({missing[0].parity.reason}): their "
                   "numbers are not checked against the baseline.")
    if not failed and not missing:
        has_single = any(strategies.is_reference(r.strategy) for r in runs)
        if dist:
            what = ("the single-device baseline" if has_single else
                    "the reference values recorded with them (there is no single-device run in "
                    "this report)")
            out.append(f"Parity: all {len(dist)} distributed run(s) match {what} within {tol_text(runs)}.")
        elif runs:
            out.append("Parity: only the single-device reference run is present; nothing to compare.")
    return out


def _ranking(rk) -> list[str]:
    """The ranking sentences: the arms in order with the reference beside them, whether the
    order is beyond the noise, the arms left out; or why the ranking is withheld."""
    if rk.status != "ranked":
        if rk.reason.startswith("the runs are not one experiment"):  # differences: under Ranking
            return ["Ranking withheld: the runs were not recorded under the same settings "
                    "(which ones differ: see Ranking), so they are not one experiment."]
        return [f"Ranking withheld: {rk.reason}"]
    arms = {a.name: a for a in rk.arms}
    order = [arms[n] for n in rk.order]
    ref = arms.get(rk.reference) if rk.reference else None

    def said(a) -> str:  # a declared arm by its settings (analyzer/contract/arms.py)
        return (a.label or a.name) if rk.declared else a.name

    def reps(a) -> str:
        return f", {len(a.runs)} repeats" if len(a.runs) > 1 else ""

    def vs_ref(a, words: str = "the single-device speed") -> str:
        speedup = rk.speedup(a)
        return "" if speedup is None else f", {fmt.speedup(speedup)} {words}"

    text = ""
    if order:
        best = order[0]
        text = (f"Fastest: {said(best)}, median step time {fmt.ms(best.median_ns)}{reps(best)}"
                f"{vs_ref(best, 'speedup over the single-device run')}")
        rest = [f"{said(a)} ({fmt.ms(a.median_ns)}{reps(a)}{vs_ref(a)})" for a in order[1:]]
        if rest:
            text += "; then " + ", ".join(rest)
        text += "."
    if ref is not None:
        text += (f" Reference (not ranked): {ref.name}, one device, median step time "
                 f"{fmt.ms(ref.median_ns)}{reps(ref)}")
        if order and all(a.median_ns > ref.median_ns for a in order):
            text += (": at this model and batch size on this machine, no distributed "
                     "strategy pays off")
        text += "."
    out = [text.strip() or "No strategy has step times to rank."]
    noise = rk.noise or None
    if noise and not noise.decisive and len(order) > 1:
        close = "; ".join(why for _, _, _, why in noise.close_pairs)
        out.append(f"This order is within measurement noise ({close}) and is not a basis "
                   "for a decision (rule: a strategy is faster only when the 95 % "
                   "interval of the step-time ratio excludes 1).")
    elif noise and len(order) > 1:
        sentence = {(p.faster, p.slower): p.sentence for p in rk.pairs}
        beyond = "; ".join(sentence.get((a.name, b.name), "") for a, b in zip(order, order[1:]))
        out.append(f"This order is beyond the measured noise: {beyond}.")
    if rk.left_out:
        out.append("Left out of the ranking for their parity: " + "; ".join(rk.left_out)
                   + "; the other arms are ranked.")
    if rk.missing:
        out.append("Not in this report: " + "; ".join(rk.missing) + ".")
    if rk.descriptive:
        out.append(f"Not ranked (another experiment): {', '.join(rk.descriptive)}; "
                   "compared in the tables only.")
    return out


def _caveats(report: Report) -> list[str]:
    """The sentences after the ranking: input-bound runs, CPU timings, mesh overlap, settings
    warnings, each run's caveats."""
    runs, rk = report.runs, report.ranking
    out = [s for r in runs if (s := input_bound_sentence(r.name, r.data))]
    # said only where the evidence says gloo: the manifest's backend, or for foreign traces
    # distributedInfo / gloo ops (analyzer/compare/runs.py trace_backend); a CPU-side-only
    # trace of another device (MTIA, a CUPTI range profile) is no gloo record
    cpu = [r for r in runs if r.device == "cpu" and r.backend == "gloo"
           and not strategies.is_reference(r.strategy)]
    if cpu:
        # the context list (reports/context.py) says CPU / gloo; here only what it measured
        fsdp = [r for r in cpu if r.prefetch]
        if fsdp:
            measured = ", ".join(f"{r.name} {fmt.pct(r.prefetch.hidden_frac)}" for r in fsdp)
            out.append("FSDP collectives run effectively synchronously on CPU: the share of "
                       f"FSDP all_gather time hidden under computation is {measured}.")
    if hidden := mesh_hidden_sentence(runs):
        out.append(hidden)
    if report.settings_warnings and not rk.reason.startswith("the runs are not one experiment"):
        out.append("Warning: " + "; ".join(report.settings_warnings) + ".")
    if n := sum(len(r.caveats) for r in runs):
        out.append(f"{n} caveat{'s' if n > 1 else ''} on how figures were measured: see Caveats.")
    return out


def mesh_hidden_sentence(runs) -> str | None:
    """One sentence: per run on a mesh and per dimension, the share of the time its collectives
    ran (their union) that computation hid (1 - exposed / union, ``RunEntry.mesh_dims``); None
    without such a run. Answers "is HSDP's cross-group all_reduce hidden" where it is asked."""
    parts = []
    for r in runs:
        if r.projection is not None:
            continue  # fake collectives: nothing hid them (Projection at N ranks says it)
        if not any(d.source in ("pg_desc", "manifest") and d.name != "world" for d in r.mesh_dims):
            continue  # a flat group: the FSDP / DDP sentences say it
        dims = [f"{d.name} {fmt.pct(1 - d.exposed_ns / d.union_ns)}" for d in r.mesh_dims
                if d.union_ns]
        if dims:
            parts.append(f"{r.name}: {', '.join(dims)}")
    if not parts:
        return None
    return ("Communication hidden under computation per mesh dimension (1 - exposed / the time "
            f"its collectives ran): {'; '.join(parts)}.")
