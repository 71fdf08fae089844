"""Grading a projection against the real run: the exact figures (issue 44, Deliver 4).

``analyzer grade PROJECTION RUN``: PROJECTION is a run directory that ``tracer project`` wrote
(a world of N from one process: only some ranks, its roles, have traces), RUN the run directory
of a real record of the same configuration. Until ``tracer project`` lands any two run
directories of one configuration grade; the manifest's ``projection`` field (world_size,
roles_run, device, fake_process_group) is read where present and shown, never required.

Same configuration first (``configuration_differences``), from the two manifests alone, before a
trace is parsed: strategy, strategy options, mesh (shape and dimension names), world size (the
projection's ``projection.world_size`` where present), fault, model (name, sizes, num_params,
spec), batch shape (per-rank batch aside, as the ranking does), precision and training setup --
each compared by the ranking's rule for one experiment (``ranking.settings_differences``), with
no declared arm excusing a difference. Device, versions, launch, seed and data supply are not
compared: none of them changes a collective's bytes or a tensor's size, and a projection runs
one process on this machine (Deliver 1). Another configuration is ``BadInput`` (exit 2).

The exact figures, per rank present in both (the projection's ranks with traces and with
profiled steps; those absent from RUN are named, not compared):

- collective calls and bytes per profiled step, per (kind, mesh dimension): the ingest's
  collectives of profiled steps (``crossrank.comm_parts``, its ``dims`` rows: per rank, kind and
  process group; the mesh dimension by ``meshdims.with_dims``, the rule of ``runs[].comm_groups``
  and ``runs[].mesh_dims``), summed over the dimension's process groups, divided by the rank's
  profiled steps. Exact fractions: a count is an integer, a step count too, so equal figures are
  equal, never "close". A kind one side never launched counts 0 calls and 0 bytes. Bytes of a
  collective whose size the trace does not give are unknown.
- parameter, gradient and optimizer-state bytes per rank: ``memory_categories.parquet`` as the
  report reads it (``runs[].memory.by_category``, ``compare/footprint.py``), counted from the
  tensors a rank holds, so device-independent.

A figure is ``equal``, a ``mismatch`` (a bug in the projection or the record, never an error
bar), or ``unknown`` (a side did not measure it: no categories file, bytes not in the trace).
The grade passes only when every figure is equal.

Several RUNs (repeats of one configuration, ``tracer record --repeat``): each is checked for
the configuration and its exact figures against the projection's (a figure is equal only when
every RUN's is); their profiled step times are pooled for the measured median. A RUN that is
itself a projection grades the exact figures (fake tensors against real ones) but measures no
step time.

Step time, with a link model (``AnalysisOptions.link_model``): the projected step
(analyzer/compare/projection.py, ``RunEntry.projected_step``) beside the RUNs' measured median
(steps.parquet's profiled steps, slowest rank's wall time, as ``runs[].step_time_ns``): the
relative error (projected - measured) / measured and whether the median lies inside the
projected interval. An error bar, not a failure: it does not change the exit code.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import msgspec

from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import AnalysisOptions, Parity, RunEntry

CONFIGURATION = ("strategy", "strategy_options", "mesh", "world_size", "fault", "model",
                 "batch", "precision", "training")
"""What makes two runs one configuration for grading (module docstring), compared by
``ranking.settings_differences`` in this order."""

MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state")
"""memory_categories.parquet's categories graded exactly: what sharding arithmetic predicts."""

TIMED = "not projected: pass --link-model"
"""What grading says of step time without a link model."""


@dataclass(frozen=True, slots=True)
class StepGrade:
    """The projected step beside the measured one (module docstring); ns."""

    projected_ns: int
    low_ns: int
    high_ns: int
    measured_median_ns: int
    measured_steps: int

    @property
    def error(self) -> float:
        """(projected - measured) / measured."""
        return (self.projected_ns - self.measured_median_ns) / self.measured_median_ns

    @property
    def inside(self) -> bool:
        return self.low_ns <= self.measured_median_ns <= self.high_ns


@dataclass(frozen=True, slots=True)
class Figure:
    """One exact figure of one rank: ``figure`` ``calls_per_step`` / ``bytes_per_step`` (of
    collective ``kind`` on ``mesh_dim``) or ``bytes`` (of memory category ``kind``, mesh_dim
    ""); ``projected`` and ``measured`` exact (None: not measured); ``status`` ``equal``,
    ``mismatch`` or ``unknown``."""

    figure: str
    kind: str
    mesh_dim: str
    rank: int
    projected: Fraction | None
    measured: Fraction | None

    @property
    def status(self) -> str:
        if self.projected is None or self.measured is None:
            return "unknown"
        return "equal" if self.projected == self.measured else "mismatch"


@dataclass(slots=True)
class Grade:
    """``grade``'s result: the two inputs, the projection's own description (manifest
    ``projection``; None for a plain record), the world size, the ranks compared and those of
    the projection that RUN lacks, every exact figure, and ``ok`` (every figure equal)."""

    projection: str
    run: str
    projection_info: dict[str, Any] | None
    world_size: int
    ranks_compared: list[int]
    ranks_not_in_run: list[int]
    figures: list[Figure] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    """Every RUN graded (``run`` is the first)."""
    step: StepGrade | None = None
    """None without a link model (``TIMED``) or without measured steps."""

    @property
    def ok(self) -> bool:
        return bool(self.figures) and all(f.status == "equal" for f in self.figures)


def projection_info(run) -> dict[str, Any] | None:
    """The manifest's ``projection`` field of ``run`` (a ``rundirs.RunDir``) as a dict, None
    when the run is not a projection. Read from the typed manifest once the schema carries it,
    else from manifest.json itself (the field is written by ``tracer project``; an analyzer
    without it in ``schemas.Manifest`` would drop it)."""
    got = getattr(run.manifest, "projection", None)
    if got is not None:
        return msgspec.to_builtins(got)
    from analyzer.contract import schemas

    try:
        raw = msgspec.json.decode((run.path / schemas.MANIFEST_NAME).read_bytes())
    except (OSError, msgspec.DecodeError):
        return None  # read and validated by discovery a moment ago: the typed manifest stands
    got = raw.get("projection") if isinstance(raw, dict) else None
    return got if isinstance(got, dict) else None


def _configuration(run, label: str) -> RunEntry:
    """A ``RunEntry`` carrying ``run``'s ``CONFIGURATION`` as settings, for the ranking's rule."""
    m = run.manifest
    info = projection_info(run) or {}
    world = info.get("world_size") if isinstance(info.get("world_size"), int) else m.world_size
    mesh = None if m.mesh is None else {"shape": list(m.mesh.shape),
                                        "dim_names": list(m.mesh.dim_names)}
    settings = {k: msgspec.to_builtins(getattr(m, k)) for k in
                ("model", "batch", "precision", "training")}
    settings |= {"strategy": m.strategy, "strategy_options": m.strategy_options, "mesh": mesh,
                 "world_size": world, "fault": m.fault}
    return RunEntry(name=label, strategy=m.strategy, settings=settings,
                    parity=Parity(status="not_recorded", reason="not read for grading"))


def configuration_differences(projection, run, labels: tuple[str, str]) -> list[str]:
    """One line per ``CONFIGURATION`` setting on which ``projection`` and ``run`` (``rundirs.
    RunDir``s with manifests) differ, naming them by ``labels``: ``runs differ in strategy
    (P: ddp; R: fsdp2)``. Empty when they are one configuration."""
    from analyzer.compare.ranking import settings_differences

    entries = [_configuration(projection, labels[0]), _configuration(run, labels[1])]
    return settings_differences(entries, keys=CONFIGURATION)


def _one_run(path: Path, role: str):
    """The one run directory at ``path`` (``rundirs.discover``). Raises ``BadInput``: a traces
    root of several runs, or traces without a manifest (no configuration to compare)."""
    from analyzer.ingest import rundirs

    found = rundirs.discover(path)
    if len(found.runs) != 1:
        raise BadInput(path, "bad_option", f"{role}: holds {len(found.runs)} run directories, "
                       "not one", f"pass one run directory as {role}")
    run = found.runs[0]
    if run.manifest is None:
        raise BadInput(path, "bad_option", f"{role}: profiler traces without manifest.json: no "
                       "configuration to grade against",
                       f"pass a run directory written by tracer record or tracer project as {role}")
    return run


def rank_collectives(tables) -> dict[int, dict[tuple[str, str], tuple[Fraction, Fraction | None]]]:
    """rank -> (kind, mesh dimension) -> (calls, bytes) per profiled step, exact (module
    docstring), for every rank with profiled steps; bytes None when an instance's size is
    unknown. ``tables``: ``ingest.load_run``'s ``JobTables``."""
    from analyzer.analyses import crossrank, meshdims

    bd = tables.breakdown
    bd = bd[(bd["step"] >= 0) & bd["device_work"].astype(bool)]
    rank_steps = bd.groupby("rank")["step"].nunique()  # as runs._trace_figures counts them
    out: dict[int, dict] = {int(r): {} for r, n in rank_steps.items() if n > 0}
    parts = crossrank.comm_parts(tables, crossrank.clock_offsets(tables), rank_steps)
    if parts is None:
        return out
    mesh = tables.manifest.mesh if tables.manifest is not None else None
    dims = meshdims.with_dims(parts["dims"], tables.world_size, mesh)
    sums = dims.groupby(["rank", "kind", "mesh_dim"], sort=True)[
        ["count", "known", "known_bytes"]].sum()
    for (rank, kind, dim), row in sums.iterrows():
        if int(rank) not in out:
            continue
        steps = int(rank_steps[rank])
        calls = Fraction(int(row["count"]), steps)
        nbytes = (Fraction(int(row["known_bytes"]), steps)
                  if int(row["known"]) == int(row["count"]) else None)
        out[int(rank)][(str(kind), str(dim))] = (calls, nbytes)
    return out


def rank_memory(entry: RunEntry) -> dict[int, dict[str, int]]:
    """rank -> ``MEMORY_CATEGORIES`` category -> bytes, from ``entry.memory.by_category``."""
    out: dict[int, dict[str, int]] = {}
    for c in entry.memory.by_category:
        if c.category in MEMORY_CATEGORIES:
            out.setdefault(c.rank, {})[c.category] = int(c.bytes)
    return out


def _measure(run, options: AnalysisOptions) -> tuple[dict, dict, list[int], RunEntry]:
    """(``rank_collectives``, ``rank_memory``, ranks with traces, the report's entry) of
    ``run``, from one load of its traces (``pipeline.load_run``, cached) and the report's
    summary of it (with ``options.link_model``, a projection's entry holds its projected
    step)."""
    from analyzer.compare import runs
    from analyzer.ingest import pipeline

    if not run.traces:
        raise BadInput(run.path, "empty", "holds no trace: no collective to grade",
                       "grade run directories with their rank traces")
    with pipeline.load_run(run, jobs=options.jobs) as tables:
        entry = runs.summarize_run(run, tables, options)
        coll = rank_collectives(tables)
        traced = sorted(rt.rank for rt in tables.ranks if not rt.empty)
    return coll, rank_memory(entry), traced, entry


def _figures(rank: int, proj: tuple[dict, dict], real: tuple[dict, dict]) -> list[Figure]:
    """The exact figures of ``rank``: collectives by (kind, mesh dimension), then memory."""
    out = []
    pc, rc = proj[0].get(rank), real[0].get(rank)
    keys = sorted(set(pc or {}) | set(rc or {}))
    zero = (Fraction(0), Fraction(0))
    for kind, dim in keys:
        p = None if pc is None else pc.get((kind, dim), zero)
        r = None if rc is None else rc.get((kind, dim), zero)
        out.append(Figure("calls_per_step", kind, dim, rank, p and p[0], r and r[0]))
        out.append(Figure("bytes_per_step", kind, dim, rank, p and p[1], r and r[1]))
    pm, rm = proj[1].get(rank, {}), real[1].get(rank, {})
    for cat in MEMORY_CATEGORIES:
        p, r = pm.get(cat), rm.get(cat)
        out.append(Figure("bytes", cat, "", rank, None if p is None else Fraction(p),
                          None if r is None else Fraction(r)))
    return out


def grade(projection: Path, run: Path | list[Path],
          options: AnalysisOptions = AnalysisOptions()) -> Grade:
    """Grade ``projection`` against ``run`` (one run directory, or several: repeats of one
    configuration; module docstring). Raises ``BadInput``: an input is not one run directory
    with a manifest, a RUN is of another configuration (one line naming each difference,
    checked before any trace is read), is a projection while ``projection`` is not (the
    arguments swapped), has no trace, or shares no rank; with a link model,
    what the projected step raises (no link curve for a group span)."""
    paths = [run] if isinstance(run, (str, Path)) else list(run)
    p_run = _one_run(projection, "PROJECTION")
    r_runs = [_one_run(p, "RUN") for p in paths]
    seen: set[str] = {str(p_run.path.resolve())}
    for path, r_run in zip(paths, r_runs):
        if str(r_run.path.resolve()) in seen:
            raise BadInput(path, "bad_option", "given twice (as PROJECTION or another RUN): "
                           "each run counts once", "pass each run directory once")
        seen.add(str(r_run.path.resolve()))
    # Two real runs may be graded (any run directory as PROJECTION, GRADE_HELP); a projection
    # as RUN beside a real PROJECTION is the arguments swapped: the real run's figures would be
    # graded as projected, and no step projected.
    if projection_info(p_run) is None:
        for path, r_run in zip(paths, r_runs):
            if projection_info(r_run) is not None:
                raise BadInput(projection, "bad_option",
                               f"not a projection (tracer project writes one), but RUN {path} "
                               "is: the arguments are swapped",
                               f"pass the projection first: analyzer grade {path} {projection}")
    for path, r_run in zip(paths, r_runs):
        if diffs := configuration_differences(p_run, r_run, (str(projection), str(path))):
            raise BadInput(path, "other_configuration",
                           f"not the configuration of {projection}, so its figures do not "
                           f"grade the projection: {'; '.join(diffs)}",
                           "grade a run recorded with the projection's strategy, options, mesh, "
                           "world size, model, batch, precision and training setup")
    p_coll, p_mem, p_ranks, p_entry = _measure(p_run, options)
    measured = [_measure(r, AnalysisOptions(jobs=options.jobs)) for r in r_runs]
    r_ranks = sorted(set.intersection(*(set(m[2]) for m in measured)))
    compared = [r for r in p_ranks if r in r_ranks]
    if not compared:
        raise BadInput(paths[0], "bad_option", f"holds none of the projected ranks "
                       f"({', '.join(map(str, p_ranks))})",
                       "grade a run whose traces include the ranks the projection ran")
    info = projection_info(p_run)
    world = info.get("world_size") if info and isinstance(info.get("world_size"), int) else (
        p_run.manifest.world_size)
    g = Grade(projection=str(projection), run=str(paths[0]), projection_info=info,
              world_size=world, ranks_compared=compared,
              ranks_not_in_run=[r for r in p_ranks if r not in r_ranks],
              runs=[str(p) for p in paths])
    for rank in compared:
        per_run = [_figures(rank, (p_coll, p_mem), (m[0], m[1])) for m in measured]
        # one figure per row: the first RUN whose figure is not equal, else the first's
        g.figures += [next((f for f in fs if f.status != "equal"), fs[0])
                      for fs in zip(*per_run)]
    g.step = _step_grade(p_entry, [m[3] for m in measured])
    return g


def _step_grade(projection: RunEntry, runs: list[RunEntry]) -> StepGrade | None:
    """The projected step beside the RUNs' pooled profiled step times (module docstring)."""
    import statistics

    ps = projection.projected_step
    # a RUN that is itself a projection (its exact figures grade, e.g. fake against real
    # tensors) has no measured step: one process's times
    values = [v for r in runs if r.projection is None for v in r.step_time_ns.values_ns]
    if ps is None or not values:
        return None
    return StepGrade(projected_ns=ps.step_ns, low_ns=ps.low_ns, high_ns=ps.high_ns,
                     measured_median_ns=round(statistics.median(values)),
                     measured_steps=len(values))


def number(v: Fraction | None) -> int | float | None:
    """An exact figure for JSON: an int when whole, else a float (a mean per step)."""
    if v is None:
        return None
    return int(v) if v.denominator == 1 else float(v)


def to_json(g: Grade) -> dict[str, Any]:
    """``analyzer grade --format json``: the inputs, ranks, every figure with its status, the
    timed figures' state and the verdict."""
    return {
        "projection": g.projection, "run": g.run, "projection_info": g.projection_info,
        "world_size": g.world_size, "ranks_compared": g.ranks_compared,
        "ranks_not_in_run": g.ranks_not_in_run,
        "exact": [{"figure": f.figure, "kind": f.kind, "mesh_dim": f.mesh_dim, "rank": f.rank,
                   "projected": number(f.projected), "measured": number(f.measured),
                   "status": f.status} for f in g.figures],
        "runs": g.runs,
        "step": None if g.step is None else {
            "projected_ns": g.step.projected_ns, "low_ns": g.step.low_ns,
            "high_ns": g.step.high_ns, "measured_median_ns": g.step.measured_median_ns,
            "measured_steps": g.step.measured_steps, "error": g.step.error,
            "inside": g.step.inside},
        "timed": {"step_time_ns": "graded" if g.step is not None else TIMED},
        "ok": g.ok,
    }
