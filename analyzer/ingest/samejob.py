"""Refuse traces of different jobs mixed in one folder (reason ``mixed_jobs``).

Two signals. distributedInfo, when it contradicts itself across files
(``distributed_info_mismatches``): the backend differs, or a process group of one name has
different members. It rarely does: two jobs on the same world size carry the same backend, rank
layout and ``pg_config``. So, second, the collectives (``check_same_job``): in one job every
member of a process group issues the same collectives in the same order (SPMD; NCCL and gloo hang
otherwise), so in a ProfilerStep both ranks trace, the set of collective kinds a rank ran on a
process group equals every other member's. Two ranks whose sets differ in *every* (process group,
step) they share cannot have run the same job. Requiring every shared cell to differ keeps a real
run with a dropped event or a cut profiler window (one cell off) loading.

Limit: two different jobs with the same collective kinds per step (two DDP runs of different
models) are not told apart; ranks that share no (process group, step) are not compared.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analyzer.contract.errors import BadInput
from analyzer.ingest.ranktables import RankTables


def distributed_info_mismatches(files: list[RankTables]) -> list[BadInput]:
    """Problems (``mixed_jobs``) of files (a job's ``RankTables``) that cannot come from one
    job: ``distributedInfo.backend`` differs, or a process group of the same name has different
    member ranks (``distributedInfo.pg_config``). Ranks may list different groups (a rank
    outside a subgroup does not know it), so only groups present in several files are
    compared."""
    seen: dict[tuple[str, str], dict[str, list[RankTables]]] = {}  # (what, pg) -> value -> files
    for f in files:
        d = f.dist
        if d.backend is not None:
            seen.setdefault(("backend", ""), {}).setdefault(d.backend, []).append(f)
        for name, text in d.ranks_text().items():
            if text:
                seen.setdefault(("pg", name), {}).setdefault(text, []).append(f)
    problems = []
    for (what, pg), by_value in sorted(seen.items()):
        if len(by_value) > 1:
            desc = "; ".join(f"{'ranks ' if what == 'pg' else ''}{v} in "
                             f"{', '.join(f.path.name for f in fs)}"
                             for v, fs in sorted(by_value.items()))
            head = "backends disagree" if what == "backend" else \
                f"process group {pg!r} has different members"
            problems.append(BadInput(files[0].path.parent, "mixed_jobs", f"{head}: {desc}",
                                     "put only one job's traces in the folder"))
    return problems


def kind_sets(coll: pd.DataFrame) -> dict[int, dict[tuple[str, int], frozenset[str]]]:
    """Per rank: {(pg, step): frozenset of collective kinds}. ``coll`` has the columns of
    ``analyzer.analyses.collectives.COLUMNS`` (rank, step, pg, kind); events outside a ProfilerStep
    (step < 0) are left out unless the rank has no step at all (whole-trace mode); rows
    without a process group (NaN pg) are left out. Ranks and cells in ascending order.
    Plain Python over the rows: a few thousand rows, where a pandas groupby per rank costs
    more than the whole check."""
    if coll.empty:
        return {}
    ranks = coll["rank"].to_numpy().tolist()
    steps = coll["step"].to_numpy().tolist()
    pgs = coll["pg"].tolist()
    has_pg = coll["pg"].notna().to_numpy().tolist()
    kinds = coll["kind"].astype(str).tolist()
    stepped = {r for r, s in zip(ranks, steps) if s >= 0}
    cells: dict[int, dict[tuple[str, int], set[str]]] = {int(r): {} for r in set(ranks)}
    for r, s, pg, ok, k in zip(ranks, steps, pgs, has_pg, kinds):
        if r in stepped:
            if s < 0:
                continue
        else:
            s = -1  # whole-trace mode: the rank's events are one cell per pg
        if ok:
            cells[int(r)].setdefault((str(pg), int(s)), set()).add(k)
    return {r: {c: frozenset(cells[r][c]) for c in sorted(cells[r])} for r in sorted(cells)}


def check_same_job(root: Path | str, batches, paths: dict[int, Path]) -> None:
    """Raise ``BadInput(root, "mixed_jobs", ...)`` naming the files when some rank's collectives
    contradict the lowest rank's in every shared (process group, step) (module docstring).
    ``batches``: (anything, collectives table: columns as ``kind_sets``) pairs in ascending
    rank order, as ``JobTables.batches`` gives them: one batch is held at a time besides the
    lowest rank's cells. ``paths`` maps rank -> trace file."""
    ref, ref_cells = None, {}
    odd, example = [], None
    for _, frame in batches:
        for rank, cells in kind_sets(frame).items():
            if ref is None:
                ref, ref_cells = rank, cells
                continue
            shared = sorted(set(cells) & set(ref_cells))
            if shared and all(cells[c] != ref_cells[c] for c in shared):
                odd.append(rank)
                if example is None:
                    pg, step = shared[0]
                    example = (f"process group {pg or '?'} step {step}: rank {ref} ran "
                               f"{', '.join(sorted(ref_cells[shared[0]]))}, rank {rank} ran "
                               f"{', '.join(sorted(cells[shared[0]]))}")
    if odd:
        names = ", ".join(Path(paths[r]).name for r in [ref, *odd] if r in paths)
        raise BadInput(root, "mixed_jobs",
                       f"traces of different jobs mixed ({names}): ranks {odd} ran other "
                       f"collectives than rank {ref} in every step they share ({example})",
                       "put each job's traces in its own folder")
