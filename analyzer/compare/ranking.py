"""Compare runs and rank them -- only when every run's numerics are trusted.

Works on the report's run entries (``report_types.RunEntry``, the ``runs[]`` of report.json).

Ranking rule (stated in every output as ``RANKING_RULE``): runs whose parity passed, plus the
``single`` reference run (the speedup base), ordered by the median step time of the profiled
steps -- the step time of a distributed step being its slowest rank's wall time from
``steps.parquet`` -- fastest first; ties broken by the lower per-rank memory peak
(``Memory.peak_allocated_bytes``: memory_categories.parquet's peak, i.e. what the rank holds,
never the profiler's window-only figure; analyzer/compare/footprint.py). The ranking is
withheld when any run failed parity or has none recorded (naming the run and its first diverging
tensor or the reason), or when the runs were not recorded under the same settings (versions,
device, global batch shape, seed, model, precision, launch), since they are then not one experiment.
"""

from __future__ import annotations

import math
from typing import Any

from analyzer.contract.report_types import Noise, Ranking, RunEntry

RANKING_RULE = (
    "Runs are ranked only when every run passed the parity gate (the single-device run is the "
    "reference and the speedup base). Order: median step time over the profiled steps, fastest "
    "first (a distributed step lasts as long as its slowest rank); ties broken by the lower "
    "per-rank memory peak (Memory section: what the rank holds, not the profiler window). Runs recorded under different settings are never ranked together; an "
    "incomplete run (no manifest.json, --allow-incomplete) is left out."
)

NOISE_MARGIN_FRAC = {"cpu": 0.50, "cuda": 0.05}
"""Floor of the noise rule: a relative gap between consecutive ranked median step times,
(slower - faster) / faster, below which their order is within measurement noise whatever the
runs' own spread. CPU records (gloo, two ranks sharing cores) differ by 30-50 % between
identical records (README), so 50 %; GPU steps are far steadier, 5 %."""

NOISE_RULE = (
    "Noise: two neighbours in the order are within measurement noise when their step times "
    "overlap (the faster run's slowest profiled step is at least as slow as the slower run's "
    "fastest) or their median step times differ by less than 50 % (CPU: identical CPU records "
    "differ by 30-50 %) or 5 % (GPU) of the faster one; such an order is listed but is no basis "
    "for a decision."
)

SETTINGS = ("versions", "device", "batch", "seed", "model", "precision", "training", "launch",
            "data")
"""Manifest settings that must agree for runs to be one experiment. ``data`` (issue 10): how
the input was supplied; a record without it was fed from memory (the only way before).
``training`` (issue 18): optimizer, mixed-precision policy, activation checkpointing -- a run
with another training setup computes other numbers and times, so it is never ranked beside."""


def _setting(run: RunEntry, key: str) -> Any:
    s = run.settings or {}
    value = s.get(key)
    if key == "batch" and isinstance(value, dict):
        # per-rank batch differs by design between single and distributed runs
        return {k: v for k, v in value.items() if k != "per_rank_batch"}
    if key == "launch" and isinstance(value, dict):
        if run.strategy == "single":
            return None  # the baseline is not launched; nothing to compare
        return {k: v for k, v in value.items() if k in ("method", "nnodes")}
    if key == "data":
        if not isinstance(value, dict):
            return {"source": "memory"}
        return {k: v for k, v in value.items() if k in ("source", "workers", "sample_cost_ms")}
    if key == "device" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k in ("type", "name")}
    return value


def _show(v: Any) -> str:
    """A setting's value as readable text: ``type cpu, name AMD EPYC`` for a dict (never a
    Python repr), ``-`` for None."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {_show(x)}" for k, x in v.items() if x is not None) or "-"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_show(x) for x in v) + "]"
    return "-" if v is None else str(v)


def settings_differences(runs: list[RunEntry]) -> list[str]:
    """One warning line per setting in ``SETTINGS`` on which the recorded runs disagree, naming
    the runs and their values. Foreign runs (no settings) are ignored."""
    recorded = [r for r in runs if r.settings]
    out = []
    for key in SETTINGS:
        seen: dict[str, list[str]] = {}
        for r in recorded:
            v = _setting(r, key)
            if v is None and key == "launch":
                continue
            seen.setdefault(_show(v), []).append(r.name)
        if len(seen) > 1:
            parts = "; ".join(f"{', '.join(names)}: {v}" for v, names in seen.items())
            out.append(f"runs differ in {key} ({parts})")
    return out


def _peak(run: RunEntry) -> float:
    """The tie-break: the run's largest per-rank peak (``Memory.peak_allocated_bytes``, chosen
    by analyzer/compare/footprint.py: recorded categories first); inf when unknown."""
    v = run.memory.peak_allocated_bytes
    return math.inf if v is None else float(v)


def rank_runs(runs: list[RunEntry]) -> Ranking:
    """The ranking (module docstring): ``order`` (names, fastest first; empty when withheld),
    ``reason``, ``rule`` and, when ranked, ``noise`` (``ranking_noise``)."""
    left_out = [r.name for r in runs if r.incomplete]
    runs = [r for r in runs if not r.incomplete]  # README: left out of the ranking
    withheld = []
    for r in runs:
        p = r.parity
        if p.status == "fail":
            what = (f"first divergence in {p.first_divergence.subject}" if p.first_divergence
                    else p.reason)
            withheld.append(f"run {r.name} failed the parity gate ({what})")
        elif p.status == "not_recorded":
            withheld.append(f"run {r.name} has no parity verdict ({p.reason})")
    diffs = settings_differences(runs)
    timed = [r for r in runs if r.step_time_ns.median is not None]
    reason = ("; ".join(withheld) + ". Speed figures of a run whose numerics are not verified "
              "do not count." if withheld else
              "the runs are not one experiment: " + "; ".join(diffs)
              + ". Record them together with the same settings." if diffs else
              "no run has a measured step time" if not timed else None)
    if reason:
        return Ranking(status="withheld", order=[], reason=reason, rule=RANKING_RULE)
    order = sorted(timed, key=lambda r: (r.step_time_ns.median, _peak(r), r.name))
    reason = f"{len(order)} run(s) passed parity (or are the reference)"
    untimed = [r.name for r in runs if r.step_time_ns.median is None]
    if untimed:
        reason += f"; not ranked for lack of step times: {', '.join(untimed)}"
    if left_out:
        reason += f"; left out as incomplete (no manifest.json): {', '.join(left_out)}"
    return Ranking(status="ranked", order=[r.name for r in order], reason=reason,
                   rule=RANKING_RULE + " " + NOISE_RULE, noise=ranking_noise(order))


def ranking_noise(order: list[RunEntry]) -> Noise:
    """Whether the ranked ``order`` (fastest first) is a basis for a decision (``NOISE_RULE``).

    Each run's ``step_time_ns`` holds ``median`` and, when measured, ``min`` / ``max`` over its
    profiled steps (the spread within the run). ``close_pairs``: ``[faster, slower, gap_frac,
    why]`` for each consecutive pair that is close: the faster run's slowest step is not faster
    than the slower run's fastest step (``why`` names both), or ``gap_frac`` = (slower - faster)
    / faster median is below the floor ``margin_frac`` (``why`` says so); ``decisive`` when none.
    """
    cpu = any((r.device or "cpu") == "cpu" for r in order)
    margin = NOISE_MARGIN_FRAC["cpu" if cpu else "cuda"]
    close = []
    for a, b in zip(order, order[1:]):
        sa, sb = a.step_time_ns, b.step_time_ns
        gap = (sb.median - sa.median) / sa.median if sa.median else math.inf
        if sa.max is not None and sb.min is not None and sa.max >= sb.min:
            close.append((a.name, b.name, gap, f"their step times overlap: {a.name}'s slowest "
                          f"step {sa.max / 1e6:.2f} ms, {b.name}'s fastest {sb.min / 1e6:.2f} ms"))
        elif gap < margin:
            close.append((a.name, b.name, gap,
                          f"below the {margin * 100:g} % {'CPU' if cpu else 'GPU'} floor"))
    return Noise(cpu=cpu, margin_frac=margin, close_pairs=close, decisive=not close)


def comparable_to(run: RunEntry, base: RunEntry) -> bool:
    """True when ``run`` may be compared with the reference ``base``: it is ``base`` itself, or
    its parity passed and every setting in ``SETTINGS`` agrees with the reference's (``launch``
    is not compared, the reference is not launched). Foreign runs (no settings) never are."""
    if run is base:
        return True
    if run.parity.status != "pass" or not run.settings:
        return False
    for key in SETTINGS:
        a, b = _setting(run, key), _setting(base, key)
        if key == "launch" and (a is None or b is None):
            continue
        if a != b:
            return False
    return True


def speedups(runs: list[RunEntry]) -> list[float | None]:
    """Speedup of each run over the ``single`` run, in ``runs`` order: single's median step
    time / the run's. None when there is no single run, either time is missing, or the run is
    not comparable with it (``comparable_to``: parity not passed, or recorded under different
    settings) -- the report must not show a speedup it says cannot be compared."""
    base = next((r for r in runs if r.strategy == "single"), None)
    b = base.step_time_ns.median if base else None
    return [b / r.step_time_ns.median if b and r.step_time_ns.median and comparable_to(r, base)
            else None for r in runs]


def prefetch_groups(runs: list[RunEntry]) -> list[list[str]]:
    """Groups (>= 2 runs) of the same FSDP strategy whose strategy options differ only in the
    prefetch settings (``backward_prefetch``, ``forward_prefetch``): compare them side by side."""
    keys = ("backward_prefetch", "forward_prefetch")
    groups: dict[str, list[RunEntry]] = {}
    for r in runs:
        if r.strategy not in ("fsdp", "fsdp2"):
            continue
        opts = {k: v for k, v in r.options.items() if k not in keys}
        settings = {k: _setting(r, k) for k in SETTINGS}
        groups.setdefault(repr((r.strategy, sorted(opts.items()), settings)), []).append(r)
    return [[r.name for r in group] for group in groups.values()
            if len(group) >= 2 and len({repr({k: r.options.get(k) for k in keys})
                                         for r in group}) > 1]
