"""``--strategy pp``: pipeline parallel (torch.distributed.pipelining) with FSDP2 over dp.

Mesh: ``init_device_mesh(device.type, (dp, P), mesh_dim_names=("dp", "pp"))``, dp = W / P,
row-major (analyzer/contract/schemas.py ``Mesh``): global rank r is stage ``r % P`` of pipeline
(dp index) ``r // P``; a pipeline's stages are consecutive ranks (the ``mesh_pp`` group), the
ranks of one stage the ``mesh_dp`` group. CPU gloo and CUDA NCCL alike.

Split rule (reference model only; ``ModelSpec`` has no stage-split hook, so the config refuses
``--model`` other than reference for pp): stage s owns the contiguous layers
``[s*L // P, (s+1)*L // P)`` (``stage_layers``; every stage gets at least one since P <= L).
The stage module is the full ``SimpleTransformer`` with the other stages' layers replaced by
``nn.Identity`` (they hold no parameters), so an owned parameter keeps its full-model FQN
(``layers.1.attn.weight``) and the numerics rows line up with the baseline by name.

FSDP2 (dp > 1): ``fully_shard(layer, mesh=mesh["dp"])`` on each owned layer, then on the stage
module, with ``reshard_after_forward=False`` as torchtitan does under PP (its
``reshard_after_forward_policy="default"``: resharding would all_gather once more per
microbatch). ``PipelineStage`` drives FSDP2 itself (stage.py ``backward_maybe_with_nosync``:
no gradient sync until the last microbatch; ``perform_reduce_grad`` runs the post-backward
reduce-scatter once per step). dp = 1: no FSDP, plain parameters.

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
import itertools
import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import torch
import torch.distributed as dist
from torch import nn

from analyzer.contract.schemas import GOLDEN_METRICS, MEMORY_DIR, Mesh, trace_name
from tracer import faults, footprint
from tracer.config import RecordConfig
from tracer.data import Batches
from tracer.memory import dump_snapshot, start_history
from tracer.model import rank_rows
from tracer.modelspec import ModelSpec, load_parameters
from tracer.numerics import NumericsRows, clean_fqn, tensor_metrics
from tracer.pgtag import tag_collectives
from tracer.profiling import cuda_sync, make_profiler
from tracer.training import build_optimizer


def stage_layers(layers: int, stages: int, stage: int) -> range:
    """Layer indices stage ``stage`` owns: ``[s*L // P, (s+1)*L // P)`` (contiguous; every
    stage non-empty when ``stages <= layers``). Raises ``ValueError`` otherwise."""
    if not 0 < stages <= layers or not 0 <= stage < stages:
        raise ValueError(f"stage {stage} of {stages} over {layers} layers: need 1 <= P <= layers")
    return range(stage * layers // stages, (stage + 1) * layers // stages)


def stage_modules(layers: int, stages: int) -> list[list[str]]:
    """Per stage, the FQNs of the layers it owns (manifest ``mesh.pp_stages``)."""
    return [[f"layers.{i}" for i in stage_layers(layers, stages, s)] for s in range(stages)]


def owner_stage(fqn: str, stages_fqns: list[list[str]]) -> int | None:
    """The stage owning the module or parameter ``fqn`` (None: no stage's layer holds it)."""
    for s, owned in enumerate(stages_fqns):
        if any(fqn == m or fqn.startswith(m + ".") for m in owned):
            return s
    return None


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
    """Pipeline stage index (``rank % P``)."""
    stages: int
    """P."""
    dp_index: int
    """Pipeline index = dp coordinate (``rank // P``)."""
    dp: int
    """Pipelines (dp = W / P)."""
    module: nn.Module
    """The stage module (full structure, other stages' layers ``nn.Identity``), FSDP2-wrapped when dp > 1."""
    schedule: object
    """ScheduleGPipe or Schedule1F1B over this rank's ``PipelineStage``."""
    pp_group: dist.ProcessGroup
    """The ``mesh_pp`` group of this pipeline."""
    stages_fqns: list[list[str]]
    """``stage_modules`` (every stage's layer FQNs)."""
    param_fqns: list[str]
    """Full-model parameter FQNs in registration order (the numerics' seq)."""
    param_numels: dict[str, int]
    """Elements per full-model parameter."""

    @property
    def owned(self) -> list[str]:
        """This stage's layer FQNs."""
        return self.stages_fqns[self.stage]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    @property
    def last_rank(self) -> int:
        """Global rank of this pipeline's last stage (row-major mesh)."""
        return self.dp_index * self.stages + self.stages - 1

    def mesh_section(self, cfg: RecordConfig) -> Mesh:
        """The manifest's ``mesh``."""
        stage_params = [sum(n for f, n in self.param_numels.items()
                            if owner_stage(f, self.stages_fqns) == s) for s in range(self.stages)]
        return Mesh(shape=[self.dp, self.stages], dim_names=["dp", "pp"],
                    pp_schedule=cfg.resolved_pp_schedule, microbatches=cfg.pp_microbatches,
                    pp_stages=self.stages_fqns, stage_params=stage_params)


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
    """This rank's stage of ``spec.model`` (baseline initial weights, the unsynced-init fault
    applied before wrapping), FSDP2 over dp when dp > 1, its ``PipelineStage`` and schedule.
    Returns (pipeline rank, full-model parameter count)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    p = cfg.pp_degree
    dp = world // p
    model = spec.model
    load_parameters(model, base, "init.")
    named = list(model.named_parameters())
    num_params = sum(t.numel() for _, t in named)
    layers = len(model.layers)
    stages_fqns = stage_modules(layers, p)
    stage, dp_index = rank % p, rank // p
    mesh = init_device_mesh(device.type, (dp, p), mesh_dim_names=("dp", "pp"))
    owned = set(stage_layers(layers, p, stage))
    for i in range(layers):
        if i not in owned:
            model.layers[i] = nn.Identity()
    if cfg.fault == "unsynced-init" and rank > 0:
        faults.perturb_init(model, cfg.seed, rank)
    model.to(device)
    if dp > 1:
        for i in sorted(owned):
            fully_shard(model.layers[i], mesh=mesh["dp"], reshard_after_forward=False)
        fully_shard(model, mesh=mesh["dp"], reshard_after_forward=False)
    pp_group = mesh["pp"].get_group()
    pipe_stage = PipelineStage(model, stage, p, device, group=pp_group)
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[cfg.resolved_pp_schedule]
    loss = microbatch_loss(spec.loss, cfg.fault, cfg.pp_microbatches)
    schedule = schedule_cls(pipe_stage, cfg.pp_microbatches, loss_fn=loss, scale_grads=True)
    return PipelineRank(stage=stage, stages=p, dp_index=dp_index, dp=dp, module=model,
                        schedule=schedule, pp_group=pp_group, stages_fqns=stages_fqns,
                        param_fqns=[f for f, _ in named],
                        param_numels={f: t.numel() for f, t in named}), num_params


class MicrobatchActivations:
    """Forward hooks on the modules of this stage's layers: every output (detached), in call
    order; a module's last ``microbatches`` outputs concatenate to the pipeline's rows. (At its
    first step ``PipelineStage`` runs one more forward before the schedule, to infer the
    shapes it sends and receives (stage.py, dynamic metadata mode); that first call is not a
    microbatch and is dropped. Static shapes (``input_args``/``output_args``) would avoid it,
    but in torch 2.13 on gloo the first stage then received no output gradient.)"""

    def __init__(self, module: nn.Module, owned: list[str], microbatches: int):
        self.microbatches = microbatches
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self._handles = []
        for name, sub in module.named_modules():
            clean = clean_fqn(name)
            if owner_stage(clean, [owned]) is None:
                continue
            self._handles.append(sub.register_forward_hook(self._hook(clean)))

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            if isinstance(output, (tuple, list)) and output:
                output = output[0]
            if isinstance(output, torch.Tensor) and output.dim() > 0:
                self.outputs.setdefault(name, []).append(output.detach().clone())
        return hook

    def close(self) -> None:
        """Remove the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def joined(self, name: str) -> torch.Tensor | None:
        """The module's microbatch outputs concatenated along dim 0, None when it ran fewer
        than ``microbatches`` times."""
        outs = self.outputs.get(name, [])
        return torch.cat(outs[-self.microbatches:]) if len(outs) >= self.microbatches else None


def run_schedule(pipe: PipelineRank, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    """One schedule step: stage 0 feeds ``x``, the last stage ``y``; returns the last stage's
    microbatch losses (empty elsewhere)."""
    losses: list[torch.Tensor] = []
    if pipe.is_first:
        pipe.schedule.step(x)
    elif pipe.is_last:
        pipe.schedule.step(target=y, losses=losses)
    else:
        pipe.schedule.step()
    return losses


def train_pp(cfg: RecordConfig, pipe: PipelineRank, base: dict[str, torch.Tensor], order: list[str],
             rank: int, world: int, device: torch.device, hb,
             step_row: Callable) -> tuple[NumericsRows, list[dict], pa.Table | None, pa.Table]:
    """tracer/worker.py ``train`` for a pipeline rank (same profiler, step rows, memory
    categories, step-0 numerics outside wall_ns); returns the same four tables."""
    model = pipe.module
    opt = build_optimizer(cfg, model.parameters())
    rows = rank_rows(cfg.batch, pipe.dp, pipe.dp_index)
    batches = Batches(cfg, base["batch.x"], base["batch.y"], rank=pipe.dp_index, world_size=pipe.dp,
                      device=device)
    batches.start()
    numerics = NumericsRows(rank)
    step_rows: list[dict] = []
    losses: list[float] = []
    start_history(device.type)
    prof, export = make_profiler(cfg, device.type, cfg.run_dir / trace_name(rank))
    snapshot_table = None
    held: dict[str, int] = {}
    with prof, tag_collectives():  # each send / recv names its group and peer (tracer/pgtag.py)
        try:
            for step in range(cfg.total_steps):
                hb.beat("step", step)
                faults.maybe_inject(rank, step)
                numerics_ns = 0
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                cuda_sync(device)
                t0 = time.perf_counter_ns()
                x, y = batches.next()
                recorder = MicrobatchActivations(model, pipe.owned, cfg.pp_microbatches) if step == 0 else None
                saved = footprint.SavedActivations() if step == 0 else contextlib.nullcontext()
                with torch.profiler.record_function("pipeline"), saved:
                    mb_losses = run_schedule(pipe, x, y)
                if recorder is not None:
                    recorder.close()
                faults.after_backward(model, cfg.fault, world)
                if step == 0:
                    t_num = time.perf_counter_ns()
                    held["activations"] = saved.bytes
                    held["gradients"] = footprint.gradient_bytes(model)
                    record_activations(pipe, recorder, base, order, numerics, rows)
                    record_owned(pipe, base, numerics, "grad")
                    numerics_ns += time.perf_counter_ns() - t_num
                with torch.profiler.record_function("optimizer"):
                    opt.step()
                    if not faults.injected("keep-grads", rank, step):
                        opt.zero_grad(set_to_none=True)
                if step == 0:
                    t_num = time.perf_counter_ns()
                    held["parameters"] = footprint.parameter_bytes(model)
                    held["optimizer_state"] = footprint.optimizer_state_bytes(opt)
                    record_owned(pipe, base, numerics, "param")
                    numerics_ns += time.perf_counter_ns() - t_num
                cuda_sync(device)
                wall_ns = time.perf_counter_ns() - t0 - numerics_ns
                losses.append(sum(float(v.detach()) for v in mb_losses) / len(mb_losses)
                              if mb_losses else float("nan"))
                step_rows.append(step_row(cfg, rank, step, wall_ns, device))
                prof.step()
                if step == cfg.profiled_until - 1:
                    snapshot_table = dump_snapshot(
                        device.type, cfg.run_dir / MEMORY_DIR / f"rank{rank}.snapshot.pickle", rank)
        except BaseException:
            export.cancel()
            raise
        finally:
            batches.close()
    categories = footprint.finish_steps(export, step_rows, held, rank)
    for step, (value, ref) in enumerate(zip(pipeline_losses(pipe, losses, device),
                                            base["loss"].tolist())):
        numerics.add_loss(step, value, ref)
    return numerics, step_rows, snapshot_table, categories


def pipeline_losses(pipe: PipelineRank, losses: list[float], device: torch.device) -> list[float]:
    """The last stage's per-step losses, broadcast over this pipeline's ``mesh_pp`` group (one
    collective after the profiled loop)."""
    t = torch.tensor(losses, dtype=torch.float64, device=device)
    dist.broadcast(t, src=pipe.last_rank, group=pipe.pp_group)
    return t.cpu().tolist()


def record_activations(pipe: PipelineRank, recorder: MicrobatchActivations, base: dict[str, torch.Tensor],
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
        out = recorder.joined(name)
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
