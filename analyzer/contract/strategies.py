"""The strategy table: what each training strategy is, written once. Every package asks a
strategy's row, never its name; a new strategy is a row here and a setup hook in
tracer/strategies.py (ARCHITECTURE.md "The strategy table").

A row names its mesh dimensions (``dims``, ``("world",)`` for a flat group of ranks) and the role
of each (``roles``): ``shard`` (parameters sharded over it: FSDP / FSDP2), ``replicate`` (whole
parameters, gradients averaged over it), ``tensor`` (weights split by a tensor-parallel plan),
``stage`` (layers split into pipeline stages); no role: unused (``single``'s world of one). The
roles follow torchtitan's parallel dims (dp_replicate, dp_shard, tp, pp)."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, Mapping

Wrapper = Literal["none", "ddp", "fsdp1", "fsdp2"]
"""What wraps the model: nothing (the one-process reference), ``DistributedDataParallel``, FSDP1
``FullyShardedDataParallel``, FSDP2 ``fully_shard`` (pp: on each stage's dp dimension)."""
Role = Literal["shard", "replicate", "tensor", "stage"]

FSDP_OPTIONS = ("sharding_strategy", "wrap_min_params", "backward_prefetch", "forward_prefetch",
                "reshard_after_forward")
FSDP2_OPTIONS = ("fsdp2_prefetch", "reshard_after_forward_size")
"""FSDP2's explicit prefetch depth and partial resharding (issue 45; FSDP1 has neither)."""
DDP_OPTIONS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
DDP_DEFAULT_BUCKET = "default"
"""The manifest's ``strategy_options.bucket_cap_mb`` (and a declared arm's setting) of a ddp run
given no ``--bucket-cap-mb`` (``--bucket-cap-mb default``): torch's default buckets, a first
bucket of 1 MiB (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``) and 25 MiB after it
(``_DEFAULT_BUCKET_CAP_MB``; torch/nn/parallel/distributed.py ``_BucketCapacityConfig.create``:
the small first bucket only when ``bucket_cap_mb`` is None). An explicit ``--bucket-cap-mb 25``
makes every bucket 25 MiB, the first too, so the two are different settings (on the reference
model, 2 all_reduce calls per step against 1). Records before issue 42 wrote 25.0 for both."""
PP_OPTIONS = ("pp", "pp_schedule", "microbatches", "pp_virtual")
COMMON_FAULTS = ("wrong-grad-scale", "unsynced-init")
"""Fault canaries every distributed strategy reproduces (tracer/faults.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategySpec:
    """One strategy's row."""

    name: str
    """``tracer record --strategy NAME``, the manifest's ``strategy``."""
    wrapper: Wrapper
    dims: tuple[str, ...]
    """Mesh dimension names, outermost first (``schemas.Mesh.dim_names``); ``("world",)`` flat."""
    roles: Mapping[str, Role]
    """The role of each dimension the run uses (module docstring)."""
    options: tuple[str, ...]
    """``tracer record`` options the strategy takes (RecordConfig field names); any other
    strategy option given to it is refused, never silently ignored."""
    faults: tuple[str, ...]
    """``--fault`` canaries the strategy reproduces. FSDP's reduce_scatter both sums and
    partitions the gradient, so "never averaged" (skip-grad-sync) has no local-only form there;
    ``hang`` (one rank never enters a gradient all_reduce) is DDP's Flight Recorder canary."""
    in_all: bool
    """Recorded by ``--strategy all`` (the flat set)."""
    colour: str
    """Its colour in report plots (Tableau 10)."""

    @property
    def is_reference(self) -> bool:
        """The one-process run the others are compared with (parity, speedup)."""
        return self.wrapper == "none"

    @property
    def is_flat(self) -> bool:
        """One flat group of ranks (no 2-D ``DeviceMesh``)."""
        return self.dims == ("world",)

    def dim_of(self, role: Role) -> str | None:
        """The dimension with ``role``, or None when the strategy has none."""
        return next((d for d in self.dims if self.roles.get(d) == role), None)

    def shards_parameters(self, options: Mapping[str, Any] | None = None) -> bool:
        """True when a rank holds a shard of the parameters, not all of them: an FSDP wrapper on
        some dimension, except FSDP1's ``sharding_strategy="no_shard"`` (DDP-like)."""
        if self.dim_of("shard") is None:
            return False
        return not (self.wrapper == "fsdp1"
                    and (options or {}).get("sharding_strategy") == "no_shard")


def _row(name: str, wrapper: Wrapper, roles: dict[str, Role], options: tuple[str, ...],
         faults: tuple[str, ...], colour: str, *, dims: tuple[str, ...] | None = None,
         in_all: bool = False) -> StrategySpec:
    return StrategySpec(name=name, wrapper=wrapper, dims=dims or tuple(roles) or ("world",),
                        roles=MappingProxyType(roles), options=options, faults=faults,
                        in_all=in_all, colour=colour)


TABLE: dict[str, StrategySpec] = {s.name: s for s in (
    _row("single", "none", {}, (), (), "#b07aa1", in_all=True),
    _row("ddp", "ddp", {"world": "replicate"}, DDP_OPTIONS,
         ("skip-grad-sync", *COMMON_FAULTS, "hang"), "#4e79a7", in_all=True),
    _row("fsdp", "fsdp1", {"world": "shard"}, FSDP_OPTIONS, COMMON_FAULTS, "#f28e2b",
         in_all=True),
    _row("fsdp2", "fsdp2", {"world": "shard"}, FSDP_OPTIONS + FSDP2_OPTIONS + ("float8",),
         COMMON_FAULTS, "#59a14f", in_all=True),
    _row("hsdp", "fsdp2", {"replicate": "replicate", "shard": "shard"},
         FSDP_OPTIONS + FSDP2_OPTIONS + ("float8", "mesh"),
         (*COMMON_FAULTS, "skip-replicate-sync"), "#e15759"),
    _row("fsdp2_tp", "fsdp2", {"dp": "shard", "tp": "tensor"},
         FSDP_OPTIONS + FSDP2_OPTIONS + ("async_tp", "tp"),
         (*COMMON_FAULTS, "wrong-tp-placement"), "#76b7b2"),
    _row("pp", "fsdp2", {"dp": "shard", "pp": "stage"}, PP_OPTIONS,
         (*COMMON_FAULTS, "skip-microbatch"), "#edc948"),
)}
"""Every strategy, in the order the CLI lists them."""

STRATEGY_OPTIONS: tuple[str, ...] = tuple(dict.fromkeys(o for s in TABLE.values() for o in s.options))
"""Every strategy option of any row (the options a row may refuse)."""


def spec(name: str | None) -> StrategySpec | None:
    """The row of strategy ``name``; None for a name not in the table (a trace recorded by
    another tool, or an older paritytrace with a strategy since removed)."""
    return TABLE.get(name) if name is not None else None


def is_reference(name: str | None) -> bool:
    """True for the reference strategy's name (``StrategySpec.is_reference``); False for any
    other, unknown names included."""
    row = spec(name)
    return row is not None and row.is_reference


def all_set() -> list[str]:
    """What ``--strategy all`` records, in table order."""
    return [s.name for s in TABLE.values() if s.in_all]
