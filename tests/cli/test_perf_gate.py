"""`analyzer gate DIR --baseline OLD --max-regression X`: exit 4 only when the interval of new/old
lies wholly above 1 + X; 0 when within or when the runs cannot tell; 2 for bad input. Hand-built
runs (no traces) with constant or seeded step times: the answers are exact or wide by design."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.compare import perfgate
from analyzer.contract.errors import ExitCode
from tests.inputs import bad_input, cli
from tests.reports.builders import write_run

MS = 1_000_000


def _root(root, steps_ms: list[list[float]], *, arm: str = "ddp", peak: int = 10 << 20):
    n = len(steps_ms)
    for k, steps in enumerate(steps_ms, 1):
        walls = {0: (1, 1), **{i + 1: (int(ms * MS),) * 2 for i, ms in enumerate(steps)}}
        write_run(root / f"{arm}.r{k}", strategy="ddp", walls=walls, peak_alloc=peak,
                  experiment={"id": root.name, "arm": arm, "repeat": k, "repeats": n})
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
    bad_input(cli("gate", str(new), "--baseline", str(old)), "no strategy in common")
    bad_input(cli("gate", str(new), "--baseline", str(tmp_path / "nope")), "no such file")


@pytest.mark.parametrize("text,value", [("10%", 0.10), ("10 %", 0.10), ("0.1", 0.1), ("0", 0.0),
                                        ("2.5%", 0.025)])
def test_max_regression_parsing(text, value):
    assert perfgate.parse_max_regression(text) == pytest.approx(value)


def _runs(root):
    from analyzer.compare.runs import analyse

    return analyse(root).runs
