"""Classify decoded events: role, collective kind, bytes, process group, and the rule used.

Rule ids (column ``rule``) and where each rule comes from:

GPU events (``is_gpu``):
  ``gpu.nccl_kernel``        NCCL kernel (``^nccl.*Kernel``, HTA ``is_comm_kernel``; covers
                             ``ncclKernel_*`` and ``ncclDevKernel_*``) -> comm; kind from the name.
  ``gpu.nccl_kernel.args``   same, kind from the kernel's own ``Collective name`` argument
                             (newer Kineto copies record_param_comms' args onto the kernel), used
                             when the name says ``Generic``/``SendRecv``/nothing.
  ``gpu.nccl_kernel.launch`` same, kind from the launching CPU op (record_param_comms
                             ``Collective name``, else ``nccl:*`` name, else ``c10d::*`` name),
                             found through External id, else correlation -> runtime launch ->
                             enclosing comm op on the launching thread.
  ``gpu.memcpy`` / ``gpu.memset`` category gpu_memcpy / gpu_memset (or name Memcpy*/Memset*)
                             -> neither compute nor comm (HTA ``is_memory_kernel``).
  ``gpu.memcpy.htod``        a memcpy whose name says ``HtoD`` (``Memcpy HtoD (Pinned ->
                             Device)``): role memcpy, and an input copy for the breakdown's data
                             supply (analyzer/analyses/breakdown.py; issue 10).
  ``gpu.sync``               category cuda_sync or a name containing ``Sync`` (HTA excludes
                             ``.*Sync`` from computation) -> neither.
  ``gpu.annotation``         gpu_user_annotation -> annotation (a range, not work).
  ``gpu.kernel``             every other GPU event -> compute (HTA ``is_compute_kernel``).

CPU events:
  ``cpu.profiler_step``      ``ProfilerStep#N`` -> step.
  ``cpu.dataloader_next``    ``enumerate(DataLoader)#<iterator class>.__next__`` (the range
                             torch.utils.data.DataLoader's iterator records around each batch
                             fetch, any thread) -> data.
  ``cpu.gloo_op``            ``gloo:*`` (any thread; gloo runs them on ``pt_gloo_runloop``
                             threads) -> comm; kind from the name, or from the paired enqueue
                             (``cpu.gloo_op.paired``): gloo runs reduce_scatter as an all_reduce of
                             the whole buffer, so the enqueue says what it really was.
  ``cpu.c10d_enqueue``       ``c10d::*`` -> comm_enqueue (``c10d::wait*`` included: time the main
                             thread spends in a collective is not computation).
  ``cpu.record_param_comms`` / ``cpu.nccl_op`` -> comm_enqueue.
  ``cpu.main_thread_op``     cpu_op on the main thread of a CPU-only rank -> compute.
  ``cpu.annotation``         other user_annotation -> annotation.
  ``cpu.other``              everything else on the CPU -> other (on a GPU rank every CPU op).

The main thread of a CPU rank is the thread that holds the ProfilerStep spans; else the one that
enqueues c10d collectives; else the one with the most cpu_op time outside communication.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analyzer.ingest.decode import str_array

ROLES = ("compute", "comm", "comm_enqueue", "memcpy", "memset", "sync", "step", "annotation",
         "other", "data")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "send_recv",
         "barrier", "other")

RULES = ("gpu.nccl_kernel", "gpu.nccl_kernel.args", "gpu.nccl_kernel.launch", "gpu.memcpy",
         "gpu.memset", "gpu.memcpy.htod", "gpu.sync", "gpu.annotation", "gpu.kernel",
         "cpu.profiler_step", "cpu.dataloader_next", "cpu.gloo_op", "cpu.gloo_op.paired",
         "cpu.c10d_enqueue", "cpu.record_param_comms", "cpu.nccl_op", "cpu.main_thread_op",
         "cpu.annotation", "cpu.other")
_ROLE = {r: i for i, r in enumerate(ROLES)}
_RULE = {r: i for i, r in enumerate(RULES)}
_KIND = {k: i for i, k in enumerate(KINDS)}

NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")  # HolisticTraceAnalysis hta/utils/utils.py
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)")
# torch/utils/data/dataloader.py _BaseDataLoaderIter: f"enumerate(DataLoader)#{cls.__name__}.__next__"
DATALOADER_RE = re.compile(r"^enumerate\(DataLoader\)#.*__next__$")

_GLOO_FOR_C10D = {  # the gloo op that carries out each enqueue kind on the runloop thread
    "all_reduce": "all_reduce", "reduce_scatter": "all_reduce", "all_gather": "all_gather",
    "broadcast": "broadcast", "barrier": "barrier", "all_to_all": "all_to_all",
    "send_recv": "send_recv", "other": "other",
}


def kind_from_text(text: str | None) -> str | None:
    """Collective kind from a kernel / op / ``Collective name`` text; None when it says nothing
    (``Generic``, ``SendRecv`` kernels, unknown). Accepts ``ncclDevKernel_AllGather_RING_LL``,
    ``nccl:_all_gather_base``, ``c10d::_reduce_scatter_base_``, ``allreduce`` ..."""
    if not text:
        return None
    t = text
    for p in ("ncclDevKernel_", "ncclKernel_", "nccl:", "gloo:", "c10d::", "mpi:", "ucc:"):
        if t.startswith(p):
            t = t[len(p):]
            break
    t = t.lower().replace("_", "")
    if t.startswith(("generic", "sendrecv")) and not t.startswith("sendrecvall"):
        return None
    if "barrier" in t:
        return "barrier"
    if t.startswith("allreduce"):
        return "all_reduce"
    if t.startswith("allgather"):
        return "all_gather"
    if t.startswith("reducescatter"):
        return "reduce_scatter"
    if t.startswith("broadcast") or t.startswith("bcast"):
        return "broadcast"
    if t.startswith("alltoall"):
        return "all_to_all"
    if t.startswith(("send", "recv", "batchisendirecv", "p2p")):
        return "send_recv"
    if t.startswith(("reduce", "gather", "scatter")):
        return "other"
    return None


def classify(df: pd.DataFrame, *, world_size: int | None) -> tuple[pd.DataFrame, dict]:
    """Add role, coll_kind, bytes, pg, rule, step to a decoded event table (analyzer/ingest/decode.py).

    Returns ``(events, info)`` with ``info`` = {device_kind, main_tid, whole_trace_mode,
    steps (DataFrame: step, cpu_start_ns, cpu_end_ns, start_ns, end_ns)}. Pure function.
    """
    ts = df["ts_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    if not _time_ordered(ts, end):  # analyzer/ingest/decode.py already gives this order
        df = df.sort_values(["ts_ns", "end_ns"], ascending=[True, False], kind="stable")
    df = df.reset_index(drop=True)
    ts = df["ts_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    n = len(df)
    # string columns as (distinct values, codes): predicates run once per distinct value
    uniq, codes = _distinct(df["name"])
    names = uniq[codes]
    u_cat, c_cat = _distinct(df["cat"])
    u_cat_lc = [x.lower() for x in u_cat]
    is_gpu = df["is_gpu"].to_numpy()
    u_tid, c_tid = _distinct(df["tid"])
    # role, rule and kind as codes into ROLES, RULES and KINDS (-1: no kind)
    role = np.full(n, _ROLE["other"], np.int8)
    rule = np.full(n, _RULE["cpu.other"], np.int8)
    kind = np.full(n, -1, np.int8)

    def by_name(fn, dtype=bool):
        return np.array([fn(u) for u in uniq], dtype=dtype)[codes] if len(uniq) else \
            np.zeros(n, dtype)

    def by_cat(*values):
        return np.array([c in values for c in u_cat_lc], bool)[c_cat] if len(u_cat) else \
            np.zeros(n, bool)

    is_nccl_kernel = by_name(lambda u: NCCL_KERNEL_RE.match(u) is not None) & is_gpu
    name_kind = by_name(_kind_code, np.int8)
    is_step = by_name(lambda u: _STEP_RE.match(u) is not None) & ~is_gpu
    is_gloo = by_name(lambda u: u.startswith("gloo:")) & ~is_gpu
    is_c10d = by_name(lambda u: u.startswith("c10d::")) & ~is_gpu
    is_rpc = by_name(lambda u: u == "record_param_comms") & ~is_gpu
    is_nccl_op = by_name(lambda u: u.startswith(("nccl:", "mpi:", "ucc:"))) & ~is_gpu
    is_memcpy = is_gpu & (by_cat("gpu_memcpy") | by_name(lambda u: u.startswith("Memcpy")))
    is_htod = is_memcpy & by_name(lambda u: "HtoD" in u)
    is_loader = ~is_gpu & by_name(lambda u: DATALOADER_RE.match(u) is not None)
    is_memset = is_gpu & (by_cat("gpu_memset") | by_name(lambda u: u.startswith("Memset")))
    is_sync = is_gpu & (by_cat("cuda_sync", "gpu_sync") | by_name(lambda u: "Sync" in u))
    is_gpu_ann = is_gpu & by_cat("gpu_user_annotation")
    device_kind = "gpu" if (is_gpu & by_cat("kernel")).any() else "cpu"

    def mark(mask, r, ru):
        role[mask] = _ROLE[r]
        rule[mask] = _RULE[ru]

    # GPU
    mark(is_gpu, "compute", "gpu.kernel")
    for mask, r, ru in ((is_sync, "sync", "gpu.sync"), (is_memset, "memset", "gpu.memset"),
                        (is_memcpy, "memcpy", "gpu.memcpy"),
                        (is_gpu_ann, "annotation", "gpu.annotation"),
                        (is_nccl_kernel, "comm", "gpu.nccl_kernel")):
        mark(mask, r, ru)
    kind[is_nccl_kernel] = name_kind[is_nccl_kernel]
    rule[is_htod] = _RULE["gpu.memcpy.htod"]

    # CPU
    cpu = ~is_gpu
    mark(cpu & by_cat("user_annotation"), "annotation", "cpu.annotation")
    mark(is_loader, "data", "cpu.dataloader_next")
    enq = is_c10d | is_rpc | is_nccl_op
    role[enq] = _ROLE["comm_enqueue"]
    rule[is_c10d] = _RULE["cpu.c10d_enqueue"]
    rule[is_rpc] = _RULE["cpu.record_param_comms"]
    rule[is_nccl_op] = _RULE["cpu.nccl_op"]
    coll_name = _obj(df["coll_name"])
    arg_kind = np.full(n, -1, np.int8)
    for i in np.flatnonzero(coll_name != None).tolist():  # noqa: E711
        arg_kind[i] = _kind_code(coll_name[i])
    kind[enq] = np.where(arg_kind[enq] >= 0, arg_kind[enq], name_kind[enq])
    mark(is_gloo, "comm", "cpu.gloo_op")
    kind[is_gloo] = name_kind[is_gloo]
    mark(is_step, "step", "cpu.profiler_step")

    main_tid = None
    if device_kind == "cpu":
        main_code = _main_thread(df, u_tid, c_tid, is_step, is_c10d, role, by_cat("cpu_op"))
        if main_code is not None:
            main_tid = str(u_tid[main_code])
            main_op = cpu & (c_tid == main_code) & by_cat("cpu_op") & (role == _ROLE["other"])
            mark(main_op, "compute", "cpu.main_thread_op")

    ext = df["external_id"].to_numpy()
    corr = df["correlation"].to_numpy()

    # --- link GPU events to their launching CPU event (correlation, else External id) --------
    launch = np.full(n, -1, np.int64)  # row index of the CPU launch event
    gpu_idx = np.flatnonzero(is_gpu)
    cpu_idx = np.flatnonzero(cpu)
    if len(gpu_idx):
        runtime = cpu & (corr >= 0) & by_cat("cuda_runtime", "cuda_driver", "cpu_op")
        rt_idx = np.flatnonzero(runtime)
        launch[gpu_idx] = _lookup(corr[rt_idx], rt_idx, corr[gpu_idx])
        missing = gpu_idx[launch[gpu_idx] < 0]
        if len(missing):
            not_range = (role[cpu_idx] != _ROLE["annotation"]) & (role[cpu_idx] != _ROLE["data"])
            cand = cpu_idx[(ext[cpu_idx] >= 0) & not_range]
            launch[missing] = _lookup(ext[cand], cand, ext[missing])

    # --- collective kind / bytes / pg of comm kernels from their launching op ----------------
    pg = _obj(df["pg"])
    nbytes = _bytes_from_args(df)
    args_bytes = nbytes.copy()  # bytes from each row's own collective args (-1 unknown)
    shape = _ShapeCols(df, names)
    comm_k = np.flatnonzero(is_nccl_kernel)
    if len(comm_k):
        enq_idx = np.flatnonzero(enq)
        enq_cols = (enq_idx, ext[enq_idx], ts[enq_idx], end[enq_idx], c_tid[enq_idx])
        for i in comm_k.tolist():
            if kind[i] < 0 and arg_kind[i] >= 0:
                kind[i] = arg_kind[i]
                rule[i] = _RULE["gpu.nccl_kernel.args"]
            src = _launching_ops(launch[i], ext[i], enq_cols, ext, ts, end, c_tid)
            if kind[i] < 0:
                k = _kind_from_ops(src, arg_kind, name_kind, is_nccl_op)
                if k >= 0:
                    kind[i] = k
                    rule[i] = _RULE["gpu.nccl_kernel.launch"]
                else:
                    kind[i] = _KIND["send_recv" if "SendRecv" in names[i] else "other"]
            if pg[i] is None:
                pg[i] = next((pg[j] for j in src if pg[j] is not None), None)
            if nbytes[i] < 0:
                nbytes[i] = _bytes_from_ops(src, KINDS[kind[i]], args_bytes, shape, world_size)
    # --- gloo: pair each runloop op with its enqueue by order and time -----------------------
    gloo_idx = np.flatnonzero(is_gloo)
    paired = np.full(n, -1, np.int64)
    if len(gloo_idx):
        c10d_idx = np.flatnonzero(is_c10d & ~by_name(lambda u: u.startswith("c10d::wait")))
        paired = _pair_gloo(c10d_idx, gloo_idx, kind, name_kind, ts, paired)
        for i in gloo_idx.tolist():
            j = paired[i]
            if j >= 0:
                rule[i] = _RULE["cpu.gloo_op.paired"]
                kind[i] = kind[j] if kind[j] >= 0 else kind[i]
                if pg[i] is None:
                    pg[i] = pg[j]
            if kind[i] < 0:
                kind[i] = _KIND["other"]
            if nbytes[i] < 0:
                nbytes[i] = shape.nbytes(i, KINDS[kind[i]], world_size)
            if nbytes[i] < 0 and j >= 0:
                nbytes[i] = shape.nbytes(j, KINDS[kind[i]], world_size)
    for i in np.flatnonzero(enq).tolist():
        if nbytes[i] < 0:
            nbytes[i] = shape.nbytes(i, KINDS[kind[i]] if kind[i] >= 0 else None, world_size)
    is_comm = (role == _ROLE["comm"]) | (role == _ROLE["comm_enqueue"])
    kind[~is_comm] = -1
    kind[is_comm & (kind < 0)] = _KIND["other"]

    # --- steps ------------------------------------------------------------------------------
    step, steps, whole = _assign_steps(df, names, is_step, is_gpu, launch, paired, role)

    out = df.drop(columns=["pg"])
    out["step"] = step
    out["role"] = pd.Categorical.from_codes(role, categories=list(ROLES))
    out["coll_kind"] = pd.Categorical.from_codes(kind, categories=list(KINDS))
    out["bytes"] = nbytes.astype(np.int64)
    out["pg"] = str_array(pg)
    out["rule"] = _used_categories(rule, RULES)
    out["launch_row"] = launch
    out["paired_row"] = paired
    info = {"device_kind": device_kind, "main_tid": main_tid, "whole_trace_mode": whole,
            "steps": steps}
    return out, info


def _time_ordered(ts: np.ndarray, end: np.ndarray) -> bool:
    """True when rows are sorted by start, longest first among equal starts."""
    if len(ts) < 2:
        return True
    a, b = ts[:-1], ts[1:]
    return bool(((b > a) | ((b == a) & (end[1:] <= end[:-1]))).all())


def _used_categories(codes: np.ndarray, values: tuple[str, ...]) -> pd.Categorical:
    """Categorical of ``values[codes]`` whose categories are the values used, sorted (what
    ``pd.Categorical(list of str)`` gives)."""
    used = np.flatnonzero(np.bincount(codes, minlength=len(values)))
    order = sorted(used.tolist(), key=lambda c: values[c])
    remap = np.full(len(values), -1, np.int8)
    remap[order] = np.arange(len(order), dtype=np.int8)
    return pd.Categorical.from_codes(remap[codes], categories=[values[c] for c in order])


def _distinct(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values as an object array of str, code of each row) of a string column;
    categorical columns (analyzer/ingest/decode.py) are used as they are, without a pass over rows."""
    if isinstance(col.dtype, pd.CategoricalDtype) and not col.isna().any():
        cat = col.array
        uniq = np.array([str(x) for x in cat.categories], object)
        if len(set(uniq.tolist())) == len(uniq):
            return uniq, cat.codes.astype(np.int64)
    codes, uniq = pd.factorize(col.astype(str))
    return np.array([str(x) for x in uniq], object), codes.astype(np.int64)


def _obj(col: pd.Series) -> np.ndarray:
    """Object array with None for missing (pandas 3 ``str`` columns hold NaN)."""
    return col.to_numpy(dtype=object, na_value=None).copy()


def _lookup(keys: np.ndarray, rows: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """Row of the first entry whose key equals each query, -1 when none (vectorised)."""
    if len(keys) == 0:
        return np.full(len(queries), -1, np.int64)
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    pos = np.searchsorted(k, queries)
    pos_c = np.minimum(pos, len(k) - 1)
    hit = (pos < len(k)) & (k[pos_c] == queries) & (queries >= 0)
    return np.where(hit, rows[order][pos_c], -1)


def _launching_ops(launch_row, ext_i, enq_cols, ext, ts, end, tid_code) -> list[int]:
    """Comm enqueue rows that launched a GPU row whose External id is ``ext_i`` and whose
    runtime launch is ``launch_row``: same External id, or enclosing the runtime launch on the
    launching thread. ``enq_cols`` = (rows, ext, ts, end, tid code) of the enqueue rows."""
    rows, e_ext, e_ts, e_end, e_tid = enq_cols
    out = []
    if ext_i >= 0:
        out.extend(rows[e_ext == ext_i].tolist())
    if launch_row >= 0:
        t0, t1, tid = ts[launch_row], end[launch_row], tid_code[launch_row]
        out.extend(rows[(e_ts <= t0) & (e_end >= t1) & (e_tid == tid)].tolist())
        if ext[launch_row] >= 0:
            out.extend(rows[e_ext == ext[launch_row]].tolist())
    return list(dict.fromkeys(out))


def _kind_from_ops(src, arg_kind, name_kind, is_nccl_op) -> int:
    """Kind code from the launching ops ``src``: a ``Collective name`` argument first, then an
    ``nccl:*`` op's name, then any op's name; -1 when none says."""
    for j in src:
        if arg_kind[j] >= 0:
            return int(arg_kind[j])
    for j in src:
        if is_nccl_op[j] and name_kind[j] >= 0:
            return int(name_kind[j])
    for j in src:
        if name_kind[j] >= 0:
            return int(name_kind[j])
    return -1


def _kind_code(text: str | None) -> int:
    """Index in KINDS of ``kind_from_text(text)``, -1 when it says nothing."""
    k = kind_from_text(text)
    return _KIND[k] if k is not None else -1


def _bytes_from_args(df: pd.DataFrame) -> np.ndarray:
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
    dt = _obj(df["dtype"])
    for i in have:
        size = dtype_bytes(dt[i])
        if size > 0:
            out[i] = max(n_in[i], n_out[i]) * size
    return out


class _ShapeCols:
    """The columns ``nbytes`` reads, as numpy arrays (row access without pandas overhead)."""

    __slots__ = ("numel", "size", "group", "names")

    def __init__(self, df: pd.DataFrame, names: np.ndarray):
        self.numel = df["shape_numel"].to_numpy()
        self.size = df["shape_elem_bytes"].to_numpy()
        self.group = df["group_size"].to_numpy()
        self.names = names

    def nbytes(self, i: int, kind: str | None, world_size: int | None) -> int:
        """Bytes of row ``i`` from its first input tensor's shape and dtype, -1 unknown.

        The nccl:* / gloo:* ops record the input tensor: for all_gather that is one rank's
        piece, so it is multiplied by the group size (world size when the trace does not say)
        to get nccl-tests' total buffer size."""
        numel = int(self.numel[i])
        size = int(self.size[i])
        if numel < 0 or size < 0:
            return -1
        total = numel * size
        if kind == "all_gather" and not str(self.names[i]).startswith("c10d::"):
            g = int(self.group[i])
            g = g if g > 0 else (world_size or 1)
            total *= g
        return total


def _bytes_from_ops(src, kind, args_bytes, shape: _ShapeCols, world_size) -> int:
    for j in src:  # args first (record_param_comms), then shapes (nccl:* op)
        if args_bytes[j] >= 0:
            return int(args_bytes[j])
    for j in src:
        if str(shape.names[j]).startswith("nccl:"):
            b = shape.nbytes(j, kind, world_size)
            if b >= 0:
                return b
    return -1


def _main_thread(df, u_tid, c_tid, is_step, is_c10d, role, is_cpu_op) -> int | None:
    """Code (in ``c_tid``, codes of the distinct tids ``u_tid``) of the main thread (module
    docstring); ties go to the thread whose tid sorts first as a string. None when no row tells."""
    for mask in (is_step, is_c10d):
        if mask.any():
            return _first_max(np.bincount(c_tid[mask], minlength=len(u_tid)), u_tid)
    ops = is_cpu_op & (role == _ROLE["other"])
    if not ops.any():
        return None
    has_ops = np.bincount(c_tid[ops], minlength=len(u_tid)) > 0
    sums = np.zeros(len(u_tid), np.int64)
    np.add.at(sums, c_tid[ops], df["dur_ns"].to_numpy()[ops])
    sums[~has_ops] = -1  # threads without such ops never win
    return _first_max(sums, u_tid)


def _first_max(values: np.ndarray, labels: np.ndarray) -> int:
    """Index of the largest value; among equals, the one whose label sorts first."""
    best = np.flatnonzero(values == values.max())
    return int(min(best.tolist(), key=lambda c: str(labels[c])))


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


def _assign_steps(df, names, is_step, is_gpu, launch, paired, role):
    """Step of every event and the step windows.

    CPU events: the ProfilerStep span containing their start. GPU events: the step of their
    launching CPU event (correlation / External id); when none is found, the span containing
    their start. gloo ops: the step of their paired enqueue, else by start.
    Window of step S: [span start, max(span end, end of every GPU / comm event of S)] — the GPU
    (or gloo thread) finishes the work the step launched after the CPU moves on.
    Whole-trace mode (no ProfilerStep): every event in step 0, window = whole trace.
    """
    n = len(df)
    ts = df["ts_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    step = np.full(n, -1, np.int64)
    if not is_step.any():
        step[:] = 0
        lo = int(ts.min()) if n else 0
        hi = int(end.max()) if n else 0
        steps = pd.DataFrame({"step": [0], "cpu_start_ns": [lo], "cpu_end_ns": [hi],
                              "start_ns": [lo], "end_ns": [hi]})
        return step, steps, True
    idx = np.flatnonzero(is_step)
    spans = pd.DataFrame({"step": [int(_STEP_RE.match(names[i]).group(1)) for i in idx], "s": ts[idx],
                          "e": end[idx]}).groupby("step").agg(s=("s", "min"), e=("e", "max"))
    spans = spans.sort_values("s")
    st = spans.index.to_numpy()
    ss = spans["s"].to_numpy()
    se = spans["e"].to_numpy()

    def by_time(t):
        k = np.searchsorted(ss, t, side="right") - 1
        ok = (k >= 0) & (t < se[np.maximum(k, 0)])
        return np.where(ok, st[np.maximum(k, 0)], -1)

    step[:] = by_time(ts)
    g = np.flatnonzero(is_gpu)
    lk = launch[g]
    has = lk >= 0
    step[g[has]] = step[lk[has]]
    comm = role == _ROLE["comm"]
    gl = np.flatnonzero(comm & ~is_gpu & (paired >= 0))
    step[gl] = step[paired[gl]]
    dev = np.flatnonzero((is_gpu | comm) & (step >= 0))
    by_number = np.argsort(st, kind="stable")  # span index of each event's step number
    at = np.minimum(np.searchsorted(st[by_number], step[dev]), len(st) - 1)
    k = np.where(st[by_number][at] == step[dev], by_number[at], -1)
    ok = k >= 0
    start = ss.copy()
    stop = se.copy()
    np.minimum.at(start, k[ok], ts[dev][ok])  # exact int64, no float round trip
    np.maximum.at(stop, k[ok], end[dev][ok])
    steps = pd.DataFrame({"step": st, "cpu_start_ns": ss, "cpu_end_ns": se,
                          "start_ns": start, "end_ns": stop})
    steps = steps.sort_values("step").reset_index(drop=True).astype(np.int64)
    return step, steps, False
