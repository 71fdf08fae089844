"""Per rank and step time breakdown: compute, communication, overlap, exposed, other, idle.

Sets, per rank and step S (events attributed to S, see analyzer/classify.py, clipped to S's
window ``[start_ns, end_ns)``):

GPU rank (the GPU timeline, as HTA's temporal breakdown):
  C = NCCL kernels, K = other kernels, O = memcpy / memset / sync.
CPU rank (gloo):
  C = ``gloo:*`` ops (the runloop threads), K = main-thread cpu_ops minus the time the main
  thread spends inside c10d enqueue / wait ops, O = every other CPU event except ranges
  (ProfilerStep, user annotations).

  compute_ns = |K|, comm_ns = |C|, overlap_ns = |C ∩ K| (HTA get_comm_comp_overlap),
  exposed_comm_ns = |C \\ K| (TraceLens), other_ns = |O \\ (C ∪ K)|,
  idle_ns = window - |C ∪ K ∪ O|,
so compute_ns + exposed_comm_ns + other_ns + idle_ns == step_ns exactly (integers).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer import intervals as iv

COLUMNS = ["rank", "step", "step_start_ns", "step_ns", "compute_ns", "comm_ns", "overlap_ns",
           "exposed_comm_ns", "other_ns", "idle_ns", "overlap_frac"]
_OTHER_CPU = ("other", "comm_enqueue", "memcpy", "memset", "sync")


def step_sets(ev: pd.DataFrame, device_kind: str, main_tid: str | None, lo: int, hi: int
              ) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals]:
    """(C, K, O) of the events ``ev`` (already restricted to one step), clipped to [lo, hi)."""
    role = ev["role"].to_numpy().astype(object)
    gpu = ev["is_gpu"].to_numpy()
    s = ev["ts_ns"].to_numpy()
    e = ev["end_ns"].to_numpy()

    def pick(mask):
        return iv.clip(iv.merge(s[mask], e[mask]), lo, hi)

    if device_kind == "gpu":
        comm = pick(gpu & (role == "comm"))
        comp = pick(gpu & (role == "compute"))
        other = pick(gpu & np.isin(role, ("memcpy", "memset", "sync")))
        return comm, comp, other
    comm = pick(role == "comm")
    comp = pick(role == "compute")
    if main_tid is not None:
        tid = ev["tid"].astype(str).to_numpy()
        inside_comm = pick((role == "comm_enqueue") & (tid == main_tid))
        comp = iv.subtract(comp, inside_comm)
    other = pick(~gpu & np.isin(role, _OTHER_CPU))
    return comm, comp, other


def rank_breakdown(rank: int, events: pd.DataFrame, steps: pd.DataFrame, device_kind: str,
                   main_tid: str | None) -> pd.DataFrame:
    """Breakdown rows (COLUMNS) of one rank; ``steps`` holds step, start_ns, end_ns."""
    rows = []
    groups = events.groupby("step", sort=False).indices
    for st, lo, hi in steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        idx = groups.get(st)
        ev = events.iloc[idx] if idx is not None else events.iloc[:0]
        comm, comp, other = step_sets(ev, device_kind, main_tid, int(lo), int(hi))
        step_ns = int(hi - lo)
        compute_ns = iv.measure(comp)
        comm_ns = iv.measure(comm)
        overlap_ns = iv.measure(iv.intersect(comm, comp))
        exposed_ns = comm_ns - overlap_ns  # |C \ K| = |C| - |C ∩ K|
        busy = iv.union(comm, comp)
        other_ns = iv.measure(iv.subtract(other, busy))
        idle_ns = step_ns - compute_ns - exposed_ns - other_ns
        rows.append((rank, int(st), int(lo), step_ns, compute_ns, comm_ns, overlap_ns,
                     exposed_ns, other_ns, idle_ns,
                     overlap_ns / comm_ns if comm_ns else float("nan")))
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({c: "int64" for c in COLUMNS if c.endswith("_ns") or c in ("rank", "step")})


def whole_trace_overlap(events: pd.DataFrame) -> tuple[int, int]:
    """(overlap_ns, comm_ns) over every GPU event of the trace, whatever its step: HTA's
    ``get_comm_comp_overlap`` scope (communication = NCCL kernels, computation = other kernels
    except memcpy / memset / sync, whole profiled window)."""
    gpu = events["is_gpu"].to_numpy()
    role = events["role"].to_numpy().astype(object)
    s = events["ts_ns"].to_numpy()
    e = events["end_ns"].to_numpy()
    comm = iv.merge(s[gpu & (role == "comm")], e[gpu & (role == "comm")])
    comp = iv.merge(s[gpu & (role == "compute")], e[gpu & (role == "compute")])
    return iv.measure(iv.intersect(comm, comp)), iv.measure(comm)


def timeline_rows(ev: pd.DataFrame, device_kind: str, main_tid: str | None, lo: int, hi: int
                  ) -> pd.DataFrame:
    """Merged compute and per-kind comm intervals of one step for plotting."""
    comm, comp, _ = step_sets(ev, device_kind, main_tid, lo, hi)
    parts = [pd.DataFrame({"lane": "compute", "kind": "", "start_ns": comp[0],
                           "end_ns": comp[1]})]
    role = ev["role"].to_numpy().astype(object)
    kinds = ev["coll_kind"].to_numpy().astype(object)
    gpu = ev["is_gpu"].to_numpy()
    base = (role == "comm") & (gpu if device_kind == "gpu" else np.ones(len(ev), bool))
    for k in sorted({str(x) for x in kinds[base]}):
        m = base & (kinds == k)
        c = iv.clip(iv.merge(ev["ts_ns"].to_numpy()[m], ev["end_ns"].to_numpy()[m]), lo, hi)
        parts.append(pd.DataFrame({"lane": "comm", "kind": k, "start_ns": c[0], "end_ns": c[1]}))
    out = pd.concat(parts, ignore_index=True)
    return out.astype({"start_ns": "int64", "end_ns": "int64"})
