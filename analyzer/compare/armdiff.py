"""What differs between the arms of a declared experiment, without step-time noise (issue 42).

Step times of two arms on a shared machine differ by noise; what the arms *did* does not: how
many collectives of each kind each rank launched per step on each mesh dimension, how many bytes
they moved, and what each rank holds by memory category. ``differences(runs, ranking)`` gives
those figures per arm (``report_types.ArmDifference``, ``Ranking.differences``), only where the
arms differ (``RELATIVE``).

- Collectives: from ``runs[].comm_groups`` (per kind, process group and dtype: per-rank means
  over the ranks that ran it, all profiled steps) -- per (kind, mesh dimension) the calls and
  bytes summed over the dimension's process groups and dtypes, divided by the ranks of the
  dimension (each rank is in one group of a dimension) and by ``runs[].profiled_steps``. A kind
  an arm never launched counts 0; a run without traces (no profiled steps) is not measured.
- Kernels (issue 45): ``runs[].compute_kernels_per_step``, the kernels a rank ran per step
  (GPU compute kernels, a CPU rank's innermost compute ops: analyzer/analyses/breakdown.py
  ``compute_kernels``); ``--compile`` fuses ops into fewer kernels.
- Memory: ``runs[].memory.by_category`` (memory_categories.parquet), the largest rank's bytes
  per category. The categories are counted from the tensors a rank holds (reports/memory.py
  ``SOURCES``) and are measured on any device; the peak is measured only where it is an
  allocator's peak (``Memory.peak_lower_bound`` False: CUDA). On a record whose peak is a lower
  bound (CPU: the sum of the categories), a setting whose memory effect is transient
  (``TRANSIENT_MEMORY``) cannot be seen: one ``memory_unseen`` row names it.

An arm's figure is the mean over its repeats (collectives; repeats launch the same calls) or the
largest over them (memory).
"""

from __future__ import annotations

from msgspec import UNSET

from analyzer.contract.report_types import ArmDifference, Ranking, RunEntry

RELATIVE = 0.005
"""Figures of two arms differ when they are more than 0.5 % apart (of the larger): counts and
bytes of one setting repeat exactly; a mean over ranks may differ in the last digits."""

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
"""memory_categories.parquet's categories that add up (the fifth, ``peak``, is their sum on CPU)."""

TRANSIENT_MEMORY: dict[str, str] = {
    "reshard_after_forward": "transient unsharded parameters are not seen",
    "forward_prefetch": "parameters all-gathered ahead of their unit are not seen",
    "backward_prefetch": "parameters all-gathered ahead of their unit are not seen",
    "fsdp2_prefetch": "parameters all-gathered ahead of their unit are not seen",
    "reshard_after_forward_size": "parameter shards kept between forward and backward are not seen",
    "sharding_strategy": "parameters kept unsharded between forward and backward are not seen",
}
"""Declared settings whose memory effect lies in buffers that live only inside a step, with what
a sum of categories misses. torch's own words: ``fully_shard(reshard_after_forward=False)``
"keeps the unsharded parameters in memory after forward" (torch/distributed/fsdp/_fully_shard/
_fully_shard.py ``fully_shard``); ``BackwardPrefetch.BACKWARD_PRE`` "increases memory usage" by
all-gathering the next unit's parameters early, as ``forward_prefetch`` does in forward
(torch/distributed/fsdp/api.py ``BackwardPrefetch``, fully_sharded_data_parallel.py);
``ShardingStrategy.SHARD_GRAD_OP`` keeps parameters unsharded from forward to the end of
backward (api.py ``ShardingStrategy``). The tracer counts what a rank holds between steps and
the saved activations (reports/memory.py ``SOURCES``): none of these."""


def _differ(values: list[float | None]) -> bool:
    """True when the measured ``values`` are not all within ``RELATIVE`` of each other; values
    with a None (not measured) never differ."""
    if any(v is None for v in values) or len(values) < 2:
        return False
    top = max(abs(v) for v in values)
    return top > 0 and (max(values) - min(values)) > RELATIVE * top


def collective_figures(run: RunEntry) -> dict[tuple[str, str], tuple[float, float | None]]:
    """(kind, mesh dimension) -> (calls, bytes) per rank per profiled step of ``run`` (module
    docstring); bytes None when no instance's bytes are known. Empty without profiled steps."""
    steps = run.profiled_steps or 0
    if steps <= 0:
        return {}
    per_pg: dict[tuple[str, str, str], list[float]] = {}  # [calls x ranks, bytes x ranks, ranks, known]
    for g in run.comm_groups:
        n = g.n_ranks or 1
        acc = per_pg.setdefault((g.kind, g.mesh_dim or "unknown", g.pg), [0.0, 0.0, 0, 0])
        acc[0] += g.count * n
        if g.bytes is not None:
            acc[1] += g.bytes * n
            acc[3] = 1
        acc[2] = max(acc[2], n)  # a group's dtypes are run by the same ranks
    out: dict[tuple[str, str], list[float]] = {}
    for (kind, dim, _), (calls, nbytes, ranks, known) in per_pg.items():
        acc = out.setdefault((kind, dim), [0.0, 0.0, 0, 0])
        acc[0] += calls
        acc[1] += nbytes
        acc[2] += ranks
        acc[3] = acc[3] or known
    return {k: (c / r / steps, (b / r / steps) if known else None)
            for k, (c, b, r, known) in out.items()}


def _arm_order(runs: list[RunEntry], ranking: Ranking) -> list[str]:
    """The ranked arms in the experiment's declared order (``experiment.order``: a sweep's
    values as written), then any ranked arm it does not list, in ranking order."""
    ranked = [a.name for a in ranking.arms]
    declared = next(((r.experiment or {}).get("order") or [] for r in runs
                     if r.arm in ranked), [])
    return [a for a in declared if a in ranked] + [a for a in ranked if a not in declared]


def differences(runs: list[RunEntry], ranking: Ranking) -> list[ArmDifference]:
    """``Ranking.differences`` for ``ranking`` (of ``runs``): the collective and memory figures
    that differ between its arms (module docstring), collectives first (by kind, then mesh
    dimension), then memory; empty unless the ranking is of declared arms, ranked, with at
    least two arms."""
    if not ranking.declared or ranking.status != "ranked" or len(ranking.arms) < 2:
        return []
    arms = {a.name: a for a in ranking.arms}
    order = _arm_order(runs, ranking)
    by_name = {r.name: r for r in runs}
    members = {a: [by_name[n] for n in arms[a].runs if n in by_name] for a in order}
    return _kernel_rows(order, members) + _collective_rows(order, members) + _memory_rows(order, members, arms)


def _kernel_rows(order: list[str], members: dict[str, list[RunEntry]]) -> list[ArmDifference]:
    """The kernels per rank per step of each arm (mean over its repeats), where they differ: a
    fusion (``--compile``) or another kernel choice shows here without step-time noise."""
    vals: dict[str, float | None] = {}
    for a in order:
        got = [r.compute_kernels_per_step for r in members[a]]
        got = [None if v is UNSET else v for v in got]
        vals[a] = _mean(got) if got else None
    if not _differ(list(vals.values())):
        return []
    return [ArmDifference(what="compute_kernels", kind="compute", unit="kernels_per_step", values=vals)]


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def _collective_rows(order: list[str], members: dict[str, list[RunEntry]]) -> list[ArmDifference]:
    figs = {a: [collective_figures(r) for r in rs if (r.profiled_steps or 0) > 0]
            for a, rs in members.items()}
    if any(not f for f in figs.values()):
        return []  # an arm without traces: nothing measured to compare
    keys = sorted({k for fs in figs.values() for f in fs for k in f})
    out = []
    for kind, dim in keys:
        calls = {a: _mean([f.get((kind, dim), (0.0, 0.0))[0] for f in figs[a]]) for a in order}
        nbytes = {a: _mean([f.get((kind, dim), (0.0, 0.0))[1] for f in figs[a]]) for a in order}
        for what, unit, vals in (("collective_calls", "calls_per_step", calls),
                                 ("collective_bytes", "bytes_per_step", nbytes)):
            if _differ(list(vals.values())):
                out.append(ArmDifference(what=what, kind=kind, mesh_dim=dim, unit=unit,
                                         values=vals))
    return out


def _largest(run: RunEntry, category: str) -> int | None:
    vals = [c.bytes for c in run.memory.by_category if c.category == category]
    return max(vals) if vals else None


def _memory_rows(order: list[str], members: dict[str, list[RunEntry]], arms: dict
                 ) -> list[ArmDifference]:
    runs = [r for rs in members.values() for r in rs]
    allocator = bool(runs) and all(r.memory.peak_allocated_bytes is not None
                                   and not r.memory.peak_lower_bound for r in runs)
    out = []
    for cat in CATEGORIES + (("peak",) if allocator else ()):
        vals: dict[str, float | None] = {}
        for a in order:
            got = [_largest(r, cat) for r in members[a]]
            vals[a] = float(max(got)) if got and None not in got else None
        if _differ(list(vals.values())):
            out.append(ArmDifference(what="memory", kind=cat, unit="bytes", values=vals))
    if not allocator:
        keys = [k for k in dict.fromkeys(k for a in order for k in arms[a].settings)
                if k in TRANSIENT_MEMORY  # and the arms differ in it
                and len({repr(arms[a].settings.get(k)) for a in order}) > 1]
        if keys:
            out.append(ArmDifference(
                what="memory_unseen", values={a: None for a in order}, settings=keys,
                why="; ".join(dict.fromkeys(
                    ["CPU records sum categories"
                     if all(r.device in (None, "cpu") for r in runs)
                     else "the peak recorded is a lower bound"]
                    + [TRANSIENT_MEMORY[k] for k in keys]))))
    return out
