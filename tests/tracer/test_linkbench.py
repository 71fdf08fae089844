"""The link benchmark (tracer/linkbench.py, issue 44 Deliver 2 (c)): two gloo processes on this
machine write the link model's table form, which the analyzer reads and looks up."""

from __future__ import annotations

import pytest

from analyzer.analyses.linkmodel import KINDS, load_curves, lookup


@pytest.mark.record
def test_link_benchmark_writes_one_curve_per_kind_the_analyzer_reads(tmp_path):
    from tracer.linkbench import run_linkbench

    out = tmp_path / "links.json"
    run_linkbench(out, world=2, backend="gloo", iters=2, sizes=(1024, 4096))
    curves = load_curves(out)
    assert [(c.kind, c.group_size, c.nodes, c.dtype, [r.bytes for r in c.rows])
            for c in curves] == [(k, 2, 1, "float32", [1024, 4096]) for k in KINDS]
    assert all(c.source.startswith("link benchmark on this machine ") and "(gloo, CPU, 2 "
               "processes, median of 2 calls)" in c.source for c in curves)
    got = lookup(curves, "all_reduce", 2048, 2, 1)
    lo, hi = (r.time_ns for r in curves[0].rows)
    assert got.outside == "" and min(lo, hi) <= got.time_ns <= max(lo, hi)
