"""One plain function per strategy (torchtitan style) and how each exposes its gradients.

``SETUP`` maps every strategy of the table (analyzer/contract/strategies.py) to its setup hook:
the baseline's initial weights loaded, the model placed and wrapped (``apply_ddp`` /
``apply_fsdp`` / ``apply_fsdp2`` / ``apply_tp``, pp's stages in
tracer/pipeline.py), returned as a ``Built`` for the training loop. ``compared_tensors`` yields,
for the numerics, each parameter's (or gradient's) local values together with the baseline
elements they must equal.

Tolerances of hsdp and fsdp2_tp are fsdp2's (``tolerance.TOLERANCES`` by precision, the
torch.testing.assert_close defaults), and so is their derivation: each compared element is a
short float32 sum whose order changed. The order does change with the mesh: HSDP sums the
ranks' gradients as (shard group reduce_scatter) then (replicate group all_reduce), i.e.
(g0 + g1) + (g2 + g3) on a 2 x 2 mesh rather than one 4-way sum; fsdp2_tp sums each rowwise
matmul's inner dimension in T partial sums added by the tp all_reduce, and its dp reduction
runs over W / T ranks. Each reordering moves a result by a few float32 ulps of the summed
magnitudes, the same order as fsdp2's own reduce_scatter, so rtol 1.3e-6 / atol 1e-5 hold; a
wider or deeper model adds terms to each sum, not reorderings beyond that bound's form.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

import torch
import torch.distributed as dist
from torch import nn

from analyzer.contract.schemas import Mesh
from analyzer.contract.strategies import TABLE
from tracer import faults
from tracer.config import RecordConfig
from tracer.modelspec import ModelSpec, load_parameters
from tracer.numerics import clean_fqn
from tracer.training import apply_checkpointing

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from tracer.pipeline import PipelineRank


def apply_ddp(model: nn.Module, cfg: RecordConfig, device: torch.device) -> nn.Module:
    """DistributedDataParallel; on CUDA pinned to ``device``. DDP broadcasts rank 0's weights.

    ``--bucket-cap-mb`` (None: not passed, torch's default, a 1 MiB first bucket then 25 MiB),
    ``--gradient-as-bucket-view``, ``--static-graph`` are DDP's constructor arguments; ``--mixed-precision fp32,REDUCE,fp32``
    registers a compression comm hook (``training.ddp_comm_hook``).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    from tracer.training import ddp_comm_hook

    ids = [device.index] if device.type == "cuda" else None
    extra = {} if cfg.bucket_cap_mb is None else {"bucket_cap_mb": cfg.bucket_cap_mb}
    ddp = DDP(model, device_ids=ids, gradient_as_bucket_view=cfg.gradient_as_bucket_view,
              static_graph=cfg.static_graph, **extra)
    ddp_comm_hook(ddp, cfg)
    return ddp


def fsdp_unit_names(model: nn.Module, min_params: int) -> list[str]:
    """Modules that ``size_based_auto_wrap_policy(min_num_params=min_params)`` wraps, post-order.

    Mirrors the policy's rule (a module is wrapped when the parameters not already inside a
    wrapped descendant reach ``min_params``, except ModuleList / ModuleDict, which the policy
    never wraps; the root is always wrapped and not listed) so that FSDP2 gets the same units as
    FSDP1.
    """
    units: list[str] = []

    def visit(name: str, module: nn.Module) -> int:
        remaining = sum(p.numel() for p in module.parameters(recurse=False))
        for child_name, child in module.named_children():
            remaining += visit(f"{name}.{child_name}" if name else child_name, child)
        if name and remaining >= min_params and not isinstance(module, (nn.ModuleList, nn.ModuleDict)):
            units.append(name)
            return 0
        return remaining

    visit("", model)
    return units


def unit_names(model: nn.Module, spec: ModelSpec) -> list[str]:
    """FQNs of the modules that become FSDP units, post-order (the root is always one, not listed).

    ``spec.wrap_min_params`` set: ``strategies.fsdp_unit_names`` (the size-based rule);
    else every instance of a ``spec.units`` class, post-order (children before parents), which
    is the order ``ModuleWrapPolicy`` wraps in.
    """
    if spec.wrap_min_params is not None:
        return fsdp_unit_names(model, spec.wrap_min_params)
    if not spec.units:
        return []
    names: list[str] = []

    def visit(name: str, module: nn.Module) -> None:
        for child_name, child in module.named_children():
            visit(f"{name}.{child_name}" if name else child_name, child)
        if name and isinstance(module, spec.units):
            names.append(name)

    visit("", model)
    return names


def apply_fsdp(model: nn.Module, cfg: RecordConfig, device: torch.device, spec: ModelSpec) -> nn.Module:
    """FSDP1 (``FullyShardedDataParallel``) with ``use_orig_params``; units from ``spec``:
    ``size_based_auto_wrap_policy`` when ``spec.wrap_min_params`` is set (the reference model),
    else ``ModuleWrapPolicy(spec.units)`` (no policy when there are none: the root only).

    ``device_id`` is required on CPU (``torch.device("cpu")``); ``sync_module_states`` and CPU
    offload fail on CPU, so ranks must start from identical weights (they load them from the
    baseline file). ``use_orig_params=True`` is needed for ``summon_full_params(with_grads=True)``.
    """
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, size_based_auto_wrap_policy

    prefetch = {"pre": BackwardPrefetch.BACKWARD_PRE, "post": BackwardPrefetch.BACKWARD_POST,
                "none": None}[cfg.backward_prefetch]
    if spec.wrap_min_params is not None:
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=spec.wrap_min_params)
    else:
        policy = ModuleWrapPolicy(set(spec.units)) if spec.units else None
    mixed = None
    if cfg.mixed_precision is not None:
        from torch.distributed.fsdp import MixedPrecision

        from tracer.training import mp_dtypes

        param, reduce, buffer = mp_dtypes(cfg)
        mixed = MixedPrecision(param_dtype=param, reduce_dtype=reduce, buffer_dtype=buffer)
    return FSDP(
        model,
        auto_wrap_policy=policy,
        sharding_strategy=ShardingStrategy[cfg.sharding_strategy.upper()],
        backward_prefetch=prefetch,
        forward_prefetch=cfg.forward_prefetch,
        device_id=device,
        use_orig_params=True,
        mixed_precision=mixed,
    )


def apply_fsdp2(model: nn.Module, cfg: RecordConfig, device: torch.device, spec: ModelSpec,
                mesh=None) -> nn.Module:
    """FSDP2: ``fully_shard`` on each unit of ``unit_names`` (post-order), then the root.

    ``--mixed-precision``: ``MixedPrecisionPolicy(param_dtype, reduce_dtype)`` on every
    ``fully_shard``; buffers cast to BUFFER once before (FSDP2 does not manage buffers).
    Mesh: ``mesh`` (hsdp: the 2-D replicate x shard mesh; fsdp2_tp: its dp dimension), by
    default 1-D over all ranks on ``device.type`` (a "cpu" mesh works with gloo). Parameters become
    DTensors sharded on dim 0 (``Shard(0)``, torch.chunk semantics). ``reshard_after_forward``:
    ``cfg.resolved_reshard_after_forward`` (an int N: reshard to groups of N ranks after
    forward). Prefetch: ``fsdp2_prefetch_units``. ``--float8``: torchao's conversion first
    (tracer/gpuonly.py). What torch then holds: ``fsdp2_applied``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if cfg.float8:
        from tracer.gpuonly import apply_float8

        apply_float8(model)
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    reshard = cfg.resolved_reshard_after_forward
    kwargs = {"mesh": mesh, "reshard_after_forward": reshard}
    if cfg.mixed_precision is not None:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        from tracer.training import cast_buffers, mp_dtypes

        param, reduce, _ = mp_dtypes(cfg)
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param, reduce_dtype=reduce)
        cast_buffers(model, cfg)  # FSDP2 has no buffer dtype (tracer/training.py)
    # clean_fqn: with --activation-checkpointing (applied before) the unit is its checkpoint wrapper
    units = [model.get_submodule(clean_fqn(n)) for n in unit_names(model, spec)]
    for unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    forward, backward = fsdp2_prefetch_units(len(units), cfg.fsdp2_prefetch or int(cfg.forward_prefetch),
                                             cfg.fsdp2_prefetch)
    if (warning := prefetch_cut(len(units), cfg.fsdp2_prefetch or 0)) and (
            not dist.is_initialized() or dist.get_rank() == 0):  # once, not per rank
        log.warning("%s", warning)
    for k, unit in enumerate(units):
        if forward[k]:
            unit.set_modules_to_forward_prefetch([units[j] for j in forward[k]])
        if backward[k]:
            unit.set_modules_to_backward_prefetch([units[j] for j in backward[k]])
    return model


def fsdp2_prefetch_units(n_units: int, forward_depth: int, backward_depth: int
                         ) -> tuple[list[list[int]], list[list[int]]]:
    """Which units each of ``n_units`` FSDP2 units (forward order) prefetches explicitly:
    (forward, backward), per unit the indices of the next ``forward_depth`` units and of the
    previous ``backward_depth`` units, nearest first (torchtitan's and torch's FSDP2 example's
    pattern). The root is not a unit here: it runs first in forward and last in backward, so
    nothing precedes it to prefetch it. A depth of 0 gives empty lists: FSDP2's own behaviour
    (no forward prefetch; in backward the implicit prefetch of the previous unit, which an
    empty ``set_modules_to_backward_prefetch`` list keeps, torch 2.13 ``FSDPState._pre_backward``).
    Raises ``ValueError`` for a negative depth."""
    if forward_depth < 0 or backward_depth < 0:
        raise ValueError(f"prefetch depths must be >= 0, got {forward_depth}, {backward_depth}")
    forward = [list(range(k + 1, min(n_units, k + 1 + forward_depth))) for k in range(n_units)]
    backward = [list(range(k - 1, max(-1, k - 1 - backward_depth), -1)) for k in range(n_units)]
    return forward, backward


def prefetch_cut(n_units: int, depth: int) -> str | None:
    """The one-line warning when ``--fsdp2-prefetch depth`` asks for more units than a unit has
    after (forward) or before (backward) it: ``fsdp2_prefetch_units`` stops at the last / first
    of ``n_units``, so the depth used is ``n_units - 1``; None when the depth fits."""
    used = max(0, n_units - 1)
    if depth <= used:
        return None
    return (f"warning: --fsdp2-prefetch {depth}: the model has {n_units} FSDP2 unit(s), so a "
            f"unit prefetches at most {used}; used {used} (the manifest's fsdp2_prefetch)")


def prefetch_cut_of(depth: int | None, run_dir) -> str | None:
    """``prefetch_cut`` for a finished record of ``run_dir`` that asked ``--fsdp2-prefetch
    depth``, from its manifest's ``fsdp_units``: what a spawned record's launcher says (its
    ranks' stderr goes to their logs, not the terminal). None without the manifest or units."""
    import json
    from pathlib import Path

    if not depth:
        return None
    try:
        options = json.loads((Path(run_dir) / "manifest.json").read_text())["strategy_options"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    units = options.get("fsdp_units") if isinstance(options, dict) else None
    return prefetch_cut(len(units), depth) if isinstance(units, list) and units else None


def fsdp2_applied(model: nn.Module) -> dict:
    """What torch holds after ``apply_fsdp2`` (the manifest's ``strategy_options``, read back
    from each ``FSDPModule``'s state, torch 2.13 private fields ``_states_to_forward_prefetch``,
    ``_states_to_backward_prefetch`` and ``FSDPParamGroup.post_forward_mesh_info``):
    ``fsdp2_prefetch`` {"forward": the most units one unit prefetches in forward, "backward":
    in backward, or "implicit" when no unit has an explicit list}, ``reshard_after_forward``
    of the non-root units (True / False / the group size N it reshards to). Empty when the
    model has no FSDP2 unit below the root or the fields are not there (another torch)."""
    from torch.distributed.fsdp import FSDPModule

    states = [m._get_fsdp_state() for m in model.modules() if isinstance(m, FSDPModule)
              and m is not model]
    if not states:
        return {}
    try:
        fwd = max(len(st._states_to_forward_prefetch) for st in states)
        bwd = max(len(st._states_to_backward_prefetch) for st in states)
        reshard = set()
        for st in states:
            for group in st._fsdp_param_groups:
                post, own = group.post_forward_mesh_info, group.mesh_info
                reshard.add(False if post is None else True if post is own
                            else int(post.shard_mesh_size))
    except AttributeError:  # a torch without these fields: the options as asked stay
        return {}
    out = {"fsdp2_prefetch": {"forward": fwd, "backward": bwd or "implicit"}}
    if len(reshard) == 1:
        out["reshard_after_forward"] = reshard.pop()
    return out


def unwrap(model: nn.Module) -> nn.Module:
    """The module whose ``named_parameters`` give clean FQNs after ``clean_fqn``."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


@contextlib.contextmanager
def full_view(model: nn.Module, strategy: str, *, with_grads: bool):
    """Context in which ``compared_tensors`` can read parameters (and gradients).

    FSDP1: ``FSDP.summon_full_params(with_grads=...)`` - every rank sees the full tensors, so
    they are compared whole (replicated = 1): public, where the shard -> parameter mapping is
    private (``_shard_param_infos``, changed across torch versions); its all_gather runs at
    step 0 only, outside the profiler's active window. Other strategies: no-op.
    """
    if TABLE[strategy].wrapper != "fsdp1":
        yield
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    with FSDP.summon_full_params(model, writeback=False, with_grads=with_grads):
        yield


def compared_tensors(model: nn.Module, strategy: str, what: str, rank: int, world_size: int,
                     baseline: dict[str, torch.Tensor], prefix: str
                     ) -> Iterator[tuple[int, str, torch.Tensor, torch.Tensor, bool]]:
    """Yield (seq, fqn, local tensor, matching baseline tensor, replicated) per parameter.

    ``what`` is "grad" or "param"; ``prefix`` the baseline key prefix ("grad." / "param.").
    DDP / single / FSDP1 (inside ``full_view``): the whole tensor, replicated. FSDP2: the local
    Shard(0) of the DTensor (``to_local()``) against ``torch.chunk(ref, world_size, 0)[rank]``
    (an empty tensor where the chunk does not exist), replicated = False - no collective needed.
    hsdp / fsdp2_tp: the whole tensor (``DTensor.full_tensor()``, an all_gather over the mesh at
    step 0, outside the profiler's active window), replicated = True: a 2-D placement does not
    partition the ranks (HSDP's replicas hold a shard twice, fsdp2_tp's colwise weights are
    _StridedShard x Shard), and every rank checks the tensor its optimizer step used.
    """
    row = TABLE[strategy]
    whole = not row.is_flat and row.dim_of("stage") is None  # a 2-D mesh: hsdp, fsdp2_tp
    for seq, (name, p) in enumerate(unwrap(model).named_parameters()):
        fqn = clean_fqn(name)
        ref = baseline[prefix + fqn]
        t = p.grad if what == "grad" else p
        if t is None:
            raise RuntimeError(f"{fqn} has no gradient after backward")
        t = t.detach()
        if whole:  # a collective per tensor: on every rank, in the same order
            yield seq, fqn, t.full_tensor() if hasattr(t, "full_tensor") else t, ref, True
        elif row.wrapper == "fsdp2":
            local = t.to_local()
            chunks = torch.chunk(ref, world_size, dim=0)
            ref_local = chunks[rank] if rank < len(chunks) else ref[:0]
            yield seq, fqn, local, ref_local, False
        else:
            yield seq, fqn, t, ref, True


def device_mesh_2d(cfg: RecordConfig, device: torch.device):
    """``init_device_mesh(device.type, cfg.mesh_shape, mesh_dim_names=cfg.row.dims)``:
    hsdp (R, S) ("replicate", "shard"), fsdp2_tp (W / T, T) ("dp", "tp"); rank r sits at
    (r // B, r % B) (row-major), its groups described ``mesh_<name>`` in the trace's pg_config."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device.type, tuple(cfg.mesh_shape), mesh_dim_names=tuple(cfg.row.dims))


def apply_tp(model: nn.Module, cfg: RecordConfig, device: torch.device, spec: ModelSpec):
    """Tensor parallel of fsdp2_tp: ``parallelize_module(model, mesh["tp"], spec.tp_plan(model,
    mesh["tp"]))`` (the reference model: ``tracer.model.tp_plan``), ``--fault
    wrong-tp-placement`` applied to the plan (tracer/faults.py ``tp_plan``). FSDP2 then shards
    over ``mesh["dp"]`` (the caller: ``apply_fsdp2(..., mesh=mesh["dp"])``, after activation
    checkpointing, which would hide the plan's module names). The dimension names are the
    row's (``dim_of("tensor")``). Returns (mesh, {fqn: style name} of the applied plan). Raises
    ``ValueError`` when the spec has no ``tp_plan``."""
    from torch.distributed.tensor.parallel import parallelize_module

    if spec.tp_plan is None:
        raise ValueError(f"--model {cfg.model}: ModelSpec.tp_plan is None; {cfg.strategy} needs one")
    mesh = device_mesh_2d(cfg, device)
    tp_mesh = mesh[cfg.row.dim_of("tensor")]
    plan = faults.tp_plan(spec.tp_plan(model, tp_mesh), cfg.fault)
    parallelize_module(model, tp_mesh, plan)
    return mesh, {fqn: style_name(style) for fqn, style in plan.items()}


def style_name(style) -> str:
    """``schemas.Mesh.tp_plan`` value of a ParallelStyle: ColwiseParallel -> "colwise",
    RowwiseParallel -> "rowwise", any other its class name without "Parallel", lower case."""
    name = type(style).__name__
    return (name[:-len("Parallel")] if name.endswith("Parallel") else name).lower()


def tp_sharded_params(model: nn.Module, tp_dim: str = "tp") -> int:
    """Elements of the parameters sharded over the mesh dimension ``tp_dim``: DTensors whose
    placement on that dimension is a Shard (ColwiseParallel's weight and bias,
    RowwiseParallel's weight; not its Replicate bias, not the norm)."""
    total = 0
    for p in model.parameters():
        mesh = getattr(p, "device_mesh", None)
        names = getattr(mesh, "mesh_dim_names", None) or ()
        if tp_dim in names and p.placements[names.index(tp_dim)].is_shard():
            total += p.numel()
    return total


def tp_activation(out: torch.Tensor, ref: torch.Tensor, tp: int, tp_rank: int
                  ) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The part of a module's step-0 output that tensor-parallel rank ``tp_rank`` of ``tp``
    compares, and the baseline elements it must equal (``ref``: the dp rows of the baseline's
    output), so that the tp ranks of a dp group partition the output (no element counted twice):

    - ``out`` as large as ``ref`` (a replicated output: attn with output_layouts=Replicate(),
      RowwiseParallel, the norm, the blocks): chunk ``tp_rank`` of both over the last dim;
    - ``out`` the last-dim chunk of ``ref`` (ColwiseParallel's local output, its GELU): ``out``
      against chunk ``tp_rank`` of ``ref`` (Shard(0) of the weight = torch.chunk of the out
      features, so the local output is that chunk);
    - any other shape (an activation sharded otherwise, e.g. over the sequence): None, not
      compared (on every rank alike: shapes are the same on every rank).
    """
    if tuple(out.shape) == tuple(ref.shape):
        return torch.chunk(out, tp, dim=-1)[tp_rank], torch.chunk(ref, tp, dim=-1)[tp_rank]
    chunk = torch.chunk(ref, tp, dim=-1)
    if tp_rank < len(chunk) and tuple(out.shape) == tuple(chunk[tp_rank].shape):
        return out, chunk[tp_rank]
    return None


@dataclass(kw_only=True, slots=True)
class Built:
    """What a setup hook hands the training loop: the model as trained (wrapped; pp: this
    rank's stage module), the whole model's parameter count, ``unit_names`` (what FSDP wraps or,
    without FSDP, activation checkpointing: the manifest's ``fsdp_units`` where the options
    choose them), the manifest's 2-D ``mesh`` (None: flat) and pp's ``PipelineRank``."""

    model: nn.Module
    num_params: int
    units: list[str] = field(default_factory=list)
    mesh: Mesh | None = None
    pipe: PipelineRank | None = None
    applied: dict = field(default_factory=dict)
    """Options as torch applied them, read back from the wrapped model (``fsdp2_applied``):
    they replace the options as asked in the manifest's ``strategy_options``."""


Setup = Callable[[RecordConfig, ModelSpec, dict[str, torch.Tensor], int, int, torch.device], Built]
"""A setup hook: (cfg, spec, baseline tensors, rank, world size, device) -> ``Built``."""
SETUP: dict[str, Setup] = {}
"""Every strategy's setup hook, one per row of the table, keyed by the row's name
(``registers``; tests/tracer/test_setup_registry.py checks that they name the same strategies)."""


def registers(name: str) -> Callable[[Setup], Setup]:
    """Decorator: the hook applies strategy ``name`` (``SETUP[name]``; torchtitan's spec
    registry). Raises ``ValueError`` for a name registered twice."""
    def register(hook: Setup) -> Setup:
        if name in SETUP:
            raise ValueError(f"strategy {name}: a setup hook is already registered")
        SETUP[name] = hook
        return hook
    return register


def _placed(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
            device: torch.device, *, unsynced_now: bool = True) -> tuple[nn.Module, int, list[str]]:
    """``spec.model`` with the baseline's initial parameters (identical on every rank; buffers
    as the factory made them), ``--fault unsynced-init`` applied on ranks > 0 unless
    ``unsynced_now`` is False (a wrapper that broadcasts the weights: after it), moved to
    ``device``. Returns (model, num_params, ``unit_names``)."""
    model = spec.model
    load_parameters(model, base, "init.")
    num_params = sum(p.numel() for p in model.parameters())
    units = unit_names(model, spec)
    if unsynced_now and cfg.fault == "unsynced-init" and rank > 0:
        faults.perturb_init(model, cfg.seed, rank)
    model.to(device)
    return model, num_params, units


def _checkpointed(cfg: RecordConfig, model: nn.Module, units: list[str]) -> None:
    """``--activation-checkpointing`` of ``units`` (tracer/training.py), then ``--compile
    blocks`` of them (torchtitan's order: activation checkpointing, compile, FSDP;
    tracer/compiling.py); each a no-op without its option."""
    if cfg.activation_checkpointing:
        apply_checkpointing(model, units)
    if cfg.compile == "blocks":
        from tracer.compiling import compile_blocks

        compile_blocks(model, units)


def _compiled_whole(cfg: RecordConfig, model: nn.Module) -> nn.Module:
    """``--compile model``: the root compiled after the strategy wrapped it (tracer/compiling.py);
    ``model`` unchanged otherwise. Returns ``model``."""
    if cfg.compile == "model":
        from tracer.compiling import compile_model

        compile_model(model)
    return model


@registers("single")
def setup_single(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
                 world: int, device: torch.device) -> Built:
    """The reference: the model unwrapped (its checkpointed units only)."""
    model, num_params, units = _placed(cfg, spec, base, rank, device)
    _checkpointed(cfg, model, units)
    return Built(model=_compiled_whole(cfg, model), num_params=num_params, units=units)


@registers("ddp")
def setup_ddp(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
              world: int, device: torch.device) -> Built:
    """``apply_ddp``, units checkpointed before; unsynced-init after DDP's constructor broadcast
    (which would undo it)."""
    model, num_params, units = _placed(cfg, spec, base, rank, device, unsynced_now=False)
    _checkpointed(cfg, model, units)
    model = apply_ddp(model, cfg, device)
    if cfg.fault == "unsynced-init" and rank > 0:
        faults.perturb_init(model, cfg.seed, rank)
    return Built(model=_compiled_whole(cfg, model), num_params=num_params, units=units)


@registers("fsdp")
def setup_fsdp(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
               world: int, device: torch.device) -> Built:
    """``apply_fsdp`` (FSDP1), then checkpointing inside its units (FSDP's own order), and
    ``--compile blocks`` inside them too."""
    model, num_params, units = _placed(cfg, spec, base, rank, device)
    model = apply_fsdp(model, cfg, device, spec)
    _checkpointed(cfg, model, units)
    return Built(model=model, num_params=num_params, units=units)


@registers("fsdp2")
def setup_fsdp2(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
                world: int, device: torch.device) -> Built:
    """``apply_fsdp2`` over all ranks, units checkpointed before."""
    model, num_params, units = _placed(cfg, spec, base, rank, device)
    _checkpointed(cfg, model, units)
    model = apply_fsdp2(model, cfg, device, spec)
    return Built(model=_compiled_whole(cfg, model), num_params=num_params, units=units,
                 applied=fsdp2_applied(model))


@registers("hsdp")
def setup_hsdp(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
               world: int, device: torch.device) -> Built:
    """HSDP: ``apply_fsdp2`` on the 2-D mesh (replicate R x shard S, ``--mesh R,S``), units
    checkpointed before, unsynced-init before wrapping (nothing broadcasts the weights). The
    units' parameters are DTensors (Replicate(), Shard(0)); per unit and step FSDP2 all_gathers
    over the shard group, reduce_scatters the gradient over it and all_reduces the shard over
    the replicate group. ``--fault skip-replicate-sync``: the units are sharded on
    ``mesh["shard"]`` only (tracer/faults.py ``hsdp_mesh``)."""
    model, num_params, units = _placed(cfg, spec, base, rank, device)
    _checkpointed(cfg, model, units)
    model = apply_fsdp2(model, cfg, device, spec, mesh=faults.hsdp_mesh(device_mesh_2d(cfg, device), cfg.fault))
    mesh = Mesh(shape=list(cfg.mesh_shape), dim_names=list(cfg.row.dims))
    return Built(model=_compiled_whole(cfg, model), num_params=num_params, units=units, mesh=mesh,
                 applied=fsdp2_applied(model))


@registers("fsdp2_tp")
def setup_fsdp2_tp(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
                   world: int, device: torch.device) -> Built:
    """``apply_tp`` (its plan on the tensor dimension; unsynced-init before: TP's
    ``distribute_tensor`` broadcasts over each tp group only, leaving the dp groups apart),
    units checkpointed, then ``apply_fsdp2`` over the mesh's shard (dp) dimension."""
    model, num_params, units = _placed(cfg, spec, base, rank, device)
    mesh2d, plan = apply_tp(model, cfg, device, spec)
    sharded = tp_sharded_params(model, cfg.row.dim_of("tensor"))
    _checkpointed(cfg, model, units)
    applied = {}
    if cfg.async_tp:  # before fully_shard: the blocks compiled, inductor's TP pass on
        from tracer.gpuonly import apply_async_tp

        applied["async_tp"] = apply_async_tp(model, mesh2d[cfg.row.dim_of("tensor")], units)
    model = apply_fsdp2(model, cfg, device, spec, mesh=mesh2d[cfg.row.dim_of("shard")])
    mesh = Mesh(shape=list(cfg.mesh_shape), dim_names=list(cfg.row.dims), tp_plan=plan,
                tp_sharded_params=sharded)
    return Built(model=_compiled_whole(cfg, model), num_params=num_params, units=units, mesh=mesh,
                 applied={**fsdp2_applied(model), **applied})


@registers("pp")
def setup_pp(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
             world: int, device: torch.device) -> Built:
    """This rank's pipeline stage, FSDP2 over dp (tracer/pipeline.py ``build_pipeline``);
    ``--compile blocks``: the stage's own layers compiled in place (after FSDP2 here: the stage's
    module is built, sharded and handed to its ``PipelineStage`` in one function, and the stage
    calls it at each microbatch, so the compiled call is what runs); ``model``: the stage's root."""
    from tracer import pipeline

    pipe, num_params = pipeline.build_pipeline(cfg, spec, base, rank, world, device)
    if cfg.compile == "blocks":
        from tracer.compiling import compile_blocks

        compile_blocks(pipe.module, list(pipe.owned))
    _compiled_whole(cfg, pipe.module)
    return Built(model=pipe.module, num_params=num_params, mesh=pipe.mesh_section(cfg), pipe=pipe)
