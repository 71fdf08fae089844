"""Display formatting shared by the renderers (units appear only here, never in the analyzer)."""

from __future__ import annotations

from typing import Any

from analyzer.contract.report_types import DataSupply, RunEntry, Tolerance


def ms(ns: Any, spec: str = ".2f") -> str:
    """Nanoseconds as milliseconds with ``spec``, ``-`` when missing."""
    return "-" if ns is None else f"{ns / 1e6:{spec}} ms"


def mib(b: Any) -> str:
    """Bytes as MiB (2^20 bytes), ``-`` when missing."""
    return "-" if b is None else f"{b / 2**20:.1f} MiB"


def pct(frac: Any) -> str:
    """A 0..1 fraction as a percentage, ``-`` when missing."""
    return "-" if frac is None else f"{100 * frac:.1f} %"


def num(v: Any, spec: str = ".3g") -> str:
    """A number with ``spec``, ``-`` when missing."""
    return "-" if v is None else format(v, spec)


def figure(v: Any, unit: str) -> str:
    """A figure with its report.json unit (a finding's evidence) in display units: ns as ms,
    bytes as MiB / KiB / B, frac as %, GB/s, counts; another unit written after the number;
    ``-`` when missing."""
    if v is None:
        return "-"
    if unit == "ns":
        return ms(v, ".3g" if abs(v) < 1e4 else ".2f")
    if unit == "bytes":  # a shortfall (negative spare) in the same unit as the figures beside it
        return ("-" + data_bytes(-v)) if v < 0 else data_bytes(v)
    if unit == "frac":
        return pct(v)
    if unit == "GB/s":
        return f"{num(v, '.3g')} GB/s"
    if unit == "count":
        return count(v)
    return f"{num(v, '.4g')} {unit}".rstrip()


def count(v: Any) -> str:
    """A count: an integer when whole (``6``, not ``6.0``), else one decimal (a mean)."""
    if v is None:
        return "-"
    return str(int(v)) if float(v).is_integer() else f"{v:.1f}"


def speedup(v: Any) -> str:
    """A speedup factor as ``1.40x``."""
    return "-" if v is None else f"{v:.2f}x"


def options(run: RunEntry) -> str:
    """Strategy and its options in one short string, e.g. ``fsdp2 (reshard_after_forward=True)``."""
    inner = ", ".join(f"{k}={v}" for k, v in run.options.items()
                      if v is not None and not isinstance(v, (list, dict)))
    text = run.strategy + (f" ({inner})" if inner else "")
    if run.fault:
        text += f" [fault: {run.fault}]"
    return text


def comm_kinds(run: RunEntry) -> str:
    """``1.80 ms (union); sums by kind: all_gather 1.20 ms, reduce_scatter 0.80 ms``: per rank,
    mean per profiled step; the union counts each instant once, the per-kind sums of durations
    can add up to more (collectives running at once)."""
    kinds = ", ".join(f"{k} {ms(v.time_ns_per_step)}" for k, v in run.communication.items())
    if run.comm_ns_per_step is None:
        return kinds or "-"
    head = f"{ms(run.comm_ns_per_step)} (union)"
    return f"{head}; sums by kind: {kinds}" if kinds else head


def data_bytes(b: Any, unknown: int = 0) -> str:
    """Bytes as MiB; ``unknown`` when the trace does not tell (never ``0.0 MiB``); ``+ n
    unknown`` when only some instances are known."""
    if b is None:
        return "unknown"
    text = mib(b) if b >= 2**20 else f"{b / 2**10:.1f} KiB" if b >= 2**10 else f"{b:.0f} B"
    return text + (f" (+{unknown} unknown)" if unknown else "")


def data_supply(d: DataSupply | None) -> str:
    """``38.0 % (loader, 2 workers, 20 ms/sample)``: a run's data-wait share (all ranks and
    steps) and how its input was supplied; ``-`` without traces."""
    if d is None:
        return "-"
    how = ""
    if d.source == "loader":
        how = f"loader, {d.workers or 0} workers"
        if d.sample_cost_ms:
            how += f", {num(d.sample_cost_ms, 'g')} ms/sample"
    elif d.source:
        how = str(d.source)
    share = pct(d.data_wait_frac)
    if share == "-":
        return how or "-"
    return f"{share} ({how})" if how else share


def tolerance_line(tol: Tolerance | None) -> str:
    """``rtol 1.3e-06, atol 1e-05; source`` (``Tolerance.describe``), ``-`` without one."""
    return tol.describe() if tol else "-"


def precision_setting(precision: str, training: dict | None) -> str:
    """The settings table's precision cell: ``--precision`` and, when recorded, the training
    setup that also decides the numbers (optimizer, mixed-precision policy, checkpointing)."""
    if not training:
        return precision
    parts = [precision, str((training.get("optimizer") or {}).get("name", "sgd"))]
    if training.get("mixed_precision"):
        parts.append("mixed precision " + ",".join(training["mixed_precision"]))
    if training.get("activation_checkpointing"):
        parts.append("activation checkpointing")
    return ", ".join(parts)
