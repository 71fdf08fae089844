"""torch.compile's events on a CPU rank (issue 45): classified as computation, with the collective
inside a compiled backward still found. Fixture fixtures/core/compiled_cpu_rules.json (µs), the
names torch 2.13 writes (analyzer/ingest/classify.py ``COMPILED_RE``): the dynamo frame, the
AOTAutograd function and its backward, inductor's graph call (a user annotation) and a profiled
inductor kernel; an extern aten::mm inside; an all_reduce enqueued inside the compiled backward.
"""

from __future__ import annotations

from analyzer.api import load_events, load_tables

US = 1000


def test_compiled_regions_and_inductor_kernels_are_compute(fixture_copy):
    events, _ = load_events(fixture_copy("compiled_cpu_rules.json"))
    rules = dict(zip(events["name"], events["rule"]))
    roles = dict(zip(events["name"], events["role"]))
    for name in ("Torch-Compiled Region: 0/2", "CompiledFunction", "## Call CompiledFxGraph fabc123 ##",
                 "graph_4_cpp_fused_add_native_layer_norm_0", "CompiledFunctionBackward",
                 "autograd::engine::evaluate_function: CompiledFunctionBackward"):
        assert (rules[name], roles[name]) == ("cpu.compiled_region", "compute"), name
    assert (rules["aten::mm"], roles["aten::mm"]) == ("cpu.main_thread_op", "compute")
    assert roles["c10d::allreduce_"] == "comm_enqueue" and roles["gloo:all_reduce"] == "comm"


def test_collective_inside_compiled_backward_found_and_breakdown(fixture_copy):
    ts = load_tables(fixture_copy("compiled_cpu_rules.json"))
    b = ts.breakdown.iloc[0]
    # K = [10,90) ∪ [100,160) ∪ [170,180), less the c10d span [120,125) and the wait for the
    # all_reduce [125,146) (the compiled backward encloses it) = 80 + 20 + 14 + 10 = 124
    assert b["compute_ns"] == 124 * US
    assert b["comm_ns"] == 20 * US  # gloo:all_reduce [126,146)
    # kernels: the ops that enclose no other compute op -- the profiled inductor kernel, the
    # extern aten::mm, the compiled backward (no profiled kernel inside it here), aten::add_
    assert b["compute_kernels"] == 4
    c = ts.collectives
    assert list(c["kind"]) == ["all_reduce"] and list(c["rule"]) == ["cpu.gloo_op.paired"]
