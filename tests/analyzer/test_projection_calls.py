"""A projection's roles as the replay reads them (analyzer/compare/projection.py
``_steps_of_role``): compute and calls from hand-built tables, with exact answers."""

from __future__ import annotations

import pandas as pd
import pytest

from analyzer.compare.projection import _steps_of_role
from analyzer.contract.errors import BadInput

BD = pd.DataFrame({"rank": [0], "step": [3], "step_start_ns": [1000], "step_ns": [500]})


def _coll(rows):
    cols = ["rank", "step", "kind", "pg", "pg_ranks", "start_ns", "dur_ns", "bytes", "mesh_dim",
            "peer", "name"]
    return pd.DataFrame([dict(zip(cols, r)) for r in rows], columns=cols)


COLL = _coll([  # all_gather at 1100 (10 ns), reduce_scatter at 1300 (20), tp all_reduce at 1400 (5)
    (0, 3, "all_gather", "0", "[0, 1]", 1100, 10, 64, "shard", -1, "c10d::_allgather_base_"),
    (0, 3, "reduce_scatter", "0", "[0, 1]", 1300, 20, 64, "shard", -1,
     "c10d::_reduce_scatter_base_"),
    (0, 3, "all_reduce", "1", "[0, 2]", 1400, 5, 8, "tp", -1, "c10d::allreduce_"),
    (0, 3, "send_recv", "2", "[0, 4]", 1450, 5, 16, "pp", 4, "c10d::send"),
    (0, 3, "send_recv", "2", "[0, 4]", 1460, 5, 16, "pp", 4, "c10d::recv_")])
PREFETCH = pd.DataFrame({"rank": [0], "step": [3], "issued_ns": [1090], "need_ns": [1200]})


def test_on_cpu_every_call_is_needed_where_it_is_issued_and_its_own_time_leaves_the_compute():
    role = _steps_of_role(0, BD, COLL, PREFETCH, world=8, nccl=False)[3]
    # compute: 500 - (10 + 20 + 5 + 5 + 5) = 455; issue times on the compute clock: 100,
    # 300 - 10, 400 - 30, 450 - 35, 460 - 40; a send is waited for at the end (455)
    assert role.compute_ns == 455
    assert [(c.issue_ns, c.need_ns) for c in role.calls] == [(100, 100), (290, 290), (370, 370),
                                                             (415, 455), (420, 420)]
    assert [c.group for c in role.calls] == [(0, 1), (0, 1), (0, 2), (0, 4), (0, 4)]  # the pair
    assert [c.direction for c in role.calls[3:]] == ["send", "recv"]
    assert role.calls[3].peer == 4 and role.calls[2].dim == "tp"


def test_on_cuda_fsdp_gathers_and_gradient_reductions_are_needed_later():
    role = _steps_of_role(0, BD, COLL, PREFETCH, world=8, nccl=True)[3]
    # the window is the device's: compute 500, nothing taken out; issues at their host time
    # from the window's start: 100, 300, 400, 450, 460. all_gather: its unit's row (issued at
    # 1090, before the call at 1100) needs it at 1200 -> 200; reduce_scatter on a data-parallel
    # dim: at the end of compute, 500; the tp all_reduce and the recv: where issued; the send
    # at the end
    assert role.compute_ns == 500
    assert [(c.issue_ns, c.need_ns) for c in role.calls] == [(100, 200), (300, 500), (400, 400),
                                                             (450, 500), (460, 460)]


def test_a_call_without_bytes_is_refused():
    coll = _coll([(0, 3, "all_gather", "0", "", 1100, 10, -1, "world", -1, "c10d::allgather_")])
    with pytest.raises(BadInput, match="has no bytes in the trace"):
        _steps_of_role(0, BD, coll, PREFETCH, world=2, nccl=False)


def test_fake_tensor_compute_is_the_estimate_the_calls_moved_in_proportion():
    from types import SimpleNamespace

    from analyzer.compare.projection import _estimated
    from analyzer.contract.schemas import OpEstimate

    roles = {0: _steps_of_role(0, BD, COLL, PREFETCH, world=8, nccl=False)}  # compute 455
    est = [OpEstimate(rank=0, op="aten::mm", calls_per_step=4, flops_per_step=1,
                      bytes_per_step=1, estimated_ns_per_step=600),
           OpEstimate(rank=0, op="aten::add", calls_per_step=1, flops_per_step=1,
                      bytes_per_step=1, estimated_ns_per_step=310)]
    proj = SimpleNamespace(compute_estimate=est)
    role = _estimated(SimpleNamespace(path="p"), roles, proj)[0][3]
    # 600 + 310 = 910 ns = 2 x 455: every issue and need doubled
    assert role.compute_ns == 910
    assert [(c.issue_ns, c.need_ns) for c in role.calls] == [(200, 200), (580, 580), (740, 740),
                                                             (830, 910), (840, 840)]
    est[1] = OpEstimate(rank=0, op="aten::add", calls_per_step=1, flops_per_step=1,
                        bytes_per_step=1, estimated_ns_per_step=None)
    with pytest.raises(BadInput, match="without a compute estimate"):
        _estimated(SimpleNamespace(path="p"), roles, proj)
