"""``tracer record`` as a library call: expand ``all``, prepare run dirs and the baseline, launch.

``record_local`` is the path without torchrun (this process is the launcher, not a rank);
``worker.worker_main`` is the path of every rank (spawned by ``record_local`` or by torchrun).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from analyzer.schemas import STRATEGIES
from tracer.config import RecordConfig

log = logging.getLogger(__name__)


def expand(strategy: str, name: str | None, **options: Any) -> list[RecordConfig]:
    """Configs for ``strategy`` (``all`` -> single, ddp, fsdp, fsdp2; with ``name`` the run dirs
    are ``<name>-<strategy>``). A fault applies to the distributed strategies only.

    Raises ``ValueError`` naming the bad option.
    """
    if strategy != "all":
        return [RecordConfig(strategy=strategy, name=name, **options)]
    configs = []
    for s in STRATEGIES:
        opts = dict(options)
        if s == "single":
            opts["fault"] = None
        configs.append(RecordConfig(strategy=s, name=f"{name}-{s}" if name else None, **opts))
    return configs


def resolve_device_type(device: str) -> str:
    """``auto`` -> cuda when available, else cpu; ``cuda`` without a GPU raises ``ValueError``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    return device


def check_gpus(configs: list[RecordConfig], gpu_count: int) -> None:
    """Before anything is written: every config's ranks fit this machine's GPUs (one process
    per GPU with NCCL; ``devices.check_ranks_fit``). ``configs`` carry a resolved device.
    Raises ``ValueError`` with one line (the CLI exits 2)."""
    from tracer import devices

    for cfg in configs:
        backend = devices.resolve_backend(cfg.backend, cfg.device)
        devices.check_ranks_fit(local_world_size=cfg.world_size, backend=backend,
                                device_type=cfg.device, gpu_count=gpu_count)


def _place(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (copy across filesystems)."""
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def record_local(configs: list[RecordConfig]) -> list[Path]:
    """Record each config with spawned workers; return the run directories.

    Clears every run dir first (manifest first), computes the baseline once (all configs share
    its settings) and places it in each run dir, then runs the strategies one after another.
    Raises ``launch.RecordFailed`` on the first failed record, ``KeyboardInterrupt`` on Ctrl-C
    (workers killed either way), ``ValueError`` for an unusable device or output folder.
    """
    from dataclasses import replace

    from tracer.baseline import BASELINE_FILES, BASELINE_NAME, write_baseline, write_baseline_isolated
    from tracer.launch import run_workers
    from tracer.rundir import clear_run_dir

    device_type = resolve_device_type(configs[0].device)
    configs = [replace(c, device=device_type) for c in configs]
    if device_type == "cuda":
        import torch

        check_gpus(configs, torch.cuda.device_count())
    for cfg in configs:
        try:
            clear_run_dir(cfg.run_dir)
        except OSError as exc:
            raise ValueError(f"{cfg.run_dir}: cannot prepare the run directory "
                             f"({exc.strerror or exc}); choose a writable --out") from None
    first = configs[0].run_dir / BASELINE_NAME
    if device_type == "cuda":  # keep the launcher free of a CUDA context while ranks run
        write_baseline_isolated(configs[0], device_type, first)
    else:
        write_baseline(configs[0], device_type, first)
    for cfg in configs[1:]:
        for name in BASELINE_FILES:
            if (first.parent / name).exists():
                _place(first.parent / name, cfg.run_dir / name)
    done = []
    for cfg in configs:
        log.info("recording %s into %s", cfg.strategy, cfg.run_dir)
        run_workers(cfg)
        done.append(cfg.run_dir)
    return done
