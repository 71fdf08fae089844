"""Classify decoded events: role, collective kind, bytes, process group, and the rule used.

Rule ids (column ``rule``): ``RULE_TABLE`` in order of precedence, each row with where it comes
from (a ``gpu.*`` rule takes GPU events, ``is_gpu``; a ``cpu.*`` rule the others); then the rules
that follow links between rows, each said by the function that applies it: cpu.main_thread_op
(``_main_thread_rule``), gpu.symm_mem_kernel / gpu.hccl_kernel / gpu.dispatch_kernel
(``_kernels_in_ops``), gpu.nccl_kernel.args / gpu.nccl_kernel.launch (``_comm_kernels``),
cpu.gloo_op.paired (``_gloo_ops``).

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

from analyzer.contract.schemas import PG_TAG_PREFIX, PG_TAG_TENSOR
from analyzer.ingest import commid, graphs
from analyzer.ingest.commid import DEEP_EP_KERNEL_RE, DISPATCH_OP_RE, NCCL_KERNEL_RE
from analyzer.ingest.decode import dtype_bytes, str_array
from analyzer.ingest.steps import STEP_RE, assign_steps

ROLES = ("compute", "comm", "comm_enqueue", "memcpy", "memset", "sync", "step", "annotation",
         "other", "data")
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "all_to_all", "send_recv",
         "barrier", "other")

_ROLE = {r: i for i, r in enumerate(ROLES)}
_KIND = {k: i for i, k in enumerate(KINDS)}

EARLY_DEVICE_CATS = {"memcpy": "gpu_memcpy", "memset": "gpu_memset"}
"""Device categories as Kineto first wrote them (compared lower-cased), by today's name. Its
ChromeTraceLogger (pytorch/kineto libkineto/src/output_json.cpp, ``handleGpuActivity``) wrote
the category as a literal per CUPTI record, ``"cat": "Kernel"``, ``"Memcpy"``, ``"Memset"``
(with ``Operator`` and ``Runtime`` on the host), the shape of the traces tb_plugin read in 2021
(tb_plugin/test/test_profiler.py ``test_all_categories``; its samples of June 2021); later
versions write ``toString(ActivityType)`` (libkineto/src/ActivityType.cpp: ``kernel``,
``gpu_memcpy``, ``gpu_memset``). ``Kernel`` already reads as ``kernel`` lower-cased; without
these two, such a trace's copies and memsets were CPU events and its step windows started at
its first kernel. analyzer/ingest/decode.py ``GPU_CATS`` puts them on the device. (Their
``Runtime`` launches are found through ``external id``, ``_launches``.)"""
KNOWN_CATS = frozenset({
    "cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "kernel",
    "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "gpu_sync", "ac2g",
    "overhead", "trace", "fwdbwd", "cpu_instant_event", "memory", *EARLY_DEVICE_CATS})
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

FAKE_BACKEND = "fake"
"""distributedInfo's backend on torch's fake process group (``torch.distributed.Backend.FAKE``,
torch/testing/_internal/distributed/fake_pg.py; the C++ ``FakeProcessGroup``,
torch/csrc/distributed/c10d/FakeProcessGroup.hpp, completes every collective at once and runs
no transfer op). Rule cpu.fake_pg_call: each collective call is then its ``c10d::*`` op (not a
``c10d::wait*``), as a gloo op is on a real trace. One call, one op: every ProcessGroup method
is one dispatcher op (torch/csrc/distributed/c10d/Ops.cpp, ``c10d::allreduce_`` ...), which a
torch.distributed call runs once, and a funcol op runs once inside itself (torch/csrc/
distributed/c10d/Functional.cpp; the profiler records ``_c10d_functional::all_reduce`` around
``c10d::allreduce_``, ``_c10d_functional::all_gather_into_tensor`` around
``c10d::allgather_into_tensor_coalesced_``), so the ``_c10d_functional::*`` op stays an
enqueue: counting both counted each tensor-parallel call twice. On gloo each such ``c10d::*``
op is paired with exactly one ``gloo:*`` op (``_pair_gloo``): the same calls a record counts
(tests/tracer/test_project.py grades a fsdp2_tp projection against a gloo record)."""

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
    rest = rest.partition(PG_TAG_TENSOR)[0].strip()  # the fake group's tensor note
    return (rest, peer) if rest else None


def parse_tag_tensor(name: str) -> tuple[str, int] | None:
    """(dtype, elements) of a process-group tag's tensor note (``schemas.PG_TAG_PREFIX``: the
    fake group's, ``tracer project``), None without one."""
    if not name.startswith(PG_TAG_PREFIX) or PG_TAG_TENSOR not in name:
        return None
    words = name.partition(PG_TAG_TENSOR)[2].split()
    if len(words) < 2 or not words[1].isdigit():
        return None
    return words[0], int(words[1])


def _on_cpu(test):
    """A table predicate: CPU rows whose name passes ``test``."""
    return lambda e: e.cpu & e.name(test)


def _prefix(*prefixes: str):
    """A table predicate: CPU rows whose name starts with one of ``prefixes``."""
    return _on_cpu(lambda u: u.startswith(prefixes))


RULE_TABLE = (
    # (rule id, role or None: the row keeps the role an earlier rule gave it, its rows), in
    # order of precedence: a later rule takes a row from an earlier one.
    # on a GPU rank every CPU op is other
    ("cpu.other", "other", lambda e: np.ones(e.n, bool)),
    ("gpu.kernel", "compute", lambda e: e.gpu),  # HTA is_compute_kernel
    # HTA excludes ``.*Sync`` from computation; memcpy / memset: HTA ``is_memory_kernel``
    ("gpu.sync", "sync",
     lambda e: e.gpu & (e.cat("cuda_sync", "gpu_sync") | e.name(lambda u: "Sync" in u))),
    # early Kineto's ``Memset`` / ``Memcpy`` categories too (``EARLY_DEVICE_CATS``)
    ("gpu.memset", "memset",
     lambda e: e.gpu & (e.cat("gpu_memset", "memset")
                        | e.name(lambda u: u.startswith("Memset")))),
    ("gpu.memcpy", "memcpy",
     lambda e: e.gpu & (e.cat("gpu_memcpy", "memcpy")
                        | e.name(lambda u: u.startswith("Memcpy")))),
    ("gpu.annotation", "annotation", lambda e: e.gpu & e.cat("gpu_user_annotation")),  # a range
    # HTA ``is_comm_kernel`` (``^nccl.*Kernel``, matched case-insensitively: ``ncclKernel_*``,
    # ``ncclDevKernel_*``, ``nccldevkernel_*``; and ``nccl::Allreduce``-style names), or any GPU
    # kernel carrying a ``Collective name`` argument
    ("gpu.nccl_kernel", "comm", lambda e: (e.name(NCCL_KERNEL_RE.match) | e.has_coll_arg)
     & e.gpu & ~e.cat("gpu_user_annotation")),
    ("gpu.deep_ep_kernel", "comm", lambda e: e.gpu & e.name(DEEP_EP_KERNEL_RE.search)
     & ~e.rows("gpu.nccl_kernel")),  # DeepEP dispatch / combine: all_to_all
    # ``Memcpy HtoD (Pinned -> Device)``: an input copy for the breakdown's data supply
    # (analyzer/analyses/breakdown.py; issue 10)
    ("gpu.memcpy.htod", None, lambda e: e.rows("gpu.memcpy") & e.name(lambda u: "HtoD" in u)),
    # so is Kineto's span of the whole profiled window (category ``Trace``, ``PyTorch Profiler
    # (0)`` on pid ``Spans``): no work ran in it (as other, it turned a CPU rank's idle into other)
    ("cpu.annotation", "annotation", lambda e: e.cpu & e.cat("user_annotation", "trace")),
    # the tracer's process-group tag (``schemas.PG_TAG_PREFIX``): counts as nothing in the
    # breakdown; it names the process group (and the peer of a send / recv) of the collectives
    # it encloses (analyzer/ingest/commid.py, pg)
    ("cpu.pg_tag", None, lambda e: e.cpu & e.cat("user_annotation") & e.name(parse_pg_tag)),
    # the range torch.utils.data.DataLoader's iterator records around each batch fetch
    ("cpu.dataloader_next", "data", _on_cpu(DATALOADER_RE.match)),
    # DTensor / TP functional collectives around their ``c10d::*`` op, and ``wait_tensor``:
    # the main thread waiting for one, milliseconds on gloo
    ("cpu.c10d_functional", "comm_enqueue", _prefix("_c10d_functional::")),
    # ``c10d::wait*`` included: time the main thread spends in a collective is not computation
    ("cpu.c10d_enqueue", "comm_enqueue", _prefix("c10d::")),
    # torch's fake process group (distributedInfo backend "fake", ``tracer project``) runs no
    # transfer op: each collective call is its ``c10d::*`` op (``FAKE_BACKEND``)
    ("cpu.fake_pg_call", "comm", lambda e: e.calls() if e.fake else np.zeros(e.n, bool)),
    ("cpu.record_param_comms", "comm_enqueue", _on_cpu(lambda u: u == "record_param_comms")),
    ("cpu.nccl_op", "comm_enqueue", _prefix("nccl:", "mpi:", "ucc:")),
    ("cpu.symm_mem_op", "comm_enqueue", _prefix("symm_mem::")),
    ("cpu.hccl_op", "comm_enqueue", _prefix("hccl:")),
    ("cpu.dispatch_op", "comm_enqueue", _on_cpu(DISPATCH_OP_RE.match)),
    # any thread: gloo runs them on ``pt_gloo_runloop`` threads
    ("cpu.gloo_op", "comm", _prefix("gloo:")),
    ("cpu.profiler_step", "step", _on_cpu(STEP_RE.match)),
)
RULES = tuple(r for r, _, _ in RULE_TABLE) + (
    "gpu.nccl_kernel.args", "gpu.nccl_kernel.launch", "gpu.symm_mem_kernel", "gpu.hccl_kernel",
    "gpu.dispatch_kernel", "cpu.gloo_op.paired", "cpu.main_thread_op", "cpu.compiled_region")
COMPILED_RE = re.compile(r"^(?:Torch-Compiled Region: |## Call CompiledFxGraph |CompiledFunction"
                         r"(?:Backward)?$|autograd::engine::evaluate_function: CompiledFunction"
                         r"Backward$|(?:graph_\d+_)?cpp_fused_)")
"""What torch.compile runs, as a CPU rank's trace names it (torch 2.13): the dynamo frame
(torch/_dynamo/convert_frame.py: ``"Torch-Compiled Region: " + compile_id``), AOTAutograd's
autograd function and its backward (torch/_functorch/_aot_autograd/runtime_wrappers.py
``CompiledFunction``), inductor's call of its graph (torch/_inductor/output_code.py:
``## Call CompiledFxGraph <key> ##``, a user annotation around the fused C++ kernels, which
have no event of their own unless ``torch._inductor.config.cpp.enable_kernel_profile``) and
those kernels when profiled (``graph_<n>_cpp_fused_*``, the graph's number first). On a GPU rank inductor's Triton kernels
(``triton_poi_fused_*``, ``triton_red_fused_*``, ...) are device kernels: gpu.kernel."""
_RULE = {r: i for i, r in enumerate(RULES)}
_PREDICATE = {rule_id: when for rule_id, _, when in RULE_TABLE}
_OTHER_COMM = ("cpu.symm_mem_op", "cpu.hccl_op", "cpu.dispatch_op")  # not NCCL
_ENQUEUE = ("cpu.c10d_functional", "cpu.c10d_enqueue", "cpu.record_param_comms",
            "cpu.nccl_op") + _OTHER_COMM


class _Events:
    """The (time-sorted) event table as the rules read and write it, in its row order: numpy
    columns; names, categories and threads as distinct values + a code per row, so that a
    predicate runs once per distinct value; each table rule's rows (``rows``: what its predicate
    matches, whichever rule the row ends with); role, rule and kind as codes into ROLES, RULES,
    KINDS (kind -1: none yet)."""

    def __init__(self, df: pd.DataFrame, fake: bool = False):
        self.n = n = len(df)
        self.fake = fake  # the trace's backend is torch's fake process group (FAKE_BACKEND)
        self.uniq, self.codes = _distinct(df["name"])
        self.names = self.uniq[self.codes]
        self.u_cat, self.c_cat = _distinct(df["cat"])
        self._u_cat_lc = [x.lower() for x in self.u_cat]
        self.u_tid, self.c_tid = _distinct(df["tid"])
        self.gpu = df["is_gpu"].to_numpy()
        self.cpu = ~self.gpu
        self.ts, self.end = df["ts_ns"].to_numpy(), df["end_ns"].to_numpy()
        self.ext, self.corr = df["external_id"].to_numpy(), df["correlation"].to_numpy()
        self.coll_name = _obj(df["coll_name"])
        self.has_coll_arg = np.array([c is not None for c in self.coll_name], bool) if n else \
            np.zeros(0, bool)
        self._rows: dict[str, np.ndarray] = {}
        self.enq = np.any([self.rows(r) for r in _ENQUEUE], axis=0)  # comm enqueue ops
        self.other_comm = np.any([self.rows(r) for r in _OTHER_COMM], axis=0)
        self.role = np.full(n, _ROLE["other"], np.int8)
        self.rule = np.full(n, _RULE["cpu.other"], np.int8)
        self.kind = np.full(n, -1, np.int8)
        # what a row says of its kind: its ``Collective name`` argument, its name (a collective
        # op that is not NCCL: ``commid.kind_in_text``)
        self.arg_kind = np.full(n, -1, np.int8)
        for i in np.flatnonzero(self.has_coll_arg).tolist():
            self.arg_kind[i] = _kind_code(self.coll_name[i])
        self.name_kind = np.where(self.other_comm,
                                  self.name(lambda u: _KIND[commid.kind_in_text(u)], np.int8),
                                  self.name(_kind_code, np.int8))

    def name(self, fn, dtype=bool) -> np.ndarray:
        """``fn`` of each row's name (``bool``: its truth), called once per distinct name."""
        if not len(self.uniq):
            return np.zeros(self.n, dtype)
        values = [fn(u) for u in self.uniq]
        return np.array([bool(v) for v in values] if dtype is bool else values, dtype)[self.codes]

    def cat(self, *values: str) -> np.ndarray:
        """Rows whose category, lower-cased, is one of ``values``."""
        return np.array([c in values for c in self._u_cat_lc], bool)[self.c_cat] \
            if len(self.u_cat) else np.zeros(self.n, bool)

    def rows(self, rule_id: str) -> np.ndarray:
        """The rows ``RULE_TABLE``'s predicate of ``rule_id`` matches (computed once)."""
        if rule_id not in self._rows:
            self._rows[rule_id] = _PREDICATE[rule_id](self)
        return self._rows[rule_id]

    def calls(self) -> np.ndarray:
        """``c10d::*`` enqueue ops that call a collective (``c10d::wait*`` waits for one)."""
        return self.rows("cpu.c10d_enqueue") & ~self.name(lambda u: u.startswith("c10d::wait"))


def classify(df: pd.DataFrame, *, world_size: int | None,
             pg_sizes: dict[str, int] | None = None, pg_ranks: dict[str, str] | None = None,
             pg_descs: dict[str, str] | None = None, path: str = "<trace>",
             backend: str | None = None) -> tuple[pd.DataFrame, dict]:
    """Add role, coll_kind, bytes, pg, rule, step to a decoded event table (analyzer/ingest/decode.py);
    on comm rows, dtype, pg_ranks, pg_desc, peer and group_size are resolved
    (analyzer/ingest/commid.py). Roles and rules: ``RULE_TABLE`` in order, then the rules that
    follow links between rows.

    ``pg_sizes``: process group name -> size (``distinfo.DistInfo.sizes``);
    ``pg_ranks``: process group name -> its ranks (``DistInfo.ranks_text``);
    ``pg_descs``: process group name -> pg_desc (``DistInfo.descs``);
    ``backend``: distributedInfo's backend (``FAKE_BACKEND``: rule cpu.fake_pg_call).
    Returns ``(events, info)`` with ``info`` = {device_kind, main_tid, whole_trace_mode,
    steps (``schemas.STEP_WINDOWS_SCHEMA``; analyzer/ingest/steps.py), unlaunched (bool per
    row: device work with no launch in the trace), notes (list of str: classes of events left
    out or counted by a rule the reader should know, the step rules' included)}. Pure function.
    Raises ``BadInput`` naming ``path`` for a ProfilerStep number no profiler writes
    (``steps.step_number``).
    """
    if not _time_ordered(df["ts_ns"].to_numpy(), df["end_ns"].to_numpy()):
        df = df.sort_values(["ts_ns", "end_ns"], ascending=[True, False], kind="stable")
    df = df.reset_index(drop=True)  # analyzer/ingest/decode.py already gives this order
    e = _Events(df, fake=backend == FAKE_BACKEND)
    for rule_id, role, _ in RULE_TABLE:
        rows = e.rows(rule_id)
        e.rule[rows] = _RULE[rule_id]
        if role is not None:
            e.role[rows] = _ROLE[role]
    # kinds the table's comm rows say themselves
    e.kind[e.rows("gpu.deep_ep_kernel")] = _KIND["all_to_all"]
    enq, gloo = e.enq, e.rows("cpu.gloo_op")
    e.kind[enq] = np.where(e.arg_kind[enq] >= 0, e.arg_kind[enq], e.name_kind[enq])
    e.kind[gloo] = e.name_kind[gloo]
    device_kind = "gpu" if (e.gpu & e.cat("kernel")).any() else "cpu"
    main_tid = _main_thread_rule(df, e) if device_kind == "cpu" else None
    launch = _launches(e)
    _kernels_in_ops(e, launch)
    ident = _Identity(df, e, launch, world_size, pg_sizes, pg_ranks)
    _comm_kernels(e, launch, ident)
    paired = _gloo_ops(e, ident)
    ident.enqueue(np.flatnonzero(e.enq))
    _fake_calls(e, ident)
    is_comm = (e.role == _ROLE["comm"]) | (e.role == _ROLE["comm_enqueue"])
    e.kind[~is_comm] = -1
    e.kind[is_comm & (e.kind < 0)] = _KIND["other"]
    steps = assign_steps(df, names=e.names, is_step=e.rows("cpu.profiler_step"), is_gpu=e.gpu,
                         is_gpu_annotation=e.rows("gpu.annotation"),
                         is_comm=e.role == _ROLE["comm"], launch=launch, paired=paired,
                         device_kind=device_kind, is_trace_span=e.cpu & e.cat("trace"),
                         path=path)
    out = ident.table(df, steps.step, is_comm, pg_descs, launch, paired)
    compute_kernel = e.gpu & (e.role == _ROLE["compute"])
    notes = _notes(df, e.u_cat, e.c_cat, e.rule, compute_kernel & e.name(_LONE_EP_RE.search)) \
        + steps.notes + graphs.replay_notes(ident.graphed, e.has_coll_arg, launch,
                                            e.role == _ROLE["comm"], e.ts, e.end, e.names)
    if device_kind == "gpu" and not (e.gpu & (e.role == _ROLE["comm"])).any():
        notes += _no_device_comm(e.names, e.calls(), world_size)
    return out, {"device_kind": device_kind, "main_tid": main_tid,
                 "whole_trace_mode": steps.whole_trace, "steps": steps.table,
                 "unlaunched": steps.unlaunched, "notes": notes}


def _main_thread_rule(df: pd.DataFrame, e: _Events) -> str | None:
    """cpu.main_thread_op on a CPU-only rank: the cpu_op rows no table rule took on its main
    thread (module docstring; ties go to the thread whose tid sorts first as a string) are
    compute; cpu.compiled_region: so are torch.compile's regions there (``COMPILED_RE``). Returns the main thread's tid, None when no row tells."""
    n_tid = len(e.u_tid)
    ops = e.cat("cpu_op") & (e.role == _ROLE["other"])
    score = next((np.bincount(e.c_tid[m], minlength=n_tid) for m in (
        e.rows("cpu.profiler_step"), e.rows("cpu.c10d_enqueue")) if m.any()), None)
    if score is None:
        if not ops.any():
            return None
        score = np.zeros(n_tid, np.int64)
        np.add.at(score, e.c_tid[ops], df["dur_ns"].to_numpy()[ops])
        score[np.bincount(e.c_tid[ops], minlength=n_tid) == 0] = -1  # no such ops: never wins
    code = min(np.flatnonzero(score == score.max()).tolist(), key=lambda c: str(e.u_tid[c]))
    rows = e.cpu & (e.c_tid == code) & ops
    e.role[rows] = _ROLE["compute"]
    e.rule[rows] = _RULE["cpu.main_thread_op"]
    # cpu.compiled_region: torch.compile's regions and kernels on the main thread (``COMPILED_RE``),
    # compute whatever their category (inductor's graph call is a user annotation around its
    # fused kernels: their time); collectives inside keep their own rules (comm, comm_enqueue)
    compiled = e.cpu & (e.c_tid == code) & e.name(COMPILED_RE.match) & (
        (e.role == _ROLE["other"]) | (e.role == _ROLE["compute"]) | (e.role == _ROLE["annotation"]))
    e.role[compiled] = _ROLE["compute"]
    e.rule[compiled] = _RULE["cpu.compiled_region"]
    return str(e.u_tid[code])


def _launches(e: _Events) -> np.ndarray:
    """Row of each GPU row's launching CPU event (correlation id, else External id), -1 none."""
    launch = np.full(e.n, -1, np.int64)
    gpu_idx, cpu_idx = np.flatnonzero(e.gpu), np.flatnonzero(e.cpu)
    if not len(gpu_idx):
        return launch
    ext, corr = e.ext, e.corr
    rt_idx = np.flatnonzero(e.cpu & (corr >= 0) & e.cat("cuda_runtime", "cuda_driver", "cpu_op"))
    launch[gpu_idx] = _lookup(corr[rt_idx], rt_idx, corr[gpu_idx])
    # External id as a fallback only where it is not a copy of the correlation id
    # (analyzer/ingest/commid.py: the DLRM set writes External id == correlation)
    missing = gpu_idx[(launch[gpu_idx] < 0) & (ext[gpu_idx] != corr[gpu_idx])]
    if len(missing):
        not_range = (e.role[cpu_idx] != _ROLE["annotation"]) & (e.role[cpu_idx] != _ROLE["data"])
        cand = cpu_idx[(ext[cpu_idx] >= 0) & not_range]
        launch[missing] = _lookup(ext[cand], cand, ext[missing])
    return launch


def _kernels_in_ops(e: _Events, launch: np.ndarray) -> None:
    """gpu.symm_mem_kernel, gpu.hccl_kernel, gpu.dispatch_kernel: a compute kernel whose runtime
    launch lies inside a ``symm_mem::*`` op (torch symmetric memory, e.g.
    ``multimem_all_reduce_``), an ``hccl:*`` op (Ascend HCCL) or a custom dispatch / combine /
    all_to_all op (``commid.DISPATCH_OP_RE``) is communication of the op's kind."""
    ops = np.flatnonzero(e.other_comm)
    cand = np.flatnonzero(e.gpu & (e.role == _ROLE["compute"]) & (launch >= 0))
    if not (len(ops) and len(cand)):
        return
    op_of = commid.ops_enclosing(ops, launch[cand], e.ts, e.end, e.c_tid)
    rows, ops = cand[op_of >= 0], op_of[op_of >= 0]
    e.role[rows] = _ROLE["comm"]
    e.kind[rows] = e.name_kind[ops]
    e.rule[rows] = np.where(e.rows("cpu.symm_mem_op")[ops], _RULE["gpu.symm_mem_kernel"],
                            np.where(e.rows("cpu.hccl_op")[ops], _RULE["gpu.hccl_kernel"],
                                     _RULE["gpu.dispatch_kernel"]))


def _comm_kernels(e: _Events, launch: np.ndarray, ident: "_Identity") -> None:
    """Every GPU comm row: an NCCL kernel's kind (gpu.nccl_kernel.args: its own ``Collective
    name``, as newer Kineto copies record_param_comms' args onto it; gpu.nccl_kernel.launch: its
    launching ops' (``_kind_from_ops``: the CPU side first, analyzer/ingest/commid.py); else, rule
    gpu.nccl_kernel, its name's), then its identity from its launching enqueue ops
    (``_Identity.kernel``). All kernels at once: the launching ops of each are found in one
    pass (``commid.launching_ops``), and no kernel's answer reads another kernel's."""
    kernels = np.flatnonzero(e.gpu & (e.role == _ROLE["comm"]))
    if not len(kernels):
        return
    offsets, src = commid.launching_ops(launch[kernels], e.ext[kernels], e.corr[kernels],
                                        np.flatnonzero(e.enq), e.ext, e.ts, e.end, e.c_tid)
    seg = np.repeat(np.arange(len(kernels)), np.diff(offsets))
    on = e.rows("gpu.nccl_kernel")[kernels]  # the kind rules below are NCCL kernels' only
    args = on & (e.arg_kind[kernels] >= 0)
    from_ops = _kind_from_ops(seg, src, len(kernels), e.arg_kind, e.name_kind,
                              e.rows("cpu.c10d_enqueue"))
    launched = on & ~args & (from_ops >= 0)
    named = on & ~args & ~launched
    kind = np.where(args, e.arg_kind[kernels], np.where(launched, from_ops, e.name_kind[kernels]))
    # a name that says nothing: SendRecv kernels are send_recv, the rest other
    sendrecv = e.name(lambda u: "sendrecv" in u.lower())[kernels]
    unnamed = named & (kind < 0)
    kind[unnamed] = np.where(sendrecv[unnamed], _KIND["send_recv"], _KIND["other"])
    e.kind[kernels[on]] = kind[on]
    e.rule[kernels[args]] = _RULE["gpu.nccl_kernel.args"]
    e.rule[kernels[launched]] = _RULE["gpu.nccl_kernel.launch"]
    ident.kernel(kernels, seg, src, launch[kernels])


def _gloo_ops(e: _Events, ident: "_Identity") -> np.ndarray:
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
    j = paired[gloo_idx]
    has = gloo_idx[j >= 0]
    e.rule[has] = _RULE["cpu.gloo_op.paired"]
    e.kind[has] = np.where(e.kind[paired[has]] >= 0, e.kind[paired[has]], e.kind[has])
    e.kind[gloo_idx[e.kind[gloo_idx] < 0]] = _KIND["other"]
    ident.gloo_op(gloo_idx, j)
    return paired


class _Identity:
    """The identity of the comm rows (analyzer/ingest/commid.py) as it is resolved: pg, its
    ranks, dtype, pg_desc (object arrays, None unknown), peer, group size, Seq, Comms Id,
    bytes (-1 unknown); each row's own arguments first, then its process-group tag, its
    launching or paired ops."""

    def __init__(self, df: pd.DataFrame, e: _Events, launch: np.ndarray,
                 world_size: int | None, pg_sizes: dict[str, int] | None,
                 pg_ranks: dict[str, str] | None):
        n, self.e = e.n, e
        self.pg, self.pg_rk, self.dtype = _obj(df["pg"]), _obj(df["pg_ranks"]), _obj(df["dtype"])
        self.desc = _obj(df["pg_desc"]) if "pg_desc" in df.columns else np.full(n, None, object)
        self.from_args = ~_none(self.pg)
        self.peer = np.full(n, -1, np.int64)
        self.tag_of = _tags(e.names, e.rows("cpu.pg_tag"), e.enq, launch, e.gpu, e.ts, e.end,
                            e.c_tid)
        for j, (t_pg, t_peer) in self.tag_of.items():  # enqueue ops take their tag's group
            if e.enq[j] and self.pg[j] is None:
                self.pg[j] = t_pg
            if e.enq[j] and self.peer[j] < 0:
                self.peer[j] = t_peer
        self.group = df["group_size"].to_numpy().copy()
        # a graphed row's Seq / Comms Id are dropped: recorded at capture, they repeat on every
        # replay (analyzer/ingest/graphs.py)
        self.graphed = graphs.graphed(df["graph_node"].to_numpy() if "graph_node" in df.columns
                                      else np.zeros(n, np.int64), e.gpu)
        self.seq = np.where(self.graphed, -1, df["seq_arg"].to_numpy().astype(np.int64)
                            if "seq_arg" in df.columns else np.full(n, -1, np.int64))
        self.cid = np.where(self.graphed, None, _obj(df["comms_id"]) if "comms_id" in df.columns
                            else np.full(n, None, object))
        self.nbytes = _bytes_from_args(df)
        self.args_bytes = self.nbytes.copy()  # bytes from each row's own collective args
        # first tensor's numel and element size, second tensor's numel, In / Out msg nelems
        self.numel, self.size, self.numel2, self.n_in, self.n_out = (df[c].to_numpy().copy() for c in (
            "shape_numel", "shape_elem_bytes", "shape2_numel", "in_nelems", "out_nelems"))
        # the fake group's tag notes (tracer project): an enqueue op's first tensor where its
        # own record lacks it (a tensor-list op: Kineto writes no dtype)
        for j, (t_dtype, t_numel) in _tag_tensors(e.names, e.rows("cpu.pg_tag"), e.enq, e.ts,
                                                   e.end, e.c_tid).items():
            if self.numel[j] < 0 or self.size[j] < 0:
                self.numel[j], self.size[j] = t_numel, dtype_bytes(t_dtype)
            if self.dtype[j] is None:
                self.dtype[j] = t_dtype
        self.pg_sizes = pg_sizes
        self.fallback = commid.group_fallback(pg_sizes, world_size)
        self.members = pg_ranks or {}
        self.only_pg = next(iter(self.members)) if len(self.members) == 1 else None
        self.c10d = e.name(lambda u: u.startswith("c10d::"))  # (output, input) first tensors

    def shape_bytes(self, rows: np.ndarray, kind: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Bytes of ``rows`` from their first tensor's shape and dtype
        (``commid.total_bytes_cols``: a piece is multiplied by ``group``) as collectives of
        kind codes ``kind`` (-1: none), -1 unknown."""
        return commid.total_bytes_cols(self.c10d[rows], kind == _KIND["all_gather"],
                                       kind == _KIND["reduce_scatter"], self.numel[rows],
                                       self.size[rows], group)

    def ops_bytes(self, seg: np.ndarray, src: np.ndarray, kind: np.ndarray, group: np.ndarray
                  ) -> np.ndarray:
        """Bytes of each collective from its launching ops (``src``, flat, in order; ``seg``:
        whose): collective args first (record_param_comms), then the op shapes (below); -1
        unknown. ``kind``, ``group``: the collectives' kind codes and group sizes."""
        n = len(kind)
        out = _pick(self.args_bytes[src], _first(seg, self.args_bytes[src] >= 0, n), -1)
        # a c10d op's first tensor is its output: the whole buffer of an all_gather, the piece
        # of a reduce_scatter; for other kinds (an uneven all_to_all) the nccl:* op's input first
        k = kind[seg]
        piece = (k == _KIND["all_gather"]) | (k == _KIND["reduce_scatter"])
        later = np.where(piece, ~self.c10d[src], self.c10d[src])
        order = np.lexsort((np.arange(len(src)), later, seg))
        b = self.shape_bytes(src, k, group[seg])[order]
        shaped = _pick(b, _first(seg[order], b >= 0, n), -1)
        return np.where(out >= 0, out, shaped)

    def take_seq(self, rows: np.ndarray, seg: np.ndarray, src: np.ndarray) -> None:
        """Seq / Comms Id of ``rows``, where their own arguments do not say, from their
        launching or paired ops (``src``, flat; ``seg``: index into ``rows``): the first that
        has one."""
        n = len(rows)
        need = rows[self.seq[rows] < 0]
        got = _pick(self.seq[src], _first(seg, self.seq[src] >= 0, n), -1)
        self.seq[need] = got[self.seq[rows] < 0]
        need = _none(self.cid[rows])
        got = _pick(self.cid[src], _first(seg, ~_none(self.cid[src]), n), None)
        self.cid[rows[need]] = got[need]

    def name_group(self, rows: np.ndarray) -> None:
        """pg of ``rows`` from pg_config's only group, pg_ranks from pg_config's ranks."""
        if self.only_pg is not None:
            self.pg[rows[_none(self.pg[rows])]] = self.only_pg
        if self.members:
            r = rows[_none(self.pg_rk[rows]) & ~_none(self.pg[rows])]
            ranks = _objects(_per_distinct(self.pg[r], lambda p: self.members.get(str(p))))
            has = np.array([bool(x) for x in ranks], bool) if len(r) else np.zeros(0, bool)
            self.pg_rk[r[has]] = ranks[has]

    def group_of(self, rows: np.ndarray, seg: np.ndarray | None = None,
                 src: np.ndarray | None = None) -> np.ndarray:
        """Group size of ``rows`` launched by ops ``src`` (flat, in order; ``seg``: index into
        ``rows``; none when not given) (commid module docstring, 2-5)."""
        out = self.group[rows].astype(np.int64)
        todo = out <= 0
        if self.pg_sizes:
            named = todo & ~_none(self.pg[rows])
            size = _per_distinct(self.pg[rows[named]], lambda p: self.pg_sizes.get(str(p)))
            found = np.array([v is not None for v in size], bool)
            at = np.flatnonzero(named)[found]
            out[at] = np.array([v for v in size if v is not None], np.int64)
            todo[at] = False
        kind = self.e.kind[rows]
        ag, rs = kind == _KIND["all_gather"], kind == _KIND["reduce_scatter"]
        out[todo & ~(ag | rs)] = self.fallback
        todo &= ag | rs
        if not todo.any():
            return out
        # each row first, then its ops: their In / Out counts, then their tensors
        idx = np.flatnonzero(todo)
        if seg is None or src is None:
            seg, src = np.zeros(0, np.int64), np.zeros(0, np.int64)
        sub = np.full(len(rows), -1, np.int64)
        sub[idx] = np.arange(len(idx))
        keep = sub[seg] >= 0
        s2 = np.concatenate([np.arange(len(idx)), sub[seg[keep]]])
        r2 = np.concatenate([rows[idx], src[keep]])
        order = np.lexsort((np.arange(len(s2)), s2))
        s2, r2 = s2[order], r2[order]
        ag2, rs2 = ag[idx][s2], rs[idx][s2]
        counts = commid.group_from_counts_cols(ag2, rs2, self.n_in[r2], self.n_out[r2])
        tensors = commid.group_from_tensors_cols(self.c10d[r2], ag2, rs2, self.numel[r2],
                                                 self.numel2[r2])
        n = len(idx)
        by_counts = _pick(counts, _first(s2, counts > 0, n), -1)
        by_tensors = _pick(tensors, _first(s2, tensors > 0, n), -1)
        out[idx] = np.where(by_counts > 0, by_counts,
                            np.where(by_tensors > 0, by_tensors, self.fallback))
        return out

    def kernel(self, rows: np.ndarray, seg: np.ndarray, src: np.ndarray,
               launch_rows: np.ndarray) -> None:
        """GPU comm ``rows`` launched by enqueue ops ``src`` (flat, innermost first; ``seg``:
        index into ``rows``) at runtime rows ``launch_rows`` (-1 none). No row's answer reads
        another's: ``src`` are CPU rows, which this does not write."""
        n = len(rows)
        pg, peer, group = self.pg, self.peer, self.group
        # pg: a record_param_comms' own name first, then a tagged op's, then the tag around
        # the launch itself
        need = _none(pg[rows])
        got = _pick(pg[src], _first(seg, self.from_args[src], n), None)
        pg[rows[need]] = got[need]
        for col in (pg, self.pg_rk, self.dtype, self.desc):
            need = _none(col[rows])
            got = _pick(col[src], _first(seg, ~_none(col[src]), n), None)
            col[rows[need]] = got[need]
        tag_rows = np.array(list(self.tag_of), np.int64)
        at = _lookup(tag_rows, np.arange(len(tag_rows)), launch_rows)  # the launch's tag
        tags = list(self.tag_of.values())
        tag_pg = _pick(_objects([t[0] for t in tags]), at, None)
        tag_peer = _pick(np.array([t[1] for t in tags], np.int64), at, -1)
        need = _none(pg[rows]) & (at >= 0)
        pg[rows[need]] = tag_pg[need]
        got = _pick(peer[src], _first(seg, peer[src] >= 0, n), -1)
        peer[rows] = np.where(got >= 0, got, tag_peer)
        live = ~self.graphed[rows]  # capture-time values (analyzer/ingest/graphs.py)
        keep = live[seg]
        self.take_seq(rows[live], np.cumsum(live)[seg[keep]] - 1, src[keep])
        self.name_group(rows)
        got = _pick(group[src], _first(seg, group[src] > 0, n), -1)
        group[rows] = np.where(group[rows] <= 0, got, group[rows])
        group[rows] = self.group_of(rows, seg, src)
        need = self.nbytes[rows] < 0
        kind = self.e.kind[rows].astype(np.int64)
        kind = np.where(kind < 0, len(KINDS) + kind, kind)  # KINDS[-1] is other
        b = self.ops_bytes(seg, src, kind, group[rows].astype(np.int64))
        self.nbytes[rows[need]] = b[need]

    def gloo_op(self, rows: np.ndarray, paired: np.ndarray) -> None:
        """Gloo ops ``rows`` paired with enqueues ``paired`` (-1: unpaired). Each row reads
        only its enqueue, which this does not write."""
        has = np.flatnonzero(paired >= 0)
        i, j = rows[has], paired[has]
        need = _none(self.pg[i])
        self.pg[i[need]] = self.pg[j[need]]
        self.take_seq(i, np.arange(len(i)), j)
        for col in (self.pg_rk, self.dtype, self.desc):
            need = _none(col[i])
            col[i[need]] = col[j[need]]
        self.peer[i] = np.where(self.peer[i] < 0, self.peer[j], self.peer[i])
        self.group[i] = np.where(self.group[i] <= 0, self.group[j], self.group[i])
        self.name_group(rows)
        self.group[rows] = self.group_of(rows, has, j)
        kind = self.e.kind[rows].astype(np.int64)
        kind = np.where(kind < 0, len(KINDS) + kind, kind)  # KINDS[-1] is other
        group = self.group[rows].astype(np.int64)
        need = self.nbytes[rows] < 0
        self.nbytes[rows[need]] = self.shape_bytes(rows, kind, group)[need]
        need = self.nbytes[i] < 0
        self.nbytes[i[need]] = self.shape_bytes(j, kind[has], group[has])[need]

    def fake_call(self, rows: np.ndarray, ops: np.ndarray) -> None:
        """A fake group's collective calls ``rows`` (their ``c10d::*`` ops, ``_fake_calls``)
        run by enqueue ops ``ops`` (-1: none): dtype and bytes from the op where their own are
        unknown, their group size as a gloo op's (``group_of``)."""
        has = np.flatnonzero(ops >= 0)
        i, j = rows[has], ops[has]
        need = _none(self.dtype[i])
        self.dtype[i[need]] = self.dtype[j[need]]
        need = self.nbytes[i] < 0
        self.nbytes[i[need]] = self.nbytes[j[need]]
        self.name_group(rows)
        self.group[rows] = self.group_of(rows)

    def enqueue(self, rows: np.ndarray) -> None:
        """Enqueue ops ``rows``: their group from pg_config, their bytes from their own
        shape."""
        self.name_group(rows)
        need = rows[self.nbytes[rows] < 0]
        self.nbytes[need] = self.shape_bytes(need, self.e.kind[need].astype(np.int64),
                                             self.group_of(need))

    def table(self, df: pd.DataFrame, step: np.ndarray, is_comm: np.ndarray,
              pg_descs: dict[str, str] | None, launch: np.ndarray, paired: np.ndarray
              ) -> pd.DataFrame:
        """``df`` with ``step``, role, coll_kind, the identity columns (``is_comm``: rows that
        keep a peer, Seq and Comms Id; ``pg_descs``: pg_config's description of each group),
        rule, launch_row and paired_row."""
        e, desc, descs = self.e, self.desc, pg_descs or {}
        rows = np.flatnonzero(is_comm)
        rows = rows[_none(desc[rows]) & ~_none(self.pg[rows])]
        desc[rows] = _objects(_per_distinct(self.pg[rows], lambda p: descs.get(str(p))))
        dtype = np.full(e.n, None, object)  # torch's names (``commid.dtype_name``)
        have = np.flatnonzero(~_none(self.dtype))
        dtype[have] = _objects(_per_distinct(self.dtype[have], commid.dtype_name))
        out = df.drop(columns=[c for c in ("pg", "pg_ranks", "dtype", "group_size", "pg_desc",
                                           "seq_arg", "comms_id") if c in df.columns])
        for name, col in {
                "step": step, "role": pd.Categorical.from_codes(e.role, categories=list(ROLES)),
                "coll_kind": pd.Categorical.from_codes(e.kind, categories=list(KINDS)),
                "bytes": self.nbytes.astype(np.int64), "pg": str_array(self.pg),
                "pg_ranks": str_array(self.pg_rk),
                "dtype": str_array(dtype),
                "group_size": self.group.astype(np.int64), "pg_desc": str_array(desc),
                "peer": np.where(is_comm, self.peer, -1).astype(np.int64),
                "seq_arg": np.where(is_comm, self.seq, -1).astype(np.int64),
                "comms_id": str_array(np.where(is_comm, self.cid, None)),
                "rule": _used_categories(e.rule, RULES), "launch_row": launch,
                "paired_row": paired}.items():
            out[name] = col
        return out


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


def _first(seg: np.ndarray, hit: np.ndarray, n: int) -> np.ndarray:
    """Place in a flat list (``seg``: its items' segment, 0 .. ``n`` - 1, ascending) of the
    first item of each segment where ``hit``; -1 where none."""
    out = np.full(n, -1, np.int64)
    pos = np.flatnonzero(hit)
    if len(pos):
        s = seg[pos]
        first = np.flatnonzero(np.append(True, s[1:] != s[:-1]))
        out[s[first]] = pos[first]
    return out


def _pick(values: np.ndarray, at: np.ndarray, default) -> np.ndarray:
    """``values[at]``, ``default`` where ``at`` is -1."""
    out = values[np.maximum(at, 0)] if len(values) else np.full(len(at), default, values.dtype)
    out[at < 0] = default
    return out


def _kind_from_ops(seg, src, n, arg_kind, name_kind, is_c10d) -> np.ndarray:
    """Kind code of each of ``n`` collectives from its launching ops (``src``, flat, in order,
    ``seg``: whose): a ``Collective name`` argument first, then a ``c10d::*`` op's name, then
    any op's name (``nccl:*``, ``symm_mem::*`` ...); -1 when none says
    (analyzer/ingest/commid.py)."""
    out = _pick(arg_kind[src].astype(np.int64), _first(seg, arg_kind[src] >= 0, n), -1)
    for hit in (is_c10d[src] & (name_kind[src] >= 0), name_kind[src] >= 0):
        k = _pick(name_kind[src].astype(np.int64), _first(seg, hit, n), -1)
        out = np.where(out >= 0, out, k)
    return out


def _none(values: np.ndarray) -> np.ndarray:
    """Where an object column holds None."""
    return np.equal(values, None).astype(bool) if len(values) else np.zeros(0, bool)


def _objects(values: list) -> np.ndarray:
    """A 1-d object array of ``values``."""
    out = np.empty(len(values), object)
    out[:] = values
    return out


def _per_distinct(values: np.ndarray, fn) -> list:
    """``fn`` of each value (hashable), called once per distinct value."""
    items = values.tolist()
    memo = {v: fn(v) for v in set(items)}
    return [memo[v] for v in items]


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
    n_in = df["in_nelems"].to_numpy()
    n_out = df["out_nelems"].to_numpy()
    out = np.full(len(df), -1, np.int64)
    have = np.flatnonzero((np.maximum(n_in, n_out) >= 0) & df["dtype"].notna().to_numpy())
    size = np.array(_per_distinct(_obj(df["dtype"])[have], dtype_bytes), np.int64)
    out[have] = np.where(size > 0, np.maximum(n_in[have], n_out[have]) * size, -1)
    return out


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


def _tag_tensors(names, is_tag, enq, ts, end, tid) -> dict[int, tuple[str, int]]:
    """{row: (dtype, elements)} of the op of each tagged call whose process-group tag has a
    tensor note (``parse_tag_tensor``: the fake group's): the first comm enqueue op the tag
    encloses (rows are in (start, longest first) order). The note is the first tensor of the
    Python call the tag wraps (tracer/pgtag.py), and so of the op that call runs first: a
    ``c10d::*`` op for a torch.distributed call (output first, as ``dist.
    all_gather_into_tensor(output, input)``), a ``_c10d_functional::*`` op for a funcol call
    (input first). The ops that one runs inside it (its ``c10d::*`` op, a tensor list) and
    after it (``_wrap_tensor_autograd``, ``wait_tensor``) take none: the note would be
    another op's tensor."""
    tags = np.flatnonzero(is_tag)
    tags = tags[[PG_TAG_TENSOR in str(names[t]) for t in tags.tolist()]] if len(tags) else tags
    if not len(tags):
        return {}
    cand = np.flatnonzero(enq).astype(np.int64)
    at = commid.ops_enclosing(tags, cand, ts, end, tid)
    first: dict[int, int] = {}
    for r, t in zip(cand.tolist(), at.tolist()):
        if t >= 0 and t not in first:
            first[t] = r
    return {int(r): note for t, r in first.items()
            if (note := parse_tag_tensor(str(names[t]))) is not None}


def _fake_calls(e: _Events, ident: "_Identity") -> None:
    """The fake group's collective calls (rule cpu.fake_pg_call, ``FAKE_BACKEND``): each takes,
    where its own record lacks them, the dtype and bytes of the innermost comm enqueue op of
    its kind enclosing it on its thread (``_Identity.fake_call``): the
    ``_c10d_functional::*`` op that ran it, sized by its tag's tensor note (``_tag_tensors``;
    its ``c10d::*`` op takes a tensor list, which Kineto records with no dtype or shape)."""
    calls = np.flatnonzero(e.rule == _RULE["cpu.fake_pg_call"])
    if not len(calls):
        return
    outer = np.flatnonzero(e.enq & (e.rule != _RULE["cpu.fake_pg_call"]))
    at = commid.ops_enclosing(outer, calls, e.ts, e.end, e.c_tid)
    same_kind = np.zeros(len(at), bool)
    same_kind[at >= 0] = e.kind[at[at >= 0]] == e.kind[calls[at >= 0]]
    ident.fake_call(calls, np.where(same_kind, at, -1))


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
    j = paired[gloo_idx]
    voter = gloo_idx[j >= 0]
    voter = voter[~_none(pg[paired[voter]])]
    if not len(voter):
        return paired
    # votes: (thread, group) pairs counted; groups coded in name order, so a tie's smaller
    # name is the smaller code
    names, code = np.unique(_objects(_per_distinct(pg[paired[voter]], str)),
                            return_inverse=True)
    pair, votes = np.unique(tid[voter].astype(np.int64) * len(names) + code,
                            return_counts=True)
    thread, group = pair // len(names), pair % len(names)
    best = np.lexsort((group, -votes, thread))
    first = best[np.append(True, thread[best][1:] != thread[best][:-1])]
    group_of_thread = dict(zip(thread[first].tolist(), names[group[first]].tolist()))
    out = np.full(len(paired), -1, np.int64)
    named = ~_none(pg[c10d_idx])
    enq_pg = np.full(len(c10d_idx), "", object)
    enq_pg[named] = _objects(_per_distinct(pg[c10d_idx[named]], str))
    op_pg = _objects(_per_distinct(tid[gloo_idx].astype(np.int64),
                                   lambda t: group_of_thread.get(t, "")))
    for g in sorted(set(enq_pg.tolist()) - {""}):
        out = _pair_gloo(c10d_idx[enq_pg == g], gloo_idx[op_pg == g], kind, name_kind, ts, out)
    return _pair_gloo(c10d_idx[out[c10d_idx] < 0], gloo_idx[out[gloo_idx] < 0], kind,
                      name_kind, ts, out)


def _pair_gloo(c10d_idx, gloo_idx, kind, name_kind, ts, paired) -> np.ndarray:
    """Pair gloo runloop ops with c10d enqueues: for each enqueue in time order, the first not
    yet paired gloo op of the matching gloo kind (``_GLOO_FOR_C10D``; an enqueue of no kind
    pairs with ops of no kind) that starts at or after the enqueue starts. (No id links them;
    gloo runs a process group's work in FIFO order.) ``c10d_idx``, ``gloo_idx``: rows in time
    order. In each kind's ops, the k-th enqueue takes place p_k = max(p_(k-1) + 1, s_k), s_k
    the first op starting at or after it: p_k = k + the running max of s_i - i."""
    want_of = np.array([_KIND[_GLOO_FOR_C10D[k]] for k in KINDS] + [-1])  # kind -1: the last
    op_kind = name_kind[gloo_idx].astype(np.int64)
    enq_want = want_of[kind[c10d_idx].astype(np.int64)]
    for k in np.unique(op_kind).tolist():
        pool, enq = gloo_idx[op_kind == k], c10d_idx[enq_want == k]
        if not len(enq):
            continue
        first = np.searchsorted(ts[pool], ts[enq], "left")  # ops before it are not its work
        r = np.arange(len(enq))
        at = r + np.maximum.accumulate(first - r)
        ok = at < len(pool)
        paired[pool[at[ok]]] = enq[ok]
        paired[enq[ok]] = pool[at[ok]]
    return paired
