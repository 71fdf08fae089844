"""Declared arms (issue 29: ``tracer record --arm NAME="OPTIONS"`` / ``--sweep KEY=V1,V2``): every
arm is ranked, a failed arm is left out and named, settings the arms declare may differ, and the
arms are named by their settings in the pair sentences, the decision line, the ranking table
and the findings. Hand-built runs with exact answers (constant steps: the interval collapses
to the ratio)."""

from __future__ import annotations

import shutil

import pytest

from analyzer.compare import ranking
from analyzer.compare.runs import analyse
from analyzer.contract.report_types import AnalysisOptions
from analyzer.contract.arms import arm_label, name_says_settings, pair_labels
from reports import html, markdown
from tests.reports.builders import decision, details, write_run

MS = 1_000_000
RECORDED_REF = ("numerics match the reference values recorded with them (no single-device run "
                "here)")


def _arm(root, arm: str, steps_ms: float, *, settings: dict | None, strategy: str = "fsdp2",
         repeats: int = 5, exp: str = "e1", per_repeat: list[dict] | None = None,
         order: list[str] | None = None, only: list[int] | None = None,
         baseline: str = "b" * 12, **kw) -> None:
    """Run dirs ``arm.r<k>`` (k = 1..repeats, or the repeats in ``only``), three profiled steps
    of ``steps_ms`` on every rank, of declared-arms experiment ``exp`` with this arm's
    ``settings`` (None: an ordinary strategy experiment); ``per_repeat[k-1]``: manifest changes
    of repeat k (``settings``: its ``experiment.settings``); ``order``: the experiment's arms
    (``experiment.order``); ``baseline``: its ``experiment.baseline``."""
    ranks = 1 if strategy == "single" else 2
    for k in only or range(1, repeats + 1):
        walls = {0: (1,) * ranks, **{i: (int(steps_ms * MS),) * ranks for i in (1, 2, 3)}}
        change = dict(per_repeat[k - 1]) if per_repeat else {}
        said = change.pop("settings", settings)  # this repeat's experiment.settings
        experiment = {"id": exp, "arm": arm, "repeat": k, "repeats": repeats,
                      "order": order or [],
                      **({"settings": said, "baseline": baseline} if said is not None
                         else {})}
        write_run(root / f"{arm}.r{k}", strategy=strategy, walls=walls, experiment=experiment,
                  **{**kw, **change})


def test_a_sweep_is_ranked_and_worded_by_the_setting_that_differs(tmp_path):
    root = tmp_path / "t"
    _arm(root, "reshard-after-forward=true", 9, settings={"reshard_after_forward": True},
         options={"reshard_after_forward": True})
    _arm(root, "reshard-after-forward=false", 6, settings={"reshard_after_forward": False},
         options={"reshard_after_forward": False}, peak_alloc=13 << 20)
    rep = analyse(root)
    rk = rep.ranking
    assert rk.status == "ranked" and rk.declared and rk.reference is None
    assert rk.order == ["reshard-after-forward=false", "reshard-after-forward=true"]
    best = rk.arms[0]
    assert best.settings == {"reshard_after_forward": False}
    assert best.label == "fsdp2 with reshard_after_forward=False"  # the name says no more
    (p,) = rk.pairs
    assert p.decision == "faster" and p.undecided is None
    assert p.sentence == ("fsdp2 with reshard_after_forward=False is 1.50x faster than with "
                          "reshard_after_forward=True (95 % CI 1.50-1.50, 5 repeats, 30 steps "
                          "in all)")
    md = markdown.render(rep)
    # the profiler-window peaks (13 MiB + 1 vs 10 MiB + 1) are lower bounds, blind to the
    # unsharded parameters reshard_after_forward=False keeps: memory is not compared
    assert decision(md) == ("fsdp2 with reshard_after_forward=False: 1.50x faster than with "
                            "reshard_after_forward=True \\[1.50, 1.50\\], memory not measurable "
                            f"on this device for reshard_after_forward; {RECORDED_REF}.")
    assert "Fastest: fsdp2 with reshard_after_forward=False, median step time 6.00 ms" in details(md)
    table = md.split("## Ranking by step time")[1].split("\n## ")[0]
    assert "| rank | run | strategy and options | declared settings | parity |" in table
    assert ("| 1 | reshard-after-forward=false.r1 | fsdp2 (reshard_after_forward=False) | "
            "reshard_after_forward=False | pass |") in table
    assert "reshard_after_forward=True</td>" in html.render(rep)


def test_user_named_arms_carry_their_name_and_differing_strategies_are_each_named(tmp_path):
    root = tmp_path / "t"
    _arm(root, "small", 6, strategy="ddp", settings={"strategy": "ddp", "bucket_cap_mb": 1})
    _arm(root, "sharded", 9, settings={"strategy": "fsdp2", "bucket_cap_mb": 25})
    rep = analyse(root)
    (p,) = rep.ranking.pairs
    assert p.sentence.startswith("ddp with bucket_cap_mb=1 (arm small) is 1.50x faster than "
                                 "fsdp2 with bucket_cap_mb=25 (arm sharded) (95 % CI")
    assert decision(markdown.render(rep)).startswith(
        "ddp with bucket_cap_mb=1 (arm small): 1.50x faster than fsdp2 with bucket_cap_mb=25 "
        "(arm sharded) \\[1.50, 1.50\\]")


def test_a_declared_setting_may_differ_between_arms(tmp_path):
    """precision is declared: fp32 and bf16 manifests are one experiment, ranked, and the
    report lists no settings warning for it."""
    root = tmp_path / "t"
    _arm(root, "precision=fp32", 9, settings={"precision": "fp32"}, precision="fp32")
    _arm(root, "precision=bf16", 6, settings={"precision": "bf16"}, precision="bf16")
    rep = analyse(root)
    assert rep.ranking.status == "ranked", rep.ranking.reason
    assert rep.settings_warnings == []
    assert rep.ranking.pairs[0].sentence.startswith(
        "fsdp2 with precision=bf16 is 1.50x faster than with precision=fp32")
    assert ranking.explained_settings(rep.runs) == {"precision"}
    # the same two precisions as an ordinary strategy experiment are refused, as before
    plain = tmp_path / "p"
    _arm(plain, "ddp", 9, strategy="ddp", settings=None, precision="fp32")
    _arm(plain, "fsdp2", 6, settings=None, precision="bf16")
    rep = analyse(plain)
    assert rep.ranking.status == "withheld" and "runs differ in precision" in rep.ranking.reason
    assert any("precision" in w for w in rep.settings_warnings)


def test_an_arm_that_changes_the_numerics_is_said_to_have_its_own_baseline(tmp_path):
    """A bf16 arm beside an fp32 one is ranked with it; the Baseline drift section says the bf16
    arm was checked against its own baseline, never that the runs are not ranked together."""
    root = tmp_path / "t"
    _arm(root, "precision=fp32", 9, settings={"precision": "fp32"}, precision="fp32",
         baseline="a" * 12)
    _arm(root, "precision=bf16", 6, settings={"precision": "bf16"}, precision="bf16",
         baseline="c" * 12)
    rep = analyse(root)
    assert rep.ranking.status == "ranked"
    bd = rep.baseline_drift
    assert bd is not None and bd.comparisons == []
    first, second = (("precision=fp32", "fp32", "a"), ("precision=bf16", "bf16", "c"))
    if bd.reference != "precision=fp32.r1":
        first, second = second, first
    assert bd.note == (f"arm {second[0]} was checked against its own baseline (experiment."
                       f"baseline {second[2] * 12}, not {first[2] * 12} of arm {first[0]}) "
                       f"because it changes the numerics (precision {second[1]}, not {first[1]}): "
                       "the declared arms are ranked together, each checked against its own "
                       "baseline")
    md = markdown.render(rep)
    section = md.split("## Baseline drift")[1].split("\n## ")[0]
    assert "not ranked against each other" not in section and "own baseline" in section
    assert "not ranked against each other" not in html.render(rep)
    # the same two precisions as strategies of one plain experiment: compared, as before
    plain = tmp_path / "p"
    _arm(plain, "ddp", 9, strategy="ddp", settings=None, precision="fp32")
    _arm(plain, "fsdp2", 6, settings=None, precision="bf16")
    bd = analyse(plain).baseline_drift
    assert len(bd.comparisons) == 1 and "not ranked against each other" in bd.note


@pytest.mark.parametrize("change, key", [
    ({"torch_version": "2.14.0"}, "versions"),  # never explained by an arm
    ({"global_batch": 16}, "batch"),  # batch is not what these arms declare
])
def test_a_difference_no_declared_option_explains_is_refused(tmp_path, change, key):
    root = tmp_path / "t"
    _arm(root, "precision=fp32", 9, settings={"precision": "fp32"}, precision="fp32")
    _arm(root, "precision=bf16", 6, settings={"precision": "bf16"}, precision="bf16", **change)
    rep = analyse(root)
    assert rep.ranking.status == "withheld"
    assert rep.ranking.reason.startswith(f"the runs are not one experiment: runs differ in {key} (")
    assert "differ in precision" not in rep.ranking.reason  # the declared one is no problem
    assert [w.split(" (")[0] for w in rep.settings_warnings] == [f"runs differ in {key}"]
    assert decision(markdown.render(rep)).startswith("No decision: the runs were not recorded")


def test_an_arm_whose_repeats_disagree_on_a_declared_setting_is_refused(tmp_path):
    root = tmp_path / "t"
    _arm(root, "precision=fp32", 9, settings={"precision": "fp32"}, precision="fp32")
    _arm(root, "precision=bf16", 6, settings={"precision": "bf16"}, precision="bf16",
         per_repeat=[{}, {}, {"precision": "fp32"}, {}, {}])
    rep = analyse(root)
    assert ranking.explained_settings(rep.runs) == set()
    assert rep.ranking.status == "withheld" and "runs differ in precision" in rep.ranking.reason


def test_repeats_of_an_arm_declaring_different_settings_withhold_the_ranking(tmp_path):
    root = tmp_path / "t"
    _arm(root, "a", 6, strategy="ddp", settings={"nproc": 2},
         per_repeat=[{}, {"settings": {"nproc": 4}}, {}, {}, {}])
    _arm(root, "b", 9, strategy="ddp", settings={"nproc": 3})
    rep = analyse(root)
    rk = rep.ranking
    assert rk.status == "withheld" and rk.order == []
    assert rk.reason == "arm a's repeats disagree in their declared settings (nproc: 2 vs 4)"
    assert decision(markdown.render(rep)) == (
        "No decision: arm a's repeats disagree in their declared settings (nproc: 2 vs 4).")


@pytest.mark.parametrize("settings, kw, line", [
    ({"bucket_cap_mb": 5.0}, {"options": {"bucket_cap_mb": 25.0}},
     "run a.r1: experiment.settings says bucket_cap_mb=5.0, its strategy_options 25.0"),
    ({"wrap_min_params": 1000}, {"options": {"auto_wrap_min_num_params": 500},
                                 "strategy": "fsdp2"},  # an option ddp does not take: refused
     "run a.r1: experiment.settings says wrap_min_params=1000, its strategy_options "
     "auto_wrap_min_num_params=500"),
    ({"precision": "bf16"}, {"precision": "fp32"},
     "run a.r1: experiment.settings says precision=bf16, its precision fp32"),
    ({"strategy": "fsdp2"}, {}, "run a.r1: experiment.settings says strategy=fsdp2, its "
     "strategy ddp"),
])
def test_declared_settings_the_manifest_contradicts_are_refused(tmp_path, settings, kw, line):
    root = tmp_path / "t"
    kw = {"strategy": "ddp", **kw}
    _arm(root, "a", 6, settings=settings, repeats=1, **kw)
    _arm(root, "b", 9, strategy="ddp", settings={"bucket_cap_mb": 25}, repeats=1,
         options={"bucket_cap_mb": 25.0})  # 25 and 25.0: one number
    rk = analyse(root).ranking
    assert rk.status == "withheld"
    assert rk.reason.startswith(f"{line}: the manifest was edited; re-record")
    assert "run b.r1" not in rk.reason
    # --mesh 2,2 as the record writes it in strategy_options: no contradiction
    ok = tmp_path / "ok"
    for arm, ms, mesh in (("a", 6, "1,2"), ("b", 9, "2,1")):
        _arm(ok, arm, ms, strategy="hsdp", settings={"mesh": mesh}, repeats=1,
             options={"mesh": mesh.replace(",", "x")},
             mesh={"shape": [int(x) for x in mesh.split(",")],
                   "dim_names": ["replicate", "shard"]})
    assert analyse(ok).ranking.status == "ranked"


def test_runs_without_declared_settings_in_a_declared_experiment_are_refused(tmp_path):
    """One experiment id, arm a declared, arm b not (a manifest edited, or joined with
    --experiment-id): neither declared arms nor strategies, so no ranking and no labels."""
    root = tmp_path / "t"
    _arm(root, "a", 6, strategy="ddp", settings={"bucket_cap_mb": 1}, repeats=1)
    _arm(root, "b", 9, strategy="ddp", settings=None, repeats=1)
    rep = analyse(root)
    rk = rep.ranking
    assert rk.status == "withheld" and not rk.declared and rk.pairs == []
    assert rk.reason == ("run b.r1 of experiment e1 carries no experiment.settings while its "
                         "other runs declare arms (tracer record --arm / --sweep): the manifests "
                         "were edited or joined from different commands; re-record")
    assert decision(markdown.render(rep)) == f"No decision: {rk.reason}."


def test_a_failed_arm_is_left_out_and_named_the_others_ranked(tmp_path):
    root = tmp_path / "t"
    _arm(root, "fast", 6, strategy="ddp", settings={"strategy": "ddp"})
    _arm(root, "slow", 9, settings={"strategy": "fsdp2"})
    _arm(root, "skipgrad", 3, strategy="ddp", settings={"strategy": "ddp"}, grad_diff=1e-3,
         fault="wrong-grad-scale")  # fastest, but its numbers are wrong
    rep = analyse(root)
    rk = rep.ranking
    assert rk.status == "ranked" and rk.order == ["fast", "slow"]
    why = "failed the parity gate (first divergence in grad layers.0.attn.weight)"
    assert rk.left_out == [f"arm skipgrad {why}"]
    assert f"arm skipgrad left out: {why}" in rk.reason
    md = markdown.render(rep)
    assert decision(md) == ("ddp (arm fast): 1.50x faster than fsdp2 (arm slow) \\[1.50, 1.50\\], "
                            f"the same memory per rank (lower bounds); {RECORDED_REF}; arm skipgrad {why}, "
                            "left out.")
    assert f"Left out of the ranking for their parity: arm skipgrad {why}" in details(md)
    assert "| - | skipgrad.r1 |" in md  # in the table, not ranked
    titles = [f.title for f in rep.findings if f.kind == "parity_failed"]
    # one finding for the arm's five repeats, not five
    assert len(titles) == 1 and titles[0].startswith(
        "skipgrad (ddp) in 5 of 5 repeats (figures of skipgrad.r3) does not reproduce the baseline")
    # the same failure in an ordinary strategy experiment withholds everything, as before
    plain = tmp_path / "p"
    _arm(plain, "ddp", 6, strategy="ddp", settings=None)
    _arm(plain, "fsdp2", 9, settings=None, grad_diff=1e-3)
    rep = analyse(plain)
    assert rep.ranking.status == "withheld" and not rep.ranking.declared
    assert decision(markdown.render(rep)).startswith("No decision: fsdp2.r1 failed the parity gate")


def test_a_failed_arm_is_said_beyond_its_own_tolerance_only(tmp_path):
    root = tmp_path / "t"
    _arm(root, "canary", 6, settings={"precision": "fp32"}, precision="fp32", grad_diff=1e-3,
         repeats=1)
    _arm(root, "fast", 9, settings={"precision": "bf16"}, precision="bf16", repeats=1)
    (line,) = [x for x in details(markdown.render(analyse(root))).split(". ")
               if "FAILED for canary.r1" in x]
    assert "beyond fp32 tolerance (rtol 1.3e-06" in line
    assert "bf16" not in line and "0.016" not in line


def test_with_every_arm_failed_the_ranking_is_withheld(tmp_path):
    root = tmp_path / "t"
    _arm(root, "a", 6, strategy="ddp", settings={"strategy": "ddp"}, grad_diff=1e-3)
    _arm(root, "b", 9, settings={"strategy": "fsdp2"}, grad_diff=1e-3)
    rk = analyse(root).ranking
    assert rk.status == "withheld" and rk.order == []
    assert rk.reason.startswith("arm a left out: failed the parity gate (first divergence in "
                                "grad layers.0.attn.weight); arm b left out: ")
    assert "no arm passed the parity gate" in rk.reason


def test_a_single_device_arm_is_ranked_not_a_reference(tmp_path):
    root = tmp_path / "t"
    _arm(root, "one", 5, strategy="single", settings={"strategy": "single", "nproc": 1})
    _arm(root, "two", 6, strategy="ddp", settings={"strategy": "ddp", "nproc": 2})
    rep = analyse(root)
    rk = rep.ranking
    assert rk.reference is None and rk.order == ["one", "two"]
    assert rk.pairs[0].sentence.startswith(
        "single with nproc=1 (arm one) is 1.20x faster than ddp with nproc=2 (arm two)")
    table = markdown.render(rep).split("## Ranking by step time")[1].split("\n## ")[0]
    assert "| 1 | one.r1 | single |" in table  # ranked, never the row marked reference
    assert not any(row.startswith("| reference |") for row in table.splitlines())


def test_identical_arms_are_named_by_their_names(tmp_path):
    root = tmp_path / "t"
    _arm(root, "a", 6, strategy="ddp", settings={})
    _arm(root, "b", 6.1, strategy="ddp", settings={})
    (p,) = analyse(root).ranking.pairs
    assert p.undecided == "small_difference"  # 6.1 / 6: 1.017, excluding 1
    assert p.sentence.startswith("ddp (arm a) vs ddp (arm b): less than 5 % apart")


def test_findings_name_a_user_named_arm_by_its_settings(tmp_path):
    root = tmp_path / "t"
    _arm(root, "noreshard", 6, settings={"reshard_after_forward": False}, grad_diff=1e-3,
         repeats=1)
    _arm(root, "reshard", 9, settings={"reshard_after_forward": True}, repeats=1)
    rep = analyse(root)
    (f,) = [f for f in rep.findings if f.kind == "parity_failed"]
    assert f.title.startswith("noreshard.r1 (fsdp2 with reshard_after_forward=False) does not "
                              "reproduce the baseline")
    assert rep.ranking.order == ["reshard"]
    assert decision(markdown.render(rep)) == (
        "fsdp2 with reshard_after_forward=True (arm reshard): the only arm in this report; "
        f"{RECORDED_REF}; arm noreshard failed the parity gate (first divergence in grad "
        "layers.0.attn.weight), left out.")


def test_an_arm_with_no_complete_run_and_missing_repeats_are_named(tmp_path):
    """Arms a, b recorded with --repeat 4; three of a's runs deleted, b's left incomplete (no
    manifest): b is named as absent and a's repeats counted, never "the only arm" alone."""
    root = tmp_path / "t"
    _arm(root, "a", 6, strategy="ddp", settings={"strategy": "ddp"}, repeats=4,
         order=["a", "b"], only=[1])
    (root / "b.r1").mkdir()  # incomplete: numerics, no manifest
    shutil.copy(root / "a.r1" / "numerics.parquet", root / "b.r1" / "numerics.parquet")
    rep = analyse(root, AnalysisOptions(allow_incomplete=True))
    rk = rep.ranking
    assert rk.status == "ranked" and rk.order == ["a"]
    assert rk.missing == ["arm b: recorded in this experiment, no complete run in this report",
                          "arm a: 1 of 4 repeats"]
    assert "arm b: recorded in this experiment, no complete run in this report; arm a: 1 of 4 repeats" in rk.reason
    md = markdown.render(rep)
    assert decision(md) == (
        f"ddp (arm a): the only arm ranked; {RECORDED_REF}; arm b: recorded in this experiment, "
        "no complete run in this report; arm a: 1 of 4 repeats.")
    assert ("Not in this report: arm b: recorded in this experiment, no complete run in this report; arm a: 1 of "
            "4 repeats.") in details(md)
    # every repeat of every listed arm present: nothing said
    full = tmp_path / "f"
    for arm, ms in (("a", 6), ("b", 9)):
        _arm(full, arm, ms, strategy="ddp", settings={"strategy": "ddp"}, repeats=2,
             order=["a", "b"])
    assert analyse(full).ranking.missing == []


def test_one_run_each_shows_the_ratio_alone_labelled(tmp_path):
    root = tmp_path / "t"
    _arm(root, "reshard-after-forward=false", 6, settings={"reshard_after_forward": False},
         repeats=1)
    _arm(root, "reshard-after-forward=true", 9, settings={"reshard_after_forward": True},
         repeats=1)
    rep = analyse(root)
    (p,) = rep.ranking.pairs
    assert p.undecided == "one_run" and p.ci_low == pytest.approx(1.5)  # kept in report.json
    assert p.sentence == ("fsdp2 with reshard_after_forward=False vs with "
                          "reshard_after_forward=True: within noise at this sample size (1.50x, "
                          "steps of one run only, 6 steps in all; 1 run each: record both with "
                          "tracer record --repeat 5 or more to decide, fewer than 5 repeats "
                          "cannot measure run-to-run variation)")
    assert decision(markdown.render(rep)) == (
        "fsdp2 with reshard_after_forward=False vs with reshard_after_forward=True: within noise "
        "at this sample size (1.50x, steps of one run only; 1 run each: record with tracer "
        "record --repeat 5 or more to decide), memory not measurable on this device for "
        f"reshard_after_forward; {RECORDED_REF}.")


def test_labels():
    assert name_says_settings("bucket-cap-mb=1+static-graph=true", "ddp",
                              {"bucket_cap_mb": 1, "static_graph": True})
    assert name_says_settings("static-graph=TRUE+bucket-cap-mb=1.0", "ddp",
                              {"bucket_cap_mb": 1, "static_graph": True})
    assert not name_says_settings("bucket-cap-mb=2", "ddp", {"bucket_cap_mb": 1})
    assert not name_says_settings("noreshard", "fsdp2", {"reshard_after_forward": False})
    assert name_says_settings("ddp", "ddp", {"strategy": "ddp"})
    assert name_says_settings("strategy=ddp+bucket-cap-mb=1", "ddp",
                              {"strategy": "ddp", "bucket_cap_mb": 1})
    assert not name_says_settings("fsdp2", "ddp", {"strategy": "ddp"})
    # a sweep of two options: only the one that differs is named, the strategy once
    a = ("bucket-cap-mb=1+static-graph=true", "ddp", {"bucket_cap_mb": 1, "static_graph": True})
    b = ("bucket-cap-mb=1+static-graph=false", "ddp", {"bucket_cap_mb": 1, "static_graph": False})
    assert pair_labels(a, b) == ("ddp with static_graph=True", "with static_graph=False")
    assert pair_labels(("ddp", "ddp", None), ("fsdp", "fsdp", None)) == ("ddp", "fsdp")
    assert arm_label("x", "ddp", {"data_sample_cost_ms": 0.5, "seed": None}) == (
        "ddp with data_sample_cost_ms=0.5, seed=None (arm x)")
    # a name from the command line is one line, its bidirectional controls shown
    assert arm_label("a\u202eb\nc", "ddp", {}) == "ddp (arm a\\u202eb\\nc)"


def test_the_decision_asks_for_the_minimum_repeats_the_pair_asks_for(tmp_path):
    """Two noisy repeats each, 8 % apart: the spread of 2 repeats is no basis for a count
    (issue 42: it gave "--repeat 63"), so the pair and the decision line both ask for the
    minimum, 5 or more."""
    root = tmp_path / "t"
    for arm, steps in (("a", (6.0, 7.0)), ("b", (6.9, 7.2))):
        for k, ms in enumerate(steps, 1):
            walls = {0: (1, 1), **{i: (int(ms * MS),) * 2 for i in (1, 2, 3)}}
            write_run(root / f"{arm}.r{k}", strategy="ddp", walls=walls, experiment={
                "id": "e1", "arm": arm, "repeat": k, "repeats": 2, "order": ["a", "b"],
                "settings": {"strategy": "ddp"}, "baseline": "b" * 12})
    rep = analyse(root)
    (p,) = rep.ranking.pairs
    assert p.undecided == "few_repeats" and p.repeats_needed is None
    assert p.sentence == (
        "ddp (arm a) vs ddp (arm b): within noise at this sample size (1.08x from 2 repeats, too "
        "few for an interval, 12 steps in all; 2 runs each: record both with tracer record "
        "--repeat 5 or more to decide, fewer than 5 repeats cannot measure run-to-run "
        "variation)")
    assert decision(markdown.render(rep)) == (
        "ddp (arm a) vs ddp (arm b): within noise at this sample size (1.08x from 2 repeats, "
        "too few for an interval; record with tracer record --repeat 5 or more to decide), the "
        f"same memory per rank (lower bounds); {RECORDED_REF}.")


def test_memory_that_is_a_lower_bound_is_said_so_in_the_decision():
    """A CPU record's memory is the sum of its categories (the allocator keeps no peak), blind
    to transient buffers such as FSDP's unsharded parameters: "the same memory" between
    reshard_after_forward True and False would mislead without the qualifier."""
    from reports.decision import DecisionInput, decision_line

    base = dict(best="a", other="b", ratio=1.2, ci_low=1.1, ci_high=1.3, verdict="faster",
                memory_ratio=1.0)
    assert ", the same memory per rank (lower bounds);" in decision_line(
        DecisionInput(**base, memory_lower_bound=True))
    assert ", the same memory per rank;" in decision_line(DecisionInput(**base))
