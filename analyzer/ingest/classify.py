"""Classify decoded events: role, collective kind, bytes, process group, and the rule used.

Rule ids (column ``rule``) and where each rule comes from:

GPU events (``is_gpu``):
  ``gpu.nccl_kernel``        NCCL kernel (HTA ``is_comm_kernel`` ``^nccl.*Kernel``, matched
                             case-insensitively: ``ncclKernel_*``, ``ncclDevKernel_*``,
                             ``nccldevkernel_*``; and ``nccl::Allreduce``-style names), or any GPU
                             kernel carrying a ``Collective name`` argument -> comm; kind from
                             the kernel name, because no CPU op says it.
  ``gpu.nccl_kernel.args``   same, kind from the kernel's own ``Collective name`` argument
                             (newer Kineto copies record_param_comms' args onto the kernel).
  ``gpu.nccl_kernel.launch`` same, kind from the launching CPU op (record_param_comms
                             ``Collective name``, else ``c10d::*`` name, else ``nccl:*`` name):
                             the CPU side first, the kernel name last (analyzer/ingest/commid.py).
  ``gpu.symm_mem_kernel``    a GPU kernel whose runtime launch lies inside a ``symm_mem::*`` op
                             (torch symmetric memory, e.g. ``multimem_all_reduce_``) -> comm;
                             kind from the op's name.
  ``gpu.hccl_kernel``        same inside an ``hccl:*`` op (Ascend HCCL).
  ``gpu.dispatch_kernel``    same inside a custom dispatch / combine / all_to_all op
                             (``commid.DISPATCH_OP_RE``) -> comm, all_to_all.
  ``gpu.deep_ep_kernel``     a kernel named ``deep_ep::...`` (DeepEP dispatch / combine) -> comm,
                             all_to_all.
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
  ``cpu.c10d_functional``    ``_c10d_functional::*`` (DTensor / TP functional collectives around
                             their ``c10d::*`` op, and ``_c10d_functional::wait_tensor``: the
                             main thread waiting for one, milliseconds on gloo) -> comm_enqueue.
  ``cpu.record_param_comms`` / ``cpu.nccl_op`` -> comm_enqueue.
  ``cpu.symm_mem_op`` / ``cpu.hccl_op`` / ``cpu.dispatch_op``: ``symm_mem::*``, ``hccl:*``,
                             custom dispatch / combine / all_to_all ops -> comm_enqueue.
  ``cpu.main_thread_op``     cpu_op on the main thread of a CPU-only rank -> compute.
  ``cpu.pg_tag``             ``paritytrace::pg <pg_name>[ peer <global rank>]`` user_annotation
                             (``schemas.PG_TAG_PREFIX``: the tracer's process-group tag) ->
                             annotation (counts as nothing in the breakdown); it names the
                             process group (and the peer of a send / recv) of the collectives
                             it encloses (analyzer/ingest/commid.py, pg).
  ``cpu.annotation``         other user_annotation -> annotation; so is Kineto's span of the
                             whole profiled window (category ``Trace``, ``PyTorch Profiler (0)``
                             on pid ``Spans``): it marks the window, no work ran in it (counted
                             as other, it turned a CPU rank's idle in its first step into other).
  ``cpu.other``              everything else on the CPU -> other (on a GPU rank every CPU op).

Collective identity (kind, bytes, dtype, group size, process group) of comm events:
analyzer/ingest/commid.py. Device event categories the analyzer does not understand (MTIA's
``mtia_ccp_events`` / ``mtia_runtime``, CUPTI's ``cuda_profiler_range``, any other
device-looking category, ``UNKNOWN_DEVICE_RE``) are named in a note with their count and time
(``info["notes"]``): they are not analysed.

The main thread of a CPU rank is the thread that holds the ProfilerStep spans; else the one that
enqueues c10d collectives; else the one with the most cpu_op time outside communication.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analyzer.contract.schemas import PG_TAG_PREFIX
from analyzer.ingest import commid, graphs
from analyzer.ingest.commid import DEEP_EP_KERNEL_RE, DISPATCH_OP_RE, NCCL_KERNEL_RE
from analyzer.ingest.decode import str_array
from analyzer.ingest.steps import STEP_RE, assign_steps

ROLES = ("compute", "comm", "comm_enqueue", "memcpy", "memset", "sync", "step", "annotation",
         "other", "data")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "send_recv",
         "barrier", "other")

RULES = ("gpu.nccl_kernel", "gpu.nccl_kernel.args", "gpu.nccl_kernel.launch", "gpu.memcpy",
         "gpu.memset", "gpu.memcpy.htod", "gpu.sync", "gpu.annotation", "gpu.kernel",
         "cpu.profiler_step", "cpu.dataloader_next", "cpu.gloo_op", "cpu.gloo_op.paired",
         "cpu.c10d_enqueue", "cpu.record_param_comms", "cpu.nccl_op", "cpu.main_thread_op",
         "cpu.annotation", "cpu.other", "gpu.symm_mem_kernel", "gpu.hccl_kernel",
         "gpu.dispatch_kernel", "gpu.deep_ep_kernel", "cpu.symm_mem_op", "cpu.hccl_op",
         "cpu.dispatch_op", "cpu.pg_tag", "cpu.c10d_functional")
_ROLE = {r: i for i, r in enumerate(ROLES)}
_RULE = {r: i for i, r in enumerate(RULES)}
_KIND = {k: i for i, k in enumerate(KINDS)}

KNOWN_CATS = frozenset({
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel",
    "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_sync", "ac2g",
    "overhead", "trace", "fwdbwd", "cpu_instant_event", "memory"})
"""Kineto categories the analyzer reads (compared lower-cased)."""
UNKNOWN_DEVICE_RE = re.compile(r"mtia|profiler_range|gpu|cuda|hip|xpu|hpu|npu|device|kernel|"
                               r"accelerator|privateuse", re.IGNORECASE)
"""A category outside ``KNOWN_CATS`` that names a device: its events are device work the
analyzer does not understand (named in a note, never silently analysed as CPU)."""
_LONE_EP_RE = re.compile(r"::(?:\w+_)?(?:dispatch|combine)(?![A-Za-z0-9])", re.IGNORECASE)
"""A kernel named like an expert-parallel dispatch / combine (``ep::dispatch_kernel<...>``; not
``cub::DispatchReduceByKey``): named in a note when no collective op launched it."""
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
    t = text.lower()  # NCCL kernel names come in either case (``nccldevkernel_allreduce...``)
    for p in ("nccldevkernel_", "ncclkernel_", "nccl::", "nccl:", "gloo:", "c10d::",
              "_c10d_functional::", "mpi:", "ucc:"):
        if t.startswith(p):
            t = t[len(p):]
            break
    t = t.replace("_", "")
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


def parse_pg_tag(name: str) -> tuple[str, int] | None:
    """(pg name, peer global rank or -1) of a process-group tag's name (``schemas.PG_TAG_PREFIX``
    + ``"<pg_name>"``, optionally + ``" peer <global rank>"``); None when ``name`` is not one
    or names no group."""
    if not name.startswith(PG_TAG_PREFIX):
        return None
    rest = name[len(PG_TAG_PREFIX):].strip()
    head, sep, tail = rest.rpartition(" peer ")
    peer = -1
    if sep and tail.strip().lstrip("-").isdigit():
        rest, peer = head.strip(), int(tail)
    return (rest, peer) if rest else None


def classify(df: pd.DataFrame, *, world_size: int | None,
             pg_sizes: dict[str, int] | None = None, pg_ranks: dict[str, str] | None = None,
             pg_descs: dict[str, str] | None = None) -> tuple[pd.DataFrame, dict]:
    """Add role, coll_kind, bytes, pg, rule, step to a decoded event table (analyzer/ingest/decode.py);
    on comm rows, dtype, pg_ranks, pg_desc, peer and group_size are resolved
    (analyzer/ingest/commid.py).

    ``pg_sizes``: process group name -> size (``commid.pg_sizes_of(distributedInfo)``);
    ``pg_ranks``: process group name -> its ranks (``commid.pg_ranks_of(distributedInfo)``);
    ``pg_descs``: process group name -> pg_desc (``commid.pg_descs_of(distributedInfo)``).
    Returns ``(events, info)`` with ``info`` = {device_kind, main_tid, whole_trace_mode,
    steps (``schemas.STEP_WINDOWS_SCHEMA``; analyzer/ingest/steps.py), unlaunched (bool per
    row: device work with no launch in the trace), notes (list of str: classes of events left
    out or counted by a rule the reader should know, the step rules' included)}. Pure function.
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

    coll_name = _obj(df["coll_name"])
    has_coll_arg = np.array([c is not None for c in coll_name], bool) if n else np.zeros(0, bool)
    is_nccl_kernel = (by_name(lambda u: NCCL_KERNEL_RE.match(u) is not None) | has_coll_arg) \
        & is_gpu & ~by_cat("gpu_user_annotation")
    is_deep_ep = by_name(lambda u: DEEP_EP_KERNEL_RE.search(u) is not None) & is_gpu \
        & ~is_nccl_kernel
    name_kind = by_name(_kind_code, np.int8)
    is_step = by_name(lambda u: STEP_RE.match(u) is not None) & ~is_gpu
    is_gloo = by_name(lambda u: u.startswith("gloo:")) & ~is_gpu
    is_c10d = by_name(lambda u: u.startswith("c10d::")) & ~is_gpu
    is_rpc = by_name(lambda u: u == "record_param_comms") & ~is_gpu
    is_func = by_name(lambda u: u.startswith("_c10d_functional::")) & ~is_gpu
    is_nccl_op = by_name(lambda u: u.startswith(("nccl:", "mpi:", "ucc:"))) & ~is_gpu
    is_symm = by_name(lambda u: u.startswith("symm_mem::")) & ~is_gpu
    is_hccl = by_name(lambda u: u.startswith("hccl:")) & ~is_gpu
    is_dispatch = by_name(lambda u: DISPATCH_OP_RE.match(u) is not None) & ~is_gpu
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
                        (is_nccl_kernel, "comm", "gpu.nccl_kernel"),
                        (is_deep_ep, "comm", "gpu.deep_ep_kernel")):
        mark(mask, r, ru)
    kind[is_deep_ep] = _KIND["all_to_all"]
    rule[is_htod] = _RULE["gpu.memcpy.htod"]

    # CPU
    cpu = ~is_gpu
    mark(cpu & by_cat("user_annotation", "trace"), "annotation", "cpu.annotation")
    is_tag = cpu & by_cat("user_annotation") & by_name(lambda u: parse_pg_tag(u) is not None)
    rule[is_tag] = _RULE["cpu.pg_tag"]
    mark(is_loader, "data", "cpu.dataloader_next")
    is_other_comm = is_symm | is_hccl | is_dispatch  # collective ops that are not NCCL
    enq = is_c10d | is_rpc | is_nccl_op | is_other_comm | is_func
    role[enq] = _ROLE["comm_enqueue"]
    rule[is_func] = _RULE["cpu.c10d_functional"]
    rule[is_c10d] = _RULE["cpu.c10d_enqueue"]
    rule[is_rpc] = _RULE["cpu.record_param_comms"]
    rule[is_nccl_op] = _RULE["cpu.nccl_op"]
    rule[is_symm] = _RULE["cpu.symm_mem_op"]
    rule[is_hccl] = _RULE["cpu.hccl_op"]
    rule[is_dispatch] = _RULE["cpu.dispatch_op"]
    arg_kind = np.full(n, -1, np.int8)
    for i in np.flatnonzero(has_coll_arg).tolist():
        arg_kind[i] = _kind_code(coll_name[i])
    other_kind = by_name(lambda u: _KIND[commid.kind_in_text(u)], np.int8)
    name_kind = np.where(is_other_comm, other_kind, name_kind)
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
        # External id as a fallback only where it is not a copy of the correlation id
        # (analyzer/ingest/commid.py: the DLRM set writes External id == correlation)
        missing = gpu_idx[(launch[gpu_idx] < 0) & (ext[gpu_idx] != corr[gpu_idx])]
        if len(missing):
            not_range = (role[cpu_idx] != _ROLE["annotation"]) & (role[cpu_idx] != _ROLE["data"])
            cand = cpu_idx[(ext[cpu_idx] >= 0) & not_range]
            launch[missing] = _lookup(ext[cand], cand, ext[missing])

    # --- kernels launched inside collective ops that are not NCCL -> comm ------------------
    other_ops = np.flatnonzero(is_other_comm)
    cand = np.flatnonzero(is_gpu & (role == _ROLE["compute"]) & (launch >= 0))
    if len(other_ops) and len(cand):
        op_of = commid.ops_enclosing(other_ops, launch[cand], ts, end, c_tid)
        hit = op_of >= 0
        rows, ops = cand[hit], op_of[hit]
        role[rows] = _ROLE["comm"]
        kind[rows] = name_kind[ops]
        rule[rows] = np.where(is_symm[ops], _RULE["gpu.symm_mem_kernel"],
                              np.where(is_hccl[ops], _RULE["gpu.hccl_kernel"],
                                       _RULE["gpu.dispatch_kernel"]))

    # --- collective identity: kind, bytes, dtype, group size, pg (analyzer/ingest/commid.py) -
    pg = _obj(df["pg"])
    pg_rk = _obj(df["pg_ranks"])
    dtype = _obj(df["dtype"])
    desc = _obj(df["pg_desc"]) if "pg_desc" in df.columns else np.full(n, None, object)
    from_args = np.array([p is not None for p in pg], bool) if n else np.zeros(0, bool)
    peer = np.full(n, -1, np.int64)
    tag_of = _tags(names, is_tag, enq, launch, is_gpu, ts, end, c_tid)
    for j, (t_pg, t_peer) in tag_of.items():  # enqueue ops take their tag's group and peer
        if enq[j] and pg[j] is None:
            pg[j] = t_pg
        if enq[j] and peer[j] < 0:
            peer[j] = t_peer
    group = df["group_size"].to_numpy().copy()
    seq_arg, comms_id, graph_rows = _seq_cols(df, n, is_gpu)
    nbytes = _bytes_from_args(df)
    args_bytes = nbytes.copy()  # bytes from each row's own collective args (-1 unknown)
    shape = _ShapeCols(df, names)
    fallback = commid.group_fallback(pg_sizes, world_size)
    members = pg_ranks or {}
    only_pg = next(iter(members)) if len(members) == 1 else None  # pg_config's one group

    def name_group(i: int) -> None:
        """pg of row ``i`` from pg_config's only group, pg_ranks from pg_config's ranks."""
        if pg[i] is None and only_pg is not None:
            pg[i] = only_pg
        if pg_rk[i] is None and pg[i] is not None and members.get(str(pg[i])):
            pg_rk[i] = members[str(pg[i])]

    def group_of(i: int, src=()) -> int:
        """Group size of row ``i`` launched by ops ``src`` (commid module docstring, 2-5)."""
        if group[i] > 0:
            return int(group[i])
        if pg[i] is not None and pg_sizes and str(pg[i]) in pg_sizes:
            return pg_sizes[str(pg[i])]
        k = KINDS[kind[i]] if kind[i] >= 0 else None
        if k in ("all_gather", "reduce_scatter"):
            for j in (i, *src):
                n = commid.group_from_counts(k, int(shape.n_in[j]), int(shape.n_out[j]))
                if n > 0:
                    return n
            for j in (i, *src):
                n = commid.group_from_tensors(str(names[j]), k, int(shape.numel[j]),
                                              int(shape.numel2[j]))
                if n > 0:
                    return n
        return fallback

    comm_k = np.flatnonzero(is_gpu & (role == _ROLE["comm"]))
    if len(comm_k):
        enq_idx = np.flatnonzero(enq)
        enq_cols = (enq_idx, ext[enq_idx], ts[enq_idx], end[enq_idx], c_tid[enq_idx])
        for i in comm_k.tolist():
            src = commid.launching_ops(launch[i], ext[i], corr[i], enq_cols, ext, ts, end, c_tid)
            if is_nccl_kernel[i]:
                if arg_kind[i] >= 0:
                    kind[i] = arg_kind[i]
                    rule[i] = _RULE["gpu.nccl_kernel.args"]
                elif (k := _kind_from_ops(src, arg_kind, name_kind, is_c10d)) >= 0:
                    kind[i] = k
                    rule[i] = _RULE["gpu.nccl_kernel.launch"]
                elif name_kind[i] >= 0:
                    kind[i] = name_kind[i]
                else:
                    kind[i] = _KIND["send_recv" if "sendrecv" in names[i].lower() else "other"]
            # pg: a record_param_comms' own name first, then a tagged op's, then the tag
            # around the launch itself
            if pg[i] is None:
                pg[i] = next((pg[j] for j in src if from_args[j]), None)
            for col in (pg, pg_rk, dtype, desc):
                if col[i] is None:
                    col[i] = next((col[j] for j in src if col[j] is not None), None)
            tag = tag_of.get(int(launch[i]))
            if pg[i] is None and tag is not None:
                pg[i] = tag[0]
            peer[i] = next((peer[j] for j in src if peer[j] >= 0),
                           tag[1] if tag is not None else -1)
            _take_seq(i, src, seq_arg, comms_id, graph_rows[i])
            name_group(i)
            if group[i] <= 0:
                group[i] = next((group[j] for j in src if group[j] > 0), -1)
            group[i] = group_of(i, src)
            if nbytes[i] < 0:
                nbytes[i] = _bytes_from_ops(src, KINDS[kind[i]], args_bytes, shape, int(group[i]))
    # --- gloo: pair each runloop op with its enqueue by order and time -----------------------
    gloo_idx = np.flatnonzero(is_gloo)
    paired = np.full(n, -1, np.int64)
    if len(gloo_idx):
        c10d_idx = np.flatnonzero(is_c10d & ~by_name(lambda u: u.startswith("c10d::wait")))
        paired = _pair_gloo(c10d_idx, gloo_idx, kind, name_kind, ts, paired)
        paired = _pair_gloo_by_group(c10d_idx, gloo_idx, kind, name_kind, ts, paired, pg, c_tid)
        for i in gloo_idx.tolist():
            j = paired[i]
            if j >= 0:
                rule[i] = _RULE["cpu.gloo_op.paired"]
                kind[i] = kind[j] if kind[j] >= 0 else kind[i]
                if pg[i] is None:
                    pg[i] = pg[j]
            if kind[i] < 0:
                kind[i] = _KIND["other"]
            if j >= 0:
                _take_seq(i, (j,), seq_arg, comms_id, False)
                for col in (pg_rk, dtype, desc):
                    if col[i] is None:
                        col[i] = col[j]
                peer[i] = peer[j] if peer[i] < 0 else peer[i]
                if group[i] <= 0:
                    group[i] = group[j]
            name_group(i)
            group[i] = group_of(i, (j,) if j >= 0 else ())
            if nbytes[i] < 0:
                nbytes[i] = shape.nbytes(i, KINDS[kind[i]], int(group[i]))
            if nbytes[i] < 0 and j >= 0:
                nbytes[i] = shape.nbytes(j, KINDS[kind[i]], int(group[i]))
    for i in np.flatnonzero(enq).tolist():
        name_group(i)
        if nbytes[i] < 0:
            nbytes[i] = shape.nbytes(i, KINDS[kind[i]] if kind[i] >= 0 else None, group_of(i))
    is_comm = (role == _ROLE["comm"]) | (role == _ROLE["comm_enqueue"])
    kind[~is_comm] = -1
    kind[is_comm & (kind < 0)] = _KIND["other"]

    steps = assign_steps(df, names=names, is_step=is_step, is_gpu=is_gpu,
                         is_gpu_annotation=is_gpu_ann, is_comm=role == _ROLE["comm"],
                         launch=launch, paired=paired, device_kind=device_kind,
                         is_trace_span=~is_gpu & by_cat("trace"))

    descs = pg_descs or {}
    for i in np.flatnonzero(is_comm).tolist():  # pg_config's description of the named group
        if desc[i] is None and pg[i] is not None:
            desc[i] = descs.get(str(pg[i]))
    out = df.drop(columns=[c for c in ("pg", "pg_ranks", "dtype", "group_size", "pg_desc",
                                       "seq_arg", "comms_id") if c in df.columns])
    out["step"] = steps.step
    out["role"] = pd.Categorical.from_codes(role, categories=list(ROLES))
    out["coll_kind"] = pd.Categorical.from_codes(kind, categories=list(KINDS))
    out["bytes"] = nbytes.astype(np.int64)
    out["pg"] = str_array(pg)
    out["pg_ranks"] = str_array(pg_rk)
    out["dtype"] = str_array([commid.dtype_name(d) for d in dtype])
    out["group_size"] = group.astype(np.int64)
    out["pg_desc"] = str_array(desc)
    out["peer"] = np.where(is_comm, peer, -1).astype(np.int64)
    out["seq_arg"] = np.where(is_comm, seq_arg, -1).astype(np.int64)
    out["comms_id"] = str_array(np.where(is_comm, comms_id, None))
    out["rule"] = _used_categories(rule, RULES)
    out["launch_row"] = launch
    out["paired_row"] = paired
    info = {"device_kind": device_kind, "main_tid": main_tid,
            "whole_trace_mode": steps.whole_trace, "steps": steps.table,
            "unlaunched": steps.unlaunched,
            "notes": _notes(df, u_cat, c_cat, rule, is_gpu & (role == _ROLE["compute"]) & by_name(
                lambda u: _LONE_EP_RE.search(u) is not None)) + steps.notes
            + graphs.replay_notes(graph_rows, has_coll_arg, launch, role == _ROLE["comm"], ts,
                                  end, names)}
    if device_kind == "gpu" and not (is_gpu & (role == _ROLE["comm"])).any():
        info["notes"] += _no_device_comm(names, is_c10d & ~by_name(
            lambda u: u.startswith("c10d::wait")), world_size)
    return out, info


def _no_device_comm(names: np.ndarray, calls: np.ndarray, world_size: int | None) -> list[str]:
    """A GPU rank whose CPU side calls collectives (``c10d::*``) while no communication runs on
    the device: say so, instead of a bare "no collectives" (a world of one rank, or groups of
    one: NCCL has nothing to move and launches no kernel)."""
    if not calls.any():
        return []
    counts = pd.Series(names[calls]).value_counts()
    top = ", ".join(f"{n} x{c}" for n, c in counts.head(4).items())
    why = (f"world size {world_size}: NCCL has nothing to move" if world_size == 1
           else "the trace shows no communication kernel for them")
    return [f"{int(calls.sum())} collective calls on the CPU side ({top}) ran no communication "
            f"on the device ({why}); communication figures are empty, not missing"]


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
    """The columns ``nbytes`` and the group-size ratios read, as numpy arrays (row access
    without pandas overhead): first tensor's numel and element size, second tensor's numel,
    In / Out msg nelems (analyzer/ingest/decode.py)."""

    __slots__ = ("numel", "size", "numel2", "n_in", "n_out", "names")

    def __init__(self, df: pd.DataFrame, names: np.ndarray):
        self.numel = df["shape_numel"].to_numpy()
        self.size = df["shape_elem_bytes"].to_numpy()
        self.numel2 = df["shape2_numel"].to_numpy()
        self.n_in = df["in_nelems"].to_numpy()
        self.n_out = df["out_nelems"].to_numpy()
        self.names = names

    def nbytes(self, i: int, kind: str | None, group: int) -> int:
        """Bytes of row ``i`` from its first tensor's shape and dtype (``commid.total_bytes``:
        a piece is multiplied by ``group``), -1 unknown."""
        return commid.total_bytes(str(self.names[i]), kind, int(self.numel[i]), int(self.size[i]),
                                  group)


def _bytes_from_ops(src, kind, args_bytes, shape: _ShapeCols, group: int) -> int:
    """Bytes of a collective from its launching ops ``src``: collective args first
    (record_param_comms), then the op shapes (below); -1 unknown."""
    for j in src:
        if args_bytes[j] >= 0:
            return int(args_bytes[j])
    # a c10d op's first tensor is its output: the whole buffer of an all_gather, the piece of a
    # reduce_scatter; for other kinds (an uneven all_to_all) the nccl:* op's input comes first
    c10d = [j for j in src if str(shape.names[j]).startswith("c10d::")]
    rest = [j for j in src if j not in c10d]
    for j in (c10d + rest if kind in ("all_gather", "reduce_scatter") else rest + c10d):
        b = shape.nbytes(j, kind, group)
        if b >= 0:
            return b
    return -1


def _seq_cols(df: pd.DataFrame, n: int, is_gpu: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Seq per row, int64 -1 unknown; Comms Id per row, object None unknown; bool per row:
    replayed from a CUDA graph) from the decoded columns (analyzer/ingest/decode.py), each row's
    own arguments; a graphed row's Seq / Comms Id are dropped: recorded at capture, they repeat
    on every replay (analyzer/ingest/graphs.py)."""
    seq = df["seq_arg"].to_numpy().astype(np.int64) if "seq_arg" in df.columns else \
        np.full(n, -1, np.int64)
    cid = _obj(df["comms_id"]) if "comms_id" in df.columns else np.full(n, None, object)
    node = df["graph_node"].to_numpy() if "graph_node" in df.columns else np.zeros(n, np.int64)
    rows = graphs.graphed(node, is_gpu)
    seq = np.where(rows, -1, seq)
    cid = np.where(rows, None, cid)
    return seq, cid, rows


def _take_seq(i: int, src, seq: np.ndarray, cid: np.ndarray, graphed: bool) -> None:
    """Row ``i``'s Seq / Comms Id, where its own arguments do not say, from its launching or
    paired ops ``src`` (the first that has one); none for a graphed row (capture-time values:
    analyzer/ingest/graphs.py)."""
    if graphed:
        return
    if seq[i] < 0:
        seq[i] = next((seq[j] for j in src if seq[j] >= 0), -1)
    if cid[i] is None:
        cid[i] = next((cid[j] for j in src if cid[j] is not None), None)


def _notes(df, u_cat, c_cat, rule, lone) -> list[str]:
    """Notes on classes of events the reader should know about: device categories not
    understood (not analysed), and GPU kernels counted as communication by a rule other than
    the NCCL name (symm_mem, hccl, dispatch / combine, DeepEP), with their count and time."""
    out = []
    dur = df["dur_ns"].to_numpy()
    for code, cat in enumerate(u_cat):
        if cat.lower() in KNOWN_CATS or not UNKNOWN_DEVICE_RE.search(cat):
            continue
        sel = c_cat == code
        out.append(f"{int(sel.sum())} events of category '{cat}' ({dur[sel].sum() / 1e6:.3f} ms "
                   "summed): a device kind the analyzer does not understand; not analysed "
                   "(the rank's figures come from its other events)")
    for ru, what in (("gpu.symm_mem_kernel", "symm_mem::* ops (torch symmetric memory)"),
                     ("gpu.hccl_kernel", "hccl:* ops"),
                     ("gpu.dispatch_kernel", "dispatch / combine / all_to_all ops"),
                     ("gpu.deep_ep_kernel", "DeepEP (deep_ep::*)")):
        sel = rule == _RULE[ru]
        if sel.any():
            out.append(f"{int(sel.sum())} GPU kernels launched by {what}, "
                       f"{dur[sel].sum() / 1e6:.3f} ms summed, counted as communication "
                       f"(rule {ru}), not NCCL")
    if lone.any():
        out.append(f"{int(lone.sum())} GPU kernels named like dispatch / combine "
                   f"({dur[lone].sum() / 1e6:.3f} ms summed) counted as computation: no "
                   "collective op launched them, so they cannot be told from compute")
    return out


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


def _tags(names, is_tag, enq, launch, is_gpu, ts, end, tid) -> dict[int, tuple[str, int]]:
    """{row: (pg, peer)} for every comm enqueue op and every runtime launch of a GPU row that a
    process-group tag (``parse_pg_tag``) encloses on the same thread: the innermost tag's."""
    tags = np.flatnonzero(is_tag)
    if not len(tags):
        return {}
    launches = launch[is_gpu & (launch >= 0)]
    cand = np.unique(np.concatenate([np.flatnonzero(enq), launches])).astype(np.int64)
    at = commid.ops_enclosing(tags, cand, ts, end, tid)
    return {int(r): parse_pg_tag(str(names[t])) for r, t in zip(cand.tolist(), at.tolist())
            if t >= 0}


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
