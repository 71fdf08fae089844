"""Steps: which ProfilerStep every event belongs to, and the window each step is measured on.

The rule, in order:

1. **One ProfilerStep track per rank**: the thread holding the most ``ProfilerStep#N`` spans
   (N a whole number up to ``MAX_STEP``: a larger one is refused, ``step_number``)
   (ties: the one whose first span starts earliest, then the tid as a string). Spans on other
   threads are ignored and named in a note (merging them per step number would stretch a 1.00
   ms step to 1.30 ms when a second thread's span is offset). Spans of the track that overlap
   (span S ends after span S+1 starts) are clipped at the next span's start.
2. **CPU events** belong to the span containing their start (HTA ``add_iteration``,
   hta/common/trace.py: ``s.ts <= e.ts < s.ts + s.dur``). An op that starts before any span
   contains it but ends inside a later one belongs to the first span it overlaps, and is
   clipped to it by the window (it is not dropped: its time inside the step is activity, not
   idle).
3. **Device work** (GPU rows except ``gpu_user_annotation``) belongs to the step of the CPU
   event that launched it (``launch_row``: correlation, else External id; analyzer/ingest/
   classify.py), as HTA does (``add_iteration``: a GPU event takes its correlated CPU event's
   iteration, -1 when none) and tb_plugin (torch_tb_profiler/profiler/step_parser.py: a step's
   device work is the work of the runtime launches inside its span). Device work with no launch
   in the trace (queued before the profiler started) and work launched outside every span get
   step -1: left out of every step and of the collectives (HTA and TraceLens leave it out
   too), counted and named in a note. It still ran on the device: where it runs inside a
   step's window the breakdown counts it as *other*, not idle (rule 4). A trace whose GPU rows
   carry no launch link at all is assigned by start time instead, with a note.
4. **Device window** of step S on a GPU rank: a_S = earliest start of S's device work, taken in
   step (span) order and made monotone; window S = [a_S, a_{S+1}) -- the gap in which the GPU
   waits for the CPU to launch step S+1 is S's idle. The **last step** with device work has no
   a_{S+1}; its window is [a_S, max(a_S + its CPU span's length, latest end of its device
   work)): the next step would have started its device work as long after its CPU span's
   start as S did (a_{S+1} = cpu_end_S + (a_S - cpu_start_S), spans being back to back), so a
   one-step trace reads as the same step followed by another, tail idle included; a GPU still
   busy past that point ends the window at its last device work, as a next step queued behind
   it would. A note per rank says which bound ended it (windows of the corpus's multi-step
   traces track their CPU spans: a100 222.05 / 222.44 ms, 219.73 / 219.73 ms). Windows never
   overlap and tile the device timeline (tb_plugin likewise makes device-side steps
   non-overlapping). Inside a window the breakdown counts every device activity *by time*,
   clipped to each window it intersects (analyzer/analyses/breakdown.py): that of steps >= 0
   as compute, communication, data or other, device work of no step (rule 3) as other, so idle
   = window time with no device activity of any kind on the rank (TraceLens GPUEventAnalyser:
   idle = time the GPU runs no computation, communication or memcpy), and the summed idle
   never exceeds the trace's device idle plus the last step's tail past the trace's last
   device activity. Step time = window length; the CPU span stays beside it (``cpu_start_ns``,
   ``cpu_end_ns``). A step that
   launched no device work gets an empty window, ``device_work`` False, is left out of medians
   and means and named in a note (tb_plugin drops such tail steps from its overview). If no step
   launched device work at all, the windows are the CPU spans (noted).
5. **CPU-only rank** (gloo): window = the span extended to the end of its communication work
   (gloo ops run on their own threads after the enqueue), clipped at the next span's start, so
   windows never overlap. Events are measured by step, clipped to their step's window. The
   first step of a trace that Kineto's window span (category ``Trace``) opens -- the span
   starts at or before the step with no other event between -- starts at its first recorded
   event: torch pays the profiler's start-up inside the first ProfilerStep's record_function
   (measured on torch 2.13, 4 gloo ranks: up to 1.2 s in which nothing runs, while the
   loop's own wall time, steps.parquet, leaves it out); a note per rank says how much.
6. **Whole-trace mode** (no ProfilerStep): every event in step 0. On a GPU rank the window is
   the extent of the launched device work (first start to last end; device work with no launch
   in the trace left out of the step and noted as in rule 3, counted as other where it runs
   inside that extent), so idle is device idle; on a CPU rank the whole trace. The CPU span is
   the whole trace.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analyzer.analyses import intervals as iv
from analyzer.contract.errors import BadInput

STEP_RE = re.compile(r"^ProfilerStep#(\d+)")
MAX_STEP = (1 << 53) - 1
"""The largest ProfilerStep number read: torch counts ``profiler.step()`` calls from 0, and a
loop of a million steps a second reaches this in 285 years. It is the largest whole number a
JSON reader that holds numbers as doubles (JavaScript, jq) keeps exact, and far inside the
int64 step columns (a larger number wrapped or failed there)."""


def step_number(name: str, path: str = "<trace>") -> int:
    """N of a ``ProfilerStep#N`` name. Raises ``BadInput`` (``not_a_trace``) when N is over
    ``MAX_STEP``: no profiler writes it, and the trace's steps cannot be told apart by it."""
    digits = STEP_RE.match(name).group(1)
    if len(digits) <= len(str(MAX_STEP)) and int(digits) <= MAX_STEP:
        return int(digits)
    shown = digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits):,} digits)"
    raise BadInput(path, "not_a_trace", f"ProfilerStep#{shown}: a step number over "
                   f"{MAX_STEP:,} (profilers count steps from 0)",
                   "pass the trace as the profiler wrote it, or number its ProfilerStep spans "
                   "by step")


@dataclass(kw_only=True, slots=True)
class Steps:
    """What ``assign_steps`` finds for one rank."""

    step: np.ndarray
    """Step number of every event row (int64), -1: no step."""
    table: pd.DataFrame
    """One row per step (``schemas.STEP_WINDOWS_SCHEMA``), sorted by step."""
    whole_trace: bool
    """No ProfilerStep: step 0 is the whole trace."""
    unlaunched: np.ndarray
    """Rows of device work with no launch in the trace (bool per row)."""
    notes: list[str] = field(default_factory=list)
    """Rules applied and events left out, one line each."""


def assign_steps(df: pd.DataFrame, *, names: np.ndarray, is_step: np.ndarray,
                 is_gpu: np.ndarray, is_gpu_annotation: np.ndarray, is_comm: np.ndarray,
                 launch: np.ndarray, paired: np.ndarray, device_kind: str,
                 is_trace_span: np.ndarray | None = None, path: str = "<trace>") -> Steps:
    """Steps and windows of one rank's classified rows (module docstring; ``path`` names the
    trace in a refusal: ``step_number``).

    ``df``: the decoded table sorted by start (ts_ns, end_ns, dur_ns, tid, coll... int64 ns);
    ``names``: each row's name; the masks: ProfilerStep rows, device rows, gpu_user_annotation
    rows, communication work (NCCL kernels, gloo ops); ``launch``: row of each device row's CPU
    launch (-1 none); ``paired``: row of each gloo op's enqueue (-1 none); ``device_kind``:
    "gpu" or "cpu"; ``is_trace_span``: Kineto's window span rows (rule 5). Pure function."""
    n = len(df)
    ts = df["ts_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    notes: list[str] = []
    no_rows = np.zeros(n, bool)
    if not is_step.any():
        return _whole_trace(df, names, is_gpu & ~is_gpu_annotation, is_comm, launch,
                            device_kind, notes)
    st, ss, se = _track(df, names, is_step, notes, path)
    step = _by_time(ts, end, st, ss, se)
    device = is_gpu & ~is_gpu_annotation
    unlaunched = no_rows
    outside = no_rows
    dev_rows = np.flatnonzero(device)
    if len(dev_rows):
        lk = launch[dev_rows]
        if (lk >= 0).any():
            step[dev_rows] = np.where(lk >= 0, step[np.maximum(lk, 0)], -1)
            unlaunched = device & (launch < 0)
            outside = device & (launch >= 0) & (step < 0)
        else:
            notes.append("device events carry no launch link (correlation / External id): "
                         "each is put in the step whose CPU span contains its start")
    gl = np.flatnonzero(is_comm & ~is_gpu & (paired >= 0))
    step[gl] = step[paired[gl]]
    later: list[str] = []
    if device_kind == "gpu":
        lo, hi, work = _device_windows(ts, end, step, device, st, ss, se, later)
    else:
        lo, hi, work = _cpu_windows(end, step, is_comm | is_gpu, st, ss, se)
        _trim_profiler_start(lo, hi, ts, is_step, is_trace_span, st, later)
    windows = (lo, hi) if device_kind == "gpu" else None
    _note_left_out(notes, df, names, unlaunched, is_comm,
                   "have no launch in the trace (queued before the profiler started)", windows)
    _note_left_out(notes, df, names, outside, is_comm,
                   "were launched outside every ProfilerStep", windows)
    _note_left_out(notes, df, names, is_comm & ~is_gpu & (step < 0), is_comm,
                   "ran outside every ProfilerStep", None, what="CPU collective ops")
    notes += later
    table = pd.DataFrame({"step": st, "cpu_start_ns": ss, "cpu_end_ns": se, "start_ns": lo,
                          "end_ns": hi, "device_work": work})
    return Steps(step=step, table=_typed(table.sort_values("step").reset_index(drop=True)),
                 whole_trace=False, unlaunched=unlaunched, notes=notes)


def _whole_trace(df, names, device, is_comm, launch, device_kind, notes) -> Steps:
    """Rule 6: one step 0. On a GPU rank its window is the device work's extent, from the first
    start to the last end of the launched device work (device work with no launch in the trace
    left out and noted as in rule 3), so idle is device idle there too; elsewhere the whole
    trace. ``cpu_start_ns`` / ``cpu_end_ns`` are the whole trace."""
    n = len(df)
    ts = df["ts_ns"].to_numpy()
    end = df["end_ns"].to_numpy()
    step = np.zeros(n, np.int64)
    lo = cpu_lo = int(ts.min()) if n else 0
    hi = cpu_hi = int(end.max()) if n else 0
    unlaunched = np.zeros(n, bool)
    if device_kind == "gpu" and device.any():
        if (launch[device] >= 0).any():
            unlaunched = device & (launch < 0)
            step[unlaunched] = -1
        else:
            notes.append("device events carry no launch link (correlation / External id): "
                         "all of them are step 0's work")
        work = device & ~unlaunched
        if work.any():
            lo, hi = int(ts[work].min()), int(end[work].max())
        _note_left_out(notes, df, names, unlaunched, is_comm,
                       "have no launch in the trace (queued before the profiler started)",
                       (np.array([lo]), np.array([hi])))
    table = pd.DataFrame({"step": [0], "cpu_start_ns": [cpu_lo], "cpu_end_ns": [cpu_hi],
                          "start_ns": [lo], "end_ns": [hi], "device_work": [True]})
    return Steps(step=step, table=_typed(table), whole_trace=True, unlaunched=unlaunched,
                 notes=notes)


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with the column types of ``schemas.STEP_WINDOWS_SCHEMA``."""
    return table.astype({**{c: np.int64 for c in ("step", "cpu_start_ns", "cpu_end_ns",
                                                   "start_ns", "end_ns")}, "device_work": bool})


def _track(df, names, is_step, notes, path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step numbers, starts, ends) of the ProfilerStep track's spans in time order, clipped so
    that none overlaps the next (rule 1)."""
    idx = np.flatnonzero(is_step)
    tid = df["tid"].iloc[idx].to_numpy().astype(str)  # the span rows only, not every row
    ts, end = df["ts_ns"].to_numpy()[idx], df["end_ns"].to_numpy()[idx]
    step = np.array([step_number(names[i], path) for i in idx], np.int64)
    # threads by span count (most first), then first span, then tid (numpy, not a pandas
    # groupby per rank: ~6 ms each on a rank of a few hundred spans)
    u_tid, of_tid = np.unique(tid, return_inverse=True)
    count = np.bincount(of_tid, minlength=len(u_tid))
    first = _group_min(of_tid, ts, len(u_tid))
    order = np.lexsort((u_tid, first, -count))
    chosen = str(u_tid[order[0]])
    if len(order) > 1:
        notes.append(f"{int(count[order[1:]].sum())} ProfilerStep span(s) on thread(s) "
                     f"{', '.join(u_tid[order[1:]].tolist())} ignored: one ProfilerStep track "
                     f"per rank, thread {chosen} (the one with the most spans)")
    on = of_tid == order[0]
    st, of_step = np.unique(step[on], return_inverse=True)  # one span per step number
    ss = _group_min(of_step, ts[on], len(st))
    se = np.full(len(st), np.iinfo(np.int64).min, np.int64)
    np.maximum.at(se, of_step, end[on])
    by_start = np.argsort(ss, kind="quicksort")  # as pandas' sort_values("s") orders ties
    st, ss, se = st[by_start], ss[by_start], se[by_start]
    cut = se[:-1] > ss[1:]
    if cut.any():
        se[:-1] = np.minimum(se[:-1], ss[1:])
        notes.append(f"{int(cut.sum())} ProfilerStep span(s) overlap the next one: clipped at "
                     "the next span's start")
    return st, ss, se


def _group_min(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """int64 minimum of ``values`` per group code (``group``: 0 .. n - 1, each used)."""
    out = np.full(n, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(out, group, values)
    return out


def _by_time(ts, end, st, ss, se) -> np.ndarray:
    """Step of each row by time (rule 2): the span containing its start, else the first span
    it overlaps, else -1. Spans sorted and non-overlapping."""
    k = np.searchsorted(ss, ts, side="right") - 1
    inside = (k >= 0) & (ts < se[np.maximum(k, 0)])
    nxt = np.minimum(k + 1, len(ss) - 1)
    later = ~inside & (k + 1 < len(ss)) & (end > ss[nxt])
    return np.where(inside, st[np.maximum(k, 0)], np.where(later, st[nxt], -1)).astype(np.int64)


def _device_windows(ts, end, step, device, st, ss, se, notes):
    """(lo, hi, device_work) per span, in span order (rule 4)."""
    m = len(st)
    pos = {int(s): i for i, s in enumerate(st.tolist())}
    rows = np.flatnonzero(device & (step >= 0))
    k = np.array([pos[int(s)] for s in step[rows].tolist()], np.int64)
    first = np.full(m, np.iinfo(np.int64).max, np.int64)
    last = np.full(m, np.iinfo(np.int64).min, np.int64)
    np.minimum.at(first, k, ts[rows])
    np.maximum.at(last, k, end[rows])
    work = np.bincount(k, minlength=m) > 0
    if not work.any():
        notes.append("no ProfilerStep launched device work: the step windows are the CPU "
                     "spans")
        return ss.copy(), se.copy(), np.ones(m, bool)
    a = np.maximum.accumulate(np.where(work, first, np.iinfo(np.int64).min))
    w = np.flatnonzero(work)
    j = int(w[-1])  # the last step with device work: no next a to end its window
    paced_ns = int(a[j]) + int(se[j] - ss[j])
    tail_end = max(int(last[j]), int(a[j]), paced_ns)
    if paced_ns >= int(last[j]):
        notes.append(f"step {int(st[j])}'s device window (the last step with device work, no "
                     "next step to end it) ends at its first device work + its CPU "
                     f"ProfilerStep span ({(se[j] - ss[j]) / 1e6:.3f} ms), "
                     f"{(paced_ns - int(last[j])) / 1e6:.3f} ms after its last device work: "
                     "the tail idle a next step launching as this one did would leave")
    else:
        notes.append(f"step {int(st[j])}'s device window (the last step with device work, no "
                     "next step to end it) ends at its last device work, "
                     f"{(int(last[j]) - paced_ns) / 1e6:.3f} ms after its first device work + "
                     f"its CPU ProfilerStep span ({(se[j] - ss[j]) / 1e6:.3f} ms): the device "
                     "ran behind the CPU")
    # a step without work starts where the next step with work starts (an empty window)
    nxt = np.searchsorted(w, np.arange(m))  # index in w of the next step with work
    lo = np.where(nxt < len(w), a[w[np.minimum(nxt, len(w) - 1)]], tail_end)
    hi = np.append(lo[1:], tail_end)
    hi[w[-1]] = tail_end
    hi = np.maximum(hi, lo)
    empty = [int(s) for s in st[~work].tolist()]
    if empty:
        notes.append(f"step(s) {', '.join(map(str, empty))} launched no device work (e.g. a "
                     "truncated last step): empty device window, left out of medians and means")
    return lo, hi, work


def _trim_profiler_start(lo, hi, ts, is_step, is_trace_span, st, notes) -> None:
    """Rule 5's profiler start-up, in place on the windows ``lo`` (span order): the first step
    span at or after the start of each of Kineto's window spans, with no other event between,
    starts at its first event that is neither a step span nor a window span."""
    if is_trace_span is None or not is_trace_span.any() or not len(lo):
        return
    others = ~is_step & ~is_trace_span
    other_ts = np.sort(ts[others])
    for span_start in np.unique(ts[is_trace_span]).tolist():
        k = int(np.searchsorted(lo, span_start, "left"))
        if k >= len(lo):
            continue
        first = lo[k]
        i = int(np.searchsorted(other_ts, span_start, "left"))
        if i >= len(other_ts) or other_ts[i] < first:
            continue  # something ran between the span's start and the step's: not start-up
        begin = other_ts[i]
        if begin == first or begin >= hi[k]:
            continue
        lo[k] = begin
        notes.append(f"step {int(st[k])} starts at its first recorded event, "
                     f"{(begin - first) / 1e6:.3f} ms after its ProfilerStep began: the "
                     "profiler's start-up (nothing runs in it; steps.parquet's wall time leaves "
                     "it out too)")


def _cpu_windows(end, step, work_rows, st, ss, se):
    """(lo, hi, True) per span, in span order (rule 5)."""
    m = len(st)
    pos = {int(s): i for i, s in enumerate(st.tolist())}
    rows = np.flatnonzero(work_rows & (step >= 0))
    hi = se.copy()
    if len(rows):
        k = np.array([pos[int(s)] for s in step[rows].tolist()], np.int64)
        np.maximum.at(hi, k, end[rows])
    hi[:-1] = np.minimum(hi[:-1], ss[1:])
    return ss.copy(), np.maximum(hi, ss), np.ones(m, bool)


def _note_left_out(notes, df, names, mask, is_comm, why: str, windows=None, *,
                   what: str = "device events") -> None:
    """A note counting the rows of ``mask``: their time, how much is communication, the name
    with the most time and, given the device ``windows`` ((lo, hi) arrays, ns), the time of
    their union inside the windows, which the breakdown counts as other where no step's own
    work covers it (rules 3 and 4)."""
    if not mask.any():
        return
    dur = df["dur_ns"].to_numpy()
    comm = mask & is_comm
    by_name = pd.Series(dur[mask]).groupby(names[mask]).sum().sort_values(ascending=False)
    top, top_ns = str(by_name.index[0]), int(by_name.iat[0])
    top = top if len(top) <= 80 else top[:77] + "..."
    if windows is None:
        where = ("left out of steps, breakdown and the collective tables (calls, time, bytes), as "
                 "HTA and TraceLens do")
    else:
        where = ("left out of steps and the collective tables (calls, time, bytes), as HTA "
                 "and TraceLens do; "
                 f"{_inside_ns(df, mask, *windows) / 1e6:.3f} ms of it runs inside step "
                 "windows, counted there as other (not idle) where no step's own work covers it")
    notes.append(f"{int(mask.sum())} {what} ({dur[mask].sum() / 1e6:.1f} ms) {why}: {where}; "
                 f"{int(comm.sum())} of them communication ({dur[comm].sum() / 1e6:.1f} ms), "
                 f"{len(by_name)} distinct names, the longest in total {top} "
                 f"({top_ns / 1e6:.1f} ms)")


def _inside_ns(df, mask, lo, hi) -> int:
    """|(union of the rows of ``mask``) ∩ (union of the windows [lo, hi))|, int64 ns."""
    rows = iv.merge(df["ts_ns"].to_numpy()[mask], df["end_ns"].to_numpy()[mask])
    keep = hi > lo
    return iv.measure(iv.intersect(rows, iv.merge(lo[keep], hi[keep])))
