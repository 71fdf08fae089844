"""Name the process group of every collective a rank issues (``schemas.PG_TAG_PREFIX``).

gloo traces carry no process group on a collective (no ``record_param_comms``), so on a 2-D
mesh the analyzer cannot tell a ``mesh_shard`` all_gather from a ``mesh_replicate`` one. While
``tag_collectives()`` is active, each collective call of this process runs inside
``torch.profiler.record_function("paritytrace::pg <pg_name>")`` (send / recv:
``"paritytrace::pg <pg_name> peer <global rank>"``), on the calling thread, so the annotation
encloses the ``c10d::*`` op the call enqueues. ``pg_name`` is the ``ProcessGroup.group_name``,
the ``pg_name`` that ``distributedInfo.pg_config`` lists with its ``pg_desc`` (``mesh_<dim>``).

What is wrapped (looked up at call time by torch 2.13's callers, so replacing the module
attribute reaches them):

- ``torch.distributed`` / ``torch.distributed.distributed_c10d``: the collectives and p2p calls
  in ``C10D_FUNCTIONS`` (FSDP2 calls ``dist.all_gather_single``, ``dist.reduce_scatter_single``
  and, for HSDP, ``dist.all_reduce``: torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py).
  Both namespaces get the same wrapper: functions inside distributed_c10d call each other
  through its globals (``all_gather_into_tensor`` -> ``all_gather_single``), and ``P2POp``
  checks ``op in [isend, irecv]`` against those globals.
- ``torch.distributed._functional_collectives``: ``FUNCOL_FUNCTIONS``, which DTensor and tensor
  parallel call as ``funcol.<name>`` (the group resolved by funcol's own
  ``_resolve_group_name``: a ProcessGroup, a DeviceMesh, (mesh, dim), ranks or a name). On the
  fake group their tag carries the call's first tensor as the c10d calls' does (``tensor_note``):
  the ``c10d::*`` op a funcol op runs takes a tensor list, which Kineto records without dtype.
- ``batch_isend_irecv``: each ``P2POp``'s ``op`` is mapped to the wrapped isend / irecv (an op
  built before ``tag_collectives`` holds the original function, which batch_isend_irecv would
  otherwise misread: it tests ``op.op is isend`` against the patched global), so each send and
  recv of the batch is tagged with its peer.

A call made inside a tagged call (distributed_c10d's own nesting) is not tagged again: one
annotation per user-level call, the outermost. No tag is opened while no profiler collects
(``torch.autograd.profiler._is_profiler_enabled``): outside the active window the wrapper
costs a dictionary lookup and a group name (bench/bench_pgtag.py measures both). Calls
through names bound before (``from torch.distributed import all_reduce``) are not reached, nor
a ``P2POp`` built inside and batched after ``tag_collectives`` (it would hold the wrapper;
torch.distributed.pipelining builds its ops per step); tests/tracer/test_mesh2d.py checks that
every c10d op of an hsdp and an fsdp2_tp record sits inside a tag. A group that cannot be
resolved (a bad argument) is passed through untagged so torch raises its own error.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from analyzer.contract.schemas import PG_TAG_PREFIX, PG_TAG_TENSOR

C10D_FUNCTIONS = (
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_single",
    "all_gather_into_tensor", "all_gather_coalesced", "_all_gather_base", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "_reduce_scatter_base", "broadcast",
    "reduce", "gather", "scatter", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "isend", "irecv",
)
"""distributed_c10d functions wrapped (those absent from the installed torch are skipped)."""
P2P_SEND = ("send", "isend")
P2P_RECV = ("recv", "irecv")
FUNCOL_FUNCTIONS = (
    "broadcast", "all_reduce", "all_reduce_inplace", "all_reduce_coalesced",
    "all_gather_single", "all_gather_single_autograd", "all_gather_single_coalesced",
    "all_gather_tensor", "all_gather_tensor_autograd", "all_gather_tensor_inplace",
    "all_gather_into_tensor_coalesced", "all_gather_inplace",
    "reduce_scatter_single", "reduce_scatter_single_autograd", "reduce_scatter_single_coalesced",
    "reduce_scatter_tensor", "reduce_scatter_tensor_autograd", "reduce_scatter_tensor_inplace",
    "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd",
    "all_to_all_inplace", "permute_tensor",
)
"""torch.distributed._functional_collectives functions wrapped (absent ones skipped)."""

_state = threading.local()


def tag_name(pg_name: str, peer: int | None = None, tensor: str = "") -> str:
    """The annotation's name: ``PG_TAG_PREFIX + pg_name`` (+ ``tensor_note``'s ``tensor``)
    (+ ``" peer <peer>"``)."""
    return PG_TAG_PREFIX + pg_name + tensor + ("" if peer is None else f" peer {peer}")


def tensor_note(args: tuple, kwargs: dict) -> str:
    """``PG_TAG_TENSOR + "<dtype> <numel>"`` of a call's first tensor argument (a list or tuple
    of tensors: the first's dtype, their summed elements; positional first, then keyword in
    call order), "" when it has none. Written on the fake process group only (``schemas.
    PG_TAG_PREFIX``: there nothing else records a tensor-list call's dtype)."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
            return f"{PG_TAG_TENSOR}{str(value[0].dtype).removeprefix('torch.')} {sum(t.numel() for t in value)}"
        if isinstance(value, (list, tuple)) and value and all(
                isinstance(x, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in x) for x in value):
            flat = [t for x in value for t in x]  # all_gather_coalesced's list of lists
            if flat:
                return f"{PG_TAG_TENSOR}{str(flat[0].dtype).removeprefix('torch.')} {sum(t.numel() for t in flat)}"
        if isinstance(value, torch.Tensor):
            return f"{PG_TAG_TENSOR}{str(value.dtype).removeprefix('torch.')} {value.numel()}"
    return ""


def _is_fake(group: Any) -> bool:
    """Whether the c10d ``group`` (None: the default group) is torch's fake process group."""
    return dist.get_backend(group) == "fake"


def _call_tagged(name: str | None, fn: Callable, args: tuple, kwargs: dict) -> Any:
    """``fn(*args, **kwargs)`` inside ``record_function(name)``; untagged when ``name`` is None,
    a tag is already open on this thread, or no profiler is collecting (the wait steps, a
    record's step 0: the annotation would go nowhere and costs a dispatcher call each way)."""
    if name is None or getattr(_state, "depth", 0) or not _profiler_enabled():
        return fn(*args, **kwargs)
    _state.depth = 1
    try:
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    finally:
        _state.depth = 0


def _profiler_enabled() -> bool:
    """torch's own fast check (torch/autograd/profiler.py, set on profiler start / stop);
    True where a torch lacks it (then every call is tagged)."""
    return getattr(torch.autograd.profiler, "_is_profiler_enabled", True)


def _c10d_group_name(group: Any) -> str:
    """``group_name`` of a c10d ``group`` argument (None: the default group)."""
    pg = c10d._get_default_group() if group is None else group
    return pg.group_name


class _Args:
    """Reads named arguments of calls to ``fn`` without ``inspect.Signature.bind`` (which
    costs more than the collective's own Python path): positions and defaults looked up once."""

    def __init__(self, fn: Callable):
        params = list(inspect.signature(fn).parameters.values())
        self.pos = {p.name: i for i, p in enumerate(params)
                    if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)}
        self.default = {p.name: None if p.default is p.empty else p.default for p in params}

    def get(self, name: str, args: tuple, kwargs: dict) -> Any:
        """The value of argument ``name`` in this call (its default when not passed)."""
        if name in kwargs:
            return kwargs[name]
        i = self.pos.get(name)
        return args[i] if i is not None and i < len(args) else self.default.get(name)


def _peer(name: str, read: _Args, args: tuple, kwargs: dict, group: Any) -> int | None:
    """Global rank of a send's destination / recv's source (None: a recv from any source)."""
    key, group_key = ("dst", "group_dst") if name in P2P_SEND else ("src", "group_src")
    peer = read.get(key, args, kwargs)
    if peer is not None:
        return int(peer)
    group_peer = read.get(group_key, args, kwargs)
    if group_peer is not None:
        pg = c10d._get_default_group() if group is None else group
        return c10d.get_global_rank(pg, int(group_peer))
    return None


def _wrap_c10d(name: str, fn: Callable) -> Callable:
    read = _Args(fn)
    p2p = name in P2P_SEND + P2P_RECV

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            group = read.get("group", args, kwargs)
            tag = tag_name(_c10d_group_name(group),
                           _peer(name, read, args, kwargs, group) if p2p else None,
                           tensor_note(args, kwargs) if _is_fake(group) else "")
        except (TypeError, ValueError, RuntimeError, AttributeError, IndexError):
            tag = None  # torch raises its own error for the bad call
        return _call_tagged(tag, fn, args, kwargs)

    wrapper.__paritytrace_original__ = fn
    return wrapper


def _fake_note(pg_name: str, args: tuple, kwargs: dict) -> str:
    """``tensor_note`` of a call on the process group registered as ``pg_name`` when it is
    torch's fake group and a profiler collects (no tag is opened otherwise), else "" (also
    for a name that does not resolve: the call keeps its plain tag)."""
    if not _profiler_enabled():
        return ""
    try:
        fake = _is_fake(c10d._resolve_process_group(pg_name))
    except (TypeError, ValueError, RuntimeError, KeyError):
        return ""
    return tensor_note(args, kwargs) if fake else ""


def _wrap_funcol(fn: Callable, resolve: Callable[[Any, str], str]) -> Callable:
    """A funcol call tagged with its group; on the fake group with its first tensor too
    (``tensor_note``): funcol's functions take their input first (``self``: all_gather's
    piece, reduce_scatter's whole buffer, all_reduce's buffer), the tensor the
    ``_c10d_functional::*`` op they call receives first (torch/distributed/
    _functional_collectives.py ``all_gather_single``, ``reduce_scatter_tensor``,
    ``all_reduce``)."""
    read = _Args(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            name = str(resolve(read.get("group", args, kwargs), read.get("tag", args, kwargs) or ""))
            tag = tag_name(name, tensor=_fake_note(name, args, kwargs))
        except (TypeError, ValueError, RuntimeError, KeyError, AttributeError, IndexError):
            tag = None
        return _call_tagged(tag, fn, args, kwargs)

    wrapper.__paritytrace_original__ = fn
    return wrapper


def _wrap_batch(fn: Callable, ops: dict[Callable, Callable]) -> Callable:
    """batch_isend_irecv with each P2POp's ``op`` mapped through ``ops`` (original or wrapper
    -> wrapper), so its isend / irecv are the tagged ones and ``op.op is isend`` holds."""

    @functools.wraps(fn)
    def wrapper(p2p_op_list):
        mapped = []
        for op in p2p_op_list:
            target = ops.get(getattr(op, "op", None))
            if target is not None and target is not op.op:
                remapped = object.__new__(type(op))  # P2POp.__new__ would re-check the op
                remapped.__dict__.update(op.__dict__)
                remapped.op = target
                op = remapped
            mapped.append(op)
        return fn(mapped)

    wrapper.__paritytrace_original__ = fn
    return wrapper


@contextlib.contextmanager
def tag_collectives() -> Iterator[None]:
    """While active, every collective call of this process is tagged (module docstring).
    Restores every replaced attribute on exit, also after an exception. Not nestable (an
    inner one would wrap the wrappers): once per process, around the training loop
    (tracer/loop.py ``train``)."""
    import torch.distributed._functional_collectives as funcol

    saved: list[tuple[Any, str, Any]] = []

    def put(module: Any, name: str, value: Any) -> None:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    try:
        ops: dict[Callable, Callable] = {}
        for name in C10D_FUNCTIONS:
            fn = getattr(c10d, name, None)
            if fn is None:
                continue
            wrapped = _wrap_c10d(name, fn)
            ops[fn] = ops[wrapped] = wrapped
            put(c10d, name, wrapped)
            if getattr(dist, name, None) is fn:
                put(dist, name, wrapped)
        batch = getattr(c10d, "batch_isend_irecv", None)
        if batch is not None:
            p2p = {k: v for k, v in ops.items() if v.__name__ in ("isend", "irecv")}
            wrapped = _wrap_batch(batch, p2p)
            put(c10d, "batch_isend_irecv", wrapped)
            if getattr(dist, "batch_isend_irecv", None) is batch:
                put(dist, "batch_isend_irecv", wrapped)
        for name in FUNCOL_FUNCTIONS:
            fn = getattr(funcol, name, None)
            if fn is not None:
                put(funcol, name, _wrap_funcol(fn, funcol._resolve_group_name))
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)
