"""`analyzer gate DIR --baseline OLD --max-regression X`: exit 4 only when the interval of new/old
lies wholly above 1 + X with at least stats.MIN_REPEATS runs a side; 0 when within or when the
runs cannot tell; 2 for bad input (OLD missing, without a strategy in common or recorded
under other settings), before any line on stdout. Hand-built runs (no traces) with constant or
seeded step times: the answers are exact or wide by design."""

from __future__ import annotations

import json

import numpy as np
import pytest

from analyzer.compare import perfgate, stats
from analyzer.contract import schemas
from analyzer.contract.errors import ExitCode
from tests.inputs import bad_input, cli
from tests.reports.builders import write_manifest, write_run

MS = 1_000_000


def _root(root, steps_ms: list[list[float]], *, arm: str = "ddp", peak: int = 10 << 20,
          hidden: int | None = None, seq: int | None = None):
    """``arm.r<k>`` per repeat; ``hidden`` / ``seq`` rewrite the manifest's model and batch."""
    n = len(steps_ms)
    for k, steps in enumerate(steps_ms, 1):
        walls = {0: (1, 1), **{i + 1: (int(ms * MS),) * 2 for i, ms in enumerate(steps)}}
        run = root / f"{arm}.r{k}"
        write_run(run, strategy="ddp", walls=walls, peak_alloc=peak,
                  experiment={"id": root.name, "arm": arm, "repeat": k, "repeats": n})
        if hidden is not None or seq is not None:
            m = json.loads((run / schemas.MANIFEST_NAME).read_text())
            m["model"]["hidden"] = m["batch"]["hidden"] = hidden or m["model"]["hidden"]
            m["batch"]["seq_len"] = seq or m["batch"]["seq_len"]
            write_manifest(run, m)
    return root


def test_a_slowdown_beyond_the_allowance_fails_with_exit_4(tmp_path):
    old = _root(tmp_path / "old", [[10, 10, 10]] * 5)
    new = _root(tmp_path / "new", [[12, 12, 12]] * 5)  # 1.2x on every step
    res = cli("gate", str(new), "--baseline", str(old), "--max-regression", "10%")
    assert res.returncode == ExitCode.REGRESSION == 4, res.stdout + res.stderr
    assert "FAIL ddp step_time: new/old 1.200 (95 % CI 1.200-1.200, 5 vs 5 runs)" in res.stdout
    assert "PASS ddp peak_allocated" in res.stdout
    assert res.stdout.splitlines()[-1] == "gate: FAILED -- regression beyond 10 %: ddp step_time"
    # the same slowdown within a 25 % allowance passes
    res = cli("gate", str(new), "--baseline", str(old), "--max-regression", "0.25")
    assert res.returncode == 0 and "within the allowed 1.250" in res.stdout


def test_noise_alone_does_not_fail(tmp_path):
    rng = np.random.default_rng(0)
    draw = lambda: [[float(v) for v in 10 * np.exp(rng.normal(0, 0.3, 4))] for _ in range(5)]
    old, new = _root(tmp_path / "old", draw()), _root(tmp_path / "new", draw())
    checks = perfgate.compare(_runs(new), _runs(old), 0.10)
    step = next(c for c in checks if c.metric == "step_time")
    assert step.ci_low <= 1.10 < step.ci_high and not step.regressed  # cannot tell: pass
    res = cli("gate", str(new), "--baseline", str(old))  # default allowance 10 %
    assert res.returncode == 0 and "cannot tell from the allowed 1.100" in res.stdout


def test_peak_memory_regression_fails(tmp_path):
    old = _root(tmp_path / "old", [[10]] * 5)
    new = _root(tmp_path / "new", [[10]] * 5, peak=20 << 20)
    res = cli("gate", str(new), "--baseline", str(old))
    assert res.returncode == 4 and "FAIL ddp peak_allocated: new/old 2.000" in res.stdout


def test_bad_options_and_inputs_are_exit_2(tmp_path):
    old = _root(tmp_path / "old", [[10]] * 2)
    new = _root(tmp_path / "new", [[10]] * 2, arm="fsdp")
    bad_input(cli("gate", str(new), "--max-regression", "10%"), "needs --baseline")
    bad_input(cli("gate", str(new), "--baseline", str(old), "--max-regression", "10"),
              "ambiguous; write 10% for a percentage")
    for res, must in ((cli("gate", str(new), "--baseline", str(old)), "no strategy in common"),
                      (cli("gate", str(new), "--baseline", str(tmp_path / "nope")), "no such file")):
        bad_input(res, must)
        assert res.stdout == ""  # refused before the parity gate prints a PASS line


def test_too_few_runs_on_a_side_cannot_fail(tmp_path):
    # 1.8x slower on every step and twice the memory, but 2 runs against 1: the interval
    # (exactly 1.800-1.800 here) holds the steps only, not run-to-run variation
    old = _root(tmp_path / "old", [[10, 10, 10]])
    new = _root(tmp_path / "new", [[18, 18, 18]] * 2, peak=20 << 20)
    res = cli("gate", str(new), "--baseline", str(old))
    assert res.returncode == 0, res.stdout + res.stderr
    assert ("PASS ddp step_time: new/old 1.800 (95 % CI 1.800-1.800, 2 vs 1 runs), cannot tell "
            "(2 vs 1 runs: record both with tracer record --repeat 5;") in res.stdout
    assert "PASS ddp peak_allocated: new/old 2.000" in res.stdout and "FAIL" not in res.stdout
    # two checks: hand-built runs have no traces, hence no exposed communication
    assert res.stdout.splitlines()[-1] == (
        "gate: performance passed (no interval lies above the allowed 10 %; 2 check(s) could not "
        "tell: fewer than 5 runs a side)")


@pytest.mark.parametrize("n_new,n_old,regressed", [
    (stats.MIN_REPEATS - 1, stats.MIN_REPEATS, False), (stats.MIN_REPEATS, stats.MIN_REPEATS - 1, False),
    (stats.MIN_REPEATS, stats.MIN_REPEATS, True)])
def test_a_regression_fails_only_with_min_repeats_on_both_sides(tmp_path, n_new, n_old, regressed):
    old = _root(tmp_path / "old", [[10, 10]] * n_old)
    new = _root(tmp_path / "new", [[13, 13]] * n_new)  # 1.3x on every step
    (step,) = [c for c in perfgate.compare(_runs(new), _runs(old), 0.10) if c.metric == "step_time"]
    assert step.ratio == pytest.approx(1.3) and step.ci_low == pytest.approx(1.3)
    assert (step.regressed, step.decidable) == (regressed, regressed)


@pytest.mark.parametrize("swap", [False, True])
def test_previous_runs_recorded_under_other_settings_are_refused(tmp_path, swap):
    small = _root(tmp_path / "small", [[1]] * 5, hidden=64, seq=16)
    large = _root(tmp_path / "large", [[25]] * 5, hidden=256, seq=128, peak=250 << 20)
    new, old = (large, small) if swap else (small, large)
    res = cli("gate", str(new), "--baseline", str(old))
    line = bad_input(res, f"analyzer: {old}: --baseline: recorded under other settings than {new}",
                     "ddp: runs differ in batch (", "runs differ in model (",
                     f"{new}: name SimpleTransformer, hidden {64 if not swap else 256}",
                     f"{old}: name SimpleTransformer, hidden {256 if not swap else 64}",
                     f"record {old} with the same settings as {new}")
    assert "seq_len 16" in line and "seq_len 128" in line
    assert res.stdout == ""  # no PASS/FAIL line before the refusal
    # the same settings are compared (the settings check is not a blanket refusal)
    same = _root(tmp_path / "same", [[1]] * 5, hidden=64, seq=16)
    assert cli("gate", str(same), "--baseline", str(small)).returncode == 0


def test_previous_runs_of_other_versions_are_compared_with_a_note(tmp_path):
    """Gating a torch upgrade against the runs before it is what the gate is for: versions are
    not refused, only said."""
    old = _root(tmp_path / "old", [[10, 10, 10]] * 5)
    new = _root(tmp_path / "new", [[10, 10, 10]] * 5)
    for run in new.iterdir():
        m = json.loads((run / schemas.MANIFEST_NAME).read_text())
        m["versions"]["torch"] = "9.9.9"
        write_manifest(run, m)
    res = cli("gate", str(new), "--baseline", str(old))
    assert res.returncode == 0, res.stderr
    assert "note: ddp: runs differ in versions (" in res.stderr and "9.9.9" in res.stderr
    assert "the comparison measures the upgrade as well" in res.stderr


@pytest.mark.parametrize("text,value", [("10%", 0.10), ("10 %", 0.10), ("0.1", 0.1), ("0", 0.0),
                                        ("2.5%", 0.025)])
def test_max_regression_parsing(text, value):
    assert perfgate.parse_max_regression(text) == pytest.approx(value)


def _runs(root):
    from analyzer.compare.runs import analyse

    return analyse(root).runs
