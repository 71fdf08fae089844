"""The ranking decides from the step-time distribution of one experiment (issue 20): pairs with
intervals in report.json, "faster" only when the interval excludes 1 with enough repeats, the
single-device run a reference, other experiments compared in the tables only. Hand-built runs
with exact answers (constant steps: the interval collapses to the ratio)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.compare import ranking
from analyzer.compare.runs import analyse
from analyzer.contract import report_types
from reports import markdown
from tests.reports.builders import decision, details, write_run

MS = 1_000_000


def _exp(run_id: str, arm: str, k: int, n: int, order=("single", "ddp", "fsdp")) -> dict:
    return {"id": run_id, "arm": arm, "repeat": k, "repeats": n, "order": list(order)}


def _arm(root, arm: str, repeats: list[list[float]], *, exp: str | None = "e1", strategy=None,
         **kw) -> None:
    """Run dirs ``arm.r<k>`` (``arm`` alone for one repeat), profiled steps ``repeats[k-1]`` ms
    on every rank, of experiment ``exp``."""
    strategy = strategy or arm
    n = len(repeats)
    for k, steps in enumerate(repeats, 1):
        name = f"{arm}.r{k}" if n > 1 else arm
        ranks = 1 if strategy == "single" else 2
        walls = {0: (1,) * ranks, **{i + 1: (int(ms * MS),) * ranks for i, ms in enumerate(steps)}}
        write_run(root / name, strategy=strategy, walls=walls,
                  experiment=_exp(exp, arm, k, n) if exp else None, **kw)


def test_constant_gap_with_five_repeats_is_faster_with_its_interval(tmp_path):
    root = tmp_path / "t"
    _arm(root, "single", [[10, 10]] * 5)
    _arm(root, "ddp", [[6, 6, 6]] * 5)
    _arm(root, "fsdp", [[9, 9, 9]] * 5)
    rep = analyse(root)
    rk = rep.ranking
    assert rk.status == "ranked" and rk.order == ["ddp", "fsdp"]
    assert rk.reference == "single" and rk.experiment == "e1" and rk.descriptive == []
    (p,) = rk.pairs  # the reference is not paired
    assert (p.faster, p.slower, p.decision, p.repeats, p.steps, p.paired) == (
        "ddp", "fsdp", "faster", 5, 30, True)
    assert p.ratio == pytest.approx(1.5) and p.ci_low == pytest.approx(1.5)
    assert p.ci_high == pytest.approx(1.5)
    assert "hierarchical bootstrap" in p.method
    assert rk.noise.decisive is True
    assert ranking.decision(rk) is p
    assert p.sentence == (
        "ddp is 1.50x faster than fsdp (95 % CI 1.50-1.50, 5 repeats, 30 steps in all)")  # 5 x 3 steps of each arm
    data = json.loads(report_types.encode(rep))["ranking"]["pairs"][0]
    assert {"faster", "slower", "ratio", "ci_low", "ci_high", "method"} <= set(data)
    md = markdown.render(rep)
    assert decision(md) == ("ddp: 1.50x faster than fsdp \\[1.50, 1.50\\], the same memory per "
                            "rank (lower bounds), 1.67x the single-device speed; numerics match "
                            "one device.")
    verdict = details(md)
    assert ("Fastest: ddp, median step time 6.00 ms, 5 repeats, 1.67x speedup over the "
            "single-device run") in verdict
    assert "ddp is 1.50x faster than fsdp" in verdict
    assert "Reference (not ranked): single, one device, median step time 10.00 ms, 5 repeats." in verdict


def test_too_few_repeats_never_decide(tmp_path):
    root = tmp_path / "t"
    _arm(root, "ddp", [[6, 6, 6]] * 2)
    _arm(root, "fsdp", [[9, 9, 9]] * 2)
    (p,) = analyse(root).ranking.pairs
    assert p.ci_low == pytest.approx(1.5)  # the interval excludes 1 ...
    assert p.decision == "within_noise" and p.repeats == 2  # ... but 2 repeats cannot decide
    assert p.undecided == "few_repeats" and p.ci_high == pytest.approx(1.5)  # kept in report.json
    # ... and it is not shown: the ratio alone, labelled
    assert p.sentence.startswith("ddp vs fsdp: within noise at this sample size (1.50x from 2 "
                                 "repeats, too few for an interval, 12 steps in all; 2 runs each: "
                                 "record both with tracer record --repeat 5 or more to decide")
    assert "CI" not in p.sentence
    assert decision(markdown.render(analyse(root))) == (
        "ddp vs fsdp: within noise at this sample size (1.50x from 2 repeats, too few for an "
        "interval; record with tracer record --repeat 5 or more to decide), the same memory per "
        "rank (lower bounds); "
        "numerics match the reference values recorded with them (no single-device run here).")


def test_a_steady_gap_under_five_percent_is_never_called_faster(tmp_path):
    """Constant steps 10.0 vs 10.3 ms: the interval is exactly 1.03, excluding 1, but a 3 % gap is
    what identical records differ by on one machine (stats.MIN_DIFFERENCE); 10.0 vs 10.6 is
    decided."""
    root = tmp_path / "t"
    _arm(root, "ddp", [[10.0, 10.0, 10.0]] * 5)
    _arm(root, "fsdp", [[10.3, 10.3, 10.3]] * 5)
    (p,) = analyse(root).ranking.pairs
    assert p.ci_low == pytest.approx(1.03) and p.ci_high == pytest.approx(1.03)
    assert p.decision == "within_noise" and p.repeats_needed is None
    assert p.undecided == "small_difference"
    # never "within noise" beside an interval that excludes 1
    assert p.sentence == ("ddp vs fsdp: less than 5 % apart (ratio 1.03, 95 % CI 1.03-1.03, 5 "
                          "repeats, 30 steps in all): the difference identical records show on "
                          "one machine, not called faster")
    assert decision(markdown.render(analyse(root))) == (
        "ddp vs fsdp: less than 5 % apart (1.03x \\[1.03, 1.03\\]; 5 repeats: the difference "
        "identical records show on one machine), the same memory per rank (lower bounds); numerics match the "
        "reference values recorded with them (no single-device run here).")
    root = tmp_path / "u"
    _arm(root, "ddp", [[10.0, 10.0, 10.0]] * 5)
    _arm(root, "fsdp", [[10.6, 10.6, 10.6]] * 5)
    (p,) = analyse(root).ranking.pairs
    assert p.decision == "faster" and p.ratio == pytest.approx(1.06)


def test_overlapping_distributions_are_within_noise_with_repeats_to_resolve(tmp_path):
    rng = np.random.default_rng(0)
    root = tmp_path / "t"
    draw = lambda: [[float(v) for v in 8 * np.exp(rng.normal(0, 0.2, 6))] for _ in range(5)]
    _arm(root, "ddp", draw())
    _arm(root, "fsdp", draw())
    rk = analyse(root).ranking
    (p,) = rk.pairs
    assert p.decision == "within_noise" and p.ci_low <= 1 <= p.ci_high
    assert rk.noise.decisive is False and rk.noise.close_pairs[0][3] == p.sentence
    if p.repeats_needed is not None:
        assert p.repeats_needed >= 5 and f"about {p.repeats_needed} repeats" in p.sentence


def test_runs_of_another_experiment_are_described_not_ranked(tmp_path):
    root = tmp_path / "t"
    _arm(root, "single", [[10]] * 5)
    _arm(root, "ddp", [[6]] * 5)
    _arm(root / "later", "fsdp", [[3]] * 2, exp="e2")  # fast, but recorded by another command
    for d in (root / "later").iterdir():
        d.rename(root / d.name)
    rep = analyse(root)
    rk = rep.ranking
    assert rk.order == ["ddp"] and rk.experiment == "e1"
    assert rk.descriptive == ["fsdp.r1", "fsdp.r2"]
    assert "not of experiment e1" in rk.reason
    by = {r.name: r for r in rep.runs}
    assert by["fsdp.r1"].speedup_vs_single is None  # no figure across experiments
    assert by["ddp.r3"].speedup_vs_single == pytest.approx(10 / 6)
    md = markdown.render(rep)
    assert "Not ranked (another experiment): fsdp.r1, fsdp.r2" in details(md)
    assert "| 1 | ddp.r1 |" in md and "| - | fsdp.r1 |" in md  # ranking table: by strategy


def test_the_experiment_with_distributed_runs_is_ranked(tmp_path):
    root = tmp_path / "t"
    _arm(root, "single", [[10]] * 3, exp="a-many-singles")
    _arm(root, "ddp", [[6]], exp="z-one-ddp")
    rk = analyse(root).ranking
    assert rk.experiment == "z-one-ddp" and rk.order == ["ddp"]
    assert rk.descriptive == ["single.r1", "single.r2", "single.r3"]


def test_runs_without_experiment_id_are_ranked_with_a_warning(tmp_path):
    root = tmp_path / "t"
    _arm(root, "ddp", [[6, 6]], exp=None)
    _arm(root, "fsdp", [[9, 9]], exp=None)
    rk = analyse(root).ranking
    assert rk.status == "ranked" and rk.experiment is None and rk.order == ["ddp", "fsdp"]
    assert "carry no experiment id" in rk.reason
    assert rk.pairs[0].decision == "within_noise"  # one run each: run-to-run noise unknown


def test_a_busy_machine_is_named(tmp_path):
    root = tmp_path / "t"
    calm = {"load_avg": [0.5, 0.5, 0.5], "cpu_count": 4, "usable_cpus": 4, "threads_per_rank": 1,
            "ranks_on_host": 2, "oversubscribed": False}
    _arm(root, "ddp", [[6]] * 5, machine=calm)
    _arm(root, "fsdp", [[9]] * 5, machine={**calm, "load_avg": [6.5, 3.0, 1.0]})
    reason = analyse(root).ranking.reason
    assert ("5 of 10 run(s) were recorded on a busy machine (1-minute load average up to 6.5 "
            "on 4 usable CPUs)") in reason
    calm_root = tmp_path / "c"
    _arm(calm_root, "ddp", [[6]] * 5, machine=calm)
    assert "busy machine" not in analyse(calm_root).ranking.reason
