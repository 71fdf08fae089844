"""Memory per rank by category (``memory_categories.parquet``, MEMORY_CATEGORIES_SCHEMA): what
the rank holds, counted from its own tensors and the allocator, never from the profiler window.

Bytes are those of the distinct storages behind the tensors (``storage_bytes``): a view counts
its whole storage once, so FSDP1's flat-parameter shard counts with its padding however many
original parameters view it, and FSDP2's padded Shard(0) buffer counts in full behind the
DTensor's unpadded local view. The rules per category are in analyzer/contract/schemas.py.
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa
import torch
from torch import nn

from analyzer.contract.schemas import MEMORY_CATEGORIES_SCHEMA
from tracer.numerics import rows_to_table


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding ``t``'s data on this rank: a DTensor's local tensor (FSDP2 and TP
    shards, counted by what the rank holds), a functional collective's AsyncCollectiveTensor's
    result (TP outputs: a wrapper without a storage of its own), any other tensor itself.
    Wrapper subclasses are unwrapped through ``__tensor_flatten__`` (their first inner tensor)."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    while is_traceable_wrapper_subclass(t):
        inner = getattr(t, t.__tensor_flatten__()[0][0], None)
        if not isinstance(inner, torch.Tensor):
            break
        t = inner
    return t


def _storage_key(t: torch.Tensor) -> tuple[str, int, int] | None:
    """(device, storage data pointer, storage bytes) of ``t``; None for a tensor without a
    storage of its own data (a size-0 storage, a meta tensor). A fake tensor (``tracer project
    --fake-tensors``) has no data pointer (0 for all): its storage object's address instead."""
    from torch._subclasses.fake_tensor import FakeTensor

    t = _local(t)
    st = t.untyped_storage()
    nbytes = st.nbytes()
    if nbytes == 0 or t.device.type == "meta":
        return None
    return str(t.device), st._cdata if isinstance(t, FakeTensor) else st.data_ptr(), nbytes


def storage_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (None skipped; a DTensor: its local
    tensor's storage). Two tensors viewing one storage count it once."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if t is None:
            continue
        key = _storage_key(t)
        if key is not None:
            seen[key[:2]] = key[2]
    return sum(seen.values())


def parameter_bytes(model: nn.Module) -> int:
    """Bytes of the parameters the rank holds now (at rest: the local shards of FSDP)."""
    return storage_bytes(p.detach() for p in model.parameters())


def gradient_bytes(model: nn.Module) -> int:
    """Bytes of the parameters' ``.grad`` tensors the rank holds now."""
    return storage_bytes(p.grad for p in model.parameters())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``opt.state`` (AdamW: exp_avg, exp_avg_sq, step)."""
    return storage_bytes(v for state in opt.state.values() for v in state.values()
                         if isinstance(v, torch.Tensor))


def _span_bytes(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) in bytes of the part of its storage ``t`` reaches (offset, sizes, strides)."""
    elem = t.element_size()
    start = t.storage_offset() * elem
    if t.numel() == 0:
        return start, start
    reach = 1 + sum((n - 1) * abs(st) for n, st in zip(t.shape, t.stride()))
    return start, start + reach * elem


class SavedActivations:
    """Context manager counting the tensors autograd saves for backward inside it
    (``torch.autograd.graph.saved_tensors_hooks``): ``bytes`` = per distinct storage, the part
    the saved tensors reach (from the lowest start to the highest end of their views: a rank's
    slice of the global batch counts its rows, not the whole batch's storage, which every rank
    of a real job would not hold), parameters and views of parameters (a weight's transpose)
    left out. The tensors are saved unchanged; only their storages are noted (keys, not
    references: nothing is kept alive)."""

    def __init__(self) -> None:
        self._storages: dict[tuple[str, int], tuple[int, int]] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t._base if t._base is not None else t
        if not isinstance(base, nn.Parameter) and not isinstance(t, nn.Parameter):
            key = _storage_key(t)
            if key is not None:
                lo, hi = _span_bytes(_local(t))
                old = self._storages.get(key[:2])
                self._storages[key[:2]] = (lo, hi) if old is None else (min(old[0], lo),
                                                                        max(old[1], hi))
        return t

    @property
    def bytes(self) -> int:
        """Bytes of the distinct non-parameter storages saved so far, the parts reached."""
        return sum(hi - lo for lo, hi in self._storages.values())

    def __enter__(self) -> "SavedActivations":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def peak_from_steps(step_rows: list[dict]) -> tuple[int | None, int | None]:
    """(allocated, reserved) CUDA peak bytes from STEPS_SCHEMA rows (peaks reset at each step's
    start): the maxima over the steps after step 0, step 0's when it is the only step; None on
    CPU (no CUDA column)."""
    rows = [r for r in step_rows if r["step"] > 0] or step_rows
    alloc = [r["cuda_max_allocated_bytes"] for r in rows if r["cuda_max_allocated_bytes"] is not None]
    res = [r["cuda_max_reserved_bytes"] for r in rows if r["cuda_max_reserved_bytes"] is not None]
    return (max(alloc) if alloc else None, max(res) if res else None)


def category_table(rank: int, *, parameters: int, gradients: int, optimizer_state: int,
                   activations: int, cuda_peak: tuple[int | None, int | None]) -> pa.Table:
    """The rank's MEMORY_CATEGORIES_SCHEMA rows: the four measured categories and the peak
    (CUDA: ``cuda_peak`` (allocated, reserved); CPU, ``cuda_peak[0]`` None: their sum)."""
    rows = [{"rank": rank, "category": c, "bytes": int(b), "reserved_bytes": None, "source": s}
            for c, b, s in (("parameters", parameters, "tensors"),
                            ("gradients", gradients, "tensors"),
                            ("optimizer_state", optimizer_state, "tensors"),
                            ("activations", activations, "saved_tensors_hooks"))]
    alloc, reserved = cuda_peak
    if alloc is None:
        peak = {"bytes": parameters + gradients + optimizer_state + activations,
                "reserved_bytes": None, "source": "sum_of_categories"}
    else:
        peak = {"bytes": int(alloc), "reserved_bytes": None if reserved is None else int(reserved),
                "source": "cuda_max_allocated"}
    rows.append({"rank": rank, "category": "peak", **peak})
    return rows_to_table(rows, MEMORY_CATEGORIES_SCHEMA)


def finish_steps(export, step_rows: list[dict], held: dict[str, int], rank: int) -> pa.Table:
    """After the profiled loop (tracer/loop.py ``train``): the trace was exported
    (else ``RuntimeError``), each profiled step gets the profiler window's allocated peak, and
    the rank's memory by category (MEMORY_CATEGORIES_SCHEMA) is returned."""
    if not export.exported:
        raise RuntimeError("profiler never exported its trace (schedule longer than the run?)")
    peaks = export.allocated_peaks
    for row in step_rows:
        if row["profiled"]:
            row["profiler_allocated_peak_bytes"] = peaks.get(row["step"])
    return category_table(rank, **held, cuda_peak=peak_from_steps(step_rows))
