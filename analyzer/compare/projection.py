"""A projection's step at world N (issue 44, Deliver 3): the roles' compute and collective calls
from their traces, each call's time from the link model, replayed (analyzer/analyses/projstep.py).

From a ``tracer project`` run directory's tables (one trace per role, ``Projection.roles_run``),
per profiled step of each role:

- compute: the step's window (``breakdown.step_ns``) less the time of its fake calls (a fake
  collective completes at once, but its call still takes host time: the link time replaces it);
  on CUDA the window is the device's, which host calls do not occupy: nothing taken out, and a
  call's issue is its host time from the window's start, within the window (an approximation:
  a host that runs ahead of its device issues early; not yet checked on a GPU);
- calls: the step's collectives (ingest rule ``cpu.fake_pg_call``) in issue order, each with
  its kind, bytes, process group, the group's global ranks (``pg_ranks``; the world when the
  trace does not say), its mesh dimension (``meshdims.with_dims``) and its peer;
- where each call is needed (``need_ns``, the overlap rule, named in ``ProjectedStep.overlap``):
  on CPU (gloo) every call where it is issued: gloo's transfers run on the CPU cores the
  compute uses, so a call costs its link time whether or not it is waited for (FSDP's calls
  show no overlap in gloo records; DDP's bucket all_reduces run under backward on gloo's
  thread, but on a 2-rank, 2-vCPU record the step was 52 ms against 49 ms projected with
  them charged in full and 47.5 ms with them overlapped free, and at 4 ranks 69 ms against
  55 and 48: the overlap is paid for in compute); on CUDA (NCCL) an FSDP all_gather where its unit
  needs it (the prefetch table's ``need_ns``: ``FSDP::all_gather_copy_out``, torch's
  wait_for_unshard), a reduce_scatter or all_reduce on a data-parallel dimension at the end of
  the step's compute (the gradient reduction runs under backward and the optimizer needs it),
  any other call where it is issued; a send (``c10d::send``) by the end of the step's compute
  on either (torch.distributed.pipelining's schedules wait their sends after the microbatches);
- on fake tensors the compute is the manifest's estimate, the calls moved in proportion
  (``_estimated``).

Each call's link time: ``linkmodel.lookup`` of its kind, bytes, group size and node span (the
group's ranks over ``ranks_per_node``, default: the whole world on one node, said in the
assumptions); a size outside a curve's measured sizes is flagged and counted, a span no curve
has refused (``BadInput`` no_link_curve). Ranks that share a CPU's cores (CPU only): each
compute stretch x (ranks per node x threads per rank / usable CPUs) when above 1, from the
projection's manifest ``machine`` (the machine it ran on stands for the target's).

The step: the median replayed step over the profiled steps (the lower middle one of an even
count: a replayed step, whose compute and exposed communication add up to it); its interval:
from the fastest step replayed with each link row's low time to the slowest with its high time
(``linkmodel.LinkTime.low_ns`` / ``high_ns`` where the curve has a spread, else its time),
widened by the co-runners' steps (``_co_runner_spread``: every step measured of the role's
compute, its own and its co-runners', as a ratio to its own median).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

import pandas as pd

from analyzer.analyses import linkmodel, meshdims
from analyzer.analyses.projstep import Call, Role, replay
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import ProjectedStep, ProjectionRow, RunEntry

if TYPE_CHECKING:
    from analyzer.ingest.rundirs import RunDir

DATA_PARALLEL_DIMS = ("world", "shard", "replicate", "dp")
"""Mesh dimensions whose reduce_scatter / all_reduce reduce gradients (needed by the optimizer,
issued under backward); a tensor-parallel dimension's are needed at once."""


def _ranks(text: str, world: int) -> tuple[int, ...]:
    try:
        got = json.loads(text) if text else None
    except ValueError:
        got = None
    return tuple(int(r) for r in got) if isinstance(got, list) and got else tuple(range(world))


def _steps_of_role(rank: int, bd, coll, prefetch, world: int, nccl: bool
                   ) -> dict[int, Role]:
    """The rank's profiled steps as ``Role``s (module docstring), keyed by step number. Raises
    ``BadInput`` for a call whose bytes the trace does not give."""
    out = {}
    for row in bd[bd["rank"] == rank].itertuples(index=False):
        step, start = int(row.step), int(row.step_start_ns)
        calls = coll[(coll["rank"] == rank) & (coll["step"] == step)].sort_values("start_ns")
        pf = prefetch[(prefetch["rank"] == rank) & (prefetch["step"] == step)] \
            if nccl and len(prefetch) else prefetch.iloc[0:0]
        needs = sorted((int(i), int(n)) for i, n in zip(pf["issued_ns"], pf["need_ns"])
                       if pd.notna(i) and pd.notna(n))
        spent = 0  # fake calls' own time so far: taken out of the compute clock
        made: list[Call] = []
        spans: list[tuple[int, int]] = []  # (start, dur) of the calls, absolute ns
        for c in calls.itertuples(index=False):
            if int(c.bytes) < 0:
                raise BadInput(f"rank{rank} step {step}", "no_link_curve",
                               f"a {c.kind} call of process group {c.pg or '?'} has no bytes in "
                               "the trace: its link time cannot be looked up",
                               "project with tracer project, whose traces carry every call's bytes")
            issue = int(c.start_ns) - start - spent
            spans.append((int(c.start_ns), 0 if nccl else int(c.dur_ns)))
            spent += 0 if nccl else int(c.dur_ns)
            peer = int(c.peer)
            group = (tuple(sorted({rank, peer})) if c.kind == "send_recv" and peer >= 0
                     else _ranks(str(c.pg_ranks), world))  # a send / recv: the pair
            made.append(Call(kind=str(c.kind), pg=str(c.pg), group=group,
                             nbytes=int(c.bytes), issue_ns=issue, need_ns=issue,
                             dim=str(c.mesh_dim), peer=peer, direction=_direction(str(c.name))))
        compute = int(row.step_ns) - spent
        made = [replace(c, issue_ns=min(max(c.issue_ns, 0), compute), need_ns=min(max(
            c.need_ns, 0), compute)) for c in made]  # a GPU step's window is the device's
        # a send is waited for at the end of the schedule's phase (torch.distributed.pipelining
        # schedules.py: the send works are waited after the microbatches), not where issued
        made = [replace(c, need_ns=compute) if c.direction == "send" else c for c in made]
        if nccl:
            made = [_nccl_need(c, compute, spans[i][0], needs, start, spans)
                    for i, c in enumerate(made)]
        out[step] = Role(rank=rank, compute_ns=compute, calls=tuple(made))
    return out


def _direction(name: str) -> str:
    """A p2p op's side from its name: ``c10d::send`` "send", ``c10d::recv_`` /
    ``c10d::recv_any_source_`` "recv", else ""."""
    op = name.rpartition("::")[2]
    return "send" if op.startswith("send") else "recv" if op.startswith("recv") else ""


def _nccl_need(c: Call, compute: float, start_abs: int, needs: list[tuple[int, int]],
               step_start: int,
               spans: list[tuple[int, int]]) -> Call:
    """``c`` with its need on NCCL (module docstring); ``spans``: (start, dur) of the step's
    calls, absolute ns."""
    if c.kind == "all_gather":
        # its FSDP unit's row: the last all_gather issued (the FSDP::all_gather range that
        # encloses the call) at or before the call
        unit = [n for i, n in needs if i <= start_abs]
        if unit:
            need = unit[-1]
            # the compute clock at the need: its time less the calls' own time before it
            spent = sum(min(d, max(0, need - s)) for s, d in spans)
            return replace(c, need_ns=max(c.issue_ns, need - step_start - spent))
    if c.kind in ("reduce_scatter", "all_reduce") and c.dim in DATA_PARALLEL_DIMS:
        return replace(c, need_ns=max(c.issue_ns, compute))
    return c


def projected_step(run: "RunDir", tables, curves: list[linkmodel.LinkCurve], *,
                   ranks_per_node: int | None = None,
                   arrival: list[linkmodel.ArrivalCurve] | tuple = (),
                   links_from: str = "") -> ProjectedStep:
    """The projected step of projection ``run`` (its manifest has ``projection``) from its
    ``tables`` (``ingest.load_run``), the link ``curves`` and the ``arrival`` curves (module
    docstring); ``links_from`` names the files they came from in a refusal of a span. Raises ``BadInput``: no link curve for a group span, a call without bytes,
    roles that do not match."""
    m = run.manifest
    proj = m.projection
    world = proj.world_size
    nccl = proj.device == "cuda"
    rpn = min(ranks_per_node or proj.ranks_per_node or world, world)
    parts = tables.collectives
    parts = meshdims.with_dims(parts, world, m.mesh)
    bd, prefetch = tables.breakdown, tables.prefetch
    roles = {rt.rank: _steps_of_role(rt.rank, bd, parts, prefetch, world, nccl)
             for rt in tables.ranks}
    estimated = False
    if proj.fake_tensors:  # the trace's op times are the meta kernels': the estimate stands in
        roles = _estimated(run, roles, proj)
        estimated = True
    steps = sorted(set.intersection(*(set(s) for s in roles.values()))) if roles else []
    if not steps:
        raise BadInput(run.path, "not_a_trace", "the projection's roles share no profiled step",
                       "project again: each role's trace holds the profiled steps")
    scale, assumptions = ((1.0, [f"compute estimated, not measured (fake tensors): the "
                                 f"roofline of each operator's FLOPs and bytes at "
                                 f"{proj.device_tflops:g} TFLOP/s and {proj.device_mem_gbps:g} "
                                 "GB/s (tracer project --device-tflops / --device-mem-gbps), in "
                                 "the order and at the relative places the trace shows"])
                          if estimated else _compute_scale(m, rpn, nccl, proj.co_runners))
    role_ranks = sorted(roles)
    role_of = _role_of(m, role_ranks)

    def link(which: str):
        return _link_time(curves, rpn, which, links_from)

    waits = _Waits(arrival, rpn, nccl)
    wait = waits.end
    mid = [replay([roles[r][s] for r in role_ranks], role_of, link("time_ns"),
                  compute_scale=scale, wait=wait(0)) for s in steps]
    # the interval's ends: every step with the links' and waits' low (high) ends, at the role's
    # own compute and, with co-runners, at their fastest (slowest): more samples of it
    spread = None if estimated else _co_runner_spread(run, proj, role_ranks)
    low, high = ([replay([_scaled(roles[r][s], k) for r in role_ranks], role_of, link(end),
                         compute_scale=scale, wait=wait(i)).step_ns
                  for s in steps for k in ((1.0,) if spread is None else (1.0, spread[i - 1]))]
                 for i, end in ((1, "low_ns"), (2, "high_ns")))
    # the median step (the lower of the two middle ones for an even count): a replayed step,
    # so that its compute and exposed communication add up to it
    middle = sorted(mid, key=lambda r: r.step_ns)[(len(mid) - 1) // 2]
    step_ns = middle.step_ns
    tokens = m.batch.global_batch * m.batch.seq_len if m.batch.seq_len > 0 else None
    sources = sorted({c.source for c in curves})
    how = ("--ranks-per-node" if ranks_per_node else "tracer project --ranks-per-node"
           if proj.ranks_per_node else "the whole world on one node: --ranks-per-node to change")
    spans = {waits.span(c) for role in roles.values() for one in role.values() for c in one.calls}
    assumptions = [f"{rpn} ranks per node ({how})", *assumptions,
                   *filter(None, [_arrival_line(nccl, waits.waited, spans)])]
    flagged = sorted({f"{k} {b:,} bytes" for r in mid for k, b in r.outside})
    return ProjectedStep(
        world_size=world, steps=len(steps), step_ns=round(step_ns), low_ns=round(min(low)),
        high_ns=round(max(high)), compute_ns=round(step_ns - middle.exposed_ns),
        comm_ns=round(middle.comm_ns), exposed_comm_ns=round(middle.exposed_ns),
        exposed_by_dim_ns={k: round(v) for k, v in sorted(middle.exposed_by_dim_ns.items())},
        tokens_per_s_per_device=None if tokens is None or step_ns <= 0
        else tokens / (step_ns / 1e9) / world,
        overlap=("as the trace's order allows (NCCL): FSDP all_gathers where their unit needs "
                 "them, gradient reductions by the end of the step's compute" if nccl else
                 "none (gloo on CPU: a transfer runs on the cores the compute uses, so each "
                 "collective is charged in full, as if exposed)"),
        compute_scale=scale, link_sources=sources, outside_sizes=flagged,
        assumptions=assumptions,
        warnings=[] if estimated else _mixed_devices(proj.device, sources))


def _link_time(curves: list[linkmodel.LinkCurve], rpn: int, which: str, links_from: str):
    """The replay's link time of a call: ``linkmodel.lookup``'s ``which`` ("time_ns",
    "low_ns", "high_ns"; the time where the row has no spread) on its group span (``rpn``
    ranks per node); a span no curve has is refused naming ``links_from`` first."""
    def time_of(c: Call) -> tuple[float, str]:
        nodes = len({r // rpn for r in c.group})
        try:
            lt = linkmodel.lookup(curves, c.kind, c.nbytes, len(c.group), nodes)
        except BadInput as exc:
            if not links_from:
                raise
            raise BadInput(links_from, exc.reason, f"{exc.path}: {exc.message}",
                           exc.fix) from None
        t = getattr(lt, which, None) if which != "time_ns" else lt.time_ns
        return float(lt.time_ns if t is None else t), lt.outside
    return time_of


class _Waits:
    """The arrival wait of each call in the replay (``linkmodel.arrival_wait`` of its group
    span; none on NCCL), and the mean waits it gave, per span, for the assumption line."""

    def __init__(self, arrival, rpn: int, nccl: bool):
        self.arrival, self.rpn, self.nccl = arrival, rpn, nccl
        self.waited: dict[tuple[int, int], list[float]] = {}

    def span(self, c: Call) -> tuple[int, int]:
        """(group size, nodes it spans)."""
        return len(c.group), len({r // self.rpn for r in c.group})

    def end(self, which: int):
        """The replay's wait: 0 the mean wait, 1 its low end, 2 its high end."""
        def wait_of(c: Call, segment_ns: float) -> float:
            span = self.span(c)
            got = None if self.nccl else linkmodel.arrival_wait(self.arrival, *span, segment_ns)
            if got is not None and which == 0:
                self.waited.setdefault(span, []).append(got[0])
            return 0.0 if got is None else got[which]
        return wait_of


def _arrival_line(nccl: bool, waited: dict[tuple[int, int], list[float]],
                  spans: set[tuple[int, int]]) -> str:
    """The assumption line of the arrival wait ("" without collectives): the mean wait of each
    group span's collectives for their last rank (the link benchmark's arrival curve at the
    projection's compute segments), or why none was added."""
    if not spans:
        return ""
    if nccl:
        return ("each collective starts when its last rank issues it (one device per rank: no "
                "rank waits for a CPU core)")
    missing = sorted(spans - set(waited))
    said = [f"g={g}" + (f" n={n}" if n > 1 else "") + f": {sum(w) / len(w) / 1e6:.2g} ms"
            for (g, n), w in sorted(waited.items())]
    line = ("each collective starts its group's arrival wait after its last rank issues it, "
            "as the link benchmark measured it with every rank computing between calls (mean "
            "per call: " + "; ".join(said) + ")") if said else ""
    if missing:
        line += ("; " if line else "") + ("no arrival wait measured for " + ", ".join(
            f"g={g}" + (f" n={n}" if n > 1 else "") for g, n in missing)
            + " (nccl-tests, a report's transfers or an older link benchmark): those start "
            "when their last rank issues them")
    return line


def _scaled(role: Role, k: float) -> Role:
    """``role`` with its compute, and its calls' places in it, times ``k``."""
    return Role(rank=role.rank, compute_ns=role.compute_ns * k, calls=tuple(
        replace(c, issue_ns=c.issue_ns * k, need_ns=c.need_ns * k) for c in role.calls))


def _co_runner_spread(run, proj, role_ranks: list[int]) -> tuple[float, float] | None:
    """(lowest, highest) ratio of a profiled step's wall time, over the roles' own steps
    (steps.parquet) and their co-runners' (``Projection.co_runner_step_ns``), to the role's
    own median: the compute's spread over every step measured. None without co-runners."""
    import statistics as st

    from analyzer.analyses.memory import read_steps
    from analyzer.contract.schemas import STEPS_NAME

    if not proj.co_runner_step_ns:
        return None
    steps = read_steps(run.path / STEPS_NAME)
    ratios = []
    for rank in role_ranks:
        own = [int(v) for v in steps.loc[(steps["rank"] == rank) & steps["profiled"], "wall_ns"]]
        if not own:
            continue
        mid = st.median(own)
        ratios += [v / mid for v in own + proj.co_runner_step_ns.get(str(rank), [])]
    return (min(ratios), max(ratios)) if ratios else None


def _estimated(run, roles: dict[int, dict[int, Role]], proj) -> dict[int, dict[int, Role]]:
    """Fake tensors: each role's steps with their compute the manifest's estimate
    (``Projection.compute_estimate``: per role, the sum of its operators' roofline ns per step),
    the calls' issue and need moved in proportion (the trace gives their order and relative
    places, its meta kernels' times nothing more). Raises ``BadInput`` when the projection has
    no estimate (no --device-tflops / --device-mem-gbps)."""
    total: dict[int, int] = {}
    for e in proj.compute_estimate:
        if e.estimated_ns_per_step is None:
            raise BadInput(run.path, "no_link_curve", "a projection on fake tensors without a "
                           "compute estimate: its trace's op times are the meta kernels', not "
                           "the device's", "project again with --device-tflops and "
                           "--device-mem-gbps (the target device's peak and bandwidth)")
        total[e.rank] = total.get(e.rank, 0) + e.estimated_ns_per_step
    out = {}
    for rank, steps in roles.items():
        if rank not in total:
            raise BadInput(run.path, "no_link_curve", f"rank {rank}'s compute estimate is "
                           "missing from the manifest", "project again")
        out[rank] = {}
        for step, role in steps.items():
            k = total[rank] / role.compute_ns if role.compute_ns > 0 else 0.0
            out[rank][step] = replace(_scaled(role, k), compute_ns=total[rank])
    return out


def _mixed_devices(device: str, sources: list[str]) -> list[str]:
    """A warning when the compute and the links were measured on different kinds of machine:
    a CPU projection with nccl-tests or NCCL benchmark curves, a CUDA one with gloo curves
    (the link benchmark's source names its backend; nccl-tests runs on GPUs)."""
    gpu_links = [x for x in sources if x.startswith("nccl-tests") or "(nccl," in x]
    cpu_links = [x for x in sources if "(gloo," in x]
    if device != "cuda" and gpu_links:
        return ["compute measured on this machine's CPU, links from GPUs (" + "; ".join(
            gpu_links) + "): the step mixes the two; project on the target's GPU "
            "(tracer project --device cuda) to rank GPU layouts"]
    if device == "cuda" and cpu_links:
        return ["compute measured on a GPU, links from CPU / gloo (" + "; ".join(cpu_links)
                + "): the step mixes the two; pass nccl-tests output or an NCCL link benchmark"]
    return []


def _compute_scale(m, rpn: int, nccl: bool, co: int) -> tuple[float, list[str]]:
    """(compute multiplier, its assumption lines): CPU ranks sharing cores (module docstring).
    ``co``: copies of each role the projection ran at once (tracer/project.py
    ``co_runners``): their contention is in the measured compute already; what is left is
    time-sharing, ranks per node x threads over the CPUs when above 1."""
    if nccl or m.machine is None:
        return 1.0, ["one device per rank: compute as measured on this device" if nccl else
                     "compute as measured in this one process (no machine facts in the manifest)"]
    threads, cpus = m.machine.threads_per_rank, max(m.machine.usable_cpus, 1)
    scale = max(1.0, rpn * threads / cpus)
    measured = (f"compute measured with {co} copies of each role running at once"
                if co > 1 else "compute measured in one process, alone")
    return scale, [f"{measured}; x {scale:g}: {rpn} ranks of {threads} thread(s) share this "
                   f"machine's {cpus} usable CPUs" if scale > 1 else
                   f"{measured}: {rpn} ranks of {threads} thread(s) fit this machine's "
                   f"{cpus} usable CPUs"]


def _role_of(m, role_ranks: list[int]):
    """Global rank -> the role rank it plays: flat strategies and hsdp one role (rank 0's);
    a mesh whose roles are its last dimension's first members (fsdp2_tp ranks 0..T-1, pp
    stages 0..P-1: rank = dp x P + index, ``schemas.Mesh`` row-major)."""
    if len(role_ranks) == 1:
        only = role_ranks[0]
        return lambda rank: only
    width = len(role_ranks)
    return lambda rank: role_ranks[rank % width]


STATE = ("parameters", "gradients", "optimizer_state")
NUMERICS_SETTINGS = ("model", "precision", "training")
"""What a verifying run shares with the projection beside strategy and options: what changes
the numbers computed (the world size and batch change how they are split, which parity checks)."""


def projection_rows(runs: list[RunEntry]) -> list[ProjectionRow]:
    """The report's projections with a projected step (issue 44, Deliver 3): each verified by
    the first run of the report with the same strategy, strategy options and
    ``NUMERICS_SETTINGS`` whose parity passed (a small-scale run of the configuration, at any
    world size and batch: a projection moves no data, so its own numerics are never checked),
    else "numerics not verified" and not ranked; the same fault, and the options but the
    mesh's shape (``_layout``); ranked by projected step among the verified projections of one
    world size and setup (``_setup``), fastest first, the unverified after them; graded
    against a run of the same configuration at its world where the report holds one
    (``_grade_row``)."""
    from analyzer.compare.ranking import settings_differences

    passed = [r for r in runs if r.projection is None and r.parity.status == "pass"]
    rows = []
    for r in runs:
        ps = r.projected_step
        if ps is None:
            continue
        by = next((p.name for p in passed if p.strategy == r.strategy and p.fault == r.fault
                   and _layout(p.options) == _layout(r.options)
                   and not settings_differences([r, p], keys=NUMERICS_SETTINGS)), None)
        state = {}
        for c in r.memory.by_category:
            if c.category in STATE:
                state.setdefault(c.rank, 0)
                state[c.rank] += int(c.bytes)
        rows.append(ProjectionRow(
            run=r.name, strategy=r.strategy, world_size=ps.world_size, step_ns=ps.step_ns,
            low_ns=ps.low_ns, high_ns=ps.high_ns,
            tokens_per_s_per_device=ps.tokens_per_s_per_device,
            exposed_comm_ns=ps.exposed_comm_ns, state_bytes=max(state.values(), default=None),
            peak_bytes=r.memory.peak_allocated_bytes,
            fits=None if r.memory.fit is None else r.memory.fit.fits, verified_by=by))
    for x in rows:
        _grade_row(x, next(r for r in runs if r.name == x.run), runs)
    rows.sort(key=lambda x: (x.world_size, x.verified_by is None, x.step_ns))
    comparable: dict[tuple, int] = {}
    for x in rows:  # ranked among the projections of one world, batch, model and setup
        if x.verified_by is not None:
            key = (x.world_size, _setup(next(r for r in runs if r.name == x.run)))
            comparable[key] = x.rank = comparable.get(key, 0) + 1
    return rows


def _layout(options: dict) -> dict:
    """Strategy options but the mesh's shape, which follows the world size: a 2x2 HSDP record
    verifies the layout an 8x8 projection runs."""
    return {k: v for k, v in options.items() if k != "mesh"}


def _setup(run: RunEntry) -> str:
    """What projections ranked against each other share beside the world: batch, model,
    precision, training (their settings as the manifest wrote them)."""
    return json.dumps({k: (run.settings or {}).get(k) for k in GRADED_SETTINGS}, sort_keys=True,
                       default=str)


GRADED_SETTINGS = ("model", "batch", "precision", "training")
"""What must agree, beside strategy, options and world size, for a run of the report to grade a
projection (analyzer/compare/grade.py's configuration, from the report's entries)."""


def _grade_row(row: ProjectionRow, proj: RunEntry, runs: list[RunEntry]) -> None:
    """Set ``row``'s measured figures from the complete, timed runs of the report of the
    projection's configuration (``GRADED_SETTINGS``), if any: Deliver 4 inside the report.
    Repeats are pooled as ``analyzer grade`` pools them (analyzer/compare/grade.py): the median
    of every profiled step of every such run (a run without its step values: its median)."""
    import statistics

    from analyzer.compare.ranking import settings_differences

    same = [r for r in runs
            if (r.projection is None and not r.incomplete and r.strategy == proj.strategy
                and r.options == proj.options and r.world_size == row.world_size
                and r.step_time_ns.median
                and not settings_differences([proj, r], keys=GRADED_SETTINGS))]
    if not same:
        return
    pooled = [v for r in same for v in (r.step_time_ns.values_ns or [r.step_time_ns.median])]
    m = float(statistics.median(pooled))
    row.measured_run, row.measured_median_ns = ", ".join(r.name for r in same), m
    row.error = (row.step_ns - m) / m
    row.inside = row.low_ns <= m <= row.high_ns
