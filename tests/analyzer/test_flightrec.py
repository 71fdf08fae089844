"""Flight Recorder dumps (issue 30 item 5): hand-built dumps in the schema of torch's
``_dump_fr_trace_json`` (the keys and value forms of a real torch 2.13 gloo dump) with exact
answers -- a rank that never entered, a size mismatch, a dtype mismatch, a kind mismatch, all
completed -- and FR dumps found beside foreign traces by ``analyzer report``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.analyses import flightrec
from analyzer.compare.runs import analyse
from analyzer.contract.errors import BadInput
from analyzer.contract.report_types import AnalysisOptions
from analyzer.ingest import frdump, rundirs
from reports import markdown
from tests.analyzer.helpers import gloo_job


def entry(seq: int, kind: str = "all_reduce", *, pg: tuple[str, str] = ("0", "default_pg"), pg_id: int = 0,
          sizes=((4,),), out_sizes=None, dtype: str = "Float", out_dtype: str | None = None,
          backend: str = "gloo", state: str = "scheduled", retired: bool = True) -> dict:
    """One FR entry as torch 2.13 writes it (every key of a real dump)."""
    return {"collective_seq_id": seq, "input_dtypes": [dtype], "input_sizes": [list(s) for s in sizes],
            "is_p2p": False, "op_id": seq, "output_dtypes": [out_dtype or dtype],
            "output_sizes": [list(s) for s in (out_sizes or sizes)], "p2p_seq_id": 0, "pg_id": pg_id,
            "process_group": list(pg), "profiling_name": f"{backend}:{kind}", "record_id": seq - 1,
            "retired": retired, "state": state, "thread_id": "1", "thread_name": "python3",
            "time_created_ns": 1_000 * seq, "time_discovered_completed_ns": 0,
            "time_discovered_started_ns": 0, "timeout_ms": 20000}


def dump(entries: list[dict], *, status: dict[str, tuple[int, int]] | None = None,
         config: dict[str, list[int]] | None = None) -> dict:
    """A dump: ``status`` {pg_id: (last enqueued, last completed)} (default: from the entries,
    all completed), ``config`` {group name: ranks}."""
    if status is None:
        last = max((e["collective_seq_id"] for e in entries), default=0)
        status = {"0": (last, last)}
    return {"comm_lib_version": "", "entries": entries, "nccl_comm_state": {},
            "pg_config": {n: {"desc": "", "name": n, "ranks": str(r)} for n, r in (config or {}).items()},
            "pg_status": {k: {"last_completed_collective": str(c), "last_enqueued_collective": str(q),
                              "last_started_collective": "-1"} for k, (q, c) in status.items()},
            "version": "2.10"}


def write_dumps(folder: Path, dumps: dict[int, dict], name: str = "rank{}.flightrec.json") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for r, d in dumps.items():
        p = folder / name.format(r)
        p.write_text(json.dumps(d))
        paths.append(p)
    return paths


def analysed(tmp_path: Path, dumps: dict[int, dict], world: int | None = None):
    return flightrec.analyse(frdump.read_dumps(write_dumps(tmp_path, dumps)), world)


def test_a_rank_that_never_entered_is_named_with_the_collective(tmp_path):
    """3 ranks: 0 and 2 enqueued all_reduce #5 and wait in it (gloo: not completed while the
    peer is missing), rank 1 stopped after #4."""
    ok = [entry(s) for s in range(1, 5)]
    fr = analysed(tmp_path, {0: dump(ok + [entry(5)], status={"0": (5, 4)}),
                             1: dump(ok, status={"0": (4, 4)}),
                             2: dump(ok + [entry(5)], status={"0": (5, 4)})}, world=3)
    (g,) = fr.groups
    assert (g.pg, g.ranks, g.ranks_source) == ("0", [0, 1, 2], "world")
    assert (g.last_completed_seq, g.next_seq, g.next_kind) == (4, 5, "all_reduce")
    assert (g.never_entered, g.entered, g.mismatches) == ([1], [0, 2], [])
    assert [x.waiting_in for x in g.per_rank] == ["all_reduce #5", None, "all_reduce #5"]
    assert g.statement == "rank 1 never entered all_reduce #5 of process group 0; ranks 0, 2 waited in it"


def test_gloo_s_timed_out_collective_is_failed_not_completed(tmp_path):
    """A real gloo dump after a timeout: the waiting rank's pg_status says #7 completed (it
    ended, failing) and #8 enqueued; the stuck rank is at #6. Every rank completed #6; #7
    failed on rank 0 (rank 1 never entered it: it cannot have completed)."""
    ok = [entry(s) for s in range(1, 7)]
    fr = analysed(tmp_path, {0: dump(ok + [entry(7), entry(8, sizes=((9,),))], status={"0": (8, 7)}),
                             1: dump(ok, status={"0": (6, 6)})})
    (g,) = fr.groups
    assert (g.last_completed_seq, g.next_seq, g.never_entered, g.entered) == (6, 7, [1], [0])
    assert g.statement == ("rank 1 never entered all_reduce #7 of process group 0; rank 0 waited in it "
                           "until it failed (timed out, or a peer left)")
    assert [(x.last_completed_seq, x.failed_seq) for x in g.per_rank] == [(6, 7), (6, None)]


def test_size_mismatch_is_found_by_fr_trace_rules(tmp_path):
    ok = [entry(s) for s in range(1, 3)]
    fr = analysed(tmp_path, {0: dump(ok + [entry(3, sizes=((4,),))]),
                             1: dump(ok + [entry(3, sizes=((8,),))])})
    (g,) = fr.groups
    assert g.never_entered == [] and g.next_seq is None
    (m,) = g.mismatches
    assert (m.seq, m.kind, m.fr_state, m.mismatch, m.rank, m.reference_rank) == (
        3, "all_reduce", "SIZE_OR_SYNTAX_MISMATCH", "size", 1, 0)
    assert m.detail == "input sizes [[8]] where the reference has [[4]]"
    assert g.statement == ("process group 0: every rank completed all_reduce #3, its last; size mismatch "
                           "at all_reduce #3: rank 1 has input sizes [[8]] where the reference has [[4]] (rank 0)")


def test_dtype_mismatch(tmp_path):
    fr = analysed(tmp_path, {0: dump([entry(1), entry(2, dtype="Float")]),
                             1: dump([entry(1), entry(2, dtype="BFloat16")])})
    (m,) = fr.groups[0].mismatches
    assert (m.seq, m.fr_state, m.mismatch, m.rank) == (2, "COLLECTIVE_DTYPE_MISMATCH", "dtype", 1)


def test_kind_mismatch_and_only_the_first_per_group(tmp_path):
    """fr_trace stops pairing a group at its first mismatch: #2 (kind) is reported, #3 (size)
    is not."""
    fr = analysed(tmp_path, {0: dump([entry(1), entry(2, "all_reduce"), entry(3, sizes=((4,),))]),
                             1: dump([entry(1), entry(2, "broadcast"), entry(3, sizes=((5,),))])})
    assert [(m.seq, m.mismatch, m.detail) for m in fr.groups[0].mismatches] == [
        (2, "kind", "kind broadcast where the reference has all_reduce")]


def test_all_gather_output_must_be_input_times_group_size(tmp_path):
    """Op.match: an all_gather's output numel = input numel x group size (here 2 x 4 = 8, not
    6); both ranks agree with each other on sizes, the rule checks the reference's input."""
    ag = dict(kind="all_gather", sizes=((4,),), out_sizes=((6,),))
    fr = analysed(tmp_path, {0: dump([entry(1, **ag)]), 1: dump([entry(1, **ag)])})
    (m,) = fr.groups[0].mismatches
    assert (m.mismatch, m.rank) == ("size", 1)
    assert m.detail == "output numel 6 where the reference's input numel 4 x group size 2 = 8"


def test_all_completed_says_so_and_no_one_is_blamed(tmp_path):
    ok = [entry(s) for s in range(1, 4)]
    fr = analysed(tmp_path, {0: dump(ok), 1: dump(ok)})
    (g,) = fr.groups
    assert (g.last_completed_seq, g.never_entered, g.entered, g.mismatches, g.missing_dumps) == (3, [], [], [], [])
    assert (g.verdict, g.statement) == ("", "")
    assert g.summary == "process group 0: every rank completed all_reduce #3, its last"


def test_groups_apart_membership_from_pg_config_and_a_missing_dump(tmp_path):
    """World 3: group "1" = ranks 0, 2 (pg_config) is stuck at #2 where rank 2 never entered;
    the default group's dumped ranks completed #1 but rank 1 left no dump of it: never "every
    rank" then, rank 1 may be the one that hung."""
    sub = dict(pg=("1", "dp"), pg_id=1)
    d0 = dump([entry(1), entry(1, **sub), entry(2, **sub)], status={"0": (1, 1), "1": (2, 1)},
              config={"0": [0, 1, 2], "1": [0, 2]})
    d2 = dump([entry(1), entry(1, **sub)], status={"0": (1, 1), "1": (1, 1)}, config={"0": [0, 1, 2], "1": [0, 2]})
    fr = analysed(tmp_path, {0: d0, 2: d2}, world=3)
    g0, g1 = fr.groups
    assert (g0.pg, g0.ranks, g0.missing_dumps) == ("0", [0, 1, 2], [1])
    assert (g0.verdict, g0.statement) == ("", "")
    assert g0.summary == ("process group 0: ranks 0, 2 ended all_reduce #1 (completed, or failed: gloo records "
                          "both alike); rank 1: no dump (unknown)")
    assert (g1.pg, g1.desc, g1.ranks, g1.ranks_source, g1.missing_dumps) == ("1", "dp", [0, 2], "pg_config", [])
    assert g1.verdict == "collective_hang"
    assert g1.statement == "rank 2 never entered all_reduce #2 of process group 1; rank 0 waited in it"


def test_a_missing_rank_dump_is_never_covered_by_every_rank(tmp_path):
    """World 2, rank 0's dump only, its last all_reduce #7 ended (gloo: completed or failed):
    rank 1 may be hung in it or never have entered it; the report says rank 0 ended #7 and
    rank 1 is unknown, in the line and in the table."""
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=20, n_gather=0)
    write_dumps(folder, {0: dump([entry(s) for s in range(1, 8)])}, name="fr_trace_rank_{}.json")
    report = analyse(folder, AnalysisOptions())
    (g,) = report.runs[0].flight_recorder.groups
    assert (g.ranks, g.missing_dumps) == ([0, 1], [1])
    line = ("process group 0: rank 0 ended all_reduce #7 (completed, or failed: gloo records both alike); "
            "rank 1: no dump (unknown)")
    assert g.summary == line
    text = markdown.render(report)
    assert f"- **job: {line}**" in text
    assert "every rank" not in text.split("## Hangs (Flight Recorder)")[1].split("\nRule: ")[0]
    assert "| #7 (1: no dump, unknown) |" in text


def test_entries_dropped_from_the_ring_buffer_do_not_count_as_missing(tmp_path):
    """Rank 1's buffer starts at #101 (older entries overwritten); pg_status still says how far
    each rank got."""
    fr = analysed(tmp_path, {0: dump([entry(s) for s in range(1, 151)], status={"0": (150, 150)}),
                             1: dump([entry(s) for s in range(101, 151)], status={"0": (150, 150)})})
    (g,) = fr.groups
    assert (g.last_completed_seq, g.never_entered, g.mismatches) == (150, [], [])


def test_reader_refuses_bad_dumps_naming_the_file(tmp_path):
    (p,) = write_dumps(tmp_path / "a", {0: dump([entry(1)])}, name="dump{}.json")
    twin = tmp_path / "a" / "other_rank0.json"
    twin.write_text(p.read_text())
    with pytest.raises(BadInput) as exc:
        frdump.read_dumps([p, twin])
    assert exc.value.reason == "duplicate_rank"
    noname = tmp_path / "a" / "fr.json"
    noname.write_text(p.read_text())
    with pytest.raises(BadInput, match="ends with no rank number"):
        frdump.read_dump(noname)
    bad = tmp_path / "a" / "bad3.json"
    bad.write_text(json.dumps({"version": "2.10", "entries": [{"collective_seq_id": "x"}]}))
    with pytest.raises(BadInput) as exc:
        frdump.read_dump(bad)
    assert exc.value.reason == "bad_run_file" and str(bad) in str(exc.value)


def test_a_truncated_dump_is_refused_with_what_to_do(tmp_path):
    """A dump cut off mid-write (a rank killed while dumping): the refusal says how to go on."""
    (p,) = write_dumps(tmp_path, {1: dump([entry(1)])})
    p.write_bytes(p.read_bytes()[:40])
    with pytest.raises(BadInput) as exc:
        frdump.read_dump(p)
    assert str(exc.value) == (f"{p}: the Flight Recorder dump is not valid JSON: Input data was truncated; "
                              "re-dump it, or move it out of the folder to analyse the rest")


class _Explodes:
    """Unpickling this runs code: the test fails if anything ever unpickles a dump."""

    def __reduce__(self):
        return (pytest.fail, ("a Flight Recorder pickle was unpickled",))


@pytest.mark.parametrize("where", ["alone", "json_beside_traces", "run_dir_name"])
def test_pickled_dumps_are_refused_as_such_and_never_unpickled(tmp_path, where):
    """torch's default dump is a pickle (``nccl_trace_rank_<r>``): known by its protocol
    header, refused saying so and how to dump JSON -- never as "not a Chrome/Kineto trace"."""
    import pickle

    data = pickle.dumps({"version": "2.10", "entries": [_Explodes()]}, protocol=4)
    if where == "alone":
        path = tmp_path / "nccl_trace_rank_0"
        path.write_bytes(data)
        with pytest.raises(BadInput) as exc:
            analyse(path, AnalysisOptions())
    elif where == "json_beside_traces":
        folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=3, n_gather=0)
        path = folder / "fr_rank0.json"
        path.write_bytes(data)
        with pytest.raises(BadInput) as exc:
            analyse(folder, AnalysisOptions())
    else:
        path = tmp_path / "rank0.flightrec.json"
        path.write_bytes(data)
        with pytest.raises(BadInput) as exc:
            frdump.read_dump(path)
    assert exc.value.reason == "pickle_dump" and str(path) in str(exc.value)
    text = str(exc.value)
    assert "pickle dumps are never read" in text and "_dump_fr_trace_json" in text
    assert "Chrome/Kineto" not in text
    # the header alone decides: 0x80 and a protocol byte, not any file starting with 0x80
    assert frdump.starts_as_pickle(b"\x80\x04") and not frdump.starts_as_pickle(b"\x80{")


def test_report_reads_fr_dumps_beside_foreign_traces(tmp_path):
    """A folder of gloo traces plus FR JSON dumps named as torch users name them: the dumps
    are not taken as traces, and the report's Hangs section names the stuck rank."""
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=20, n_gather=0)
    ok = [entry(s) for s in range(1, 4)]
    write_dumps(folder, {0: dump(ok + [entry(4)], status={"0": (4, 3)}), 1: dump(ok)},
                name="fr_trace_rank_{}.json")
    found = rundirs.discover(folder)
    (run,) = found.runs
    assert sorted(p.name for p in run.traces) == ["rank0.trace.json", "rank1.trace.json"]
    assert [p.name for p in run.fr_dumps] == ["fr_trace_rank_0.json", "fr_trace_rank_1.json"]
    report = analyse(folder, AnalysisOptions())
    (g,) = report.runs[0].flight_recorder.groups
    assert g.statement == "rank 1 never entered all_reduce #4 of process group 0; rank 0 waited in it"
    text = markdown.render(report)
    assert "## Hangs (Flight Recorder)" in text
    assert "- **job: rank 1 never entered all_reduce #4 of process group 0; rank 0 waited in it**" in text
    assert report.runs[0].ranks  # the traces were analysed as before


def test_no_dumps_no_section(tmp_path):
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=20, n_gather=0)
    report = analyse(folder, AnalysisOptions())
    assert report.runs[0].flight_recorder is None
    assert "Hangs (Flight Recorder)" not in markdown.render(report)


FR_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flightrec"


def fixture_dumps(name: str, world: int):
    return frdump.flight_recorder(sorted((FR_FIXTURES / name).glob("rank*.flightrec.json")), world)


def test_pg_status_that_counts_point_to_point_ops_is_set_aside():
    """A real torch 2.13 gloo hang (fixtures/flightrec/build_gloo_p2p_hang.py): all_reduce #1,
    10 sends 0 -> 1, all_reduce #2, then rank 1 stops before all_reduce #3. gloo records no
    send / recv, but its pg_status counts them (rank 0: 13 enqueued, 12 completed; all_reduce
    #2 is op 12): the collective numbers come from the entries. 18fb8ff said "rank 1 never
    entered collective #13 of process group 0"."""
    fr = fixture_dumps("gloo_p2p_hang", 2)
    (g,) = fr.groups
    assert g.verdict == "collective_hang"
    assert g.statement == "rank 1 never entered all_reduce #3 of process group 0; rank 0 waited in it"
    assert [(x.rank, x.last_enqueued_seq, x.last_completed_seq) for x in g.per_rank] == [(0, 3, 2), (1, 2, 2)]
    assert fr.notes == ["process group 0: pg_status set aside (it counts point-to-point ops too: rank 0's "
                        "all_reduce #2 is gloo's op 12 of the group); entered / completed from its collective "
                        "entries"]


def test_nccl_coalesced_collectives_keep_pg_status_and_end_with_their_last_entry(tmp_path):
    """NCCL's op_id counts each op of a coalesced collective (FSDP's all_gather batch), its
    counters the batch once: no send / recv, so pg_status still counts collectives. And where
    the entries decide, a batch ends with its last ("coalesced") entry, the one holding the
    work: its first ops' entries never leave "scheduled"."""
    def batch(seq: int, done: bool) -> list[dict]:
        ops = [entry(seq, "all_gather", out_sizes=((8,),), backend="nccl", state="scheduled", retired=False)
               for _ in range(2)]
        last = entry(seq, "coalesced", backend="nccl", state="completed" if done else "started", retired=done)
        for i, e in enumerate(ops + [last]):
            e["op_id"] = 3 * (seq - 1) + i + 1
        return ops + [last]
    fr = analysed(tmp_path, {0: dump(batch(1, True) + batch(2, True), status={"0": (2, 2)}),
                             1: dump(batch(1, True) + batch(2, False), status={"0": (2, 1)})})
    (g,) = fr.groups
    assert fr.notes == []
    assert [(x.last_enqueued_seq, x.last_completed_seq) for x in g.per_rank] == [(2, 2), (2, 1)]
    assert g.statement == "process group 0: every rank entered all_gather #2; not completed on rank 1"
    fr = analysed(tmp_path / "no_status", {0: {**dump(batch(1, True)), "pg_status": {}},
                                          1: {**dump(batch(1, True)), "pg_status": {}}})
    assert fr.groups[0].summary == "process group 0: every rank completed all_gather #1, its last"


def test_a_real_gloo_pp_hang_gets_no_collective_verdict(tmp_path):
    """A real `tracer record --strategy pp --nproc 2` on gloo with rank 1 stopped at step 1
    (fixtures/flightrec/README.md): its default group carried only send / recv, which gloo
    never records, so the dumps hold no entry and no pg_status. No group, no collective
    verdict; a note says why the dumps are empty; the Hangs section blames no one and shows
    no empty table."""
    note = ("The dumps hold no entry: no process group recorded an op (torch's gloo records "
            "collectives only, never a send or recv: ProcessGroupGloo::enqueue)")
    fr = fixture_dumps("gloo_pp_hang", 2)
    assert fr.groups == [] and fr.ranks == [0, 1]
    assert fr.notes == [note]
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=3, n_gather=0)
    for r in (0, 1):
        (folder / f"fr_trace_rank_{r}.json").write_bytes(
            (FR_FIXTURES / "gloo_pp_hang" / f"rank{r}.flightrec.json").read_bytes())
    section = markdown.render(analyse(folder, AnalysisOptions())).split("## Hangs (Flight Recorder)")[1]
    section = section.split("\n## ")[0]
    assert section.strip().splitlines()[0] == f"job: dumps of rank(s) 0, 1. {note}"
    assert "| run |" not in section and "never entered" not in section.split("Rule: ")[0]


def p2p(seq: int, op: str, me: int, peer: int, *, coll: int = 0, done: bool = True,
        pg: tuple[str, str] = ("0", "default_pg")) -> dict:
    """One NCCL point-to-point entry as ProcessGroupNCCL records it: ``collective_seq_id`` the
    group's collective count so far, ``p2p_seq_id`` the rank's p2p count, ``profiling_name``
    "nccl:send <src>-><dst>" / "nccl:recv <dst><-<src>" in group ranks (fr_trace types.py Op)."""
    e = entry(coll, backend="nccl", pg=pg, state="completed" if done else "scheduled", retired=done)
    e.update(is_p2p=True, p2p_seq_id=seq, op_id=seq + coll,
             profiling_name=f"nccl:send {me}->{peer}" if op == "send" else f"nccl:recv {me}<-{peer}")
    return e


def pipeline(last: dict[int, int], stuck: int) -> dict[int, dict]:
    """5 ranks in a chain over the default group: rank r receives from r - 1 and sends to
    r + 1, alternating (recv first); ``last[r]``: its last p2p_seq_id; ``stuck``'s last op is
    left not completed. pg_status as NCCL leaves it after send / recv: the p2p count."""
    out = {}
    for r, n in last.items():
        ops = []
        for s in range(1, n + 1):
            if r == 0:
                ops.append(("send", 1))
            elif r == 4:
                ops.append(("recv", 3))
            else:
                ops.append(("recv", r - 1) if s % 2 else ("send", r + 1))
        es = [p2p(s, op, r, peer, done=not (r == stuck and s == n)) for s, (op, peer) in enumerate(ops, 1)]
        out[r] = dump(es, status={"0": (n, n - (r == stuck))})
    return out


def test_a_send_whose_peer_never_entered_its_recv_is_its_own_verdict(tmp_path):
    """Rank 3 entered send #12 to rank 4; rank 4 received 5 times from rank 3 (all completed)
    and never entered its 6th recv. The group carries only send / recv: no collective verdict
    (18fb8ff read pg_status, the p2p count, as collective numbers: "rank 4 never entered
    collective #6 of process group 0; ranks 0, 1, 2, 3 waited in it")."""
    fr = analysed(tmp_path, pipeline({0: 6, 1: 12, 2: 12, 3: 12, 4: 5}, stuck=3), world=5)
    (g,) = fr.groups
    assert (g.next_seq, g.never_entered, g.entered, g.last_completed_seq) == (None, [], [], 0)
    assert g.verdict == "p2p_pending"
    assert g.statement == ("rank 3's send #12 to rank 4 (process group 0) was never matched: rank 4 never "
                           "entered its recv")
    assert [(x.rank, x.op, x.peer, x.p2p_seq) for x in g.p2p_pending] == [(3, "send", 4, 12)]
    assert fr.notes == ["process group 0: pg_status set aside (it counts point-to-point ops too: rank 0 "
                        "holds a send entry); entered / completed from its collective entries"]


def test_a_p2p_only_group_without_a_pending_op_has_no_verdict(tmp_path):
    fr = analysed(tmp_path, pipeline({0: 6, 1: 12, 2: 12, 3: 12, 4: 6}, stuck=-1), world=5)
    (g,) = fr.groups
    assert (g.verdict, g.statement, g.p2p_pending) == ("", "", [])
    assert g.summary == "process group 0: no collective recorded (48 point-to-point entries only)"


def test_both_ends_pending_is_not_a_never_matched_op(tmp_path):
    """Rank 0's send and rank 1's recv both entered, neither completed (a transport fault or a
    size mismatch, not a peer that never came): no p2p verdict."""
    fr = analysed(tmp_path, {0: dump([p2p(1, "send", 0, 1, done=False)], status={"0": (1, 0)}),
                             1: dump([p2p(1, "recv", 1, 0, done=False)], status={"0": (1, 0)})})
    (g,) = fr.groups
    assert (g.verdict, g.p2p_pending) == ("", [])


def test_a_batched_op_ends_with_its_coalesced_entry(tmp_path):
    """batch_isend_irecv on NCCL: each op's entry, then a "nccl:coalesced" entry of the same
    p2p_seq_id whose state is the batch's (fr_trace find_coalesced_group). Rank 0's batch #1
    ended; its #2 did not, and rank 1 holds no pending recv: rank 1 never entered it."""
    def batch(seq: int, me: int, peer: int, op: str, done: bool) -> list[dict]:
        coalesced = p2p(seq, op, me, peer, done=done)
        coalesced["profiling_name"] = "nccl:coalesced"
        return [p2p(seq, op, me, peer, done=False), coalesced]
    fr = analysed(tmp_path, {0: dump(batch(1, 0, 1, "send", True) + batch(2, 0, 1, "send", False)),
                             1: dump(batch(1, 1, 0, "recv", True))})
    (g,) = fr.groups
    assert g.statement == ("rank 0's send #2 to rank 1 (process group 0) was never matched: rank 1 never "
                           "entered its recv")


def test_a_collective_hang_outranks_a_pending_p2p_op(tmp_path):
    """A group with collectives and send / recv: the collective numbers come from the
    collective entries (#2), never from pg_status (the p2p count); the hang is the verdict."""
    d0 = dump([entry(1), p2p(1, "send", 0, 1, coll=1), entry(2)], status={"0": (1, 1)})
    d1 = dump([entry(1), p2p(1, "recv", 1, 0, coll=1)], status={"0": (1, 1)})
    fr = analysed(tmp_path, {0: d0, 1: d1})
    (g,) = fr.groups
    assert g.verdict == "collective_hang"
    assert g.statement == "rank 1 never entered all_reduce #2 of process group 0; rank 0 waited in it"


@pytest.mark.parametrize("names", [["nccl_trace_rank_0", "nccl_trace_rank_1"], ["job_dump_0", "job_dump_1"]])
def test_a_folder_of_pickled_dumps_is_refused_naming_them(tmp_path, names):
    """torch's default dumps (TORCH_FR_DUMP_TEMP_FILE prefix + rank, pickled) and nothing else:
    one line naming them as Flight Recorder pickles, never unpickled, and how to get JSON.
    18fb8ff said "holds no run directory (manifest.json) and no trace files"."""
    import pickle

    folder = tmp_path / "dumps"
    folder.mkdir()
    for n in names:
        (folder / n).write_bytes(pickle.dumps({"version": "2.10", "entries": [_Explodes()]}, protocol=2))
    with pytest.raises(BadInput) as exc:
        rundirs.discover(folder)
    assert exc.value.reason == "pickle_dump"
    assert str(exc.value) == (
        f"{folder}: holds no trace, only Flight Recorder dumps in torch's pickle format ({', '.join(names)}): "
        "pickle dumps are never read, unpickling a file runs code it chooses; dump JSON instead: "
        "torch._C._distributed_c10d._dump_fr_trace_json() on each rank, written as <prefix><rank>.json beside "
        "the traces (tracer record writes rank<r>.flightrec.json on a failed record)")


def test_report_prints_a_never_matched_send_as_the_hang_line(tmp_path):
    """The Hangs section's line and table column for a p2p verdict (NCCL-shaped dumps beside
    a folder of traces)."""
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=20, n_gather=0)
    write_dumps(folder, {0: dump([p2p(1, "send", 0, 1), p2p(2, "send", 0, 1, done=False)]),
                         1: dump([p2p(1, "recv", 1, 0)])}, name="fr_trace_rank_{}.json")
    report = analyse(folder, AnalysisOptions())
    text = markdown.render(report)
    line = "rank 0's send #2 to rank 1 (process group 0) was never matched: rank 1 never entered its recv"
    assert f"- **job: {line}**" in text
    assert "| 0 send #2 to 1 |" in text
