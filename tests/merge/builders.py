"""Hand-built Chrome traces with exact answers, shared by the merge tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from tests.corpus import CORPUS

DLRM = CORPUS / "dlrm_ddp_8rank_v100"


def meta(pid, tid, kind, **args):
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args}


def x(name, ts, dur, *, pid=100, tid=100, cat="cpu_op", **args):
    ev = {"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        ev["args"] = args
    return ev


def named(events, pid=100, tids=(100,)):
    """``events`` plus process/thread name metadata for ``pid`` / ``tids``."""
    head = [meta(pid, 0, "process_name", name="python3")]
    head += [meta(pid, t, "thread_name", name=f"thread {t} (python3)") for t in tids]
    return head + list(events)


def gloo_rank(rank: int, world: int, *, offset_us: float, ends_us: list[float], step_len_us: float = 1000.0,
              extra: list | None = None) -> dict:
    """One rank of a synthetic gloo job on a clock that runs ``offset_us`` ahead of true time.

    Step k (ProfilerStep#k) spans true time [k*step_len, (k+1)*step_len). In step k the main
    thread enqueues c10d::allreduce_ and the gloo thread runs gloo:all_reduce from true time
    k*step_len + 100 to ``ends_us[k]`` (true time, so the test controls the jitter).
    """
    pid, main, gloo = 1000 + rank, 1000 + rank, 2000 + rank
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          meta(pid, gloo, "thread_name", name=f"thread {gloo} (pt_gloo_runloop)")]
    for k, end in enumerate(ends_us):
        t = k * step_len_us + offset_us
        ev.append(x(f"ProfilerStep#{k}", t, step_len_us - 1, pid=pid, tid=main, cat="user_annotation"))
        ev.append(x("aten::mm", t + 10, 50, pid=pid, tid=main))
        ev.append(x("c10d::allreduce_", t + 90, 5, pid=pid, tid=main))
        start = t + 100
        ev.append(x("gloo:all_reduce", start, end + offset_us - start, pid=pid, tid=gloo))
    ev += extra or []
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": world,
                                "pg_count": 1, "pg_config": [{"pg_name": "0", "pg_size": world,
                                                               "ranks": list(range(world))}]}}


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = json.dumps(data).encode()
    path.write_bytes(gzip.compress(raw) if path.name.endswith(".gz") else raw)
    return path


def read(path: Path):
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)


def hta_trace_facts(trace_files: dict[int, str], trace_dir: str, **kwargs) -> dict:
    """HTA's ``TraceAnalysis`` on ``trace_files`` in a child process (HTA parses with a fork
    pool: forked from the test process, which holds other tests' threads, a child can deadlock
    on a lock one of them held, and the test would wait for ever). Returns, per rank, the pids
    of its trace and the names of its events (HTA's symbol table applied). Raises
    ``AssertionError`` with the child's stderr when HTA fails."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "files, trace_dir, kwargs = json.loads(sys.argv[1])\n"
        "t = TraceAnalysis(trace_files={int(k): v for k, v in files.items()}, trace_dir=trace_dir, **kwargs)\n"
        "names = t.t.symbol_table.get_sym_table()\n"
        "out = {}\n"
        "for r in t.t.traces:\n"
        "    df = t.t.get_trace(r)\n"
        "    out[r] = {'pids': sorted(int(p) for p in df['pid'].unique()),\n"
        "              'names': [names[i] for i in df['name'].tolist()]}\n"
        "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps([trace_files, trace_dir, kwargs])],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {int(k): v for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
