"""Per-rank clock offsets from collectives matched across ranks.

Every rank of a collective (all_reduce, all_gather, reduce_scatter, broadcast, all_to_all,
barrier) finishes at nearly the same instant: the last data arrives everywhere within one
transfer. So the *end* of the k-th collective of one kind in one process group, seen on rank r
and on the reference rank, differs by rank r's clock offset plus transfer jitter. The offset
estimate is the median of those differences, its uncertainty the median absolute deviation
(MAD) around it (both robust to a few outliers: Rousseeuw & Croux 1993). Point-to-point
send/recv never finishes together across all ranks and is not used.

Which events are collectives (rules stated in DESIGN.md "Trace semantics"):
- NCCL: kernels named ``ncclKernel_*`` / ``ncclDevKernel_*``. The kind comes from the CPU op
  that launched the kernel (``nccl:<kind>`` or ``record_param_comms`` args "Collective name",
  found as the innermost such op on the launching thread that encloses the launch's
  ``cuda_runtime`` event, linked to the kernel by ``correlation``), else from the kernel name.
  The process group comes from ``record_param_comms`` args "Process Group Name".
- gloo: ``gloo:<kind>`` ops (they run on ``pt_gloo_runloop`` threads).
- When no event names a process group, the trace's only process group
  (``distributedInfo.pg_config``) is used, else "".

Tables (pandas) in and out; times int64 nanoseconds on each rank's own clock.
"""

from __future__ import annotations

import bisect

import numpy as np
import pandas as pd

MATCHABLE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "barrier")
_KIND_TOKENS = (
    ("reducescatter", "reduce_scatter"),
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("broadcast", "broadcast"),
    ("alltoall", "all_to_all"),
    ("barrier", "barrier"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
)
NCCL_KERNEL_PREFIXES = ("ncclKernel_", "ncclDevKernel_")
COLLECTIVE_COLUMNS = ["idx", "pg", "backend", "kind", "start_ns", "end_ns"]


def collective_kind(name: str) -> str:
    """Normalised kind of a collective op or kernel name, "other" when none is recognised.

    ``nccl:_all_gather_base`` -> all_gather, ``ncclDevKernel_ReduceScatter_Sum_f32_RING_LL`` ->
    reduce_scatter, ``allreduce`` (record_param_comms "Collective name") -> all_reduce.
    """
    flat = name.split("(")[0].replace("_", "").lower()
    for prefix in ("ncclkernel", "nccldevkernel", "nccl:", "gloo:", "c10d::"):
        if flat.startswith(prefix):
            flat = flat[len(prefix):]
            break
    for token, kind in _KIND_TOKENS:
        if token in flat:
            return kind
    return "other"


def collective_events(x: pd.DataFrame, *, default_pg: str = "") -> pd.DataFrame:
    """The collectives of one rank.

    ``x``: complete events of one trace with columns idx, name, cat, tid, ts_ns, dur_ns,
    correlation (-1 absent), pg_arg (record_param_comms "Process Group Name", "" absent),
    coll_arg ("Collective name", "" absent). Returns columns ``COLLECTIVE_COLUMNS`` (backend
    "nccl" | "gloo"), sorted by start.
    """
    rows: list[tuple] = []
    names = x["name"].astype(object)
    gloo = x[names.str.startswith("gloo:")]
    for r in gloo.itertuples(index=False):
        rows.append((r.idx, default_pg, "gloo", collective_kind(r.name), r.ts_ns, r.ts_ns + r.dur_ns))

    kernels = x[(x["cat"].str.lower() == "kernel") & names.str.startswith(NCCL_KERNEL_PREFIXES)]  # old Kineto: "Kernel"
    if len(kernels):
        launch_info = _launch_info(x, set(kernels["correlation"].tolist()))
        for r in kernels.itertuples(index=False):
            kind, pg = launch_info.get(r.correlation, ("other", ""))
            if kind == "other":
                kind = collective_kind(r.name)
            rows.append((r.idx, pg or default_pg, "nccl", kind, r.ts_ns, r.ts_ns + r.dur_ns))
    out = pd.DataFrame(rows, columns=COLLECTIVE_COLUMNS)
    out = out.astype({"idx": "int64", "start_ns": "int64", "end_ns": "int64"})
    return out.sort_values(["start_ns", "idx"], kind="stable").reset_index(drop=True)


def _launch_info(x: pd.DataFrame, correlations: set[int]) -> dict[int, tuple[str, str]]:
    """correlation -> (kind, pg) from the communication CPU ops enclosing each kernel launch."""
    names = x["name"].astype(object)
    ops = x[(names.str.startswith("nccl:") | (names == "record_param_comms"))
            & (x["cat"].str.lower() != "kernel")]
    launches = x[(x["cat"] == "cuda_runtime") & x["correlation"].isin(correlations)]
    info: dict[int, tuple[str, str]] = {}
    for tid, thread_ops in ops.groupby("tid", sort=False):
        thread_ops = thread_ops.sort_values("ts_ns", kind="stable")
        starts = thread_ops["ts_ns"].tolist()
        ends = (thread_ops["ts_ns"] + thread_ops["dur_ns"]).tolist()
        op_names = thread_ops["name"].tolist()
        pgs = thread_ops["pg_arg"].tolist()
        colls = thread_ops["coll_arg"].tolist()
        for launch in launches[launches["tid"] == tid].itertuples(index=False):
            kind, pg = "other", ""
            # walk back over ops starting at or before the launch; innermost (latest) first
            for k in range(bisect.bisect_right(starts, launch.ts_ns) - 1, -1, -1):
                if ends[k] < launch.ts_ns:
                    continue
                label = colls[k] if op_names[k] == "record_param_comms" else op_names[k]
                if kind == "other" and label:
                    kind = collective_kind(label)
                pg = pg or pgs[k]
                if kind != "other" and pg:
                    break
                if launch.ts_ns - starts[k] > 10_000_000_000:
                    break  # nothing encloses a launch for 10 s; stop scanning
            info[launch.correlation] = (kind, pg)
    return info


def match_collectives(per_rank: dict[int, pd.DataFrame]) -> pd.DataFrame:
    """Collectives matched across ranks by (pg, backend, kind, seq).

    ``seq`` is the order of the collective among those of the same (pg, backend, kind) on its
    rank. Only ``MATCHABLE_KINDS`` and keys seen on at least two ranks are kept. Returns columns
    rank, pg, backend, kind, seq, idx, start_ns, end_ns.
    """
    frames = []
    for rank, colls in per_rank.items():
        c = colls[colls["kind"].isin(MATCHABLE_KINDS)].copy()
        c["seq"] = c.groupby(["pg", "backend", "kind"], sort=False).cumcount().astype("int64")
        c["rank"] = rank
        frames.append(c)
    cols = ["rank", "pg", "backend", "kind", "seq", "idx", "start_ns", "end_ns"]
    if not frames:
        return pd.DataFrame(columns=cols)
    allc = pd.concat(frames, ignore_index=True)[cols]
    n = allc.groupby(["pg", "backend", "kind", "seq"])["rank"].transform("nunique")
    return allc[n >= 2].sort_values(["pg", "backend", "kind", "seq", "rank"]).reset_index(drop=True)


def estimate_offsets(matched: pd.DataFrame, ranks: list[int], ref_rank: int) -> pd.DataFrame:
    """Clock offset of each rank relative to ``ref_rank``: aligned time = own time - offset_ns.

    For the collectives rank r shares with ``ref_rank`` (d_k = end on r - end on ref):
    - median_ns = median of d_k; mad_ns = median |d_k - median_ns| (the uncertainty).
    - causality bounds: no rank finishes a collective before every rank has started it, so
      lo_ns = max_k(start on r - end on ref) <= offset <= hi_ns = min_k(end on r - start on ref).
    - offset_ns = median_ns clamped into [lo_ns, hi_ns] (the bounds win over a median pulled
      by a descheduled rank); when lo_ns > hi_ns the bounds contradict each other (mismatched
      collectives) and offset_ns = median_ns, consistent = False.
    A rank sharing no collective with ``ref_rank`` gets offset 0, n_matched 0, nulls elsewhere.
    Columns: rank, offset_ns, mad_ns, lo_ns, hi_ns, n_matched, consistent.
    """
    key = ["pg", "backend", "kind", "seq"]
    ref = matched[matched["rank"] == ref_rank][key + ["start_ns", "end_ns"]].rename(
        columns={"start_ns": "ref_start_ns", "end_ns": "ref_end_ns"})
    rows = []
    for rank in ranks:
        if rank == ref_rank:
            rows.append((rank, 0, 0, 0, 0, len(ref), True))
            continue
        mine = matched[matched["rank"] == rank].merge(ref, on=key)
        if mine.empty:
            rows.append((rank, 0, None, None, None, 0, True))
            continue
        diff = (mine["end_ns"] - mine["ref_end_ns"]).to_numpy(dtype=np.int64)
        median = int(round(float(np.median(diff))))
        mad = int(round(float(np.median(np.abs(diff - median)))))
        lo = int((mine["start_ns"] - mine["ref_end_ns"]).max())
        hi = int((mine["end_ns"] - mine["ref_start_ns"]).min())
        consistent = lo <= hi
        offset = min(max(median, lo), hi) if consistent else median
        rows.append((rank, offset, mad, lo, hi, len(diff), consistent))
    out = pd.DataFrame(rows, columns=["rank", "offset_ns", "mad_ns", "lo_ns", "hi_ns", "n_matched",
                                      "consistent"])
    return out.astype({"rank": "int64", "offset_ns": "int64", "mad_ns": "Int64", "lo_ns": "Int64",
                       "hi_ns": "Int64", "n_matched": "int64", "consistent": "bool"})


def end_spread(matched: pd.DataFrame, offsets: pd.DataFrame) -> pd.DataFrame:
    """Per matched collective: spread (max - min) of its end across ranks, before and after
    subtracting each rank's offset. Columns pg, backend, kind, seq, n_ranks, spread_before_ns,
    spread_after_ns."""
    m = matched.merge(offsets[["rank", "offset_ns"]], on="rank")
    m["aligned_end_ns"] = m["end_ns"] - m["offset_ns"]
    g = m.groupby(["pg", "backend", "kind", "seq"], sort=True)
    out = pd.DataFrame({
        "n_ranks": g["rank"].nunique(),
        "spread_before_ns": g["end_ns"].max() - g["end_ns"].min(),
        "spread_after_ns": g["aligned_end_ns"].max() - g["aligned_end_ns"].min(),
    }).reset_index()
    return out
