"""The step loop of every strategy: profiler schedule, one ``ProfilerStep`` per step, step-0
numerics, step rows, the faults that act inside a step, the process-group tags. What differs
between strategies is a ``Step``; the loop asks the strategy table (analyzer/contract/
strategies.py) only whether collectives are tagged (the reference runs none).
"""

from __future__ import annotations

import contextlib
import resource
import time
from typing import Protocol

import pyarrow as pa
import torch
from torch import nn

from analyzer.contract import strategies
from analyzer.contract.schemas import MEMORY_DIR, trace_name
from tracer import faults, footprint
from tracer.compiling import CompileClock
from tracer.config import RecordConfig
from tracer.data import Batches
from tracer.memory import dump_snapshot, start_history
from tracer.numerics import ActivationRecorder, NumericsRows
from tracer.pgtag import tag_collectives
from tracer.profiling import cuda_sync, make_profiler
from tracer.training import build_optimizer


class Step(Protocol):
    """One strategy's part of a step (tracer/worker.py ``FlatStep``, tracer/pipeline.py
    ``PipelineStep``). ``model``: what the optimizer steps, the memory categories count and
    ``wrong-grad-scale`` divides. ``recorder()``: step 0's activation capture, hooked on return
    (the loop removes it after the backward). ``forward_backward``: forward and backward on the
    rank's rows, with the profiler's annotations and ``saved`` (step 0:
    ``footprint.SavedActivations``) around what holds the activations; returns the loss of each
    microbatch the rank computed (maybe none). ``compare``: step 0's rows vs the baseline,
    "grad" after the backward (activations, gradients), "param" after the optimizer step.
    ``losses``: every step's loss from the rank's ``values`` (NaN: it computed none); may run
    a collective (after the profiled loop)."""

    model: nn.Module

    def recorder(self) -> ActivationRecorder: ...

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor, step: int,
                         saved: contextlib.AbstractContextManager) -> list[torch.Tensor]: ...

    def compare(self, numerics: NumericsRows, kind: str, recorder: ActivationRecorder) -> None: ...

    def losses(self, values: list[float]) -> list[float]: ...


def dp_coords(cfg: RecordConfig, rank: int, world: int) -> tuple[int, int]:
    """(index, size) of this rank among the ranks that split the batch: on a (dp, X) mesh
    (row-major, ``schemas.Mesh``) rank // X of world // X, X = T (fsdp2_tp) or P (pp); else
    (hsdp, the flat strategies) the rank of the world."""
    x = cfg.tp_degree * cfg.pp_degree
    return rank // x, world // x


def train(cfg: RecordConfig, step: Step, base: dict[str, torch.Tensor], rank: int, world: int,
          device: torch.device, hb) -> tuple[NumericsRows, list[dict], pa.Table | None, pa.Table]:
    """Run every step under the profiler on this rank's rows of the fixed batch
    (``tracer.data.Batches``, ``--data``; the rows of its dp index, ``dp_coords``).

    While the steps run, every collective call of a distributed strategy is tagged with its
    process group (tracer/pgtag.py). Step 0's numerics and memory by category
    (tracer/footprint.py) are measured outside the profiler's active window and wall_ns. A
    step's loss: the mean of the rank's microbatches' (``Step.losses``), recorded after the
    loop. The trace is exported once, at the end of the active window; a failure cancels it.
    ``hb``: tracer/worker.py ``Heartbeat``. With ``--compile`` each step row also holds
    ``compile_ns``, the time torch compiled during that step (in ``wall_ns`` too: steps 0 and
    1, never profiled; ``compiling.warmup_section`` puts them in the manifest). Returns
    (numerics rows, steps rows, CUDA snapshot table or None, MEMORY_CATEGORIES_SCHEMA table).
    """
    opt = build_optimizer(cfg, step.model.parameters())
    dp_rank, dp_size = dp_coords(cfg, rank, world)
    batches = Batches(cfg, base["batch.x"], base["batch.y"], rank=dp_rank, world_size=dp_size,
                      device=device)
    batches.start()  # before the profiler: a multi-process loader forks its workers here
    numerics = NumericsRows(rank)
    step_rows: list[dict] = []
    values: list[float] = []
    start_history(device.type)
    prof, export = make_profiler(cfg, device.type, cfg.run_dir / trace_name(rank))
    snapshot_table = None
    held: dict[str, int] = {}
    tagged = contextlib.nullcontext() if strategies.spec(cfg.strategy).is_reference else tag_collectives()
    clock = CompileClock() if cfg.compile != "none" else None
    with prof, tagged:
        try:
            for i in range(cfg.total_steps):
                hb.beat("step", i)
                faults.maybe_inject(rank, i)
                numerics_ns = 0
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                cuda_sync(device)
                t0 = time.perf_counter_ns()
                x, y = batches.next()  # --data loader: the fetch is part of the step
                recorder = step.recorder() if i == 0 else contextlib.nullcontext()
                saved = footprint.SavedActivations() if i == 0 else contextlib.nullcontext()
                with recorder:  # a module's calls past those it keeps are not copied
                    losses = step.forward_backward(x, y, i, saved)
                faults.after_backward(step.model, cfg.fault, world)
                if i == 0:
                    t_num = time.perf_counter_ns()
                    held["activations"] = saved.bytes
                    held["gradients"] = footprint.gradient_bytes(step.model)
                    step.compare(numerics, "grad", recorder)
                    numerics_ns += time.perf_counter_ns() - t_num
                with torch.profiler.record_function("optimizer"):
                    opt.step()
                    if not faults.injected("keep-grads", rank, i):
                        opt.zero_grad(set_to_none=True)
                if i == 0:
                    t_num = time.perf_counter_ns()
                    held["parameters"] = footprint.parameter_bytes(step.model)
                    held["optimizer_state"] = footprint.optimizer_state_bytes(opt)
                    step.compare(numerics, "param", recorder)
                    numerics_ns += time.perf_counter_ns() - t_num
                cuda_sync(device)
                wall_ns = time.perf_counter_ns() - t0 - numerics_ns
                values.append(sum(float(v.detach()) for v in losses) / len(losses) if losses else float("nan"))
                step_rows.append(step_row(cfg, rank, i, wall_ns, device))
                if clock is not None:  # not a STEPS_SCHEMA column: the manifest's (compile_section)
                    step_rows[-1]["compile_ns"] = clock.lap()
                prof.step()
                if i == cfg.profiled_until - 1:
                    snapshot_table = dump_snapshot(
                        device.type, cfg.run_dir / MEMORY_DIR / f"rank{rank}.snapshot.pickle", rank)
        except BaseException:
            export.cancel()
            raise
        finally:
            batches.close()
    categories = footprint.finish_steps(export, step_rows, held, rank)
    for i, (value, ref) in enumerate(zip(step.losses(values), base["loss"].tolist())):
        numerics.add_loss(i, value, ref)
    return numerics, step_rows, snapshot_table, categories


def step_row(cfg: RecordConfig, rank: int, step: int, wall_ns: int, device: torch.device) -> dict:
    """One STEPS_SCHEMA row (profiler_allocated_peak_bytes filled in after the export)."""
    cuda = device.type == "cuda"
    return {
        "rank": rank, "step": step, "profiled": cfg.wait + cfg.warmup <= step < cfg.profiled_until,
        "wall_ns": wall_ns, "peak_rss_bytes": peak_rss_bytes(), "profiler_allocated_peak_bytes": None,
        "cuda_max_allocated_bytes": torch.cuda.max_memory_allocated(device) if cuda else None,
        "cuda_max_reserved_bytes": torch.cuda.max_memory_reserved(device) if cuda else None,
    }


def peak_rss_bytes() -> int:
    """High-water RSS of this process (ru_maxrss is KiB on Linux)."""
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
