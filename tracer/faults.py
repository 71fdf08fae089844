"""Fault canaries: real bug classes reproduced on purpose (``--fault``).

- ``skip-grad-sync``: gradients are never averaged across ranks; each rank steps on its own
  slice's gradient (DDP ``no_sync()`` on every step). DDP only (its row's ``faults``,
  analyzer/contract/strategies.py).
- ``wrong-grad-scale``: the averaged gradient is divided by the world size once more (the classic
  "divide by world size in the loss and again in the reduction" bug), before the optimizer.
- ``unsynced-init``: ranks r > 0 start from different weights (initial weights + 0.01 * noise
  seeded by ``seed + r``). DDP would repair this with its constructor broadcast, so for DDP the
  noise is added after wrapping (like a per-rank checkpoint load after DDP); for FSDP1/FSDP2
  before wrapping (they never broadcast: each rank keeps its own shard of its own weights).
- ``skip-replicate-sync`` (hsdp): the replicate dimension's gradient all_reduce never happens;
  each replica steps on the gradient of its own rows. Reproduced as the configuration bug that
  causes it: the units are ``fully_shard``-ed on ``mesh["shard"]`` (1-D) instead of the 2-D
  mesh, so each replica is an FSDP2 job of its own (``hsdp_mesh``). Not FSDP2's
  ``set_requires_all_reduce(False)``: that is its gradient-accumulation switch, which holds
  the reduce-scattered gradient back for a later all_reduce and leaves ``.grad`` None at the
  optimizer step (torch 2.13 _fsdp_collectives.py ``foreach_reduce``), so nothing would step.
- ``wrong-tp-placement`` (fsdp2_tp): every ``RowwiseParallel`` of the plan keeps its output
  ``Partial()`` instead of ``Replicate()`` (``tp_plan``): the rowwise all_reduce is skipped and
  each tp rank carries on with its own partial sum -- it runs, with every shape right, and
  computes wrong values from the first rowwise module's output on.
- ``hang`` (ddp): rank ``HANG_RANK`` never enters one all_reduce: at step ``HANG_STEP`` (the
  first after the numerics step) it blocks after its forward, before the backward whose
  gradient hooks would enqueue DDP's bucket all_reduce -- the stuck-rank bug class (a deadlock
  in host code, a wait on I/O that never returns). Its peers enter that all_reduce and wait in
  it until ``--timeout``; the record fails naming the stuck rank, and the Flight Recorder dumps
  (tracer/flightrec.py) say which collective it never entered. The rank blocks on an event
  nobody sets, so the Flight Recorder's dump thread still runs; the launcher then stops it.

Test-only failure injection (not a CLI option): env ``PARITYTRACE_INJECT=<what>@<rank>:<step>``
with what = raise | hang | sigkill makes that rank raise, sleep forever, or SIGKILL itself at the
start of that step; what = keep-grads (rank ``*``: every rank) skips that step's ``zero_grad``,
so the next step's gradients add to stale ones -- the forgotten-zero_grad bug, which leaves step 0
(and its gradient and parameter checks) untouched and shows only in later losses.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time

import torch
from torch import nn

log = logging.getLogger(__name__)

INJECT_ENV = "PARITYTRACE_INJECT"
HANG_RANK = 1
HANG_STEP = 1
UNSYNCED_INIT_SCALE = 0.01


def perturb_init(model: nn.Module, seed: int, rank: int) -> None:
    """unsynced-init: add ``0.01 * N(0, 1)`` noise (seeded by ``seed + rank``) to every parameter.

    Works on plain tensors and on DTensors' local shards.
    """
    gen = torch.Generator().manual_seed(seed + rank)
    with torch.no_grad():
        for p in model.parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            noise = torch.randn(local.shape, generator=gen).to(local.device, local.dtype)
            local.add_(noise, alpha=UNSYNCED_INIT_SCALE)


def grad_sync_context(model: nn.Module, fault: str | None) -> contextlib.AbstractContextManager:
    """skip-grad-sync: DDP ``no_sync()`` around forward and backward; otherwise a no-op."""
    return model.no_sync() if fault == "skip-grad-sync" else contextlib.nullcontext()


def after_backward(model: nn.Module, fault: str | None, world_size: int) -> None:
    """wrong-grad-scale: divide every (local) gradient by ``world_size`` once more."""
    if fault != "wrong-grad-scale":
        return
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.grad.div_(world_size)


def hang_before_backward(fault: str | None, rank: int, step: int) -> None:
    """hang: block rank ``HANG_RANK`` for good at step ``HANG_STEP``, between its forward and
    its backward (module docstring); a no-op otherwise."""
    if fault == "hang" and rank == HANG_RANK and step == HANG_STEP:
        log.warning("rank %d: --fault hang: blocking before the backward of step %d", rank, step)
        threading.Event().wait()


def _injection(rank: int, step: int) -> str | None:
    """What ``PARITYTRACE_INJECT`` injects at this rank and step (rank ``*``: any), else None."""
    spec = os.environ.get(INJECT_ENV)
    if not spec:
        return None
    what, _, where = spec.partition("@")
    r, _, s = where.partition(":")
    if (r != "*" and int(r) != rank) or int(s) != step:
        return None
    return what


def injected(what: str, rank: int, step: int) -> bool:
    """Whether ``PARITYTRACE_INJECT`` asks for ``what`` at this rank and step (tests only)."""
    return _injection(rank, step) == what


def maybe_inject(rank: int, step: int) -> None:
    """Apply ``PARITYTRACE_INJECT`` when it names this rank and step (tests only); the
    injections that act elsewhere in the step (``injected``) are left to their place."""
    what = _injection(rank, step)
    if what is None or what == "keep-grads":
        return
    spec = os.environ[INJECT_ENV]
    if what == "raise":
        raise RuntimeError(f"injected failure at step {step}")
    if what == "hang":
        while True:
            time.sleep(3600)
    if what == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise ValueError(f"{INJECT_ENV}={spec}: unknown injection {what!r}")


def hsdp_mesh(mesh, fault: str | None):
    """The mesh hsdp gives ``fully_shard``: the 2-D ``mesh``, or with skip-replicate-sync its
    ``"shard"`` dimension alone (module docstring)."""
    return mesh["shard"] if fault == "skip-replicate-sync" else mesh


def tp_plan(plan: dict, fault: str | None) -> dict:
    """The TP plan fsdp2_tp applies: ``plan``, or with wrong-tp-placement each RowwiseParallel
    replaced by one whose output stays ``Partial()`` (module docstring). Raises ``ValueError``
    when the fault finds no RowwiseParallel to break."""
    if fault != "wrong-tp-placement":
        return plan
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor.parallel import RowwiseParallel

    broken = {fqn: RowwiseParallel(input_layouts=style.input_layouts[0], output_layouts=Partial(),
                                   use_local_output=style.use_local_output)
              if isinstance(style, RowwiseParallel) else style for fqn, style in plan.items()}
    if not any(isinstance(s, RowwiseParallel) for s in plan.values()):
        raise ValueError("--fault wrong-tp-placement: the TP plan has no RowwiseParallel to break")
    return broken
