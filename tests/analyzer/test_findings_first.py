"""Findings that come first (issue 42): a hang is finding 1 and the decision line; a pipeline
bubble above its schedule's ideal is a finding; an exposed-communication headline pairs its
kind with that kind's own mesh dimension. Hand-built reports with exact answers."""

from __future__ import annotations

import pytest

from analyzer.contract.report_types import (CommGroup, CommKind, FlightRecorder,
                                            FlightRecorderGroup, FlightRecorderP2P,
                                            FlightRecorderRank, Pipeline, PipelineStage)
from reports import findings as findings_text
from reports.decision import decision_input, decision_line
from tests.analyzer.test_findings import MS, _dim, _straggler, kinds, report, run


def _fr() -> FlightRecorder:
    """Rank 1 never entered all_reduce #7 of the default group; rank 0 waited in it."""
    g = FlightRecorderGroup(
        pg="0", desc="default_pg", ranks=[0, 1], ranks_source="world", dumped_ranks=[0, 1],
        last_completed_seq=6, next_seq=7, next_kind="all_reduce", never_entered=[1],
        entered=[0], per_rank=[FlightRecorderRank(rank=0, last_enqueued_seq=7, last_completed_seq=6),
                               FlightRecorderRank(rank=1, last_enqueued_seq=6, last_completed_seq=6)],
        verdict="collective_hang",
        statement="rank 1 never entered all_reduce #7 of process group 0; rank 0 waited in it")
    return FlightRecorder(dumps=["rank0.flightrec.json", "rank1.flightrec.json"], ranks=[0, 1],
                          groups=[g], rule="by collective_seq_id")


def test_a_hang_is_the_first_finding_and_the_decision():
    hung = run(flight_recorder=_fr(), stragglers=[_straggler(0.9)])
    rep = report(hung)
    assert [f.kind for f in rep.findings][0] == "hang"  # before a straggler of 2.1 ms/step
    (f,) = kinds(rep, "hang")
    assert f.title == "ddp hung in process group 0 (default_pg)" and f.ranks == [1]
    assert f.cause == "rank 1 never entered all_reduce #7 of process group 0; rank 0 waited in it"
    assert [e.path for e in f.evidence] == ["/runs/0/flight_recorder/groups/0/last_completed_seq",
                                            "/runs/0/flight_recorder/groups/0/next_seq"]
    assert decision_line(decision_input(rep)) == (
        "No decision: ddp hung: rank 1 never entered all_reduce #7 of process group 0; rank 0 "
        "waited in it (see Hangs).")
    lines, _ = findings_text.first_screen(rep)
    assert lines[0].startswith("hang (10.00 ms/step at stake): ddp hung in process group 0 "
                               "(default_pg); evidence: ")
    assert "; cause: rank 1 never entered all_reduce #7 of process group 0; rank 0 waited in " \
           "it; try: look at what rank 1 did instead" in lines[0]


def test_a_hang_without_a_step_says_the_run_does_not_finish():
    rep = report(run(flight_recorder=_fr(), step=None))
    (f,) = kinds(rep, "hang")
    assert f.severity_ns is None and findings_text.stake(f) == "the run does not finish"


def test_a_group_every_rank_completed_is_no_hang():
    fine = FlightRecorderGroup(pg="0", ranks=[0, 1], last_completed_seq=7,
                               summary="process group 0: every rank completed all_reduce #7")
    assert not kinds(report(run(flight_recorder=FlightRecorder(groups=[fine]))), "hang")


def test_a_send_never_received_is_a_hang_of_its_own():
    line = ("rank 3's send #12 to rank 4 (process group 0) was never matched: rank 4 never "
            "entered its recv")
    g = FlightRecorderGroup(pg="0", desc="default_pg", ranks=[0, 1, 2, 3, 4], verdict="p2p_pending",
                            p2p_pending=[FlightRecorderP2P(rank=3, op="send", peer=4, p2p_seq=12)],
                            statement=line)
    (f,) = kinds(report(run(flight_recorder=FlightRecorder(groups=[g]))), "hang")
    assert f.cause == line and f.ranks == [4]
    assert f.action.startswith("look at what rank 4 did instead of the matching send / recv")
    assert [e.path for e in f.evidence] == ["/runs/0/flight_recorder/groups/0/p2p_pending/0/p2p_seq"]


def _pipeline(bubbles: list[float], microbatches: int = 4) -> Pipeline:
    return Pipeline(stages=2, microbatches=microbatches, schedule="1f1b", dp=1,
                    ideal_bubble_frac=1 / (microbatches + 1), ideal_source="manifest",
                    bubble_rule="exposed + idle",
                    per_stage=[PipelineStage(stage=s, ranks=[s], rank_steps=2, step_ns=10 * MS,
                                             compute_ns=10 * MS * (1 - b), bubble_ns=10 * MS * b,
                                             bubble_frac=b) for s, b in enumerate(bubbles)])


def test_a_bubble_above_the_schedules_ideal_is_a_finding():
    rep = report(run(name="pp", strategy="pp", pipeline=_pipeline([0.5, 0.48])))
    (f,) = kinds(rep, "pipeline_bubble")
    assert f.title == "pp: the pipeline bubble is above its schedule's ideal, stage 0 most"
    assert f.severity_ns == pytest.approx((0.49 - 0.2) * 10 * MS)  # (mean - ideal) x step
    assert f.mesh_dims == ["pp"]
    assert f.action.startswith("more microbatches per step (M = 8 gives an ideal of 11 %)")
    assert findings_text.to_act_on(f)


def test_a_bubble_on_shared_cpus_says_measure_on_a_quiet_machine_first():
    over = {"load_avg": [5.3, 4.0, 3.0], "cpu_count": 2, "usable_cpus": 2, "threads_per_rank": 1,
            "ranks_on_host": 4, "oversubscribed": True}
    rep = report(run(name="pp", strategy="pp", pipeline=_pipeline([0.5, 0.48]), machine=over))
    (f,) = kinds(rep, "pipeline_bubble")
    assert f.action.startswith("the ranks share the CPUs (4 ranks x 1 threads on 2 CPUs), which "
                               "leaves stages waiting as well: measure on a quiet machine first; "
                               "then more microbatches per step")


def test_a_bubble_at_the_schedules_ideal_is_no_finding():
    assert not kinds(report(run(name="pp", strategy="pp", pipeline=_pipeline([0.22, 0.23]))),
                     "pipeline_bubble")


def test_the_headline_pairs_a_kind_with_its_own_mesh_dimension():
    """HSDP: all_reduce runs on replicate only; shard exposes more (all_gather) but all_reduce
    has the most time: the headline says all_reduce on replicate, never on shard."""
    comm = {k: CommKind(count=2, time_ns=t, bytes=None, busbw_gbps=None, count_per_step=1,
                        time_ns_per_step=t / 2, bytes_per_step=None)
            for k, t in (("all_reduce", 8 * MS), ("all_gather", 6 * MS))}
    groups = [CommGroup(kind=k, pg=pg, pg_ranks="", group_size=2, dtype="float32", count=2,
                        time_ns=t, bytes=None, unknown_bytes=0, busbw_gbps=None, mesh_dim=d)
              for k, pg, t, d in (("all_reduce", "1", 8 * MS, "replicate"),
                                  ("all_gather", "2", 6 * MS, "shard"))]
    rep = report(run(name="hsdp", strategy="hsdp", exposed_comm_ns=5 * MS, communication=comm,
                     comm_groups=groups,
                     mesh_dims=[_dim("replicate", 2 * MS), _dim("shard", 6 * MS)]))
    (f,) = kinds(rep, "exposed_communication")
    assert f.title.startswith("hsdp: communication is exposed, mostly all_reduce (mesh dimension "
                              "replicate)")
    assert f.mesh_dims == ["replicate"]
