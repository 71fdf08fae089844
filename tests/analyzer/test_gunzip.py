"""Gunzipping a trace (analyzer/ingest/decode.py ``decompress``): as many gzip members as a file
holds, in time linear in the file (issue 43 R6: 160k members took 18 s, 1M over 300 s).

Oracles: ``gzip.decompress`` for the bytes; for the time, the same call on N and on 4N members
measured in this test (CPU time, the best of three): linear is x4, the quadratic rest-of-file
copy per member was x16."""

from __future__ import annotations

import gzip
import pickle
import struct
import time
import zlib

import pytest

from analyzer.contract.errors import BadInput
from analyzer.ingest import decode

TRACE = b'{"traceEvents": []}'


def _members(n: int) -> bytes:
    return gzip.compress(b" ") * n + gzip.compress(TRACE)


def _cpu_s(raw: bytes) -> float:
    best = float("inf")
    for _ in range(3):
        t = time.process_time()
        out = decode.decompress(raw, "many.json.gz", max_bytes=1 << 30)
        best = min(best, time.process_time() - t)
    assert out == gzip.decompress(raw)
    return best


def test_many_gzip_members_take_linear_time():
    n = 20_000
    small, large = _cpu_s(_members(n)), _cpu_s(_members(4 * n))
    assert large < 8 * max(small, 1e-3), (small, large)  # x4 linear, x16 quadratic


def test_members_of_every_size_read_as_gzip_reads_them():
    big = bytes(range(256)) * 40_000 + b"x" * (40 << 20)  # past one piece and one output chunk
    parts = [b"", b"a", big, b"b" * 5000, big[:3000]]
    raw = b"".join(gzip.compress(p, compresslevel=1) for p in parts) + bytes(7)  # zero padding
    assert decode.decompress(raw, "x.gz", max_bytes=1 << 30) == b"".join(parts)


# --- the inflate library (issue 46): ISA-L where installed, zlib otherwise -------------------
#
# Oracles: zlib (the standard library) for the bytes and the refusal lines; gzip's trailer
# (RFC 1952 2.3.1: CRC-32, then ISIZE = the input size mod 2^32, little-endian) forged here.

def _with_zlib(monkeypatch) -> None:
    """``decode`` as on a platform where isal does not import."""
    monkeypatch.setattr(decode, "INFLATE", zlib)
    monkeypatch.setattr(decode, "_INFLATE_ERROR", zlib.error)


def _refusal(raw: bytes, cap: int) -> tuple[str, str]:
    with pytest.raises(BadInput) as exc:
        decode.decompress(raw, "t.json.gz", max_bytes=cap)
    return exc.value.reason, exc.value.one_line()


def _forged_isize(raw: bytes, isize: int) -> bytes:
    return raw[:-4] + struct.pack("<I", isize)


def test_isal_inflates_where_it_is_installed():
    pytest.importorskip("isal")
    assert decode.INFLATE.__name__ == "isal.isal_zlib"


def test_zlib_fallback_reads_the_same_bytes(monkeypatch):
    big = bytes(range(256)) * 40_000 + b"x" * (9 << 20)  # past one piece and one output chunk
    raw = gzip.compress(b"a") + gzip.compress(big, compresslevel=1) + bytes(3)
    fast = decode.decompress(raw, "x.gz", max_bytes=1 << 30)
    _with_zlib(monkeypatch)
    assert decode.decompress(raw, "x.gz", max_bytes=1 << 30) == fast == b"a" + big


def test_a_bomb_whose_trailer_claims_a_small_size_stops_at_the_cap(monkeypatch):
    # 64 MiB of zeros (64 KB on disk) whose ISIZE says 100 bytes: the cap is enforced on the
    # bytes made, never on the trailer's word (a one-shot inflate sized by it would say corrupt)
    bomb = _forged_isize(gzip.compress(bytes(64 << 20), compresslevel=9), 100)
    assert _refusal(bomb, 1 << 20)[0] == "too_large"
    _with_zlib(monkeypatch)
    assert _refusal(bomb, 1 << 20)[0] == "too_large"


def test_a_forged_trailer_under_the_cap_is_refused_as_zlib_refuses_it(monkeypatch):
    raw = gzip.compress(TRACE * 1000)
    cases = [_forged_isize(raw, len(TRACE) * 1000 + 1),  # size lies: "incorrect length check"
             raw[:-8] + struct.pack("<I", 12345) + raw[-4:],  # CRC lies: "incorrect data check"
             raw[:30] + bytes([raw[30] ^ 0xFF]) + raw[31:],  # a flipped byte in the stream
             raw[:-9],  # cut short
             b"\x1f\x8b\x09" + raw[3:]]  # an unknown compression method
    fast = [_refusal(c, 1 << 20) for c in cases]
    _with_zlib(monkeypatch)
    assert fast == [_refusal(c, 1 << 20) for c in cases]
    assert [reason for reason, _ in fast] == ["truncated"] * len(cases)
    assert fast[0][1] == ("t.json.gz: truncated or corrupt gzip (Error -3 while decompressing "
                          "data: incorrect length check); copy the trace again or re-record it")
    assert "incorrect data check" in fast[1][1]


def test_the_refusal_of_corrupt_gzip_pickles_with_its_whole_chain():
    # a worker's BadInput crosses to the parent pickled; with tblib's pickling support (which
    # dask.distributed installs on import) its __context__ chain is pickled too, and ISA-L's
    # error class (igzip_lib.IsalError) cannot be: none may be left in the chain
    raw = b"\x1f\x8b\x09" + gzip.compress(TRACE)[3:]
    with pytest.raises(BadInput) as exc:
        decode.decompress(raw, "t.json.gz", max_bytes=1 << 20)
    chain, e = [], exc.value
    while e is not None:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        assert pickle.loads(pickle.dumps(e)).args == e.args, type(e)


def test_one_call_and_chunked_inflate_agree(monkeypatch):
    # ISA-L inflates a file's first member in one call bounded by the cap, zlib in chunks
    # (decode._gunzip): the same bytes, or the same refusal, at every cap around the size
    one = gzip.compress(TRACE * 5000)
    files = [one, one + bytes(9), one + gzip.compress(b"x") + one, one[:-9], one[:-3],
             one[:40] + bytes([one[40] ^ 0xFF]) + one[41:], _forged_isize(one, 7), one + b"\x1f"]

    def results() -> list:
        out = []
        for raw in files:
            for cap in (len(TRACE) * 5000 - 1, len(TRACE) * 5000, 1 << 30):
                try:
                    out.append(decode.decompress(raw, "t.json.gz", max_bytes=cap))
                except BadInput as exc:
                    out.append((exc.reason, exc.message))
        return out
    fast = results()
    _with_zlib(monkeypatch)
    assert fast == results()
    assert fast[2 * 3 + 2] == TRACE * 5000 + b"x" + TRACE * 5000
    assert fast[0][0] == "too_large" and fast[1] == TRACE * 5000
    assert fast[3 * 3 + 2][0] == "truncated"
