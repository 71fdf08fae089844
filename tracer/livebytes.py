"""The peak of a fake-tensor role's live tensor bytes on its device (issue 44).

A fake storage is never allocated, so neither the CUDA allocator nor the profiler sees a fake
role's memory. ``LiveBytes`` counts it the way torch's ``MemTracker``
(torch/distributed/_tools/mem_tracker.py) does: every storage an operator returns (the
dispatch mode that sees each op, tracer/opcost.py ``OpCost``, hands over its results; a
DTensor's local storages, ``get_untyped_storages``) is added once with its bytes and removed
when it dies (a weak reference's callback); ``UntypedStorage.resize_`` (FSDP2 frees and
re-allocates its unsharded parameters' storage that way,
torch/distributed/fsdp/_fully_shard/_fsdp_common.py) changes its bytes. Only storages on the
role's device type count (a CUDA role's global batch stays on the CPU, as in a record). The
peak is sampled after each operator of the profiled steps: tensors only, without the
allocator's rounding, caching or fragmentation, so below ``torch.cuda.max_memory_allocated``
by those.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary


class LiveBytes:
    """Live bytes of the distinct storages on ``device_type`` (module docstring); ``peak``
    the largest sampled while ``step`` is in ``profiled``."""

    def __init__(self, device_type: str, profiled: range):
        self.device_type, self.profiled = device_type, profiled
        self.cells = WeakIdKeyDictionary()  # storage -> [bytes] (a cell: resize_ changes it)
        self.live = self.peak = 0

    def add(self, out, step: int | None) -> None:
        """Count the storages of the tensors in ``out`` (an operator's results) not yet
        counted, then sample the peak when ``step`` is profiled."""
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                for st in get_untyped_storages(t):
                    if st not in self.cells:
                        self._new(st, st.nbytes())
        if step in self.profiled and self.live > self.peak:
            self.peak = self.live

    def _new(self, st, nbytes: int) -> None:
        cell = [nbytes]
        self.cells[st] = cell
        self.live += nbytes
        weakref.finalize(st, self._free, cell)

    def _free(self, cell: list[int]) -> None:
        self.live -= cell[0]

    def resized(self, st, nbytes: int) -> None:
        """``st``, counted, now holds ``nbytes`` (``UntypedStorage.resize_``)."""
        cell = self.cells[st]
        self.live += nbytes - cell[0]
        cell[0] = nbytes

    @contextlib.contextmanager
    def tracking_resize(self):
        """``UntypedStorage.resize_`` reporting each resize of a counted storage."""
        resize = torch.UntypedStorage.resize_
        tracker = self

        def resize_(st, size):
            out = resize(st, size)
            if st in tracker.cells:  # counted (on the device type; a fake storage's device is meta)
                tracker.resized(st, st.nbytes())
            return out

        torch.UntypedStorage.resize_ = resize_
        try:
            yield self
        finally:
            torch.UntypedStorage.resize_ = resize
