"""``manifest.json``: built by global rank 0 after every rank wrote its files, written last."""

from __future__ import annotations

import json
import os
import platform
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import msgspec
import torch

from analyzer.contract.atomic import write_atomic
from analyzer.contract.schemas import (MANIFEST_NAME, SCHEMA_VERSION, Baseline, Batch, Device, Experiment,
                                       Launch, Machine, Manifest, Mesh, Model, Profiler, Training, Versions)
from analyzer.contract.tolerance import TOLERANCES, compile_tolerance, float8_tolerance, mixed_precision_tolerance
from tracer.config import RecordConfig
from tracer.data import data_manifest
from tracer.golden import golden_section
from tracer.profiling import activities
from tracer.training import optimizer_manifest
from tracer.specform import HF_SIZE_NAMES, SpecError, parse_spec
from tracer.rundir import file_entries, finish_record, holds_lock, unlock_run_dir


def versions() -> Versions:
    """python, torch, cuda, cudnn, nccl (None where absent), paritytrace."""
    cuda = torch.version.cuda
    nccl = None
    if cuda and torch.cuda.is_available():
        try:
            raw = torch.cuda.nccl.version()  # a tuple on recent torch, an int on older
            nccl = ".".join(str(v) for v in raw) if isinstance(raw, tuple) else str(raw)
        except (RuntimeError, AttributeError):
            nccl = None
    try:
        own = metadata.version("paritytrace")
    except metadata.PackageNotFoundError:
        own = None
    cudnn = torch.backends.cudnn.version() if cuda else None
    return Versions(python=platform.python_version(), torch=str(torch.__version__), cuda=cuda,
                    cudnn=cudnn, nccl=nccl, paritytrace=own)


def cpu_name() -> str:
    """The CPU model from /proc/cpuinfo, else platform.processor()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(device: torch.device) -> Device:
    """count = visible CUDA devices, or logical CPUs."""
    if device.type == "cuda":
        return Device(type="cuda", name=torch.cuda.get_device_name(device), count=torch.cuda.device_count())
    return Device(type="cpu", name=cpu_name(), count=os.cpu_count() or 1)


def machine_info(load_avg: list[float], ranks_on_host: int) -> Machine:
    """The machine section: ``load_avg`` (1, 5, 15 min, taken as the record started), CPUs,
    this process's torch intra-op threads (every rank sets the same), oversubscription."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = torch.get_num_threads()
    return Machine(load_avg=[round(v, 2) for v in load_avg], cpu_count=os.cpu_count() or 1,
                   usable_cpus=usable, threads_per_rank=threads, ranks_on_host=ranks_on_host,
                   oversubscribed=ranks_on_host * threads > usable)


def experiment_section(cfg: RecordConfig) -> Experiment | None:
    """The run's ``Experiment`` (None for a config never given an id: a library caller)."""
    if cfg.experiment_id is None:
        return None
    return Experiment(id=cfg.experiment_id, arm=cfg.arm, repeat=max(1, cfg.repeat_index),
                      repeats=cfg.repeat,
                      order=cfg.experiment_order.split(",") if cfg.experiment_order else [cfg.arm],
                      settings=None if cfg.arm_settings is None else json.loads(cfg.arm_settings),
                      baseline=cfg.baseline_id)


def build_manifest(*, cfg: RecordConfig, run_dir: Path, world_size: int, backend: str | None,
                   device: torch.device, launch: Launch, num_params: int,
                   fsdp_units: list[str], spec, model_name: str, buffers: list[str],
                   batch_x: torch.Tensor, machine: Machine | None = None,
                   mesh: Mesh | None = None, applied: dict | None = None, compiled=None,
                   warmup=None) -> Manifest:
    """The run's manifest; ``files`` lists every file already in ``run_dir``.

    ``strategy_options`` also carries ``fsdp_units`` (the wrapped module FQNs, additive) for
    fsdp / fsdp2; with a ModelSpec whose units are classes, ``fsdp_unit_classes`` (their names)
    replaces ``auto_wrap_min_num_params``. ``spec``: the run's ``tracer.ModelSpec``;
    ``model_name``: its model's class name (before wrapping); ``buffers``: its buffer FQNs; ``batch_x``: the global batch's inputs.
    ``mesh``: hsdp / fsdp2_tp's ``Mesh`` (shape, dim names, TP plan and its sharded elements),
    their ``strategy_options`` as fsdp2's (``fsdp_units`` included); ``applied``: options as
    torch applied them (tracer/strategies.py ``Built.applied``) over those asked; ``batch.per_rank_batch``
    is the rows of one data-parallel rank (batch / dp size: tp ranks share them).
    ``compiled``, ``warmup``: ``--compile``'s ``schemas.Compile`` and ``schemas.CompileWarmup``
    (tracer/compiling.py ``compile_section``, ``warmup_section``).
    """
    options = cfg.strategy_options()
    options.update(applied or {})  # what torch applied, read back (strategies.Built.applied)
    if "wrap_min_params" in cfg.row.options:  # a strategy whose FSDP units the options choose
        options["fsdp_units"] = fsdp_units
        if spec.wrap_min_params is None:
            options.pop("auto_wrap_min_num_params", None)
            options["fsdp_unit_classes"] = [c.__name__ for c in spec.units]
    reference = cfg.model == "reference"
    dims = list(batch_x.shape) + [0, 0]
    hidden, layers = model_sizes(cfg, spec.config)
    tol = (TOLERANCES[cfg.precision] if cfg.mixed_precision is None else
           mixed_precision_tolerance(list(cfg.mixed_precision_dtypes), world_size))
    if cfg.float8:  # float8 casts differ more than any reduction order (tolerance.py)
        tol = float8_tolerance()
    elif cfg.compile != "none" and cfg.mixed_precision is None:  # mixed precision's rule has the same form
        tol = compile_tolerance(cfg.precision, world_size, cfg.compile)
    return Manifest(
        schema_version=SCHEMA_VERSION, run_id=uuid.uuid4().hex, run_name=run_dir.name,
        created_utc=datetime.now(timezone.utc).isoformat(), strategy=cfg.strategy,
        strategy_options=options, fault=cfg.fault, precision=cfg.precision, world_size=world_size,
        backend=backend, device=device_info(device), launch=launch, versions=versions(),
        model=Model(name=model_name, hidden=hidden, layers=layers, num_params=num_params, spec=cfg.model,
                    buffers_not_compared=buffers, config=spec.config),
        batch=Batch(global_batch=cfg.batch, seq_len=cfg.seq if reference else dims[1],
                    per_rank_batch=cfg.batch // (world_size // (cfg.tp_degree * cfg.pp_degree)), hidden=hidden or dims[2]),
        seed=cfg.seed, steps=cfg.total_steps,
        profiler=Profiler(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                          activities=[a.name for a in activities(device.type)],
                          record_shapes=True, profile_memory=True),
        tolerance=tol,
        baseline=Baseline(
            kind="separate-process", file="baseline.safetensors",
            description=("one process, whole global batch, same seed, initial weights, data and "
                         f"precision policy ({precision_policy(cfg)}), one torch thread, "
                         f"optimizer {cfg.optimizer}"
                         f"{', activation checkpointing' if cfg.activation_checkpointing else ''}"
                         f"{'' if cfg.compile == 'none' else f', torch.compile {cfg.compile} as the ranks'}; "
                         "computed before the ranks start, outside their processes")),
        files=file_entries(run_dir), data=data_manifest(cfg, device.type),
        keep_tensors=cfg.keep_tensors, golden=golden_section(cfg, run_dir),
        training=Training(optimizer=optimizer_manifest(cfg),
                          mixed_precision=list(cfg.mixed_precision_dtypes) if cfg.mixed_precision else None,
                          activation_checkpointing=cfg.activation_checkpointing,
                          compile=compiled),
        experiment=experiment_section(cfg), machine=machine, mesh=mesh, compile_warmup=warmup)


def model_sizes(cfg: RecordConfig, config: dict | None) -> tuple[int, int]:
    """``(hidden, layers)`` of the run's model, for the manifest's ``model`` and ``batch``:
    ``--hidden`` / ``--layers`` for the reference model; for an ``hf:`` model, its built
    config's values (``config``: tracer/hf.py ``built_config``) under the family's keys
    (tracer/specform.py ``HF_SIZE_NAMES``: Llama ``hidden_size`` / ``num_hidden_layers``,
    GPT-2 ``n_embd`` / ``n_layer``); 0 where the spec gives no size (a custom model)."""
    if cfg.model == "reference":
        return cfg.hidden, cfg.layers
    try:
        form = parse_spec(cfg.model)
    except SpecError:
        return 0, 0
    if form.kind != "hf" or not config:
        return 0, 0
    return tuple(int(config.get(HF_SIZE_NAMES[name].get(form.where), 0) or 0)
                 for name in ("hidden", "layers"))


def precision_policy(cfg: RecordConfig) -> str:
    """One-line description of the precision policy."""
    if cfg.mixed_precision is not None:
        param, reduce, buffer = cfg.mixed_precision_dtypes
        return (f"mixed precision: {param} parameters in forward and backward, gradients reduced "
                f"in {reduce}, {buffer} buffers, fp32 master weights (FSDP MixedPrecision, emulated)")
    if cfg.precision == "bf16":
        return "torch.autocast bf16 forward and loss, fp32 master weights, gradients and reduction"
    return "fp32 throughout"


def write_manifest(run_dir: Path, manifest: Manifest) -> None:
    """Write ``manifest.json`` atomically, indented (read by people too). When this process
    holds the run dir's record lock (global rank 0 under torchrun) the record is over once the
    manifest is there: the record marker is removed (``rundir.finish_record``) and the lock
    released. Under the built-in launcher the launcher does both after every rank exited 0."""
    write_atomic(run_dir / MANIFEST_NAME, msgspec.json.format(msgspec.json.encode(manifest), indent=2))
    if holds_lock(run_dir):
        finish_record(run_dir)
        unlock_run_dir(run_dir)
