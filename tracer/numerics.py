"""Numerics rows (analyzer.contract.schemas NUMERICS_SCHEMA): diff metrics of a rank's tensors vs the baseline.

All sums are float64 over this rank's elements; readers combine ranks (sum for sharded tensors,
worst rank for replicated ones).
"""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
import torch
from torch import nn

from analyzer.contract.schemas import NUMERICS_SCHEMA, TENSOR_METRICS

# Wrapper prefixes inserted into parameter / module names by DDP, FSDP1 and activation
# checkpointing. FSDP2 (fully_shard) keeps names unchanged.
_WRAPPER_PARTS = ("module", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod")


def clean_fqn(name: str) -> str:
    """FQN as in the unwrapped model: drops ``module.`` (DDP), ``_fsdp_wrapped_module.`` (FSDP1),
    ``_checkpoint_wrapped_module.`` and ``_orig_mod.`` (torch.compile) path parts.

    ``"module.layers.0._fsdp_wrapped_module.attn.weight"`` -> ``"layers.0.attn.weight"``. Our model
    has no submodule really named ``module``, so dropping every such part is safe here.
    """
    return ".".join(p for p in name.split(".") if p not in _WRAPPER_PARTS)


def tensor_metrics(x: torch.Tensor, ref: torch.Tensor, *, replicated: bool) -> dict[str, float]:
    """TENSOR_METRICS of ``x`` (this rank's elements) against the matching baseline elements ``ref``.

    Shapes must be equal (a mismatch is a bug in the slicing: ``ValueError``). Empty tensors
    (a rank holding no elements of a shard) give zero sums and zero maxima.
    """
    if tuple(x.shape) != tuple(ref.shape):
        raise ValueError(f"shape {tuple(x.shape)} does not match baseline {tuple(ref.shape)}")
    xd = x.detach().to("cpu", torch.float64).reshape(-1)
    rd = ref.detach().to("cpu", torch.float64).reshape(-1)
    diff = xd - rd
    empty = xd.numel() == 0
    return {
        "numel": float(xd.numel()),
        "sq_sum": float((xd * xd).sum()),
        "ref_sq_sum": float((rd * rd).sum()),
        "diff_sq_sum": float((diff * diff).sum()),
        "max_abs_diff": 0.0 if empty else float(diff.abs().max()),
        "max_abs_ref": 0.0 if empty else float(rd.abs().max()),
        "nonfinite": float((~torch.isfinite(xd)).sum()),
        "replicated": 1.0 if replicated else 0.0,
    }


class NumericsRows:
    """Accumulates long-format rows for one rank; ``table()`` gives a NUMERICS_SCHEMA table."""

    def __init__(self, rank: int):
        self.rank = rank
        self.rows: list[dict[str, Any]] = []

    def add(self, step: int, kind: str, tensor: str, seq: int, metric: str, value: float) -> None:
        """One row."""
        self.rows.append({"rank": self.rank, "step": step, "kind": kind, "tensor": tensor,
                          "seq": seq, "metric": metric, "value": value})

    def add_tensor(self, step: int, kind: str, tensor: str, seq: int, metrics: dict[str, float]) -> None:
        """Rows for every TENSOR_METRICS entry of ``metrics``."""
        for metric in TENSOR_METRICS:
            self.add(step, kind, tensor, seq, metric, metrics[metric])

    def add_loss(self, step: int, value: float, ref_value: float) -> None:
        """The loss rows of one step."""
        self.add(step, "loss", "loss", 0, "value", value)
        self.add(step, "loss", "loss", 0, "ref_value", ref_value)

    def table(self) -> pa.Table:
        """The rows as a NUMERICS_SCHEMA table."""
        return rows_to_table(self.rows, NUMERICS_SCHEMA)


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts keyed by the schema's field names) -> a table of exactly ``schema``."""
    columns = {f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema}
    return pa.Table.from_pydict(columns, schema=schema)


def _is_wrapper(module: nn.Module) -> bool:
    """DDP / FSDP1 / checkpoint wrappers: their output is their inner module's output."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return bool(names & {"DistributedDataParallel", "FullyShardedDataParallel", "CheckpointWrapper"})


class ActivationRecorder:
    """Forward hooks that keep each module's outputs (detached) during one step.

    Keys are clean module FQNs; order = order in which modules first finished a forward. The
    root module and wrapper modules are skipped (their output equals an inner module's), and
    with ``within`` (module FQNs: a pipeline stage's layers) the modules not at or under them.
    An output is kept when it is a tensor, or a tuple / list whose first element is one
    (attention blocks return ``(out, weights)``), and its dim 0 has ``batch_rows`` rows: only
    then do a rank's rows line up with the baseline's rows of that rank (``rank_rows``).
    Outputs without the batch dimension (``batch_rows`` None: any dim 0) (rotary tables
    [1, S, D], position embeddings) and model-output objects (dicts: their tensors are some
    inner module's output) are not compared. A module's activation: the outputs of the calls
    ``calls`` picks, joined along dim 0 (default the first; a pipeline stage's last M are its
    microbatches). Use as a context manager around what it captures.
    """

    def __init__(self, model: nn.Module, batch_rows: int | None = None, *, calls: slice = slice(0, 1),
                 within: list[str] | None = None):
        self.outputs: dict[str, list[torch.Tensor]] = {}
        self.batch_rows = batch_rows
        self.calls = calls
        self._handles = []
        for name, module in model.named_modules():
            clean = clean_fqn(name)
            if not clean or _is_wrapper(module) or (
                    within is not None and not any(clean == m or clean.startswith(m + ".") for m in within)):
                continue
            self._handles.append(module.register_forward_hook(self._hook(clean)))

    def _hook(self, name: str):
        def hook(_module, _inputs, output):
            if isinstance(output, (tuple, list)) and output:
                output = output[0]
            if isinstance(output, torch.Tensor) and output.dim() > 0 and self.batch_rows in (None, output.shape[0]):
                kept = self.outputs.setdefault(name, [])
                if self.calls.stop is None or len(kept) < self.calls.stop:  # none past the last picked
                    kept.append(output.detach().clone())
        return hook

    def __enter__(self) -> "ActivationRecorder":
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def output(self, name: str) -> torch.Tensor | None:
        """Module ``name``'s activation (class docstring); None when none of its calls was kept."""
        picked = self.outputs.get(name, [])[self.calls]
        return (picked[0] if len(picked) == 1 else torch.cat(picked)) if picked else None

    def items(self) -> Iterator[tuple[int, str, torch.Tensor]]:
        """(seq, name, activation) in forward-finish order."""
        for seq, name in enumerate(self.outputs):
            yield seq, name, self.output(name)
