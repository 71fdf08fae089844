"""Gunzipping a trace (analyzer/ingest/decode.py ``decompress``): as many gzip members as a file
holds, in time linear in the file (issue 43 R6: 160k members took 18 s, 1M over 300 s).

Oracles: ``gzip.decompress`` for the bytes; for the time, the same call on N and on 4N members
measured in this test (CPU time, the best of three): linear is x4, the quadratic rest-of-file
copy per member was x16."""

from __future__ import annotations

import gzip
import time

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
