"""`--rtol` / `--atol` of gate, drift and report: a negative, NaN or infinite value is refused
with a hint naming that option, a value above the bound is refused with the bound, -0.0 is
taken and shown as 0, and a real fault still fails the gate at the bounds."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inputs import bad_input, cli, copy_run, shared


# refused: negative, NaN, infinite, above the bound

def test_negative_or_nan_tolerance(tmp_path, ddp_run):
    for value in ("-1", "nan"):
        line = bad_input(cli("gate", str(ddp_run), "--rtol", value), "--rtol", "finite number >= 0")
        assert "manifest" not in line  # the option is wrong, not the run


@pytest.mark.parametrize("opt", ["--atol", "--rtol"])
def test_bad_tolerance_hint_names_its_option(ddp_run, tmp_path, opt):
    run = copy_run(ddp_run, tmp_path / "run")
    other = "--rtol" if opt == "--atol" else "--atol"
    for args in (["gate", str(run)], ["drift", str(run), str(run)],
                 ["report", str(run), "--out", str(tmp_path / "rep")]):
        line = bad_input(cli(*args, opt, "inf"), opt, f"e.g. {opt} ")
        assert other not in line, line


@pytest.mark.parametrize("opt,value", [("--rtol", "1e300"), ("--rtol", "0.5"), ("--atol", "1e300"),
                                       ("--atol", "0.1")])
def test_tolerance_above_the_bound_is_refused(fsdp_fault_run, tmp_path, opt, value):
    from analyzer.contract.report_types import MAX_OVERRIDE

    bound = f"{MAX_OVERRIDE[opt[2:]]:g}"
    for args in (["gate", str(fsdp_fault_run)], ["drift", str(fsdp_fault_run), str(fsdp_fault_run)],
                 ["report", str(fsdp_fault_run), "--out", str(tmp_path / "rep")]):
        bad_input(cli(*args, opt, value), opt, f"above the bound {bound}", f"{opt} <= {bound}")


# the bounds still fail a real fault

@pytest.fixture(scope="session")
def ddp_default_fault_run(tmp_path_factory) -> Path:
    """``--fault wrong-grad-scale`` at the default model shapes (smaller gradients than TINY's:
    where the first atol bound, 1e-2, let the fault pass the gate)."""
    out = tmp_path_factory.mktemp("fu-ddp-default") / "traces"
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", "--strategy", "ddp",
                           "--warmup", "0", "--active", "2", "--fault", "wrong-grad-scale",
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return shared(out / "ddp")


@pytest.mark.record
@pytest.mark.parametrize("which", ["tiny_fsdp", "default_ddp"])
def test_faulted_run_still_fails_at_the_bounds(which, request):
    from analyzer.contract.report_types import MAX_OVERRIDE

    run = request.getfixturevalue("fsdp_fault_run" if which == "tiny_fsdp"
                                  else "ddp_default_fault_run")
    # the fault halves every gradient (relative error 0.5): the looser tolerances refused
    # above would have let it through, the bounds do not
    proc = cli("gate", str(run), "--rtol", str(MAX_OVERRIDE["rtol"]),
               "--atol", str(MAX_OVERRIDE["atol"]))
    assert proc.returncode == 3 and f"FAIL {run.name}: fail" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "rel L2 0.5" in proc.stdout
    from analyzer.analyses.parity import evaluate, read_numerics, tolerance_for

    numerics = read_numerics(run / "numerics.parquet")
    for name, loose in (("rtol", 0.5), ("atol", 0.1)):  # the library still computes them
        res = evaluate(numerics, tolerance_for("fp32", **{name: loose}))
        assert res.status == "pass", (name, res.reason)  # why such values must be refused


# -0.0: taken as 0, never shown as "-0"

@pytest.fixture(scope="module")
def zero_tol_report(ddp_run, tmp_path_factory) -> Path:
    """``analyzer report`` of the tiny record with --rtol=-0.0 --atol=-0.0 (report folder)."""
    root = tmp_path_factory.mktemp("zero")
    out = root / "r"
    copy_run(ddp_run, root / "traces" / "ddp")  # the report's caches land in the copy
    proc = cli("report", str(root / "traces"), "--rtol=-0.0", "--atol=-0.0", "--out", str(out))
    assert proc.returncode in (0, 1), proc.stderr  # 1: the gate fails at tolerance 0
    return out


def test_negative_zero_tolerance_is_shown_as_zero(zero_tol_report):
    md = (zero_tol_report / "report.md").read_text()
    assert not re.search(r"(rtol|atol) -0\b", md), md[:2000]
    assert "rtol 0, atol 0" in md
    rep = json.loads((zero_tol_report / "report.json").read_text())
    tol = next(r["parity"]["tolerance"] for r in rep["runs"] if r["parity"].get("tolerance"))
    for key in ("rtol", "atol"):
        assert tol[key] == 0.0 and math.copysign(1.0, tol[key]) == 1.0, tol
