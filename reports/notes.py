"""Definitions and per-run notes shared by report.md and report.html, so both say the same.

Pure functions of the report (analyzer/contract/report_types.py); text only, no numbers computed here
beyond what the report holds.
"""

from __future__ import annotations

from analyzer.contract.report_types import RunEntry
from reports import fmt

CLOCK_OFFSET = (
    "Clock offset = the rank's clock minus the lowest rank's: the median over matched "
    "collectives (same process group, kind and order) of the difference of their ends, which "
    "NCCL and gloo collectives reach together on every rank, kept inside causality bounds "
    "(analyzer/analyses/clock.py; `analyzer summary` aligns start skew and stragglers with it "
    "and `analyzer merge` aligns the timeline with it). Applied only when measured: \"-\" = "
    "single rank, no collective shared with the lowest rank, an offset smaller than its own "
    "spread (median absolute deviation: not resolved, 0 applied) or causality bounds that "
    "contradict each other (matched collectives that cannot be one instance: 0 applied and "
    "the rank's collectives left out of transfer, wait and stragglers); each such rank is "
    "named in the caveats."
)

OTHER_IDLE = (
    "Other = step time covered by neither computation, communication nor data wait but by some "
    "other recorded activity (GPU: memcpy, memset, sync, and device work of no step -- queued "
    "before the profiler started or launched outside every ProfilerStep -- running inside the "
    "window; CPU: optimizer bookkeeping, Python "
    "overhead inside recorded ranges, profiler annotations). Idle on a GPU rank = window time "
    "with no device activity of any kind on the rank, the window running from the first device "
    "work the step launched to the next step's (the gap while the GPU waits for the CPU counts "
    "as idle); the last step, with no next step, to its first device work + its CPU "
    "ProfilerStep span, or to its last device work when that ends later (a note per rank says "
    "which); on a CPU rank = step time in which nothing was recorded on the rank (gaps between "
    "recorded ops, e.g. untraced Python or the process waiting)."
)

SLACK = (
    "Issued as prefetch = the all_gather was started ahead of the unit that needs it (by the "
    "previous unit's hook, or inside FSDP's forward / backward prefetch label) rather than by the "
    "unit's own hook. Issued ahead (units, most) = how many units before its use the earliest "
    "of its all_gathers was issued: 0 by its own hook, 1 by the previous unit's (FSDP2's "
    "implicit backward prefetch, or an explicit prefetch depth of 1), 2 two units before "
    "(depth 2); FSDP1 prefetches one unit ahead at most. Ranks gathered = the process group "
    "size of its all_gathers in that phase, - when they differ or are not known "
    "(reshard_after_forward=N: N in backward). Under computation = share of "
    "the all_gather's duration during which the rank was computing. Ready before use (slack) = "
    "when the unit first used the gathered parameters minus when the all_gather finished; "
    "negative = the computation had to wait (late). On a GPU the first use is the first kernel "
    "or memcpy launched from inside the unit's FSDP::all_gather_copy_out label (else from its "
    "pre_forward / pre_backward hook after the copy-out), found by correlation id, and its time "
    "is when that kernel could have started: the later of its launch call and the end of the "
    "previous operation on its stream. Without such a consumer the slack is shown as - (not "
    "measured). Phase = the FSDP hook label around the all_gather (pre_forward / "
    "forward_prefetch: forward; pre_backward / backward_prefetch: backward); without one, "
    "backward when it runs inside the autograd engine."
)

UNIT_NAMES = (
    "Unit = the FSDP unit whose parameters the all_gather brings. FSDP2 (fully_shard) names it "
    "in its trace labels: the module's fully qualified name, \"(root)\" for the root module. "
    "FSDP1 (FullyShardedDataParallel) labels carry no unit name, so its rows are numbered: "
    "\"#k\" is the all_gather issued k-th (from #0) in that phase, forward or backward, of a "
    "step, in issue order; a row averages the k-th all_gathers of every profiled step and rank "
    "(the same unit each time as long as FSDP1 issues them in the same order every step)."
)


STEP_TIME = (
    "Step time, the one step-time figure of this report: the time of a profiled step on its "
    "slowest rank, median over the profiled steps. Recorded runs: the step's wall time from "
    "steps.parquet (on CUDA the step ends with a device synchronisation, so it covers the "
    "device work; on CPU it is the CPU step time). Foreign traces: the traces' step windows "
    "(device windows on a GPU, CPU ProfilerStep spans with their gloo work without one). The "
    "per-rank times below add up to each rank's own traced step (report.json ranks[].step_ns); "
    "p90, min and max are in report.json step_time_ns."
)


def projection_times(runs: list[RunEntry]) -> str:
    """The sentence under a table of measured times that holds projections' rows ("" without
    one): a projection ran one process on torch's fake process group, so its collectives moved
    no data and its times are that process's, not a step at N ranks."""
    names = [r.name for r in runs if r.projection is not None]
    if not names:
        return ""
    return (f"Projection rows ({', '.join(names)}) are one process on torch's fake process group: "
            "their collectives moved no data and their times are that process's, not a step at "
            "N ranks (that is the projected step, under Projection at N ranks).")


def step_sources(runs: list[RunEntry]) -> list[str]:
    """One line per run: where its step times come from and over how many steps, e.g.
    ``ddp: steps.parquet: profiled steps, slowest rank's wall time; median over 2 step(s)``."""
    return [f"{r.name}: {r.step_time_ns.source}; median over {r.step_time_ns.n} step(s)"
            if r.step_time_ns.source else f"{r.name}: no step times" for r in runs]


def windows(runs: list[RunEntry]) -> str:
    """The sentence saying which time window every timing figure covers."""
    steps = sorted({r.profiled_steps for r in runs if r.profiled_steps})
    n = "/".join(str(s) for s in steps) or "the"
    return (f"All times in the tables are means per profiled step ({n} profiled step(s) per rank "
            "in the traces), per rank unless said otherwise: communication / step = the union of "
            "a rank's collective intervals inside each profiled step (time during which at least "
            "one collective ran, so never more than the step), mean over ranks and steps; beside "
            "it, the sums of durations by kind, which count collectives running at once (two "
            "threads, two streams) once each and so can add up to more than the union or the "
            "step; exposed comm / step likewise a union. Overlap and data wait are shares over "
            "all ranks and profiled steps.")

COMM_GROUPS = (
    "Per process group and dtype: all profiled steps, per rank (mean over the ranks that ran it, "
    "i.e. the group's members in the traces, not every rank of the job); time = sum of "
    "durations; bytes as nccl-tests counts them (all_gather and reduce_scatter: the whole "
    "buffer = one rank's piece x the group's size), taken from the CPU side (record_param_comms, "
    "the c10d op) before the kernel; 'unknown' where the trace does not tell; busbw from "
    "transfer time (the wait for the slowest rank left out) with the group's size. Process "
    "group 'not in trace': no Process Group Name on the collective or its launching ops, and "
    "distributedInfo.pg_config does not list exactly one group. Group size: the collective's "
    "Group size argument, else pg_config's size of its group, else (all_gather, "
    "reduce_scatter) whole buffer / piece (In / Out msg nelems, or the c10d op's output and "
    "input), else the world size only where pg_config shows no group smaller than the world; "
    "else unknown, never assumed to be the world (bytes that need it and busbw then unknown, "
    "but for broadcast and send_recv: factor 1 whatever the group). All profiled steps: every "
    "table of this section counts only the collectives launched inside a ProfilerStep (those "
    "launched outside every ProfilerStep, or queued before the profiler started, are left out, "
    "as the notes below count them; without ProfilerStep, step 0 is the whole trace).")


def prefetch_sentence(run: RunEntry) -> str:
    """The run-level prefetch summary in words that do not contradict the CPU figures."""
    p = run.prefetch
    text = (f"{run.name} ({p.labels} labels): {p.all_gathers} all_gathers over all ranks and "
            f"profiled steps, {p.prefetched} of them issued as prefetch; {fmt.pct(p.hidden_frac)} "
            "of all_gather time under computation; ")
    measured = p.all_gathers - p.unknown
    if not measured:
        text += ("ready before use not measured for any of them: no consumer of the gathered "
                 "parameters (FSDP's all_gather_copy_out label, on a GPU the kernel launched "
                 "from it) or no all_gather execution was found in the trace, so whether "
                 "computation waited for them is unknown.")
        return text + _cpu_tail(run)
    if p.late:
        text += (f"{p.late} of the {measured} measured finished after their unit needed them "
                 f"(computation waited {fmt.ms(p.wait_ns)} in all at the point of use).")
    else:
        text += (f"none of the {measured} measured finished after its unit needed it (no wait "
                 "at the point of use).")
    if p.unknown:
        text += (f" Not measured for {p.unknown}: no consumer of their gathered parameters or "
                 "no execution of the all_gather was found in the trace.")
    return text + _cpu_tail(run)


def _cpu_tail(run: RunEntry) -> str:
    """On CPU: where the all_gathers are waited for (the exposed communication)."""
    if not run.prefetch.note:
        return ""
    return (f" Exposed communication of this run: {fmt.ms(run.exposed_comm_ns)} per step -- on "
            "CPU that is where the all_gathers are waited for (see the note below).")
