"""The collective-identity stage as it was at 8821002, one row at a time: the oracle that
tests/analyzer/test_commid_vectorized.py compares the vectorized stage with
(analyzer/ingest/commid.py ``launching_ops`` / ``ops_enclosing``, analyzer/ingest/classify.py
``_Identity``, ``_comm_kernels``, ``_gloo_ops``, ``_fake_calls``). Kept here only as the
reference: its ``launching_ops`` scans every comm enqueue row once per GPU comm row (quadratic
in the steps of a trace). ``old_identity()`` runs ``classify.classify`` with it.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pandas as pd

from analyzer.ingest import classify as C
from analyzer.ingest import commid
from analyzer.ingest.classify import _GLOO_FOR_C10D, _KIND, _RULE, _ROLE, KINDS, ROLES, \
    RULES, _Events, _used_categories
from analyzer.ingest.decode import str_array


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


def _kind_from_ops(src, arg_kind, name_kind, is_c10d) -> int:
    """Kind code from the launching ops ``src``: a ``Collective name`` argument first, then a
    ``c10d::*`` op's name, then any op's name (``nccl:*``, ``symm_mem::*`` ...); -1 when none
    says (analyzer/ingest/commid.py)."""
    for j in src:
        if arg_kind[j] >= 0:
            return int(arg_kind[j])
    for j in src:
        if is_c10d[j] and name_kind[j] >= 0:
            return int(name_kind[j])
    for j in src:
        if name_kind[j] >= 0:
            return int(name_kind[j])
    return -1


def _comm_kernels(e: _Events, launch: np.ndarray, ident: "OldIdentity") -> None:
    """Every GPU comm row: an NCCL kernel's kind (gpu.nccl_kernel.args: its own ``Collective
    name``, as newer Kineto copies record_param_comms' args onto it; gpu.nccl_kernel.launch: its
    launching ops' (``_kind_from_ops``: the CPU side first, analyzer/ingest/commid.py); else, rule
    gpu.nccl_kernel, its name's), then its identity from its launching enqueue ops
    (``_Identity.kernel``)."""
    kernels = np.flatnonzero(e.gpu & (e.role == _ROLE["comm"]))
    if not len(kernels):
        return
    enq_idx = np.flatnonzero(e.enq)
    enq_cols = (enq_idx, e.ext[enq_idx], e.ts[enq_idx], e.end[enq_idx], e.c_tid[enq_idx])
    nccl, c10d = e.rows("gpu.nccl_kernel"), e.rows("cpu.c10d_enqueue")
    for i in kernels.tolist():
        src = launching_ops(launch[i], e.ext[i], e.corr[i], enq_cols, e.ext, e.ts, e.end,
                                   e.c_tid)
        if nccl[i]:
            if e.arg_kind[i] >= 0:
                e.kind[i] = e.arg_kind[i]
                e.rule[i] = _RULE["gpu.nccl_kernel.args"]
            elif (k := _kind_from_ops(src, e.arg_kind, e.name_kind, c10d)) >= 0:
                e.kind[i] = k
                e.rule[i] = _RULE["gpu.nccl_kernel.launch"]
            elif e.name_kind[i] >= 0:
                e.kind[i] = e.name_kind[i]
            else:
                e.kind[i] = _KIND["send_recv" if "sendrecv" in e.names[i].lower() else "other"]
        ident.kernel(i, src, launch[i])


def _gloo_ops(e: _Events, ident: "OldIdentity") -> np.ndarray:
    """cpu.gloo_op.paired: each gloo runloop op paired with its enqueue by order and time
    (``_pair_gloo``, then within each process group), taking the enqueue's kind (gloo runs
    reduce_scatter as an all_reduce of the whole buffer: the enqueue says what it really was)
    and identity. Returns the paired row of every row (-1 none)."""
    gloo_idx = np.flatnonzero(e.rows("cpu.gloo_op"))
    paired = np.full(e.n, -1, np.int64)
    if not len(gloo_idx):
        return paired
    c10d_idx = np.flatnonzero(e.calls())
    paired = _pair_gloo(c10d_idx, gloo_idx, e.kind, e.name_kind, e.ts, paired)
    paired = _pair_gloo_by_group(c10d_idx, gloo_idx, e.kind, e.name_kind, e.ts, paired, ident.pg,
                                 e.c_tid)
    for i in gloo_idx.tolist():
        j = paired[i]
        if j >= 0:
            e.rule[i] = _RULE["cpu.gloo_op.paired"]
            e.kind[i] = e.kind[j] if e.kind[j] >= 0 else e.kind[i]
        if e.kind[i] < 0:
            e.kind[i] = _KIND["other"]
        ident.gloo_op(i, j)
    return paired


def _fake_calls(e: _Events, ident: "OldIdentity") -> None:
    """The fake group's collective calls (rule cpu.fake_pg_call, ``FAKE_BACKEND``): each takes,
    where its own record lacks them, the dtype and bytes of the innermost comm enqueue op of
    its kind enclosing it on its thread (``_Identity.fake_call``): the
    ``_c10d_functional::*`` op that ran it, sized by its tag's tensor note (``_tag_tensors``;
    its ``c10d::*`` op takes a tensor list, which Kineto records with no dtype or shape)."""
    calls = np.flatnonzero(e.rule == _RULE["cpu.fake_pg_call"])
    if not len(calls):
        return
    outer = np.flatnonzero(e.enq & (e.rule != _RULE["cpu.fake_pg_call"]))
    at = ops_enclosing(outer, calls, e.ts, e.end, e.c_tid)
    for i, j in zip(calls.tolist(), at.tolist()):
        ident.fake_call(i, j if j >= 0 and e.kind[j] == e.kind[i] else -1)


def _pair_gloo_by_group(c10d_idx, gloo_idx, kind, name_kind, ts, paired, pg, tid
                        ) -> np.ndarray:
    """Pair again within each process group once the enqueues name theirs: gloo runs each
    process group's work on its own runloop threads, so a thread's group is the one most of
    its paired enqueues name (ties: the smaller name); each group's enqueues are then paired
    (``_pair_gloo``) with the gloo ops of that group's threads only, so that two groups'
    collectives of one kind running at once are not crossed. What stays unpaired (enqueues
    without a group, ops on threads no enqueue names, a thread that serves several groups)
    is then paired among itself as before. Returns ``paired`` unchanged when no paired
    enqueue names a group."""
    votes: dict[int, dict[str, int]] = {}
    for i in gloo_idx.tolist():
        j = paired[i]
        if j >= 0 and pg[j] is not None:
            v = votes.setdefault(int(tid[i]), {})
            v[str(pg[j])] = v.get(str(pg[j]), 0) + 1
    if not votes:
        return paired
    group_of_thread = {t: min(v, key=lambda g: (-v[g], g)) for t, v in votes.items()}
    out = np.full(len(paired), -1, np.int64)
    enq_pg = np.array([str(pg[j]) if pg[j] is not None else "" for j in c10d_idx.tolist()],
                      object)
    op_pg = np.array([group_of_thread.get(int(tid[i]), "") for i in gloo_idx.tolist()], object)
    for g in sorted(set(enq_pg.tolist()) - {""}):
        out = _pair_gloo(c10d_idx[enq_pg == g], gloo_idx[op_pg == g], kind, name_kind, ts, out)
    return _pair_gloo(c10d_idx[out[c10d_idx] < 0], gloo_idx[out[gloo_idx] < 0], kind,
                      name_kind, ts, out)


def _pair_gloo(c10d_idx, gloo_idx, kind, name_kind, ts, paired) -> np.ndarray:
    """Pair gloo runloop ops with c10d enqueues: for each enqueue in time order, the first not
    yet paired gloo op of the matching gloo kind that starts at or after the enqueue starts.
    (No id links them; gloo runs a process group's work in FIFO order.)"""
    def name(code) -> str:  # kind name; "None" for no kind, which pairs with no-kind ops
        return KINDS[code] if code >= 0 else "None"

    pools: dict[str, list[int]] = {}
    for i in gloo_idx.tolist():  # already in time order (table sorted by ts)
        pools.setdefault(name(name_kind[i]), []).append(i)
    heads = {k: 0 for k in pools}
    for j in c10d_idx.tolist():
        want = _GLOO_FOR_C10D.get(name(kind[j]), None)
        pool = pools.get(str(want))
        if not pool:
            continue
        h = heads[str(want)]
        while h < len(pool) and ts[pool[h]] < ts[j]:
            h += 1  # a gloo op before the enqueue cannot be its work (it was enqueued earlier)
        if h < len(pool):
            paired[pool[h]] = j
            paired[j] = pool[h]
            h += 1
        heads[str(want)] = h
    return paired


def _bytes_from_args(df) -> np.ndarray:
    """nccl-tests byte count from collective args: max(in, out) elements x element size.

    nccl-tests (doc/PERFORMANCE.md) counts all_gather and reduce_scatter by the total (whole)
    buffer, all_reduce / broadcast / all_to_all by the buffer size: in every case the larger of
    the input and output element counts.
    """
    from analyzer.ingest.decode import dtype_bytes

    n_in = df["in_nelems"].to_numpy()
    n_out = df["out_nelems"].to_numpy()
    out = np.full(len(df), -1, np.int64)
    have = np.flatnonzero((np.maximum(n_in, n_out) >= 0) & df["dtype"].notna().to_numpy())
    dt = C._obj(df["dtype"])
    for i in have:
        size = dtype_bytes(dt[i])
        if size > 0:
            out[i] = max(n_in[i], n_out[i]) * size
    return out


class OldIdentity(C._Identity):
    """``classify._Identity`` with its per-row methods as they were."""

    def __init__(self, df, *args, **kw):
        super().__init__(df, *args, **kw)
        # the rows whose own arguments name their group (before any tag names it)
        own = C._obj(df["pg"])
        self.from_args = np.array([p is not None for p in own], bool) if len(own) else \
            np.zeros(0, bool)
        self.nbytes = _bytes_from_args(df)
        self.args_bytes = self.nbytes.copy()

    def table(self, df, step: np.ndarray, is_comm: np.ndarray,
              pg_descs: dict[str, str] | None, launch: np.ndarray, paired: np.ndarray
              ):
        """``df`` with ``step``, role, coll_kind, the identity columns (``is_comm``: rows that
        keep a peer, Seq and Comms Id; ``pg_descs``: pg_config's description of each group),
        rule, launch_row and paired_row."""
        e, desc, descs = self.e, self.desc, pg_descs or {}
        for i in np.flatnonzero(is_comm).tolist():
            if desc[i] is None and self.pg[i] is not None:
                desc[i] = descs.get(str(self.pg[i]))
        out = df.drop(columns=[c for c in ("pg", "pg_ranks", "dtype", "group_size", "pg_desc",
                                           "seq_arg", "comms_id") if c in df.columns])
        for name, col in {
                "step": step, "role": pd.Categorical.from_codes(e.role, categories=list(ROLES)),
                "coll_kind": pd.Categorical.from_codes(e.kind, categories=list(KINDS)),
                "bytes": self.nbytes.astype(np.int64), "pg": str_array(self.pg),
                "pg_ranks": str_array(self.pg_rk),
                "dtype": str_array([commid.dtype_name(d) for d in self.dtype]),
                "group_size": self.group.astype(np.int64), "pg_desc": str_array(desc),
                "peer": np.where(is_comm, self.peer, -1).astype(np.int64),
                "seq_arg": np.where(is_comm, self.seq, -1).astype(np.int64),
                "comms_id": str_array(np.where(is_comm, self.cid, None)),
                "rule": _used_categories(e.rule, RULES), "launch_row": launch,
                "paired_row": paired}.items():
            out[name] = col
        return out

    def shape_bytes(self, i: int, kind: str | None, group: int) -> int:
        """Bytes of row ``i`` from its first tensor's shape and dtype (``commid.total_bytes``:
        a piece is multiplied by ``group``), -1 unknown."""
        return total_bytes(str(self.e.names[i]), kind, int(self.numel[i]),
                                  int(self.size[i]), group)

    def ops_bytes(self, src, kind: str, group: int) -> int:
        """Bytes of a collective from its launching ops ``src``: collective args first
        (record_param_comms), then the op shapes (below); -1 unknown."""
        for j in src:
            if self.args_bytes[j] >= 0:
                return int(self.args_bytes[j])
        # a c10d op's first tensor is its output: the whole buffer of an all_gather, the piece
        # of a reduce_scatter; for other kinds (an uneven all_to_all) the nccl:* op's input first
        c10d = [j for j in src if str(self.e.names[j]).startswith("c10d::")]
        rest = [j for j in src if j not in c10d]
        for j in (c10d + rest if kind in ("all_gather", "reduce_scatter") else rest + c10d):
            if (b := self.shape_bytes(j, kind, group)) >= 0:
                return b
        return -1

    def take_seq(self, i: int, src) -> None:
        """Row ``i``'s Seq / Comms Id, where its own arguments do not say, from its launching or
        paired ops ``src`` (the first that has one)."""
        if self.seq[i] < 0:
            self.seq[i] = next((self.seq[j] for j in src if self.seq[j] >= 0), -1)
        if self.cid[i] is None:
            self.cid[i] = next((self.cid[j] for j in src if self.cid[j] is not None), None)

    def name_group(self, i: int) -> None:
        """pg of row ``i`` from pg_config's only group, pg_ranks from pg_config's ranks."""
        if self.pg[i] is None and self.only_pg is not None:
            self.pg[i] = self.only_pg
        if self.pg_rk[i] is None and self.pg[i] is not None and self.members.get(str(self.pg[i])):
            self.pg_rk[i] = self.members[str(self.pg[i])]

    def group_of(self, i: int, src=()) -> int:
        """Group size of row ``i`` launched by ops ``src`` (commid module docstring, 2-5)."""
        if self.group[i] > 0:
            return int(self.group[i])
        if self.pg[i] is not None and self.pg_sizes and str(self.pg[i]) in self.pg_sizes:
            return self.pg_sizes[str(self.pg[i])]
        k = KINDS[self.e.kind[i]] if self.e.kind[i] >= 0 else None
        if k in ("all_gather", "reduce_scatter"):
            for j in (i, *src):
                n = group_from_counts(k, int(self.n_in[j]), int(self.n_out[j]))
                if n > 0:
                    return n
            for j in (i, *src):
                n = group_from_tensors(str(self.e.names[j]), k, int(self.numel[j]),
                                              int(self.numel2[j]))
                if n > 0:
                    return n
        return self.fallback

    def kernel(self, i: int, src: list[int], launch_row: int) -> None:
        """A GPU comm row ``i`` launched by enqueue ops ``src`` at runtime row ``launch_row``."""
        pg, peer, group = self.pg, self.peer, self.group
        # pg: a record_param_comms' own name first, then a tagged op's, then the tag around
        # the launch itself
        if pg[i] is None:
            pg[i] = next((pg[j] for j in src if self.from_args[j]), None)
        for col in (pg, self.pg_rk, self.dtype, self.desc):
            if col[i] is None:
                col[i] = next((col[j] for j in src if col[j] is not None), None)
        tag = self.tag_of.get(int(launch_row))
        if pg[i] is None and tag is not None:
            pg[i] = tag[0]
        peer[i] = next((peer[j] for j in src if peer[j] >= 0), tag[1] if tag is not None else -1)
        if not self.graphed[i]:  # capture-time values (analyzer/ingest/graphs.py)
            self.take_seq(i, src)
        self.name_group(i)
        if group[i] <= 0:
            group[i] = next((group[j] for j in src if group[j] > 0), -1)
        group[i] = self.group_of(i, src)
        if self.nbytes[i] < 0:
            self.nbytes[i] = self.ops_bytes(src, KINDS[self.e.kind[i]], int(group[i]))

    def gloo_op(self, i: int, j: int) -> None:
        """A gloo op ``i`` paired with enqueue ``j`` (-1: unpaired)."""
        if j >= 0:
            if self.pg[i] is None:
                self.pg[i] = self.pg[j]
            self.take_seq(i, (j,))
            for col in (self.pg_rk, self.dtype, self.desc):
                if col[i] is None:
                    col[i] = col[j]
            self.peer[i] = self.peer[j] if self.peer[i] < 0 else self.peer[i]
            if self.group[i] <= 0:
                self.group[i] = self.group[j]
        self.name_group(i)
        self.group[i] = self.group_of(i, (j,) if j >= 0 else ())
        kind = KINDS[self.e.kind[i]]
        if self.nbytes[i] < 0:
            self.nbytes[i] = self.shape_bytes(i, kind, int(self.group[i]))
        if self.nbytes[i] < 0 and j >= 0:
            self.nbytes[i] = self.shape_bytes(j, kind, int(self.group[i]))

    def fake_call(self, i: int, j: int) -> None:
        """A fake group's collective call ``i`` (its ``c10d::*`` op, ``_fake_calls``) run by
        enqueue op ``j`` (-1: none): dtype and bytes from ``j`` where its own are unknown,
        its group size as a gloo op's (``group_of``)."""
        if j >= 0:
            if self.dtype[i] is None:
                self.dtype[i] = self.dtype[j]
            if self.nbytes[i] < 0:
                self.nbytes[i] = self.nbytes[j]
        self.name_group(i)
        self.group[i] = self.group_of(i)

    def enqueue_one(self, i: int) -> None:
        """An enqueue op ``i``: its group from pg_config, its bytes from its own shape."""
        self.name_group(i)
        if self.nbytes[i] < 0:
            k = self.e.kind[i]
            self.nbytes[i] = self.shape_bytes(i, KINDS[k] if k >= 0 else None, self.group_of(i))


    def enqueue(self, rows) -> None:
        """The enqueue loop as classify ran it: one row at a time."""
        for i in np.asarray(rows).tolist():
            self.enqueue_one(i)


@contextlib.contextmanager
def old_identity():
    """Within: ``classify.classify`` runs the collective-identity stage as at 8821002."""
    names = {"_Identity": OldIdentity, "_comm_kernels": _comm_kernels, "_gloo_ops": _gloo_ops,
             "_fake_calls": _fake_calls}
    saved = {k: getattr(C, k) for k in names}
    saved_enclosing = commid.ops_enclosing
    try:
        for k, v in names.items():
            setattr(C, k, v)
        commid.ops_enclosing = ops_enclosing
        yield
    finally:
        for k, v in saved.items():
            setattr(C, k, v)
        commid.ops_enclosing = saved_enclosing
