"""Per rank and step time breakdown: compute, communication, overlap, exposed, data, other, idle.

Sets, per rank and step S, clipped to S's window ``[start_ns, end_ns)`` (analyzer/ingest/steps.py):
on a GPU rank every event of a step >= 0 by time (device windows tile the device timeline, so an
event crossing a window boundary counts in both windows, each part in its own); on a CPU rank
the events of step S.

GPU rank (the GPU timeline, as HTA's temporal breakdown):
  C = NCCL kernels, K = other kernels, O = memcpy / memset / sync of steps >= 0, and every
  device event of no step (analyzer/ingest/steps.py rule 3) whatever its kind: the device was
  busy. Idle is then window time with no device activity of any kind.
CPU rank (gloo):
  C = ``gloo:*`` ops (the runloop threads), K = main-thread cpu_ops minus the time the main
  thread spends inside c10d enqueue ops and waiting for collectives, O = every other CPU event
  except ranges (ProfilerStep, user annotations).
  How a synchronous wait looks in a real trace (torch 2.13, gloo, FSDP1 and DDP recorded with
  tests/analyzer/gloo_record.py): ``c10d::allgather_`` / ``c10d::_reduce_scatter_base_`` return
  after enqueueing; ``work.wait()`` records no op of its own, so the wait is time in which the
  main thread runs no op except the ones that *enclose* the enqueue (``autograd::engine::
  evaluate_function: AddmmBackward0`` around FSDP's pre-backward all_gather,
  ``...AccumulateGrad`` around its post-backward reduce_scatter). Rule: for a c10d op paired with
  its gloo op, the interval [enqueue end, gloo end) minus every main-thread op that does not
  enclose the enqueue is waiting, not compute.

Data supply (issue 10), D = the ``enumerate(DataLoader)#...__next__`` ranges (role data, any
CPU thread: the host fetching or waiting for the next batch) ∪ host-to-device memcpys (rule
``gpu.memcpy.htod``: input copies on the GPU timeline). On a CPU rank the main-thread ops inside
a DataLoader range (collate, a single-process loader's ``__getitem__``) are data supply, not
computation: K excludes them.

  compute_ns = |K|, comm_ns = |C|, overlap_ns = |C ∩ K| (HTA get_comm_comp_overlap),
  exposed_comm_ns = |C \\ K| (TraceLens), data_wait_ns = |D \\ (C ∪ K)|,
  other_ns = |O \\ (C ∪ K ∪ D)|, idle_ns = window - |C ∪ K ∪ D ∪ O|,
so compute_ns + exposed_comm_ns + data_wait_ns + other_ns + idle_ns == step_ns exactly
(integers): each instant of the window counts once, for the first of compute, communication,
data, other that covers it. Data time under computation or communication is hidden and not
counted (as communication under computation is hidden): data_wait_ns is the time the rank had
nothing to do but fetch or wait for input. Without DataLoader ranges and HtoD copies it is 0
and the other figures are those of the four-part breakdown.
data_wait_frac = data_wait_ns / step_ns; a step is ``input_bound`` when data_wait_frac >=
INPUT_BOUND_FRAC (a convention of this project, not a published threshold).

Last step's tail (``last_step_tail_ns``): on a GPU rank, the part of the last step's window
(the last step with device work, whose window no next step ends: analyzer/ingest/steps.py rule
4, its first device work + its CPU span) after the last device activity of any kind in it:
window end - end of C ∪ K ∪ D ∪ O there (the whole window when nothing runs in it); 0 on every
other step, on a CPU rank and when the window ends at its last device work. All of it is
idle_ns (nothing runs in it). It is idle the rule infers (a next step launching as this one
did), not idle seen between two device activities: HTA's temporal breakdown
(hta/analyzers/breakdown_analysis.py ``_get_idle_time_for_kernels``) measures idle from the
first kernel's start to the last kernel's end, and TraceLens' GPUEventAnalyser over the
events' extent, so neither counts it; idle_ns - last_step_tail_ns over the steps is the idle
they see (up to their own step windows).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv
from analyzer.contract.schemas import BREAKDOWN_SCHEMA

INPUT_BOUND_FRAC = 0.2
"""A step is input-bound when at least this share of it waits for data (module docstring)."""
_OTHER_CPU = ("other", "comm_enqueue", "memcpy", "memset", "sync")


def is_in(col: pd.Series, values: tuple[str, ...]) -> np.ndarray:
    """Boolean mask: rows whose value, as a string, is one of ``values``. A categorical is
    looked up through its codes (one str() per category, not per row); a missing value is in
    no set (``values`` never holds "nan")."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = col.array.codes
        mask = np.zeros(len(codes), bool)
        for k, c in enumerate(col.array.categories.tolist()):
            if str(c) in values:
                mask |= codes == k
        return mask
    return np.isin(col.astype(str).to_numpy().astype(object), values)


class _Rows:
    """Per event row, as numpy arrays: start / end and the set each row belongs to (module
    docstring: C comm, K compute, O other, D data; on a CPU rank with a main thread, E its c10d
    enqueue ops, M its ops inside DataLoader ranges, and paired_row for the wait rule)."""

    __slots__ = ("s", "e", "comm", "comp", "other", "data", "enq", "data_main", "paired",
                 "gpu")

    def __init__(self, ev: pd.DataFrame, device_kind: str, main_tid: str | None):
        role = ev["role"]
        gpu = ev["is_gpu"].to_numpy(dtype=bool)
        self.gpu = gpu
        self.s = ev["ts_ns"].to_numpy()
        self.e = ev["end_ns"].to_numpy()
        is_data = is_in(role, ("data",))
        htod = (is_in(ev["rule"], ("gpu.memcpy.htod",)) if "rule" in ev.columns
                else np.zeros(len(ev), bool))
        self.data = (is_data & ~gpu) | (gpu & htod)
        self.enq = self.data_main = self.paired = None
        if device_kind == "gpu":
            self.comm = gpu & is_in(role, ("comm",))
            self.comp = gpu & is_in(role, ("compute",))
            self.other = gpu & is_in(role, ("memcpy", "memset", "sync"))
            return
        self.comm = is_in(role, ("comm",))
        self.comp = is_in(role, ("compute",))
        self.other = ~gpu & is_in(role, _OTHER_CPU)
        if main_tid is not None:
            main = is_in(ev["tid"], (main_tid,))
            self.enq = is_in(role, ("comm_enqueue",)) & main
            self.data_main = is_data & main
            self.paired = (ev["paired_row"].to_numpy() if "paired_row" in ev.columns
                           else np.full(len(ev), -1, np.int64))

    def take(self, idx: np.ndarray) -> "_Rows":
        """These rows only (``paired`` still indexes the whole table)."""
        out = object.__new__(_Rows)
        for k in _Rows.__slots__:
            v = getattr(self, k)
            setattr(out, k, None if v is None else v[idx])
        return out

    def stepless_as_other(self, step: np.ndarray) -> np.ndarray:
        """GPU rank: move device rows of no step (``step`` < 0, int64 per row) that are in
        some set to O (module docstring), in place; returns them (bool per row)."""
        stray = (step < 0) & self.gpu & (self.comm | self.comp | self.other | self.data)
        self.comm = self.comm & ~stray
        self.comp = self.comp & ~stray
        self.data = self.data & ~stray
        self.other = self.other | stray
        return stray

    def used(self) -> np.ndarray:
        """Rows in some set."""
        m = self.comm | self.comp | self.other | self.data
        return m if self.enq is None else m | self.enq | self.data_main


class _Windows:
    """Step windows [lo, hi) laid end to end on one virtual time line, so that the interval
    algebra of every step runs in one call: window k's instant t sits at
    ``t - lo[k] + base[k]``, and consecutive windows are 1 ns apart (their intervals never
    touch, so never merge). Window k holds the rows with ``group == k`` (-1: none)."""

    def __init__(self, lo: np.ndarray, hi: np.ndarray, group: np.ndarray):
        self.lo = lo.astype(np.int64)
        self.hi = hi.astype(np.int64)
        span = np.maximum(self.hi - self.lo, 0) + 1
        self.base = np.zeros(len(span), np.int64)
        np.cumsum(span[:-1], out=self.base[1:])
        self.group = group

    def place(self, s: np.ndarray, e: np.ndarray, g: np.ndarray) -> iv.Intervals:
        """The canonical virtual set of intervals [s, e) of windows ``g``, each clipped to its
        window."""
        lo, hi = self.lo[g], self.hi[g]
        cs = np.clip(s, lo, hi)
        ce = np.clip(e, lo, hi)
        shift = self.base[g] - lo
        return iv.merge(cs + shift, ce + shift)

    def rows(self, mask: np.ndarray, r: _Rows) -> iv.Intervals:
        """The rows of ``mask`` that belong to a window, placed."""
        sel = np.flatnonzero(mask & (self.group >= 0))
        return self.place(r.s[sel], r.e[sel], self.group[sel])

    def measure(self, a: iv.Intervals) -> np.ndarray:
        """|a ∩ window k| for every k, int64 ns (exact: prefix sums of lengths)."""
        cs = np.zeros(len(a[0]) + 1, np.int64)
        np.cumsum(a[1] - a[0], out=cs[1:])
        at = np.searchsorted(a[0], self.base)
        return np.diff(cs[np.append(at, len(a[0]))])

    def real(self, a: iv.Intervals, k: int) -> iv.Intervals:
        """Window ``k``'s part of a virtual set, in real time."""
        lo = np.searchsorted(a[0], self.base[k])
        hi = np.searchsorted(a[0], self.base[k + 1]) if k + 1 < len(self.base) else len(a[0])
        shift = self.lo[k] - self.base[k]
        return a[0][lo:hi] + shift, a[1][lo:hi] + shift


def _sets(r: _Rows, w: _Windows, all_end_ns: np.ndarray
          ) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals, iv.Intervals]:
    """(C, K, O, D) of the module docstring, every window at once (virtual time)."""
    return (w.rows(r.comm, r), _compute(r, w, all_end_ns), w.rows(r.other, r),
            w.rows(r.data, r))


def _compute(r: _Rows, w: _Windows, all_end_ns: np.ndarray) -> iv.Intervals:
    """K: compute rows, on a CPU rank less its main thread's enqueue ops, collective waits
    and DataLoader work (module docstring)."""
    comp = w.rows(r.comp, r)
    if r.enq is None:
        return comp
    busy = iv.union(iv.union(w.rows(r.enq, r), _waits(r, w, all_end_ns)),
                    w.rows(r.data_main, r))
    return iv.subtract(comp, busy)


def _waits(r: _Rows, w: _Windows, all_end_ns: np.ndarray) -> iv.Intervals:
    """Main-thread waiting for paired gloo collectives (module docstring), placed: for an
    enqueue op i of window k, [end of i, end of its gloo op) minus the window's compute rows
    that do not enclose i. The waits are themselves laid end to end (``_Windows``), so one
    subtraction serves them all."""
    g = w.group
    enq = np.flatnonzero(r.enq & (r.paired >= 0) & (g >= 0))
    w0, w1 = r.e[enq], all_end_ns[r.paired[enq]]
    valid = w1 > w0
    enq, w0, w1 = enq[valid], w0[valid], w1[valid]
    if not len(enq):
        return iv.EMPTY
    ops = np.flatnonzero(r.comp & (g >= 0))
    ops = ops[np.argsort(g[ops], kind="stable")]
    first = np.searchsorted(g[ops], np.arange(len(w.base) + 1))
    ops_s, ops_e = r.s[ops], r.e[ops]
    wait_of, busy = [], []  # (wait index, compute row) pairs that cut into the wait
    for k in np.unique(g[enq]).tolist():
        s, e = ops_s[first[k]:first[k + 1]], ops_e[first[k]:first[k + 1]]
        q_all = np.flatnonzero(g[enq] == k)
        chunk = max(1, (1 << 22) // max(len(s), 1))  # bounded pair matrix
        for c in range(0, len(q_all), chunk):
            q = q_all[c:c + chunk]
            i = enq[q]
            cut = ((s[None, :] < w1[q, None]) & (e[None, :] > w0[q, None])
                   & ~((s[None, :] <= r.s[i, None]) & (e[None, :] >= r.e[i, None])))
            qi, oj = np.nonzero(cut)
            wait_of.append(q[qi])
            busy.append(first[k] + oj)
    waits = _Windows(w0, w1, np.arange(len(enq)))
    wait_of = np.concatenate(wait_of) if wait_of else np.zeros(0, np.int64)
    busy = np.concatenate(busy) if busy else np.zeros(0, np.int64)
    gaps = iv.subtract(waits.place(w0, w1, np.arange(len(enq))),
                       waits.place(ops_s[busy], ops_e[busy], wait_of))
    q = np.searchsorted(waits.base, gaps[0], "right") - 1
    shift = w0[q] - waits.base[q]
    return w.place(gaps[0] + shift, gaps[1] + shift, g[enq[q]])


_FIT = 1 << 62
"""Virtual time lines longer than this are split (int64 headroom)."""


def rank_breakdown(rank: int, events: pd.DataFrame, steps: pd.DataFrame, device_kind: str,
                   main_tid: str | None) -> pd.DataFrame:
    """Breakdown rows (``BREAKDOWN_SCHEMA``) of one rank; ``steps``: ``STEP_WINDOWS_SCHEMA``
    (analyzer/ingest/steps.py). The sets of the module docstring (``_membership``: which rows a
    window measures), built and measured for every step in one pass (``_Windows``), with |C ∩
    K| = |C| + |K| - |C ∪ K| and |X \\ Y| = |X ∪ Y| - |Y|, exact in integers."""
    if not len(steps):
        return BREAKDOWN_SCHEMA.empty_table().to_pandas()
    st, lo, hi, full, step_col, measured = _windows_and_rows(events, steps, device_kind, main_tid)
    m = np.zeros((5, len(st)), np.int64)
    work = (steps["device_work"].to_numpy().astype(bool) if "device_work" in steps.columns
            else np.ones(len(st), bool))
    last = _last_window(steps["cpu_start_ns"].to_numpy(), work) if device_kind == "gpu" else -1
    tail_ns = np.zeros(len(st), np.int64)
    for ks, w, rows, _ in _batches(st, lo, hi, full, step_col, measured, device_kind):
        comm, comp, other, data = _sets(rows, w, full.e)
        u1 = iv.union(comm, comp)
        u2 = iv.union(u1, data)
        u3 = iv.union(u2, other)
        m[:, ks] = [w.measure(x) for x in (comm, comp, u1, u2, u3)]
        if last in ks.tolist():
            busy = w.real(u3, ks.tolist().index(last))
            tail_ns[last] = hi[last] - max(int(busy[1][-1]) if len(busy[1]) else lo[last],
                                           lo[last])
    comm_ns, compute_ns, u1_ns, u2_ns, u3_ns = m
    step_ns = hi - lo
    overlap_ns = comm_ns + compute_ns - u1_ns
    exposed_ns = comm_ns - overlap_ns
    data_ns = u2_ns - u1_ns
    other_ns = u3_ns - u2_ns
    idle_ns = step_ns - compute_ns - exposed_ns - data_ns - other_ns
    nan = float("nan")
    overlap_frac = [o / c if c else nan for o, c in zip(overlap_ns.tolist(), comm_ns.tolist())]
    data_frac = [d / s if s else nan for d, s in zip(data_ns.tolist(), step_ns.tolist())]
    return pd.DataFrame({
        "rank": np.full(len(st), rank, np.int64), "step": st, "step_start_ns": lo,
        "step_ns": step_ns, "compute_ns": compute_ns, "comm_ns": comm_ns,
        "overlap_ns": overlap_ns, "exposed_comm_ns": exposed_ns, "other_ns": other_ns,
        "idle_ns": idle_ns, "overlap_frac": np.array(overlap_frac, np.float64),
        "data_wait_ns": data_ns, "data_wait_frac": np.array(data_frac, np.float64),
        "input_bound": np.array([f >= INPUT_BOUND_FRAC for f in data_frac], bool),
        "cpu_step_ns": (steps["cpu_end_ns"].to_numpy() - steps["cpu_start_ns"].to_numpy()
                        ).astype(np.int64),
        "device_work": work, "last_step_tail_ns": tail_ns,
        "compute_kernels": compute_kernels(events, full, st, device_kind)})


def compute_kernels(events: pd.DataFrame, rows: "_Rows", st: np.ndarray, device_kind: str
                    ) -> np.ndarray:
    """Kernels each step ran, int64 per step of ``st`` (by the rows' ``step``): on a GPU rank
    its compute kernels (role compute: device rows); on a CPU rank the compute rows that
    enclose no other compute row of their thread -- the ops that ran a kernel (an eager aten
    kernel, an extern ``aten::mm`` inside a compiled graph, inductor's profiled
    ``graph_<n>_cpp_fused_*``), not the ops and regions around them (``aten::linear``,
    ``CompiledFunction``). A count, not a time: the same work counts the same on a busy machine,
    and a fusion (``--compile``) shows as fewer kernels (issue 45)."""
    comp = np.flatnonzero(rows.comp & (~rows.gpu if device_kind == "cpu" else rows.gpu))
    if device_kind == "cpu" and len(comp):
        tid = pd.factorize(events["tid"])[0][comp]  # codes: a thread id may be a str
        order = np.lexsort((-rows.e[comp], rows.s[comp], tid))  # by thread, start, longest first
        comp, tid = comp[order], tid[order]
        nxt_s = np.append(rows.s[comp][1:], np.iinfo(np.int64).max)
        same = np.append(tid[1:] == tid[:-1], False)
        comp = comp[~same | (nxt_s >= rows.e[comp])]  # no compute row of its thread starts inside
    step = events["step"].to_numpy()[comp]
    pos = {int(k): i for i, k in enumerate(st.tolist())}
    out = np.zeros(len(st), np.int64)
    for k, n in zip(*np.unique(step[step >= 0], return_counts=True)):
        if int(k) in pos:
            out[pos[int(k)]] = int(n)
    return out


def _last_window(cpu_start_ns: np.ndarray, work: np.ndarray) -> int:
    """Index of the last step with device work in time (span) order, -1 when none: on a GPU
    rank the one window no next step ends (analyzer/ingest/steps.py rule 4)."""
    k = np.flatnonzero(work)
    return int(k[np.argmax(cpu_start_ns[k])]) if len(k) else -1


def _windows_and_rows(events: pd.DataFrame, steps: pd.DataFrame, device_kind: str, main_tid):
    """What the breakdown and the comm shares both start from: the steps' ids and windows
    (int64 ns), the rows (``_Rows``), each row's step and which rows are measured (GPU: also
    device rows of no step, as other)."""
    st = steps["step"].to_numpy().astype(np.int64)
    lo = steps["start_ns"].to_numpy().astype(np.int64)
    hi = steps["end_ns"].to_numpy().astype(np.int64)
    full = _Rows(events, device_kind, main_tid)
    step_col = events["step"].to_numpy()
    measured = step_col >= 0
    if device_kind == "gpu":
        measured = measured | full.stepless_as_other(step_col)
    return st, lo, hi, full, step_col, measured


def _batches(st, lo, hi, full: _Rows, step_col, measured, device_kind: str):
    """(ks, w, rows, row_ids) per batch of windows ``ks`` measured in one pass: ``w`` their
    ``_Windows``, ``rows`` the rows they measure (``_membership``), ``row_ids`` those rows'
    indices in the event table. One batch, or one window per batch when the windows are too
    long to lay end to end (``_FIT``)."""
    used = np.flatnonzero(full.used())
    r = full.take(used)
    row_of, win_of = _membership(r, step_col[used], measured[used], st, lo, hi, device_kind)
    spans = np.maximum(hi - lo, 0) + 1
    parts = [np.arange(len(st))] if sum(spans.tolist()) < _FIT else \
        [np.array([k]) for k in range(len(st))]
    for ks in parts:
        local = np.full(len(st), -1, np.int64)
        local[ks] = np.arange(len(ks))
        sel = local[win_of] >= 0
        yield ks, _Windows(lo[ks], hi[ks], local[win_of[sel]]), r.take(row_of[sel]), used[row_of[sel]]


def _membership(r: _Rows, step_col: np.ndarray, measured: np.ndarray, st: np.ndarray,
                lo: np.ndarray, hi: np.ndarray, device_kind: str
                ) -> tuple[np.ndarray, np.ndarray]:
    """(row, window) pairs: which rows of ``r`` each window measures (``rank_breakdown``).
    GPU rank: the ``measured`` rows (bool per row: steps >= 0 and device rows of no step), each
    paired with every non-empty window [lo, hi) it intersects (the windows are disjoint and
    sorted by time: analyzer/ingest/steps.py); otherwise each row with the window of its
    step (``step_col``)."""
    if device_kind == "gpu":
        rows = np.flatnonzero(measured)
        nonempty = np.flatnonzero(hi > lo)
        nonempty = nonempty[np.argsort(lo[nonempty], kind="stable")]
        wl, wh = lo[nonempty], hi[nonempty]
        k0 = np.searchsorted(wh, r.s[rows], side="right")  # first window ending after s
        k1 = np.searchsorted(wl, r.e[rows], side="left")  # one past the last starting before e
        count = np.maximum(k1 - k0, 0)
        row_of = np.repeat(rows, count)
        first = np.repeat(k0 - (np.cumsum(count) - count), count)
        return row_of, nonempty[first + np.arange(len(row_of))].astype(np.int64)
    order = np.argsort(st, kind="stable")
    pos = np.clip(np.searchsorted(st[order], step_col), 0, len(st) - 1)
    win = np.where(st[order][pos] == step_col, order[pos], -1)
    rows = np.flatnonzero(win >= 0)
    return rows, win[rows].astype(np.int64)


def whole_trace_overlap(events: pd.DataFrame) -> tuple[int, int]:
    """(overlap_ns, comm_ns) over every GPU event of the trace, whatever its step: HTA's
    ``get_comm_comp_overlap`` scope (communication = NCCL kernels, computation = other kernels
    except memcpy / memset / sync, whole profiled window)."""
    gpu = events["is_gpu"].to_numpy()
    role = events["role"].to_numpy().astype(object)
    s = events["ts_ns"].to_numpy()
    e = events["end_ns"].to_numpy()
    comm = iv.merge(s[gpu & (role == "comm")], e[gpu & (role == "comm")])
    comp = iv.merge(s[gpu & (role == "compute")], e[gpu & (role == "compute")])
    return iv.measure(iv.intersect(comm, comp)), iv.measure(comm)


def timeline_rows(ev: pd.DataFrame, device_kind: str, main_tid: str | None, lo: int, hi: int,
                  all_end_ns: np.ndarray | None = None) -> pd.DataFrame:
    """Merged compute and per-kind comm intervals of one step for plotting: columns lane
    ("compute" / "comm"), kind ("" / the collective kind, lanes in kind order), start_ns,
    end_ns, clipped to [lo, hi). ``ev``: the events of that step; ``all_end_ns``: end_ns of
    the rank's whole event table (``paired_row`` indexes it, for the CPU wait rule), None when
    ``ev`` is the whole table."""
    r = _Rows(ev, device_kind, main_tid)
    w = _Windows(np.array([lo]), np.array([hi]), np.zeros(len(ev), np.int64))
    comp = w.real(_compute(r, w, r.e if all_end_ns is None else all_end_ns), 0)
    lanes, starts, ends = [("compute", "", len(comp[0]))], [comp[0]], [comp[1]]
    col = ev["coll_kind"]  # categorical (ingest/classify.py)
    codes = col.cat.codes.to_numpy()
    present = np.unique(codes[r.comm])
    masks = {str(col.cat.categories[c]): r.comm & (codes == c)
             for c in present[present >= 0].tolist()}
    for k in sorted(masks):
        c = iv.clip(iv.merge(r.s[masks[k]], r.e[masks[k]]), lo, hi)
        lanes.append(("comm", k, len(c[0])))
        starts.append(c[0])
        ends.append(c[1])
    counts = [n for _, _, n in lanes]
    return pd.DataFrame({
        "lane": pd.array(np.repeat([x for x, _, _ in lanes], counts).astype(object), dtype="str"),
        "kind": pd.array(np.repeat([x for _, x, _ in lanes], counts).astype(object), dtype="str"),
        "start_ns": np.concatenate(starts).astype(np.int64),
        "end_ns": np.concatenate(ends).astype(np.int64)})


def comm_shares(events: pd.DataFrame, steps: pd.DataFrame, device_kind: str,
                main_tid: str | None, key: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray]:
    """(union_ns, exposed_ns): int64 per event row, each communication row's share of its
    process group's communication in the windows ``rank_breakdown`` measures (C and K of the
    module docstring, the same rows and windows, every step >= 0).

    Per window and process group P (``key``: one value per event row; default the ``pg``
    column, missing as ""), C_P = the union of P's rows; each instant of C_P is given to the
    row of P that starts first among those covering it (ties: table order), so summing the
    shares of any set of P's rows in one or more windows gives |C_P| there exactly (union_ns),
    and |C_P \\ K| (exposed_ns: P's communication that no computation overlaps, as
    ``exposed_comm_ns``). With one process group per rank, the shares of a step sum to its
    ``comm_ns`` and ``exposed_comm_ns``. Rows outside C: 0."""
    n = len(events)
    union, exposed = np.zeros(n, np.int64), np.zeros(n, np.int64)
    if not len(steps) or not n:
        return union, exposed
    st, lo, hi, full, step_col, measured = _windows_and_rows(events, steps, device_kind, main_tid)
    comm_rows = np.flatnonzero(full.comm)  # keys of these rows only (a few per step)
    if not len(comm_rows):
        return union, exposed
    vals = (events["pg"].iloc[comm_rows] if key is None else pd.Series(key).iloc[comm_rows])
    key_code = np.full(n, -1, np.int64)
    key_code[comm_rows] = pd.factorize(vals.astype(object).where(vals.notna(), "")
                                       .astype(str).to_numpy())[0]
    for _, w, rr, at_rows in _batches(st, lo, hi, full, step_col, measured, device_kind):
        comp = _compute(rr, w, full.e)
        cm = np.flatnonzero(rr.comm & (w.group >= 0))
        if not len(cm):
            continue
        g = w.group[cm]
        shift = w.base[g] - w.lo[g]
        cs = np.clip(rr.s[cm], w.lo[g], w.hi[g]) + shift
        ce = np.clip(rr.e[cm], w.lo[g], w.hi[g]) + shift
        rows = at_rows[cm]
        codes = key_code[rows]
        for c in np.unique(codes).tolist():
            at = np.flatnonzero(codes == c)
            at = at[np.lexsort((rows[at], cs[at]))]  # by start, ties by table order
            s, e = cs[at], ce[at]
            before = np.empty(len(e), np.int64)  # the furthest end of the earlier rows
            before[0] = np.iinfo(np.int64).min
            before[1:] = np.maximum.accumulate(e)[:-1]
            a = np.maximum(s, before)
            share = np.maximum(e - a, 0)
            b = np.maximum(a, e)
            hidden = _covered(comp, b) - _covered(comp, a)
            np.add.at(union, rows[at], share)
            np.add.at(exposed, rows[at], share - hidden)
    return union, exposed


def _covered(a: iv.Intervals, t: np.ndarray) -> np.ndarray:
    """|a ∩ (-inf, t)| for every instant of ``t`` (``a`` canonical), int64 ns."""
    cum = np.zeros(len(a[0]) + 1, np.int64)
    np.cumsum(a[1] - a[0], out=cum[1:])
    k = np.searchsorted(a[0], t, "right")  # intervals starting at or before t
    over = np.where(k > 0, np.maximum(a[1][np.maximum(k - 1, 0)] - t, 0), 0) if len(a[0]) \
        else np.zeros(len(t), np.int64)
    return cum[k] - over
