"""Findings (analyzer/analyses/findings.py): each rule on a hand-built Report where it must fire
and one where it must not, exact severities, causes only at or above CAUSE_THRESHOLD, and
every evidence pointer resolving in report.json to the finding's value."""

from __future__ import annotations

import json

import pytest

from analyzer.analyses import findings as fnd
from analyzer.contract.report_types import (CAUSE_THRESHOLD, CommGroup, CommKind, DataSupply,
                                            FirstDivergence, Memory,
                                            MemoryFit, MeshDimComm, Parity, Prefetch,
                                            PrefetchUnit, RankFigures, Ranking, Report, RunEntry,
                                            StepTime, StragglerCause, TraceInfo, decode, encode)
from analyzer.contract.tolerance import Tolerance

MS = 1_000_000


def resolve(doc, pointer: str):
    """The value at JSON pointer ``pointer`` (RFC 6901) in ``doc``."""
    assert pointer.startswith("/"), pointer
    for key in pointer[1:].split("/"):
        key = key.replace("~1", "/").replace("~0", "~")
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


def assert_evidence_joins(report: Report) -> dict:
    """Every evidence path of report.json's findings resolves to the finding's own value (both
    read from the encoded text); the findings are those ``findings()`` draws from the report
    decoded again (a cached report.json gives the same). Returns the parsed report.json."""
    text = encode(report)
    doc = json.loads(text)
    for f in doc["findings"]:
        assert f["kind"] in fnd.FINDING_KINDS
        for e in f["evidence"]:
            assert resolve(doc, e["path"]) == e["value"], (f["kind"], e)
    again = fnd.findings(decode(text))
    assert json.loads(encode(Report(**{**_fields(decode(text)), "findings": again})))["findings"] \
        == doc["findings"]
    return doc


def _fields(report: Report) -> dict:
    return {k: getattr(report, k) for k in report.__struct_fields__}


def rank(r, *, step=10 * MS, compute=4 * MS, exposed=0.0, idle=0.0, data=0.0, comm=0.0):
    return RankFigures(rank=r, steps=2, step_ns=step, compute_ns=compute, comm_ns=comm,
                       exposed_comm_ns=exposed, data_wait_ns=data, other_ns=0.0, idle_ns=idle,
                       overlap_frac=None, data_wait_frac=data / step, input_bound_steps=0)


def run(name="ddp", strategy="ddp", *, step=10 * MS, device="cpu", ranks=None, **kw) -> RunEntry:
    return RunEntry(name=name, strategy=strategy, parity=kw.pop("parity", Parity(
        status="pass", reason="hand-built")), step_time_ns=StepTime(median=step, n=2),
        profiled_steps=2, ranks=ranks if ranks is not None else [rank(0), rank(1)],
        trace_info=TraceInfo(whole_trace_mode=False, rank_sources=["hand-built"],
                             missing_ranks=[], device_kind=device, trace_warnings=[]), **kw)


def report(*runs: RunEntry) -> Report:
    rep = Report(root="/x", layout="root", runs=list(runs),
                 ranking=Ranking(status="withheld", order=[], reason="hand-built", rule=""))
    rep.findings = fnd.findings(rep)
    assert_evidence_joins(rep)
    return rep


def kinds(rep: Report, kind: str):
    return [f for f in rep.findings if f.kind == kind]


def comm(*, time, wait, transfer, bytes_=None, count=1.0, busbw=None, tbusbw=None):
    return CommKind(count=count, time_ns=time, bytes=bytes_, busbw_gbps=busbw,
                    count_per_step=count, time_ns_per_step=time, bytes_per_step=bytes_,
                    wait_ns=wait, transfer_ns=transfer, wait_ns_per_step=wait,
                    transfer_ns_per_step=transfer, transfer_busbw_gbps=tbusbw)


# --- parity_failed -------------------------------------------------------------------------

def _divergence():
    return FirstDivergence(tensor="layers.0.attn.weight", kind="grad", step=1, rel_l2=0.5,
                           max_abs_diff=1e-3, limit=1.13e-5, nonfinite=0,
                           tolerance=Tolerance(rtol=1.3e-6, atol=1e-5, source="t"),
                           subject="grad layers.0.attn.weight")


def test_parity_failed_names_the_first_divergence():
    rep = report(run(parity=Parity(status="fail", reason="r", first_divergence=_divergence())))
    (f,) = kinds(rep, "parity_failed")
    assert "grad layers.0.attn.weight (step 1)" in f.title
    assert f.severity_ns == 10 * MS and f.runs == ["ddp"]
    assert {e.path for e in f.evidence} >= {"/runs/0/parity/first_divergence/max_abs_diff"}


@pytest.mark.parametrize("status", ["pass", "not_recorded", "reference"])
def test_parity_not_failed_no_finding(status):
    # foreign traces: not_recorded ("not verified") is no finding; the other rules still run
    assert not kinds(report(run(parity=Parity(status=status, reason="r"))), "parity_failed")


# --- straggler -----------------------------------------------------------------------------

def _straggler(frac, cause="host_delay"):
    late = 6 * MS  # over 2 profiled steps: 3 ms per step
    return StragglerCause(rank=7, kind="all_to_all", times_last=4, late_ns=late,
                          split_ns={"host_delay": frac * late, "unexplained": (1 - frac) * late},
                          cause=cause if frac >= CAUSE_THRESHOLD else None, explained_frac=frac,
                          rule="largest part of the split")


def test_straggler_with_cause_at_the_threshold():
    (f,) = kinds(report(run(stragglers=[_straggler(CAUSE_THRESHOLD)])), "straggler")
    assert f.ranks == [7] and f.cause == "host_delay" and f.explained_frac == CAUSE_THRESHOLD
    assert f.cause_rule == "largest part of the split" and f.action
    assert f.severity_ns == 3 * MS
    assert "waits for rank 7 (host_delay)" in f.title
    assert "/runs/0/stragglers/0/split_ns/host_delay" in {e.path for e in f.evidence}


def test_straggler_below_the_threshold_cause_not_established():
    (f,) = kinds(report(run(stragglers=[_straggler(0.79)])), "straggler")
    assert f.cause is None and f.cause_rule is None and f.explained_frac is None
    assert f.action is None and "rank 7 (cause not established)" in f.title
    # a cause the straggler stage names below the threshold is not taken either
    (g,) = kinds(report(run(stragglers=[_straggler(0.5).__class__(
        **{**{k: getattr(_straggler(0.5), k) for k in StragglerCause.__struct_fields__},
           "cause": "host_delay"})])), "straggler")
    assert g.cause is None


def test_straggler_no_finding():
    assert not kinds(report(run()), "straggler")  # stragglers [] (not filled)
    tiny = StragglerCause(rank=1, kind="all_reduce", times_last=1, late_ns=0.01 * 2 * 10 * MS - 1)
    assert not kinds(report(run(stragglers=[tiny])), "straggler")  # < 1 % of the step


# --- exposed_communication -----------------------------------------------------------------

def test_exposed_communication_waiting():
    r = run(exposed_comm_ns=3 * MS, overlap_frac=0.1, communication={
        "all_to_all": comm(time=4 * MS, wait=3.8 * MS, transfer=0.2 * MS)})
    (f,) = kinds(report(r), "exposed_communication")
    assert f.cause.startswith("waiting") and f.explained_frac == pytest.approx(0.95)
    assert f.severity_ns == 3 * MS and "all_to_all" in f.title
    assert "straggler" in f.action


def test_exposed_communication_transfer_ddp_bucket_action():
    r = run(exposed_comm_ns=2 * MS, overlap_frac=0.2, communication={
        "all_reduce": comm(time=3 * MS, wait=0.3 * MS, transfer=2.7 * MS),
        "broadcast": comm(time=0.1 * MS, wait=0.0, transfer=0.1 * MS)})
    (f,) = kinds(report(r), "exposed_communication")
    assert f.cause.startswith("moving") and f.explained_frac == pytest.approx(2.8 / 3.1)
    assert "bucket_cap_mb" in f.action
    # well overlapped already: no overlap option suggested
    r.overlap_frac = 0.6
    (g,) = kinds(report(r), "exposed_communication")
    assert g.action is None


def test_exposed_communication_mixed_split_cause_not_established():
    r = run(strategy="fsdp", exposed_comm_ns=2 * MS, overlap_frac=0.0, communication={
        "all_gather": comm(time=3 * MS, wait=1.5 * MS, transfer=1.5 * MS)})
    (f,) = kinds(report(r), "exposed_communication")
    assert f.cause is None and f.action is None and "cause not established" in f.title


def test_exposed_communication_names_the_least_hidden_fsdp_unit():
    pf = _prefetch(0)
    pf.units[0].hidden_frac, pf.units[1].hidden_frac = 0.9, 0.2  # 0.1 ms vs 0.8 ms unhidden
    r = run(strategy="fsdp", exposed_comm_ns=2 * MS, overlap_frac=0.1, prefetch=pf,
            communication={"all_gather": comm(time=3 * MS, wait=0.1 * MS, transfer=2.9 * MS)})
    (f,) = kinds(report(r), "exposed_communication")
    assert f.units == ["layers.1"] and "FSDP unit layers.1" in f.title
    assert "forward_prefetch" in f.action


def test_exposed_communication_below_threshold_no_finding():
    r = run(exposed_comm_ns=0.099 * 10 * MS, communication={
        "all_reduce": comm(time=3 * MS, wait=0.0, transfer=3 * MS)})
    assert not kinds(report(r), "exposed_communication")


# --- prefetch_late -------------------------------------------------------------------------

def _prefetch(late, prefetched=0.0):
    return Prefetch(all_gathers=8, prefetched=0, comm_ns=8 * MS, hidden_ns=0, hidden_frac=0.0,
                    late=late, unknown=0, wait_ns=late * 2 * MS, labels="fsdp2", note=None,
                    units=[PrefetchUnit(phase="forward", unit="layers.0", n=4,
                                        prefetched=prefetched, comm_ns=MS, hidden_frac=0.0,
                                        slack_ns=-MS if late else MS,
                                        min_slack_ns=-2 * MS if late else MS),
                           PrefetchUnit(phase="backward", unit="layers.1", n=4, prefetched=1.0,
                                        comm_ns=MS, hidden_frac=1.0, slack_ns=MS,
                                        min_slack_ns=MS)])


def test_prefetch_late_names_the_unit():
    (f,) = kinds(report(run(strategy="fsdp2", prefetch=_prefetch(2))), "prefetch_late")
    assert f.units == ["layers.0"] and "forward_prefetch" in f.action
    assert f.severity_ns == 4 * MS / (2 * 2)  # wait_ns over 2 ranks x 2 steps
    (g,) = kinds(report(run(strategy="fsdp2", prefetch=_prefetch(2, prefetched=1.0))),
                 "prefetch_late")
    assert "further ahead" in g.action


def test_prefetch_not_late_no_finding():
    assert not kinds(report(run(strategy="fsdp2", prefetch=_prefetch(0))), "prefetch_late")


# --- input_bound ---------------------------------------------------------------------------

def _data(bound, workers=0):
    return DataSupply(source="loader", workers=workers, pin_memory=False, threshold_frac=0.2,
                      data_wait_frac=0.15, worst_rank=1, worst_rank_frac=0.3 if bound else 0.1,
                      input_bound=bound)


def test_input_bound_raise_workers():
    r = run(data=_data(True), ranks=[rank(0), rank(1, data=3 * MS)], device="gpu")
    (f,) = kinds(report(r), "input_bound")
    assert f.ranks == [1] and f.severity_ns == 3 * MS
    assert "num_workers (now 0" in f.action and "pin_memory=True" in f.action


def test_pinned_memory_is_advised_only_where_a_gpu_copies_from_it():
    r = run(data=_data(True), ranks=[rank(0), rank(1, data=3 * MS)], device="cpu")
    (f,) = kinds(report(r), "input_bound")
    assert f.action == ("raise the DataLoader's num_workers (now 0: loading runs in the training "
                        "process)")


def test_nvlink_is_advised_only_on_gpus():
    for device, action in (("gpu", "keep TP inside a node (NVLink), or overlap it (async TP / "
                                   "sequence parallel)"),
                           ("cpu", "overlap it (async TP / sequence parallel)")):
        rep = report(run(strategy="fsdp2_tp", device=device,
                         mesh_dims=[_dim("dp", 0.1 * MS), _dim("tp", 8 * MS)]))
        (f,) = kinds(rep, "mesh_dimension")
        assert f.action == action, device


def test_not_input_bound_no_finding():
    assert not kinds(report(run(data=_data(False))), "input_bound")


# --- host_bound ----------------------------------------------------------------------------

def _idle_ranks(a, b):
    return [rank(0, idle=a), rank(1, idle=b)]


def test_host_bound_on_gpu():
    (f,) = kinds(report(run(device="gpu", ranks=_idle_ranks(2 * MS, 4 * MS))), "host_bound")
    assert f.ranks == [1] and f.severity_ns == 2 * MS and f.cause is None


@pytest.mark.parametrize("device,idle", [("gpu", (1.9 * MS, 2 * MS)), ("cpu", (4 * MS, 4 * MS))])
def test_host_bound_no_finding(device, idle):
    # GPU idle under 20 % of the step; a CPU rank's idle is no launch gap
    assert not kinds(report(run(device=device, ranks=_idle_ranks(*idle))), "host_bound")


# --- imbalance -----------------------------------------------------------------------------

# measured on work (compute + own transfer), issue 42: tests/analyzer/test_findings_causes.py


# --- memory_does_not_fit -------------------------------------------------------------------

def _fit(fits):
    return Memory(fit=MemoryFit(device_bytes=80 << 30, needed_bytes=90 << 30, basis="peak",
                                fits=fits, spare_bytes=-(10 << 30)))


def test_memory_does_not_fit():
    (f,) = kinds(report(run(memory=_fit(False))), "memory_does_not_fit")
    assert f.severity_ns == 10 * MS and "FSDP" in f.action


@pytest.mark.parametrize("strategy,options,sharded", [
    ("ddp", {}, False), ("single", {}, False), ("foreign", {}, False),
    ("fsdp", {"sharding_strategy": "no_shard"}, False), ("fsdp", {}, True), ("fsdp2", {}, True),
    ("hsdp", {}, True), ("fsdp2_tp", {}, True), ("pp", {"pp": 2}, True)])
def test_memory_does_not_fit_advice_follows_the_strategy_sharding(strategy, options, sharded):
    # issue 41: a pp run (FSDP2 over its dp dimension) was told to "shard it"
    (f,) = kinds(report(run(strategy=strategy, options=options, memory=_fit(False))),
                 "memory_does_not_fit")
    assert f.action.startswith("shard it") is not sharded
    assert ("CPU offload" in f.action) is sharded


@pytest.mark.parametrize("fits", [True, None])
def test_memory_fits_or_unknown_no_finding(fits):
    assert not kinds(report(run(memory=_fit(fits))), "memory_does_not_fit")


# --- low_busbw -----------------------------------------------------------------------------

def _kinds(low, per_call=4 << 20):
    return {"all_reduce": comm(time=2 * MS, wait=0.0, transfer=2 * MS, bytes_=8 * per_call,
                               count=8, busbw=90.0, tbusbw=100.0),
            "all_gather": comm(time=1 * MS, wait=0.0, transfer=1 * MS, bytes_=2 * per_call,
                               count=2, busbw=low * 0.9, tbusbw=low)}


def test_low_busbw_against_the_runs_best_kind():
    (f,) = kinds(report(run(communication=_kinds(10.0))), "low_busbw")
    assert "all_gather" in f.title and "all_reduce" in f.title
    assert f.severity_ns == pytest.approx(1 * MS * (1 - 10 / 100))
    assert f.evidence[0].path == "/runs/0/communication/all_gather/transfer_busbw_gbps"


@pytest.mark.parametrize("low,per_call", [(25.0, 4 << 20), (10.0, (1 << 20) - 1)])
def test_busbw_not_low_or_latency_bound_no_finding(low, per_call):
    assert not kinds(report(run(communication=_kinds(low, per_call))), "low_busbw")


def test_low_busbw_between_groups_of_one_kind():
    g = lambda pg, bw: CommGroup(kind="all_reduce", pg=pg, pg_ranks="", group_size=2,  # noqa: E731
                                 dtype="float32", count=4, time_ns=2 * MS, bytes=8 << 20,
                                 unknown_bytes=0, busbw_gbps=bw, transfer_busbw_gbps=bw)
    rep = report(run(comm_groups=[g("0", 100.0), g("1", 20.0)]))
    (f,) = kinds(rep, "low_busbw")
    assert "pg 1" in f.title and f.severity_ns == pytest.approx(MS * 0.8)  # 2 ms over 2 steps


# --- mesh_dimension ------------------------------------------------------------------------

def _dim(name, exposed, wait=0.2 * MS, transfer=1.8 * MS):
    return MeshDimComm(name=name, source="manifest", group_size=2, groups=1, kinds=["all_reduce"],
                       n_ranks=4, count=4, time_ns=2 * MS, union_ns=2 * MS, exposed_ns=exposed,
                       union_ns_per_step=MS, exposed_ns_per_step=exposed / 2, wait_ns=wait,
                       transfer_ns=transfer)


def test_mesh_dimension_tp_exposed():
    rep = report(run(strategy="fsdp2_tp", mesh_dims=[_dim("dp", 0.1 * MS), _dim("tp", 8 * MS)]))
    (f,) = kinds(rep, "mesh_dimension")
    assert f.mesh_dims == ["tp"] and f.severity_ns == 4 * MS
    assert f.cause.startswith("moving") and "TP" in f.action


def test_mesh_dimension_no_finding():
    # one dimension only (exposed_communication says it), or under 10 % of the step
    assert not kinds(report(run(mesh_dims=[_dim("world", 8 * MS)])), "mesh_dimension")
    assert not kinds(report(run(mesh_dims=[_dim("dp", 1.9 * MS), _dim("tp", 0.1 * MS)])),
                     "mesh_dimension")


# --- the list ------------------------------------------------------------------------------

def test_most_severe_first_and_pointer_escaping():
    r = run(device="gpu", ranks=_idle_ranks(2 * MS, 4 * MS), exposed_comm_ns=3 * MS,
            communication={"a/b~c": comm(time=4 * MS, wait=3.8 * MS, transfer=0.2 * MS)},
            stragglers=[_straggler(0.9)])
    rep = report(r)
    assert [f.kind for f in rep.findings] == ["straggler", "exposed_communication", "host_bound"]
    assert "/runs/0/communication/a~1b~0c/time_ns_per_step" in {
        e.path for e in rep.findings[1].evidence}


def test_no_figures_no_findings():
    rep = report(RunEntry(name="empty", strategy="unknown",
                          parity=Parity(status="not_recorded", reason="foreign")))
    assert rep.findings == []


# --- repeats of one arm merged ---------------------------------------------------------------

def _repeat(k: int, n: int, stragglers, arm="ddp", exp="e1") -> RunEntry:
    return run(name=f"{arm}.r{k}", stragglers=stragglers,
               experiment={"id": exp, "arm": arm, "repeat": k, "repeats": n, "order": [arm]})


def test_repeats_of_one_arm_give_one_finding_per_subject():
    """Four repeats: rank 7 straggles in r1, r2 and r4 (3, 6 and 1.5 ms per step), rank 3 in r3
    (3 ms): one finding each, the first shown with the median repeat's figures (r1: 3 ms), at
    stake the mean over all four repeats ((3 + 6 + 1.5 + 0) / 4 ms); the second fired in 1 of 4
    (3 / 4 ms). Another experiment's run is not merged with them."""
    s = _straggler(CAUSE_THRESHOLD)
    scaled = lambda f, rank=7: StragglerCause(**{**{k: getattr(s, k) for k in
                                                  StragglerCause.__struct_fields__},
                                               "late_ns": f * s.late_ns, "rank": rank,
                                               "split_ns": {k: f * v for k, v in s.split_ns.items()}})
    rep = report(_repeat(1, 4, [scaled(1.0)]), _repeat(2, 4, [scaled(2.0)]),
                 _repeat(3, 4, [scaled(1.0, rank=3)]), _repeat(4, 4, [scaled(0.5)]),
                 _repeat(1, 1, [scaled(1.0)], exp="other"))
    by = {(tuple(f.runs), f.ranks[0]): f for f in kinds(rep, "straggler")}
    assert set(by) == {(("ddp.r1", "ddp.r2", "ddp.r4"), 7), (("ddp.r3",), 3), (("ddp.r1",), 7)}
    seven = by[(("ddp.r1", "ddp.r2", "ddp.r4"), 7)]
    assert seven.severity_ns == pytest.approx((3 + 6 + 1.5) / 4 * MS)
    assert seven.title.startswith("ddp in 3 of 4 repeats (figures of ddp.r1): the all_to_all "
                                  "waits for rank 7")
    assert {e.path for e in seven.evidence} >= {"/runs/0/stragglers/0/late_ns"}  # r1's figures
    three = by[(("ddp.r3",), 3)]
    assert three.severity_ns == pytest.approx(3 / 4 * MS)
    assert three.title.startswith("ddp in 1 of 4 repeats (figures of ddp.r3)")
    alone = by[(("ddp.r1",), 7)]  # experiment "other", one repeat: as before
    assert alone.title.startswith("ddp.r1: the all_to_all") and alone.severity_ns == 3 * MS
