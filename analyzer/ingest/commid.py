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


def total_bytes_cols(c10d: np.ndarray, all_gather: np.ndarray, reduce_scatter: np.ndarray,
                     numel: np.ndarray, elem_bytes: np.ndarray, group: np.ndarray) -> np.ndarray:
    """nccl-tests bytes of collectives from the first tensor an op records (module docstring),
    one per row of the (equal-length) columns: ``c10d`` (the op's name starts ``c10d::``),
    ``all_gather`` / ``reduce_scatter`` (the collective's kind), ``numel`` (elements),
    ``elem_bytes``, ``group`` (group size); int64, -1 where the shape, dtype or a needed group
    size is unknown, or the bytes would not fit int64 (a crafted trace: never wrapped)."""
    numel, elem_bytes = np.asarray(numel, np.int64), np.asarray(elem_bytes, np.int64)
    group = np.asarray(group, np.int64)
    top = np.iinfo(np.int64).max
    fits = (numel >= 0) & (elem_bytes >= 0) & (numel <= top // np.maximum(elem_bytes, 1))
    total = np.where(fits, numel * np.where(fits, elem_bytes, 0), -1)
    # c10d ops take (output, input): all_gather's output is the total, reduce_scatter's the
    # piece; nccl:* / gloo:* / symm_mem / hccl ops record the input: the reverse
    piece = (all_gather & ~c10d) | (reduce_scatter & c10d)
    whole = (group > 0) & (total >= 0) & (total <= top // np.maximum(group, 1))
    total = np.where(piece, np.where(whole, total * np.where(whole, group, 0), -1), total)
    return total.astype(np.int64)


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


def _whole_ratio(whole: np.ndarray, piece: np.ndarray) -> np.ndarray:
    """``whole / piece`` where both are known (>= 0), piece > 0 and it divides whole, else -1."""
    ok = (whole >= 0) & (piece > 0) & (whole >= piece)
    piece = np.where(ok, piece, 1)
    ok &= whole % piece == 0
    return np.where(ok, whole // piece, -1).astype(np.int64)


def group_from_counts_cols(all_gather: np.ndarray, reduce_scatter: np.ndarray,
                           in_nelems: np.ndarray, out_nelems: np.ndarray) -> np.ndarray:
    """Group size of an all_gather (out / in) or reduce_scatter (in / out) from a collective's
    In / Out msg nelems (element counts; -1 unknown), per row of the columns (``all_gather`` /
    ``reduce_scatter``: the kind): one rank's piece is 1 / n of the whole buffer. int64, -1 for
    other kinds, unknown counts or a ratio that is not a whole number >= 1."""
    in_nelems, out_nelems = np.asarray(in_nelems, np.int64), np.asarray(out_nelems, np.int64)
    whole = np.where(all_gather, out_nelems, in_nelems)
    piece = np.where(all_gather, in_nelems, out_nelems)
    return np.where(all_gather | reduce_scatter, _whole_ratio(whole, piece), -1).astype(np.int64)


def group_from_tensors_cols(c10d: np.ndarray, all_gather: np.ndarray,
                            reduce_scatter: np.ndarray, first_numel: np.ndarray,
                            second_numel: np.ndarray) -> np.ndarray:
    """Group size from the first two tensors (elements, -1 unknown) a ``c10d::*`` op records,
    (output, input): ``_allgather_base_`` whole / piece, ``_reduce_scatter_base_`` piece /
    whole, per row of the columns. -1 for other ops (``c10d`` False: ``nccl:*`` / ``gloo:*``
    record one tensor) and as ``group_from_counts_cols``."""
    return np.where(c10d, group_from_counts_cols(all_gather, reduce_scatter, second_numel,
                                                 first_numel), -1).astype(np.int64)


def total_bytes(op_name: str, kind: str | None, numel: int, elem_bytes: int, group: int) -> int:
    """``total_bytes_cols`` of one op (``kind``: the collective's kind, None unknown)."""
    return int(total_bytes_cols(np.array(op_name.startswith("c10d::")),
                                np.array(kind == "all_gather"), np.array(kind == "reduce_scatter"),
                                np.array(numel), np.array(elem_bytes), np.array(group)))


def group_from_counts(kind: str | None, in_nelems: int, out_nelems: int) -> int:
    """``group_from_counts_cols`` of one collective of kind ``kind``."""
    return int(group_from_counts_cols(np.array(kind == "all_gather"),
                                      np.array(kind == "reduce_scatter"), np.array(in_nelems),
                                      np.array(out_nelems)))


def group_from_tensors(op_name: str, kind: str | None, first_numel: int, second_numel: int
                       ) -> int:
    """``group_from_tensors_cols`` of one op named ``op_name``."""
    return int(group_from_tensors_cols(np.array(op_name.startswith("c10d::")),
                                       np.array(kind == "all_gather"),
                                       np.array(kind == "reduce_scatter"), np.array(first_numel),
                                       np.array(second_numel)))


def _segments(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(segment of each item, offset of each item in its segment) of consecutive segments of
    ``counts`` items (int64, >= 0)."""
    seg = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    starts = np.cumsum(counts) - counts
    return seg, np.arange(len(seg), dtype=np.int64) - starts[seg]


def _by_thread(rows: np.ndarray, ts, tid) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``rows`` sorted by (thread, start, row), with each thread's [first, last) slice:
    (sorted rows, distinct threads, slice starts + final end)."""
    o = rows[np.lexsort((rows, ts[rows], tid[rows]))]
    threads, first = np.unique(tid[o], return_index=True)
    return o, threads, np.append(first, len(o))


def enclosing_pairs(op_rows: np.ndarray, q_ts: np.ndarray, q_end: np.ndarray,
                    q_tid: np.ndarray, ts, end, tid) -> tuple[np.ndarray, np.ndarray]:
    """Every (query, op) pair where a row of ``op_rows`` on the query's thread encloses the
    query: op start <= ``q_ts`` and op end >= ``q_end`` (ns; both bounds inclusive).

    Returns (query index into ``q_ts``, op row), int64, in no particular order. Ops are cut by
    duration (powers of two) and sorted by (thread, start) within each class: an op of
    duration <= D that ends at or after ``q_end`` starts at or after ``q_end - D``, so each
    query reads one window of starts per class (binary search), and the time is about
    linear in the pairs found instead of queries x ops."""
    none = np.zeros(0, np.int64)
    if not len(op_rows) or not len(q_ts):
        return none, none
    dur = end[op_rows] - ts[op_rows]
    # class = bit length of the duration (0 for <= 0): a window of one class holds only ops
    # within a factor 2 of its longest
    cls = np.zeros(len(op_rows), np.int64)
    pos = dur > 0
    cls[pos] = np.frexp(dur[pos].astype(np.float64))[1]
    q_order = np.lexsort((np.arange(len(q_ts)), q_tid))
    q_threads, q_first = np.unique(q_tid[q_order], return_index=True)
    q_first = np.append(q_first, len(q_order))
    out_q, out_op = [], []
    for c in np.unique(cls).tolist():
        in_c = op_rows[cls == c]
        d_max = (end[in_c] - ts[in_c]).max()
        o, threads, first = _by_thread(in_c, ts, tid)
        for k, th in enumerate(threads.tolist()):
            t = np.searchsorted(q_threads, th)
            if t >= len(q_threads) or q_threads[t] != th:
                continue
            qs = q_order[q_first[t]:q_first[t + 1]]
            g = o[first[k]:first[k + 1]]
            g_ts = ts[g]
            lo = np.searchsorted(g_ts, q_end[qs] - d_max, "left")
            hi = np.searchsorted(g_ts, q_ts[qs], "right")
            seg, off = _segments(np.maximum(hi - lo, 0))
            cand = g[lo[seg] + off]
            keep = end[cand] >= q_end[qs[seg]]
            out_q.append(qs[seg[keep]])
            out_op.append(cand[keep])
    if not out_q:
        return none, none
    return np.concatenate(out_q).astype(np.int64), np.concatenate(out_op).astype(np.int64)


def enclosed_pairs(op_rows: np.ndarray, q_ts: np.ndarray, q_end: np.ndarray, q_tid: np.ndarray,
                   ts, end, tid) -> tuple[np.ndarray, np.ndarray]:
    """Every (query, op) pair where the query encloses a row of ``op_rows`` on its thread: op
    start >= ``q_ts`` and op end <= ``q_end`` (inclusive). Returns (query index, op row), int64,
    in no particular order; per thread a window of starts by binary search."""
    none = np.zeros(0, np.int64)
    if not len(op_rows) or not len(q_ts):
        return none, none
    # an op ending by q_end starts by q_end - (its duration): by q_end unless a duration < 0
    slack = max(0, -int((end[op_rows] - ts[op_rows]).min()))
    o, threads, first = _by_thread(op_rows, ts, tid)
    out_q, out_op = [], []
    for k, th in enumerate(threads.tolist()):
        qs = np.flatnonzero(q_tid == th)
        if not len(qs):
            continue
        g = o[first[k]:first[k + 1]]
        g_ts = ts[g]
        lo = np.searchsorted(g_ts, q_ts[qs], "left")
        hi = np.searchsorted(g_ts, q_end[qs] + slack, "right")
        seg, off = _segments(np.maximum(hi - lo, 0))
        cand = g[lo[seg] + off]
        keep = end[cand] <= q_end[qs[seg]]
        out_q.append(qs[seg[keep]])
        out_op.append(cand[keep])
    if not out_q:
        return none, none
    return np.concatenate(out_q).astype(np.int64), np.concatenate(out_op).astype(np.int64)


def _same_key(keys: np.ndarray, rows: np.ndarray, queries: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
    """Every (query index, row) pair where ``keys`` (of ``rows``) equals the query, rows in
    ascending order within a query. int64."""
    o = np.lexsort((rows, keys))
    k, r = keys[o], rows[o]
    lo = np.searchsorted(k, queries, "left")
    hi = np.searchsorted(k, queries, "right")
    seg, off = _segments(hi - lo)
    return seg, r[lo[seg] + off]


def _ordered_unique(seg: np.ndarray, rows: np.ndarray, *keys: np.ndarray, n: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Pairs (segment, row) sorted by segment then ``keys`` (the first key sorts first; ties
    by the order given), a row kept once per segment at its first place. Returns (segment
    offsets, length ``n`` + 1; rows)."""
    order = np.lexsort((np.arange(len(seg)), *keys[::-1], seg))
    seg, rows = seg[order], rows[order]
    place = np.arange(len(seg))
    first = np.lexsort((place, rows, seg))  # by (segment, row), first place first
    dup = np.zeros(len(seg), bool)
    same = (seg[first][1:] == seg[first][:-1]) & (rows[first][1:] == rows[first][:-1])
    dup[first[1:][same]] = True
    seg, rows = seg[~dup], rows[~dup]
    return np.searchsorted(seg, np.arange(n + 1)), rows


def launching_ops(launch: np.ndarray, ext_k: np.ndarray, corr_k: np.ndarray,
                  enq_rows: np.ndarray, ext, ts, end, tid) -> tuple[np.ndarray, np.ndarray]:
    """Comm ops that launched each of K GPU rows (module docstring), innermost first.

    ``launch``, ``ext_k``, ``corr_k``: each GPU row's runtime launch row (-1 none), External
    id and correlation id (-1 none); ``enq_rows``: the comm_enqueue rows; ``ext``, ``ts``,
    ``end`` (ns), ``tid`` (codes): the whole table's columns. Returns (offsets, K + 1; rows):
    GPU row k's ops are ``rows[offsets[k]:offsets[k + 1]]``.

    With a launch: the ops on its thread enclosing it, innermost first (latest start, then
    earliest end, then row), then those with its External id (row order), each once. Without
    one: the only op carrying the row's own External id when that is not its correlation id,
    then the op's nest on its thread (the ops enclosing it or inside it: the c10d op around
    record_param_comms, nccl:* inside), innermost first."""
    k_n = len(launch)
    enq_rows = np.asarray(enq_rows, np.int64)
    empty = np.zeros(0, np.int64)
    if not k_n or not len(enq_rows):
        return np.zeros(k_n + 1, np.int64), empty
    parts_seg, parts_row, parts_keys = [], [], []
    # launched: the enclosing ops (part 0) then the External id's (part 1)
    kl = np.flatnonzero(launch >= 0)
    lr = launch[kl]
    q, j = enclosing_pairs(enq_rows, ts[lr], end[lr], tid[lr], ts, end, tid)
    parts_seg.append(kl[q]), parts_row.append(j)
    parts_keys.append((np.zeros(len(j), np.int64), -ts[j], end[j]))
    with_ext = np.flatnonzero(ext[lr] >= 0)
    q, j = _same_key(ext[enq_rows], enq_rows, ext[lr[with_ext]])
    parts_seg.append(kl[with_ext[q]]), parts_row.append(j)
    zero = np.zeros(len(j), np.int64)
    parts_keys.append((zero + 1, zero, zero))
    # not launched: the only op with the row's own External id, then its nest (per distinct op)
    kx = np.flatnonzero((launch < 0) & (ext_k >= 0) & (ext_k != corr_k))
    if len(kx):
        e_ext = np.sort(ext[enq_rows])
        cnt = np.searchsorted(e_ext, ext_k[kx], "right") - np.searchsorted(e_ext, ext_k[kx])
        kx = kx[cnt == 1]
        q, j = _same_key(ext[enq_rows], enq_rows, ext_k[kx])
        op = np.empty(len(kx), np.int64)
        op[q] = j
        ops, op_code = np.unique(op, return_inverse=True)
        q1, n1 = enclosing_pairs(enq_rows, ts[ops], end[ops], tid[ops], ts, end, tid)
        q2, n2 = enclosed_pairs(enq_rows, ts[ops], end[ops], tid[ops], ts, end, tid)
        nest_q, nest = np.concatenate([q1, q2]), np.concatenate([n1, n2])
        # each GPU row takes its op's nest: pairs (GPU row, nest op)
        by_op = np.argsort(nest_q, kind="stable")
        nest_q, nest = nest_q[by_op], nest[by_op]
        lo = np.searchsorted(nest_q, op_code, "left")
        hi = np.searchsorted(nest_q, op_code, "right")
        seg, off = _segments(hi - lo)
        j = nest[lo[seg] + off]
        parts_seg += [kx, kx[seg]]
        parts_row += [op, j]
        zero = np.zeros(len(kx), np.int64)
        parts_keys += [(zero, zero, zero), (np.ones(len(j), np.int64), -ts[j], end[j])]
    seg = np.concatenate(parts_seg)
    rows = np.concatenate(parts_row)
    keys = [np.concatenate([p[i] for p in parts_keys]) for i in range(3)]
    # ties of (part, -start, end) go to the smaller row
    return _ordered_unique(seg, rows, *keys, rows, n=k_n)


def ops_enclosing(op_rows: np.ndarray, cand_rows: np.ndarray, ts, end, tid) -> np.ndarray:
    """For each row of ``cand_rows`` (runtime launches), the innermost row of ``op_rows`` on the
    same thread enclosing it (start <= its start, end >= its end, its start <= the op's end),
    -1 when none. Innermost:
    the latest start, then the earliest end, then the later place in ``op_rows``. int64, the
    length of ``cand_rows``; all pairs at once (``enclosing_pairs``)."""
    out = np.full(len(cand_rows), -1, np.int64)
    if not len(op_rows) or not len(cand_rows):
        return out
    op_rows = np.asarray(op_rows, np.int64)
    place = np.empty(int(op_rows.max()) + 1, np.int64)
    place[op_rows] = np.arange(len(op_rows))  # a row listed twice: its later place
    q, j = enclosing_pairs(op_rows, ts[cand_rows], end[cand_rows], tid[cand_rows], ts, end, tid)
    starts_in = ts[cand_rows[q]] <= end[j]  # only a negative duration starts after the op ends
    q, j = q[starts_in], j[starts_in]
    order = np.lexsort((place[j], -end[j], ts[j], q))
    q, j = q[order], j[order]
    last = np.append(q[1:] != q[:-1], True) if len(q) else np.zeros(0, bool)
    out[q[last]] = j[last]
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
