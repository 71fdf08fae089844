"""What a hostile input may make the analyzer allocate (issue 33 item 8): the default trace cap
follows the machine's memory and the number of decoding processes, gunzipped JSON is held once,
and a Dask worker reads with the client's cap.

Oracles: the cap rule is computed by hand from a memory size the test sets; the memory a
decompress takes is the peak RSS of a fresh interpreter (``ru_maxrss``), run under an address
space limit so that a regression cannot take the machine; the worker's environment is emptied
by the test."""

from __future__ import annotations

import gzip
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from analyzer.contract.errors import BadInput
from analyzer.ingest import decode, pipeline, pool
from tests.merge.builders import gloo_rank, write

GiB, MiB = 1 << 30, 1 << 20


def test_default_cap_is_a_share_of_memory_per_decoding_process(monkeypatch):
    monkeypatch.delenv(decode.MAX_TRACE_ENV, raising=False)
    monkeypatch.setattr(decode, "memory_bytes", lambda: 10 * GiB)
    assert decode.default_max_trace_bytes(1) == GiB  # 10 GiB / (10 x 1)
    assert decode.default_max_trace_bytes(2) == 512 * MiB
    assert decode.max_trace_bytes(2) == 512 * MiB
    monkeypatch.setattr(decode, "memory_bytes", lambda: 1024 * GiB)
    assert decode.default_max_trace_bytes(1) == decode.DEFAULT_MAX_TRACE_BYTES  # 8 GiB at most
    monkeypatch.setattr(decode, "memory_bytes", lambda: 128 * MiB)
    assert decode.default_max_trace_bytes(8) == decode.MIN_DEFAULT_MAX_TRACE_BYTES
    monkeypatch.setenv(decode.MAX_TRACE_ENV, str(3 * GiB))  # the user's word wins
    assert decode.max_trace_bytes(8) == 3 * GiB


def test_the_machine_default_is_below_its_memory():
    mem = decode.memory_bytes()
    if not mem:
        pytest.skip("memory size not readable here")
    assert decode.default_max_trace_bytes(1) <= max(mem // 10, decode.MIN_DEFAULT_MAX_TRACE_BYTES)


@pytest.mark.integration
def test_decompress_holds_the_json_once():
    # 192 MiB of JSON blanks from a few hundred KB: the peak must stay near one copy (the
    # chunks and their join would be two), under a 1 GiB address-space limit
    code = textwrap.dedent("""
        import resource, zlib
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from analyzer.ingest import decode
        n, block = 192 << 20, b" " * (1 << 20)
        z = zlib.compressobj(6, wbits=31)  # built a MiB at a time: the peak is decompress's
        bomb = b"".join([z.compress(block) for _ in range(n >> 20)] + [z.flush()])
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        out = decode.decompress(bomb, "bomb.json.gz", max_bytes=1 << 30)
        assert len(out) == n
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / n)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert float(proc.stdout) < 1.4, proc.stdout  # ~1.1 streamed; ~2.0 with a join


def test_dask_worker_reads_with_the_clients_cap(tmp_path, monkeypatch):
    folder = tmp_path / "job"
    write(folder / "rank0.json", gloo_rank(0, 2, offset_us=0.0, ends_us=[600.0, 1600.0]))
    (folder / "rank1.json.gz").write_bytes(gzip.compress(b" " * (1 << 20)))  # 1 MiB of blanks
    monkeypatch.setenv(decode.MAX_TRACE_ENV, str(256 << 10))  # the client's cap

    def remote(fn, items, keep):  # a worker: the task pickled, run without the client's env
        fn = pickle.loads(pickle.dumps(fn))
        with monkeypatch.context() as m:
            m.delenv(decode.MAX_TRACE_ENV)
            return [keep(fn(x)) for x in items]

    pool.push_map(remote)
    try:
        ok, bad = pipeline.parse_files(sorted(folder.iterdir()), 1)
    finally:
        pool.pop_map(remote)
    assert len(ok) == 1 and len(bad) == 1
    assert isinstance(bad[0], BadInput) and bad[0].reason == "too_large", bad[0]
    assert "262,144 bytes" in bad[0].one_line()


def _merge_job(folder):
    for r in (0, 1):
        write(folder / f"rank{r}.json", gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0]))
    return folder


def test_merge_without_the_memory_it_needs_is_refused_before_reading(tmp_path, monkeypatch):
    from analyzer.timeline import merge
    from tests.inputs import bad_input, cli

    folder = _merge_job(tmp_path / "job")
    size = max(p.stat().st_size for p in folder.iterdir())
    read: list = []
    monkeypatch.setattr(merge.pipeline, "load_run", lambda *a, **k: read.append(1))
    monkeypatch.setattr(merge, "available_memory_bytes", lambda: 10 * size - 1)
    line = bad_input(cli("merge", str(folder), "-o", str(tmp_path / "m.json")), "rank",
                     "needs about", "to merge", "free")
    assert not read and not (tmp_path / "m.json").exists(), line


def test_merge_running_out_of_memory_is_one_line(tmp_path, monkeypatch):
    from analyzer.timeline import merge
    from tests.inputs import bad_input, cli

    folder = _merge_job(tmp_path / "job")

    def no_memory(rt):
        raise MemoryError

    monkeypatch.setattr(merge, "_read_rank", no_memory)
    bad_input(cli("merge", str(folder), "-o", str(tmp_path / "m.json")), "job",
              "merge ran out of memory", "more free memory")
    assert not (tmp_path / "m.json").exists()


@pytest.mark.integration
def test_a_trace_that_runs_out_of_memory_is_one_line(tmp_path):
    # issue 43 R7: under an address-space limit, a gzip bomb of dense events under the cap
    # was "internal error: MemoryError"; now one line naming the file and the cap, exit 2
    import resource
    import zlib

    ev = b'{"ph":"X","cat":"cpu_op","name":"aten::mm","ts":1,"dur":1,"pid":1,"tid":1},'
    z = zlib.compressobj(6, wbits=31)
    block = ev * 10_000
    parts = [z.compress(b'{"traceEvents":[')]
    parts += [z.compress(block) for _ in range((200 << 20) // len(block))]  # 200 MB of JSON
    parts += [z.compress(ev.rstrip(b",") + b"]}"), z.flush()]
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "rank0.json.gz").write_bytes(b"".join(parts))
    limit = 1_400 << 20  # the analyzer's imports fit; this trace's decode (~1.8 GB) does not

    def cap_memory():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run([sys.executable, "-m", "analyzer", "summary", str(tmp_path / "job")],
                          capture_output=True, text=True, preexec_fn=cap_memory, timeout=300,
                          env={**os.environ, decode.MAX_TRACE_ENV: str(8 << 30)})
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and "internal error" not in lines[0], proc.stderr[-2000:]
    assert "rank0.json.gz" in lines[0] and decode.MAX_TRACE_ENV in lines[0], lines[0]
    assert "out of memory" in lines[0], lines[0]
