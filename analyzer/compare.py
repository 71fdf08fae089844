"""Compare runs and rank them -- only when every run's numerics are trusted.

Works on the per-run summaries the report builds (the ``runs[]`` entries of report.json).

Ranking rule (stated in every output as ``RANKING_RULE``): runs whose parity passed, plus the
``single`` reference run (the speedup base), ordered by the median step time of the profiled
steps -- the step time of a distributed step being its slowest rank's wall time from
``steps.parquet`` -- fastest first; ties broken by lower peak allocated memory. The ranking is
withheld when any run failed parity or has none recorded (naming the run and its first diverging
tensor or the reason), or when the runs were not recorded under the same settings (versions,
device, global batch shape, seed, model, precision, launch), since they are then not one experiment.
"""

from __future__ import annotations

import math
from typing import Any

from analyzer.divergence import divergence_subject

RANKING_RULE = (
    "Runs are ranked only when every run passed the parity gate (the single-device run is the "
    "reference and the speedup base). Order: median step time over the profiled steps, fastest "
    "first (a distributed step lasts as long as its slowest rank); ties broken by lower peak "
    "allocated memory. Runs recorded under different settings are never ranked together; an "
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

SETTINGS = ("versions", "device", "batch", "seed", "model", "precision", "launch", "data")
"""Manifest settings that must agree for runs to be one experiment. ``data`` (issue 10): how
the input was supplied; a record without it was fed from memory (the only way before)."""


def _setting(run: dict[str, Any], key: str) -> Any:
    s = run.get("settings") or {}
    value = s.get(key)
    if key == "batch" and isinstance(value, dict):
        # per-rank batch differs by design between single and distributed runs
        return {k: v for k, v in value.items() if k != "per_rank_batch"}
    if key == "launch" and isinstance(value, dict):
        if run.get("strategy") == "single":
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


def settings_differences(runs: list[dict[str, Any]]) -> list[str]:
    """One warning line per setting in ``SETTINGS`` on which the recorded runs disagree, naming
    the runs and their values. Foreign runs (no settings) are ignored."""
    recorded = [r for r in runs if r.get("settings")]
    out = []
    for key in SETTINGS:
        seen: dict[str, list[str]] = {}
        for r in recorded:
            v = _setting(r, key)
            if v is None and key == "launch":
                continue
            seen.setdefault(_show(v), []).append(r["name"])
        if len(seen) > 1:
            parts = "; ".join(f"{', '.join(names)}: {v}" for v, names in seen.items())
            out.append(f"runs differ in {key} ({parts})")
    return out


def _peak(run: dict[str, Any]) -> float:
    v = (run.get("memory") or {}).get("peak_allocated_bytes")
    return math.inf if v is None else float(v)


def rank_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """``{status: "ranked" | "withheld", order: [names], reason: str, rule: RANKING_RULE}``.

    ``order`` is empty when withheld. Each run needs ``name``, ``strategy``, ``parity.status``,
    ``parity.reason``, ``parity.first_divergence``, ``step_time_ns.median`` and optionally
    ``memory.peak_allocated_bytes`` and ``settings``.
    """
    left_out = [r["name"] for r in runs if r.get("incomplete")]
    runs = [r for r in runs if not r.get("incomplete")]  # README: left out of the ranking
    withheld = []
    for r in runs:
        p = r["parity"]
        if p["status"] == "fail":
            fd = p.get("first_divergence")
            what = (f"first divergence in {divergence_subject(fd)}" if fd else p["reason"])
            withheld.append(f"run {r['name']} failed the parity gate ({what})")
        elif p["status"] == "not_recorded":
            withheld.append(f"run {r['name']} has no parity verdict ({p['reason']})")
    if withheld:
        return {"status": "withheld", "order": [], "rule": RANKING_RULE,
                "reason": "; ".join(withheld) + ". Speed figures of a run whose numerics are not "
                          "verified do not count."}
    diffs = settings_differences(runs)
    if diffs:
        return {"status": "withheld", "order": [], "rule": RANKING_RULE,
                "reason": "the runs are not one experiment: " + "; ".join(diffs)
                          + ". Record them together with the same settings."}
    timed = [r for r in runs if (r.get("step_time_ns") or {}).get("median") is not None]
    untimed = [r["name"] for r in runs if r not in timed]
    if not timed:
        return {"status": "withheld", "order": [], "rule": RANKING_RULE,
                "reason": "no run has a measured step time"}
    order = sorted(timed, key=lambda r: (r["step_time_ns"]["median"], _peak(r), r["name"]))
    reason = f"{len(order)} run(s) passed parity (or are the reference)"
    if untimed:
        reason += f"; not ranked for lack of step times: {', '.join(untimed)}"
    if left_out:
        reason += f"; left out as incomplete (no manifest.json): {', '.join(left_out)}"
    return {"status": "ranked", "order": [r["name"] for r in order], "reason": reason,
            "rule": RANKING_RULE + " " + NOISE_RULE, "noise": ranking_noise(order)}


def ranking_noise(order: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the ranked ``order`` (fastest first) is a basis for a decision (``NOISE_RULE``).

    Each run's ``step_time_ns`` holds ``median`` and, when measured, ``min`` / ``max`` over its
    profiled steps (the spread within the run). Returns ``{cpu: bool, margin_frac (the floor
    applied), close_pairs: [[faster, slower, gap_frac, why]], decisive}``: a consecutive pair is
    close when the faster run's slowest step is not faster than the slower run's fastest step
    (``why`` names both), or when ``gap_frac`` = (slower - faster) / faster median is below the
    floor (``why`` says so); ``decisive`` is True when no pair is close.
    """
    cpu = any((r.get("device") or "cpu") == "cpu" for r in order)
    margin = NOISE_MARGIN_FRAC["cpu" if cpu else "cuda"]
    close = []
    for a, b in zip(order, order[1:]):
        sa, sb = a["step_time_ns"], b["step_time_ns"]
        fa, fb = sa["median"], sb["median"]
        gap = (fb - fa) / fa if fa else math.inf
        slowest_a, fastest_b = sa.get("max"), sb.get("min")
        if slowest_a is not None and fastest_b is not None and slowest_a >= fastest_b:
            why = (f"their step times overlap: {a['name']}'s slowest step {slowest_a / 1e6:.2f} ms, "
                   f"{b['name']}'s fastest {fastest_b / 1e6:.2f} ms")
            close.append([a["name"], b["name"], gap, why])
        elif gap < margin:
            why = f"below the {margin * 100:g} % {'CPU' if cpu else 'GPU'} floor"
            close.append([a["name"], b["name"], gap, why])
    return {"cpu": cpu, "margin_frac": margin, "close_pairs": close, "decisive": not close}


def comparable_to(run: dict[str, Any], base: dict[str, Any]) -> bool:
    """True when ``run`` may be compared with the reference ``base``: it is ``base`` itself, or
    its parity passed and every setting in ``SETTINGS`` agrees with the reference's (``launch``
    is not compared, the reference is not launched). Foreign runs (no settings) never are."""
    if run is base:
        return True
    if (run.get("parity") or {}).get("status") != "pass" or not run.get("settings"):
        return False
    for key in SETTINGS:
        a, b = _setting(run, key), _setting(base, key)
        if key == "launch" and (a is None or b is None):
            continue
        if a != b:
            return False
    return True


def speedups(runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Speedup of each run over the ``single`` run: single's median step time / the run's.
    None when there is no single run, either time is missing, or the run is not comparable
    with it (``comparable_to``: parity not passed, or recorded under different settings) --
    the report must not show a speedup it says cannot be compared."""
    base = next((r for r in runs if r.get("strategy") == "single"), None)
    b = (base or {}).get("step_time_ns", {}).get("median") if base else None
    out = {}
    for r in runs:
        m = (r.get("step_time_ns") or {}).get("median")
        ok = base is not None and comparable_to(r, base)
        out[r["name"]] = (b / m) if (b and m and ok) else None
    return out


def prefetch_groups(runs: list[dict[str, Any]]) -> list[list[str]]:
    """Groups (>= 2 runs) of the same FSDP strategy whose strategy options differ only in the
    prefetch settings (``backward_prefetch``, ``forward_prefetch``): compare them side by side."""
    keys = ("backward_prefetch", "forward_prefetch")
    groups: dict[str, list[str]] = {}
    for r in runs:
        if r.get("strategy") not in ("fsdp", "fsdp2"):
            continue
        opts = {k: v for k, v in (r.get("options") or {}).items() if k not in keys}
        settings = {k: _setting(r, k) for k in SETTINGS}
        groups.setdefault(repr((r["strategy"], sorted(opts.items()), settings)), []).append(r["name"])
    out = []
    for names in groups.values():
        opts = {repr({k: (next(r for r in runs if r["name"] == n).get("options") or {}).get(k)
                      for k in keys}) for n in names}
        if len(names) >= 2 and len(opts) > 1:
            out.append(names)
    return out
