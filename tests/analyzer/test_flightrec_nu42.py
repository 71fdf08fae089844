"""Flight Recorder defects a new user found (issue 42, nu42): a pickled dump beside the JSON
ones is named, a gloo collective that failed is not "completed", a hang with one rank's dump
missing still gets a verdict, a truncated dump says what to do."""

from __future__ import annotations

import pickle

import pytest

from analyzer.compare.runs import analyse
from analyzer.contract.report_types import AnalysisOptions
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
