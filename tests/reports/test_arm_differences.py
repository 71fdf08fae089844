"""What differs between declared arms without noise (issue 42): collective calls and bytes per
step by kind and mesh dimension, memory by category where it is measurable, "not measurable on
this device" where it is not (reshard_after_forward on CPU) -- in report.json
(``ranking.differences``), in the lines for the first screen (reports/armdiff.py) and in the
decision line; and the decision's other small wordings: the repeats to record, runs of another
experiment, the memory figure named for what it is. Hand-built runs with exact answers
(constant steps: the interval collapses to the ratio)."""

from __future__ import annotations

import json

import msgspec

from analyzer.compare import ranking, stats
from analyzer.compare.runs import analyse
from analyzer.contract import schemas, strategies
from analyzer.contract.report_types import ArmDifference, CommGroup, encode
from reports import armdiff, context, markdown
from reports import memory as memory_section
from reports.decision import decision_input, decision_line
from tests.reports.builders import decision, write_categories, write_manifest, write_run

MS = 1_000_000
MiB = 2**20
RECORDED_REF = ("numerics match the reference values recorded with them (no single-device run "
                "here)")
CATS = {"parameters": 2 * MiB, "gradients": 2 * MiB, "optimizer_state": 4 * MiB,
        "activations": 1 * MiB}


def _arm(root, arm: str, steps_ms: float, settings: dict, *, exp: str = "e1",
         order=("reshard-after-forward=true", "reshard-after-forward=false"), repeats: int = 5,
         cats: dict | None = None, strategy: str = "fsdp2", **kw) -> None:
    """Run dirs ``arm.r1`` .. ``arm.r<repeats>`` of declared-arms experiment ``exp``: 2 ranks,
    three profiled steps of ``steps_ms``, memory categories ``cats`` on both ranks (CPU: the
    peak row is their sum)."""
    for k in range(1, repeats + 1):
        walls = {0: (1, 1), **{i: (int(steps_ms * MS),) * 2 for i in (1, 2, 3)}}
        write_run(root / f"{arm}.r{k}", strategy=strategy, walls=walls,
                  categories={0: cats or CATS, 1: cats or CATS},
                  options={k: v for k, v in settings.items()  # what its strategy records
                           if k in strategies.spec(strategy).options} if strategy != "ddp" else None,
                  experiment={"id": exp, "arm": arm, "repeat": k, "repeats": repeats,
                              "order": list(order), "settings": settings,
                              "baseline": "b" * 12}, **kw)


def _sweep(root) -> None:
    _arm(root, "reshard-after-forward=true", 9, {"reshard_after_forward": True})
    _arm(root, "reshard-after-forward=false", 6, {"reshard_after_forward": False})


def _groups(all_gathers: int, steps: int = 2) -> list[CommGroup]:
    """An HSDP-like run's collectives over ``steps`` profiled steps: ``all_gathers`` per step on
    each of two shard groups of 2 ranks (2.25 MiB each), 2 reduce_scatters per step on them
    (fp32 and bf16), 1 all_reduce per step on the replicate dimension."""
    def g(kind, pg, dim, per_step, nbytes, dtype="Float"):
        return CommGroup(kind=kind, pg=pg, pg_ranks="", group_size=2, dtype=dtype, n_ranks=2,
                         count=per_step * steps, time_ns=1.0, bytes=per_step * steps * nbytes,
                         unknown_bytes=0, busbw_gbps=None, mesh_dim=dim, mesh_dim_source="pg_desc")
    return [g("all_gather", pg, "shard", all_gathers, 2.25 * MiB) for pg in ("1", "2")] + [
        g("reduce_scatter", pg, "shard", 1, MiB, dtype) for pg in ("1", "2")
        for dtype in ("Float", "BFloat16")] + [g("all_reduce", "3", "replicate", 1, MiB)]


def _with_collectives(rep):
    """``rep`` as if its runs had traces: reshard_after_forward=True arms launch 4 all_gathers
    per step on each rank (2 units, gathered in forward and again in backward), False ones 2;
    ranked again."""
    runs = [msgspec.structs.replace(r, profiled_steps=2, comm_groups=_groups(
        4 if r.arm.endswith("true") else 2)) for r in rep.runs]
    return msgspec.structs.replace(rep, runs=runs, ranking=ranking.rank_runs(runs))


def test_a_reshard_sweep_on_cpu_names_what_differs_and_the_memory_it_cannot_see(tmp_path):
    """The one difference that does not depend on noise is the all_gather count; a CPU record
    sums memory categories, blind to the unsharded parameters reshard_after_forward=False
    keeps, so the decision never says "the same memory per rank"."""
    _sweep(tmp_path / "t")
    rep = _with_collectives(analyse(tmp_path / "t"))
    assert armdiff.lines(rep) == [
        "arms: fsdp2 with reshard_after_forward=True → with reshard_after_forward=False",
        "all_gather (shard): 4 → 2 calls per step, 9.0 → 4.5 MiB per step",
        "memory: not measurable on this device for reshard_after_forward (CPU records sum "
        "categories; transient unsharded parameters are not seen)"]
    assert decision(markdown.render(rep)) == (
        "fsdp2 with reshard_after_forward=False: 1.50x faster than with "
        "reshard_after_forward=True \\[1.50, 1.50\\], memory not measurable on this device for "
        f"reshard_after_forward; {RECORDED_REF}.")
    got = json.loads(encode(rep))["ranking"]["differences"]
    assert got[0] == {"what": "collective_calls", "kind": "all_gather", "mesh_dim": "shard",
                      "unit": "calls_per_step", "values": {"reshard-after-forward=true": 4.0,
                                                           "reshard-after-forward=false": 2.0},
                      "settings": [], "why": ""}
    assert got[1]["unit"] == "bytes_per_step" and list(got[1]["values"].values()) == [
        9 * MiB, 4.5 * MiB]
    assert [d["what"] for d in got] == ["collective_calls", "collective_bytes", "memory_unseen"]


def test_without_traces_only_the_memory_that_cannot_be_seen_is_said(tmp_path):
    """Runs without traces launch nothing measured: no collective row, the memory row kept."""
    _sweep(tmp_path / "t")
    rep = analyse(tmp_path / "t")
    assert rep.ranking.differences == [ArmDifference(
        what="memory_unseen", values={"reshard-after-forward=true": None,
                                      "reshard-after-forward=false": None},
        settings=["reshard_after_forward"],
        why="CPU records sum categories; transient unsharded parameters are not seen")]


def test_an_allocator_peak_is_compared_by_category(tmp_path):
    """CUDA records keep the allocator's peak: memory is measurable, each category that
    differs is given and the decision compares the peaks, no "lower bounds"."""
    root = tmp_path / "t"
    small = {**CATS, "activations": MiB // 2}
    for arm, ms, cats, peak in (("reshard-after-forward=true", 9, CATS, 12 * MiB),
                                ("reshard-after-forward=false", 6, small, 15 * MiB)):
        _arm(root, arm, ms, {"reshard_after_forward": arm.endswith("true")}, device="cuda")
        for k in range(1, 6):
            run = root / f"{arm}.r{k}"
            write_categories(run / schemas.MEMORY_CATEGORIES_NAME,
                             {r: {**cats, "peak": peak} for r in (0, 1)},
                             source="cuda_max_allocated")
            write_manifest(run, json.loads((run / schemas.MANIFEST_NAME).read_text()))
    rep = _with_collectives(analyse(root))
    assert armdiff.lines(rep)[2:] == ["activations: 1.0 → 0.5 MiB per rank",
                                      "peak allocated: 12.0 → 15.0 MiB per rank"]
    assert decision(markdown.render(rep)) == (
        "fsdp2 with reshard_after_forward=False: 1.50x faster than with "
        f"reshard_after_forward=True \\[1.50, 1.50\\], 25 % more memory per rank; {RECORDED_REF}.")
    heads, _ = markdown.comparison_rows(rep)
    assert "peak allocated per rank" in heads


def test_the_memory_figure_of_a_cpu_record_is_named_a_sum(tmp_path):
    """"peak allocated" is a peak; a CPU record's figure is named the sum it is."""
    _sweep(tmp_path / "t")
    rep = analyse(tmp_path / "t")
    heads, rows = markdown.comparison_rows(rep)
    assert heads[5] == "memory per rank (sum of categories, lower bound)"
    assert rows[0][5] == "9.0 MiB"
    assert memory_section.peak_source_lines(rep)[0] == (
        "reshard-after-forward=false.r1: sum of categories (lower bound) 9.0 MiB per rank, "
        "from memory_categories.parquet: parameters + gradients + optimizer state + "
        "activations (CPU: the allocator keeps no peak)")


def test_runs_of_another_experiment_are_counted_in_the_decision(tmp_path):
    root = tmp_path / "t"
    _sweep(root)
    _arm(root, "ddp", 7, {"strategy": "ddp"}, exp="e2", order=("ddp",), repeats=2,
         strategy="ddp")
    rep = analyse(root)
    assert rep.ranking.descriptive == ["ddp.r1", "ddp.r2"]
    assert decision(markdown.render(rep)).endswith(
        f"reshard_after_forward; {RECORDED_REF}; 2 runs of another experiment (compared in the "
        "tables only).")


def test_too_few_repeats_ask_for_the_minimum_never_an_extrapolated_count(tmp_path):
    """Two repeats: the spread of their log ratios has one degree of freedom; a count from it
    ("--repeat 63") is no advice. A report.json written before the rule still holds one: the
    decision asks for the minimum all the same."""
    root = tmp_path / "t"
    _arm(root, "reshard-after-forward=true", 9, {"reshard_after_forward": True}, repeats=2)
    _arm(root, "reshard-after-forward=false", 6, {"reshard_after_forward": False}, repeats=2)
    rep = analyse(root)
    (p,) = rep.ranking.pairs
    assert p.undecided == "few_repeats" and p.repeats_needed is None
    old = msgspec.structs.replace(rep, ranking=msgspec.structs.replace(
        rep.ranking, pairs=[msgspec.structs.replace(p, repeats_needed=63)]))
    line = decision_line(decision_input(old))
    assert line == (
        "fsdp2 with reshard_after_forward=False vs with reshard_after_forward=True: within "
        "noise at this sample size (1.50x from 2 repeats, too few for an interval; record with "
        "tracer record --repeat 5 or more to decide), memory not measurable on this device for "
        f"reshard_after_forward; {RECORDED_REF}.")
    assert stats.repeats_to_resolve(0.5, 1.08, repeats=2) is None
    assert stats.repeats_to_resolve(0.5, 1.08) > 5  # the formula itself is unchanged


def test_a_transient_setting_the_arms_share_is_not_said(tmp_path):
    """Arms that differ in bucket_cap_mb but declare the same reshard_after_forward: memory
    is not called unmeasurable for a setting that does not differ."""
    root = tmp_path / "t"
    for arm, ms, cap in (("a", 9, 1), ("b", 6, 25)):
        _arm(root, arm, ms, {"reshard_after_forward": True, "bucket_cap_mb": cap},
             order=("a", "b"))
    rep = analyse(root)
    assert rep.ranking.differences == []
    assert armdiff.lines(rep) == []


def test_a_compile_sweep_names_its_kernel_counts_first(tmp_path):
    """Issue 45: `--sweep compile=none,blocks` on fsdp2: inductor fuses ops into fewer kernels,
    a count free of step-time noise; the collectives and memory, the same in both arms, are
    said to be the same (CPU: no reshard setting differs, so no memory_unseen line)."""
    order = ("compile=none", "compile=blocks")
    _arm(tmp_path / "t", "compile=none", 9, {"compile": "none"}, order=order)
    _arm(tmp_path / "t", "compile=blocks", 6, {"compile": "blocks"}, order=order)
    rep = analyse(tmp_path / "t")
    warm = {"compile_ns_by_step": [7_000 * MS, 300 * MS, 0, 0], "first_step_wall_ns": 7_500 * MS,
            "profiled_compile_ns": 0}
    runs = [msgspec.structs.replace(r, profiled_steps=2, comm_groups=_groups(4),
                                    compute_kernels_per_step=434.0 if r.arm == "compile=none" else 355.0,
                                    **({} if r.arm == "compile=none" else {"compile_warmup": warm}))
            for r in rep.runs]
    rep = msgspec.structs.replace(rep, runs=runs, ranking=ranking.rank_runs(runs))
    assert armdiff.lines(rep) == [
        "arms: fsdp2 with compile=none → with compile=blocks",
        "compute kernels: 434 → 355 per step (per rank)",
        "no collective call or byte per kind and mesh dimension and no memory category differs "
        "between the arms"]
    assert [ln for ln in context.lines(rep) if ln.startswith("Compiled")] == [
        "Compiled (5 of 10 runs): compile=blocks.r1: 7300 ms compiling in steps 0, 1; "
        "compile=blocks.r2: 7300 ms compiling in steps 0, 1; compile=blocks.r3: 7300 ms compiling "
        "in steps 0, 1; ...; the step times are the profiled steps', none of it in them."]
    got = json.loads(encode(rep))["ranking"]["differences"]
    assert got == [{"what": "compute_kernels", "kind": "compute", "mesh_dim": "", "unit": "kernels_per_step",
                    "values": {"compile=none": 434.0, "compile=blocks": 355.0}, "settings": [], "why": ""}]
