"""What a projection's roles start from: the record's inputs, never its numerics baseline.

A record computes a single-device baseline on the whole global batch (tracer/baseline.py
``compute_baseline``: every step, every module's activations kept at [B, ...]) so that each
rank's step-0 tensors can be compared with it. A projection cannot use that comparison (the
fake process group moves no data: parity is "not verified", analyzer/compare/runs.py
``PROJECTION_PARITY``), and the baseline's cost grows with the global batch, which grows with
the world: at N = 1,024 (batch 1,024, the reference model's defaults) it took 82 of the
projection's 99 s and wrote 3.8 GB (measured here, issue 44's "world 1,024 in under a
minute"). So a projection writes only what its roles read: the batch and the initial
parameters (the record's, drawn from the same seed or read from ``--golden``), in the
baseline's file and form (``baseline.safetensors``, kept.parquet, an empty activations file),
with a NaN loss per step, no ``grad.*`` / ``param.*`` and no activations; and each role's step
skips the step-0 comparison (``unverified``).

Nothing profiled changes: the comparison runs at step 0, which is never profiled
(tracer/config.py: ``--wait`` >= 1), and it is outside a step's wall time.
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import torch

from tracer.config import RecordConfig


def projection_inputs(cfg: RecordConfig, device_type: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, metadata) in ``tracer.baseline.compute_baseline``'s form, without its steps:
    ``batch.x``, ``batch.y`` (the global batch), ``init.<fqn>`` (initial parameters, CPU),
    ``loss`` ([total_steps] fp64, NaN: not computed). The metadata's ``config`` is the
    baseline's key, so ``load_baseline`` accepts the file for ``cfg``."""
    from tracer.baseline import baseline_key
    from tracer.modelspec import load_parameters
    from tracer.specload import load_spec

    spec = load_spec(cfg)
    if cfg.golden is not None:
        from tracer.golden import load_golden

        golden = load_golden(cfg.golden)
        load_parameters(spec.model, golden, "init.")
        x, y = golden["batch.x"], golden["batch.y"]
    else:
        x, y = spec.make_batch(cfg.batch, cfg.seed)
    tensors = {"batch.x": x, "batch.y": y}
    for name, p in spec.model.named_parameters():
        tensors[f"init.{name}"] = p.detach()
    tensors["loss"] = torch.full((cfg.total_steps,), math.nan, dtype=torch.float64)
    meta = {"config": json.dumps(baseline_key(cfg, device_type), sort_keys=True),
            "activation_order": "[]"}
    return tensors, meta


def write_projection_inputs(cfg: RecordConfig, device_type: str, path: Path,
                            fake_tensors: bool = False) -> None:
    """Write ``projection_inputs`` where the baseline goes (``path``: the run dir's
    baseline.safetensors), by the baseline's writer (tracer/baseline.py ``save_baseline``:
    atomic, one-line ``ValueError`` when the folder cannot take it). ``fake_tensors``: the
    batch only (tracer/fakeproject.py ``batch_only``: the model is never built with storage)."""
    from tracer.baseline import save_baseline

    if fake_tensors:
        from tracer.fakeproject import batch_only

        tensors, meta = batch_only(cfg)
    else:
        tensors, meta = projection_inputs(cfg, device_type)
    save_baseline(tensors, meta, path)


class Unverified:
    """A role's ``tracer.loop.Step`` without the step-0 comparison: no activation capture,
    ``compare`` does nothing (the inputs hold no reference to compare with). ``losses_kept``
    False: ``forward_backward`` returns no loss (the loop reads each loss's value, which a fake
    tensor has none of; the steps' losses are then NaN, as a rank that computed none).
    ``cost``: a tracer/fakeproject.py ``OpCost``, told each step's index as it starts."""

    def __init__(self, step, *, losses_kept: bool = True, cost=None):
        self.step, self.model, self.losses_kept, self.cost = step, step.model, losses_kept, cost

    def recorder(self):
        return contextlib.nullcontext()

    def forward_backward(self, x, y, step, saved):
        if self.cost is not None:  # tracer/fakeproject.py OpCost: the ops until the next step are step's
            self.cost.step = step
        losses = self.step.forward_backward(x, y, step, saved)
        return losses if self.losses_kept else []

    def compare(self, numerics, kind, recorder) -> None:
        return None

    def losses(self, values: list[float]) -> list[float]:
        return self.step.losses(values)
