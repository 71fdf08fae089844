"""The projected step's replay (analyzer/analyses/projstep.py) on hand-built roles with exact
answers: compute stretches, calls, their link times and where each is needed."""

from __future__ import annotations

import pytest

from analyzer.analyses.projstep import Call, Role, replay
from analyzer.contract.errors import BadInput


def _link(times: dict[tuple[str, int], float]):
    return lambda c: (times[(c.kind, c.nbytes)], "")


def _flat(rank_of_role: int = 0):
    return lambda rank: rank_of_role  # every rank plays role 0


def test_blocking_calls_add_their_link_time_to_the_compute():
    # compute 100 ns; all_gather issued and needed at 10 (5 ns), reduce_scatter at 50 (20 ns):
    # 100 + 5 + 20 = 125, all of it exposed, 5 on dim shard, 20 on dim world
    role = Role(rank=0, compute_ns=100, calls=(
        Call("all_gather", "0", (0, 1), 64, 10, 10, dim="shard"),
        Call("reduce_scatter", "1", (0, 1), 32, 50, 50)))
    r = replay([role], _flat(), _link({("all_gather", 64): 5, ("reduce_scatter", 32): 20}))
    assert r.step_ns == 125 and r.comm_ns == 25 and r.exposed_ns == 25
    assert r.exposed_by_dim_ns == {"shard": 5, "world": 20}


def test_a_call_needed_later_overlaps_the_compute_in_between():
    # issued at 10, needed at 60, 30 ns: done at 40 < 60: hidden; step = compute
    role = Role(rank=0, compute_ns=100, calls=(Call("all_gather", "0", (0, 1), 64, 10, 60),))
    r = replay([role], _flat(), _link({("all_gather", 64): 30}))
    assert r.step_ns == 100 and r.exposed_ns == 0 and r.exposed_by_dim_ns == {}
    # 70 ns: done at 80, needed at 60: 20 exposed
    r = replay([role], _flat(), _link({("all_gather", 64): 70}))
    assert r.step_ns == 120 and r.exposed_ns == 20


def test_calls_of_one_process_group_run_one_after_another():
    # two reduce_scatters issued at 10 and 12, needed at the step's end (100): 60 ns each on
    # one stream: [10, 70), [70, 130): the step ends at 130, 30 ns exposed after the compute
    role = Role(rank=0, compute_ns=100, calls=(
        Call("reduce_scatter", "0", (0, 1), 32, 10, 100),
        Call("reduce_scatter", "0", (0, 1), 32, 12, 100)))
    r = replay([role], _flat(), _link({("reduce_scatter", 32): 60}))
    assert r.step_ns == 130 and r.exposed_ns == 30 and r.comm_ns == 120
    # on two process groups they run at once: [10, 70), [12, 72): hidden up to 100
    role2 = Role(rank=0, compute_ns=100, calls=(
        Call("reduce_scatter", "0", (0, 1), 32, 10, 100),
        Call("reduce_scatter", "1", (0, 1), 32, 12, 100)))
    assert replay([role2], _flat(), _link({("reduce_scatter", 32): 60})).step_ns == 100


def test_a_collective_starts_when_its_last_member_issues_it():
    # tp group {0, 1}: role 0 issues at 10, role 1 at 50; 10 ns: [50, 60). Role 0 waits from
    # 10 to 60 then computes 90 more: 150; role 1: 60 + 50 = 110. The step: 150
    r0 = Role(rank=0, compute_ns=100, calls=(Call("all_reduce", "1", (0, 1), 8, 10, 10),))
    r1 = Role(rank=1, compute_ns=100, calls=(Call("all_reduce", "1", (0, 1), 8, 50, 50),))
    r = replay([r0, r1], lambda rank: rank, _link({("all_reduce", 8): 10}))
    assert r.role_step_ns == {0: 150, 1: 110} and r.step_ns == 150
    assert r.exposed_ns == 50 and r.comm_ns == 10


def test_a_send_waits_for_its_recv_and_the_pipeline_bubble_follows():
    # stage 0: 10 ns of compute, then sends to rank 1 (needed at once); stage 1: posts the
    # recv at 0, then 20 ns of compute. 5 ns on the link: [10, 15). Stage 0 ends at 15, stage
    # 1 waits 15 ns (its bubble) and ends at 35
    s0 = Role(rank=0, compute_ns=10, calls=(Call("send_recv", "2", (0, 1), 16, 10, 10, peer=1),))
    s1 = Role(rank=1, compute_ns=20, calls=(Call("send_recv", "2", (0, 1), 16, 0, 0, peer=0),))
    r = replay([s0, s1], lambda rank: rank % 2, _link({("send_recv", 16): 5}))
    assert r.role_step_ns == {0: 15, 1: 35} and r.step_ns == 35 and r.exposed_ns == 15


def test_ranks_sharing_cores_scale_the_compute():
    role = Role(rank=0, compute_ns=100, calls=(Call("all_reduce", "0", (0, 1), 8, 50, 50),))
    r = replay([role], _flat(), _link({("all_reduce", 8): 10}), compute_scale=2.0)
    assert r.step_ns == 210 and r.exposed_ns == 10


def test_roles_issuing_different_sequences_on_one_group_are_refused():
    r0 = Role(rank=0, compute_ns=10, calls=(Call("all_reduce", "1", (0, 1), 8, 1, 1),
                                            Call("all_reduce", "1", (0, 1), 8, 2, 2)))
    r1 = Role(rank=1, compute_ns=10, calls=(Call("all_reduce", "1", (0, 1), 8, 1, 1),))
    with pytest.raises(BadInput, match="roles"):
        replay([r0, r1], lambda rank: rank, _link({("all_reduce", 8): 1}))


def test_sends_pair_with_recvs_by_direction_in_an_interleaved_schedule():
    # 1F1B-like: stage 0 sends, sends, then receives; stage 1 receives, sends, receives. By
    # direction: 0's sends #0, #1 pair with 1's recvs #0, #1; 1's send #0 with 0's recv #0;
    # each 5 ns, one lane per direction.
    def call(issue, need, direction, peer):
        return Call("send_recv", "2", (0, 1), 16, issue, need, peer=peer, direction=direction)

    s0 = Role(rank=0, compute_ns=10, calls=(call(0, 10, "send", 1), call(2, 10, "send", 1),
                                            call(4, 4, "recv", 1)))
    s1 = Role(rank=1, compute_ns=10, calls=(call(0, 0, "recv", 0), call(1, 10, "send", 0),
                                            call(1, 1, "recv", 0)))
    r = replay([s0, s1], lambda rank: rank % 2, _link({("send_recv", 16): 5}))
    # 0 -> 1 #0: issued at 0 and 0: [0, 5). Stage 1 waits for it (need 0) to 5, computes 1,
    # issues its send (1 -> 0) and recv #1 at 6. 0 -> 1 #1 (stage 0 issued it at 2): [6, 11);
    # 1 -> 0 #0 (stage 0's recv issued at 4): its own lane, [6, 11). Stage 0 needs its recv
    # at 4: waits to 11, then 6 more: 17. Stage 1 needs recv #1 at 1 (its clock 6): waits to
    # 11, then 9 more: 20
    assert r.role_step_ns == {0: 17, 1: 20}


def test_the_arrival_wait_delays_each_collectives_start_by_the_segment_before_it():
    # compute 100 ns; calls issued at 10 and 50 (segments 10 and 40), 5 ns each on the link;
    # the wait is the segment / 10: 1 then 4 ns. [11, 16) then role resumes at 16: 40 more ->
    # issue at 56, wait 4: [60, 65), then 50 more: 115
    role = Role(rank=0, compute_ns=100, calls=(
        Call("all_gather", "0", (0, 1), 64, 10, 10),
        Call("all_gather", "0", (0, 1), 64, 50, 50)))
    seen = []

    def wait(call, segment_ns):
        seen.append((call.nbytes, segment_ns))
        return segment_ns / 10

    r = replay([role], _flat(), _link({("all_gather", 64): 5}), wait=wait)
    assert seen == [(64, 10), (64, 40)]
    assert r.step_ns == 115 and r.comm_ns == 10 and r.exposed_ns == 15
    assert replay([role], _flat(), _link({("all_gather", 64): 5})).step_ns == 110  # no wait


def test_the_arrival_wait_takes_the_longest_segment_of_the_groups_members():
    # tp group {0, 1}: role 0 issues after 10 ns of compute, role 1 after 50: the wait sees 50
    r0 = Role(rank=0, compute_ns=100, calls=(Call("all_reduce", "1", (0, 1), 8, 10, 10),))
    r1 = Role(rank=1, compute_ns=100, calls=(Call("all_reduce", "1", (0, 1), 8, 50, 50),))
    seen = []
    replay([r0, r1], lambda rank: rank, _link({("all_reduce", 8): 10}),
           wait=lambda c, seg: seen.append(seg) or 0.0)
    assert seen == [50]
