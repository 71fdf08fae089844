"""`analyzer merge --steps`: a selection is ranges, bounded by the steps the traces hold."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from analyzer.timeline.merge import MergeOptions, StepRanges, merge_traces, parse_steps
from tests.merge.builders import gloo_rank, write

HUGE = "0-100000000000000"


def _job(folder):
    for r in (0, 1):
        write(folder / f"rank{r}.trace.json", gloo_rank(r, 2, offset_us=0.0,
                                                        ends_us=[600.0, 1600.0, 2600.0]))
    return folder


def test_parse_steps_keeps_ranges_not_numbers():
    sel = parse_steps(HUGE)
    assert sel.ranges == ((0, 100_000_000_000_000),)
    assert parse_steps("7, 1-3,2-4,5").ranges == ((1, 5), (7, 7))
    assert 99_999_999_999_999 in sel and 6 not in parse_steps("1-5,7")


def test_step_ranges_pick_only_what_a_trace_holds():
    sel = parse_steps(HUGE)
    assert sel.pick([2, 0, 2, 1]) == [0, 1, 2]
    assert sel.without([0, 1, 2]) == [(3, 100_000_000_000_000)]
    assert StepRanges.of((2, 1)).without([1]) == [(2, 2)]


@pytest.mark.parametrize("bad", ["3-1", "x", "1,,2", "-1"])
def test_parse_steps_refuses_bad_parts(bad):
    with pytest.raises(ValueError):
        parse_steps(bad)


def test_step_numbers_still_select(tmp_path):
    res = merge_traces(_job(tmp_path / "job"), tmp_path / "m.json", MergeOptions(steps=(1, 7)))
    assert res.warnings and "has no ProfilerStep [7]" in res.warnings[-1]
    assert json.loads((tmp_path / "m.offsets.json").read_text())["steps"] == [1, 7]


def test_a_huge_selection_is_summarised_as_ranges(tmp_path):
    res = merge_traces(_job(tmp_path / "job"), tmp_path / "m.json",
                       MergeOptions(steps=parse_steps(HUGE)))
    assert any(f"ProfilerStep [3-{HUGE[2:]}]" in w for w in res.warnings), res.warnings
    assert json.loads((tmp_path / "m.offsets.json").read_text())["steps"] == [[0, 10**14]]


@pytest.mark.integration
def test_merge_of_a_huge_step_range_stays_small(tmp_path):
    # the probe's `--steps 0-100000000000000` built the whole range (22.8 GB before the OOM
    # killer); under a 2 GiB address-space limit it must merge what the traces hold
    job = _job(tmp_path / "job")
    out = tmp_path / "m.json"
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        sys.argv = ["analyzer", "merge", {str(job)!r}, "--steps", {HUGE!r}, "-o", {str(out)!r}]
        from analyzer.cli.app import main
        main()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file() and "MemoryError" not in proc.stderr
