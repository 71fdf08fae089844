"""Paths and small helpers of the analyzer-core tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from tests.corpus import CORPUS, corpus  # noqa: F401 - used by the test modules
from tests.merge.builders import meta, write, x

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures" / "core"


def link_folder(dst: Path, files: list[Path]) -> Path:
    """A folder holding copies of ``files`` (to load a subset of a corpus folder). Copies, not
    symlinks: folder walks never follow a symlink out of the folder given (issue 5)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dst / f.name)
    return dst


def copy_folder(dst: Path, files: list[Path]) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, dst / f.name)
    return dst


def dask_ranks_ran(c) -> int:
    """Per-rank tasks (analyzer/ingest/cluster.py ``dask_map``) the Dask cluster ``c``'s
    scheduler has run to completion so far."""
    p = c.scheduler.task_prefixes.get("paritytrace-rank")
    return 0 if p is None else p.state_counts["memory"]


HALF = [0, 2, 4]
"""The all_gather group of ``gloo_rank``."""


def gloo_rank(rank: int, world: int = 6, n_reduce: int = 120, n_gather: int = 60) -> dict:
    """A hand-built gloo rank trace (dict) of a ``world``-rank job: its clock offset 777 µs x
    rank; every 100 µs of true time one collective slot, ending at the same true instant on
    every rank, starting 10-40 µs into it (seeded by the rank); all_reduces on process group
    "0" (the world), all_gathers on group "1" (``HALF``) in every other slot of the first
    2 x n_gather, which a rank outside ``HALF`` leaves empty; a ProfilerStep every 20 slots."""
    rng = np.random.default_rng(rank)
    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    clock_us = 5_000 + 777 * rank  # each rank's own clock offset
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)")]
    slots = [("all_gather", "1", HALF) if k < 2 * n_gather and k % 2 else
             ("all_reduce", "0", list(range(world))) for k in range(n_reduce + n_gather)]
    per_step = 20
    for k, (kind, pg, members) in enumerate(slots):
        t = 100 * k
        if k % per_step == 0:
            ev.append(x(f"ProfilerStep#{k // per_step}", clock_us + t, per_step * 100,
                        pid=pid, tid=main, cat="user_annotation"))
        ev.append(x("aten::mm", clock_us + t, 8, pid=pid, tid=main))
        if rank not in members:
            continue
        start = t + 10 + int(rng.integers(0, 30))
        end = t + 80  # ends agree across ranks (true time)
        ev.append(x("c10d::allreduce_" if kind == "all_reduce" else "c10d::allgather_",
                    clock_us + start - 5, 3, pid=pid, tid=main,
                    **{"Process Group Name": pg, "Process Group Ranks": str(members),
                       "Group size": len(members), "dtype": "Float", "In msg nelems": 1024,
                       "Out msg nelems": 1024 * (len(members) if kind == "all_gather" else 1)}))
        ev.append(x(f"gloo:{kind}", clock_us + start, end - start, pid=pid, tid=gloo))
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                "pg_count": 2,
                                "pg_config": [{"pg_name": "0", "pg_size": world,
                                               "ranks": list(range(world))},
                                              {"pg_name": "1", "pg_size": 3, "ranks": HALF}]}}


def gloo_job(folder: Path, ranks: int = 6, **kw) -> Path:
    """``gloo_rank`` 0 .. ranks-1 of one job written as ``folder/rank<r>.trace.json``
    (``kw``: n_reduce, n_gather; a name ending .gz for gzip: ``suffix``)."""
    suffix = kw.pop("suffix", ".json")
    for r in range(ranks):
        write(folder / f"rank{r}.trace{suffix}", gloo_rank(r, ranks, **kw))
    return folder
