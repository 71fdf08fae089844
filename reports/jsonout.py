"""report.json: serialisation, the required keys (issue 4), and atomic writing of outputs."""

from __future__ import annotations

import json
from typing import Any

from analyzer.atomic import write_atomic  # noqa: F401 - report files are written with it

RUN_KEYS = ("name", "strategy", "world_size", "backend", "device", "parity", "step_time_ns",
            "memory", "communication", "overlap_frac", "exposed_comm_ns", "ranks", "prefetch", "data")
PARITY_KEYS = ("status", "max_grad_rel_l2", "loss_max_rel_diff", "first_divergence")
DIVERGENCE_KEYS = ("tensor", "kind", "rel_l2", "tolerance")
RANK_KEYS = ("rank", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "overlap_frac", "idle_ns",
             "data_wait_ns", "data_wait_frac")
COMM_KEYS = ("count", "time_ns", "bytes", "busbw_gbps")


def problems(report: dict[str, Any]) -> list[str]:
    """Every way ``report`` misses the report.json contract of issue 4 (empty list = valid)."""
    out = []
    for k in ("schema_version", "runs", "ranking"):
        if k not in report:
            out.append(f"missing top-level key {k}")
    for i, r in enumerate(report.get("runs", [])):
        where = f"runs[{i}]"
        out += [f"{where} lacks {k}" for k in RUN_KEYS if k not in r]
        p = r.get("parity", {})
        out += [f"{where}.parity lacks {k}" for k in PARITY_KEYS if k not in p]
        if p.get("status") not in ("pass", "fail", "not_recorded", "reference"):
            out.append(f"{where}.parity.status is {p.get('status')!r}")
        fd = p.get("first_divergence")
        if fd is not None:
            out += [f"{where}.parity.first_divergence lacks {k}" for k in DIVERGENCE_KEYS if k not in fd]
        for k in ("median", "p90"):
            if k not in r.get("step_time_ns", {}):
                out.append(f"{where}.step_time_ns lacks {k}")
        for k in ("peak_rss_bytes", "peak_allocated_bytes"):
            if k not in r.get("memory", {}):
                out.append(f"{where}.memory lacks {k}")
        for kind, c in (r.get("communication") or {}).items():
            out += [f"{where}.communication.{kind} lacks {k}" for k in COMM_KEYS if k not in c]
        for j, rk in enumerate(r.get("ranks") or []):
            out += [f"{where}.ranks[{j}] lacks {k}" for k in RANK_KEYS if k not in rk]
    rk = report.get("ranking", {})
    for k in ("status", "order", "reason"):
        if k not in rk:
            out.append(f"ranking lacks {k}")
    if rk.get("status") not in ("ranked", "withheld"):
        out.append(f"ranking.status is {rk.get('status')!r}")
    return out


def dumps(report: dict[str, Any]) -> str:
    """report.json text (NaN is never written: the collector maps it to null)."""
    return json.dumps(report, indent=2, allow_nan=False, default=str) + "\n"
