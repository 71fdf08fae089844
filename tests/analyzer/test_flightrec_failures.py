"""Flight Recorder rules for failed and missing dumps (issue 42): a pickled dump beside the JSON
ones is named, a gloo collective that failed is not "completed", a hang with one rank's dump
missing still gets a verdict, a truncated dump says what to do."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from analyzer.compare.runs import analyse
from analyzer.contract.report_types import AnalysisOptions
from analyzer.ingest import frdump
from reports import markdown
from tests.analyzer.helpers import gloo_job
from tests.analyzer.test_flightrec import dump, entry, write_dumps


class _Explodes:
    """Unpickling this runs code: the test fails if anything ever unpickles a dump."""

    def __reduce__(self):
        return (pytest.fail, ("a Flight Recorder pickle was unpickled",))


def test_a_pickled_dump_beside_json_dumps_is_named_not_taken_for_no_dump(tmp_path):
    """rank 0 dumped JSON, rank 1 left torch's default pickle ``nccl_trace_rank_1`` beside the
    traces: the notes and a caveat name it, the Hangs line says rank 1's dump is a pickle (6cc75a5:
    nothing named it and the line said "rank 1: no dump (unknown)")."""
    folder = gloo_job(tmp_path / "job", ranks=2, n_reduce=20, n_gather=0)
    write_dumps(folder, {0: dump([entry(s) for s in range(1, 4)])}, name="fr_trace_rank_{}.json")
    (folder / "nccl_trace_rank_1").write_bytes(pickle.dumps({"entries": [_Explodes()]}, protocol=4))
    report = analyse(folder, AnalysisOptions())
    run = report.runs[0]
    line = ("nccl_trace_rank_1: a Flight Recorder dump in torch's pickle format, not read (never "
            "unpickled); dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on each "
            "rank, written as <prefix><rank>.json beside the traces")
    assert line in run.caveats and line in run.flight_recorder.notes
    assert run.flight_recorder.pickled_ranks == [1]
    (g,) = run.flight_recorder.groups
    assert g.summary.endswith("; rank 1: its dump is a pickle (not read)")
    text = markdown.render(report)
    assert "| #3 (1: pickle, not read) |" in text
    assert "no dump (unknown)" not in text


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "flightrec"


def _gloo_ddp_hang(tmp_path: Path, ranks=(0, 1), retired_7: bool = True) -> Path:
    """The real gloo ddp hang's dumps (fixtures/flightrec/gloo_ddp_hang) of ``ranks`` copied
    into a folder; ``retired_7`` False: rank 0's all_reduce #7 as dumped before gloo retired it
    (its pg_status then says 6 completed, as torch 2.13 leaves it right after the error)."""
    folder = tmp_path / "ddp"
    folder.mkdir()
    for r in ranks:
        d = json.loads((FIXTURES / "gloo_ddp_hang" / f"rank{r}.flightrec.json").read_text())
        if r == 0 and not retired_7:
            d["entries"][-1]["retired"] = False
            d["pg_status"]["0"]["last_completed_collective"] = "6"
        (folder / f"rank{r}.flightrec.json").write_text(json.dumps(d))
    return folder


def test_a_gloo_collective_a_peer_never_entered_failed_it_did_not_complete(tmp_path):
    """gloo retires a timed-out all_reduce as it does a completed one (retired, state
    scheduled, pg_status 7 completed): rank 0's #7 is entered, not completed (6cc75a5: "0: #7 /
    #7", completed, beside "rank 0 waited in it")."""
    folder = _gloo_ddp_hang(tmp_path)
    fr = frdump.flight_recorder(sorted(folder.iterdir()), 2)
    (g,) = fr.groups
    r0, r1 = g.per_rank
    assert (r0.last_enqueued_seq, r0.last_completed_seq, r0.failed_seq, r0.waiting_in) == (7, 6, 7, "all_reduce #7")
    assert (r1.last_enqueued_seq, r1.last_completed_seq, r1.failed_seq) == (6, 6, None)
    assert g.statement == ("rank 1 never entered all_reduce #7 of process group 0; rank 0 waited in it "
                           "until it failed (timed out, or a peer left)")
    text = markdown.render(analyse(folder, AnalysisOptions()))
    assert "| ddp | 0 (default_pg) | 0, 1 | #6 | 1: all_reduce #7 | 0 | 0: #7 / #6 (#7 failed); 1: #6 / #6 | - | - |" in text


def test_a_hang_with_one_dump_missing_is_finding_one(tmp_path):
    """Rank 1's dump missing, rank 0 in all_reduce #7 and not through it (dumped before gloo
    retired it): the group's verdict is a hang, finding 1 and the decision line name rank 1
    (6cc75a5: the statement said "rank 0 entered all_reduce #7; not completed on rank 0", the
    action "every rank entered it")."""
    folder = _gloo_ddp_hang(tmp_path, ranks=(0,), retired_7=False)
    report = analyse(folder, AnalysisOptions())
    (g,) = report.runs[0].flight_recorder.groups
    line = ("rank 0 entered all_reduce #7 of process group 0 and did not complete it; rank 1 left no dump "
            "(its state is unknown)")
    assert (g.verdict, g.statement, g.missing_dumps) == ("collective_hang", line, [1])
    screen = "\n".join(markdown.first_screen(report))
    assert f"**Decision:** No decision: ddp hung: {line} (see Hangs)." in screen
    assert (f"1. hang (the run does not finish): ddp hung in process group 0 (default_pg); evidence: "
            f"process group 0: last collective every dumped rank completed 6; cause: {line}; try: look at "
            "what rank 1 did (no Flight Recorder dump: its log, whether it died or hung before dumping): "
            "a dumped rank entered the collective and did not complete it") in screen


def test_a_gloo_collective_ended_with_a_dump_missing_is_not_called_completed(tmp_path):
    """Rank 1's dump missing, rank 0's all_reduce #7 retired: gloo retires a failed collective
    as a completed one, so only rank 1's dump could tell which -- no verdict, and the line says
    "ended", never "completed" (6cc75a5: "rank 0 completed all_reduce #7")."""
    folder = _gloo_ddp_hang(tmp_path, ranks=(0,))
    fr = frdump.flight_recorder(sorted(folder.iterdir()), 2)
    (g,) = fr.groups
    assert g.verdict == ""
    assert g.summary == ("process group 0: rank 0 ended all_reduce #7 (completed, or failed: gloo records both "
                         "alike); rank 1: no dump (unknown)")


def test_a_hang_whose_missing_rank_left_a_pickle_says_so(tmp_path):
    """The same hang, rank 1's dump a pickle beside rank 0's JSON: the statement names the
    pickle, never "left no dump"."""
    folder = _gloo_ddp_hang(tmp_path, ranks=(0,), retired_7=False)
    fr = frdump.flight_recorder(sorted(folder.iterdir()), 2, pickles=[folder / "nccl_trace_rank_1"])
    (g,) = fr.groups
    assert g.statement == ("rank 0 entered all_reduce #7 of process group 0 and did not complete it; rank 1: "
                           "its dump is a pickle (not read; its state is unknown)")
