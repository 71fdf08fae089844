"""Pipeline-parallel figures of a ``pp`` run (issue 27): each stage's bubble beside the
schedule's ideal one, and the send / recv traffic between stages. Pure functions of tables.

Stage of a rank: its coordinate on the mesh's ``"pp"`` dimension (``schemas.Mesh``, row-major:
on a mesh of shape [dp, P] rank r is stage ``r % P``; ``stage_of``).

Ideal bubble (``ideal_bubble_frac``): with P stages and M microbatches of equal cost, GPipe
keeps each stage idle for P - 1 of the M + P - 1 microbatch slots of a step, so the bubble
fraction is (P - 1) / (M + P - 1) (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural
Networks using Pipeline Parallelism": a bubble overhead of O((K-1)/(M+K-1)) for K partitions).
1F1B (PipeDream-Flush) has the same bubble and only bounds the activations in flight (Narayanan
et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
sec. 2.2: bubble time fraction (p - 1) / m of the ideal time, i.e. (p - 1) / (m + p - 1) of the
whole step).

Schedules with V stages per rank (issue 45; ``IDEAL_BUBBLES`` holds each formula and its
source). P pp ranks, M microbatches, each rank's work per microbatch split in V model chunks of
equal cost; times of a chunk's forward F, backward for the input B and for the weights W taken
equal (the papers' own assumption for the figures below):
* interleaved-1f1b: (P - 1) / (V M + P - 1): Narayanan et al. 2021, sec. 2.2.2, "the
  pipeline bubble ... reduced by a factor of v": bubble time fraction (1/v)(p - 1)/m of the
  ideal time. Needs M a multiple of P for its best order (torch's rounds).
* looped-bfs: the same (P - 1) / (V M + P - 1) when M >= P (Lamy-Poirier 2023, "Breadth-First
  Pipeline Parallelism", arXiv 2211.05953): a rank runs chunk k for all M microbatches, then
  chunk k + 1, whose first microbatch is back from rank P - 1 after P <= M slots, so only the
  fill and the drain of P - 1 chunk slots (1/V of a stage's time each) idle a rank.
* interleaved-zb: (P - 1) / (3 V M + P - 1): torch's ScheduleInterleavedZeroBubble is the ZB1P
  schedule of Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv
  2401.10241), whose ZB-H1 bubble is (p - 1)(T_F + T_B - T_W) against 1F1B's (p - 1)(T_F + T_B
  + T_W): with equal times, (P - 1) chunk-slots over the 3 M V slots of work of a rank.
* zbv: 0: ZB-V (Qi et al. 2024, sec. 6; torch's ScheduleZBVZeroBubble docstring: "the 'zero
  bubble' property only if time forward == time backward input == time backward weights").
* dualpipev: None, no closed form here: DeepSeek-V3's report (arXiv 2412.19437, Table 2) gives
  DualPipe's bubble as (PP/2 - 1)(F&B + B - 3W), which depends on how much a rank overlaps a
  forward with a backward (F&B); DualPipeV cuts DualPipe in half and no paper states its bubble.
Measured, every schedule's bubble is the same rule (below): the stages' idle and exposed time.

Measured bubble (``stage_bubbles``), from the per-rank breakdown (analyzer/analyses/
breakdown.py: compute + exposed_comm + data_wait + other + idle = step, exactly, per rank and
step): bubble_ns = exposed_comm_ns + idle_ns, the part of the step in which the rank computes
nothing and is either waiting inside a communication call (a blocking recv waiting for the
neighbour stage's activations or gradients: exposed communication) or doing nothing at all
(idle). Data wait (fetching the next batch) and other (memcpy, CPU overhead, enqueueing
collectives) are left out: the rank is busy then, not starved by the schedule. The dp
dimension's collectives (FSDP2 all_gather / reduce_scatter over dp) that compute does not hide
are exposed communication too, so with dp > 1 the figure is the schedule's bubble plus that
exposed time: an upper bound of the schedule's bubble (with dp = 1 there is none).
bubble_frac = sum of bubble_ns / sum of step_ns over the stage's ranks and profiled steps.

Stage pairs (``p2p_pairs``): every send_recv call of a rank, its direction from its name
(``direction``: ``gloo:send`` / ``c10d::send`` send, ``...recv...`` recv; an NCCL ``SendRecv``
kernel says neither) and its peer (the tracer's ``paritytrace::pg <pg> peer <r>`` annotation,
``schemas.PG_TAG_PREFIX``; -1 when unknown). A send goes from the rank's stage to the peer's, a
recv from the peer's to the rank's. Peer unknown: with P = 2 the peer stage is the other stage
(``peer_source`` "mesh"); with more stages it cannot be told (stage -1, "unknown").
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.contract.schemas import Mesh

IDEAL_BUBBLE_SOURCE = (
    "(P - 1) / (M + P - 1) for P stages and M microbatches: GPipe (Huang et al. 2019); 1F1B "
    "has the same bubble (Narayanan et al. 2021, Megatron-LM, sec. 2.2: (p - 1) / m of the "
    "ideal time)")
BUBBLE_RULE = (
    "bubble = exposed communication + idle of the stage's ranks (breakdown: the step's time "
    "in which the rank computes nothing and waits in a recv / send or does nothing); data wait "
    "and other are busy time, left out. Exposed dp collectives (FSDP2 over dp) count too, so "
    "with dp > 1 it bounds the schedule's bubble from above.")
PAIR_COLUMNS = ["src_stage", "dst_stage", "peer_source", "calls", "sends", "recvs",
                "send_bytes", "recv_bytes", "time_ns", "send_ns", "recv_ns"]


INTERLEAVED_SOURCE = (
    "(P - 1) / (V M + P - 1) for P ranks, V stages per rank, M microbatches: interleaved 1F1B "
    "(Narayanan et al. 2021, Megatron-LM, sec. 2.2.2: (1/v)(p - 1)/m of the ideal time)")
IDEAL_BUBBLES: dict[str, tuple[str, str]] = {
    "gpipe": ("(P - 1) / (M + P - 1)", IDEAL_BUBBLE_SOURCE),
    "1f1b": ("(P - 1) / (M + P - 1)", IDEAL_BUBBLE_SOURCE),
    "interleaved-1f1b": ("(P - 1) / (V M + P - 1)", INTERLEAVED_SOURCE),
    "looped-bfs": ("(P - 1) / (V M + P - 1)",
                   "(P - 1) / (V M + P - 1) for M >= P: looped breadth-first (Lamy-Poirier 2023, "
                   "arXiv 2211.05953), the fill and drain of P - 1 chunk slots of 1/V stage each"),
    "interleaved-zb": ("(P - 1) / (3 V M + P - 1)",
                       "(P - 1) / (3 V M + P - 1), equal forward, input- and weight-backward "
                       "times: ZB1P (Qi et al. 2024, Zero Bubble Pipeline Parallelism, ZB-H1 "
                       "bubble (p - 1)(T_F + T_B - T_W)) over V chunks per rank"),
    "zbv": ("0", "0 with equal forward, input- and weight-backward times: ZB-V (Qi et al. 2024, "
                 "Zero Bubble Pipeline Parallelism, sec. 6; torch ScheduleZBVZeroBubble)"),
    "dualpipev": ("none", "no closed form: DualPipe's (PP/2 - 1)(F&B + B - 3W) (DeepSeek-V3, "
                          "Table 2) depends on the forward-backward overlap; none is stated for "
                          "DualPipeV"),
}
"""``--pp-schedule`` -> (formula, source) of its ideal bubble share (module docstring)."""


def ideal_bubble_frac(stages: int, microbatches: int | None, schedule: str | None = None,
                      virtual: int = 1) -> float | None:
    """The ideal bubble share of a step of ``schedule`` (``IDEAL_BUBBLES``; None or an unknown
    name: GPipe's, the formula of the runs recorded before issue 45) for P = ``stages`` ranks,
    M = ``microbatches``, V = ``virtual`` stages per rank. None when M is unknown, any of them
    is < 1, or the schedule has no closed form (dualpipev)."""
    if not microbatches or microbatches < 1 or stages < 1 or virtual < 1:
        return None
    p, m, v = stages, microbatches, virtual
    if schedule in ("interleaved-1f1b", "looped-bfs"):
        return (p - 1) / (v * m + p - 1)
    if schedule == "interleaved-zb":
        return (p - 1) / (3 * v * m + p - 1)
    if schedule == "zbv":
        return 0.0
    if schedule == "dualpipev":
        return None
    return (p - 1) / (m + p - 1)


def ideal_source(schedule: str | None) -> str:
    """Where ``schedule``'s ideal bubble comes from (``IDEAL_BUBBLES``; GPipe's for others)."""
    return IDEAL_BUBBLES.get(schedule or "", (None, IDEAL_BUBBLE_SOURCE))[1]


def pp_dim(mesh: Mesh) -> int:
    """Index of the ``"pp"`` dimension of ``mesh``. Raises ``ValueError`` when it has none."""
    if "pp" not in mesh.dim_names:
        raise ValueError(f"mesh dims {mesh.dim_names} have no 'pp' dimension")
    return mesh.dim_names.index("pp")


def stage_of(mesh: Mesh) -> dict[int, int]:
    """{global rank: its stage} for every rank of ``mesh`` (module docstring)."""
    return {r: s for s, g in enumerate(stage_ranks(mesh)) for r in g}


def stage_ranks(mesh: Mesh) -> list[list[int]]:
    """Per stage (in order) the global ranks it runs on, sorted: the groups of the other
    dimension(s) at each pp coordinate."""
    d = pp_dim(mesh)
    groups = mesh.group_ranks(d)  # one group per dp coordinate, ranks in stage order
    return [sorted(g[s] for g in groups) for s in range(mesh.shape[d])]


def stage_bubbles(bd: pd.DataFrame, stages: dict[int, int]) -> pd.DataFrame:
    """Per stage of ``stages`` ({rank: stage}) from breakdown rows ``bd`` (``BREAKDOWN_SCHEMA``
    columns; the caller keeps the profiled steps with device work): stage, ranks (list of
    the stage's ranks with rows), rank_steps ((rank, step) rows), step_ns, compute_ns,
    bubble_ns (means per rank and step, ns), bubble_frac (sum bubble / sum step; NaN when
    the steps sum to 0). bubble_ns = exposed_comm_ns + idle_ns (module docstring). Stages
    without a row are left out; ranks outside ``stages`` are ignored."""
    cols = ["stage", "ranks", "rank_steps", "step_ns", "compute_ns", "bubble_ns", "bubble_frac"]
    if bd.empty:
        return pd.DataFrame(columns=cols)
    b = bd[bd["rank"].isin(list(stages))].copy()
    b["stage"] = b["rank"].map(stages).astype("int64")
    b["bubble_ns"] = b["exposed_comm_ns"].astype("int64") + b["idle_ns"].astype("int64")
    g = b.groupby("stage", sort=True)
    out = pd.DataFrame({
        "ranks": g["rank"].agg(lambda s: sorted(int(r) for r in s.unique())),
        "rank_steps": g.size().astype("int64"),
        "step_ns": g["step_ns"].mean(), "compute_ns": g["compute_ns"].mean(),
        "bubble_ns": g["bubble_ns"].mean()})
    total = g["step_ns"].sum().astype("float64")
    out["bubble_frac"] = (g["bubble_ns"].sum() / total).where(total > 0)
    return out.rename_axis("stage").reset_index()[cols]


def direction(name: str) -> str:
    """``send`` / ``recv`` from a send_recv event's name (``gloo:send``, ``c10d::recv_``,
    ``nccl:send``, ``record_param_comms`` ``send``), "" when the name says neither or both
    (``ncclDevKernel_SendRecv``, ``batch_isend_irecv``)."""
    t = str(name).lower().replace("_", "")
    send, recv = "send" in t, "recv" in t
    return "send" if send and not recv else "recv" if recv and not send else ""


def p2p_pairs(coll: pd.DataFrame, stages: dict[int, int], n_stages: int, steps: int
              ) -> pd.DataFrame:
    """Send / recv traffic per (src stage -> dst stage), per profiled step: ``coll`` has
    columns rank, kind, peer (global rank, -1 unknown), bytes (-1 unknown), dur_ns, step and
    either direction ("send" / "recv" / "") or name (``direction`` reads it); rows of kind
    ``send_recv`` in a step >= 0 count. ``steps``: the run's profiled steps (what the sums
    are divided by; < 1: 1).

    Returns ``PAIR_COLUMNS``, one row per (src_stage, dst_stage, peer_source), sorted:
    peer_source "peer" (the call's peer named its stage), "mesh" (no peer, P = 2: the other
    stage) or "unknown" (stages -1 where not known; a call of unknown direction is put as
    src = the rank's stage, dst = the peer's); per step, over all the stages' ranks: calls,
    sends, recvs (calls - sends - recvs: direction unknown), send_bytes / recv_bytes (the
    known bytes of the sends / recvs, NaN when no such call has known bytes), time_ns (sum
    of durations), send_ns, recv_ns."""
    c = coll[(coll["kind"].astype(str) == "send_recv") & (coll["step"] >= 0)]
    if c.empty:
        return pd.DataFrame(columns=PAIR_COLUMNS)
    rank = c["rank"].to_numpy(np.int64)
    peer = c["peer"].to_numpy(np.int64)
    dirs = (c["direction"].astype(str).to_numpy() if "direction" in c.columns
            else np.array([direction(n) for n in c["name"].astype(str)], object))
    mine = np.array([stages.get(int(r), -1) for r in rank], np.int64)
    theirs = np.array([stages.get(int(p), -1) if p >= 0 else -1 for p in peer], np.int64)
    source = np.where(theirs >= 0, "peer", "unknown").astype(object)
    if n_stages == 2:
        by_mesh = (theirs < 0) & (mine >= 0)
        theirs = np.where(by_mesh, 1 - mine, theirs)
        source[by_mesh] = "mesh"
    is_recv = dirs == "recv"
    is_send = dirs == "send"
    df = pd.DataFrame({
        "src_stage": np.where(is_recv, theirs, mine), "dst_stage": np.where(is_recv, mine, theirs),
        "peer_source": source, "calls": 1, "sends": is_send.astype(int), "recvs": is_recv.astype(int),
        "send_bytes": np.where(is_send & (c["bytes"].to_numpy() >= 0), c["bytes"].to_numpy(), 0),
        "recv_bytes": np.where(is_recv & (c["bytes"].to_numpy() >= 0), c["bytes"].to_numpy(), 0),
        "send_known": is_send & (c["bytes"].to_numpy() >= 0),
        "recv_known": is_recv & (c["bytes"].to_numpy() >= 0),
        "time_ns": c["dur_ns"].to_numpy(np.int64),
        "send_ns": np.where(is_send, c["dur_ns"].to_numpy(np.int64), 0),
        "recv_ns": np.where(is_recv, c["dur_ns"].to_numpy(np.int64), 0)})
    g = df.groupby(["src_stage", "dst_stage", "peer_source"], sort=True)
    out = g[["calls", "sends", "recvs", "send_bytes", "recv_bytes", "time_ns", "send_ns",
             "recv_ns"]].sum().astype("float64") / max(steps, 1)
    known = g[["send_known", "recv_known"]].any()
    out["send_bytes"] = out["send_bytes"].where(known["send_known"])
    out["recv_bytes"] = out["recv_bytes"].where(known["recv_known"])
    return out.reset_index()[PAIR_COLUMNS]
