"""Test-only model specs whose code misbehaves in ways no ``except`` sees where it runs
(tests/tracer/test_model_code.py): it ends the process with status 0, hangs, or prints lines
that read like the tracer's own. ``where`` decides in which process it misbehaves: ``ranks``
only in a rank of the record (RANK set, 1 for ``rank1``), ``factory`` in every process at the
factory call (the spec check comes first).
"""

import os
import sys
import threading
from pathlib import Path

import torch
from torch import nn

from tracer import ModelSpec

ARRIVED_ENV = "UNRULY_ARRIVED"
"""A file the hanging factory creates once it is in the factory (the test waits on it)."""


def _batch(batch_size, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch_size, 4, generator=gen), torch.randn(batch_size, 2, generator=gen)


class _Net(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.lin = nn.Linear(4, 2)
        self.act = act

    def forward(self, x):
        self.act()
        return self.lin(x)


def _spec(act=lambda: None) -> ModelSpec:
    return ModelSpec(model=_Net(act), make_batch=_batch, loss=nn.functional.mse_loss, units=(nn.Linear,))


def _in_rank1() -> bool:
    return os.environ.get("RANK") == "1"


def sys_exit_in_rank1() -> ModelSpec:
    return _spec(lambda: sys.exit(0) if _in_rank1() else None)


def os_exit_in_rank1() -> ModelSpec:
    return _spec(lambda: os._exit(0) if _in_rank1() else None)


def sys_exit_in_factory() -> ModelSpec:
    sys.exit(0)


def os_exit_in_factory() -> ModelSpec:
    os._exit(0)


def hangs_in_factory() -> ModelSpec:
    arrived = os.environ.get(ARRIVED_ENV)
    if arrived:
        Path(arrived).write_text(str(os.getpid()))
    threading.Event().wait()  # forever: a deadlock, a download that never answers


def prints_recorded() -> ModelSpec:
    print("recorded traces/ddp", flush=True)

    def say():
        print("recorded traces/fsdp", flush=True)
    return _spec(say)


def library_gives_up_in_rank1() -> ModelSpec:
    """What a native library does on a fatal error: a line on stderr, then ``_exit(1)``."""
    def give_up():
        if _in_rank1():
            print("FATAL: the kernel library gave up: shape mismatch", file=sys.stderr, flush=True)
            os._exit(1)
    return _spec(give_up)


def os_exit_in_every_rank() -> ModelSpec:
    return _spec(lambda: os._exit(0) if "RANK" in os.environ else None)
