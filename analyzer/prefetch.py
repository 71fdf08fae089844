"""FSDP prefetch per FSDP unit and step: was each all_gather done before its data was needed?

Input: one rank's event table (``analyzer/api.py`` columns). Labels locate the units; names
checked against real torch 2.13 CPU/gloo traces of ``fully_shard`` and ``FullyShardedDataParallel``:

* FSDP2 (``fully_shard``): ``FSDP::all_gather (<fqn>)`` is where the unit's all_gather is issued;
  it sits inside ``FSDP::pre_forward (<fqn>)`` / ``FSDP::pre_backward (<fqn>)`` (not prefetched)
  or inside another unit's ``FSDP::pre_forward`` / ``FSDP::backward_prefetch for <i>``
  (prefetched). ``FSDP::all_gather_copy_out (<fqn>)`` is the first consumer of the gathered
  data: *need* = its start (CPU); on GPU see "GPU need" below, for the first GPU compute kernel
  launched from inside it (by correlation id; else the first GPU compute kernel starting after it).
  ``<fqn>`` is the module's fully qualified name (the root has none).
* FSDP1 (``FullyShardedDataParallel``): labels carry no unit name. Each ``c10d`` all_gather
  enqueue (``comm_enqueue`` row) is one unit's unshard, numbered ``#k`` in issue order within
  the step's forward or backward; it is prefetched when inside ``_pre_forward_prefetch`` /
  ``_pre_backward_prefetch``. *need* = the end of the pre-hook (``_pre_forward`` /
  ``_pre_backward_hook``) that consumes it: the enclosing one, or for a prefetched unit the next
  one to start after the issue (the unit's module computation starts when that hook returns).
  On GPU: "GPU need" of the first GPU compute kernel launched after that hook returned. One
  NCCL all_gather shows up as nested enqueue ops (``c10d::_allgather_base_`` >
  ``record_param_comms`` > ``nccl:_all_gather_base``, as in the A100 corpus trace); only the
  outermost one on its thread is an issue.

Labels are read from CPU rows only: on GPU traces Kineto mirrors every user annotation as a
``gpu_user_annotation`` on a stream (GPU clock positions, same name), which is not an issue.

GPU need. The consumer kernel runs on the compute stream after a stream wait on the
all_gather, so its start is never before the all_gather's end, and "start of the consumer"
would make every prefetch look on time. *need* on GPU is the consumer's ready time: when it
could have started without that wait = max(its launch call's start on the CPU, the end of the
previous operation on its stream). slack < 0 is then the time the compute stream sat waiting.

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
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

FSDP2_ISSUE = re.compile(r"^FSDP::all_gather(?: \((?P<fqn>.*)\))?$")
FSDP2_COPY_OUT = "FSDP::all_gather_copy_out"
FSDP1_PREFIX = "FullyShardedDataParallel."
FSDP1_PREFETCH = ("FullyShardedDataParallel._pre_forward_prefetch",
                  "FullyShardedDataParallel._pre_backward_prefetch")
FSDP1_PRE_FORWARD = "FullyShardedDataParallel._pre_forward"
FSDP1_PRE_BACKWARD = "FullyShardedDataParallel._pre_backward_hook"

COLUMNS = ["rank", "step", "phase", "unit", "prefetched", "issued_ns", "comm_start_ns",
           "finished_ns", "need_ns", "comm_ns", "hidden_ns", "hidden_frac", "slack_ns", "labels"]

CPU_NOTE = ("On CPU (gloo) the all_gather runs synchronously inside the FSDP hook that issues "
            "it: the rank blocks in that hook until it finishes. So it is never under "
            "computation (hidden about 0 % by construction), it is always finished before its "
            "unit needs it (no late all_gathers; positive slack = the parameters sat ready until "
            "the unit started), and the blocking itself is counted as exposed communication -- "
            "prefetch can only move the wait to where the all_gather is issued, not hide it. "
            "FSDP overlap figures on CPU say nothing about a GPU run.")


def detect_labels(events: pd.DataFrame) -> str | None:
    """``"fsdp2"``, ``"fsdp1"`` or None: which FSDP label family the event table carries."""
    names = events["name"].astype(str)
    if names.str.match(FSDP2_ISSUE).any():
        return "fsdp2"
    if names.str.startswith(FSDP1_PREFIX).any():
        return "fsdp1"
    return None


def _merge(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Union of intervals as an (n, 2) int64 array, sorted and disjoint."""
    if len(starts) == 0:
        return np.empty((0, 2), dtype="int64")
    order = np.argsort(starts, kind="stable")
    out: list[list[int]] = []
    for s, e in zip(starts[order], ends[order]):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], int(e))
        else:
            out.append([int(s), int(e)])
    return np.asarray(out, dtype="int64")


def _covered(merged: np.ndarray, start: int, end: int) -> int:
    """ns of [start, end) covered by the merged intervals."""
    if len(merged) == 0 or end <= start:
        return 0
    lo = np.clip(merged[:, 0], start, end)
    hi = np.clip(merged[:, 1], start, end)
    return int(np.sum(hi - lo))


def _subtract(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a`` minus ``b`` (both merged)."""
    out = []
    for s, e in a:
        cur = int(s)
        for bs, be in b[(b[:, 1] > s) & (b[:, 0] < e)] if len(b) else []:
            if bs > cur:
                out.append([cur, int(bs)])
            cur = max(cur, int(be))
        if cur < e:
            out.append([cur, int(e)])
    return np.asarray(out, dtype="int64").reshape(-1, 2)


def _fsdp_hook_spans(ev: pd.DataFrame) -> pd.DataFrame:
    """FSDP's own hook / collective labels (not ``FullyShardedDataParallel.forward``, which wraps
    the module's whole forward)."""
    names = ev["name"].astype(str)
    hooks = names.str.startswith("FSDP::") | (names.str.startswith(FSDP1_PREFIX)
                                              & (names != "FullyShardedDataParallel.forward"))
    return ev[hooks]


def _enclosing(spans: pd.DataFrame, t: int) -> pd.DataFrame:
    """Spans (ts_ns, end_ns) that contain instant ``t``."""
    return spans[(spans["ts_ns"] <= t) & (spans["end_ns"] >= t)]


class _GpuView:
    """The GPU side of one event table: launch times by correlation id and the operations of
    each stream, to find consumer kernels and their ready time (module docstring)."""

    def __init__(self, ev: pd.DataFrame):
        gpu = ev["is_gpu"].astype(bool).to_numpy()
        role = ev["role"].astype(str).to_numpy()
        cpu_corr = ev[~gpu & (ev["correlation"].to_numpy() >= 0)]
        self.launch_ts = cpu_corr.groupby("correlation")["ts_ns"].min().to_dict()
        ops = ev[gpu & np.isin(role, ("compute", "comm", "memcpy", "memset"))]
        self.ops = {int(k): g.sort_values("ts_ns") for k, g in ops.groupby("stream")}
        self.compute = ev[gpu & (role == "compute")].sort_values("ts_ns")
        self.active = bool(len(self.compute))

    def launched(self, kernels: pd.DataFrame, lo: int, hi: int | None) -> pd.DataFrame:
        """``kernels`` whose launch call starts in [lo, hi] (hi None: no upper bound)."""
        t = kernels["correlation"].map(self.launch_ts)
        ok = t.notna() & (t >= lo) & ((t <= hi) if hi is not None else True)
        return kernels[ok.to_numpy(bool)]

    def launch_of(self, kernel) -> int | None:
        t = self.launch_ts.get(int(kernel["correlation"])) if int(kernel["correlation"]) >= 0 else None
        return None if t is None else int(t)

    def ready_ns(self, kernel) -> int:
        """When ``kernel`` could have started: max(launch call start, end of the previous
        operation on its stream); its own start when neither is known."""
        start = int(kernel["ts_ns"])
        cands = []
        launch = self.launch_of(kernel)
        if launch is not None:
            cands.append(launch)
        same = self.ops.get(int(kernel["stream"]))
        if same is not None:
            ends = same["end_ns"].to_numpy("int64")
            before = ends[(same["ts_ns"].to_numpy("int64") < start) & (ends <= start)]
            if len(before):
                cands.append(int(before.max()))
        return min(max(cands), start) if cands else start

    def consumer_ready(self, lo: int, hi: int | None) -> int | None:
        """Ready time of the first compute kernel launched in [lo, hi]; with ``hi`` given and
        none launched there, of the first compute kernel starting at or after ``lo``."""
        ks = self.launched(self.compute, lo, hi)
        if not len(ks) and hi is not None:
            ks = self.compute[self.compute["ts_ns"] >= lo]
        if not len(ks):
            return None
        return self.ready_ns(ks.sort_values("ts_ns").iloc[0])


def _outermost(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows not enclosed by another row of ``rows`` on the same thread."""
    keep = []
    for tid, g in rows.groupby("tid", sort=False, observed=True):
        g = g.sort_values(["ts_ns", "end_ns"], ascending=[True, False])
        cover_end = None
        for idx, e in zip(g.index, g["end_ns"].to_numpy("int64")):
            if cover_end is not None and e <= cover_end:
                continue
            keep.append(idx)
            cover_end = e if cover_end is None else max(cover_end, e)
    return rows.loc[keep].sort_values("ts_ns")


def _issues_fsdp2(ev: pd.DataFrame, gpu: _GpuView) -> list[dict]:
    cpu = ev[~ev["is_gpu"].astype(bool)]
    names = cpu["name"].astype(str)
    issue = cpu[names.str.match(FSDP2_ISSUE)]
    copy_out = cpu[names.str.startswith(FSDP2_COPY_OUT)]
    pre_fwd = cpu[names.str.startswith("FSDP::pre_forward")]
    bwd = cpu[names.str.startswith(("FSDP::pre_backward", "FSDP::backward_prefetch"))]
    out = []
    for _, row in issue.sort_values("ts_ns").iterrows():
        fqn = FSDP2_ISSUE.match(str(row["name"])).group("fqn") or ""
        t = int(row["ts_ns"])
        enclosing_bwd = _enclosing(bwd, t)
        phase = "backward" if len(enclosing_bwd) else "forward"
        if phase == "backward":
            prefetched = enclosing_bwd["name"].astype(str).str.startswith("FSDP::backward_prefetch").any()
        else:
            own = f"FSDP::pre_forward ({fqn})" if fqn else "FSDP::pre_forward"
            enc = _enclosing(pre_fwd, t)
            prefetched = bool(len(enc)) and not (enc["name"].astype(str) == own).any()
        label = f"{FSDP2_COPY_OUT} ({fqn})" if fqn else FSDP2_COPY_OUT
        consumers = copy_out[(copy_out["name"].astype(str) == label) & (copy_out["ts_ns"] >= t)]
        need = None
        if len(consumers):
            c = consumers.sort_values("ts_ns").iloc[0]
            need = int(c["ts_ns"])
            if gpu.active:
                ready = gpu.consumer_ready(int(c["ts_ns"]), int(c["end_ns"]))
                need = ready if ready is not None else need
        out.append({"step": int(row["step"]), "phase": phase, "unit": fqn or "(root)",
                    "prefetched": bool(prefetched), "issued_ns": t, "issue_end_ns": int(row["end_ns"]),
                    "need_ns": need})
    return out


def _issues_fsdp1(ev: pd.DataFrame, gpu: _GpuView) -> list[dict]:
    cpu = ev[~ev["is_gpu"].astype(bool)]
    names = cpu["name"].astype(str)
    enq = _outermost(cpu[(cpu["role"] == "comm_enqueue") & (cpu["coll_kind"] == "all_gather")])
    prefetch = cpu[names.isin(FSDP1_PREFETCH)]
    pre_fwd = cpu[names == FSDP1_PRE_FORWARD]
    pre_bwd = cpu[names == FSDP1_PRE_BACKWARD]
    bwd_any = cpu[names.isin((FSDP1_PRE_BACKWARD, FSDP1_PREFETCH[1]))
                  | names.str.startswith("FullyShardedDataParallel._post_backward")]
    out = []
    counters: dict[tuple[int, str], int] = {}
    for _, row in enq.iterrows():
        t = int(row["ts_ns"])
        phase = "backward" if len(_enclosing(bwd_any, t)) else "forward"
        prefetched = bool(len(_enclosing(prefetch, t)))
        hooks = pre_bwd if phase == "backward" else pre_fwd
        enc = _enclosing(hooks, t)
        if prefetched:
            later = hooks[hooks["ts_ns"] > t]
            need = int(later.sort_values("ts_ns").iloc[0]["end_ns"]) if len(later) else None
        else:
            need = int(enc["end_ns"].min()) if len(enc) else None
        if need is not None and gpu.active:
            need = gpu.consumer_ready(need, None)
        key = (int(row["step"]), phase)
        k = counters.get(key, 0)
        counters[key] = k + 1
        out.append({"step": int(row["step"]), "phase": phase, "unit": f"#{k}",
                    "prefetched": prefetched, "issued_ns": t, "issue_end_ns": int(row["end_ns"]),
                    "need_ns": need})
    return out


def prefetch_table(events: pd.DataFrame, *, rank: int) -> pd.DataFrame:
    """One row per FSDP unit all_gather of this rank (columns ``COLUMNS``); empty when the
    trace has no FSDP labels. ``labels`` is ``fsdp2`` or ``fsdp1``; ``need_ns`` / ``slack_ns``
    are <NA> when no consumer was found; ``comm_*`` / ``finished_ns`` / ``hidden_*`` are <NA> when
    no execution could be paired. On GPU traces ``need_ns`` is the consumer kernel's ready time
    (module docstring)."""
    family = detect_labels(events)
    if family is None:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    ev = events
    gpu = _GpuView(ev)
    issues = _issues_fsdp2(ev, gpu) if family == "fsdp2" else _issues_fsdp1(ev, gpu)
    execs = ev[(ev["role"] == "comm") & (ev["coll_kind"] == "all_gather")].sort_values("ts_ns")
    exec_start = execs["ts_ns"].to_numpy("int64")
    exec_end = execs["end_ns"].to_numpy("int64")
    exec_launch = np.array([t if t is not None else -1 for t in
                            (gpu.launch_of(r) if bool(r["is_gpu"]) else None
                             for _, r in execs.iterrows())], dtype="int64")
    taken = np.zeros(len(execs), dtype=bool)
    comp = ev[ev["role"] == "compute"]
    merged = _merge(comp["ts_ns"].to_numpy("int64"), comp["end_ns"].to_numpy("int64"))
    if not (comp["is_gpu"].astype(bool)).any():
        hooks = _fsdp_hook_spans(ev)
        merged = _subtract(merged, _merge(hooks["ts_ns"].to_numpy("int64"), hooks["end_ns"].to_numpy("int64")))
    rows = []
    for it in sorted(issues, key=lambda r: r["issued_ns"]):
        issue_end = it.pop("issue_end_ns")
        inside = ~taken & (exec_launch >= it["issued_ns"]) & (exec_launch <= issue_end)
        cand = np.nonzero(inside)[0]
        if not len(cand):
            cand = np.nonzero(~taken & (exec_start >= it["issued_ns"]))[0]
        rec = {"rank": rank, **it, "comm_start_ns": None, "finished_ns": None, "comm_ns": None,
               "hidden_ns": None, "hidden_frac": None, "slack_ns": None, "labels": family}
        if len(cand):
            i = int(cand[0])
            taken[i] = True
            s, e = int(exec_start[i]), int(exec_end[i])
            hidden = _covered(merged, s, e)
            rec.update(comm_start_ns=s, finished_ns=e, comm_ns=e - s, hidden_ns=hidden,
                       hidden_frac=hidden / (e - s) if e > s else None)
            if it["need_ns"] is not None:
                rec["slack_ns"] = it["need_ns"] - e
        rows.append(rec)
    out = pd.DataFrame(rows, columns=COLUMNS)
    for c in ("issued_ns", "comm_start_ns", "finished_ns", "need_ns", "comm_ns", "hidden_ns", "slack_ns"):
        out[c] = out[c].astype("Int64")
    out["hidden_frac"] = out["hidden_frac"].astype("Float64")
    return out


def prefetch_summary(table: pd.DataFrame) -> dict | None:
    """Run-level summary of ``prefetch_table`` rows (all ranks): all_gathers, prefetched (count),
    comm_ns, hidden_ns, hidden_frac (time-weighted), late (count with slack < 0), wait_ns (sum of
    -slack over the late ones), labels. None when there are no rows."""
    if table.empty:
        return None
    comm = int(table["comm_ns"].sum())
    hidden = int(table["hidden_ns"].sum())
    slack = table["slack_ns"].dropna()
    late = slack[slack < 0]
    return {"all_gathers": int(len(table)), "prefetched": int(table["prefetched"].sum()),
            "comm_ns": comm, "hidden_ns": hidden,
            "hidden_frac": hidden / comm if comm > 0 else None,
            "late": int(len(late)), "wait_ns": int(-late.sum()),
            "labels": str(table["labels"].iloc[0])}
