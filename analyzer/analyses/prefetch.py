"""FSDP prefetch per FSDP unit and step: was each all_gather done before its data was needed?

Input: one rank's event table (``analyzer/api.py`` columns). Labels locate the units; names
checked against real torch 2.13 CPU/gloo traces of ``fully_shard`` and ``FullyShardedDataParallel``:

* FSDP2 (``fully_shard``): labels as torch 2.13's ``_fsdp_param_group.py`` /
  ``_fsdp_state.py`` write them, ``FSDP::<what> (<fqn>)`` plus `` [pg=<n>]`` when a module has
  several parameter groups (``FSDPParamGroup._with_fqn``; the root has no fqn, shown
  ``(root)``). ``FSDP::all_gather (<fqn>)`` is where the unit's all_gather is issued.
  Phase and prefetch from the FSDP hook label around the issue: ``FSDP::forward_prefetch for
  <fqn>`` / ``FSDP::backward_prefetch for <fqn>`` -> forward / backward, prefetched;
  ``FSDP::pre_forward`` / ``FSDP::pre_backward`` -> forward / backward, prefetched when the hook
  is another unit's. With no such label around it, backward when it runs inside
  ``autograd::engine::evaluate_function`` (FSDP's backward hooks are autograd hooks) or on the
  autograd engine's own thread (below), else forward, not prefetched. ``FSDP::all_gather_copy_out (<fqn>)`` (the unit's first after the
  issue, before its next issue) is the first consumer of the gathered data: on CPU *need* = its
  start; on GPU see "GPU need" below. No copy-out: need unknown.
* FSDP1 (``FullyShardedDataParallel``): labels carry no unit name. Each ``c10d`` all_gather
  enqueue (``comm_enqueue`` row) is one unit's unshard, numbered ``#k`` in issue order within
  the step's forward or backward (backward: inside ``_pre_backward_hook`` /
  ``_pre_backward_prefetch`` / ``_post_backward*``, or on the autograd engine's thread); it is
  prefetched when inside ``_pre_forward_prefetch`` / ``_pre_backward_prefetch`` /
  ``_post_backward_prefetch`` (``_runtime_utils.py``). *need* =
  the end of the pre-hook (``_pre_forward`` / ``_pre_backward_hook``) that consumes it: the
  enclosing one, or for a prefetched unit the next one to start after the issue (the unit's
  module computation starts when that hook returns). On GPU: "GPU need" below. One NCCL
  all_gather shows up as nested enqueue ops (``c10d::_allgather_base_`` >
  ``record_param_comms`` > ``nccl:_all_gather_base``, as in the A100 corpus trace); only the
  outermost one on its thread is an issue.

The autograd engine's thread: on a GPU job torch's engine runs backward on a device thread of
its own (torch/csrc/autograd/engine.cpp ``Engine::thread_init``), so all it issues is backward,
inside an ``evaluate_function`` span or not (hooks between nodes, ``queue_callback``). Found as
a CPU thread with ``evaluate_function`` spans and no ``ProfilerStep#`` span in a trace that has
them; on CPU the engine runs on the loop's thread and only the enclosing rules apply.

Labels are read from CPU rows only: on GPU traces Kineto mirrors every user annotation as a
``gpu_user_annotation`` on a stream (GPU clock positions, same name), which is not an issue.

GPU need. The consumer is found by launch, never by comparing a CPU time with GPU starts (the
GPU may run steps behind): FSDP2, the first GPU compute kernel or memcpy launched (correlation
id) inside the unit's ``FSDP::all_gather_copy_out``; else the first compute kernel launched
inside the unit's own ``FSDP::pre_forward`` / ``FSDP::pre_backward`` after the copy-out,
skipping launches inside any ``FSDP::all_gather`` span (the next unit's copy-in); FSDP1, the
first compute kernel launched after the consuming hook returned. None found: need unknown. The
consumer's start is never before the all_gather's end (it waits on it), so *need* is its ready
time: max(its launch call's start on the CPU, the end of the previous operation on its stream);
slack < 0 is then the time the compute stream sat waiting.

Each issue is paired with the earliest not-yet-paired all_gather execution (``role == comm``)
starting at or after it (gloo: the ``gloo:all_gather`` work on its runloop thread; NCCL: the
kernel on the communication stream, FIFO per stream); on GPU an all_gather kernel whose launch
call (correlation id) lies inside the issue's span is taken first. Then per all_gather:

* ``hidden_frac`` = |execution ∩ ∪computation| / |execution| -- the share of the all_gather
  that ran while this rank computed. Computation = ``role == compute`` rows: GPU compute
  kernels on GPU traces; on CPU traces the main-thread ops *minus the time inside FSDP's own
  hook labels* (``FSDP::*``, ``FullyShardedDataParallel._*``): FSDP's hooks run nested inside
  autograd ops (``autograd::engine::evaluate_function: ...``) and block there waiting for the
  all_gather, which is not computation that hides it.
* ``slack_ns`` = need - finished: > 0 the data arrived that early; < 0 the computation waited.

On CPU/gloo the FSDP all_gather is waited for inside the label, so hidden_frac is about 0 there;
``cpu_note`` says so.

How far ahead (issue 45: FSDP2's explicit prefetch depth, ``set_modules_to_forward_prefetch`` /
``set_modules_to_backward_prefetch``): ``ahead_units`` = 0 for an all_gather its own unit's hook
issued; for a prefetched FSDP2 one, 1 + the number of other units whose own hook of the same
pass (``FSDP::pre_forward`` / ``FSDP::pre_backward``) starts between the issue and the unit's
own hook in that step -- depth 1 gives 1 (the previous unit's hook issued it), depth 2 gives up
to 2 (a unit prefetched two units before it is used). <NA> when the unit's own hook is not
found after the issue. FSDP1 prefetches one handle at a time (``_runtime_utils.py``
``_get_handle_to_prefetch``): 1 when prefetched, else 0. ``group_size``: the paired
execution's process-group size (``reshard_after_forward=N``: backward's all_gathers run over
the N ranks of the post-forward group, torch 2.13 ``FSDPParamGroup._all_gather_process_group``);
<NA> when not known.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv
from analyzer.contract.schemas import PREFETCH_SCHEMA

FSDP2_ISSUE = re.compile(r"^FSDP::all_gather(?: \((?P<fqn>.*)\))?(?P<pg> \[pg=\d+\])?$")
# every FSDP2 label this module reads: "FSDP::<what> (<fqn>) [pg=<n>]" (both parts optional;
# FSDPParamGroup._with_fqn) or "FSDP::<forward|backward>_prefetch for <fqn>"
FSDP2_LABEL = re.compile(r"^FSDP::(?P<what>all_gather_copy_out|all_gather|pre_forward|pre_backward)"
                         r"(?: \((?P<fqn>.*)\))?(?P<pg> \[pg=\d+\])?$"
                         r"|^FSDP::(?P<pass>forward|backward)_prefetch for (?P<target>.*)$")
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function"
FSDP1_PREFIX = "FullyShardedDataParallel."
FSDP1_PREFETCH = ("FullyShardedDataParallel._pre_forward_prefetch",
                  "FullyShardedDataParallel._pre_backward_prefetch",
                  "FullyShardedDataParallel._post_backward_prefetch")
FSDP1_PRE_FORWARD = "FullyShardedDataParallel._pre_forward"
FSDP1_PRE_BACKWARD = "FullyShardedDataParallel._pre_backward_hook"


CPU_NOTE = ("On CPU (gloo) the all_gather runs synchronously inside the FSDP hook that issues "
            "it: the rank blocks in that hook until it finishes. So it is never under "
            "computation (hidden about 0 % by construction), it is always finished before its "
            "unit needs it (no late all_gathers; positive slack = the parameters sat ready until "
            "the unit started), and the blocking itself is counted as exposed communication -- "
            "prefetch can only move the wait to where the all_gather is issued, not hide it. "
            "FSDP overlap figures on CPU say nothing about a GPU run.")


class _Names:
    """The name column as codes into a list of distinct names, so label tests run once per
    distinct name (a categorical's categories; else the factorized strings). A missing name
    (code -1) is no label."""

    def __init__(self, col: pd.Series):
        if isinstance(col.dtype, pd.CategoricalDtype):
            self.codes = col.array.codes
            self.names = [str(c) for c in col.array.categories.tolist()]
        else:
            codes, uniques = pd.factorize(col.astype(str))
            self.codes = np.asarray(codes)
            self.names = [str(u) for u in uniques]
        self._index = {n: i for i, n in enumerate(self.names)}

    def _rows(self, codes: list[int]) -> np.ndarray:
        if len(codes) > 8:
            return np.isin(self.codes, codes)
        mask = np.zeros(len(self.codes), bool)
        for k in codes:
            mask |= self.codes == k
        return mask

    def mask(self, test) -> np.ndarray:
        """Rows whose name passes ``test`` (a predicate on one name)."""
        return self._rows([k for k, n in enumerate(self.names) if test(n)])

    def any(self, test) -> bool:
        """Whether some row's name passes ``test``."""
        return bool(self.mask(test).any())

    def name(self, row: int) -> str:
        return self.names[self.codes[row]]

    def code(self, name: str) -> int:
        """The code of ``name``; -2 (no row's code) when no row is named so."""
        return self._index.get(name, -2)


def _first(rows: np.ndarray, ts: np.ndarray) -> int:
    """The row of ``rows`` (in table order) with the earliest start. On a tie, the one numpy's
    quicksort puts first, as ``sort_values("ts_ns").iloc[0]`` chose before this module worked
    on arrays (so results did not change)."""
    t = ts[rows]
    k = int(np.argmin(t))
    if np.count_nonzero(t == t[k]) > 1:
        k = int(np.argsort(t, kind="quicksort")[0])
    return int(rows[k])


def _by_start(rows: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """``rows`` by start (numpy quicksort, as ``sort_values("ts_ns")``)."""
    return rows[np.argsort(ts[rows], kind="quicksort")]


def _autograd_thread_rows(tb: "_Table") -> np.ndarray:
    """Per row, True when it runs on the autograd engine's own thread (module docstring): a CPU
    thread with ``evaluate_function`` spans and no ``ProfilerStep#`` span, in a trace whose
    ProfilerSteps run on some other thread."""
    cpu = ~tb.gpu
    tid = np.asarray(pd.factorize(tb.tid.astype(str))[0])
    autograd = cpu & tb.names.mask(lambda n: n.startswith(AUTOGRAD_PREFIX))
    step = cpu & tb.names.mask(lambda n: n.startswith("ProfilerStep#"))
    if not step.any() or not autograd.any():
        return np.zeros(len(tid), bool)
    engine = np.setdiff1d(np.unique(tid[autograd]), np.unique(tid[step]))
    return cpu & np.isin(tid, engine)


def _enclosing(rows: np.ndarray, ts: np.ndarray, end: np.ndarray, t: int) -> np.ndarray:
    """The rows of ``rows`` whose span contains instant ``t`` (ends included)."""
    return rows[(ts[rows] <= t) & (end[rows] >= t)]


def detect_labels(events: pd.DataFrame, names: _Names | None = None) -> str | None:
    """``"fsdp2"``, ``"fsdp1"`` or None: which FSDP label family the event table carries.
    Tests each distinct name once."""
    names = names or _Names(events["name"])
    if names.any(FSDP2_ISSUE.match):
        return "fsdp2"
    if names.any(lambda n: n.startswith(FSDP1_PREFIX)):
        return "fsdp1"
    return None


class _Table:
    """The columns of one event table that the prefetch analysis reads, as numpy arrays."""

    def __init__(self, ev: pd.DataFrame, names: _Names):
        from analyzer.analyses.breakdown import is_in

        self.names = names
        self.ts = ev["ts_ns"].to_numpy().astype(np.int64, copy=False)
        self.end = ev["end_ns"].to_numpy().astype(np.int64, copy=False)
        self.step = ev["step"].to_numpy()
        self.gpu = ev["is_gpu"].to_numpy(dtype=bool)
        self.corr = ev["correlation"].to_numpy().astype(np.int64, copy=False)
        self.stream = ev["stream"].to_numpy().astype(np.int64, copy=False)
        role, kind = ev["role"], ev["coll_kind"]
        self.compute = is_in(role, ("compute",))
        self.consumer = is_in(role, ("compute", "memcpy"))
        self.gpu_ops = self.gpu & is_in(role, ("compute", "comm", "memcpy", "memset"))
        all_gather = is_in(kind, ("all_gather",))
        self.execs = is_in(role, ("comm",)) & all_gather
        self.enqueue = is_in(role, ("comm_enqueue",)) & all_gather
        self.tid = ev["tid"]
        self.group = (ev["group_size"].to_numpy().astype(np.int64, copy=False)
                      if "group_size" in ev else np.full(len(ev), -1, np.int64))
        self.launch_row = (ev["launch_row"].to_numpy().astype(np.int64, copy=False)
                           if "launch_row" in ev else None)


class _GpuView:
    """The GPU side of one event table: launch times by correlation id, the consumer candidates
    (GPU compute kernels and memcpys) by launch time, and the operations of each stream, to find
    consumers and their ready time (module docstring)."""

    def __init__(self, tb: _Table):
        self.tb = tb
        ts = tb.ts
        self.launch_ts = self._launch_times(tb)
        ops = np.flatnonzero(tb.gpu_ops)
        self._ops = ops[np.lexsort((tb.end[ops], tb.stream[ops]))]  # per stream, by end
        self._ops_stream = tb.stream[self._ops]
        self._ops_end = tb.end[self._ops]
        self._ends_after_starts = bool((tb.end[ops] >= tb.ts[ops]).all())
        self.active = bool((tb.gpu & tb.compute).any())
        cand = np.flatnonzero(tb.gpu & tb.consumer & (self.launch_ts >= 0))
        lt = self.launch_ts[cand]
        o = np.lexsort((ts[cand], lt))  # by launch; same launch time: earliest start first
        self._cand, self._cand_launch = cand[o], lt[o]
        self._cand_compute = tb.compute[self._cand]

    @staticmethod
    def _launch_times(tb: _Table) -> np.ndarray:
        """Per row, the start of the runtime call that launched it (GPU rows; -1 unknown): the
        event table's ``launch_row`` (analyzer/ingest/classify.py: correlation id, else External
        id); where there is none, the earliest CPU row with the row's correlation id."""
        out = np.full(len(tb.ts), -1, np.int64)
        cpu_c = np.flatnonzero(~tb.gpu & (tb.corr >= 0))
        if len(cpu_c):
            c, t = tb.corr[cpu_c], tb.ts[cpu_c]
            o = np.lexsort((t, c))  # per correlation id, its earliest CPU row first
            c, t = c[o], t[o]
            first = np.ones(len(c), bool)
            first[1:] = c[1:] != c[:-1]
            c, t = c[first], t[first]
            g = np.flatnonzero(tb.gpu & (tb.corr >= 0))
            i = np.minimum(np.searchsorted(c, tb.corr[g]), len(c) - 1)
            hit = c[i] == tb.corr[g]
            out[g[hit]] = t[i[hit]]
        if tb.launch_row is not None:
            g = np.flatnonzero(tb.gpu & (tb.launch_row >= 0))
            out[g] = tb.ts[tb.launch_row[g]]
        return out

    def first_launched(self, lo: int, hi: int | None, *, memcpy: bool = False,
                       skip: tuple[np.ndarray, np.ndarray] | None = None) -> int | None:
        """The row of the first GPU compute kernel (with ``memcpy``: or memcpy) whose launch
        call starts in [lo, hi] (``hi`` None: no upper bound) and not inside one of the
        ``skip`` spans (starts, ends); None when there is none. Launch times only: a GPU start
        is never compared with a CPU time (the GPU may run far behind the CPU)."""
        a = int(np.searchsorted(self._cand_launch, lo, "left"))
        b = (int(np.searchsorted(self._cand_launch, hi, "right")) if hi is not None
             else len(self._cand))
        for k in range(a, b):
            t = int(self._cand_launch[k])
            if not memcpy and not self._cand_compute[k]:
                continue
            if skip is not None and ((skip[0] <= t) & (skip[1] >= t)).any():
                continue
            return int(self._cand[k])
        return None

    def ready_ns(self, kernel: int) -> int:
        """When ``kernel`` could have started: max(launch call start, end of the previous
        operation on its stream); its own start when neither is known."""
        tb = self.tb
        start = int(tb.ts[kernel])
        cands = []
        if self.launch_ts[kernel] >= 0:
            cands.append(int(self.launch_ts[kernel]))
        prev = self._previous_end(int(tb.stream[kernel]), start)
        if prev is not None:
            cands.append(prev)
        return min(max(cands), start) if cands else start

    def _previous_end(self, stream: int, start: int) -> int | None:
        """The latest end among ``stream``'s operations that start before ``start`` and end
        by it; None when there is none."""
        tb = self.tb
        a, b = np.searchsorted(self._ops_stream, [stream, stream + 1])
        ops, ends = self._ops[a:b], self._ops_end[a:b]
        if not self._ends_after_starts:  # a negative duration: test every operation
            before = ends[(tb.ts[ops] < start) & (ends <= start)]
            return int(before.max()) if len(before) else None
        # ends sorted: the last end <= start, passing over operations of no length at start
        j = int(np.searchsorted(ends, start, "right"))
        while j > 0 and ends[j - 1] == start and tb.ts[ops[j - 1]] >= start:
            j -= 1
        return int(ends[j - 1]) if j > 0 else None


def _outermost(rows: np.ndarray, tb: _Table) -> np.ndarray:
    """Rows not enclosed by another row of ``rows`` on the same thread, by start; threads in
    the order they first appear, each thread's rows by (start, longest first)."""
    col = tb.tid.iloc[rows]
    if isinstance(col.dtype, pd.CategoricalDtype):
        tid = col.cat.codes.to_numpy()
    else:
        tid = np.asarray(pd.factorize(col)[0])
    keep = []
    threads, first = np.unique(tid[tid >= 0], return_index=True)
    for t in threads[np.argsort(first)].tolist():
        g = rows[tid == t]
        g = g[np.lexsort((-tb.end[g], tb.ts[g]))]
        e = tb.end[g]
        cover = np.maximum.accumulate(e)
        new = np.ones(len(g), bool)
        new[1:] = e[1:] > cover[:-1]
        keep.append(g[new])
    if not keep:
        return rows[:0]
    return _by_start(np.concatenate(keep), tb.ts)


def _fsdp2_parse(names: _Names) -> dict[int, tuple[str, str]]:
    """{name code: (what, unit key)} for the FSDP2 labels among the distinct names. what is
    all_gather / all_gather_copy_out / pre_forward / pre_backward / forward_prefetch /
    backward_prefetch; the unit key is ``<fqn>`` plus any `` [pg=<n>]`` (the target's fqn for
    the prefetch labels)."""
    out = {}
    for k, n in enumerate(names.names):
        m = FSDP2_LABEL.match(n)
        if m is None:
            continue
        if m.group("pass"):
            out[k] = (m.group("pass") + "_prefetch", m.group("target"))
        else:
            out[k] = (m.group("what"), (m.group("fqn") or "") + (m.group("pg") or ""))
    return out


def _issues_fsdp2(tb: _Table, gpu: _GpuView) -> list[dict]:
    names, ts, end, codes = tb.names, tb.ts, tb.end, tb.names.codes
    cpu = ~tb.gpu
    parsed = _fsdp2_parse(names)

    def rows(*whats: str) -> np.ndarray:
        return np.flatnonzero(cpu & names._rows([k for k, (w, _) in parsed.items() if w in whats]))

    issue = _by_start(rows("all_gather"), ts)
    copy_out = _by_start(rows("all_gather_copy_out"), ts)
    hooks = rows("pre_forward", "pre_backward", "forward_prefetch", "backward_prefetch")
    own_hooks = rows("pre_forward", "pre_backward")
    autograd = np.flatnonzero(cpu & names.mask(lambda n: n.startswith(AUTOGRAD_PREFIX)))
    engine = _autograd_thread_rows(tb)
    skip = (ts[issue], end[issue])  # launches inside an all_gather label: copy-in, NCCL
    unit_of = np.array([parsed.get(int(k), ("", ""))[1] for k in codes[issue]], dtype=object)
    own_of = np.array([parsed[int(k)] for k in codes[own_hooks]] or np.empty((0, 2)), dtype=object)
    out = []
    for n, i in enumerate(issue.tolist()):
        key = unit_of[n]
        t = int(ts[i])
        enc = _enclosing(hooks, ts, end, t)
        whats = {parsed[int(codes[j])][0] for j in enc.tolist()}
        own = any(parsed[int(codes[j])] in (("pre_forward", key), ("pre_backward", key))
                  for j in enc.tolist())
        if "backward_prefetch" in whats or "forward_prefetch" in whats:
            phase = "backward" if "backward_prefetch" in whats else "forward"
            prefetched = True
        elif whats:
            phase = "backward" if "pre_backward" in whats else "forward"
            prefetched = not own
        else:  # no FSDP hook label around it: backward hooks run inside the autograd engine
            phase = "backward" if engine[i] or len(_enclosing(autograd, ts, end, t)) else "forward"
            prefetched = False
        # the unit's copy-out: its first after this issue and before the unit's next issue
        later = issue[(unit_of == key) & (ts[issue] > t)]
        stop = int(ts[later].min()) if len(later) else np.iinfo(np.int64).max
        mine = copy_out[(ts[copy_out] >= t) & (ts[copy_out] < stop)]
        mine = mine[[parsed[int(codes[j])][1] == key for j in mine.tolist()]]
        need = None
        if len(mine):
            c = int(mine[0])
            if not gpu.active:
                need = int(ts[c])
            else:
                k = gpu.first_launched(int(ts[c]), int(end[c]), memcpy=True)
                if k is None:  # else: launched by the unit's pre-hook after the copy-out
                    h = _enclosing(own_hooks, ts, end, int(ts[c]))
                    h = h[[parsed[int(codes[j])][1] == key and end[j] >= end[c] for j in h.tolist()]]
                    if len(h):
                        k = gpu.first_launched(int(end[c]), int(end[h].min()), skip=skip)
                need = gpu.ready_ns(k) if k is not None else None
        ahead = _ahead_fsdp2(own_hooks, own_of, tb, i, key, phase) if prefetched else 0
        out.append({"step": int(tb.step[i]), "phase": phase, "unit": "(root)" + key if key[:1] in ("", " ") else key,
                    "prefetched": bool(prefetched), "issued_ns": t, "issue_end_ns": int(end[i]),
                    "need_ns": need, "ahead_units": ahead})
    return out


def _ahead_fsdp2(own_hooks: np.ndarray, own_of: np.ndarray, tb: _Table, i: int, key: str,
                 phase: str) -> int | None:
    """How many units ahead of its use the prefetched all_gather at row ``i`` (unit ``key``,
    pass ``phase``) was issued (module docstring, "How far ahead"): 1 + the distinct other units
    whose own hook of the pass starts after the issue and before the unit's own one, in the
    issue's step; None when the unit's own hook is not found after the issue. ``own_hooks``:
    the rows of the ``FSDP::pre_forward`` / ``pre_backward`` labels, ``own_of`` their (what,
    unit key)."""
    if not len(own_hooks):
        return None
    what = "pre_forward" if phase == "forward" else "pre_backward"
    t, step = int(tb.ts[i]), tb.step[i]
    later = (own_of[:, 0] == what) & (tb.ts[own_hooks] > t) & (tb.step[own_hooks] == step)
    mine = later & (own_of[:, 1] == key)
    if not mine.any():
        return None
    use = int(tb.ts[own_hooks][mine].min())
    between = later & (tb.ts[own_hooks] < use) & (own_of[:, 1] != key)
    return 1 + len(set(own_of[between, 1].tolist()))


def _issues_fsdp1(tb: _Table, gpu: _GpuView) -> list[dict]:
    names, ts, end = tb.names, tb.ts, tb.end
    cpu = ~tb.gpu
    enq = _outermost(np.flatnonzero(cpu & tb.enqueue), tb)
    prefetch = np.flatnonzero(cpu & names.mask(lambda n: n in FSDP1_PREFETCH))
    pre_fwd = np.flatnonzero(cpu & names.mask(lambda n: n == FSDP1_PRE_FORWARD))
    pre_bwd = np.flatnonzero(cpu & names.mask(lambda n: n == FSDP1_PRE_BACKWARD))
    bwd_any = np.flatnonzero(cpu & names.mask(
        lambda n: n in (FSDP1_PRE_BACKWARD, FSDP1_PREFETCH[1])
        or n.startswith("FullyShardedDataParallel._post_backward")))
    engine = _autograd_thread_rows(tb)
    out = []
    counters: dict[tuple[int, str], int] = {}
    for i in enq.tolist():
        t = int(ts[i])
        phase = "backward" if engine[i] or len(_enclosing(bwd_any, ts, end, t)) else "forward"
        prefetched = bool(len(_enclosing(prefetch, ts, end, t)))
        hooks = pre_bwd if phase == "backward" else pre_fwd
        if prefetched:
            later = hooks[ts[hooks] > t]
            need = int(end[_first(later, ts)]) if len(later) else None
        else:
            enc = _enclosing(hooks, ts, end, t)
            need = int(end[enc].min()) if len(enc) else None
        if need is not None and gpu.active:
            k = gpu.first_launched(need, None)
            need = gpu.ready_ns(k) if k is not None else None
        key = (int(tb.step[i]), phase)
        k = counters.get(key, 0)
        counters[key] = k + 1
        out.append({"step": int(tb.step[i]), "phase": phase, "unit": f"#{k}",
                    "prefetched": prefetched, "issued_ns": t, "issue_end_ns": int(end[i]),
                    "need_ns": need, "ahead_units": int(prefetched)})
    return out


def _computation(tb: _Table) -> iv.Intervals:
    """∪ computation (module docstring): compute rows; on a CPU trace less FSDP's own hook /
    collective labels (not ``FullyShardedDataParallel.forward``, which wraps the module's
    whole forward)."""
    comp = tb.compute
    merged = iv.merge(tb.ts[comp], tb.end[comp])
    if tb.gpu[comp].any():
        return merged
    hooks = tb.names.mask(lambda n: n.startswith("FSDP::") or (
        n.startswith(FSDP1_PREFIX) and n != "FullyShardedDataParallel.forward"))
    return iv.subtract(merged, iv.merge(tb.ts[hooks], tb.end[hooks]))


def prefetch_table(events: pd.DataFrame, *, rank: int) -> pd.DataFrame:
    """One row per FSDP unit all_gather of this rank (``PREFETCH_SCHEMA``); empty when the
    trace has no FSDP labels. ``labels`` is ``fsdp2`` or ``fsdp1``; ``need_ns`` / ``slack_ns``
    are <NA> when no consumer was found; ``comm_*`` / ``finished_ns`` / ``hidden_*`` are <NA> when
    no execution could be paired. On GPU traces ``need_ns`` is the consumer kernel's ready time
    (module docstring). Rows by issue time (ties: the issues' order by start, numpy
    quicksort)."""
    names = _Names(events["name"])
    family = detect_labels(events, names)
    if family is None:
        return pd.DataFrame(columns=PREFETCH_SCHEMA.names, dtype=object)
    tb = _Table(events, names)
    gpu = _GpuView(tb)
    issues = _issues_fsdp2(tb, gpu) if family == "fsdp2" else _issues_fsdp1(tb, gpu)
    execs = _by_start(np.flatnonzero(tb.execs), tb.ts)
    exec_start, exec_end = tb.ts[execs], tb.end[execs]
    exec_launch = np.where(tb.gpu[execs], gpu.launch_ts[execs], -1)
    taken = np.zeros(len(execs), dtype=bool)
    merged = _computation(tb)
    rows = []
    for it in sorted(issues, key=lambda r: r["issued_ns"]):
        issue_end = it.pop("issue_end_ns")
        inside = ~taken & (exec_launch >= it["issued_ns"]) & (exec_launch <= issue_end)
        cand = np.flatnonzero(inside)
        if not len(cand):
            cand = np.flatnonzero(~taken & (exec_start >= it["issued_ns"]))
        rec = {"rank": rank, **it, "comm_start_ns": None, "finished_ns": None, "comm_ns": None,
               "hidden_ns": None, "hidden_frac": None, "slack_ns": None, "labels": family,
               "group_size": None}
        if len(cand):
            i = int(cand[0])
            taken[i] = True
            g = int(tb.group[execs[i]])
            rec["group_size"] = g if g > 0 else None
            s, e = int(exec_start[i]), int(exec_end[i])
            a, b = np.searchsorted(merged[1], s, "right"), np.searchsorted(merged[0], e)
            hidden = iv.measure(iv.clip((merged[0][a:b], merged[1][a:b]), s, e))
            rec.update(comm_start_ns=s, finished_ns=e, comm_ns=e - s, hidden_ns=hidden,
                       hidden_frac=hidden / (e - s) if e > s else None)
            if it["need_ns"] is not None:
                rec["slack_ns"] = it["need_ns"] - e
        rows.append(rec)
    if not rows:
        out = pd.DataFrame(rows, columns=PREFETCH_SCHEMA.names)
        for c in _INT_COLUMNS:
            out[c] = out[c].astype("Int64")
        out["hidden_frac"] = out["hidden_frac"].astype("Float64")
        return out
    cols = {c: [r[c] for r in rows] for c in PREFETCH_SCHEMA.names}
    # nullable columns straight from the Python ints: exact (through float64, as a frame of
    # records with a missing value would go, epoch ns lose their last digits)
    for c in _INT_COLUMNS:
        cols[c] = pd.array(cols[c], dtype="Int64")
    cols["hidden_frac"] = pd.array(cols["hidden_frac"], dtype="Float64")
    return pd.DataFrame(cols)


_INT_COLUMNS = ("issued_ns", "comm_start_ns", "finished_ns", "need_ns", "comm_ns", "hidden_ns",
                "slack_ns", "ahead_units", "group_size")
