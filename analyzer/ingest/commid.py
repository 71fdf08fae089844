"""Collective identity of communication events: kind, bytes, dtype, group size, process group.

Called by analyzer/ingest/classify.py once roles are known. The CPU side speaks first, the
kernel name last (issue 16):

kind   1. the kernel's own ``Collective name`` argument (newer Kineto copies record_param_comms'
          arguments onto the NCCL kernel),
       2. the launching ops: record_param_comms' ``Collective name``, then a ``c10d::*`` op's
          name, then an ``nccl:*`` / ``symm_mem::*`` / ``hccl:*`` / dispatch-combine op's name,
       3. the kernel name (``ncclDevKernel_AllGather...``); ``SendRecv`` -> send_recv, else other.
       An all_gather whose kernel is named Broadcast is an all_gather (torch runs uneven
       all_gathers as broadcasts).
bytes  nccl-tests (doc/PERFORMANCE.md "Bus bandwidth": all_gather and reduce_scatter count the
       total buffer, i.e. one rank's piece x the group's size; all_reduce, broadcast, all_to_all
       the buffer): 1. In / Out msg nelems x dtype size, the larger of the two (the kernel's
       own arguments, then record_param_comms'); 2. the tensor shape of the launching op:
       ``c10d::_allgather_base_`` records the output tensor first (the total),
       ``c10d::_reduce_scatter_base_`` the output piece first (x group size), ``nccl:*`` /
       ``symm_mem::*`` / ``hccl:*`` ops the input tensor (all_gather: the piece, x group size);
       3. on torch's fake process group (no transfer op: the collective is its ``c10d::*`` op,
          classify.py ``FAKE_BACKEND``), the first tensor of the tagged call (the tag's tensor
          note) on the call's first op, a ``_c10d_functional::*`` op's taken by the ``c10d::*``
          op it runs;
       4. unknown (-1): never 0, never the world size when the process group may be smaller.
group  1. the ``Group size`` argument (the kernel's own, then record_param_comms');
size   2. the size distributedInfo's pg_config gives the named process group (distinfo.py);
       3. all_gather and reduce_scatter only: the ratio of the whole buffer to one rank's piece
          when it is a whole number >= 1 (``group_from_counts``, ``group_from_tensors``): In /
          Out msg nelems (the kernel's own, then record_param_comms'), else the two tensors of
          the ``c10d::*`` op (output, input);
       4. the world size only when pg_config is present and no process group in it is smaller
          than the world (the trace proves every group is the world: ``group_fallback``);
       5. else unknown (-1): never the world size on a trace that does not prove it (a rank of
          a 16-rank job with FSDP groups of 8 and no pg_config). Bytes that need a piece x the
          group size are then unknown, and so is busbw of every kind (its factor needs n).
pg     the ``Process Group Name`` (else ``Process Group ID``) argument, the kernel's own then
       the launching ops'; else the tracer's process-group tag (``schemas.PG_TAG_PREFIX``, a
       CPU user_annotation) enclosing the enqueue op on its thread (a gloo op takes its paired
       enqueue's, a kernel its launching ops' or the tag around its launch); else, when
       pg_config lists exactly one process group, that one (the rank is in no other); else ""
       (the trace does not name it). pg_ranks likewise, else the ``ranks`` pg_config gives the
       named group. pg_desc: the ``Process Group Description`` argument as pg, else pg_config's
       ``pg_desc`` of the named group ("default_pg", "mesh_shard" ...). peer: the global rank
       a send / recv tag names (``... peer <rank>``), -1 unknown.
dtype  the kernel's own arguments, then the launching ops' (``dtype`` argument, else the op's
       first input tensor type).

Launching ops of a GPU row: the comm ops (role comm_enqueue) on the launching thread that
enclose its runtime launch (correlation id), plus those with the launch's External id. A GPU
row without a runtime launch uses its own External id only when it is unambiguous: it differs
from the row's correlation id (Kineto writes the correlation id as External id on some traces,
e.g. the DLRM set, where it names an unrelated CPU op) and exactly one comm op carries it.
"""

from __future__ import annotations

import re

import numpy as np

KIND_TOKENS = (("allreduce", "all_reduce"), ("allgather", "all_gather"),
               ("reducescatter", "reduce_scatter"), ("alltoall", "all_to_all"),
               ("all2all", "all_to_all"), ("dispatch", "all_to_all"), ("combine", "all_to_all"),
               ("broadcast", "broadcast"))
"""Kind of a non-NCCL collective op from a token anywhere in its name (``symm_mem::
multimem_all_reduce_``, ``moe::dispatch``): dispatch and combine are the two all_to_all
exchanges of expert parallelism (DeepEP ``Buffer.dispatch`` / ``Buffer.combine``)."""


def kind_in_text(text: str) -> str:
    """Collective kind from a token anywhere in ``text`` (``KIND_TOKENS``), "other" when none."""
    t = text.lower().replace("_", "")
    for token, kind in KIND_TOKENS:
        if token in t:
            return kind
    return "other"


def total_bytes(op_name: str, kind: str | None, numel: int, elem_bytes: int, group: int) -> int:
    """nccl-tests bytes of a collective from the first tensor an op records (module docstring);
    -1 when the shape, dtype or a needed group size is unknown."""
    if numel < 0 or elem_bytes < 0:
        return -1
    total = numel * elem_bytes
    c10d = op_name.startswith("c10d::")
    # c10d ops take (output, input): all_gather's output is the total, reduce_scatter's the
    # piece; nccl:* / gloo:* / symm_mem / hccl ops record the input: the reverse
    piece = (kind == "all_gather" and not c10d) or (kind == "reduce_scatter" and c10d)
    if piece:
        if group <= 0:
            return -1
        total *= group
    return total


_DTYPE_NAMES = {"float": "Float", "float32": "Float", "double": "Double", "float64": "Double",
                "half": "Half", "float16": "Half", "bfloat16": "BFloat16", "long": "Long",
                "long int": "Long", "int64": "Long", "int": "Int", "int32": "Int",
                "short": "Short", "int16": "Short", "char": "Char", "signed char": "Char",
                "int8": "Char", "byte": "Byte", "unsigned char": "Byte", "uint8": "Byte",
                "bool": "Bool"}


def dtype_name(text: str | None) -> str | None:
    """torch's ScalarType name of a dtype as traces spell it (``float``, ``c10::BFloat16``,
    ``long int`` -> ``Float``, ``BFloat16``, ``Long``); others without ``c10::``; None stays."""
    if text is None:
        return None
    t = str(text).removeprefix("c10::").strip()
    return _DTYPE_NAMES.get(t.lower(), t)


def group_fallback(pg_sizes: dict[str, int] | None, world_size: int | None) -> int:
    """The group size to assume for a collective nothing else sizes (module docstring, rule 4):
    the world size when pg_config is present (``pg_sizes``: pg name -> size, non-empty) and
    none of its groups is smaller than the world; else -1 (unknown). No pg_config proves
    nothing: torch's older profilers write none, whatever the job's groups."""
    if not world_size or world_size <= 0 or not pg_sizes:
        return -1
    if min(pg_sizes.values()) < world_size:
        return -1
    return int(world_size)


def _whole_ratio(whole: int, piece: int) -> int:
    """``whole / piece`` when both are known (>= 0), piece > 0 and it divides whole, else -1."""
    if whole < 0 or piece <= 0 or whole < piece or whole % piece:
        return -1
    return int(whole // piece)


def group_from_counts(kind: str | None, in_nelems: int, out_nelems: int) -> int:
    """Group size of an all_gather (out / in) or reduce_scatter (in / out) from a collective's
    In / Out msg nelems (element counts; -1 unknown): one rank's piece is 1 / n of the whole
    buffer. -1 for other kinds, unknown counts or a ratio that is not a whole number >= 1."""
    if kind == "all_gather":
        return _whole_ratio(out_nelems, in_nelems)
    if kind == "reduce_scatter":
        return _whole_ratio(in_nelems, out_nelems)
    return -1


def group_from_tensors(op_name: str, kind: str | None, first_numel: int, second_numel: int
                       ) -> int:
    """Group size from the first two tensors (elements, -1 unknown) a ``c10d::*`` op records,
    (output, input): ``_allgather_base_`` whole / piece, ``_reduce_scatter_base_`` piece /
    whole. -1 for other ops (``nccl:*`` / ``gloo:*`` record one tensor) and as
    ``group_from_counts``."""
    if not op_name.startswith("c10d::"):
        return -1
    return group_from_counts(kind, second_numel, first_numel)


def launching_ops(launch_row: int, ext_i: int, corr_i: int, enq_cols, ext, ts, end, tid
                  ) -> list[int]:
    """Comm ops that launched a GPU row (module docstring), innermost first.

    ``enq_cols`` = (rows, ext, ts, end, tid code) of the comm_enqueue rows; ``ext``, ``ts``,
    ``end``, ``tid`` are the whole table's columns."""
    rows, e_ext, e_ts, e_end, e_tid = enq_cols
    if launch_row >= 0:
        t0, t1, th = ts[launch_row], end[launch_row], tid[launch_row]
        hit = rows[(e_ts <= t0) & (e_end >= t1) & (e_tid == th)]
        out = sorted(hit.tolist(), key=lambda j: (-ts[j], end[j]))  # innermost first
        if ext[launch_row] >= 0:
            out += rows[e_ext == ext[launch_row]].tolist()
        return list(dict.fromkeys(out))
    if ext_i < 0 or ext_i == corr_i:
        return []
    same = rows[e_ext == ext_i]
    if len(same) != 1:
        return []
    j = int(same[0])
    # the op and its nest on its thread (the c10d op around record_param_comms, nccl:* inside)
    nest = rows[(e_tid == tid[j]) & (((e_ts <= ts[j]) & (e_end >= end[j]))
                                     | ((e_ts >= ts[j]) & (e_end <= end[j])))]
    return list(dict.fromkeys([j, *sorted(nest.tolist(), key=lambda k: (-ts[k], end[k]))]))


def ops_enclosing(op_rows: np.ndarray, cand_rows: np.ndarray, ts, end, tid) -> np.ndarray:
    """For each row of ``cand_rows`` (runtime launches), the innermost row of ``op_rows`` on the
    same thread enclosing it, -1 when none. Per thread: candidates sorted by start, each op's
    [start, end] found by binary search."""
    out = np.full(len(cand_rows), -1, np.int64)
    if not len(op_rows) or not len(cand_rows):
        return out
    order = np.lexsort((ts[cand_rows], tid[cand_rows]))
    c = cand_rows[order]
    c_tid, c_ts = tid[c], ts[c]
    # outer ops first, so inner ones overwrite them
    for j in sorted(op_rows.tolist(), key=lambda k: (ts[k], -end[k])):
        a = np.searchsorted(c_tid, tid[j], "left")
        b = np.searchsorted(c_tid, tid[j], "right")
        lo = a + np.searchsorted(c_ts[a:b], ts[j], "left")
        hi = a + np.searchsorted(c_ts[a:b], end[j], "right")
        sel = np.arange(lo, hi)
        sel = sel[end[c[sel]] <= end[j]]
        out[order[sel]] = j
    return out


NCCL_KERNEL_RE = re.compile(r"^nccl.*kernel|^nccl::", re.IGNORECASE)
"""NCCL kernels: HTA hta/utils/utils.py ``^nccl.*Kernel``, made case-insensitive (lower-case
``nccldevkernel_...`` names) and extended to ``nccl::Allreduce``-style names."""
DEEP_EP_KERNEL_RE = re.compile(r"deep_ep::", re.IGNORECASE)
"""DeepEP's dispatch / combine kernels (``deep_ep::intranode::dispatch<...>``): an all_to_all."""
DISPATCH_OP_RE = re.compile(
    r"^(?!(?:aten|prim|c10d|profiler|cuda|autograd)::)[A-Za-z_][\w.]*::"
    r"(?:\w*_)?(?:dispatch|combine|all_?to_?all|all2all)(?:_\w*)?$", re.IGNORECASE)
"""Custom expert-parallel ops (``moe::dispatch``, ``ep::low_latency_combine``,
``mylib::all_to_all_single``): a namespaced op (not aten / prim / c10d / profiler / cuda /
autograd) whose last name part is dispatch / combine / all_to_all."""
