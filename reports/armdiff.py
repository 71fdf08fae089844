"""What differs between declared arms, in words, for the first screen (issue 42): the
``ranking.differences`` of report.json (analyzer/compare/armdiff.py) as plain-text lines.

Collective figures of one kind and mesh dimension share a line (``all_gather (shard): 4 → 2
calls per step, 9.0 → 4.5 MiB per step``), memory one line per category, and a memory effect
the record cannot see says so (``memory: not measurable on this device for
reshard_after_forward (...)``). Arms appear in the experiment's declared order, named once on
the first line; each figure lists their values in that order, joined by ``→``.
"""

from __future__ import annotations

from analyzer.contract.arms import arm_label, pair_labels
from analyzer.contract.report_types import UNSET, ArmDifference, Report
from reports import fmt
from reports.memory import LABELS


NOTHING_DIFFERS = ("no collective call or byte per kind and mesh dimension and no memory category "
                   "differs between the arms: a step-time difference between them is not from "
                   "the work counted here")


SAME_COMM_AND_MEMORY = ("no collective call or byte per kind and mesh dimension and no memory "
                        "category differs between the arms")


def _bytes(values: list[float | None], per: str) -> str:
    """``9.0 → 4.5 MiB per step``: every value in the unit of the largest (MiB, KiB, B)."""
    top = max(v for v in values if v is not None)
    div, unit, spec = ((2**20, "MiB", ".1f") if top >= 2**20 else (2**10, "KiB", ".1f")
                       if top >= 2**10 else (1, "B", ".0f"))
    return (" → ".join("unknown" if v is None else format(v / div, spec) for v in values)
            + f" {unit} {per}")


def _calls(values: list[float | None]) -> str:
    return " → ".join(fmt.count(v) for v in values) + " calls per step"


def _arms_line(report: Report, names: list[str]) -> str:
    """``arms: fsdp2 with reshard_after_forward=True → with reshard_after_forward=False``."""
    arms = {a.name: a for a in report.ranking.arms}
    who = [(n, arms[n].strategy, arms[n].settings) for n in names if n in arms]
    if len(who) == 2:
        labels = list(pair_labels(*who))
    else:
        labels = [arm_label(*w) for w in who]
    return "arms: " + " → ".join(labels)


def lines(report: Report) -> list[str]:
    """Plain-text lines (the renderers escape them) of ``report.ranking.differences``: first the
    arms in the order their values are given, then the kernels per step where they differ,
    one line per collective kind and mesh
    dimension whose calls or bytes per step differ, one per memory category that differs (bytes
    on the largest rank), and one per memory effect not measurable on this device. Empty when
    the report has no differences to state (not declared arms, withheld, an arm without
    traces); when every arm was traced and nothing differs, that one line (a step-time ratio
    between them is then not from the work counted here)."""
    rows = report.ranking.differences
    if rows is UNSET or not isinstance(rows, list):
        return []  # not declared arms
    if not rows:
        ranked = {n for a in report.ranking.arms if a.name in report.ranking.order for n in a.runs}
        traced = [r for r in report.runs if r.name in ranked]
        if len(report.ranking.order) < 2 or not traced or not all(r.traces for r in traced):
            return []
        return [_arms_line(report, list(report.ranking.order)),
                NOTHING_DIFFERS]
    names = list(rows[0].values)
    out = [_arms_line(report, names)]
    comm: dict[tuple[str, str], dict[str, ArmDifference]] = {}
    for d in rows:
        if d.what.startswith("collective_"):
            comm.setdefault((d.kind, d.mesh_dim), {})[d.what] = d
    for d in rows:
        if d.what == "compute_kernels":
            out.append("compute kernels: " + " → ".join(fmt.count(v) for v in d.values.values())
                       + " per step (per rank)")
    for (kind, dim), got in comm.items():
        parts = []
        if "collective_calls" in got:
            parts.append(_calls(list(got["collective_calls"].values.values())))
        if "collective_bytes" in got:
            parts.append(_bytes(list(got["collective_bytes"].values.values()), "per step"))
        out.append(f"{kind} ({dim}): {', '.join(parts)}")
    if not any(d.what.startswith(("collective_", "memory")) for d in rows):
        out.append(SAME_COMM_AND_MEMORY)
    for d in rows:
        if d.what == "memory":
            label = "peak allocated" if d.kind == "peak" else LABELS.get(d.kind, d.kind)
            out.append(f"{label}: {_bytes(list(d.values.values()), 'per rank')}")
        elif d.what == "memory_unseen":
            out.append(f"memory: not measurable on this device for {', '.join(d.settings)} "
                       f"({d.why})")
    return out
