"""The performance gate (``analyzer gate DIR --baseline OLD --max-regression 10%``, issue 20):
the new runs (DIR) against the previous runs (OLD).

For every arm (strategy; a run name without its ``.r<k>`` repeat suffix, RunEntry.arm) found
both in the new runs and the previous ones, and for each metric -- step time (every profiled step,
``StepTime.values_ns``), exposed communication (every profiled step, mean over ranks,
``RunEntry.exposed_comm_step_ns``), peak allocated memory (one value per run) -- the ratio
new / old of their medians with a 95 % interval (analyzer/compare/stats.py, repeats never paired:
the two sides were recorded apart). A metric regresses only when both sides have at least
``stats.MIN_REPEATS`` runs and the whole interval lies above 1 + the allowed regression: noise
alone does not fail the gate. With fewer runs on a side the interval covers the steps but not
run-to-run variation (the ranking's rule, ranking.NOISE_RULE), so the check cannot tell and
passes; so does a regression the runs cannot resolve; the line says which. Exposed communication
below 1 ns counts as 1 ns (a run without communication has a ratio of 1, not 0/0).

Only runs of one experiment's settings are compared (``mismatch``: ranking.settings_differences
per arm): hidden 64 against hidden 256 is no regression test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analyzer.compare import stats
from analyzer.compare.ranking import SETTINGS, settings_differences
from analyzer.contract.report_types import RunEntry

METRICS = ("step_time", "exposed_comm", "peak_allocated")
_FRACTION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(%?)\s*")


def parse_max_regression(text: str) -> float:
    """``10%`` (or ``10 %``) -> 0.10; ``0.1`` -> 0.1. Raises ``ValueError`` for anything else:
    a negative value, a bare number above 1 (``10``: write ``10%``), or not a number."""
    m = _FRACTION.fullmatch(text)
    if not m:
        raise ValueError(f"--max-regression {text!r}: expected a percentage like 10% or a "
                         "fraction like 0.10")
    value = float(m.group(1)) / (100 if m.group(2) else 1)
    if not m.group(2) and value > 1:
        raise ValueError(f"--max-regression {text}: ambiguous; write {text}% for a percentage "
                         f"or {value / 100:g} as a fraction")
    return value


@dataclass(frozen=True, slots=True)
class Check:
    """One arm and metric: ``ratio`` new / old with ``ci_low`` .. ``ci_high``; ``repeats`` new
    and old (runs with a value); ``decidable`` when both are at least ``stats.MIN_REPEATS``;
    ``regressed`` when decidable and ``ci_low`` > 1 + allowed."""

    arm: str
    metric: str
    ratio: float
    ci_low: float
    ci_high: float
    regressed: bool
    repeats_new: int
    repeats_old: int
    decidable: bool


def _values(runs: list[RunEntry], metric: str) -> list[list[float]]:
    out = []
    for r in runs:
        if metric == "step_time":
            v = [float(x) for x in r.step_time_ns.values_ns] or (
                [float(r.step_time_ns.median)] if r.step_time_ns.median else [])
        elif metric == "exposed_comm":
            v = [max(1.0, float(x)) for x in r.exposed_comm_step_ns]
        else:
            v = [float(r.memory.peak_allocated_bytes)] if r.memory.peak_allocated_bytes else []
        if v:
            out.append(v)
    return out


def _arms(runs: list[RunEntry]) -> dict[str, list[RunEntry]]:
    out: dict[str, list[RunEntry]] = {}
    for r in runs:
        if not r.incomplete:
            out.setdefault(r.arm, []).append(r)
    return out


def common_arms(new: list[RunEntry], old: list[RunEntry]
                ) -> dict[str, tuple[list[RunEntry], list[RunEntry]]]:
    """arm -> (its complete new runs, its complete previous runs) for every arm in both, sorted
    by name. Raises ``ValueError`` when no arm is in both."""
    a_new, a_old = _arms(new), _arms(old)
    common = sorted(set(a_new) & set(a_old))
    if not common:
        raise ValueError(f"no strategy in common (new: {', '.join(sorted(a_new)) or 'none'}; "
                         f"previous: {', '.join(sorted(a_old)) or 'none'})")
    return {arm: (a_new[arm], a_old[arm]) for arm in common}


GATED_SETTINGS = tuple(k for k in SETTINGS if k != "versions")
"""Settings the previous runs must share with the new ones. Not ``versions``: measuring a torch (or
this tool's) upgrade against the runs before it is what a performance gate is for; the
difference is said as a note (``mismatch(..., keys=("versions",))``)."""


def mismatch(arms: dict[str, tuple[list[RunEntry], list[RunEntry]]], new_label: str,
             old_label: str, keys: tuple[str, ...] = GATED_SETTINGS) -> list[str]:
    """Per group of arms (of ``common_arms``) whose new and previous runs differ in a setting
    in ``keys`` (default ``GATED_SETTINGS``: what makes runs one experiment, versions aside;
    ``ranking.settings_differences``, runs named by
    ``new_label`` / ``old_label``): ``ddp, fsdp: runs differ in model (NEW: ...; OLD: ...)``.
    Empty when every arm's runs agree (foreign runs, without settings, are not checked)."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for arm, (rn, ro) in arms.items():
        side = {id(r): new_label for r in rn} | {id(r): old_label for r in ro}
        diffs = settings_differences(rn + ro, label=lambda r: side[id(r)], keys=keys)
        if diffs:
            groups.setdefault(tuple(diffs), []).append(arm)
    return [f"{', '.join(names)}: {'; '.join(diffs)}" for diffs, names in groups.items()]


def compare(new: list[RunEntry], old: list[RunEntry], max_regression: float) -> list[Check]:
    """One ``Check`` per arm in both and metric measured on both sides (module docstring), arms
    sorted by name. Raises ``ValueError`` when no arm is in both."""
    out = []
    for arm, (rn, ro) in common_arms(new, old).items():
        for metric in METRICS:
            vn, vo = _values(rn, metric), _values(ro, metric)
            if not vn or not vo:
                continue
            ci = stats.ratio_ci(vo, vn, paired=False)
            decidable = min(len(vn), len(vo)) >= stats.MIN_REPEATS
            out.append(Check(arm=arm, metric=metric, ratio=ci.ratio, ci_low=ci.ci_low,
                             ci_high=ci.ci_high,
                             regressed=decidable and ci.ci_low > 1 + max_regression,
                             repeats_new=len(vn), repeats_old=len(vo), decidable=decidable))
    return out


def lines(checks: list[Check], max_regression: float) -> tuple[bool, list[str]]:
    """(no check regressed, one line per check and the verdict line)."""
    limit = 1 + max_regression
    n = stats.MIN_REPEATS
    out = []
    for c in checks:
        figures = (f"{c.metric}: new/old {c.ratio:.3f} (95 % CI {c.ci_low:.3f}-{c.ci_high:.3f}, "
                   f"{c.repeats_new} vs {c.repeats_old} runs)")
        if not c.decidable:
            out.append(f"PASS {c.arm} {figures}, cannot tell ({c.repeats_new} vs {c.repeats_old} "
                       f"runs: record both with tracer record --repeat {n}; fewer than {n} runs "
                       "a side cannot measure run-to-run variation)")
            continue
        why = ("the whole interval is above" if c.regressed else
               "within" if c.ci_high <= limit else "cannot tell from")
        out.append(f"{'FAIL' if c.regressed else 'PASS'} {c.arm} {figures}, {why} the allowed "
                   f"{limit:.3f}")
    bad = [f"{c.arm} {c.metric}" for c in checks if c.regressed]
    few = sum(not c.decidable for c in checks)
    pct = f"{100 * max_regression:g} %"
    tail = (f"; {few} check(s) could not tell: fewer than {n} runs a side" if few else "")
    out.append(f"gate: FAILED -- regression beyond {pct}: {', '.join(bad)}{tail}" if bad else
               f"gate: performance passed (no interval lies above the allowed {pct}{tail})")
    return not bad, out
