"""``--strategy pp``: pipeline parallel (torch.distributed.pipelining) with FSDP2 over dp.

Mesh: ``init_device_mesh(device.type, (dp, P), mesh_dim_names=("dp", "pp"))``, dp = W / P,
row-major (analyzer/contract/schemas.py ``Mesh``): global rank r is stage ``r % P`` of pipeline
(dp index) ``r // P``; a pipeline's stages are consecutive ranks (the ``mesh_pp`` group), the
ranks of one stage the ``mesh_dp`` group. CPU gloo and CUDA NCCL alike.

Split rule: the model is cut into n = P x V stages (``--pp-virtual`` V stages per rank) by its
``ModelSpec.pp_split(model, n)`` (``split_stages``): per stage, the submodule FQNs it runs in
order; the reference model's is ``split_module_list("layers")``, stage s owning the contiguous
layers ``[s*L // n, (s+1)*L // n)`` (``stage_layers``; every stage gets one since n <= L).
Stages go to pp ranks by torch's placement (``stage_placement``: stage s on rank s % P, or a V
for zbv / dualpipev). A rank's module is the full model with the other ranks' stage modules
replaced by ``nn.Identity`` (they hold no parameters), so an owned parameter keeps its
full-model FQN (``layers.1.attn.weight``) and the numerics rows line up with the baseline by
name; each of its stages runs a ``StageChain`` of its modules (the reference model with one
stage per rank runs the whole structure, as before issue 45). ``mesh.pp_stages`` lists per pp
rank the modules of all its stages, ``mesh.pp_stage_ids`` their global indices.

Schedules (``SCHEDULES``): gpipe, 1f1b (one stage per rank), interleaved-1f1b, looped-bfs,
interleaved-zb (V >= 1 stages per rank, looped), zbv, dualpipev (V = 2, a V); torch's rules on
V and M are refused by tracer/config.py before anything runs. Whatever the schedule, each stage
sees every microbatch once forward and once backward (the zero-bubble ones split the backward
into input and weight parts, which sum into the same ``.grad``), so the gradient rule below
holds for all of them; the rank holding stage 0 feeds the inputs and the rank holding the last
stage (pp rank P - 1, or 0 for a V) the targets.

Precision: ``--precision bf16`` autocasts each stage's forward (``StageChain``) and each
microbatch's loss (``precise_loss``) and not the schedule's backward, as the baseline autocasts
its forward and loss and not its backward (tracer/model.py ``precision_context``).
``--activation-checkpointing`` wraps each of the rank's stage modules (tracer/training.py
``apply_checkpointing``) before FSDP2; ``ForwardRecorder`` keeps the forward calls only.

FSDP2 (dp > 1): ``fully_shard(layer, mesh=mesh["dp"])`` on each owned layer, then on the stage
module, with ``reshard_after_forward=False`` as torchtitan does under PP (its
``reshard_after_forward_policy="default"``: resharding would all_gather once more per
microbatch). ``PipelineStage`` drives FSDP2 itself (stage.py ``backward_maybe_with_nosync``:
no gradient sync until the last microbatch; ``perform_reduce_grad`` runs the post-backward
reduce-scatter once per step). dp = 1: no FSDP, plain parameters.

Shapes: every stage is given its input and output shapes (``stage_shapes``: one microbatch,
[B / (dp M), seq, h] fp32), so torch's warm-up vote finds them static and no stage runs a
shape-inference forward or exchanges shapes with ``send_object_list`` in its first step (a
record's profiled steps are unchanged by it; its step-0 activations no longer count that extra
forward). ``tracer project`` runs the same stages on the fake process group (``_stage_class``).

Data: pipeline d trains the rows ``rank_rows(B, dp, d)`` (tracer/model.py); the schedule splits
them into M contiguous microbatches of B / (dp M) rows (``TensorChunkSpec(0)``, torch.tensor_split
order). Stage 0 feeds the inputs, stage P-1 the targets; ``ModelSpec.loss`` (a mean) per
microbatch. Gradient scale: torch 2.13's schedules *sum* the microbatches' gradients (each
``backward_one_chunk`` accumulates into ``.grad``) and, with ``scale_grads=True`` (the default,
kept), divide them by M in ``perform_reduce_grad`` -> ``stage.scale_grads(M)`` after FSDP's
reduce-scatter (which averages over dp). Equal microbatches: (1/M) sum_m grad(mean over mb m) =
grad(mean over the pipeline's rows); averaged over the dp pipelines of equal rows = the
one-device gradient of the mean loss over the global batch. The summation order changes
(microbatch accumulation, then the dp reduction), which the fp32 tolerance covers (as for fsdp2).

Numerics at step 0 (rows for *every* baseline tensor on *every* rank, as the analyzer's
``unverified`` rule needs): an owned parameter's gradient / value is its local Shard(0) chunk
(dp > 1) against ``torch.chunk(ref, dp, 0)[dp_index]``, or the whole tensor (dp = 1); a tensor
of another stage is an empty shard (numel 0, zero sums). All rows are ``replicated = 0``: summed
over ranks, each tensor is covered exactly once. Activations: each module of an owned layer,
its outputs of the M microbatches concatenated in order (this pipeline's rows) against the
baseline's rows of that pipeline; other stages' modules: empty rows. seq = the baseline's
forward order. Loss: only the last stage computes it; its per-step value (mean of its
microbatch losses) is broadcast over the pipeline's ``mesh_pp`` group after the profiled loop
(never inside the profiler's window), so every rank writes its pipeline's loss and the
analyzer's mean over ranks is the global mean (equal rows per pipeline).

Memory by category (tracer/footprint.py) counts this rank's stage module only (other stages'
layers are ``nn.Identity``: no tensors): parameters, gradients and optimizer state are its
owned layers' FSDP2 local shards (dp > 1) or whole tensors (dp = 1), i.e. ``stage_params[s] /
dp`` elements each (tests/tracer/test_pipeline.py checks it). Activations: the storages saved
for backward during the whole schedule step (``SavedActivations`` around it), keyed by address:
under GPipe every microbatch's storages are alive at once and are all counted; under 1F1B a
storage freed after one microbatch's backward may be reused at the same address by a later
microbatch and then counts once, so the figure lies between the in-flight peak and the sum over
microbatches (not exact; the CUDA allocator's peak is the measured one on GPU).

Faults: ``skip-microbatch`` scales the last microbatch's loss by 0 (it runs, its gradient and
loss contribution are lost); ``wrong-grad-scale`` divides the gradients by W once more after the
schedule's step; ``unsynced-init`` perturbs ranks > 0 before wrapping (tracer/faults.py).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn

from analyzer.contract.schemas import GOLDEN_METRICS, Mesh
from tracer import faults
from tracer.config import RecordConfig
from tracer.model import precision_context, rank_rows
from tracer.modelspec import ModelSpec, load_parameters
from tracer.numerics import ActivationRecorder, NumericsRows, clean_fqn, tensor_metrics


SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS",
             "interleaved-zb": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
             "dualpipev": "ScheduleDualPipeV"}
"""``--pp-schedule`` -> its class in torch.distributed.pipelining.schedules (torch 2.13). The
first two take one ``PipelineStage`` (``PipelineScheduleSingle``), the others a list of this
rank's stages (``PipelineScheduleMulti``); all seven run on gloo / CPU."""


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """Layer indices stage ``stage`` owns: ``[s*L // P, (s+1)*L // P)`` (contiguous; every
    stage non-empty when ``stages <= layers``). Raises ``ValueError`` otherwise."""
    if not 0 < stages <= layers or not 0 <= stage < stages:
        raise ValueError(f"stage {stage} of {stages} over {layers} layers: need 1 <= P <= layers")
    return range(stage * layers // stages, (stage + 1) * layers // stages)


def stage_modules(layers: int, stages: int) -> list[list[str]]:
    """Per stage, the FQNs of the layers it owns (the reference model's split)."""
    return [[f"layers.{i}" for i in stage_layers(layers, stages, s)] for s in range(stages)]


def stage_placement(pp: int, virtual: int, schedule: str) -> list[list[int]]:
    """Per pp rank (its coordinate on the "pp" dimension), the global stage indices it runs,
    ascending, for P = ``pp`` ranks x V = ``virtual`` stages each: torch's own rule
    (_utils.py ``generate_stage_to_rank_mapping``): style "v" for zbv / dualpipev (rank r runs
    stages r and 2P - 1 - r; the schedules set it themselves), "loop" for the others (stage s
    on rank s % P)."""
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    from tracer.config import PP_V_SHAPE

    mapping = generate_stage_to_rank_mapping(pp, pp * virtual, style="v" if schedule in PP_V_SHAPE else "loop")
    return [sorted(s for s, r in mapping.items() if r == rank) for rank in range(pp)]


def owner_stage(fqn: str, stages_fqns: list[list[str]]) -> int | None:
    """The stage owning the module or parameter ``fqn`` (None: no stage's layer holds it)."""
    for s, owned in enumerate(stages_fqns):
        if any(fqn == m or fqn.startswith(m + ".") for m in owned):
            return s
    return None


def split_stages(spec: ModelSpec, stages: int) -> list[list[str]]:
    """``spec.pp_split(model, stages)`` checked: ``stages`` non-empty lists of submodule FQNs,
    every parameter under exactly one stage's modules. Raises ``ValueError`` (one line) when the
    spec has no hook, the hook raises, or the split breaks a rule (tracer/modelspec.py)."""
    model = spec.model
    if spec.pp_split is None:
        raise ValueError("the ModelSpec has no stage-split hook (pp_split is None)")
    try:
        split = spec.pp_split(model, stages)
    except Exception as exc:  # the user's hook: its failure is a bad spec, said in one line
        raise ValueError(f"pp_split(model, {stages}) raised {type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if not isinstance(split, list) or len(split) != stages or any(not s for s in split):
        raise ValueError(f"pp_split(model, {stages}) must return {stages} non-empty lists of module FQNs")
    owner: dict[int, int] = {}
    for k, fqns in enumerate(split):
        for fqn in fqns:
            try:
                module = model.get_submodule(fqn)
            except AttributeError:
                raise ValueError(f"pp_split stage {k}: {fqn!r} is not a submodule of the model") from None
            for p in module.parameters():
                if owner.setdefault(id(p), k) != k:
                    raise ValueError(f"pp_split: a parameter under {fqn!r} (stage {k}) is also in "
                                     f"stage {owner[id(p)]} (tied across stages)")
    for fqn, p in model.named_parameters():
        if id(p) not in owner:
            raise ValueError(f"pp_split: parameter {fqn} is under no stage's modules")
    return split


class StageChain(nn.Module):
    """One pipeline stage: its ``pp_split`` modules applied in order (the model's own modules,
    shared with the rank's module, so their parameters keep their full-model FQNs there),
    under ``context()`` (``--precision bf16``: autocast around this forward only, as the
    baseline's around its forward; the schedule's backward runs outside it, as the baseline's)."""

    def __init__(self, parts: list[nn.Module], context: Callable = contextlib.nullcontext):
        super().__init__()
        self.parts = nn.ModuleList(parts)
        self.context = context

    def forward(self, x):
        with self.context():
            for part in self.parts:
                x = part(x)
        return x


def chain_shapes(model: nn.Module, split: list[list[str]], x: torch.Tensor,
                 context: Callable = contextlib.nullcontext) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per stage, (input, output) meta tensors of one microbatch ``x`` run through the chain
    (no grad, under ``context()``: the stages' precision): shape and dtype as the stage sees
    them, the input requiring grad on every stage but the first and when floating
    (``stage_shapes`` says why), the output when floating. Raises ``ValueError`` when a
    stage's output is not one tensor."""
    out, h = [], x
    with torch.no_grad(), context():
        for k, fqns in enumerate(split):
            inp = h
            for fqn in fqns:
                h = model.get_submodule(fqn)(h)
            if not isinstance(h, torch.Tensor):
                raise ValueError(f"pp_split stage {k} returns {type(h).__name__}, not one tensor")
            out.append((_meta(inp, k > 0), _meta(h, True)))
    return out


def _meta(t: torch.Tensor, grad: bool) -> torch.Tensor:
    m = torch.empty(t.shape, dtype=t.dtype, device="meta")
    return m.requires_grad_(grad and t.is_floating_point())


def check_split(spec: ModelSpec, stages: int, x: torch.Tensor) -> None:
    """Before any worker starts (tracer/specload.py ``check_spec``): the split follows the rules
    (``split_stages``) and its chain on ``x`` gives ``model(x)`` (allclose, torch's default
    tolerances: the same modules in the same order). Raises ``ValueError`` (one line)."""
    split = split_stages(spec, stages)
    h = x
    with torch.no_grad():
        for fqns in split:
            for fqn in fqns:
                h = spec.model.get_submodule(fqn)(h)
        whole = spec.model(x)
    if not isinstance(h, torch.Tensor) or not isinstance(whole, torch.Tensor) \
            or h.shape != whole.shape or not torch.allclose(h.float(), whole.float()):
        raise ValueError(f"the chain of the {stages} stages' modules does not give model(inputs): "
                         "the forward is not a chain along pp_split")


def check_world(cfg: RecordConfig, world: int) -> None:
    """The real world size (torchrun's WORLD_SIZE may differ from ``--nproc``) fits ``--pp``
    and ``--microbatches``. Raises ``ValueError`` with one line."""
    p, m = cfg.pp_degree, cfg.pp_microbatches
    if world % p or world < p:
        raise ValueError(f"--pp {p}: must divide the world size {world}")
    dp = world // p
    if cfg.batch % dp or (cfg.batch // dp) % m:
        raise ValueError(f"--microbatches {m}: must divide the batch of each pipeline "
                         f"(--batch {cfg.batch} / dp {dp})")


@dataclass(kw_only=True, slots=True)
class PipelineRank:
    """This rank's place in the pipeline and what it runs."""

    stage: int
    """This rank's pp coordinate (``rank % P``); the stages it runs are ``stage_ids``."""
    stages: int
    """P (pp ranks of a pipeline)."""
    dp_index: int
    """Pipeline index = dp coordinate (``rank // P``)."""
    dp: int
    """Pipelines (dp = W / P)."""
    module: nn.Module
    """The stage module (full structure, other stages' layers ``nn.Identity``), FSDP2-wrapped when dp > 1."""
    schedule: object
    """The torch schedule (``SCHEDULES``) over this rank's ``PipelineStage``(s)."""
    pp_group: dist.ProcessGroup
    """The ``mesh_pp`` group of this pipeline."""
    stages_fqns: list[list[str]]
    """``stage_modules`` (every stage's layer FQNs)."""
    param_fqns: list[str]
    """Full-model parameter FQNs in registration order (the numerics' seq)."""
    param_numels: dict[str, int]
    """Elements per full-model parameter."""
    placement: list[list[int]]
    """``stage_placement``: per pp rank, the global stage indices it runs (P x V stages)."""

    @property
    def stage_ids(self) -> list[int]:
        """The global stage indices this rank runs."""
        return self.placement[self.stage]

    @property
    def total_stages(self) -> int:
        """P x V."""
        return sum(len(ids) for ids in self.placement)

    @property
    def owned(self) -> list[str]:
        """This stage's layer FQNs."""
        return self.stages_fqns[self.stage]

    @property
    def is_first(self) -> bool:
        """Runs stage 0 (feeds the inputs)."""
        return 0 in self.stage_ids

    @property
    def is_last(self) -> bool:
        """Runs the last stage (computes the loss)."""
        return self.total_stages - 1 in self.stage_ids

    @property
    def last_rank(self) -> int:
        """Global rank running this pipeline's last stage (row-major mesh): pp rank P - 1
        under the looped placement, 0 under the V one."""
        coord = next(r for r, ids in enumerate(self.placement) if self.total_stages - 1 in ids)
        return self.dp_index * self.stages + coord

    def mesh_section(self, cfg: RecordConfig) -> Mesh:
        """The manifest's ``mesh``."""
        stage_params = [sum(n for f, n in self.param_numels.items()
                            if owner_stage(f, self.stages_fqns) == s) for s in range(self.stages)]
        return Mesh(shape=[self.dp, self.stages], dim_names=list(cfg.row.dims),
                    pp_schedule=cfg.resolved_pp_schedule,
                    microbatches=self.schedule._n_microbatches,  # what torch split the batch into
                    pp_stages=self.stages_fqns, stage_params=stage_params,
                    pp_schedule_class=type(self.schedule).__name__, pp_stage_ids=self.placement)


def stage_shapes(cfg: RecordConfig, dp: int, stage: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, output) example tensors of stage ``stage`` (meta device: shapes only) for
    ``PipelineStage(input_args=, output_args=)``: one microbatch of a pipeline's rows,
    [B / (dp M), seq, h] fp32 in and out (every layer maps [rows, seq, h] to itself; under bf16
    autocast too, its output being a residual sum with the fp32 input). The input requires grad on every stage but
    the first (its gradient is what the stage sends back; torch derives the gradients' shapes
    from these flags, _utils.py ``_derive_grad_metas``: a stage whose input did not require grad
    would send none and its predecessor would wait for one).

    Given both, each stage votes STATIC and torch skips the shape exchange of its first step
    (stage.py ``_warmup_forward_vote``, ``InferenceMode.needs_dynamic``: no extra forward, no
    ``send_object_list`` / ``recv_object_list``, which a fake process group cannot carry)."""
    rows = cfg.batch // dp // cfg.pp_microbatches
    shape = (rows, cfg.seq, cfg.hidden)
    # the meta device: torch keeps only shape, stride, dtype and requires_grad (_TensorMeta)
    x = torch.empty(shape, dtype=torch.float32, device="meta").requires_grad_(stage > 0)
    return x, torch.empty(shape, dtype=torch.float32, device="meta").requires_grad_(True)


def _stage_class():
    """``PipelineStage`` whose warm-up vote, on torch's fake process group, comes out STATIC.

    torch 2.13 (stage.py ``_warmup_forward_vote`` / ``_warmup_backward_result``, schedules.py
    ``_warmup_p2p``) multiplies every stage's vote (1 = static shapes given) along the pipeline
    with ``dist.send`` / ``dist.recv`` of an int32 and sends the product back. A fake group's
    recv moves no data (the buffer keeps its zeros), so every rank would read DYNAMIC and then
    fail in ``recv_object_list``. Every stage here is given its static shapes
    (``stage_shapes``), so the product a real group carries is 1: the vote's sends and recvs
    are still issued (the record's calls), and on a fake group the result is taken as that 1.
    On any other group the received result stands."""
    from torch.distributed.pipelining import PipelineStage

    class StaticShapeStage(PipelineStage):
        def _warmup_backward_result(self, received_result=None):
            got = super()._warmup_backward_result(received_result)
            if dist.get_backend(self.group) == dist.Backend.FAKE:
                return torch.ones_like(got)
            return got

    return StaticShapeStage


def precise_loss(loss: Callable, context: Callable) -> Callable:
    """``loss`` under ``context()`` (the baseline computes its loss under autocast too,
    tracer/baseline.py); ``loss`` itself when the context is fp32's."""
    def under(out, target):
        with context():
            return loss(out, target)
    return under


def microbatch_loss(loss: Callable, fault: str | None, microbatches: int) -> Callable:
    """``loss`` per microbatch; with ``skip-microbatch`` the last microbatch of every step
    (call M-1, 2M-1, ... on the last stage) is scaled by 0: it runs, but its loss and its
    gradient contribution are lost."""
    if fault != "skip-microbatch":
        return loss
    calls = itertools.count()

    def lossy(out, target):
        value = loss(out, target)
        return value * 0.0 if next(calls) % microbatches == microbatches - 1 else value
    return lossy


def build_pipeline(cfg: RecordConfig, spec: ModelSpec, base: dict[str, torch.Tensor], rank: int,
                   world: int, device: torch.device) -> tuple[PipelineRank, int]:
    """This rank's stages of ``spec.model`` (baseline initial weights, the unsynced-init fault
    applied before wrapping), FSDP2 over dp when dp > 1, its ``PipelineStage``(s) and schedule.
    Returns (pipeline rank, full-model parameter count). Raises ``ValueError`` for a split
    that breaks ``ModelSpec.pp_split``'s rules (``split_stages``)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import schedules as torch_schedules

    p, schedule_name = cfg.pp_degree, cfg.resolved_pp_schedule
    n = p * cfg.pp_virtual_stages
    dp = world // p
    model = spec.model
    load_parameters(model, base, "init.")
    named = list(model.named_parameters())
    num_params = sum(t.numel() for _, t in named)
    split = split_stages(spec, n)
    placement = stage_placement(p, cfg.pp_virtual_stages, schedule_name)
    stages_fqns = [[f for i in ids for f in split[i]] for ids in placement]
    stage, dp_index = rank % p, rank // p
    mine = placement[stage]
    reference = cfg.model == "reference"
    context = functools.partial(precision_context, cfg.precision, device.type)
    if reference:  # every layer maps [rows, seq, h] fp32 to itself (under autocast too: fp32 sums)
        shapes = {i: stage_shapes(cfg, dp, i) for i in mine}
    else:  # one microbatch of the batch through the chain, before other stages' modules go
        x, _ = spec.make_batch(cfg.batch, cfg.seed)
        every = chain_shapes(model, split, x[:cfg.batch // dp // cfg.pp_microbatches], context)
        shapes = {i: every[i] for i in mine}
    mesh = init_device_mesh(device.type, (dp, p), mesh_dim_names=cfg.row.dims)  # ("dp", "pp")
    owned = set(stages_fqns[stage])
    for fqn in (f for fqns in stages_fqns for f in fqns if f not in owned):
        model.set_submodule(fqn, nn.Identity())  # no parameters: this rank holds its stages only
    if cfg.fault == "unsynced-init" and rank > 0:
        faults.perturb_init(model, cfg.seed, rank)
    model.to(device)
    if cfg.activation_checkpointing:  # each stage module, before FSDP2 (as torchtitan orders them)
        from tracer.training import apply_checkpointing

        apply_checkpointing(model, stages_fqns[stage])
    # one fp32 stage of the reference model: the whole structure runs (the records before issue
    # 45); else chains, which put autocast around each stage's forward only
    chunks = [model] if reference and len(mine) == 1 and cfg.precision == "fp32" and \
        not cfg.activation_checkpointing else [
        StageChain([model.get_submodule(f) for f in split[i]], context) for i in mine]
    if dp > 1:
        for fqn in stages_fqns[stage]:
            fully_shard(model.get_submodule(fqn), mesh=mesh["dp"], reshard_after_forward=False)
        for chunk in chunks:  # each stage is an FSDP root, as torchtitan shards its model chunks
            fully_shard(chunk, mesh=mesh["dp"], reshard_after_forward=False)
    pp_group = mesh["pp"].get_group()
    stage_cls = _stage_class()
    pipe_stages = [stage_cls(chunk, i, n, device, input_args=shapes[i][0], output_args=shapes[i][1],
                             group=pp_group) for chunk, i in zip(chunks, mine)]
    schedule_cls = getattr(torch_schedules, SCHEDULES[schedule_name])
    loss = microbatch_loss(precise_loss(spec.loss, context), cfg.fault, cfg.pp_microbatches)
    single = issubclass(schedule_cls, torch_schedules.PipelineScheduleSingle)
    schedule = schedule_cls(pipe_stages[0] if single else pipe_stages, cfg.pp_microbatches,
                            loss_fn=loss, scale_grads=True)
    return PipelineRank(stage=stage, stages=p, dp_index=dp_index, dp=dp, module=model,
                        schedule=schedule, pp_group=pp_group, stages_fqns=stages_fqns,
                        param_fqns=[f for f, _ in named],
                        param_numels={f: t.numel() for f, t in named}, placement=placement), num_params


class ForwardRecorder(ActivationRecorder):
    """``ActivationRecorder`` that skips the calls made inside autograd's backward: under
    ``--activation-checkpointing`` a checkpointed module's forward runs again there (the
    non-reentrant recomputation, interleaved with the schedule's next forwards), and only the
    M forward calls are the microbatches' activations. torch's ``_current_graph_task_id()`` is
    -1 outside a backward pass (torch/csrc/autograd/python_engine.cpp)."""

    def _hook(self, name: str):
        keep = super()._hook(name)

        def hook(module, inputs, output):
            if torch._C._current_graph_task_id() == -1:
                keep(module, inputs, output)
        return hook


class PipelineStep:
    """tracer/loop.py ``Step`` of a pipeline rank: one schedule step ("pipeline"), whose
    saved tensors all count (module docstring, memory). Step-0 rows for every baseline tensor
    (module docstring, numerics; activations' seq: the baseline's ``order``); the loss: its
    pipeline's, from the last stage."""

    def __init__(self, cfg: RecordConfig, pipe: PipelineRank, base: dict[str, torch.Tensor], order: list[str],
                 device: torch.device):
        self.pipe, self.model, self.base, self.order, self.device = pipe, pipe.module, base, order, device
        self.microbatches = cfg.pp_microbatches
        self.rows = rank_rows(cfg.batch, pipe.dp, pipe.dp_index)  # this pipeline's rows
        # only a checkpointed stage recomputes forwards inside backward; the check that skips
        # them cannot be traced by dynamo (--compile, which --activation-checkpointing refuses)
        self.recorder_cls = ForwardRecorder if cfg.activation_checkpointing else ActivationRecorder

    def recorder(self) -> ActivationRecorder:
        """This stage's layers; the last M calls, the schedule's M microbatches (given its
        static shapes, ``stage_shapes``, the stage runs no shape-inference forward before
        them)."""
        return self.recorder_cls(self.pipe.module, calls=slice(-self.microbatches, None),
                                 within=self.pipe.owned)

    def forward_backward(self, x, y, step, saved) -> list[torch.Tensor]:
        """Stage 0 feeds ``x``, the last stage ``y``; the last stage's microbatch losses."""
        pipe, losses = self.pipe, []
        args = (x,) if pipe.is_first else ()
        kwargs = {"target": y, "losses": losses} if pipe.is_last else {}
        with torch.profiler.record_function("pipeline"), saved:
            pipe.schedule.step(*args, **kwargs)  # a V schedule's rank 0 runs the first and last
        return losses

    def compare(self, numerics: NumericsRows, kind: str, recorder: ActivationRecorder) -> None:
        if kind == "grad":
            record_activations(self.pipe, recorder, self.base, self.order, numerics, self.rows)
        record_owned(self.pipe, self.base, numerics, kind)

    def losses(self, values: list[float]) -> list[float]:
        """The last stage's, broadcast over this pipeline's ``mesh_pp`` group."""
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.broadcast(t, src=self.pipe.last_rank, group=self.pipe.pp_group)
        return t.cpu().tolist()


def record_activations(pipe: PipelineRank, recorder: ActivationRecorder, base: dict[str, torch.Tensor],
                       order: list[str], numerics: NumericsRows, rows: slice) -> None:
    """Step-0 activation rows for every module of the baseline's ``order``: owned modules'
    microbatch outputs joined vs the baseline's rows of this pipeline; others empty."""
    for seq, name in enumerate(order):
        ref_all = base.get(f"act.{name}")
        if ref_all is None:
            continue
        ref = ref_all[rows]
        if owner_stage(name, [pipe.owned]) is None:
            empty = ref[:0]
            numerics.add_tensor(0, "activation", name, seq, tensor_metrics(empty, empty, replicated=False))
            continue
        out = recorder.output(name)
        if out is None:
            raise RuntimeError(f"stage {pipe.stage} owns {name} but it produced no output at step 0")
        numerics.add_tensor(0, "activation", name, seq, tensor_metrics(out, ref, replicated=False))


def record_owned(pipe: PipelineRank, base: dict[str, torch.Tensor], numerics: NumericsRows,
                 kind: str) -> None:
    """Step-0 ``kind`` rows ("grad" / "param") for every full-model parameter, vs the baseline
    and, with ``--golden``, the golden run (GOLDEN_METRICS): an owned one's local chunk, another
    stage's an empty shard; all ``replicated = 0``."""
    local = {clean_fqn(n): p for n, p in pipe.module.named_parameters()}
    golden = any(k.startswith(f"golden.{kind}.") for k in base)
    for seq, fqn in enumerate(pipe.param_fqns):
        for prefix in (f"{kind}.", f"golden.{kind}.") if golden else (f"{kind}.",):
            ref = base[prefix + fqn]
            p = local.get(fqn)
            if p is None:
                x, ref = ref[:0], ref[:0]
            else:
                t = p.grad if kind == "grad" else p
                if t is None:
                    raise RuntimeError(f"{fqn} has no gradient after the pipeline's backward")
                x = t.detach()
                if hasattr(x, "to_local"):  # FSDP2 Shard(0) over dp: torch.chunk semantics
                    x = x.to_local()
                    chunks = torch.chunk(ref, pipe.dp, dim=0)
                    ref = chunks[pipe.dp_index] if pipe.dp_index < len(chunks) else ref[:0]
            m = tensor_metrics(x, ref, replicated=False)
            if prefix == f"{kind}.":
                numerics.add_tensor(0, kind, fqn, seq, m)
            else:
                for metric in GOLDEN_METRICS:
                    numerics.add(0, kind, fqn, seq, metric, m[metric[len("golden_"):]])
