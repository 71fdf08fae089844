"""A trace's distributed metadata (Kineto's ``distributedInfo``), read in one place.

torch's profiler (profiler.py ``_get_distributed_info``) writes backend, rank, world_size and,
since 2.2, pg_config: pg_name, pg_desc (2.3), pg_size, ranks of each group the rank is in.
Absent or mistyped: unknown (None), never an error. Also read: pg_config as {pg_name: entry}
(Flight Recorder's, ``desc``); ranks "[0, 1]" or "all" (the world). No pg_name: left out.

``ranks`` is the one parser of a group's ranks, the traces' and the Flight Recorder dumps'
(analyzer/ingest/frdump.py). Given ``most`` (the most ranks the job holds) it is bounded: a
string longer than ``most`` ranks can spell is refused before it is parsed, and so is any rank
outside ``range(most)``; nothing is allocated beyond what a job of that size holds.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class ProcessGroup:
    """A group of pg_config: pg_desc ("default_pg", "mesh_shard"), global ranks, pg_size >= 1."""

    desc: str | None = None
    ranks: tuple[int, ...] | None = None
    size: int | None = None


@dataclass(frozen=True, slots=True)
class DistInfo:
    """distributedInfo: rank >= 0, world_size >= 1, backend, groups (pg_name -> the group)."""

    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    groups: dict[str, ProcessGroup] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        return {n: g.size for n, g in self.groups.items() if g.size is not None}

    def descs(self) -> dict[str, str]:
        return {n: g.desc for n, g in self.groups.items() if g.desc is not None}

    def ranks_text(self) -> dict[str, str]:
        """{pg_name: ranks as record_param_comms spells them, "[0, 1]"; "" when unknown}."""
        return {n: "" if g.ranks is None else json.dumps(list(g.ranks))
                for n, g in self.groups.items()}


def _whole(value: Any, least: int) -> int | None:
    return value if type(value) is int and value >= least else None


MAX_WORLD_SIZE = 1 << 17
"""The most ranks a job is taken to hold when nothing states its world size (131072: more than
any training job published; Llama 3 trained on 16384 GPUs). Bounds the ranks a Flight Recorder
dump may name when no manifest or trace says how many there are."""


def _spelled_bytes(most: int) -> int:
    """The longest ``str(list)`` of ``most`` distinct ranks below ``most`` ("[0, 1, 2]"), with
    room for other spacing: a longer string cannot be such a list."""
    return 2 + most * (len(str(most - 1)) + 2) * 2


def ranks(value: Any, world_size: int | None, *, most: int | None = None) -> tuple[int, ...] | None:
    """A group's global ranks from pg_config's ``ranks``: a list of ints, its JSON text "[0, 1]",
    or "all" (``range(world_size)``); None when it is none of them. ``most``: the most ranks
    the job holds; given, a string longer than such a list can be is None unparsed, and so is
    a list of more than ``most`` ranks or a rank outside ``range(most)``. Never raises."""
    if isinstance(value, str):
        if most is not None and len(value) > _spelled_bytes(most):
            return None
        if value.strip() == "all":
            if world_size is None or (most is not None and world_size > most):
                return None
            return tuple(range(world_size))
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return None
    if not (isinstance(value, list) and all(type(r) is int for r in value)):
        return None
    if most is not None and (len(value) > most or any(not 0 <= r < most for r in value)):
        return None
    return tuple(value)


def read(info: Any) -> DistInfo:
    """The ``DistInfo`` of a trace's ``distributedInfo`` value (any JSON value). Never raises."""
    if not isinstance(info, dict):
        return DistInfo()
    world, cfg = _whole(info.get("world_size"), 1), info.get("pg_config")
    if isinstance(cfg, dict):
        cfg = [{"pg_name": k, **v} for k, v in cfg.items() if isinstance(v, dict)]
    groups = {}
    for g in cfg if isinstance(cfg, list) else []:
        name = g.get("pg_name") if isinstance(g, dict) else None
        if type(name) is str or type(name) is int:
            desc = g.get("pg_desc", g.get("desc"))
            groups[str(name)] = ProcessGroup(desc if isinstance(desc, str) else None,
                                             ranks(g.get("ranks"), world),
                                             _whole(g.get("pg_size"), 1))
    backend = info.get("backend")
    return DistInfo(_whole(info.get("rank"), 0), world,
                    backend if isinstance(backend, str) else None, groups)
