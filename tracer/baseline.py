"""The single-device baseline every distributed record is compared with.

One process runs the model on the whole global batch (same seed, initial weights, data and
precision policy as the ranks, one torch thread) and saves what the ranks compare against to
``baseline.safetensors`` in the run directory (never pickle):

    batch.x, batch.y          the global batch, [B, S, H] fp32
    init.<fqn>                initial parameters
    act.<fqn>                 step-0 forward output of each module, [B, S, H or 4H]
    grad.<fqn>                step-0 gradients (before the optimizer step)
    param.<fqn>               parameters after the first optimizer step
    loss                      loss per step, [steps] fp64
metadata: ``config`` (the fields that determine the numbers, JSON) and ``activation_order``.

Where it runs: ``tracer record`` (no torchrun) computes it in the parent before spawning ranks
(on CUDA in a child process, so the parent holds no GPU memory while ranks run). Under torchrun
there is no parent: global rank 0 runs ``python -m tracer.baseline`` as a child process and every
rank waits at a barrier, so no rank's memory peaks include the baseline. Multi-node runs
therefore need the run directory on a filesystem all nodes share (as the manifest does).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tracer.config import RecordConfig
from tracer.model import build_model, loss_fn, make_batch, precision_context
from tracer.numerics import ActivationRecorder

BASELINE_NAME = "baseline.safetensors"
_KEY_FIELDS = ("hidden", "layers", "batch", "seq", "seed", "precision", "lr")


def baseline_key(cfg: RecordConfig, device_type: str) -> dict:
    """The settings that determine the baseline's numbers (stored in its metadata)."""
    key = {f: getattr(cfg, f) for f in _KEY_FIELDS}
    key["steps"] = cfg.total_steps
    key["device_type"] = device_type
    return key


def compute_baseline(cfg: RecordConfig, device_type: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Run ``cfg.total_steps`` SGD steps on the global batch; return (tensors, metadata).

    Tensors are on CPU, contiguous. Uses one torch thread, as every rank does.
    """
    torch.set_num_threads(1)
    device = torch.device(device_type)
    model = build_model(cfg.hidden, cfg.layers, cfg.seed)
    x, y = make_batch(cfg.batch, cfg.seq, cfg.hidden, cfg.seed)
    tensors: dict[str, torch.Tensor] = {"batch.x": x, "batch.y": y}
    for name, p in model.named_parameters():
        tensors[f"init.{name}"] = p.detach().clone()
    model.to(device)
    xd, yd = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    losses = []
    order: list[str] = []
    for step in range(cfg.total_steps):
        if step == 0:
            with ActivationRecorder(model) as rec, precision_context(cfg.precision, device_type):
                loss = loss_fn(model(xd), yd)
            for _, name, out in rec.items():
                tensors[f"act.{name}"] = out.cpu().contiguous()
                order.append(name)
        else:
            with precision_context(cfg.precision, device_type):
                loss = loss_fn(model(xd), yd)
        loss.backward()
        if step == 0:
            for name, p in model.named_parameters():
                tensors[f"grad.{name}"] = p.grad.detach().cpu().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            for name, p in model.named_parameters():
                tensors[f"param.{name}"] = p.detach().cpu().clone()
        losses.append(float(loss.detach()))
    tensors["loss"] = torch.tensor(losses, dtype=torch.float64)
    meta = {"config": json.dumps(baseline_key(cfg, device_type), sort_keys=True),
            "activation_order": json.dumps(order)}
    return tensors, meta


def save_baseline(tensors: dict[str, torch.Tensor], meta: dict[str, str], path: Path) -> None:
    """Write atomically (temp file in the same folder + os.replace)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # like any other run-dir file (save_file may create it 0600)
    os.replace(tmp, path)


def write_baseline(cfg: RecordConfig, device_type: str, path: Path) -> None:
    """Compute and save the baseline in this process."""
    tensors, meta = compute_baseline(cfg, device_type)
    save_baseline(tensors, meta, path)


def write_baseline_isolated(cfg: RecordConfig, device_type: str, path: Path) -> None:
    """Compute and save the baseline in a child process (``python -m tracer.baseline``).

    Raises ``RuntimeError`` with the child's last stderr line when it fails or exceeds the
    config's timeout.
    """
    cmd = [sys.executable, "-m", "tracer.baseline", json.dumps(cfg.to_dict()), device_type, str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"baseline process exceeded {cfg.timeout_s}s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        raise RuntimeError(f"baseline process failed: {lines[-1] if lines else proc.returncode}")


def load_baseline(path: Path, cfg: RecordConfig, device_type: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Load ``baseline.safetensors``; returns (tensors on CPU, activation order).

    Raises ``ValueError`` when the file was computed for different settings.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    stored = json.loads(meta.get("config", "{}"))
    wanted = baseline_key(cfg, device_type)
    if stored != wanted:
        raise ValueError(f"{path}: baseline computed for {stored}, this run needs {wanted}")
    return load_file(str(path)), json.loads(meta["activation_order"])


def _main(argv: list[str]) -> int:
    cfg = RecordConfig.from_dict(json.loads(argv[0]))
    write_baseline(cfg, argv[1], Path(argv[2]))
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
