"""The context of the figures (issue 42): what the machine, the backend, the rank set, the
clocks and the step markers let the report say, as a short list on the first screen of report.md and report.html,
one line each with its count of runs. The full sentences stay where they were (the verdict's
details, each run's caveats under "Caveats"). Pure functions of the report; plain text (the
renderers escape it)."""

from __future__ import annotations

from analyzer.contract import strategies
from analyzer.contract.report_types import Report, RunEntry, machine_busy
from reports import fmt

UNALIGNED = ("unresolved", "inconsistent", "unmatched")
"""``RankFigures.clock`` states whose offset is not applied (analyzer/analyses/clock.py)."""


def _of(some: list[RunEntry], runs: list[RunEntry]) -> str:
    return f"{len(some)} of {len(runs)} run{'s' if len(runs) > 1 else ''}"


def _busy(runs: list[RunEntry]) -> str | None:
    """Busy (1-minute load >= usable CPUs) or oversubscribed (ranks x threads > usable CPUs)
    records, from the manifest's ``machine`` (tracer/record.py)."""
    busy = [r for r in runs if machine_busy(r.machine)]
    if not busy:
        return None
    worst = max(busy, key=lambda r: r.machine["load_avg"][0]).machine
    over = [r.machine for r in busy if r.machine["oversubscribed"]]
    text = (f"Busy machine ({_of(busy, runs)}): 1-minute load up to {worst['load_avg'][0]:g} on "
            f"{worst['usable_cpus']} usable CPUs")
    if over:
        m = max(over, key=lambda m: m["ranks_on_host"] * m["threads_per_rank"])
        text += (f"; oversubscribed ({len(over)}): {m['ranks_on_host']} ranks x "
                 f"{m['threads_per_rank']} thread(s) on {m['usable_cpus']} CPUs, so ranks wait "
                 "for cores: CPU contention, not a device to rebalance")
    return text + "."


def _cpu_gloo(runs: list[RunEntry]) -> str | None:
    """Distributed runs recorded on CPU with gloo: their timings carry a shared machine's noise,
    their memory is a sum of categories, and FSDP's collectives run synchronously there (DDP's
    bucket all_reduces still overlap backward on gloo: only FSDP's overlap is said to be 0)."""
    cpu = [r for r in runs if r.device == "cpu" and r.backend == "gloo"
           and not strategies.is_reference(r.strategy)]
    if not cpu:
        return None
    fsdp = [r for r in cpu if r.prefetch]
    return (f"CPU with gloo ({_of(cpu, runs)}): timings carry +-30-50 % noise, memory is a "
            "lower bound" + (", FSDP's collectives run synchronously (no overlap)" if fsdp else "")
            + ": the order of strategies here says little about GPUs.")


def _projected(runs: list[RunEntry]) -> str | None:
    """Runs of ``tracer project``: roles run in one process at world N on the fake process group,
    so their shapes, collectives and memory are the job's, their times are not."""
    proj = [r for r in runs if r.projection]
    if not proj:
        return None
    named = "; ".join(f"{r.name}: world {r.projection.get('world_size')} from ranks "
                      f"{', '.join(map(str, r.projection.get('roles_run') or []))}"
                      for r in proj[:3]) + ("; ..." if len(proj) > 3 else "")
    return (f"Projected ({_of(proj, runs)}): {named}, on the fake process group: shapes, "
            "collectives and memory per rank are the job's; no data moves, so times and "
            "numerics are not.")


def _compiled(runs: list[RunEntry]) -> str | None:
    """``--compile`` records (issue 45): the compile warm-up, rank 0's seconds compiling and the
    steps it took, apart from the profiled steps' times -- or inside them, said."""
    comp = [r for r in runs if isinstance(r.compile_warmup, dict)]
    if not comp:
        return None
    parts = []
    for r in comp[:3]:
        by_step = r.compile_warmup.get("compile_ns_by_step") or []
        steps = [str(i) for i, ns in enumerate(by_step) if ns > 0]
        text = (f"{r.name}: {fmt.ms(sum(by_step), '.0f')} compiling in step"
                f"{'s' if len(steps) > 1 else ''} {', '.join(steps)}")
        inside = r.compile_warmup.get("profiled_compile_ns") or 0
        parts.append(text + (f", {fmt.ms(inside, '.0f')} of it in profiled steps (in their step time)"
                             if inside else ""))
    return (f"Compiled ({_of(comp, runs)}): {'; '.join(parts)}{'; ...' if len(comp) > 3 else ''}"
            "; the step times are the profiled steps', "
            + ("some with compile in them." if any((r.compile_warmup.get("profiled_compile_ns") or 0)
                                                    for r in comp) else "none of it in them."))


def _partial(runs: list[RunEntry]) -> str | None:
    """Runs whose traces miss ranks of their world (``trace_info.missing_ranks``); a projection
    runs only its roles by design (``_projected`` says so)."""
    part = [r for r in runs if r.trace_info is not None and r.trace_info.missing_ranks
            and not r.projection]
    if not part:
        return None
    named = "; ".join(f"{r.name}: {len(r.trace_info.missing_ranks)} of {r.world_size or '?'} "
                      "ranks missing" for r in part[:3]) + ("; ..." if len(part) > 3 else "")
    return (f"Partial rank set ({_of(part, runs)}): {named}; cross-rank figures cover the "
            "traced ranks only.")


def _clocks(runs: list[RunEntry]) -> str | None:
    """Runs with ranks whose clock offset is not measured (0 applied: cross-rank waits on them
    are as their clocks say)."""
    off = [(r, [x.rank for x in r.ranks if x.clock in UNALIGNED]) for r in runs]
    off = [(r, ranks) for r, ranks in off if ranks]
    if not off:
        return None
    named = "; ".join(f"{r.name}: {len(ranks)} of {len(r.ranks)} ranks" for r, ranks in off[:3]
                      ) + ("; ..." if len(off) > 3 else "")
    return (f"Unaligned clocks ({_of([r for r, _ in off], runs)}): offsets not measured for "
            f"{named} (0 applied); waits across ranks on them are approximate.")


def _whole_trace(runs: list[RunEntry]) -> str | None:
    """Runs whose traces hold no ProfilerStep: one "step" is the whole trace."""
    whole = [r for r in runs if r.trace_info is not None and r.trace_info.whole_trace_mode]
    if not whole:
        return None
    return (f"No ProfilerStep ({_of(whole, runs)}): whole-trace mode, one step is the whole "
            "trace; per-step figures are per trace.")


def lines(report: Report) -> list[str]:
    """The context list: a projection, busy or oversubscribed machine, CPU/gloo, a compile
    warm-up, a partial rank set, unaligned clocks, no ProfilerStep; each present item one line;
    [] when none applies."""
    runs = [r for r in report.runs if not r.incomplete]
    return [x for x in (_projected(runs), _busy(runs), _cpu_gloo(runs), _compiled(runs),
                        _partial(runs), _clocks(runs), _whole_trace(runs)) if x]
