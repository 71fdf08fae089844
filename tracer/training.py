"""The training setup shared by the baseline and every strategy: optimizer, mixed precision,
activation checkpointing (``--optimizer``, ``--mixed-precision``, ``--activation-checkpointing``).

One definition each, used by ``tracer/baseline.py`` (one process, whole batch) and the ranks
(``tracer/worker.py``, ``tracer/strategies.py``), so a parity difference cannot come from two
spellings of one setting.

Mixed precision ``PARAM,REDUCE,BUFFER`` means what FSDP1 ``MixedPrecision(param_dtype,
reduce_dtype, buffer_dtype)`` does (torch/distributed/fsdp/api.py ``MixedPrecision`` docstring):
fp32 master parameters; forward and backward run on a PARAM copy of the parameters, with the
root's floating inputs cast to PARAM; gradients are cast to REDUCE before the reduction and back to
the parameters' fp32 for the optimizer; buffers are cast to BUFFER. FSDP2 ``MixedPrecisionPolicy
(param_dtype, reduce_dtype)`` does the same for parameters and gradients (its ``cast_forward_inputs``
default casts each unit's inputs); it has no buffer dtype: ``fully_shard`` does not manage
buffers, so ``cast_buffers`` casts them once before wrapping, as FSDP1 does at its lazy init.
The baseline emulates the policy step by step (``MixedPrecisionStep``). Under a low-precision
PARAM or REDUCE it runs the global batch as W micro-batches, one per rank's rows, and accumulates
their gradients in REDUCE as the ranks' reduction does (each cast to REDUCE, divided by W, added in
rank order): one device doing gradient accumulation. A whole-batch gradient rounded once would
differ from the ranks' W rounded partial sums by u relative to the *partials*, which in a small
tensor whose rows cancel (a norm weight) exceeds any tolerance relative to the gradient itself.
What is left is the order of the collective's additions (none for W = 2), which the tolerance
covers (docs/method.md "Reading the report": the parity check and its tolerance).
"""

from __future__ import annotations

import copy
import functools

import torch
from torch import nn

from tracer.config import RecordConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def mp_dtypes(cfg: RecordConfig) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(param, reduce, buffer) torch dtypes of ``--mixed-precision`` (fp32 x 3 without it)."""
    return tuple(DTYPES[d] for d in cfg.mixed_precision_dtypes)  # type: ignore[return-value]


def build_optimizer(cfg: RecordConfig, params) -> torch.optim.Optimizer:
    """``--optimizer``: plain SGD, or AdamW with torch's defaults (betas (0.9, 0.999), eps 1e-8,
    weight_decay 0.01) and ``cfg.learning_rate``. ``foreach=False``: the per-tensor loop, the same
    arithmetic for plain tensors and FSDP2's DTensors."""
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.learning_rate, foreach=False)
    return torch.optim.SGD(params, lr=cfg.learning_rate, foreach=False)


def optimizer_manifest(cfg: RecordConfig) -> dict:
    """The optimizer's settings as the manifest records them (``Training.optimizer``)."""
    opt = build_optimizer(cfg, [nn.Parameter(torch.zeros(1))])
    group = opt.param_groups[0]
    keep = ("lr", "betas", "eps", "weight_decay", "momentum")
    return {"name": cfg.optimizer, **{k: (list(v) if isinstance(v, tuple) else v)
                                      for k, v in group.items() if k in keep}}


def cast_buffers(model: nn.Module, cfg: RecordConfig) -> None:
    """Floating buffers to BUFFER (``--mixed-precision``; no-op without it)."""
    if cfg.mixed_precision is None:
        return
    dtype = mp_dtypes(cfg)[2]
    for module in model.modules():
        for name, buf in module.named_buffers(recurse=False):
            if buf is not None and buf.is_floating_point():
                setattr(module, name, buf.to(dtype))


def apply_checkpointing(model: nn.Module, unit_names: list[str]) -> None:
    """``--activation-checkpointing``: wrap each unit (module FQNs) in a non-reentrant
    ``checkpoint_wrapper`` (torch.distributed.algorithms._checkpoint.checkpoint_wrapper
    ``apply_activation_checkpointing``, the helper FSDP's docs use). The wrapper inserts
    ``_checkpoint_wrapped_module`` into FQNs; ``numerics.clean_fqn`` drops it. Works on a plain
    model and inside FSDP1 units (wrap first, then checkpoint, as FSDP's tutorials do)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)

    from tracer.numerics import clean_fqn

    wanted = set(unit_names)
    chosen = {id(m) for n, m in model.named_modules() if clean_fqn(n) in wanted
              and type(m).__name__ != "FullyShardedDataParallel"}
    apply_activation_checkpointing(
        model, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                       checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda m: id(m) in chosen)


def ddp_comm_hook(model: nn.Module, cfg: RecordConfig) -> None:
    """DDP with REDUCE bf16 / fp16: a comm hook that casts each gradient bucket to REDUCE,
    divides it by the world size, all_reduces it and casts it back -- the arithmetic of torch's
    ``bf16_compress_hook`` / ``fp16_compress_hook`` (torch/distributed/algorithms/ddp_comm_hooks/
    default_hooks.py), which refuse gloo (they check for NCCL); this one runs on any backend. It
    rounds the gradient where FSDP's ``reduce_dtype`` does."""
    import torch.distributed as dist

    reduce = mp_dtypes(cfg)[1]
    if reduce == torch.float32:
        if dist.get_backend() == "fake":  # tracer project (issue 44)
            model.register_comm_hook(state=None, hook=_fake_group_allreduce)
        return

    def compress(_state, bucket):
        buffer = bucket.buffer()
        compressed = buffer.to(reduce).div_(dist.get_world_size())
        fut = dist.all_reduce(compressed, async_op=True).get_future()

        def decompress(_f):  # all_reduce is in place; the fake group's future holds None
            buffer.copy_(compressed)
            return buffer

        return fut.then(decompress)

    model.register_comm_hook(state=None, hook=compress)


def _fake_group_allreduce(_state, bucket):
    """DDP's own all_reduce of a bucket, as a comm hook, for torch's fake process group: the
    built-in reducer's future yields None there, which DDP's backward refuses ("expected the
    hook result is either a Tensor or a TensorList", torch/csrc/distributed/c10d/comm.cpp).
    Same call as the reducer's (``allreduce_`` of the bucket divided by the world size,
    torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py ``allreduce_hook``), returning
    the bucket's buffer."""
    import torch.distributed as dist

    buffer = bucket.buffer().div_(dist.get_world_size())
    return dist.all_reduce(buffer, async_op=True).get_future().then(lambda _f: buffer)


class MixedPrecisionStep:
    """The baseline's emulation of ``--mixed-precision`` around one model.

    ``compute`` is the module forward and backward run on: the model itself without mixed
    precision, else a copy holding PARAM-dtype parameters and BUFFER-dtype buffers, refreshed
    from the fp32 master (``model``) before every forward (``refresh``). ``inputs`` casts the
    floating inputs to PARAM (FSDP1's root / FSDP2's ``cast_forward_inputs``). ``to_master``
    gives the master the micro-batches' gradients accumulated in REDUCE (``accumulate``, after each
    micro-batch's backward), cast to the master's dtype. ``parts``: micro-batches per step
    (default ``micro_batches(cfg)``; the ``single`` strategy's run uses 1, its whole batch).
    """

    def __init__(self, model: nn.Module, cfg: RecordConfig, parts: int | None = None):
        self.master = model
        self.enabled = cfg.mixed_precision is not None
        self.param_dtype, self.reduce_dtype, _ = mp_dtypes(cfg)
        self.micro_batches = micro_batches(cfg) if parts is None else parts
        self._sums: dict[int, torch.Tensor] = {}  # parameter index -> REDUCE sum
        if self.enabled:
            from tracer.compiling import recompile_copy

            self.compute = copy.deepcopy(model)
            recompile_copy(model, self.compute)  # --compile: the copy runs its own parameters
            cast_buffers(self.compute, cfg)
        else:
            self.compute = model

    def refresh(self) -> None:
        """Copy the master parameters into the compute copy, cast to PARAM."""
        if not self.enabled:
            return
        with torch.no_grad():
            for p, m in zip(self.compute.parameters(), self.master.parameters()):
                p.data = m.detach().to(self.param_dtype)

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` cast to PARAM when floating and mixed precision is on."""
        return x.to(self.param_dtype) if self.enabled and x.is_floating_point() else x

    def accumulate(self) -> None:
        """After one micro-batch's backward: its compute-copy gradients, cast to REDUCE and
        divided by ``micro_batches`` (as a rank's gradient before the reduction), are added in
        REDUCE to the sum of the micro-batches so far; clears the copy's."""
        if not self.enabled:
            return
        for i, p in enumerate(self.compute.parameters()):
            if p.grad is not None:
                part = p.grad.to(self.reduce_dtype).div(self.micro_batches)
                self._sums[i] = part if self._sums.get(i) is None else self._sums[i] + part
            p.grad = None

    def to_master(self) -> None:
        """Accumulated gradients -> master ``.grad`` in the master's dtype; clears the sums."""
        if not self.enabled:
            return
        for i, m in enumerate(self.master.parameters()):
            m.grad = None if self._sums.get(i) is None else self._sums[i].to(m.dtype)
        self._sums.clear()


def micro_batches(cfg: RecordConfig) -> int:
    """Micro-batches of the baseline's step: the data-parallel size (``cfg.nproc`` / (T * P)) under a
    low-precision PARAM or REDUCE, so each rank's rows are computed and rounded as that rank does
    (module docstring); 1 otherwise (one whole-batch step, the plain one-device reference)."""
    if cfg.mixed_precision is None or all(d == "fp32" for d in cfg.mixed_precision_dtypes[:2]):
        return 1
    return cfg.nproc // (cfg.tp_degree * cfg.pp_degree)  # the data-parallel ranks
