"""ProfilerStep numbers (analyzer/ingest/steps.py ``step_number``): a number no profiler writes
is one line and exit 2, never an overflow in the int64 step columns (issue 43 R16: 20 digits
were "internal error: OverflowError", 5,000 digits a ValueError, 2^63 a step numbered
-9223372036854775808).

Oracle: ``steps.MAX_STEP`` read; the largest number it allows is analysed as that step."""

from __future__ import annotations

import pytest

from analyzer.contract.errors import BadInput
from analyzer.ingest import steps
from tests.inputs import bad_input, cli
from tests.merge.builders import gloo_rank, write


def _job(folder, number: str):
    trace = gloo_rank(0, 1, offset_us=0.0, ends_us=[600.0, 1600.0])
    for ev in trace["traceEvents"]:
        if ev.get("name") == "ProfilerStep#1":
            ev["name"] = f"ProfilerStep#{number}"
    write(folder / "rank0.json", trace)
    return folder


@pytest.mark.parametrize("digits", [str(1 << 63), "9" * 25, "9" * 5000])
def test_a_step_number_over_the_bound_is_refused(digits):
    with pytest.raises(BadInput) as exc:
        steps.step_number(f"ProfilerStep#{digits}", "rank0.json")
    assert exc.value.reason == "not_a_trace"
    line = exc.value.one_line()
    assert line.startswith("rank0.json: ProfilerStep#") and len(line) < 300, line


def test_the_largest_step_number_is_read():
    assert steps.step_number(f"ProfilerStep#{steps.MAX_STEP}") == steps.MAX_STEP
    assert steps.step_number("ProfilerStep#0") == 0


def test_summary_of_a_trace_with_a_huge_step_number_is_one_line(tmp_path):
    folder = _job(tmp_path / "job", "9" * 25)
    for cmd in ("summary", "merge"):
        args = ["-o", str(tmp_path / "m.json")] if cmd == "merge" else []
        bad_input(cli(cmd, str(folder), *args), "rank0.json", "ProfilerStep#9999", "25 digits")


def test_the_largest_step_number_is_a_step(tmp_path):
    folder = _job(tmp_path / "job", str(steps.MAX_STEP))
    proc = cli("summary", str(folder), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert str(steps.MAX_STEP) in proc.stdout
