"""Pipeline figures of a pp run (analyzer/analyses/pipeline.py): stages from the mesh, the ideal
bubble, each stage's bubble from the breakdown and the send / recv traffic per stage pair, on
hand-built frames whose answers are worked out in the docstrings."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analyzer.analyses import pipeline
from analyzer.contract.schemas import Mesh


def _mesh(dp: int, pp: int) -> Mesh:
    return Mesh(shape=[dp, pp], dim_names=["dp", "pp"], pp_schedule="gpipe", microbatches=4)


def test_a_ranks_stage_is_its_pp_coordinate():
    """[dp 2, pp 2], row-major: rank r at (r // 2, r % 2), so stage = r % 2."""
    assert pipeline.stage_of(_mesh(2, 2)) == {0: 0, 1: 1, 2: 0, 3: 1}
    assert pipeline.stage_ranks(_mesh(2, 2)) == [[0, 2], [1, 3]]
    assert pipeline.stage_of(_mesh(1, 4)) == {0: 0, 1: 1, 2: 2, 3: 3}
    assert pipeline.stage_ranks(_mesh(2, 3)) == [[0, 3], [1, 4], [2, 5]]
    with pytest.raises(ValueError, match="no 'pp'"):
        pipeline.stage_of(Mesh(shape=[2, 2], dim_names=["dp", "tp"]))


@pytest.mark.parametrize("schedule,p,m,v,ideal", [
    ("gpipe", 4, 8, 1, 3 / 11), ("1f1b", 2, 4, 1, 1 / 5),
    ("interleaved-1f1b", 4, 4, 2, 3 / 11),   # (P-1)/(VM+P-1), Narayanan et al. 2021
    ("interleaved-1f1b", 4, 8, 4, 3 / 35),
    ("looped-bfs", 4, 4, 2, 3 / 11),
    ("interleaved-zb", 4, 4, 2, 3 / 27),     # (P-1)/(3VM+P-1): ZB-H1 over V chunks
    ("interleaved-zb", 2, 4, 1, 1 / 13),
    ("zbv", 4, 8, 2, 0.0),                   # ZB-V: zero with equal F, B, W times
    ("dualpipev", 4, 8, 2, None),            # no closed form
])
def test_ideal_bubble_per_schedule(schedule, p, m, v, ideal):
    got = pipeline.ideal_bubble_frac(p, m, schedule, v)
    assert got == (None if ideal is None else pytest.approx(ideal))
    assert pipeline.ideal_source(schedule) == pipeline.IDEAL_BUBBLES[schedule][1]


def test_interleaving_shrinks_the_ideal_bubble_by_v_in_the_bubble_to_work_ratio():
    for v in (1, 2, 4):
        f = pipeline.ideal_bubble_frac(4, 8, "interleaved-1f1b", v)
        assert f / (1 - f) == pytest.approx((4 - 1) / (v * 8))  # (1/v)(p-1)/m of the ideal time
    assert pipeline.ideal_bubble_frac(4, 8, "interleaved-1f1b", 1) == pipeline.ideal_bubble_frac(4, 8, "1f1b")
    assert pipeline.ideal_source(None) == pipeline.IDEAL_BUBBLE_SOURCE


def test_ideal_bubble_is_p_minus_1_over_m_plus_p_minus_1():
    assert pipeline.ideal_bubble_frac(2, 4) == pytest.approx(1 / 5)
    assert pipeline.ideal_bubble_frac(4, 8) == pytest.approx(3 / 11)
    assert pipeline.ideal_bubble_frac(1, 8) == 0.0
    assert pipeline.ideal_bubble_frac(2, None) is None


def _bd(rows):
    cols = ["rank", "step", "step_ns", "compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns",
            "idle_ns"]
    df = pd.DataFrame(rows, columns=cols)
    # the breakdown identity holds on every hand-built row
    assert (df[cols[3:]].sum(axis=1) == df["step_ns"]).all()
    return df


def test_stage_bubble_is_exposed_comm_plus_idle_of_its_ranks():
    """Stage 0 (ranks 0, 2): bubbles 20+10, 10+10, 30+20, 20+20 = 30, 20, 50, 40 over four
    100-ns rank-steps: mean 35, share 140 / 400; data wait and other (rank 0) are not bubble.
    Stage 1 (ranks 1, 3): 10 + 40 = 50 of 200 each: mean 50, share 0.25. Rank 9 is outside
    the mesh: ignored."""
    bd = _bd([
        (0, 1, 100, 60, 20, 5, 5, 10), (0, 2, 100, 70, 10, 0, 10, 10),
        (2, 1, 100, 50, 30, 0, 0, 20), (2, 2, 100, 60, 20, 0, 0, 20),
        (1, 1, 200, 150, 10, 0, 0, 40), (3, 1, 200, 150, 10, 0, 0, 40),
        (9, 1, 100, 0, 0, 0, 0, 100)])
    out = pipeline.stage_bubbles(bd, pipeline.stage_of(_mesh(2, 2))).set_index("stage")
    assert out.loc[0, "ranks"] == [0, 2] and out.loc[1, "ranks"] == [1, 3]
    assert out["rank_steps"].tolist() == [4, 2]
    assert out.loc[0, "bubble_ns"] == 35 and out.loc[0, "bubble_frac"] == pytest.approx(0.35)
    assert out.loc[0, "compute_ns"] == 60 and out.loc[0, "step_ns"] == 100
    assert out.loc[1, "bubble_ns"] == 50 and out.loc[1, "bubble_frac"] == pytest.approx(0.25)


def _coll(rows):
    return pd.DataFrame(rows, columns=["rank", "kind", "peer", "bytes", "dur_ns", "step", "name"])


def test_send_recv_pairs_per_stage_pair_per_step():
    """Two steps, mesh [dp 2, pp 2]. Pipeline 0 (ranks 0 -> 1) names its peers: rank 0 sends 4
    (64 B, 5 ns) and receives 4 (7 ns); rank 1 receives 4 (9 ns) and sends 4 (3 ns). Pipeline
    1 (ranks 2 -> 3) names none: rank 2 sends 2 (64 B, 5 ns), rank 3 receives 2 (bytes
    unknown, 9 ns) -- two stages, so the mesh pairs them. Per step (/ 2):
    0 -> 1 peer: 4 calls, 2 sends, 2 recvs, 128 B each way, send 10 ns, recv 18 ns;
    1 -> 0 peer: 4 calls, 2 + 2, 128 B, send 6 ns, recv 14 ns;
    0 -> 1 mesh: 2 calls, 1 + 1, 64 B sent, received unknown, send 5 ns, recv 9 ns.
    An all_gather and a send of no step (-1) are left out."""
    rows = []
    for step in (1, 2):
        for _ in range(2):
            rows += [(0, "send_recv", 1, 64, 5, step, "gloo:send"),
                     (0, "send_recv", 1, 64, 7, step, "gloo:recv"),
                     (1, "send_recv", 0, 64, 9, step, "gloo:recv"),
                     (1, "send_recv", 0, 64, 3, step, "gloo:send")]
        rows += [(2, "send_recv", -1, 64, 5, step, "c10d::send"),
                 (3, "send_recv", -1, -1, 9, step, "gloo:recv")]
    rows += [(0, "all_gather", -1, 64, 50, 1, "gloo:all_gather"),
             (0, "send_recv", 1, 64, 50, -1, "gloo:send")]
    out = pipeline.p2p_pairs(_coll(rows), pipeline.stage_of(_mesh(2, 2)), 2, steps=2)
    got = {(r.src_stage, r.dst_stage, r.peer_source): r for r in out.itertuples()}
    assert set(got) == {(0, 1, "peer"), (1, 0, "peer"), (0, 1, "mesh")}
    a = got[(0, 1, "peer")]
    assert (a.calls, a.sends, a.recvs, a.send_bytes, a.recv_bytes, a.time_ns, a.send_ns,
            a.recv_ns) == (4, 2, 2, 128, 128, 28, 10, 18)
    b = got[(1, 0, "peer")]
    assert (b.calls, b.sends, b.recvs, b.send_bytes, b.send_ns, b.recv_ns) == (4, 2, 2, 128, 6, 14)
    c = got[(0, 1, "mesh")]
    assert (c.calls, c.sends, c.recvs, c.send_bytes, c.send_ns, c.recv_ns) == (2, 1, 1, 64, 5, 9)
    assert math.isnan(c.recv_bytes)


def test_unknown_peer_with_more_than_two_stages_stays_unknown():
    """Four stages: a send with no peer cannot be placed (dst -1); a recv of unknown
    direction (an NCCL SendRecv kernel) with a peer goes rank's stage -> peer's, counted in
    calls only."""
    mesh = _mesh(1, 4)
    rows = [(1, "send_recv", -1, 32, 4, 0, "gloo:send"),
            (2, "send_recv", 3, 32, 6, 0, "ncclDevKernel_SendRecv")]
    out = pipeline.p2p_pairs(_coll(rows), pipeline.stage_of(mesh), 4, steps=1)
    got = {(r.src_stage, r.dst_stage, r.peer_source): r for r in out.itertuples()}
    assert set(got) == {(1, -1, "unknown"), (2, 3, "peer")}
    assert (got[(2, 3, "peer")].calls, got[(2, 3, "peer")].sends, got[(2, 3, "peer")].recvs) == (1, 0, 0)
    assert got[(1, -1, "unknown")].sends == 1


def test_direction_from_the_name():
    assert [pipeline.direction(n) for n in ("gloo:send", "gloo:recv", "c10d::recv_", "c10d::send",
                                            "nccl:send", "ncclDevKernel_SendRecv",
                                            "batch_isend_irecv")] == [
        "send", "recv", "recv", "send", "send", "", ""]


def test_no_send_recv_gives_no_pairs():
    out = pipeline.p2p_pairs(_coll([(0, "all_reduce", -1, 8, 1, 0, "gloo:all_reduce")]),
                             {0: 0}, 2, steps=1)
    assert out.empty and list(out.columns) == pipeline.PAIR_COLUMNS
