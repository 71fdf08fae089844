"""Communication per mesh dimension (issue 27): which ``DeviceMesh`` dimension each process
group is, and the collectives of every dimension summed.

Dimension of a process group (``dim_of``), the first rule that tells:
  1. ``pg_desc`` ``mesh_<name>`` (torch names a DeviceMesh dimension's group so: the
     ``Process Group Description`` argument, else ``distributedInfo.pg_config``) -> <name>,
     source "pg_desc"; ``default_pg`` -> "world", source "pg_desc";
  2. the run's manifest ``mesh``: the group's ranks are one of ``Mesh.group_ranks(d)`` ->
     ``dim_names[d]``, source "manifest";
  3. the group's ranks alone (foreign traces): every rank of the world -> "world"; else the
     ranks' pattern, named so that the reader sees it was inferred: consecutive ranks
     ``inferred_consecutive_n<size>``, ranks ``k`` apart ``inferred_stride<k>_n<size>``, any
     other set ``inferred_group_<pg>``; source "ranks";
  4. else "unknown", source "none" (the trace does not name the process group, e.g. a gloo
     trace without the tracer's process-group tags, or names it without ranks or description).

Figures of a dimension (``dim_table``; their meaning: report_types.py ``MeshDimComm``): union_ns
and exposed_ns from analyzer/analyses/breakdown.py ``comm_shares``, exact per process group (a
rank with two groups in one dimension gets the sum of their unions); transfer / wait / not
measured from analyzer/analyses/commsplit.py; busbw = sum of bytes x factor
(collectives.py ``busbw_factor``, each instance's own group size, else the dimension's) over
the instances with known bytes and a factor, over the sum of their durations, all ranks.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from analyzer.analyses.collectives import busbw_factor
from analyzer.contract.schemas import Mesh

WORLD = "world"
UNKNOWN = "unknown"
SUM_COLUMNS = ("count", "time_ns", "union_ns", "exposed_ns", "known", "known_bytes",
               "known_dur_ns", "transfer_ns", "wait_ns", "not_measured_ns", "measured",
               "moved_bytes", "moved_dur_ns")
KEY_COLUMNS = ("rank", "kind", "pg", "pg_desc", "pg_ranks", "group_size")


def parse_ranks(text: str | None) -> list[int] | None:
    """A group's ranks as the tables spell them ("[0, 2]"), sorted; None when not a list of
    int."""
    if not text:
        return None
    try:
        r = json.loads(text)
    except (TypeError, ValueError):
        return None
    if not isinstance(r, list) or not all(type(x) is int for x in r):
        return None
    return sorted(r)


def dim_of(pg: str, pg_desc: str, pg_ranks: str, world_size: int | None,
           mesh: Mesh | None) -> tuple[str, str]:
    """(dimension name, source) of one process group (module docstring). ``pg``: its name
    ("" unknown), ``pg_desc`` ("" unknown), ``pg_ranks`` ("[0, 2]", "" unknown),
    ``world_size`` (None unknown), ``mesh``: the manifest's (None for foreign traces)."""
    desc = pg_desc or ""
    if desc.startswith("mesh_") and len(desc) > 5:
        return desc[5:], "pg_desc"
    if desc == "default_pg":
        return WORLD, "pg_desc"
    ranks = parse_ranks(pg_ranks)
    if ranks is None:
        return UNKNOWN, "none"
    if mesh is not None:
        for d, name in enumerate(mesh.dim_names):
            if ranks in mesh.group_ranks(d):
                return str(name), "manifest"
    n = len(ranks)
    if world_size and ranks == list(range(world_size)):
        return WORLD, "ranks" if mesh is None else "manifest"
    gaps = set(np.diff(ranks).tolist()) if n > 1 else set()
    if n > 1 and len(gaps) == 1:
        k = gaps.pop()
        return (f"inferred_consecutive_n{n}" if k == 1 else f"inferred_stride{k}_n{n}"), "ranks"
    return f"inferred_group_{pg}" if pg else UNKNOWN, "ranks" if pg else "none"


def dim_parts(coll: pd.DataFrame, split: pd.DataFrame) -> pd.DataFrame:
    """Sums per (rank, kind, pg, pg_desc, pg_ranks, group_size) of one batch of collectives
    (``JobTables.collectives`` rows, profiled steps only) and their ``commsplit.wait_transfer``
    split: ``SUM_COLUMNS`` = count, time_ns (durations), union_ns, exposed_ns (the rows'
    shares, ``breakdown.comm_shares``), known (instances with known bytes), known_bytes,
    known_dur_ns (their bytes and durations), transfer_ns, wait_ns, not_measured_ns,
    measured (instances), moved_bytes / moved_dur_ns (bytes and transfer time of the measured
    instances with known bytes). All int64; every column a sum, so batches add up."""
    nbytes = coll["bytes"].to_numpy(dtype=np.int64)
    dur = np.maximum(coll["dur_ns"].to_numpy(dtype=np.int64), 0)
    known = nbytes >= 0
    measured = split["measured"].to_numpy(dtype=bool)
    moved = known & measured
    t = pd.DataFrame({
        "rank": coll["rank"].to_numpy(dtype=np.int64),
        "kind": coll["kind"].astype(str).to_numpy(),
        "pg": coll["pg"].astype(str).to_numpy(),
        "pg_desc": coll["pg_desc"].astype(str).to_numpy() if "pg_desc" in coll.columns
        else np.full(len(coll), "", object),
        "pg_ranks": coll["pg_ranks"].astype(str).to_numpy(),
        "group_size": coll["group_size"].to_numpy(dtype=np.int64),
        "count": np.ones(len(coll), np.int64), "time_ns": dur,
        "union_ns": coll["union_ns"].to_numpy(dtype=np.int64) if "union_ns" in coll.columns
        else np.zeros(len(coll), np.int64),
        "exposed_ns": coll["exposed_ns"].to_numpy(dtype=np.int64)
        if "exposed_ns" in coll.columns else np.zeros(len(coll), np.int64),
        "known": known.astype(np.int64), "known_bytes": np.where(known, nbytes, 0),
        "known_dur_ns": np.where(known, dur, 0),
        "transfer_ns": split["transfer_ns"].to_numpy(dtype=np.int64),
        "wait_ns": split["wait_ns"].to_numpy(dtype=np.int64),
        "not_measured_ns": split["not_measured_ns"].to_numpy(dtype=np.int64),
        "measured": measured.astype(np.int64), "moved_bytes": np.where(moved, nbytes, 0),
        "moved_dur_ns": np.where(moved, split["transfer_ns"].to_numpy(dtype=np.int64), 0)})
    return t.groupby(list(KEY_COLUMNS), sort=True)[list(SUM_COLUMNS)].sum().reset_index()


def with_dims(parts: pd.DataFrame, world_size: int | None, mesh: Mesh | None) -> pd.DataFrame:
    """``parts`` (``dim_parts`` rows, any batches joined) with columns mesh_dim and
    mesh_dim_source (``dim_of`` of each row's process group)."""
    out = parts.copy()
    keys = list(zip(out["pg"], out["pg_desc"], out["pg_ranks"]))
    found = {k: dim_of(*k, world_size, mesh) for k in set(keys)}
    out["mesh_dim"] = [found[k][0] for k in keys]
    out["mesh_dim_source"] = [found[k][1] for k in keys]
    return out


def dim_group_size(name: str, source: str, rows: pd.DataFrame, mesh: Mesh | None
                   ) -> int | None:
    """The group size of a dimension: the manifest mesh's extent of ``name``, else the one
    size its rows have (their group_size, else the number of their ranks); None when they
    disagree or none is known, and for "unknown" (groups the trace does not name) when some
    row's size is unknown."""
    if mesh is not None and name in mesh.dim_names:
        return int(mesh.shape[mesh.dim_names.index(name)])
    if name == UNKNOWN and (rows["group_size"] <= 0).any():
        return None
    sizes = {int(g) for g in rows["group_size"].tolist() if int(g) > 0}
    sizes |= {len(r) for r in map(parse_ranks, rows["pg_ranks"].tolist()) if r}
    return sizes.pop() if len(sizes) == 1 else None


def dim_table(parts: pd.DataFrame, rank_steps: pd.Series, world_size: int | None,
              mesh: Mesh | None) -> list[dict]:
    """One dict per dimension (module docstring), with the fields of report_types.py
    ``MeshDimComm``, in order of the manifest's ``dim_names``, then "world", then the rest by
    name. ``parts``: ``dim_parts`` of every batch, joined; ``rank_steps``: rank -> its profiled
    steps (the ``_per_step`` figures' divisor)."""
    if parts is None or not len(parts):
        return []
    t = with_dims(parts, world_size, mesh)
    order = list(mesh.dim_names) if mesh is not None else []

    def rank_of(name: str) -> tuple:
        if name in order:
            return (0, order.index(name), name)
        return (1 if name == WORLD else 2, 0, name)

    out = []
    for name in sorted(set(t["mesh_dim"]), key=rank_of):
        rows = t[t["mesh_dim"] == name]
        source = str(rows["mesh_dim_source"].iat[0])
        n_size = dim_group_size(name, source, rows, mesh)
        per_rank = rows.groupby("rank")[list(SUM_COLUMNS)].sum()
        n = len(per_rank)
        steps = per_rank.index.to_series().map(rank_steps if rank_steps is not None else {})
        steps = steps.astype(float).where(steps > 0)

        def per_step(c: str) -> float | None:
            v = (per_rank[c] / steps).dropna()
            return float(v.mean()) if len(v) else None

        # each instance's own group size, else the dimension's ("unknown": its own only)
        sizes = [int(g) if int(g) > 0 else (n_size or -1) if name != UNKNOWN else -1
                 for g in rows["group_size"].tolist()]
        fac = np.array([busbw_factor(k, g) for k, g in zip(rows["kind"], sizes)])
        ok = np.isfinite(fac)
        f = np.nan_to_num(fac)

        def bw(b: str, d: str) -> float | None:
            time = float(rows[d].to_numpy()[ok].sum())
            return float((rows[b].to_numpy() * f)[ok].sum()) / time if time > 0 else None

        measured = int(rows["measured"].sum())
        pgs = sorted({p for p in rows["pg"].tolist() if p})
        total = lambda c: float(rows[c].sum()) / n  # noqa: E731
        out.append(dict(
            name=name, source=source, group_size=n_size, groups=len(pgs) if pgs else None,
            pgs=pgs, kinds=sorted(set(rows["kind"].tolist())), n_ranks=n,
            count=total("count"), time_ns=total("time_ns"), union_ns=total("union_ns"),
            exposed_ns=total("exposed_ns"), time_ns_per_step=per_step("time_ns"),
            union_ns_per_step=per_step("union_ns"), exposed_ns_per_step=per_step("exposed_ns"),
            bytes=total("known_bytes") if int(rows["known"].sum()) else None,
            unknown_bytes=int(rows["count"].sum() - rows["known"].sum()),
            busbw_gbps=bw("known_bytes", "known_dur_ns"),
            transfer_busbw_gbps=bw("moved_bytes", "moved_dur_ns") if measured else None,
            transfer_ns=total("transfer_ns") if measured else None,
            wait_ns=total("wait_ns") if measured else None,
            not_measured_ns=total("not_measured_ns")))
    return [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
             for k, v in d.items()} for d in out]


def group_dims(parts: pd.DataFrame | None, world_size: int | None, mesh: Mesh | None
               ) -> dict[str, tuple[str, str]]:
    """{pg: (dimension, source)} of every named process group of ``parts`` (``dim_parts``
    rows); pg "" is "unknown" (source "none")."""
    found: dict[str, tuple[str, str]] = {"": (UNKNOWN, "none")}
    if parts is None or not len(parts):
        return found
    t = with_dims(parts, world_size, mesh)
    for pg, name, src in zip(t["pg"], t["mesh_dim"], t["mesh_dim_source"]):
        if pg:
            found.setdefault(str(pg), (str(name), str(src)))
    return found
