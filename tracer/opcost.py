"""The compute estimate of a projection run on fake tensors (issue 44; tracer/fakeproject.py).

``OpCost``, a dispatch mode, counts each operator's calls, FLOPs and bytes in a role's profiled
steps; its rows estimate the operator's time on a target device given by two assumed figures,
as a roofline: max(FLOPs / peak FLOP/s, bytes / memory bandwidth) (Williams, Waterman and
Patterson, "Roofline", CACM 2009; torch/distributed/_tools/runtime_estimator.py's
``_roofline_estimate`` takes the same max, from its datasheet figures of CUDA devices only).
FLOPs: torch/utils/flop_counter.py ``flop_registry``, the formulas ``FlopCounterMode`` uses
(matmuls, convolutions, attention; an operator without a formula counts 0 FLOPs and its bytes
only). Bytes: each distinct tensor argument and result read or written once (no cache, no
fusion): an upper bound where an op returns a buffer it does not fill (FSDP2's
``all_gather_copy_in`` allocates the all_gather's output).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode


class OpCost(TorchDispatchMode):
    """Per operator (``aten`` overload packet name), in the profiled steps of one role: calls,
    FLOPs (``flop_registry``; 0 for an operator it has no formula for) and bytes (its distinct
    tensor arguments' and results' bytes: each read or written once, no cache; none for views,
    allocations, ``NO_TRAFFIC``) per step.
    Collectives and metadata reads (``NOT_COMPUTE`` namespaces) are left out. ``step``: set by the step wrapper before each step's forward (ops until the
    next one, the optimizer's included, count to it); None: not counted."""

    NOT_COMPUTE = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor", "prim")
    """Collectives' namespaces, and ``prim`` (a tensor's metadata read: ``prim::device``)."""
    NO_TRAFFIC = frozenset({"empty", "empty_like", "empty_strided", "new_empty",
                            "new_empty_strided", "set_", "resize_", "resize_storage_bytes_",
                            "detach", "alias", "lift_fresh", "_local_scalar_dense"})
    """Operators that allocate or relabel storage without reading or writing its bytes (views
    too: ``OpOverload.is_view``); they count no bytes."""

    def __init__(self, profiled: range):
        super().__init__()
        self.profiled, self.step = profiled, None
        self.live = None  # a tracer/livebytes.py LiveBytes, handed every op's results
        self.ops: dict[str, list[int]] = {}  # name -> [calls, flops, bytes]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(issubclass(t, DTensor) for t in types):
            # A mode sees an op before the tensor subclasses do: a DTensor op here has the
            # global shapes (AdamW's step on FSDP2's sharded parameters: W times the rank's
            # bytes). NotImplemented lets DTensor run it as local ops, which come back here
            # (torch/distributed/_tools/mem_tracker.py ``MemTracker`` does the same).
            return NotImplemented
        if func.namespace == "profiler":  # record_function's own ops: the annotation itself
            return func(*args, **kwargs)
        # The profiler recorded this op as it was called (the dispatcher's RecordFunction,
        # before the Python mode key); the re-dispatch below (this mode, then FakeTensorMode,
        # then its meta or fake-group kernel) would record it again, nested, once per level:
        # the analyzer would count a collective three times. A real op is recorded once.
        torch._C._autograd._enable_record_function(False)
        try:
            out = func(*args, **kwargs)
        finally:
            torch._C._autograd._enable_record_function(True)
        if self.live is not None:
            self.live.add(out, self.step)
        if self.step in self.profiled and func.namespace not in self.NOT_COMPUTE:
            self._count(func, args, kwargs, out)
        return out

    def _count(self, func, args, kwargs, out) -> None:
        from torch.utils._pytree import tree_flatten
        from torch.utils.flop_counter import flop_registry

        flops = 0
        packet = func._overloadpacket
        if packet in flop_registry:  # as FlopCounterMode._count_flops calls it (shapes taken inside)
            flops = int(flop_registry[packet](*args, **kwargs, out_val=out))
        if func.is_view or packet.__name__ in self.NO_TRAFFIC:
            moved = 0
        else:  # each distinct tensor once (an in-place op's result is its argument)
            moved = sum(t.numel() * t.element_size() for t in
                        {id(t): t for t in tree_flatten((args, kwargs, out))[0]
                         if isinstance(t, torch.Tensor)}.values())
        row = self.ops.setdefault(f"{func.namespace}::{packet.__name__}", [0, 0, 0])
        row[0] += 1
        row[1] += flops
        row[2] += moved

    def rows(self, rank: int, options) -> list[dict[str, Any]]:
        """``schemas.OpEstimate`` rows, per step (the profiled steps' mean), largest time or
        FLOPs first."""
        n = max(1, len(self.profiled))
        out = []
        for op, (calls, flops, moved) in self.ops.items():
            est = None
            if options.device_tflops is not None:
                est = round(max(flops / n / (options.device_tflops * 1e12),
                                moved / n / (options.device_mem_gbps * 1e9)) * 1e9)
            out.append({"rank": rank, "op": op, "calls_per_step": calls // n,
                        "flops_per_step": flops // n, "bytes_per_step": moved // n,
                        "estimated_ns_per_step": est})
        out.sort(key=lambda r: (-(r["estimated_ns_per_step"] or 0), -r["flops_per_step"], r["op"]))
        return out
