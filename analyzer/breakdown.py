"""Per rank and step time breakdown: compute, communication, overlap, exposed, data, other, idle.

Sets, per rank and step S (events attributed to S, see analyzer/classify.py, clipped to S's
window ``[start_ns, end_ns)``):

GPU rank (the GPU timeline, as HTA's temporal breakdown):
  C = NCCL kernels, K = other kernels, O = memcpy / memset / sync.
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
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer import intervals as iv

COLUMNS = ["rank", "step", "step_start_ns", "step_ns", "compute_ns", "comm_ns", "overlap_ns",
           "exposed_comm_ns", "other_ns", "idle_ns", "overlap_frac", "data_wait_ns",
           "data_wait_frac", "input_bound"]
INPUT_BOUND_FRAC = 0.2
"""A step is input-bound when at least this share of it waits for data (module docstring)."""
_OTHER_CPU = ("other", "comm_enqueue", "memcpy", "memset", "sync")


def _strs(col: pd.Series) -> np.ndarray:
    """``col.astype(str)`` as an object array; a categorical without missing values is
    expanded from its categories (one str() per distinct value, not per row)."""
    if isinstance(col.dtype, pd.CategoricalDtype) and not col.isna().any():
        cat = col.array
        return np.array([str(x) for x in cat.categories], object)[cat.codes]
    return col.astype(str).to_numpy().astype(object)


class _Cols:
    """The columns the breakdown reads, as numpy arrays (rows selected without pandas)."""

    __slots__ = ("role", "gpu", "s", "e", "tid", "paired", "kind", "htod")

    def __init__(self, ev: pd.DataFrame, *, kinds: bool = False):
        self.role = _strs(ev["role"])
        self.gpu = ev["is_gpu"].to_numpy()
        self.s = ev["ts_ns"].to_numpy()
        self.e = ev["end_ns"].to_numpy()
        self.tid = _strs(ev["tid"])
        self.paired = ev["paired_row"].to_numpy() if "paired_row" in ev.columns else None
        self.kind = ev["coll_kind"].to_numpy().astype(object) if kinds else None
        self.htod = ((ev["rule"] == "gpu.memcpy.htod").to_numpy(dtype=bool) if "rule" in ev.columns
                     else np.zeros(len(ev), bool))

    def take(self, idx: np.ndarray) -> "_Cols":
        out = object.__new__(_Cols)
        for k in _Cols.__slots__:
            v = getattr(self, k)
            setattr(out, k, None if v is None else v[idx])
        return out


def step_sets(ev: pd.DataFrame, device_kind: str, main_tid: str | None, lo: int, hi: int,
              all_end_ns: np.ndarray | None = None
              ) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals]:
    """(C, K, O) of the events ``ev`` (already restricted to one step), clipped to [lo, hi).

    ``all_end_ns``: end_ns of the rank's whole event table (``paired_row`` indexes it), needed
    on CPU ranks for the wait rule; None means ``ev`` is the whole table."""
    c = _Cols(ev)
    return _sets(c, device_kind, main_tid, lo, hi, c.e if all_end_ns is None else all_end_ns)


def _sets(c: _Cols, device_kind: str, main_tid: str | None, lo: int, hi: int,
          all_end_ns: np.ndarray) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals]:
    role, gpu, s, e = c.role, c.gpu, c.s, c.e

    def pick(mask):
        return iv.clip(iv.merge(s[mask], e[mask]), lo, hi)

    if device_kind == "gpu":
        comm = pick(gpu & (role == "comm"))
        comp = pick(gpu & (role == "compute"))
        other = pick(gpu & np.isin(role, ("memcpy", "memset", "sync")))
        return comm, comp, other
    comm = pick(role == "comm")
    comp = pick(role == "compute")
    if main_tid is not None:
        enq = (role == "comm_enqueue") & (c.tid == main_tid)
        comp = iv.subtract(comp, pick(enq))
        comp = iv.subtract(comp, iv.clip(_waits(c, enq, role == "compute", all_end_ns), lo, hi))
        comp = iv.subtract(comp, pick((role == "data") & (c.tid == main_tid)))
    other = pick(~gpu & np.isin(role, _OTHER_CPU))
    return comm, comp, other


def _data(c: _Cols, lo: int, hi: int) -> iv.Intervals:
    """D of the module docstring: DataLoader ranges (CPU) and HtoD copies (GPU), clipped."""
    mask = ((c.role == "data") & ~c.gpu) | (c.gpu & c.htod)
    return iv.clip(iv.merge(c.s[mask], c.e[mask]), lo, hi)


def _waits(c: _Cols, enq: np.ndarray, main_ops: np.ndarray, all_end_ns: np.ndarray
           ) -> iv.Intervals:
    """Main-thread waiting for paired gloo collectives (module docstring)."""
    paired, s, e = c.paired, c.s, c.e
    ops_s, ops_e = s[main_ops], e[main_ops]
    ws, we = [], []
    for i in np.flatnonzero(enq & (paired >= 0)):
        w0, w1 = int(e[i]), int(all_end_ns[paired[i]])
        if w1 <= w0:
            continue
        near = (ops_s < w1) & (ops_e > w0)
        encloses = (ops_s <= s[i]) & (ops_e >= e[i])
        busy = iv.merge(ops_s[near & ~encloses], ops_e[near & ~encloses])
        gap = iv.subtract((np.array([w0]), np.array([w1])), busy)
        ws.append(gap[0])
        we.append(gap[1])
    if not ws:
        return iv.EMPTY
    return iv.merge(np.concatenate(ws), np.concatenate(we))


def rank_breakdown(rank: int, events: pd.DataFrame, steps: pd.DataFrame, device_kind: str,
                   main_tid: str | None) -> pd.DataFrame:
    """Breakdown rows (COLUMNS) of one rank; ``steps`` holds step, start_ns, end_ns."""
    rows = []
    cols = _Cols(events)
    step_col = events["step"].to_numpy()
    order = np.argsort(step_col, kind="stable")  # rows of each step, in table order
    keys, first = np.unique(step_col[order], return_index=True)
    bounds = dict(zip(keys.tolist(), zip(first.tolist(), [*first[1:].tolist(), len(order)])))
    for st, lo, hi in steps[["step", "start_ns", "end_ns"]].itertuples(index=False):
        a, b = bounds.get(int(st), (0, 0))
        c = cols.take(order[a:b])
        comm, comp, other = _sets(c, device_kind, main_tid, int(lo), int(hi), cols.e)
        step_ns = int(hi - lo)
        compute_ns = iv.measure(comp)
        comm_ns = iv.measure(comm)
        overlap_ns = iv.measure(iv.intersect(comm, comp))
        exposed_ns = comm_ns - overlap_ns  # |C \ K| = |C| - |C ∩ K|
        busy = iv.union(comm, comp)
        data = _data(c, int(lo), int(hi))
        data_ns = iv.measure(iv.subtract(data, busy))
        other_ns = iv.measure(iv.subtract(other, iv.union(busy, data)))
        idle_ns = step_ns - compute_ns - exposed_ns - data_ns - other_ns
        data_frac = data_ns / step_ns if step_ns else float("nan")
        rows.append((rank, int(st), int(lo), step_ns, compute_ns, comm_ns, overlap_ns,
                     exposed_ns, other_ns, idle_ns,
                     overlap_ns / comm_ns if comm_ns else float("nan"), data_ns, data_frac,
                     bool(data_frac >= INPUT_BOUND_FRAC)))
    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({**{c: "int64" for c in COLUMNS if c.endswith("_ns") or c in ("rank", "step")},
                      "input_bound": bool})


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
    """Merged compute and per-kind comm intervals of one step for plotting."""
    comm, comp, _ = step_sets(ev, device_kind, main_tid, lo, hi, all_end_ns)
    parts = [pd.DataFrame({"lane": "compute", "kind": "", "start_ns": comp[0],
                           "end_ns": comp[1]})]
    role = ev["role"].to_numpy().astype(object)
    kinds = ev["coll_kind"].to_numpy().astype(object)
    gpu = ev["is_gpu"].to_numpy()
    base = (role == "comm") & (gpu if device_kind == "gpu" else np.ones(len(ev), bool))
    for k in sorted({str(x) for x in kinds[base]}):
        m = base & (kinds == k)
        c = iv.clip(iv.merge(ev["ts_ns"].to_numpy()[m], ev["end_ns"].to_numpy()[m]), lo, hi)
        parts.append(pd.DataFrame({"lane": "comm", "kind": k, "start_ns": c[0], "end_ns": c[1]}))
    out = pd.concat(parts, ignore_index=True)
    return out.astype({"start_ns": "int64", "end_ns": "int64"})
