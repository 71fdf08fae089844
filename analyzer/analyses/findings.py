"""Findings (issue 28): the typed ``Report`` -> what its figures show, most severe first.

``findings(report)`` reads only the typed report (no pandas, no trace): it runs on a cached
report.json too, and on foreign traces (parity "not verified" gives no finding). A run of a
declared arm is named in titles by its strategy and declared settings too (``who``).

Every finding carries the figures it rests on (``Evidence``: value, unit and the JSON pointer
of the same value in report.json, taken from the attribute it is read from), a cause only when
a rule establishes one (the cause's share of the effect >= ``CAUSE_THRESHOLD``, 0.8; otherwise
``cause`` None: "cause not established"), a suggested action where one follows from the
figures, and ``severity_ns``: the step time at stake per step (ns). Titles hold names, never
formatted figures (display units live in reports/ only); the renderers and ``analyzer
summary`` show the evidence.

Rules, one function each (``RULES``), over each run ``runs[i]``; "the step" is the run's
median profiled step time (``step_time_ns.median``, slowest rank):

* hang: one per process group of the run's Flight Recorder dumps (``flight_recorder.groups``,
  analyzer/analyses/flightrec.py) with a verdict: a rank never entered the collective its peers
  waited in (collective_hang), entries that do not match across ranks (mismatch), or a send /
  recv whose peer never entered the matching op (p2p_pending). Cause: the group's statement
  (the dumps of every rank establish it). Severity: the step when one was measured (none: the run does not
  finish); listed first whatever the severity.
* parity_failed: ``parity.status == "fail"``; names the first divergence. Severity: the whole
  step (the run's result is wrong whatever its speed).
* straggler: one per ``stragglers[j]`` (analyzer/analyses/straggler.py) whose lateness per
  profiled step (``late_ns / profiled_steps``) is >= ``MIN_STAKE_FRAC`` of the step. Cause:
  the straggler's own ``cause`` when its ``explained_frac`` >= ``CAUSE_THRESHOLD``; the split
  (``split_ns``) is evidence either way. late_step_start is said as what the trace shows
  ("rank 7 entered the step after the first rank: the delay lies before the step's window",
  the figure first in the evidence) and its action points before the window, not at a cause
  the trace cannot see. On a busy or oversubscribed machine (manifest ``machine``,
  ``_contention``) a host_delay (and, on a CPU run, a device_compute) cause is "CPU
  contention (N ranks x T threads on C CPUs)": the ranks share the CPUs, no work is to be
  rebalanced. Actions name what exists on the run's device (no launch or .item() sync on a
  CPU run). Severity: its lateness per step.
* exposed_communication: ``exposed_comm_ns`` (per step, mean over ranks) >= ``EXPOSED_FRAC``
  of the step. Names the kind with the most time per step, with its own mesh dimension (the
  named one where that kind's collectives spend the most time, ``comm_groups[].mesh_dim``) and, when that kind is all_gather, the FSDP unit whose
  all_gathers leave the most time unhidden (``prefetch.units[]``: comm_ns x (1 -
  hidden_frac)). Cause, from the split of the run's collective time
  (``communication[k].wait_ns_per_step`` / ``transfer_ns_per_step`` summed over kinds, over
  their ``time_ns_per_step``): "waiting for the group's last rank" when the wait is >=
  ``CAUSE_THRESHOLD`` of it, "moving data" when the transfer is; else not established. Action:
  wait -> the rank the others wait for; transfer -> DDP ``bucket_cap_mb`` when the top kind is
  a DDP all_reduce, FSDP forward / backward prefetch when it is an FSDP all_gather, and only
  when the run's ``overlap_frac`` < ``LOW_OVERLAP_FRAC`` (there is overlap left to gain).
  Severity: ``exposed_comm_ns``.
* prefetch_late: ``prefetch.late`` > 0 (all_gathers that finished after their unit needed
  them: slack < 0, analyzer/analyses/prefetch.py) and their waiting per rank and profiled step
  (``prefetch.wait_ns / (len(ranks) x profiled_steps)``) >= ``MIN_STAKE_FRAC`` of the step.
  Names the late units (``units[].min_slack_ns`` < 0), worst first. Action: prefetch the
  unit's phase (FSDP1 ``forward_prefetch`` / ``backward_prefetch=BACKWARD_PRE``, FSDP2
  ``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``) when a late unit
  is not prefetched, else issue it further ahead. Severity: that waiting per rank and step.
* input_bound: ``data.input_bound`` (its worst rank waits for data >= ``data.threshold_frac``
  of its step, analyzer/analyses/datasupply.py). Action: raise the DataLoader's
  ``num_workers`` (and ``pin_memory``). Severity: the worst rank's ``data_wait_ns`` per step
  (the others wait for it at the next collective).
* host_bound: a GPU run (``trace_info.device_kind == "gpu"``) whose ranks' idle time (per step,
  mean over ranks) is >= ``HOST_BOUND_FRAC`` of their step time (mean over ranks): no device
  activity of any kind (analyzer/analyses/breakdown.py), the host had not launched the next
  work; why, the report does not hold (cause not established). Idle and step are taken less
  each rank's last-step tail (``last_step_tail_ns`` per step: idle the step rule infers after
  the last device work, which HTA and TraceLens do not count), so no finding rests on the tail
  alone. Names the rank with the largest idle share. Severity: the least idle rank's idle less
  its tail (every rank's GPU loses at least that per step; a mean would count a waiting rank's
  idle twice with the straggler's).
* imbalance: >= 2 ranks and their work per step (``ranks[].work_ns`` = compute + own
  transfer, analyzer/analyses/commsplit.py; never the traced step, which holds the waiting:
  the rank that waits for a straggler has the longest traced step) spread (max - min) >=
  ``IMBALANCE_FRAC`` of the largest, and the slowest rank's work over the mean >=
  ``MIN_STAKE_FRAC`` of the step. Cause "rank R computes longer than its peers" when the
  compute spread (``compute_ns`` max - min) is >= ``CAUSE_THRESHOLD`` of the work spread; on
  a CPU run on a busy or oversubscribed machine, "CPU contention (...)" instead. Severity:
  the slowest rank's work - the mean over ranks.
* memory_does_not_fit: ``memory.fit.fits`` is False (``--device-memory``). Severity: the
  whole step (the run does not run on that device).
* low_busbw: among the run's kinds whose mean bytes per call are >= ``BUSBW_MIN_BYTES`` (below
  that a collective is latency-bound: nccl-tests' curves are flat there), one whose busbw (from
  transfer when every compared kind has it, else over the whole duration) is < ``LOW_BUSBW_FRAC``
  of the best kind's; the same among the process groups / dtypes of one kind (``comm_groups``).
  Severity: its time per step x (1 - busbw / best): what it would save at the best's bandwidth.
  Action per backend (``RunEntry.backend``): NCCL_DEBUG=INFO only for NCCL; gloo's interface
  variable for gloo; message sizes and the link otherwise.
* mesh_dimension: a run with >= 2 mesh dimensions: each named one (not "unknown") whose
  ``exposed_ns_per_step`` is >= ``MESH_DIM_FRAC`` of the step. Cause as for
  exposed_communication, from the dimension's ``wait_ns`` / ``transfer_ns`` over ``time_ns``.
  Severity: ``exposed_ns_per_step``.
* pipeline_bubble: a pipelined run whose stages' mean bubble share (``pipeline.per_stage[]
  .bubble_frac``) is >= the schedule's ideal (``pipeline.ideal_bubble_frac``, (P - 1) / (M + P
  - 1) for gpipe / 1f1b, analyzer/analyses/pipeline.py ``IDEAL_BUBBLES`` for the others; none
  for dualpipev) + ``BUBBLE_EXCESS_FRAC``. Names the stage with the largest bubble. Action: more
  microbatches (with the ideal that doubling M gives), or a schedule with several stages per
  rank (already several: more of them); zbv, whose ideal is 0 at any M: even out the stages'
  work; on a busy or oversubscribed machine, a quiet machine first. Severity, in the stages'
  own figures: their mean ``bubble_ns`` - ideal x their mean ``step_ns``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec

from analyzer.analyses.pipeline import ideal_bubble_frac
from analyzer.contract import strategies
from analyzer.contract.arms import arm_label, name_says_settings
from analyzer.contract.report_types import (CAUSE_THRESHOLD, FINDING_KINDS, Evidence, Finding,
                                            Report, RunEntry, machine_busy)

MIN_STAKE_FRAC = 0.01
"""straggler, prefetch_late, imbalance: not reported below this share of the step."""
EXPOSED_FRAC = 0.10
"""exposed_communication: exposed communication per step >= this share of the step."""
LOW_OVERLAP_FRAC = 0.5
"""exposed_communication: an overlap option is suggested only below this overlap share."""
HOST_BOUND_FRAC = 0.20
"""host_bound: GPU idle >= this share of the step."""
IMBALANCE_FRAC = 0.10
"""imbalance: ranks' work spread >= this share of the slowest rank's work per step."""
LOW_BUSBW_FRAC = 0.25
"""low_busbw: busbw < this share of the run's best kind's (or group's)."""
BUSBW_MIN_BYTES = 1 << 20
"""low_busbw: only kinds / groups moving at least this many bytes per call (1 MiB) compare."""
MESH_DIM_FRAC = 0.10
"""mesh_dimension: a dimension's exposed time per step >= this share of the step."""
BUBBLE_EXCESS_FRAC = 0.05
"""pipeline_bubble: the stages' mean bubble share >= the schedule's ideal + this share."""

_NOT_ESTABLISHED = "cause not established"


def pointer(*keys: str | int) -> str:
    """The JSON pointer (RFC 6901) of ``keys`` from report.json's root: ``~`` -> ``~0``,
    ``/`` -> ``~1`` in each key."""
    return "".join("/" + str(k).replace("~", "~0").replace("/", "~1") for k in keys)


def who(run: RunEntry, *, arm_only: bool = False) -> str:
    """The run as a title names it: its name (``arm_only``: its arm's, for the repeats of an
    arm together), and for a declared arm (``tracer record --arm`` / ``--sweep``) its strategy
    and declared settings where the arm's name does not say them: ``noreshard.r1 (fsdp2 with
    reshard_after_forward=False)``."""
    exp = run.experiment or {}
    settings, arm = exp.get("settings"), exp.get("arm") or run.name
    name = arm if arm_only else run.name
    if settings is None or name_says_settings(arm, run.strategy, settings):
        return name
    return f"{name} ({arm_label(arm, run.strategy, settings, show_name=False)})"


class _Run:
    """One run of the report, with the pointers of its figures (``at``) and its step."""

    def __init__(self, index: int, run: RunEntry) -> None:
        self.i, self.run = index, run
        self.step_ns = run.step_time_ns.median
        self.who = who(run)

    def at(self, *keys: str | int) -> str:
        return pointer("runs", self.i, *keys)

    def ev(self, figure: str, value, unit: str, *keys: str | int) -> Evidence:
        return Evidence(figure=figure, value=value, unit=unit, path=self.at(*keys))

    def step_ev(self) -> Evidence:
        return self.ev("median step time", self.step_ns, "ns", "step_time_ns", "median")

    def stake_ok(self, ns: float | None, frac: float) -> bool:
        """``ns`` >= ``frac`` of the step (False when either is unknown)."""
        return ns is not None and bool(self.step_ns) and ns >= frac * self.step_ns


def _split_cause(wait_ns: float | None, transfer_ns: float | None, time_ns: float | None
                 ) -> tuple[str | None, str | None, float | None]:
    """(cause, rule, explained_frac) of communication time split into wait and transfer
    (analyzer/analyses/commsplit.py): the part >= CAUSE_THRESHOLD of ``time_ns``, if any."""
    if not time_ns or wait_ns is None or transfer_ns is None:
        return None, None, None
    for part, ns, cause in (("wait", wait_ns, "waiting for the group's last rank to start"),
                            ("transfer", transfer_ns, "moving the data (transfer)")):
        if ns / time_ns >= CAUSE_THRESHOLD:
            return cause, (f"{part}_ns / time_ns of the collectives >= {CAUSE_THRESHOLD:g} "
                           "(transfer: from the group's last start to the end; wait: before "
                           "it)"), ns / time_ns
    return None, None, None


def _hang(r: _Run) -> Iterator[Finding]:
    fr = r.run.flight_recorder
    if fr is None:
        return
    for j, g in enumerate(fr.groups):
        if not g.verdict or not g.statement:
            continue
        at = ("flight_recorder", "groups", j)
        ev = ([r.ev(f"process group {g.pg}: last collective every dumped rank completed",
                    g.last_completed_seq, "count", *at, "last_completed_seq")]
              if g.last_completed_seq is not None else [])
        if g.verdict == "collective_hang":
            # a member never entered the next collective; else, with members without a
            # dump, those are the ones to look at (a dumped member did not complete it)
            ranks = g.never_entered or g.missing_dumps
            if g.next_seq is not None:
                ev.append(r.ev(f"process group {g.pg}: the collective some rank never entered",
                               g.next_seq, "count", *at, "next_seq"))
            action = (f"look at what rank{'s' if len(ranks) > 1 else ''} "
                      f"{', '.join(map(str, ranks))} did instead (its log, the stack of its "
                      "newest Flight Recorder entry): a rank that skips or reorders a collective "
                      "hangs its peers" if g.never_entered else
                      f"look at what rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                      "did (no Flight Recorder dump: its log, whether it died or hung before "
                      "dumping): a dumped rank entered the collective and did not complete it" if ranks else
                      "every rank entered it and some never completed it: look at the ranks' "
                      "logs for a rank that died or a transport error")
        elif g.verdict == "mismatch":
            ranks = sorted({m.rank for m in g.mismatches})
            ev.append(r.ev(f"process group {g.pg}: the first collective whose entries differ",
                           g.mismatches[0].seq, "count", *at, "mismatches", 0, "seq"))
            action = ("make every rank call the same collective with the same shape and dtype "
                      f"at #{g.mismatches[0].seq}")
        else:  # p2p_pending: a send / recv whose peer never entered the matching op
            ranks = sorted({p.peer for p in g.p2p_pending})
            ev += [r.ev(f"rank {p.rank}'s {p.op} #{p.p2p_seq}: point-to-point op number",
                        p.p2p_seq, "count", *at, "p2p_pending", k, "p2p_seq")
                   for k, p in enumerate(g.p2p_pending[:3])]
            action = (f"look at what rank{'s' if len(ranks) > 1 else ''} "
                      f"{', '.join(map(str, ranks))} did instead of the matching "
                      "send / recv: pipeline stages must issue their sends and recvs in the "
                      "same order")
        where = f"process group {g.pg}" + (f" ({g.desc})" if g.desc else "")
        yield Finding(kind="hang", title=f"{r.who} hung in {where}", runs=[r.run.name],
                      ranks=list(ranks), evidence=ev, cause=g.statement,
                      cause_rule="the Flight Recorder dumps of every rank "
                                 "(analyzer/analyses/flightrec.py): " + fr.rule,
                      action=action, severity_ns=r.step_ns or None)


def _parity_failed(r: _Run) -> Iterator[Finding]:
    p = r.run.parity
    if p.status != "fail":
        return
    fd = p.first_divergence
    ev = [r.step_ev()]
    if fd is not None:
        ev += [r.ev(f"first divergence {name}", getattr(fd, name), unit,
                    "parity", "first_divergence", name)
               for name, unit in (("max_abs_diff", "value"), ("limit", "value"),
                                   ("rel_l2", "ratio"))]
    where = f": first divergence {fd.subject} (step {fd.step})" if fd else ""
    yield Finding(kind="parity_failed", title=f"{r.who} does not reproduce the "
                  f"baseline{where}", runs=[r.run.name], evidence=ev,
                  action=None if fd is None else f"look at {fd.subject} at step {fd.step}: "
                  "the first check the run fails",
                  severity_ns=r.step_ns)


_STRAGGLER_ACTION = {
    "device_compute": "its device computes longer than its peers': balance the work across "
                      "ranks (batch split, sequence lengths, embedding tables)",
    "host_delay": "its host launches the work late: look at that rank's CPU timeline for host "
                  "syncs (.item(), .cpu()), Python overhead or CPU contention",
    "data_wait": "it waits for its input: raise the DataLoader's num_workers on that rank",
    "own_collective": "an earlier collective of its own delays it: look at the collective "
                      "before it on that rank (another process group)",
    "late_step_start": "look at what that rank did before this step, which the trace does not "
                       "show: the previous step's end (optimizer, a host sync), data loading, "
                       "checkpointing or logging on that rank; a trace that starts a step "
                       "earlier shows it",
}
"""GPU runs: the action per straggler cause (analyzer/analyses/straggler.py's parts)."""
_STRAGGLER_ACTION_CPU = {
    **_STRAGGLER_ACTION,
    "device_compute": "it computes longer than its peers (its ops on the CPU): balance the work "
                      "across ranks (batch split, sequence lengths)",
    "host_delay": "nothing is recorded on that rank while its peers go on: look at its untraced "
                  "time between ops (Python, a sleep, a lock) and at other processes on its CPUs",
}
"""CPU runs (gloo): no device, no launch; host_delay is time with nothing recorded."""
_LATE_START_CAUSE = "rank {rank} entered the step after the first rank: the delay lies before " \
    "the step's window"
"""late_step_start in words: what the trace establishes, not why (the figure is evidence)."""
_CONTENTION_PARTS = {"gpu": ("host_delay",), "cpu": ("device_compute", "host_delay")}
"""Straggler parts a busy machine's CPU contention accounts for, per device kind: on a GPU the
kernels do not run on the CPUs, so their time is not contention."""
_CONTENTION_ACTION = ("the ranks share the CPUs: run fewer ranks per host or fewer threads per "
                      "rank (torch.set_num_threads, OMP_NUM_THREADS), or measure on a quiet "
                      "machine; the work across ranks need not be rebalanced")


def _device_kind(run: RunEntry) -> str:
    """"gpu" or "cpu": the traces' device kind, else the manifest's device."""
    if run.trace_info is not None:
        return run.trace_info.device_kind
    return "cpu" if (run.device or "cpu") == "cpu" else "gpu"


def _contention(r: _Run) -> tuple[str, list[Evidence]] | None:
    """("4 ranks x 2 threads on 2 CPUs", its evidence) when the run's
    manifest ``machine`` says the record ran on an oversubscribed machine (ranks_on_host x
    threads_per_rank > usable_cpus) or a busy one (1-minute load >= usable_cpus), as
    ``report_types.machine_busy`` decides it; else None (foreign traces: no
    machine)."""
    if not machine_busy(r.run.machine):
        return None
    m = r.run.machine
    cpus, load = m.get("usable_cpus"), (m.get("load_avg") or [None])[0]
    over = bool(m.get("oversubscribed"))
    n, t = m.get("ranks_on_host"), m.get("threads_per_rank")
    ev = [r.ev(f"{name} (manifest machine)", m[key], "count", "machine", key)
          for key, name in (("ranks_on_host", "ranks on the host"),
                            ("threads_per_rank", "threads per rank"),
                            ("usable_cpus", "usable CPUs")) if m.get(key) is not None]
    if load is not None:
        ev.append(r.ev("1-minute load average at the start (manifest machine)", load, "count",
                       "machine", "load_avg", 0))
    what = (f"{n} ranks x {t} threads on {cpus} CPUs" if over and n and t else
            f"1-minute load {load:g} on {cpus} CPUs")
    return what, ev


_CONTENTION_RULE = ("the manifest's machine: ranks_on_host x threads_per_rank > usable_cpus "
                    "(oversubscribed) or 1-minute load >= usable_cpus: the ranks' CPU time is "
                    "shared, so its {part} is the machine's, not the rank's work")


def _straggler(r: _Run) -> Iterator[Finding]:
    steps = r.run.profiled_steps or 1
    device = _device_kind(r.run)
    busy = _contention(r)
    for j, s in enumerate(r.run.stragglers):
        late = s.late_ns / steps
        if not r.stake_ok(late, MIN_STAKE_FRAC):
            continue
        named = s.cause is not None and (s.explained_frac or 0) >= CAUSE_THRESHOLD
        first = []
        if named and s.cause == "late_step_start":
            first = [r.ev(f"rank {s.rank}'s step start after the first rank's (all profiled "
                          "steps)", s.split_ns.get(s.cause), "ns", "stragglers", j, "split_ns",
                          s.cause)]
        ev = [*first,
              r.ev(f"lateness of rank {s.rank} over {s.kind} (all profiled steps)", s.late_ns,
                   "ns", "stragglers", j, "late_ns"),
              r.ev(f"{s.kind} calls rank {s.rank} started last", s.times_last, "count",
                   "stragglers", j, "times_last"),
              *[r.ev(f"lateness split: {part}", ns, "ns", "stragglers", j, "split_ns", part)
                for part, ns in s.split_ns.items() if not (first and part == s.cause)],
              r.step_ev()]
        cause, rule = (s.cause, s.rule or None) if named else (None, None)
        action = (_STRAGGLER_ACTION_CPU if device == "cpu" else _STRAGGLER_ACTION).get(s.cause) \
            if named else None
        label = cause or _NOT_ESTABLISHED
        if named and s.cause == "late_step_start":
            cause, label = _LATE_START_CAUSE.format(rank=s.rank), "late step start"
        elif named and busy is not None and s.cause in _CONTENTION_PARTS[device]:
            what, more = busy
            cause, label = f"CPU contention ({what})", f"CPU contention: {what}"
            action = _CONTENTION_ACTION
            rule = f"{s.rule}; " + _CONTENTION_RULE.format(part=s.cause)
            ev = ev[:-1] + more + ev[-1:]
        yield Finding(kind="straggler", title=f"{r.who}: the {s.kind} waits for rank {s.rank} "
                      f"({label})", runs=[r.run.name], ranks=[s.rank],
                      evidence=ev, cause=cause, cause_rule=rule,
                      explained_frac=s.explained_frac if named else None,
                      action=action, severity_ns=late)


def _overlap_action(strategy: str, kind: str) -> str | None:
    row = strategies.spec(strategy)
    if row is not None and row.wrapper == "ddp" and kind == "all_reduce":
        return ("DDP: try a smaller bucket_cap_mb (torch's default: a 1 MiB first bucket, then "
                "25 MiB) so that the first buckets' "
                "all_reduce starts earlier in backward and overlaps more of it")
    if row is not None and row.is_flat and row.dim_of("shard") and kind == "all_gather":
        return ("FSDP: prefetch the next unit's all_gather (FSDP1 forward_prefetch=True, "
                "backward_prefetch=BACKWARD_PRE; FSDP2 set_modules_to_forward_prefetch / "
                "set_modules_to_backward_prefetch)")
    return None


def _dim_of_kind(run: RunEntry, kind: str) -> tuple[int, object] | None:
    """(index, ``mesh_dims`` entry) of the named mesh dimension where ``kind`` spends the most
    time (``comm_groups[].time_ns`` by ``mesh_dim``): a headline names a kind with its own
    dimension (HSDP's all_reduce is on replicate, whatever the shard dimension exposes)."""
    time_ns: dict[str, float] = {}
    for g in run.comm_groups:
        if g.kind == kind and g.mesh_dim:
            time_ns[g.mesh_dim] = time_ns.get(g.mesh_dim, 0.0) + g.time_ns
    dims = [(j, d) for j, d in enumerate(run.mesh_dims) if d.name != "unknown"
            and d.exposed_ns_per_step is not None and time_ns.get(d.name)]
    return max(dims, key=lambda jd: time_ns[jd[1].name]) if dims else None


def _exposed_communication(r: _Run) -> Iterator[Finding]:
    run = r.run
    if not r.stake_ok(run.exposed_comm_ns, EXPOSED_FRAC) or not run.communication:
        return
    kind, top = max(run.communication.items(), key=lambda kv: kv[1].time_ns_per_step or 0.0)
    ev = [r.ev("exposed communication per step (mean over ranks)", run.exposed_comm_ns, "ns",
               "exposed_comm_ns"), r.step_ev(),
          r.ev("overlap of communication with computation", run.overlap_frac, "frac",
               "overlap_frac"),
          r.ev(f"{kind} time per step", top.time_ns_per_step, "ns", "communication", kind,
               "time_ns_per_step")]
    parts = list(run.communication.values())
    wait = transfer = None
    if all(k.wait_ns_per_step is not None and k.transfer_ns_per_step is not None for k in parts):
        wait = sum(k.wait_ns_per_step for k in parts)
        transfer = sum(k.transfer_ns_per_step for k in parts)
        for name, k in run.communication.items():
            ev += [r.ev(f"{name} waiting per step", k.wait_ns_per_step, "ns",
                        "communication", name, "wait_ns_per_step"),
                   r.ev(f"{name} transfer per step", k.transfer_ns_per_step, "ns",
                        "communication", name, "transfer_ns_per_step")]
    cause, rule, frac = _split_cause(wait, transfer,
                                     sum(k.time_ns_per_step or 0.0 for k in parts))
    mesh = []
    if (found := _dim_of_kind(run, kind)) is not None:
        j, d = found
        mesh = [d.name]
        ev.append(r.ev(f"mesh dimension {d.name} exposed per step", d.exposed_ns_per_step,
                       "ns", "mesh_dims", j, "exposed_ns_per_step"))
    units = []
    exposed_units = [(j, u) for j, u in enumerate(run.prefetch.units if run.prefetch else [])
                     if u.comm_ns and u.hidden_frac is not None and u.hidden_frac < 1.0]
    if kind == "all_gather" and exposed_units:
        j, u = max(exposed_units, key=lambda ju: ju[1].comm_ns * (1 - ju[1].hidden_frac))
        units = [u.unit]
        ev += [r.ev(f"{u.phase} unit {u.unit}: all_gather time (mean per call)", u.comm_ns,
                    "ns", "prefetch", "units", j, "comm_ns"),
               r.ev(f"{u.phase} unit {u.unit}: share hidden under computation", u.hidden_frac,
                    "frac", "prefetch", "units", j, "hidden_frac")]
    action = None
    if cause is not None and cause.startswith("waiting"):
        action = ("find the rank the others wait for (straggler, imbalance) and even out its "
                  "work: overlap cannot hide a wait")
    elif cause is not None and (run.overlap_frac or 0.0) < LOW_OVERLAP_FRAC:
        action = _overlap_action(run.strategy, kind)
    where = "".join([f" (mesh dimension {mesh[0]})" if mesh else "",
                     f", FSDP unit {units[0]} most exposed" if units else ""])
    yield Finding(kind="exposed_communication",
                  title=f"{r.who}: communication is exposed, mostly {kind}{where}: "
                  f"{cause or _NOT_ESTABLISHED}", runs=[run.name], mesh_dims=mesh, units=units,
                  evidence=ev, cause=cause, cause_rule=rule, explained_frac=frac,
                  action=action, severity_ns=run.exposed_comm_ns)


def _prefetch_late(r: _Run) -> Iterator[Finding]:
    pf, run = r.run.prefetch, r.run
    if pf is None or pf.late <= 0 or not run.ranks:
        return
    stake = pf.wait_ns / (len(run.ranks) * (run.profiled_steps or 1))
    if not r.stake_ok(stake, MIN_STAKE_FRAC):
        return
    late = sorted(((j, u) for j, u in enumerate(pf.units)
                   if u.min_slack_ns is not None and u.min_slack_ns < 0),
                  key=lambda ju: ju[1].min_slack_ns)
    ev = [r.ev("late all_gathers (all ranks and steps)", pf.late, "count", "prefetch", "late"),
          r.ev("all_gathers (all ranks and steps)", pf.all_gathers, "count", "prefetch",
               "all_gathers"),
          r.ev("waiting for late all_gathers (all ranks and steps)", pf.wait_ns, "ns",
               "prefetch", "wait_ns"), r.step_ev()]
    for j, u in late[:3]:
        ev += [r.ev(f"{u.phase} unit {u.unit}: worst slack", u.min_slack_ns, "ns",
                    "prefetch", "units", j, "min_slack_ns"),
               r.ev(f"{u.phase} unit {u.unit}: share prefetched", u.prefetched, "frac",
                    "prefetch", "units", j, "prefetched")]
    phases = sorted({u.phase for _, u in late})
    if any((u.prefetched or 0.0) < 1.0 for _, u in late):
        action = ("prefetch it: " + "; ".join(
            {"forward": "forward: FSDP1 forward_prefetch=True, FSDP2 "
                        "set_modules_to_forward_prefetch",
             "backward": "backward: FSDP1 backward_prefetch=BACKWARD_PRE, FSDP2 "
                         "set_modules_to_backward_prefetch"}.get(p, p) for p in phases))
    else:
        action = ("it is prefetched but too late: issue it further ahead (FSDP2 "
                  "set_modules_to_forward_prefetch with two modules ahead; FSDP1 "
                  "limit_all_gathers=False)")
    names = ", ".join(f"{u.phase} {u.unit}" for _, u in late[:3]) + (" ..." if len(late) > 3 else "")
    yield Finding(kind="prefetch_late", title=f"{r.who}: FSDP all_gathers finish after "
                  f"their unit needs them ({names or 'units not named'})", runs=[run.name],
                  units=[u.unit for _, u in late], evidence=ev, action=action,
                  severity_ns=stake)


def _input_bound(r: _Run) -> Iterator[Finding]:
    d, run = r.run.data, r.run
    if d is None or not d.input_bound or d.worst_rank is None:
        return
    j, rank = next(((j, x) for j, x in enumerate(run.ranks) if x.rank == d.worst_rank),
                   (None, None))
    ev = [r.ev(f"rank {d.worst_rank}'s share of its step waiting for data", d.worst_rank_frac,
               "frac", "data", "worst_rank_frac"),
          r.ev("input-bound threshold", d.threshold_frac, "frac", "data", "threshold_frac"),
          r.ev("share of all ranks' steps waiting for data", d.data_wait_frac, "frac", "data",
               "data_wait_frac")]
    if rank is not None:
        ev.append(r.ev(f"rank {d.worst_rank}'s data wait per step", rank.data_wait_ns, "ns",
                       "ranks", j, "data_wait_ns"))
    action = "raise the DataLoader's num_workers"
    if isinstance(d.workers, int):
        ev.append(r.ev("DataLoader workers", d.workers, "count", "data", "workers"))
        action += (f" (now {d.workers}: loading runs in the training process)" if d.workers == 0
                   else f" above {d.workers}")
    if d.pin_memory is False and _on_gpu(run):  # pinned memory speeds host-to-device copies only
        action += "; pin_memory=True"
    yield Finding(kind="input_bound", title=f"{r.who}: input-bound: rank {d.worst_rank} "
                  "waits for its next batch with nothing else to do", runs=[run.name],
                  ranks=[d.worst_rank], evidence=ev, action=action,
                  severity_ns=None if rank is None else rank.data_wait_ns)


def _on_gpu(run: RunEntry) -> bool:
    """The run's traces hold GPU work (advice that names a GPU feature needs it)."""
    return run.trace_info is not None and run.trace_info.device_kind == "gpu"


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def _host_bound(r: _Run) -> Iterator[Finding]:
    """host_bound (module docstring), on idle seen between device work: each rank's idle and
    step per step less its last step's tail (``RankFigures.last_step_tail_ns`` / steps, idle
    the step rule infers after the last device work, which HTA and TraceLens do not count), so
    a run whose only idle is that tail gets no finding; the tail is cited beside the idle it
    was taken from."""
    run = r.run
    if run.trace_info is None or run.trace_info.device_kind != "gpu" or not run.ranks:
        return

    def less_tail(x, ns):  # ns per step without the rank's last-step tail
        tail = x.last_step_tail_ns or 0
        return None if ns is None else ns - (tail / x.steps if x.steps else 0)

    idle = _mean([less_tail(x, x.idle_ns) for x in run.ranks])
    step = _mean([less_tail(x, x.step_ns) for x in run.ranks])
    if idle is None or not step or idle < HOST_BOUND_FRAC * step:
        return
    known = [(j, x) for j, x in enumerate(run.ranks)
             if x.idle_ns is not None and less_tail(x, x.step_ns)]
    j, worst = max(known, key=lambda jx: less_tail(jx[1], jx[1].idle_ns)
                   / less_tail(jx[1], jx[1].step_ns))
    k, least = min(known, key=lambda jx: less_tail(jx[1], jx[1].idle_ns))
    ev = [r.ev(f"rank {worst.rank}'s GPU idle per step (largest share)", worst.idle_ns, "ns",
               "ranks", j, "idle_ns"),
          r.ev(f"rank {worst.rank}'s traced step", worst.step_ns, "ns", "ranks", j, "step_ns"),
          r.ev(f"rank {least.rank}'s GPU idle per step (least)", least.idle_ns, "ns",
               "ranks", k, "idle_ns")]
    ev += [r.ev(f"rank {x.rank}'s last-step tail (left out of its idle: "
                f"{x.steps} step(s))", x.last_step_tail_ns, "ns", "ranks", i,
                "last_step_tail_ns")
           for i, x in ((j, worst), (k, least))[:1 if j == k else 2] if x.last_step_tail_ns]
    yield Finding(kind="host_bound", title=f"{r.who}: the GPUs sit idle with no work "
                  f"launched, rank {worst.rank} most (host-/launch-bound; why the host is late: "
                  f"{_NOT_ESTABLISHED})", runs=[run.name], ranks=[worst.rank], evidence=ev,
                  action=(f"look at rank {worst.rank}'s CPU timeline in the gaps: host syncs "
                          "(.item(), .cpu(), cudaStreamSynchronize), Python between launches; "
                          "CUDA graphs (torch.compile mode='reduce-overhead') cut launch "
                          "overhead"), severity_ns=less_tail(least, least.idle_ns))


def _imbalance(r: _Run) -> Iterator[Finding]:
    ranks = [(j, x) for j, x in enumerate(r.run.ranks) if x.work_ns is not None]
    if len(ranks) < 2:
        return
    (js, slow), (jf, fast) = (max(ranks, key=lambda jx: jx[1].work_ns),
                              min(ranks, key=lambda jx: jx[1].work_ns))
    spread = slow.work_ns - fast.work_ns
    mean = sum(x.work_ns for _, x in ranks) / len(ranks)
    if (spread <= 0 or spread < IMBALANCE_FRAC * slow.work_ns
            or not r.stake_ok(slow.work_ns - mean, MIN_STAKE_FRAC)):
        return
    ev = [r.ev(f"rank {slow.rank}'s work per step (compute + own transfer; most)", slow.work_ns,
               "ns", "ranks", js, "work_ns"),
          r.ev(f"rank {fast.rank}'s work per step (compute + own transfer; least)", fast.work_ns,
               "ns", "ranks", jf, "work_ns"),
          r.ev(f"rank {slow.rank}'s own transfer per step", slow.transfer_ns, "ns", "ranks", js,
               "transfer_ns")]
    comp = [(j, x) for j, x in ranks if x.compute_ns is not None]
    cause = rule = frac = action = None
    (jc, cmax), (jd, cmin) = (max(comp, key=lambda jx: jx[1].compute_ns),
                              min(comp, key=lambda jx: jx[1].compute_ns))
    ev += [r.ev(f"rank {cmax.rank}'s compute (most)", cmax.compute_ns, "ns", "ranks", jc,
                "compute_ns"),
           r.ev(f"rank {cmin.rank}'s compute (least)", cmin.compute_ns, "ns", "ranks", jd,
                "compute_ns")]
    share = (cmax.compute_ns - cmin.compute_ns) / spread
    if share >= CAUSE_THRESHOLD:
        frac = min(share, 1.0)
        rule = (f"compute spread (max - min of ranks[].compute_ns) >= {CAUSE_THRESHOLD:g} "
                "x work spread (max - min of ranks[].work_ns)")
        busy = _contention(r) if _device_kind(r.run) == "cpu" else None
        if busy is not None:
            (what, more), action = busy, _CONTENTION_ACTION
            cause = f"CPU contention ({what})"
            rule += "; " + _CONTENTION_RULE.format(part="compute")
            ev += more
        else:
            cause = f"rank {cmax.rank} computes longer than its peers"
            action = "balance the work across ranks (batch split, sequence lengths, sharding)"
    ev.append(r.step_ev())
    yield Finding(kind="imbalance", title=f"{r.who}: ranks' work per step (compute + own "
                  f"transfer) differs, rank {slow.rank} slowest: {cause or _NOT_ESTABLISHED}",
                  runs=[r.run.name], ranks=[slow.rank, fast.rank], evidence=ev, cause=cause,
                  cause_rule=rule, explained_frac=frac, action=action,
                  severity_ns=slow.work_ns - mean)


def _memory_does_not_fit(r: _Run) -> Iterator[Finding]:
    fit = r.run.memory.fit
    if fit is None or fit.fits is not False:
        return
    ev = [r.ev("memory needed (largest rank)", fit.needed_bytes, "bytes", "memory", "fit",
               "needed_bytes"),
          r.ev("device memory", fit.device_bytes, "bytes", "memory", "fit", "device_bytes"),
          r.ev("spare (negative: short)", fit.spare_bytes, "bytes", "memory", "fit",
               "spare_bytes"), r.step_ev()]
    row = strategies.spec(r.run.strategy)
    action = ("activation checkpointing, a smaller per-rank batch, or CPU offload"
              if row is not None and row.shards_parameters(r.run.options)
              else "shard it (FSDP / FSDP2), or activation checkpointing / a smaller per-rank batch")
    yield Finding(kind="memory_does_not_fit", title=f"{r.who} does not fit the device "
                  f"({fit.basis})", runs=[r.run.name], evidence=ev, action=action,
                  severity_ns=r.step_ns)


_BANDWIDTH_ACTION = {
    "nccl": "check the link it crosses (NCCL_DEBUG=INFO names the transport: NVLink, PCIe, "
            "network) and its message sizes",
    "gloo": "check its message sizes and the network interface gloo sends over "
            "(GLOO_SOCKET_IFNAME sets it; on one host, loopback TCP through the CPUs)",
    "": "check its message sizes and the link it crosses",
}
"""low_busbw: the action per backend (``RunEntry.backend``; "": another or unknown): only the
tools that backend has (NCCL_DEBUG is NCCL's; gloo reads GLOO_SOCKET_IFNAME, torch.distributed's
documented variable: docs/source/distributed.rst, Common environment variables)."""


def _low_bandwidth(r: _Run, rows: list[tuple[str, tuple, object, float | None]], what: str
                   ) -> Iterator[Finding]:
    """``rows``: (name, pointer keys of the row, the row, its time per step)."""
    rows = [x for x in rows if x[2].bytes is not None and x[2].count
            and x[2].bytes / x[2].count >= BUSBW_MIN_BYTES]
    field = "transfer_busbw_gbps" if all(getattr(x[2], "transfer_busbw_gbps") is not None
                                         for x in rows) else "busbw_gbps"
    rows = [x for x in rows if getattr(x[2], field) is not None]
    if len(rows) < 2:
        return
    best = max(rows, key=lambda x: getattr(x[2], field))
    top = getattr(best[2], field)
    for name, keys, row, per_step in rows:
        bw = getattr(row, field)
        if top <= 0 or bw >= LOW_BUSBW_FRAC * top:
            continue
        ev = [r.ev(f"{name} {field}", bw, "GB/s", *keys, field),
              r.ev(f"{best[0]} {field} (the run's best {what})", top, "GB/s", *best[1], field),
              r.ev(f"{name} bytes (per rank, all profiled steps)", row.bytes, "bytes", *keys,
                   "bytes"),
              r.ev(f"{name} calls (per rank, all profiled steps)", row.count, "count", *keys,
                   "count")]
        yield Finding(kind="low_busbw", title=f"{r.who}: {name} moves data far slower "
                      f"than the run's best {what} ({best[0]})", runs=[r.run.name], evidence=ev,
                      action=_BANDWIDTH_ACTION.get((r.run.backend or "").lower(),
                                                   _BANDWIDTH_ACTION[""]),
                      severity_ns=None if per_step is None else per_step * (1 - bw / top))


def _low_busbw(r: _Run) -> Iterator[Finding]:
    run = r.run
    steps = run.profiled_steps or 1
    yield from _low_bandwidth(r, [(k, ("communication", k), c, c.transfer_ns_per_step
                                   if c.transfer_ns_per_step is not None else c.time_ns_per_step)
                                  for k, c in run.communication.items()], "kind")
    for kind in sorted({g.kind for g in run.comm_groups}):
        yield from _low_bandwidth(r, [
            (f"{g.kind} pg {g.pg or '?'} {g.dtype or '?'}", ("comm_groups", j), g,
             g.time_ns / steps) for j, g in enumerate(run.comm_groups) if g.kind == kind],
            f"{kind} group")


def _mesh_dimension(r: _Run) -> Iterator[Finding]:
    run = r.run
    if len(run.mesh_dims) < 2:
        return
    for j, d in enumerate(run.mesh_dims):
        if d.name == "unknown" or not r.stake_ok(d.exposed_ns_per_step, MESH_DIM_FRAC):
            continue
        ev = [r.ev(f"{d.name} exposed per step", d.exposed_ns_per_step, "ns", "mesh_dims", j,
                   "exposed_ns_per_step"),
              r.ev(f"{d.name} running per step", d.union_ns_per_step, "ns", "mesh_dims", j,
                   "union_ns_per_step"), r.step_ev()]
        cause, rule, frac = _split_cause(d.wait_ns, d.transfer_ns, d.time_ns)
        if d.wait_ns is not None and d.transfer_ns is not None:
            ev += [r.ev(f"{d.name} waiting (all profiled steps)", d.wait_ns, "ns", "mesh_dims",
                        j, "wait_ns"),
                   r.ev(f"{d.name} transfer (all profiled steps)", d.transfer_ns, "ns",
                        "mesh_dims", j, "transfer_ns")]
        action = None
        if cause is not None and cause.startswith("waiting"):
            action = f"find the rank the {d.name} groups wait for and even out its work"
        elif cause is not None and d.name == "tp":  # NVLink exists only between GPUs
            action = ("keep TP inside a node (NVLink), or overlap it (async TP / sequence "
                      "parallel)" if _on_gpu(run) else "overlap it (async TP / sequence parallel)")
        elif cause is not None and d.name == "pp":
            action = "more microbatches per step (smaller pipeline bubble)"
        yield Finding(kind="mesh_dimension", title=f"{r.who}: the {d.name} "
                      f"{'/'.join(d.kinds) or 'collectives'} is exposed: "
                      f"{cause or _NOT_ESTABLISHED}", runs=[run.name], mesh_dims=[d.name],
                      evidence=ev, cause=cause, cause_rule=rule, explained_frac=frac,
                      action=action, severity_ns=d.exposed_ns_per_step)


def _pipeline_bubble(r: _Run) -> Iterator[Finding]:
    pp = r.run.pipeline
    if pp is None or pp.ideal_bubble_frac is None:
        return
    stages = [(j, s) for j, s in enumerate(pp.per_stage)
              if s.bubble_frac is not None and s.bubble_ns is not None and s.step_ns]
    if not stages:
        return
    j, worst = max(stages, key=lambda js: js[1].bubble_frac)
    measured = sum(s.bubble_frac for _, s in stages) / len(stages)
    if measured - pp.ideal_bubble_frac < BUBBLE_EXCESS_FRAC:
        return
    # in the stages' own figures (the Pipeline table): their bubble over the ideal share of their step
    bubble_ns = sum(s.bubble_ns for _, s in stages) / len(stages)
    step_ns = sum(s.step_ns for _, s in stages) / len(stages)
    ev = [e for k, s in stages for e in (
        r.ev(f"stage {s.stage} bubble per step", s.bubble_ns, "ns", "pipeline", "per_stage", k,
             "bubble_ns"),
        r.ev(f"stage {s.stage} step", s.step_ns, "ns", "pipeline", "per_stage", k, "step_ns"))]
    ev.append(r.ev(f"ideal bubble of the {pp.schedule or 'pipeline'} schedule",
                   pp.ideal_bubble_frac, "frac", "pipeline", "ideal_bubble_frac"))
    if pp.microbatches is not None:
        ev.append(r.ev("microbatches per step", pp.microbatches, "count", "pipeline",
                       "microbatches"))
    doubled = (ideal_bubble_frac(pp.stages, 2 * pp.microbatches, pp.schedule, pp.virtual_stages)
               if pp.microbatches else None)
    more = f" (M = {2 * pp.microbatches} gives an ideal of {100 * doubled:.0f} %)" if doubled is not None else ""
    action = (f"more microbatches per step{more}, or a schedule with a smaller bubble "
              "(torch.distributed.pipelining ScheduleInterleaved1F1B, "
              "ScheduleInterleavedZeroBubble: several stages per rank)")
    if pp.virtual_stages > 1:  # already interleaved: its bubble shrinks with V as with M
        action = f"more microbatches per step{more}, or more stages per rank (a larger V)"
    if doubled is not None and doubled >= pp.ideal_bubble_frac:  # zbv: its ideal is 0 at any M
        action = ("even out the stages' work: the schedule's ideal assumes equal forward, "
                  "input-backward and weight-backward times on every stage")
    if (busy := _contention(r)) is not None:  # shared CPUs leave stages waiting too
        action = (f"the ranks share the CPUs ({busy[0]}), which leaves stages waiting as "
                  f"well: measure on a quiet machine first; then {action}")
        ev += busy[1]
    yield Finding(kind="pipeline_bubble", title=f"{r.who}: the pipeline bubble is above its "
                  f"schedule's ideal, stage {worst.stage} most", runs=[r.run.name],
                  mesh_dims=[d] if (row := strategies.spec(r.run.strategy)) and (
                      d := row.dim_of("stage")) else [],
                  evidence=ev, action=action,
                  severity_ns=bubble_ns - pp.ideal_bubble_frac * step_ns)


RULES: dict[str, Callable[[_Run], Iterator[Finding]]] = {
    "hang": _hang, "parity_failed": _parity_failed, "straggler": _straggler,
    "exposed_communication": _exposed_communication, "prefetch_late": _prefetch_late,
    "input_bound": _input_bound, "host_bound": _host_bound, "imbalance": _imbalance,
    "memory_does_not_fit": _memory_does_not_fit, "low_busbw": _low_busbw,
    "mesh_dimension": _mesh_dimension, "pipeline_bubble": _pipeline_bubble}
assert tuple(RULES) == FINDING_KINDS


def findings(report: Report) -> list[Finding]:
    """Every rule (module docstring) over every run of ``report`` but projections (``tracer
    project``: fake collectives, one process's times), the repeats of one arm merged
    (``merge_repeats``), hangs first, then most severe first (a finding without a severity last; ties in
    ``FINDING_KINDS`` order, then by title)."""
    out: list[Finding] = []
    for group in _repeat_groups(report.runs):
        if report.runs[group[0]].projection is not None:
            continue  # a projection's times are one process's: its step is projected instead
        found = {i: [f for rule in RULES.values() for f in rule(_Run(i, report.runs[i]))]
                 for i in group}
        out += (found[group[0]] if len(group) == 1 else
                merge_repeats([report.runs[i] for i in group], [found[i] for i in group]))
    return sorted(out, key=lambda f: (f.kind != "hang", f.severity_ns is None, -(f.severity_ns or 0.0),
                                      FINDING_KINDS.index(f.kind), f.title))


def _repeat_groups(runs: list[RunEntry]) -> list[list[int]]:
    """Indices of ``runs`` grouped by (experiment id, arm) for runs recorded with ``--repeat``
    > 1; every other run alone."""
    groups: dict[object, list[int]] = {}
    for i, run in enumerate(runs):
        exp = run.experiment or {}
        key = ((exp.get("id"), exp.get("arm")) if exp.get("id") and (exp.get("repeats") or 1) > 1
               else ("run", i))
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def merge_repeats(runs: list[RunEntry], found: list[list[Finding]]) -> list[Finding]:
    """The findings of the repeats of one arm (``runs``, ``found[k]``: run k's findings) as one
    finding per (kind, ranks, units, mesh dimensions): a straggler on rank 1 in 4 of 5 repeats
    is one finding, not four, and one on rank 0 in the fifth is another (ranks that take turns
    say the straggler is the machine's noise). Each keeps the evidence, cause and action of the
    repeat whose severity is the median of the repeats it fired in (its evidence points into
    that run), ``runs`` = every repeat it fired in, and ``severity_ns`` = the mean over all
    the arm's repeats, 0 where it did not fire (the step time at stake per step of the arm).
    Its title names the arm and how many repeats: ``ddp in 4 of 5 repeats (figures of
    ddp.r2): the all_reduce waits for rank 1 (...)``."""
    by: dict[tuple, list[tuple[RunEntry, Finding]]] = {}
    for run, fs in zip(runs, found):
        for f in fs:
            key = (f.kind, tuple(f.ranks), tuple(f.units), tuple(f.mesh_dims))
            by.setdefault(key, []).append((run, f))
    out = []
    for fired in by.values():
        ranked = sorted(fired, key=lambda rf: rf[1].severity_ns or 0.0)
        run, shown = ranked[(len(ranked) - 1) // 2]
        title = shown.title
        if title.startswith(who(run)):
            title = (f"{who(run, arm_only=True)} in {len({r.name for r, _ in fired})} of "
                     f"{len(runs)} "
                     f"repeats (figures of {run.name}){title[len(who(run)):]}")
        stakes = [f.severity_ns for _, f in fired]
        out.append(msgspec.structs.replace(
            shown, title=title, runs=sorted({r.name for r, _ in fired}),
            severity_ns=None if any(v is None for v in stakes) else sum(stakes) / len(runs)))
    return out

