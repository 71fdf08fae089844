"""Traces from exporters before kineto #1459: event names with unescaped double quotes inside
(pytorch#146900) are read with the names as written and the number of repaired strings noted;
a file broken in any other way is refused with the same one line as before; the file on disk
is never changed; a valid trace never goes through the repair."""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import time

import msgspec
import numpy as np
import pytest

from analyzer.api import load_events, load_tables
from analyzer.ingest import decode, quoterepair
from analyzer.ingest.quoterepair import repair_quotes
from tests.corpus import CORPUS
from tests.inputs import bad_input, cli

BROKEN = [  # (name as the profiler meant it, how many events carry it)
    ('torch/_dynamo/eval_frame.py("foo")(12): _fn', 2),
    ('{"device": "cpu", "dtype": "float32"}(12): run', 1),  # kineto#1459's example
    ('"""Returns "x" when y, "z" otherwise."""(3): <module>', 1),  # a docstring
    ('g("a", b")(7): h', 1),  # a quote right before a comma inside the string
    ('"', 1),
]
N_BROKEN = sum(n for _, n in BROKEN)


def _events() -> list[dict]:
    """One ProfilerStep on one thread, compute events named by ``BROKEN`` and clean ones."""
    evs = [{"ph": "M", "name": "thread_name", "pid": 7, "tid": 7, "args": {"name": "main"}},
           {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 7, "tid": 7,
            "ts": 1000, "dur": 900}]
    t = 1010
    for name, n in [*BROKEN, ("aten::mm", 2)]:
        for _ in range(n):
            evs.append({"ph": "X", "cat": "python_function", "name": name, "pid": 7, "tid": 7,
                        "ts": t, "dur": 50, "args": {"Python id": t}})
            t += 60
    return evs


def _old_exporter_text(events: list[dict], *, kineto: bool) -> bytes:
    """The trace as an exporter before kineto #1459 wrote it: every value escaped but the
    ``name``. ``kineto``: ChromeTraceLogger's layout (one event over three lines); else one
    line (Python's ``EventList.export_chrome_trace``)."""
    parts = []
    for e in events:
        head = {k: v for k, v in e.items() if k in ("ph", "cat")}
        rest = {k: v for k, v in e.items() if k not in ("ph", "cat", "name")}
        body = [json.dumps(head)[1:-1], f'"name": "{e["name"]}"', json.dumps(rest)[1:-1]]
        parts.append("{\n    " + ", ".join(body[:2]) + ",\n    " + body[2] + "\n  }" if kineto
                     else "{" + ", ".join(body) + "}")
    sep = ",\n  " if kineto else ", "
    text = '{"schemaVersion": 1, "traceEvents": [\n  ' + sep.join(parts) + "\n]}\n"
    return text.encode()


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name,kineto", [("rank0.json.gz", True), ("rank0.json", False)])
def test_names_are_the_intended_ones_and_the_count_is_noted(tmp_path, name, kineto):
    raw = _old_exporter_text(_events(), kineto=kineto)
    with pytest.raises(json.JSONDecodeError):
        json.loads(raw)  # invalid JSON, as the old exporters wrote it
    path = _write(tmp_path / "job" / name, raw)
    before = _sha(path)
    events = load_events(path)[0]
    want = sorted(n for n, k in BROKEN for _ in range(k)) + ["ProfilerStep#3"] + ["aten::mm"] * 2
    assert sorted(events["name"].astype(str)) == sorted(want)
    rank = load_tables(path.parent).ranks[0]
    notes = [w for w in rank.warnings if decode.QUOTES_NOTE in w]
    assert notes == [f"{path}: {N_BROKEN} strings repaired: {decode.QUOTES_NOTE}"]
    proc = cli("report", str(path.parent), "--out", str(tmp_path / "rep"))
    assert proc.returncode == 0, proc.stderr
    assert f"{N_BROKEN} strings repaired" in proc.stdout
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    shown = [w for run in report["runs"] for w in run["trace_info"]["trace_warnings"]]
    assert any(f"{N_BROKEN} strings repaired" in w for w in shown)
    assert _sha(path) == before  # the file is never changed


def test_one_string_is_said_in_the_singular():
    raw = b'{"traceEvents": [{"ph": "X", "name": "a"b", "ts": 1, "dur": 2}]}'
    dec = decode.decode_bytes(raw, "t.json")
    assert dec.events["name"].tolist() == ['a"b']
    assert dec.warnings == [f"t.json: 1 string repaired: {decode.QUOTES_NOTE}"]


def test_repaired_bytes_are_the_intended_json():
    events = _events()
    for kineto in (True, False):
        fixed, n = repair_quotes(_old_exporter_text(events, kineto=kineto))
        assert n == N_BROKEN
        assert json.loads(fixed)["traceEvents"] == events


def test_windows_do_not_change_the_answer(monkeypatch):
    """A string that crosses a window's end: the window grows; every window size gives the
    same bytes."""
    raw = _old_exporter_text(_events() * 20, kineto=True)
    want = repair_quotes(raw)
    for size in (64, 300, 4096):
        monkeypatch.setattr(quoterepair, "WINDOW_BYTES", size)
        assert repair_quotes(raw) == want


def _cpu_s(raw: bytes) -> tuple[float, tuple[bytes, int] | None]:
    best, got = float("inf"), None
    for _ in range(3):
        t = time.process_time()
        got = repair_quotes(raw)
        best = min(best, time.process_time() - t)
    return best, got


def test_long_blank_runs_cost_what_other_bytes_cost():
    """Blanks before a quote are crossed at numpy speed (a Python loop over them made the
    repair ~5x slower, issue 43 R9): 8 MiB of blanks before a value against a file of the same
    size whose 8 MiB are inside a name (byte by byte: ~200x; now ~3x)."""
    fill = 8 << 20
    head = b'{"traceEvents": [{"name": "f"x"(1)", "ph": "X"}, '
    blanks = head + b'{"name": "g", "ph":' + b" " * fill + b'"X"}]}'
    letters = head + b'{"name": "' + b"g" * fill + b'", "ph": "X"}]}'
    (t_blanks, fixed), (t_letters, same) = _cpu_s(blanks), _cpu_s(letters)
    assert fixed is not None and fixed[1] == 1 and same is not None and same[1] == 1
    assert json.loads(fixed[0])["traceEvents"][0]["name"] == 'f"x"(1)'
    assert t_blanks < 10 * max(t_letters, 1e-3), (t_blanks, t_letters)


def test_blank_runs_of_every_length_are_skipped_to_the_same_byte():
    data = b'[1, "a",' + b"".join(b" " * n + b'"b' + bytes([65 + n % 26]) + b'",'
                                 for n in (0, 1, 15, 16, 17, 31, 33, 4095, 4097, 70000)) + b"2]"
    full = np.frombuffer(data, np.uint8)
    ends = [m.start() for m in re.finditer(rb"[^ ]", data)]  # each side of every blank run
    pos = np.array(sorted({-1, len(data), *(p + d for p in ends for d in (-1, 1))}))
    for step in (1, -1):
        cls, at = quoterepair._skip_blanks(data, full, pos, step)
        for p, c, a in zip(pos.tolist(), cls.tolist(), at.tolist()):
            q = p
            while 0 <= q < len(data) and data[q] in b" \t\n\r":
                q += step
            assert (a, c) == (q, data[q] if 0 <= q < len(data) else 256), (p, step)


def test_escaped_quotes_and_backslashes_stay_as_they_are():
    raw = (b'{"traceEvents": [{"ph": "X", "name": "a\\"b"c\\\\", "cat": "q\\\\\\"", '
           b'"ts": 1, "dur": 2}]}')
    fixed, n = repair_quotes(raw)
    assert n == 1
    ev = json.loads(fixed)["traceEvents"][0]
    assert (ev["name"], ev["cat"]) == ('a"b"c\\', 'q\\"')


def _refusal(path) -> str:
    """The one line ``analyzer report`` gives for ``path`` (today's, with no repair)."""
    raw = path.read_bytes()
    data = gzip.decompress(raw) if path.name.endswith(".gz") else raw
    with pytest.raises(msgspec.DecodeError) as exc:
        msgspec.json.decode(data)
    return f"{path}: truncated or invalid JSON ({exc.value}); copy the trace again or re-record it"


BROKEN_OTHERWISE = {  # how the file is broken besides (or instead of) the quotes
    "truncated": lambda raw: raw[: len(raw) * 2 // 3],
    "missing_brace": lambda raw: raw.replace(b"}, {", b", {", 1),
    "missing_comma": lambda raw: raw.replace(b'"cat": "python_function", ',
                                             b'"cat": "python_function" ', 1),
}


@pytest.mark.parametrize("how", sorted(BROKEN_OTHERWISE))
@pytest.mark.parametrize("quotes", [True, False], ids=["with_quotes", "clean_names"])
def test_a_file_broken_otherwise_gets_the_same_one_line(tmp_path, how, quotes):
    events = _events() if quotes else [e for e in _events() if '"' not in e["name"]]
    raw = BROKEN_OTHERWISE[how](_old_exporter_text(events, kineto=False))
    path = _write(tmp_path / "job" / "rank0.json", raw)
    before = _sha(path)
    want = _refusal(path)
    with pytest.raises(decode.BadInput) as exc:
        decode.decode_bytes(raw, path)
    assert exc.value.one_line() == want
    line = bad_input(cli("report", str(path.parent), "--out", str(tmp_path / "rep")))
    assert line == f"analyzer: {want}"
    assert _sha(path) == before


def test_memory_events_of_a_repaired_trace_are_read(tmp_path):
    evs = _events() + [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 7,
                        "tid": 7, "ts": 1100, "s": "t",
                        "args": {"Device Type": 0, "Device Id": -1, "Bytes": 64,
                                 "Total Allocated": 4096, "Total Reserved": 8192}}]
    path = _write(tmp_path / "job" / "rank0.json", _old_exporter_text(evs, kineto=True))
    rank = load_tables(path.parent).ranks[0]
    assert not [w for w in rank.warnings if "[memory] events not read" in w]
    assert len(rank.device_memory) == 1


def test_merge_writes_the_intended_names(tmp_path):
    path = _write(tmp_path / "job" / "rank0.json", _old_exporter_text(_events(), kineto=True))
    out = tmp_path / "merged.json.gz"
    proc = cli("merge", str(path.parent), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    names = {e["name"] for e in json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
             if e.get("ph") == "X"}
    assert {n for n, _ in BROKEN} <= names


def _corpus_traces() -> list:
    return sorted(p for p in CORPUS.rglob("*") if p.name.endswith((".json", ".json.gz")))


@pytest.mark.integration
def test_valid_corpus_traces_never_go_through_the_repair():
    """Every corpus trace decodes on the strict path (no repair note, no repaired bytes), and
    the repair would find nothing to change in any of them."""
    paths = _corpus_traces()
    if not paths:
        pytest.skip("PARITYTRACE_CORPUS is not set: no corpus traces")
    for p in paths:
        data = decode.decompress(p.read_bytes(), p)
        dec = decode.decode_bytes(data, p)
        assert dec.repaired_json is None and not any(decode.QUOTES_NOTE in w
                                                     for w in dec.warnings), p
        assert repair_quotes(data) is None, p
