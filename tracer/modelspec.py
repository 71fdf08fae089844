"""``tracer.ModelSpec``, the public API of ``tracer record --model``: a model and its training
problem (tracer/specload.py turns a ``--model SPEC`` into one and checks it), and how a rank
loads the baseline's initial parameters into it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from tracer.specform import SpecError  # defined without torch (tracer/specform.py)

__all__ = ["ModelSpec", "SpecError", "load_parameters", "buffer_names", "split_module_list"]


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """A model and its training problem, as ``tracer record --model`` needs them.

    Example (a complete user file; ``tracer record --model my_model.py:build``)::

        import torch
        from torch import nn
        from tracer import ModelSpec

        def build() -> ModelSpec:
            model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
            def make_batch(batch_size, seed):
                gen = torch.Generator().manual_seed(seed)
                return torch.randn(batch_size, 16, generator=gen), torch.randn(batch_size, 4, generator=gen)
            return ModelSpec(model=model, make_batch=make_batch,
                             loss=lambda out, y: nn.functional.mse_loss(out, y), units=(nn.Linear,))
    """

    model: nn.Module
    """Built on CPU, in training mode, with no randomness in its forward (dropout p = 0: each
    rank and the baseline would draw different masks). Its parameter FQNs name the numerics
    rows; tied parameters are one FQN (``named_parameters`` lists a shared tensor once)."""
    make_batch: Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
    """``make_batch(batch_size, seed) -> (inputs, targets)``: the one fixed global batch, both
    tensors with dim 0 = ``batch_size`` (any dtype: token ids are int64). Called once per record;
    rank r trains on rows [r*B/W, (r+1)*B/W) of it (tracer/model.py ``rank_rows``), every step."""
    loss: Callable[[Any, torch.Tensor], torch.Tensor]
    """``loss(model(inputs), targets) -> scalar tensor``, a mean over the batch rows (so that
    DDP / FSDP's gradient average over equal row counts equals the one-process gradient)."""
    units: tuple[type[nn.Module], ...] = ()
    """Module classes whose instances become FSDP units: FSDP1 ``ModuleWrapPolicy(units)``,
    FSDP2 ``fully_shard`` on each instance (post-order), then on the root. Empty: the root is
    the only unit."""
    wrap_min_params: int | None = None
    """Set instead of ``units``: FSDP1 ``size_based_auto_wrap_policy(min_num_params=...)`` and
    the same modules for FSDP2 (what the reference model uses; ``--wrap-min-params`` sets it)."""
    tp_plan: Callable[[nn.Module, Any], dict[str, Any]] | None = None
    """``tp_plan(model, tp_mesh) -> {module FQN: ParallelStyle}``, the plan ``--strategy
    fsdp2_tp`` gives ``torch.distributed.tensor.parallel.parallelize_module(model, tp_mesh,
    plan)`` on the whole model (``tp_mesh``: the "tp" dimension of the (dp, tp) DeviceMesh),
    before FSDP2 shards over "dp". None: the model has no TP plan, and ``--strategy fsdp2_tp``
    is refused before any worker starts. The reference model's: ``tracer.model.tp_plan``.
    Example (the MLP above)::

        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        def plan(model, tp_mesh):
            return {"0": ColwiseParallel(), "2": RowwiseParallel()}

    Every parameter stays in ``named_parameters`` under its FQN (as a DTensor), so the numerics
    compare it whole (``DTensor.full_tensor()``, tracer/strategies.py ``compared_tensors``). A
    module's output is compared when it is replicated or last-dim sharded (ColwiseParallel's
    local output); other layouts are left out (tracer/strategies.py ``tp_activation``)."""
    config: dict[str, Any] | None = None
    """The model's configuration as built (JSON values: sizes, epsilons, flags), written to the
    manifest's ``model.config``; ``hf:`` models give their transformers config
    (tracer/hf.py ``built_config``). None: the spec names none (the parameter count,
    ``model.num_params``, is recorded either way)."""

    pp_split: Callable[[nn.Module, int], list[list[str]]] | None = None
    """The stage-split hook of ``--strategy pp``: ``pp_split(model, n) -> n lists of submodule
    FQNs``, stage k's modules in forward order. The model must be a chain along them: stage 0's
    modules applied in order to the batch's inputs, each next module to the previous one's
    output (a single tensor), the last stage's output is what ``loss`` takes, and the whole
    chain gives ``model(inputs)`` (``tracer record`` checks it on rank 0's rows before any
    worker starts, with every other rule here). Every parameter lies under exactly one stage's
    modules (tied parameters across stages are refused). ``n`` = P x V (``--pp`` x
    ``--pp-virtual``); stage k runs on pp rank k % P (looped schedules) or as a V (zbv,
    dualpipev; tracer/pipeline.py ``stage_placement``). None: ``--strategy pp`` is refused.
    The reference model's: ``split_module_list("layers")``. Example (a GPT whose forward is
    ``head(norm(blocks(embed(ids))))``)::

        from tracer import split_module_list

        pp_split = split_module_list("blocks", first=("embed",), last=("norm", "head"))
    """

    def __post_init__(self) -> None:
        """Raises ``ValueError`` for a ``config`` the manifest cannot hold (not a dict of JSON
        values): refused when the factory returns, not when a rank writes its manifest."""
        if self.config is None:
            return
        try:
            json.dumps(self.config, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"ModelSpec.config is not JSON ({exc})") from None
        if not isinstance(self.config, dict):
            raise ValueError(f"ModelSpec.config is a {type(self.config).__name__}, not a dict")


def split_module_list(attr: str, first: tuple[str, ...] = (), last: tuple[str, ...] = ()
                      ) -> Callable[[nn.Module, int], list[list[str]]]:
    """A ``ModelSpec.pp_split`` for a model whose forward is ``first`` modules, then the blocks
    of ``model.<attr>`` (an ``nn.ModuleList`` / ``nn.Sequential``) in order, then ``last``:
    stage k of n gets the contiguous blocks ``[k*L // n, (k+1)*L // n)`` (L blocks), stage 0
    the ``first`` modules before its blocks, stage n-1 the ``last`` after its blocks. The split
    raises ``ValueError`` when n < 1 or n > L (a stage with no block)."""

    def split(model: nn.Module, n: int) -> list[list[str]]:
        blocks = len(model.get_submodule(attr))
        if not 0 < n <= blocks:
            raise ValueError(f"{n} pipeline stages over {blocks} blocks of {attr}: need 1 <= stages <= blocks")
        out = [[f"{attr}.{i}" for i in range(k * blocks // n, (k + 1) * blocks // n)] for k in range(n)]
        out[0][:0] = list(first)
        out[-1].extend(last)
        return out
    return split


def load_parameters(model: nn.Module, tensors: dict[str, torch.Tensor], prefix: str) -> None:
    """Copy ``tensors[prefix + fqn]`` into each parameter of ``model`` (``named_parameters``:
    a tied parameter once). Buffers keep the values the factory gave them.

    Raises ``ValueError`` when a parameter is missing or has another shape (the file was
    written for another model).
    """
    with torch.no_grad():
        for fqn, p in model.named_parameters():
            t = tensors.get(prefix + fqn)
            if t is None or tuple(t.shape) != tuple(p.shape):
                got = "missing" if t is None else f"shape {tuple(t.shape)}"
                raise ValueError(f"initial parameter {fqn}: {got}, the model has {tuple(p.shape)}; "
                                 "the baseline was written for another model")
            p.copy_(t)


def buffer_names(model: nn.Module) -> list[str]:
    """FQNs of the model's buffers: not compared (why: docs/howto/your-model.md, "How to: record
    your own model")."""
    return [name for name, _ in model.named_buffers()]
