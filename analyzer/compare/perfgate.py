"""The performance gate (``analyzer gate DIR --baseline OLD --max-regression 10%``, issue 20).

For every arm (strategy; a run name without its ``.r<k>`` repeat suffix, ranking.arm_of) found
both in the new runs and the baseline's, and for each metric -- step time (every profiled step,
``StepTime.values_ns``), exposed communication (every profiled step, mean over ranks,
``RunEntry.exposed_comm_step_ns``), peak allocated memory (one value per run) -- the ratio
new / old of their medians with a 95 % interval (analyzer/compare/stats.py, repeats never paired:
the two sides were recorded apart). A metric regresses only when the whole interval lies above
1 + the allowed regression: noise alone does not fail the gate; a regression the runs cannot
resolve passes, and the line says so. Exposed communication below 1 ns counts as 1 ns (a run
without communication has a ratio of 1, not 0/0).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from analyzer.compare import stats
from analyzer.compare.ranking import arm_of
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
    """One arm and metric: ``ratio`` new / old with ``ci_low`` .. ``ci_high``, ``regressed``
    when ``ci_low`` > 1 + allowed; ``repeats`` new and old; ``note`` what limits it."""

    arm: str
    metric: str
    ratio: float
    ci_low: float
    ci_high: float
    regressed: bool
    repeats_new: int
    repeats_old: int
    note: str = ""


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
            out.setdefault(arm_of(r), []).append(r)
    return out


def compare(new: list[RunEntry], old: list[RunEntry], max_regression: float) -> list[Check]:
    """One ``Check`` per arm in both and metric measured on both sides (module docstring), arms
    sorted by name. Raises ``ValueError`` when no arm is in both."""
    a_new, a_old = _arms(new), _arms(old)
    common = sorted(set(a_new) & set(a_old))
    if not common:
        raise ValueError(f"no strategy in common (new: {', '.join(sorted(a_new)) or 'none'}; "
                         f"baseline: {', '.join(sorted(a_old)) or 'none'})")
    out = []
    for arm in common:
        for metric in METRICS:
            vn, vo = _values(a_new[arm], metric), _values(a_old[arm], metric)
            if not vn or not vo:
                continue
            ci = stats.ratio_ci(vo, vn, paired=False)
            note = ("one run on a side: run-to-run variation not measured (record with --repeat 5)"
                    if min(len(vn), len(vo)) < 2 else "")
            out.append(Check(arm=arm, metric=metric, ratio=ci.ratio, ci_low=ci.ci_low,
                             ci_high=ci.ci_high, regressed=ci.ci_low > 1 + max_regression,
                             repeats_new=len(vn), repeats_old=len(vo), note=note))
    return out


def lines(checks: list[Check], max_regression: float) -> tuple[bool, list[str]]:
    """(no check regressed, one line per check and the verdict line)."""
    limit = 1 + max_regression
    out = []
    for c in checks:
        word = "FAIL" if c.regressed else "PASS"
        why = ("the whole interval is above" if c.regressed else
               "within" if c.ci_high <= limit else "cannot tell from")
        out.append(f"{word} {c.arm} {c.metric}: new/old {c.ratio:.3f} (95 % CI {c.ci_low:.3f}-"
                   f"{c.ci_high:.3f}, {c.repeats_new} vs {c.repeats_old} runs), {why} the "
                   f"allowed {limit:.3f}" + (f"; {c.note}" if c.note else ""))
    bad = [f"{c.arm} {c.metric}" for c in checks if c.regressed]
    pct = f"{100 * max_regression:g} %"
    out.append(f"gate: FAILED -- regression beyond {pct}: {', '.join(bad)}" if bad else
               f"gate: performance passed (no interval lies above the allowed {pct})")
    return not bad, out
