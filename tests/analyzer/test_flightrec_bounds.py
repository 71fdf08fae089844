"""Crafted Flight Recorder dumps cost no more than a dump of the job can (issue 43 R4): a rank
beyond the job's world size (from the file name), a ranks string no group can spell, ranks
strings that made ``ast.literal_eval`` run out of parser stack or recursion, and nesting deeper
than any dump's are refused or set aside before anything is allocated for them.

Oracles: the world size is the one the test passes (a manifest's or a trace's); the ranks a
group holds are written by the test; a real dump's nesting is a few levels (torch's schema:
entries -> entry -> input_sizes -> sizes)."""

from __future__ import annotations

import json

import pytest

from analyzer.analyses import flightrec
from analyzer.contract.errors import BadInput
from analyzer.ingest import distinfo, frdump
from tests.analyzer.test_flightrec import dump, entry, write_dumps


def test_a_rank_beyond_the_world_is_refused_from_its_name(tmp_path):
    (p,) = write_dumps(tmp_path, {999_999_999: dump([entry(1)])}, name="fr_rank{}.json")
    with pytest.raises(BadInput) as exc:
        frdump.read_dumps([p], world_size=2)
    assert exc.value.reason == "rank_out_of_range" and str(p) in str(exc.value)
    assert "rank 999999999, but the job's world size is 2" in str(exc.value)
    with pytest.raises(BadInput) as exc:  # no world size stated: the documented maximum
        frdump.flight_recorder([p], 2, world_stated=False)
    assert exc.value.reason == "rank_out_of_range" and "MAX_WORLD_SIZE" in str(exc.value)


def test_the_rank_bound_admits_every_rank_of_the_world(tmp_path):
    paths = write_dumps(tmp_path, {0: dump([entry(1)]), 3: dump([entry(1)])}, name="fr_rank{}.json")
    fr = frdump.flight_recorder(paths, 4)
    (g,) = fr.groups
    assert (g.ranks, g.missing_dumps) == ([0, 1, 2, 3], [1, 2])
    # world inferred from the traces' ranks (not stated): a dump may name a rank beyond it
    (g,) = frdump.flight_recorder(paths, 2, world_stated=False).groups
    assert g.ranks == [0, 1, 2, 3]


@pytest.mark.parametrize("ranks", ["-" * 100_000 + "1",  # literal_eval: MemoryError (parser stack)
                                   "-" * 5_000 + "1",  # literal_eval: RecursionError
                                   "[" * 100_000 + "]" * 100_000,
                                   "[" + ", ".join(["1"] * 400_000) + "]",  # more ranks than the world
                                   "[0, 1, 7]", "[0, -1]", "(0, 1)", "[1e9]", "all"])
def test_a_ranks_string_no_group_of_the_job_spells_is_unknown(tmp_path, ranks):
    d = dump([entry(1)])
    d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    paths = write_dumps(tmp_path, {0: d, 1: d}, name="fr_rank{}.json")
    (p0, _) = paths
    assert frdump.read_dump(p0, 2).pg_config["0"].ranks == ([0, 1] if ranks == "all" else [])
    fr = frdump.flight_recorder(paths, 2)
    (g,) = fr.groups
    assert (g.ranks, g.ranks_source) == ([0, 1], "pg_config" if ranks == "all" else "world")
    said = [f"{p}: process group 0's pg_config ranks are not a group of a job of 2 ranks; set aside"
            for p in paths]
    assert fr.notes == ([] if ranks == "all" else said)  # never the value itself


def test_the_bounded_parser_reads_what_torch_and_the_tracer_write():
    assert distinfo.ranks("[0, 1, 2, 3]", 4, most=4) == (0, 1, 2, 3)
    assert distinfo.ranks([2, 3], 4, most=4) == (2, 3)
    assert distinfo.ranks("[]", 4, most=4) == ()
    assert distinfo.ranks("all", 4, most=4) == (0, 1, 2, 3)
    assert distinfo.ranks("all", 10**9, most=4) is None
    longest = str(list(range(distinfo.MAX_WORLD_SIZE)))
    assert distinfo.ranks(longest, None, most=distinfo.MAX_WORLD_SIZE) == tuple(range(distinfo.MAX_WORLD_SIZE))
    # unbounded (a trace's distributedInfo, as before): unchanged
    assert distinfo.ranks("[0, -1]", None) == (0, -1)


def test_a_ranks_string_longer_than_a_group_is_never_parsed(monkeypatch):
    def parse(_):
        raise AssertionError("parsed")

    monkeypatch.setattr(distinfo.json, "loads", parse)
    assert distinfo.ranks("[" + "1, " * 1000 + "1]", 8, most=8) is None


def test_the_analysis_never_parses_a_ranks_string():
    """Only the reader parses ranks (distinfo.ranks, bounded): text left in a Dump built
    otherwise is unknown to the analysis, whatever it spells."""
    d = flightrec.Dump(entries=[flightrec.Entry(process_group=("0", "default_pg"), collective_seq_id=1,
                                                profiling_name="gloo:all_reduce")],
                       pg_config={"0": flightrec.PgConfig(name="0", ranks="-" * 5_000 + "1")}, rank=0)
    (g,) = flightrec.analyse([d], 2).groups
    assert (g.ranks, g.ranks_source) == ([0, 1], "world")


def test_nesting_deeper_than_a_dump_is_refused_naming_the_file(tmp_path):
    d = dump([entry(1)])
    text = json.dumps(d)[:-1] + ', "frames_of_nobody": ' + "[" * 200_000 + "]" * 200_000 + "}"
    p = tmp_path / "fr_rank0.json"
    p.write_text(text)
    with pytest.raises(BadInput) as exc:
        frdump.read_dump(p, 2)
    assert exc.value.reason == "bad_run_file" and str(p) in str(exc.value)
    assert "nested too deep" in str(exc.value)


def test_a_dump_that_is_not_a_regular_file_is_refused_unread(tmp_path):
    """A FIFO under a dump's name: refused by its type, never waited on. A writer keeps opening
    it meanwhile, so that a reader that does wait (a plain ``open``) fails this test rather
    than hang it."""
    import os
    import threading

    fifo = tmp_path / "fr_rank0.json"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            with open(fifo, "wb"):
                pass

    threading.Thread(target=writer, daemon=True).start()
    try:
        with pytest.raises(BadInput) as exc:
            frdump.read_dump(fifo, 2)
        assert exc.value.reason == "unreadable" and "not a regular file" in str(exc.value)
        assert not frdump.is_dump(fifo) and not frdump.is_pickle(fifo)
    finally:
        stop.set()
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))  # frees a writer waiting for a reader


def test_a_dump_over_the_cap_is_refused_by_its_size_unread(tmp_path, monkeypatch):
    p = tmp_path / "fr_rank0.json"
    with open(p, "wb") as f:
        f.write(json.dumps(dump([entry(1)])).encode())
        f.truncate(frdump.MAX_DUMP_BYTES + 1)  # sparse: no disk used
    read = []
    real = frdump._open_regular

    def spy(path):
        fh = real(path)
        orig = fh.read
        fh.read = lambda n=-1: read.append(n) or orig(n)
        return fh

    monkeypatch.setattr(frdump, "_open_regular", spy)
    with pytest.raises(BadInput) as exc:
        frdump.read_dump(p, 2)
    assert exc.value.reason == "too_large" and str(p) in str(exc.value)
    assert read == [2]  # the gzip magic alone
