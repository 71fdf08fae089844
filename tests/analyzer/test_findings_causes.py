"""Causes that hold (issue 42), on hand-built reports (analyzer/analyses/findings.py): a straggler
that entered its step late is named so; imbalance is measured on work (compute + own transfer),
so the rank that waits is never the slowest; ranks sharing a busy machine's CPUs are "CPU
contention", not a device to rebalance; advice names only what the run's backend has. Exact
titles, causes, actions and first-screen lines (reports/findings.py ``line``)."""

from __future__ import annotations

import re

import msgspec
import pytest

from analyzer.contract.report_types import CAUSE_THRESHOLD, StragglerCause
from reports.findings import line
from tests.analyzer.test_findings import MS, comm, kinds, rank, report, run


def _work(r: int, *, step: float, compute: float, transfer: float):
    """A rank with its work figures filled as analyzer/compare/runs.py fills them."""
    return msgspec.structs.replace(rank(r, step=step, compute=compute), transfer_ns=transfer,
                                   work_ns=compute + transfer)


# --- straggler: a late step start --------------------------------------------------------------

def _late_start(frac: float = 7.5 / 9.0) -> StragglerCause:
    """DLRM's shape: rank 7 last at 4 all_to_all, 9 ms late over 2 profiled steps, of which
    ``frac`` is its step starting after the first rank's."""
    late = 9 * MS
    start = frac * late
    return StragglerCause(rank=7, kind="all_to_all", times_last=4, late_ns=late,
                          split_ns={"device_compute": 0.0, "host_delay": 1 * MS, "data_wait": 0.0,
                                    "own_collective": 0.0, "late_step_start": start,
                                    "unexplained": late - 1 * MS - start},
                          cause="late_step_start" if frac >= CAUSE_THRESHOLD else None,
                          explained_frac=frac, rule="largest part of the split")


def test_straggler_that_entered_its_step_late_is_named_so():
    (f,) = kinds(report(run(device="gpu", backend="nccl", stragglers=[_late_start()])),
                 "straggler")
    assert f.title == "ddp: the all_to_all waits for rank 7 (late step start)"
    assert f.cause == ("rank 7 entered the step after the first rank: the delay lies before "
                       "the step's window")
    assert f.evidence[0].path == "/runs/0/stragglers/0/split_ns/late_step_start"
    assert [e.path for e in f.evidence].count("/runs/0/stragglers/0/split_ns/late_step_start") == 1
    assert line(f) == (
        "straggler (4.50 ms/step at stake): ddp: the all_to_all waits for rank 7 (late step "
        "start); evidence: rank 7's step start after the first rank's (all profiled steps) "
        "7.50 ms, lateness of rank 7 over all_to_all (all profiled steps) 9.00 ms, all_to_all "
        "calls rank 7 started last 4 (+6 more in full); cause: rank 7 entered the step after "
        "the first rank: the delay lies before the step's window (explains 83.3 %); try: look "
        "at what that rank did before this step, which the trace does not show: the previous "
        "step's end (optimizer, a host sync), data loading, checkpointing or logging on that "
        "rank; a trace that starts a step earlier shows it")


def test_late_step_start_below_the_threshold_is_not_a_cause():
    (f,) = kinds(report(run(stragglers=[_late_start(0.7)])), "straggler")
    assert f.cause is None and f.action is None
    assert f.title == "ddp: the all_to_all waits for rank 7 (cause not established)"
    assert f.evidence[0].path == "/runs/0/stragglers/0/late_ns"


# --- imbalance on work ----------------------------------------------------------------------------

def test_the_rank_that_waits_is_not_the_slowest():
    """DLRM's shape: rank 1's traced step is 19.9 ms (it waits), rank 7's 12.5 ms (it came
    late); their work (compute + own transfer) is within 2 %: no imbalance."""
    r = run(device="gpu", ranks=[_work(1, step=19.9 * MS, compute=1.04 * MS, transfer=0.21 * MS),
                                 _work(7, step=12.5 * MS, compute=1.06 * MS, transfer=0.21 * MS)])
    assert not kinds(report(r), "imbalance")


def test_imbalance_caused_by_compute_on_work():
    """Rank 0 works 5.8 + 1 ms, rank 1 4 + 1 ms, though rank 1's traced step (it waits for rank
    0) is the longer: rank 0 is the slowest, by its compute (spread 1.8 of 1.8 ms)."""
    r = run(ranks=[_work(0, step=8 * MS, compute=5.8 * MS, transfer=1 * MS),
                   _work(1, step=10 * MS, compute=4 * MS, transfer=1 * MS)])
    (f,) = kinds(report(r), "imbalance")
    assert f.title == ("ddp: ranks' work per step (compute + own transfer) differs, rank 0 "
                       "slowest: rank 0 computes longer than its peers")
    assert f.ranks == [0, 1] and f.explained_frac == pytest.approx(1.0)
    assert f.severity_ns == pytest.approx(0.9 * MS)  # 6.8 - mean(6.8, 5.0)
    assert [e.path for e in f.evidence[:3]] == ["/runs/0/ranks/0/work_ns",
                                                "/runs/0/ranks/1/work_ns",
                                                "/runs/0/ranks/0/transfer_ns"]
    assert line(f) == (
        "imbalance across ranks (0.90 ms/step at stake): ddp: ranks' work per step (compute + "
        "own transfer) differs, rank 0 slowest: rank 0 computes longer than its peers; "
        "evidence: rank 0's work per step (compute + own transfer; most) 6.80 ms, rank 1's work "
        "per step (compute + own transfer; least) 5.00 ms, rank 0's own transfer per step "
        "1.00 ms (+3 more in full); cause: rank 0 computes longer than its peers (explains "
        "100.0 %); try: balance the work across ranks (batch split, sequence lengths, sharding)")


def test_imbalance_in_transfer_cause_not_established():
    r = run(ranks=[_work(0, step=10 * MS, compute=4 * MS, transfer=2 * MS),
                   _work(1, step=10 * MS, compute=4 * MS, transfer=1 * MS)])
    (f,) = kinds(report(r), "imbalance")
    assert f.cause is None and f.title.endswith("rank 0 slowest: cause not established")


@pytest.mark.parametrize("work", [(5 * MS, 4.6 * MS), None])
def test_no_imbalance_without_a_work_spread(work):
    """Work within 10 %; or no work figure (a report.json written before it): the traced
    step's spread alone never makes an imbalance."""
    ranks = ([_work(0, step=10 * MS, compute=work[0], transfer=0.0),
              _work(1, step=5 * MS, compute=work[1], transfer=0.0)] if work else
             [rank(0, step=10 * MS), rank(1, step=5 * MS, compute=2 * MS)])
    assert not kinds(report(run(ranks=ranks)), "imbalance")


# --- CPU contention -----------------------------------------------------------------------------

BUSY = {"load_avg": [18.0, 9.0, 4.0], "cpu_count": 2, "usable_cpus": 2, "threads_per_rank": 2,
        "ranks_on_host": 4, "oversubscribed": True}
"""The manifest's machine of a 4-ranks-on-2-cores record (issue 42)."""
CONTENTION_ACTION = ("the ranks share the CPUs: run fewer ranks per host or fewer threads per rank "
                     "(torch.set_num_threads, OMP_NUM_THREADS), or measure on a quiet machine; "
                     "the work across ranks need not be rebalanced")


def _cause(part: str) -> StragglerCause:
    late = 6 * MS
    return StragglerCause(rank=3, kind="all_reduce", times_last=5, late_ns=late,
                          split_ns={part: 0.9 * late, "unexplained": 0.1 * late}, cause=part,
                          explained_frac=0.9, rule="largest part of the split")


@pytest.mark.parametrize("part", ["device_compute", "host_delay"])
def test_straggler_on_an_oversubscribed_cpu_run_is_cpu_contention(part):
    r = run(device="cpu", backend="gloo", machine=BUSY, stragglers=[_cause(part)])
    (f,) = kinds(report(r), "straggler")
    assert f.cause == "CPU contention (4 ranks x 2 threads on 2 CPUs)"
    assert f.title == ("ddp: the all_reduce waits for rank 3 (CPU contention: 4 ranks x 2 "
                       "threads on 2 CPUs)")
    assert line(f) == (
        "straggler (3.00 ms/step at stake): ddp: the all_reduce waits for rank 3 (CPU "
        "contention: 4 ranks x 2 threads on 2 CPUs); evidence: lateness of rank 3 over "
        "all_reduce (all profiled steps) 6.00 ms, all_reduce calls rank 3 started last 5, "
        f"lateness split: {part} 5.40 ms (+6 more in full); cause: CPU contention (4 ranks x 2 "
        f"threads on 2 CPUs) (explains 90.0 %); try: {CONTENTION_ACTION}")
    assert f.action == CONTENTION_ACTION and "balance" not in f.action.replace("rebalanced", "")
    assert f.explained_frac == 0.9 and "oversubscribed" in f.cause_rule
    assert {"/runs/0/machine/ranks_on_host", "/runs/0/machine/threads_per_rank",
            "/runs/0/machine/usable_cpus", "/runs/0/machine/load_avg/0"} <= {
        e.path for e in f.evidence}


def test_straggler_on_a_busy_machine_names_its_load():
    busy = {**BUSY, "ranks_on_host": 1, "threads_per_rank": 1, "oversubscribed": False}
    (f,) = kinds(report(run(machine=busy, stragglers=[_cause("host_delay")])), "straggler")
    assert f.cause == "CPU contention (1-minute load 18 on 2 CPUs)"


def test_gpu_compute_is_not_cpu_contention():
    """On a GPU run the kernels do not run on the shared CPUs: device_compute stays the cause,
    host_delay is the contention."""
    gpu = run(device="gpu", backend="nccl", machine=BUSY,
              stragglers=[_cause("device_compute"), msgspec.structs.replace(
                  _cause("host_delay"), rank=2)])
    by = {f.ranks[0]: f for f in kinds(report(gpu), "straggler")}
    assert by[3].cause == "device_compute" and by[3].action.endswith("embedding tables)")
    assert by[2].cause == "CPU contention (4 ranks x 2 threads on 2 CPUs)"


def test_quiet_cpu_run_gets_cpu_advice():
    """No busy machine: the CPU run's causes stay, with advice that exists on a CPU (no
    launch, no .item() sync)."""
    (f,) = kinds(report(run(device="cpu", backend="gloo", stragglers=[_cause("host_delay")])),
                 "straggler")
    assert f.cause == "host_delay"
    assert f.action == ("nothing is recorded on that rank while its peers go on: look at its "
                        "untraced time between ops (Python, a sleep, a lock) and at other "
                        "processes on its CPUs")


def test_imbalance_on_an_oversubscribed_cpu_run_is_cpu_contention():
    r = run(device="cpu", backend="gloo", machine=BUSY,
            ranks=[_work(0, step=10 * MS, compute=5.8 * MS, transfer=1 * MS),
                   _work(1, step=10 * MS, compute=4 * MS, transfer=1 * MS)])
    (f,) = kinds(report(r), "imbalance")
    assert f.title == ("ddp: ranks' work per step (compute + own transfer) differs, rank 0 "
                       "slowest: CPU contention (4 ranks x 2 threads on 2 CPUs)")
    assert f.action == CONTENTION_ACTION


# --- advice per backend ---------------------------------------------------------------------------

def _low(backend):
    per_call = 4 << 20
    return run(backend=backend, communication={
        "all_reduce": comm(time=2 * MS, wait=0.0, transfer=2 * MS, bytes_=8 * per_call, count=8,
                           busbw=90.0, tbusbw=100.0),
        "all_gather": comm(time=1 * MS, wait=0.0, transfer=1 * MS, bytes_=2 * per_call, count=2,
                           busbw=9.0, tbusbw=10.0)})


@pytest.mark.parametrize("backend,action", [
    ("nccl", "check the link it crosses (NCCL_DEBUG=INFO names the transport: NVLink, PCIe, "
             "network) and its message sizes"),
    ("gloo", "check its message sizes and the network interface gloo sends over "
             "(GLOO_SOCKET_IFNAME sets it; on one host, loopback TCP through the CPUs)"),
    (None, "check its message sizes and the link it crosses")])
def test_low_busbw_advice_names_only_the_runs_backend(backend, action):
    (f,) = kinds(report(_low(backend)), "low_busbw")
    assert f.action == action


# --- the DLRM corpus job (8 ranks, V100, NCCL) ----------------------------------------------------

@pytest.mark.integration
def test_dlrm_names_rank_7_with_its_late_step_start():
    """Rank 7 enters its ProfilerStep 7.51 ms after rank 1 (aligned clocks) and starts the
    first all_to_all last: rank 7 is the straggler, by its late step start; rank 1, whose traced
    step is the longest because it waits, is called the slowest by no finding."""
    from analyzer.compare.runs import analyse
    from tests.analyzer.helpers import corpus

    rep = analyse(corpus("dlrm_ddp_8rank_v100"))
    first = rep.findings[0]
    assert line(first) == (
        "straggler (9.02 ms/step at stake): dlrm_ddp_8rank_v100: the all_to_all waits for rank "
        "7 (late step start); evidence: rank 7's step start after the first rank's (all "
        "profiled steps) 7.51 ms, lateness of rank 7 over all_to_all (all profiled steps) "
        "9.02 ms, all_to_all calls rank 7 started last 4 (+6 more in full); cause: rank 7 "
        "entered the step after the first rank: the delay lies before the step's window "
        "(explains 83.3 %); try: look at what that rank did before this step, which the trace "
        "does not show: the previous step's end (optimizer, a host sync), data loading, "
        "checkpointing or logging on that rank; a trace that starts a step earlier shows it")
    assert rep.runs[0].stragglers[0].split_ns["late_step_start"] == 7_513_500
    assert not [f for f in rep.findings if "rank 1 slowest" in f.title]
    assert not [f for f in rep.findings if f.kind == "imbalance"]  # work within 8 %
    work = {x.rank: x.work_ns for x in rep.runs[0].ranks}
    assert (work[1], work[7], max(work.values())) == (1_250_000, 1_271_000, 1_343_000)


# --- a committed record on a busy 2-CPU machine (fixtures/recorded/tiny) -------------------------

def test_recorded_gloo_run_on_a_busy_machine_says_cpu_contention(tmp_path):
    """tiny's ddp was recorded with 2 ranks on 2 CPUs at a 1-minute load above the CPUs
    (manifest machine; 3.13 at the last regeneration): rank 1's all_reduce lateness is host
    delay, that is the shared CPUs; nothing asks to rebalance the work or to look at NCCL."""
    import json
    import shutil

    from analyzer.compare.runs import analyse
    from tests.records import committed

    src = tmp_path / "ddp"
    shutil.copytree(committed("tiny") / "ddp", src)
    load = json.loads((src / "manifest.json").read_text())["machine"]["load_avg"][0]
    assert load > 2, "regenerate fixtures/recorded on a busy machine: this test needs its contention"
    rep = analyse(src)
    (f,) = [f for f in rep.findings if f.kind == "straggler" and f.cause is not None]
    assert (f.ranks, f.cause, f.action) == (
        [1], f"CPU contention (1-minute load {load:.2f} on 2 CPUs)", CONTENTION_ACTION)
    # which of DDP's collectives (the initial broadcast, an all_reduce) waits is the recording's
    assert re.fullmatch(rf"ddp: the (broadcast|all_reduce) waits for rank 1 \(CPU contention: "
                        rf"1-minute load {load:.2f} on 2 CPUs\)", f.title), f.title
    actions = " ".join(x.action or "" for x in rep.findings)
    assert "balance the work" not in actions and "NCCL" not in actions
