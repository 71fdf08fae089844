"""The analyzer's fast paths give what the general paths (or an exact oracle) give (issue 6)."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer.ingest import decode
from tests.corpus import CORPUS, params

# --- exact µs text -> int64 ns ------------------------------------------------------------

# non-negative decimals with 0-3 decimals, up to the largest value int64 ns holds
plain = st.builds(lambda i, f, d: f"{i}.{str(f).zfill(3)[:d]}" if d else str(i),
                  st.integers(0, decode._MAX_US - 1), st.integers(0, 999), st.integers(0, 3))


def _oracle_ns(token: str) -> int:
    """Exact value in ns, rounded half up (the parser's contract), from Python's Decimal."""
    v = Decimal(token) * 1000
    return int(v.to_integral_value(rounding="ROUND_HALF_UP"))


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.lists(plain, min_size=1, max_size=40))
def test_arrow_path_is_exact_on_plain_decimals(tokens):
    blob = b"\x00" + b"\x00".join(t.encode() for t in tokens)
    got = decode._parse_decimal_arrow(blob, len(tokens))
    assert got is not None
    assert got.tolist() == [_oracle_ns(t) for t in tokens]


@pytest.mark.parametrize("token", ["1.2345", "0.0005", "-1", "1e3", "1E3", "+5", "null",
                                   '"5"', "", " 1", "1 ", "99999999999999999999999"])
def test_arrow_path_declines_what_needs_the_general_parser(token):
    blob = b"\x00" + b"\x00".join([b"1.5", token.encode()])
    assert decode._parse_decimal_arrow(blob, 2) is None


@pytest.mark.parametrize("token", ["-1", "1e3", "+5", "null", "", "99999999999999999999999",
                                   str(decode._MAX_US + 1)])
def test_whole_microsecond_path_declines_the_same(token):
    blob = b"\x00" + b"\x00".join([b"15", token.encode()])
    assert decode._parse_decimal_arrow(blob, 2) is None
    assert decode._parse_decimal_arrow(b"\x0015\x00" + str(decode._MAX_US).encode(), 2
                                       ).tolist() == [15_000, decode._MAX_US * 1000]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.lists(st.one_of(plain, st.sampled_from(["1.2345", "0.0005", "7.99995", "null",
                                                  "-3", "2.5e1", '"x"'])),
                min_size=1, max_size=30))
def test_parse_decimal_ns_matches_the_oracle_whichever_path(tokens):
    values, ok = decode.parse_decimal_ns([msgspec.Raw(t.encode()) for t in tokens])
    for t, v, good in zip(tokens, values.tolist(), ok.tolist()):
        if t in ("null", "-3", '"x"'):
            assert not good
        elif "e" in t:
            assert good and v == round(float(t) * 1000)
        else:
            assert good and v == _oracle_ns(t), t


# --- decoded table: order and codes --------------------------------------------------------

def _trace(events: list[dict]) -> bytes:
    return json.dumps({"traceEvents": events}).encode()


def test_rows_sorted_by_start_longest_first_and_categories_in_file_order():
    ev = [
        {"ph": "X", "name": "b", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": 5, "dur": 1},
        {"ph": "X", "name": "a", "cat": "cpu_op", "pid": "1", "tid": 2, "ts": 5, "dur": 3},
        {"ph": "X", "name": "c", "cat": "kernel", "pid": 0, "tid": "stream 7", "ts": 1, "dur": 1,
         "args": {"correlation": 4, "External id": 9}},
        {"ph": "X", "name": "b", "cat": "cpu_op", "pid": 1, "tid": 2, "ts": "bad", "dur": 1},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "main"}},
    ]
    df = decode.decode_bytes(_trace(ev)).events
    assert df["name"].tolist() == ["c", "a", "b"]  # by ts, then the longer first
    assert list(df["name"].cat.categories) == ["b", "a", "c"]  # first use in the file
    assert list(df["pid"].cat.categories) == ["1", "0"]  # 1 and "1" are one pid
    assert df["thread_name"].tolist() == ["", "main", "main"]
    assert df[["correlation", "external_id", "stream"]].iloc[0].tolist() == [4, 9, 7]
    assert df["external_id"].tolist()[1:] == [-1, -1]


def test_lower_case_external_id_only_when_the_capitalised_one_is_absent():
    ev = [{"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
           "args": {"external id": 5}},
          {"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 2, "dur": 1,
           "args": {"external id": 5, "External id": 6}},
          {"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 3, "dur": 1,
           "args": {"External id": None, "external id": 8}}]
    df = decode.decode_bytes(_trace(ev)).events
    assert df["external_id"].tolist() == [5, 6, 8]


def test_the_decode_says_whether_memory_events_will_find_any():
    """decode_bytes' flag is True whenever memory_events finds [memory] events (rank_tables reads
    the bytes again only then), whatever their phase, in every decoder; False when the name
    appears only inside another string."""
    args = {"Device Type": 1, "Device Id": 0, "Total Allocated": 64, "Bytes": 64}
    x = {"ph": "X", "name": "[memory]", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
         "args": args}
    inst = [{"ph": ph, "name": "[memory]", "pid": 1, "tid": 1, "ts": 2 + i, "args": args}
            for i, ph in enumerate("iIRn")]
    other = {"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 5, "dur": 1,
             "args": {"note": "[memory]"}}
    lenient = {"ph": "X", "name": 7, "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}
    meta = {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}}
    for events, n_mem in (([other], 0), ([x, other], 1), ([other, *inst], 4), ([other, inst[2]], 1),
                          ([meta, other, inst[3], lenient], 1), ([meta, other, lenient], 0)):
        data = _trace(events)
        for name, dec in _tables_by_each_decoder(data):
            assert dec.memory_events == (n_mem > 0), (name, events)
        assert len(decode.memory_events(data)[0]) == n_mem
    assert decode.decode_bytes(_trace([meta, other, lenient])).events["thread_name"].tolist() == [
        "main", "main"]


def test_ids_beyond_int64_are_unknown():
    ev = [{"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1,
           "args": {"External id": 2**64 - 1, "correlation": 3}}]
    df = decode.decode_bytes(_trace(ev)).events
    assert df[["external_id", "correlation"]].iloc[0].tolist() == [-1, 3]


# --- the three decoders agree ---------------------------------------------------------------

CORPUS_TRACES = sorted(p for p in CORPUS.glob("**/*.json*") if "manifest" not in p.name)


def _tables_by_each_decoder(data: bytes) -> list[tuple[str, decode.Decoded]]:
    """The decoded table from each decoder that accepts ``data``: whole-µs, raw times, and the
    lenient one (which accepts every trace)."""
    out = []
    for name, dec in (("whole_us", decode._TYPED[0]), ("raw_times", decode._TYPED[1]),
                      ("lenient", decode._LENIENT)):
        try:
            trace = dec.decode(data)
        except msgspec.ValidationError:
            continue
        out.append((name, decode.columns(decode._parsed(trace, data, "t"), "t")))
    return out


def _same(a: decode.Decoded, b: decode.Decoded) -> None:
    import pandas as pd

    pd.testing.assert_frame_equal(a.events, b.events)
    assert (a.warnings, a.distributed_info, a.memory_events) == (
        b.warnings, b.distributed_info, b.memory_events)


@pytest.mark.integration
@pytest.mark.parametrize("path", params([pytest.param(p, id=p.name) for p in CORPUS_TRACES]))
def test_every_decoder_that_accepts_a_corpus_trace_gives_the_same_table(path):
    data = decode.decompress(path.read_bytes(), path)
    tables = _tables_by_each_decoder(data)
    names = [n for n, _ in tables]
    assert "raw_times" in names and "lenient" in names
    if b'"ts": 1.' not in data and names[0] == "whole_us":  # an integer trace: three agree
        assert len(tables) == 3
    for _, t in tables[1:]:
        _same(tables[0][1], t)
    _same(decode.decode_bytes(data, "t"), tables[0][1])  # decode_bytes takes the first


def _x(**kw) -> dict:
    return {"ph": "X", "name": "k", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": 1, "dur": 1, **kw}


@pytest.mark.parametrize("events, first", [
    ([_x(), _x(ts=2)], "whole_us"),
    ([_x(), _x(ts=2.5)], "raw_times"),  # a decimal time
    ([_x(), _x(dur=-1)], "raw_times"),  # out of range: skipped by the general parser
    ([_x(), _x(ts=decode._MAX_US + 1)], "raw_times"),
    ([_x(), _x(ts=2**64 + 1)], "raw_times"),
    ([_x(), _x(ts=None)], "raw_times"),
    ([_x(), {**_x(), "ph": "Z"}], "lenient"),  # a phase the format does not define
    ([_x(), _x(name=5)], "lenient"),
    ([_x(), {"name": "k", "ts": 3}], "lenient"),  # no phase at all
])
def test_each_trace_goes_to_the_first_decoder_that_accepts_it_and_all_agree(events, first):
    data = _trace(events + [{"ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 1, "cat": "ac2g"},
                            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1,
                             "args": {"name": "main"}}])
    tables = _tables_by_each_decoder(data)
    assert tables[0][0] == first
    for _, t in tables[1:]:
        _same(tables[0][1], t)
    dec = decode.decode_bytes(data, "t")
    _same(dec, tables[0][1])
    assert dec.events["thread_name"].tolist()[0] == "main"


def test_events_with_no_or_an_unknown_phase_are_counted():
    ev = [_x(), {**_x(), "ph": "Z"}, {k: v for k, v in _x().items() if k != "ph"},
          {**_x(), "ph": 5}, {"ph": "f", "id": 1, "ts": 1}]
    dec = decode.decode_bytes(_trace(ev), "t.json")
    assert len(dec.events) == 1
    assert [w for w in dec.warnings if "phase" in w] == [
        't.json: skipped 3 events with no or an unknown phase ("ph"), which the Chrome trace '
        "format does not define"]


_SEEN: list[str] = []


def _record_name(path: Path) -> str:
    _SEEN.append(path.name)
    return path.name


def test_files_are_parsed_largest_first_and_returned_in_input_order(tmp_path):
    from analyzer.ingest.pipeline import parse_files

    sizes = {"a.json": 10, "b.json": 30, "c.json": 20, "missing.json": None}
    paths = []
    for name, size in sizes.items():
        if size is not None:
            (tmp_path / name).write_bytes(b" " * size)
        paths.append(tmp_path / name)
    _SEEN.clear()
    ok, bad = parse_files(paths, 1, worker=_record_name)
    assert _SEEN == ["b.json", "c.json", "a.json", "missing.json"]
    assert ok == ["a.json", "b.json", "c.json", "missing.json"] and bad == []


@pytest.mark.parametrize("times", ["whole_us", "decimal"])
def test_the_json_is_freed_before_the_full_columns_are_built(monkeypatch, times):
    """Raw JSON values (times, shapes, process group ranks, other phases' names) point into the
    trace's bytes: once the caller drops them (``Parsed.json``), the last one is gone before the
    columns of every row are built, so a rank's peak memory holds the JSON or its columns,
    never both."""
    import sys

    t = (lambda us: us) if times == "whole_us" else (lambda us: us + 0.5)
    events = [{"ph": "X", "name": "aten::mm", "cat": "cpu_op", "pid": 1, "tid": 1, "ts": t(1),
               "dur": t(3), "args": {"Input Dims": [[2, 2]], "Input type": ["float"]}},
              {"ph": "X", "name": "nccl:all_reduce", "cat": "cpu_op", "pid": 1, "tid": 1,
               "ts": t(5), "dur": t(2), "args": {"Process Group Ranks": [0, 1],
                                                 "Input Dims": [[4]], "Comms Id": 7}},
              {"ph": "f", "name": "flow", "pid": 1, "tid": 1, "ts": t(6), "id": 1},
              {"ph": "i", "name": "mark", "pid": 1, "tid": 1, "ts": t(7)}]
    data = _trace(events)
    refs = []
    spread = decode._spread
    monkeypatch.setattr(decode, "_spread", lambda *a: (refs.append(sys.getrefcount(data)),
                                                       spread(*a))[1])
    parsed = decode.parse(data, "t")
    assert sys.getrefcount(data) > 3  # the caller's, parsed.json's, the raw values'
    parsed.json = None
    dec = decode.columns(parsed, "t")
    assert refs == [2]  # this test's name for it (and getrefcount's argument) alone
    assert dec.events["shape_numel"].tolist() == [-1, 4]
    assert dec.events["pg_ranks"].isna().tolist() == [True, False]
    assert dec.events["pg_ranks"].iat[1] == "[0, 1]"
