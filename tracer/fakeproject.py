"""``tracer project --fake-tensors``: a role of a projection with no real storage (issue 44).

A model too large for this device runs its role under torch's ``FakeTensorMode``
(torch/_subclasses/fake_tensor.py): every tensor has its shape, dtype, device and strides, and
an operator runs its meta kernel, which allocates nothing and computes nothing. torchtitan's
memory estimation (torchtitan/tools/estimation.py) and torch's own ``FSDPMemTracker``
(torch/distributed/_tools/fsdp2_mem_tracker.py) run FSDP2 the same way, on the fake process
group. What stays exact, because it depends on shapes only: every collective call with its
kind, process group, dtype and bytes (the process-group tag reads a tensor's dtype and elements,
tracer/pgtag.py ``tensor_note``), and the parameter / gradient / optimizer-state bytes per rank
(tracer/footprint.py counts storages' bytes; a fake storage has its size). Activations: the
record's own measure (tracer/footprint.py ``SavedActivations``: the distinct storages autograd
saves for backward at step 0, parameters excluded), which needs only sizes too.

What is not the job's: every op's duration in the trace (a meta kernel's on this CPU). So the
role runs under ``OpCost`` as well, a dispatch mode that counts each operator's FLOPs
(torch/utils/flop_counter.py ``flop_registry``, the formulas ``FlopCounterMode`` uses) and the
bytes of its tensor arguments and results in the profiled steps, and estimates its time on the
target device from two figures the user gives, as a roofline: max(FLOPs / peak FLOP/s, bytes /
memory bandwidth). The estimate goes to the manifest (``schemas.Projection.compute_estimate``),
per role and operator, with its inputs named as assumptions; the trace keeps the meta kernels'
durations and ``Projection.op_durations`` says so.

Numerics: none (a fake tensor has no values): the steps' losses are NaN, and parity reads "not
verified" as for every projection.
"""

from __future__ import annotations

import contextlib
import logging
import math
from dataclasses import dataclass

from tracer.config import RecordConfig

log = logging.getLogger(__name__)


@dataclass(kw_only=True, slots=True)
class FakeOptions:
    """The projection's fake-tensor options (``tracer project``)."""

    fake_tensors: bool | None = False
    """True: run the roles under FakeTensorMode; False: real tensors; None: decide
    (``decide_fake_tensors``)."""
    device_tflops: float | None = None
    """Assumed peak compute of the target device, 10^12 FLOP/s (for the estimate)."""
    device_mem_gbps: float | None = None
    """Assumed memory bandwidth of the target device, 10^9 bytes/s (for the estimate)."""

    def __post_init__(self) -> None:
        for name in ("device_tflops", "device_mem_gbps"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ValueError(f"--{name.replace('_', '-')} {v}: must be a positive number")
        if (self.device_tflops is None) != (self.device_mem_gbps is None):
            raise ValueError("--device-tflops and --device-mem-gbps: give both (the compute "
                             "estimate is a roofline of the two) or neither")
        if self.device_tflops is not None and self.fake_tensors is False:
            raise ValueError(f"--device-tflops {self.device_tflops:g}: the compute estimate is "
                             "for --fake-tensors (real tensors measure their ops); add "
                             "--fake-tensors or drop it")


# ---- before the roles: does the model fit? ----

def state_bytes(cfg: RecordConfig) -> tuple[int, int]:
    """(bytes of the whole model's parameters, bytes of parameters + gradients + optimizer
    state one rank holds at the projected sharding), from the model built under FakeTensorMode
    (no storage: its shapes and dtypes only). A rank's share: the parameters over the product
    of the mesh dimensions that split them (shard, tensor, stage:
    analyzer/contract/strategies.py roles; FSDP2's padding and uneven splits ignored, under a
    row per parameter); gradients as the parameters; AdamW's state twice them (exp_avg,
    exp_avg_sq), SGD's none (tracer/training.py ``build_optimizer``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tracer.specload import load_spec

    with FakeTensorMode(allow_non_fake_inputs=True):
        model = load_spec(cfg).model
        whole = sum(p.numel() * p.element_size() for p in model.parameters())
    row = cfg.row
    split = 1
    if row.shards_parameters(cfg.strategy_options()) or row.dim_of("tensor") or row.dim_of("stage"):
        for dim, size in zip(row.dims, cfg.mesh_shape):
            if row.roles.get(dim) in ("shard", "tensor", "stage"):
                split *= size
    per_rank = -(-whole // split)
    optimizer = 2 * per_rank if cfg.optimizer == "adamw" else 0
    return whole, 2 * per_rank + optimizer


def free_bytes(device_type: str) -> int:
    """Free memory of this device now: CPU ``MemAvailable`` (/proc/meminfo); CUDA the free
    bytes of device 0 (NVML where installed, else ``torch.cuda.mem_get_info``, which makes a
    CUDA context in this process)."""
    if device_type == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).free)
        except Exception:  # no NVML: torch's figure
            import torch

            return int(torch.cuda.mem_get_info(0)[0])
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable")


def decide_fake_tensors(cfg: RecordConfig, device_type: str, options: FakeOptions) -> bool:
    """``options.fake_tensors``, or when it is None: True when a role with real tensors would
    not fit this device's free memory, i.e. when the whole model's parameters (each role builds
    the model whole before the strategy shards it: tracer/strategies.py ``_placed``) plus one
    rank's parameters, gradients and optimizer state (``state_bytes``) exceed ``free_bytes``;
    then one log line says so. Activations are not counted: they are not known before the
    model runs."""
    if options.fake_tensors is not None:
        return options.fake_tensors
    try:
        whole, rank_state = state_bytes(cfg)
    except Exception as exc:  # a --model that does not build on fake tensors: real ones, as before
        log.info("could not size the model on fake tensors (%s: %s): real tensors",
                 type(exc).__name__, exc)
        return False
    free = free_bytes(device_type)
    if whole + rank_state <= free:
        return False
    log.warning("--fake-tensors on: the model's parameters (%.2f GiB, built whole before "
                "sharding) and one rank's parameters + gradients + optimizer state at %s over %d "
                "ranks (%.2f GiB) exceed %s free memory (%.2f GiB); no real tensors, "
                "numerics not verified", whole / 2**30, cfg.strategy, cfg.world_size,
                rank_state / 2**30, "cuda:0's" if device_type == "cuda" else "this machine's",
                free / 2**30)
    return True


def batch_only(cfg: RecordConfig) -> tuple[dict, dict[str, str]]:
    """What ``write_projection_inputs`` keeps with fake tensors: the real batch only (its
    ``make_batch``, the model built under FakeTensorMode: no storage), and a NaN loss per
    step; no ``init.*`` (the roles build fake parameters). (tensors, metadata) as
    ``projection_inputs``."""
    import json

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

    from tracer.baseline import baseline_key
    from tracer.specload import load_spec

    with FakeTensorMode(allow_non_fake_inputs=True):
        spec = load_spec(cfg)
        with unset_fake_temporarily():
            x, y = spec.make_batch(cfg.batch, cfg.seed)
            loss = torch.full((cfg.total_steps,), math.nan, dtype=torch.float64)
    meta = {"config": json.dumps(baseline_key(cfg, cfg.device), sort_keys=True),
            "activation_order": "[]"}
    return {"batch.x": x, "batch.y": y, "loss": loss}, meta


def check_fake_tensors(cfg: RecordConfig) -> None:
    """Refuse, with one line (``ValueError``), a strategy whose wrapper cannot run on fake
    tensors: DDP, whose C++ Reducer reads its gradient buckets' storage (measured, torch 2.13:
    "The tensor has a non-zero number of elements, but its data is not allocated yet").
    FSDP1 and FSDP2 (fsdp, fsdp2, hsdp) run, with calls, bytes and memory equal to real
    tensors' (tests/tracer/test_project.py)."""
    if cfg.row.wrapper == "ddp":
        raise ValueError(f"--strategy {cfg.strategy} --fake-tensors: DDP's reducer reads its "
                         "gradient buckets' data, which fake tensors do not have; project it "
                         "with real tensors (--real-tensors) at a size this device holds")


def shapes_only(on: bool | None):
    """A FakeTensorMode when ``on`` (building the model in the projection's own process for
    its settings: no storage), else a null context."""
    if not on:
        return contextlib.nullcontext()
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode(allow_non_fake_inputs=True)


# ---- in a role's process ----

def fake_inputs(cfg: RecordConfig) -> dict:
    """A role's inputs under an active FakeTensorMode (``tracer.projinputs.projection_inputs``'s
    keys): the batch (``spec.make_batch``'s shapes), the initial parameters (a model built
    for the purpose: shapes only; on the CPU, as a record's), a NaN loss per step (a real
    tensor: read with ``tolist``)."""
    import torch

    from tracer.specload import load_spec

    spec = load_spec(cfg)
    x, y = spec.make_batch(cfg.batch, cfg.seed)
    base = {"batch.x": x, "batch.y": y}
    for name, p in spec.model.named_parameters():
        base[f"init.{name}"] = p.detach()
    with torch._subclasses.fake_tensor.unset_fake_temporarily():
        base["loss"] = torch.full((cfg.total_steps,), math.nan, dtype=torch.float64)
    return base


def fake_step_outputs(rank: int, step_rows: list[dict], categories):
    """A fake-tensor role's steps rows and MEMORY_CATEGORIES_SCHEMA table (tracer/loop.py
    ``train``'s) without allocator figures: a fake storage is never allocated, so the CUDA
    allocator's and the profiler's peaks (near 0) are not the role's; they become None, and
    the ``peak`` category the sum of the four categories (tracer/footprint.py
    ``category_table``'s CPU rule, which the analyzer reads as a lower bound)."""
    from tracer.footprint import category_table

    rows = [{**r, "cuda_max_allocated_bytes": None, "cuda_max_reserved_bytes": None,
             "profiler_allocated_peak_bytes": None} for r in step_rows]
    held = {r["category"]: r["bytes"] for r in categories.to_pylist() if r["category"] != "peak"}
    return rows, category_table(rank, **held, cuda_peak=(None, None))


@contextlib.contextmanager
def fake_role(cfg: RecordConfig, on: bool):
    """Around a role (tracer/project.py ``run_role``): with ``on`` a FakeTensorMode
    (non-fake inputs allowed: a real NaN loss, the device mesh's rank tensor) and an
    ``OpCost`` inside it; yields the OpCost, or None without ``on``."""
    if not on:
        yield None
        return
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tracer.opcost import OpCost

    from tracer.livebytes import LiveBytes

    profiled = range(cfg.wait + cfg.warmup, cfg.profiled_until)
    cost = OpCost(profiled)
    cost.live = LiveBytes(cfg.device, profiled)
    with FakeTensorMode(allow_non_fake_inputs=True), cost, _real_device_mesh(), \
            cost.live.tracking_resize():
        yield cost


@contextlib.contextmanager
def _real_device_mesh():
    """``init_device_mesh`` with real tensors inside a FakeTensorMode: a DeviceMesh reads its
    rank map with ``tolist()`` (torch/distributed/device_mesh.py ``DeviceMesh.__init__``),
    which a fake tensor cannot answer. torchtitan makes its mesh before entering the mode
    (torchtitan/tools/estimation.py); the strategies' setup hooks make theirs inside it
    (tracer/strategies.py), so their ``init_device_mesh`` runs with the fake mode unset."""
    import functools

    import torch.distributed.device_mesh as dm
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    made = dm.init_device_mesh

    @functools.wraps(made)
    def init_device_mesh(*args, **kwargs):
        with unset_fake_temporarily():
            return made(*args, **kwargs)

    dm.init_device_mesh = init_device_mesh
    try:
        yield
    finally:
        dm.init_device_mesh = made


def fake_projection(fake: FakeOptions, estimates: list[dict], live_peaks: dict[int, int]) -> dict:
    """The ``schemas.Projection`` fields of the fake-tensor options (``fake_tensors``,
    ``op_durations``, the assumed device figures, the compute estimate's rows, each role's
    live-bytes peak: tracer/livebytes.py)."""
    from analyzer.contract.schemas import OpEstimate

    if not fake.fake_tensors:
        return {}
    return {"fake_tensors": True, "op_durations": "meta_kernels",
            "device_tflops": fake.device_tflops, "device_mem_gbps": fake.device_mem_gbps,
            "compute_estimate": [OpEstimate(**row) for row in estimates],
            "live_peak_bytes": {str(rank): peak for rank, peak in live_peaks.items()}}
