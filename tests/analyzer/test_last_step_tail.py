"""The last step's tail (analyzer/analyses/breakdown.py ``last_step_tail_ns``): the idle of a
GPU rank's last profiled step after its last device work, which the step rule
(analyzer/ingest/steps.py rule 4) infers and HTA / TraceLens do not count. It is shown beside
the idle in the per-rank table, and no host_bound finding rests on it alone.

A 2-rank job, hand-built (times in ms; the analyzer works in ns). Each rank: ProfilerStep#1
[0, 100), ProfilerStep#2 [100, 200); a kernel launched at 1 ms and one at 101 ms.

  rank 0: kernels [2, 101) and [102, 201)
          windows [2, 102) (idle 1) and, the last, [102, 102 + 100) (idle 1: 201 -> 202)
          idle per step (1 + 1) / 2 = 1 ms; tail 1 ms
  rank 1: kernels [2, 101) and [102, 112)
          windows [2, 102) (idle 1) and [102, 202) (idle 90: 112 -> 202)
          idle per step (1 + 90) / 2 = 45.5 ms; compute (99 + 10) / 2 = 54.5 ms; tail 90 ms

host_bound on 18fb8ff: mean idle (1 + 45.5) / 2 = 23.25 ms >= 0.2 x 100 ms: fired, although
all but 1 ms per rank is rank 1's tail (and 1 ms of rank 0's). Less the tails: idle per step
(2 - 1) / 2 = 0.5 and (91 - 90) / 2 = 0.5 ms, steps (200 - 1) / 2 = 99.5 and (200 - 90) / 2 =
55 ms: 0.5 < 0.2 x 77.25, no finding.
"""

from __future__ import annotations

import json

from analyzer.compare.runs import analyse
from reports import html, markdown

MS = 1000  # µs per ms, the trace's unit


def _x(cat, name, ts_ms, dur_ms, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts_ms * MS,
            "dur": dur_ms * MS, "args": args}


def _rank(path, rank, second_kernel_ms, first_kernel_ms=99):
    events = []
    for k, t0 in ((1, 0), (2, 100)):
        corr = 10 * k + rank
        events += [
            _x("user_annotation", f"ProfilerStep#{k}", t0, 100, 100, 1),
            _x("cuda_runtime", "cudaLaunchKernel", t0 + 1, 0.5, 100, 1, correlation=corr),
            _x("kernel", "void gemm_kernel", t0 + 2, first_kernel_ms if k == 1 else second_kernel_ms, 0, 7,
               device=0, stream=7, correlation=corr)]
    path.write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {
        "backend": "nccl", "rank": rank, "world_size": 2}, "traceEvents": events}))


def _job(tmp_path, first_kernel_ms=99):
    job = tmp_path / "tail_job"
    job.mkdir()
    _rank(job / "rank0.trace.json", 0, 99, first_kernel_ms)
    _rank(job / "rank1.trace.json", 1, 10, first_kernel_ms)
    return job


def test_last_step_tail_is_the_idle_after_the_last_device_work(tmp_path):
    report = analyse(_job(tmp_path))
    ranks = {k.rank: k for k in report.runs[0].ranks}
    assert ranks[0].last_step_tail_ns == 1_000_000
    assert ranks[1].last_step_tail_ns == 90_000_000
    assert ranks[1].idle_ns == 45_500_000  # the tail is part of the idle


def test_rank_table_shows_the_tail_beside_the_idle(tmp_path):
    md = markdown.render(analyse(_job(tmp_path)))
    assert "| idle | of which last step's tail | clock offset |" in md
    assert ("| tail_job | 1 | 54.50 ms | 0.00 ms | 0.00 ms | - | 0.00 ms (0.0 %) | 0.00 ms "
            "| 45.50 ms | 45.00 ms (90.00 ms in the last step) | - |") in md.splitlines()


def test_html_rank_table_shows_the_tail_and_defines_it(tmp_path):
    page = html.render(analyse(_job(tmp_path)))
    assert "<td>45.00 ms (90.00 ms in the last step)</td>" in page
    assert "No finding rests on it alone." in page


def test_host_bound_does_not_fire_on_the_tail_alone(tmp_path):
    report = analyse(_job(tmp_path))
    assert [f.kind for f in report.findings if f.kind == "host_bound"] == []


def test_host_bound_still_fires_on_idle_between_device_work(tmp_path):
    # step 1's kernels [2, 52): step 1's idle is 50 ms on both ranks. Less the tails: idle per
    # step (50 + 1 - 1) / 2 = 25 ms on rank 0, (50 + 90 - 90) / 2 = 25 ms on rank 1; steps
    # (200 - 1) / 2 = 99.5 and (200 - 90) / 2 = 55 ms: 25 >= 0.2 x 77.25; rank 1 has the
    # largest share (25 / 55)
    report = analyse(_job(tmp_path, first_kernel_ms=50))
    (host,) = [f for f in report.findings if f.kind == "host_bound"]
    assert host.ranks == [1] and host.severity_ns == 25_000_000
    assert [e.value for e in host.evidence if e.path.endswith("last_step_tail_ns")] == [
        90_000_000, 1_000_000]
