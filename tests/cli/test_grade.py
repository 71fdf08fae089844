"""`analyzer grade PROJECTION RUN` (issue 44, Deliver 4): a projection's exact figures --
collective calls and bytes per step by kind and mesh dimension, parameter / gradient /
optimizer-state bytes per rank -- beside the real run's, equal or a failure (exit 3); a RUN of
another configuration refused in one line (exit 2). Inputs: copies of the committed 2-rank
records (fixtures/recorded/tiny), edited where a test says so, with exact answers: ddp's one
all_reduce of the 18,944 fp32 parameters (75,776 bytes) and one 9-element Int broadcast (36
bytes) per step; fsdp2's 4 all_gathers (151,552 bytes) and 2 reduce_scatters (75,776 bytes)
per step of each rank, half the parameters and gradients each. Mesh dimensions: the hand-built
2 x 2 HSDP traces of fixtures/mesh/gloo_hsdp (counted in tests/analyzer/test_mesh_dims.py)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from analyzer.cli.app import app
from analyzer.cli.grade import ranks_text
from tests.remanifest import refresh_manifest
from tests.reports.builders import manifest, write_categories, write_manifest

TINY = Path(__file__).resolve().parents[2] / "fixtures" / "recorded" / "tiny"
MESH = Path(__file__).resolve().parents[2] / "fixtures" / "mesh" / "gloo_hsdp"
HSDP_MESH = {"shape": [2, 2], "dim_names": ["replicate", "shard"]}
runner = CliRunner()


def _copy(tmp_path: Path, name: str, as_name: str) -> Path:
    dest = tmp_path / as_name
    shutil.copytree(TINY / name, dest)
    return dest


def _edit_manifest(run: Path, **changes) -> None:
    path = run / "manifest.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data, indent=1), encoding="utf-8")


def _projection_of_rank0(tmp_path: Path, name: str = "ddp", world: int = 2) -> Path:
    """A copy of ``name`` holding rank 0's trace only, its manifest marked as a projection at
    ``world`` (the field tracer project writes)."""
    proj = _copy(tmp_path, name, "proj")
    (proj / "rank1.trace.json.gz").unlink()
    data = json.loads((proj / "manifest.json").read_text(encoding="utf-8"))
    _edit_manifest(proj, files=[f for f in data["files"] if f["path"] != "rank1.trace.json.gz"],
                   projection={"world_size": world, "roles_run": [0], "device": "cpu",
                               "fake_process_group": True})
    return proj


def _grade(*args: str):
    return runner.invoke(app, ["grade", *map(str, args)], env={"COLUMNS": "200"})


def _table(out: str) -> list[str]:
    """The table's rows, whitespace collapsed."""
    lines = out.splitlines()
    start = next(i for i, s in enumerate(lines) if s.strip().startswith("─")) + 1
    return [" ".join(s.split()) for s in lines[start:] if s.strip()][:-2]


def test_grade_of_an_equal_projection_prints_exact_rows_and_exits_0(tmp_path):
    proj = _projection_of_rank0(tmp_path)
    real = _copy(tmp_path, "ddp", "real")
    res = _grade(proj, real)
    assert res.exit_code == 0, res.output
    assert f"PROJECTION {proj} (projected at world 2 from one process, roles run 0, on cpu)" in res.output
    assert "ranks compared: 0\n" in res.output
    assert _table(res.output) == [
        "calls/step all_reduce world 0 1 1 equal",
        "bytes/step all_reduce world 0 75,776 75,776 equal",
        "calls/step broadcast world 0 1 1 equal",
        "bytes/step broadcast world 0 36 36 equal",
        "memory bytes parameters - 0 75,776 75,776 equal",
        "memory bytes gradients - 0 75,776 75,776 equal",
        "memory bytes optimizer_state - 0 0 0 equal",
    ]
    assert res.output.splitlines()[-2:] == [
        "step time: not projected: pass --link-model",
        "grade: passed -- 7 exact figures equal on ranks 0"]


def test_grade_json_holds_every_figure_of_every_rank_exactly(tmp_path):
    proj = _copy(tmp_path, "fsdp2", "proj")
    real = _copy(tmp_path, "fsdp2", "real")
    res = _grade(proj, real, "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["ok"] is True and got["ranks_compared"] == [0, 1] and got["world_size"] == 2
    assert got["projection_info"] is None and got["timed"] == {"step_time_ns": "not projected: pass --link-model"}
    assert got["step"] is None and got["runs"] == [str(real)]
    rows = {(x["figure"], x["kind"], x["mesh_dim"], x["rank"]): (x["projected"], x["measured"],
                                                                 x["status"])
            for x in got["exact"]}
    want = {("calls_per_step", "all_gather", "world"): 4,
            ("bytes_per_step", "all_gather", "world"): 151552,
            ("calls_per_step", "reduce_scatter", "world"): 2,
            ("bytes_per_step", "reduce_scatter", "world"): 75776,
            ("bytes", "parameters", ""): 37888, ("bytes", "gradients", ""): 37888,
            ("bytes", "optimizer_state", ""): 0}
    assert rows == {k + (r,): (v, v, "equal") for k, v in want.items() for r in (0, 1)}


def test_a_planted_byte_difference_is_a_mismatch_and_exits_3(tmp_path):
    proj = _copy(tmp_path, "ddp", "proj")
    trace = proj / "rank0.trace.json.gz"
    raw = gzip.decompress(trace.read_bytes()).decode()
    # gloo's all_reduce annotation gives the size: one more fp32 element, 4 bytes more
    assert raw.count('"Input Dims": [[18944]]') == 2
    trace.write_bytes(gzip.compress(raw.replace('"Input Dims": [[18944]]',
                                                '"Input Dims": [[18945]]').encode()))
    refresh_manifest(proj)
    res = _grade(proj, _copy(tmp_path, "ddp", "real"))
    assert res.exit_code == 3, res.output
    table = _table(res.output)
    assert "bytes/step all_reduce world 0 75,780 75,776 MISMATCH" in table
    assert "bytes/step all_reduce world 1 75,776 75,776 equal" in table
    assert res.output.splitlines()[-1] == (
        "grade: FAILED -- 1 of 14 exact figures differ, first: bytes/step all_reduce world "
        "rank 0 (projected 75,780, measured 75,776)")


def test_a_run_of_another_strategy_is_refused_in_one_line_with_exit_2(tmp_path):
    proj = _copy(tmp_path, "ddp", "proj")
    real = _copy(tmp_path, "fsdp2", "real")
    res = _grade(proj, real)
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"analyzer: {real}: not the configuration of {proj}, so its "
                               f"figures do not grade the projection: runs differ in strategy "
                               f"({proj}: ddp; {real}: fsdp2); runs differ in strategy_options")


def test_a_projection_at_another_world_size_is_refused_before_any_trace_is_read(tmp_path):
    proj = _projection_of_rank0(tmp_path, world=8)
    real = _copy(tmp_path, "ddp", "real")
    (real / "rank0.trace.json.gz").write_bytes(b"not a trace")  # never read: refused first
    refresh_manifest(real)
    res = _grade(proj, real)
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"analyzer: {real}: not the configuration of {proj}, so its figures do not grade the "
        f"projection: runs differ in world_size ({proj}: 8; {real}: 2); grade a run recorded "
        "with the projection's strategy, options, mesh, world size, model, batch, precision "
        "and training setup")


def test_a_run_whose_manifest_says_another_world_size_is_another_configuration(tmp_path):
    proj = _copy(tmp_path, "ddp", "proj")
    real = _copy(tmp_path, "ddp", "real")
    _edit_manifest(real, world_size=4)
    res = _grade(proj, real)
    assert res.exit_code == 2
    assert f"runs differ in world_size ({proj}: 2; {real}: 4)" in res.output


def _hsdp(dest: Path, ranks: list[int], *, categories: bool = True, mesh=HSDP_MESH) -> Path:
    """A 2 x 2 HSDP run directory holding the traces of ``ranks`` (fixtures/mesh/gloo_hsdp, per
    rank and step: 2 all_gathers of 8,192 bytes and a reduce_scatter of 8,192 on the shard
    dimension, an all_reduce of 4,096 on the replicate one) and, with ``categories``, 1,000
    parameter and gradient bytes and 2,000 optimizer-state bytes per rank."""
    dest.mkdir(parents=True)
    for r in ranks:
        (dest / f"rank{r}.trace.json.gz").write_bytes(
            gzip.compress((MESH / f"rank{r}.trace.json").read_bytes()))
    if categories:
        write_categories(dest / "memory_categories.parquet", {
            r: {"parameters": 1000, "gradients": 1000, "optimizer_state": 2000, "activations": 7}
            for r in ranks})
    write_manifest(dest, manifest(run_name=dest.name, strategy="hsdp", world_size=4, mesh=mesh))
    return dest


def test_grade_compares_the_projected_ranks_per_mesh_dimension(tmp_path):
    proj = _hsdp(tmp_path / "proj", [0, 3])
    res = _grade(proj, _hsdp(tmp_path / "real", [0, 1, 2]))
    assert res.exit_code == 0, res.output
    assert "ranks compared: 0 (projected ranks not in RUN: 3)\n" in res.output
    assert _table(res.output) == [
        "calls/step all_gather shard 0 2 2 equal",
        "bytes/step all_gather shard 0 16,384 16,384 equal",
        "calls/step all_reduce replicate 0 1 1 equal",
        "bytes/step all_reduce replicate 0 4,096 4,096 equal",
        "calls/step reduce_scatter shard 0 1 1 equal",
        "bytes/step reduce_scatter shard 0 8,192 8,192 equal",
        "memory bytes parameters - 0 1,000 1,000 equal",
        "memory bytes gradients - 0 1,000 1,000 equal",
        "memory bytes optimizer_state - 0 2,000 2,000 equal",
    ]


def test_a_projection_without_memory_categories_is_not_measured_and_exits_3(tmp_path):
    proj = _hsdp(tmp_path / "proj", [0, 3], categories=False)
    res = _grade(proj, _hsdp(tmp_path / "real", [0, 1, 2, 3]))
    assert res.exit_code == 3, res.output
    assert "memory bytes parameters - 0, 3 - 1,000 unknown" in _table(res.output)
    assert res.output.splitlines()[-1] == (
        "grade: FAILED -- 6 of 18 exact figures not measured, first: memory bytes parameters "
        "rank 0 (projected -, measured 1,000)")


def test_a_run_on_another_mesh_is_another_configuration(tmp_path):
    proj = _hsdp(tmp_path / "proj", [0])
    real = _hsdp(tmp_path / "real", [0], mesh={"shape": [1, 4], "dim_names": ["replicate", "shard"]})
    res = _grade(proj, real)
    assert res.exit_code == 2
    assert (f"runs differ in mesh ({proj}: shape [2, 2], dim_names [replicate, shard]; {real}: "
            "shape [1, 4], dim_names [replicate, shard])") in res.output


def test_ranks_text_writes_runs_of_three_as_ranges():
    assert ranks_text([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7, 8"
    assert ranks_text([0]) == "0"


@pytest.mark.integration
def test_grade_command_exit_codes_as_a_program(tmp_path):
    proj = _copy(tmp_path, "ddp", "proj")
    same = subprocess.run([sys.executable, "-m", "analyzer", "grade", str(proj),
                           str(_copy(tmp_path, "ddp", "real"))], capture_output=True, text=True)
    assert same.returncode == 0, same.stderr
    assert same.stdout.splitlines()[-1] == "grade: passed -- 14 exact figures equal on ranks 0, 1"
    other = subprocess.run([sys.executable, "-m", "analyzer", "grade", str(proj),
                            str(_copy(tmp_path, "fsdp2", "other"))], capture_output=True, text=True)
    assert other.returncode == 2 and other.stdout == ""
    assert "runs differ in strategy" in other.stderr


def test_the_verdict_names_a_difference_before_a_figure_not_measured():
    from fractions import Fraction

    from analyzer.cli.grade import lines
    from analyzer.compare.grade import Figure, Grade

    g = Grade(projection="p", run="r", projection_info=None, world_size=2, ranks_compared=[0],
              ranks_not_in_run=[], figures=[
                  Figure("bytes", "parameters", "", 0, None, Fraction(3)),
                  Figure("calls_per_step", "all_reduce", "world", 0, Fraction(1), Fraction(2))])
    assert not g.ok
    assert lines(g)[1][-1] == (
        "grade: FAILED -- 1 of 2 exact figures differ, 1 exact figures not measured, first: "
        "calls/step all_reduce world rank 0 (projected 1, measured 2)")


@pytest.mark.record
@pytest.mark.parametrize("strategy", ["fsdp2", "ddp"])
def test_a_projection_grades_equal_against_the_real_run_it_projects(tmp_path, strategy):
    """``tracer project`` at world 2 beside ``tracer record`` of the same options: every exact
    figure equal (the analyzer reads the fake group's collective calls, ingest rule
    cpu.fake_pg_call), exit 0."""
    from tests.tracer.helpers import run_tracer

    opts = ["--strategy", strategy, "--nproc", "2", "--hidden", "32", "--layers", "2", "--seq",
            "16", "--batch", "4", "--optimizer", "adamw", "--out", str(tmp_path)]
    proc, _ = run_tracer([*opts, "--name", "proj"], cwd=tmp_path,
                         module=[sys.executable, "-m", "tracer", "project"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    proc, _ = run_tracer([*opts, "--name", "real"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = runner.invoke(app, ["grade", str(tmp_path / "proj"), str(tmp_path / "real"),
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    figures = json.loads(res.output)["exact"]
    calls = {f["kind"]: f["measured"] for f in figures if f["figure"] == "calls_per_step"}
    assert calls == ({"all_gather": 4, "reduce_scatter": 2} if strategy == "fsdp2"
                     else {"all_reduce": 1})


def _flat_curves(tmp_path: Path, time_ns: int, kinds=("all_gather", "reduce_scatter")) -> Path:
    """A link model whose every call of ``kinds`` on 2 ranks takes ``time_ns`` (1 KiB..1 MiB,
    low half, high double)."""
    curves = [{"source": "hand-built", "kind": k, "group_size": 2, "nodes": 1, "dtype": "float32",
               "rows": [{"bytes": 1024, "time_ns": time_ns}, {"bytes": 1 << 20, "time_ns": time_ns}]}
              for k in kinds]
    path = tmp_path / "link.json"
    path.write_text(json.dumps(curves), encoding="utf-8")
    return path


def _replayed_steps(proj: Path, link_ns: int) -> list[int]:
    """Each profiled step of ``proj`` replayed by hand on CPU: its window less its calls' own
    time plus ``link_ns`` of link time (the ingest's tables: a second way to the replay)."""
    from analyzer.api import load_tables

    t = load_tables(proj)
    bd, c = t.breakdown, t.collectives
    return [int(b.step_ns) - int(c.loc[c["step"] == b.step, "dur_ns"].sum()) + link_ns
            for b in bd.itertuples()]


def test_the_projected_step_is_the_compute_plus_each_calls_link_time_on_cpu(tmp_path):
    """fsdp2's rank 0 as a projection at world 2, every call 1 ms on the link: on CPU (gloo, no
    overlap) each step replays as its window less its calls' own time plus 6 x 1 ms; the
    median step, computed here a second way from the ingest's tables."""
    import statistics

    proj = _projection_of_rank0(tmp_path, "fsdp2")
    real = _copy(tmp_path, "fsdp2", "real")
    res = _grade(proj, real, "--format", "json", "--link-model", _flat_curves(tmp_path, 1_000_000))
    assert res.exit_code == 0, res.output
    step = json.loads(res.output)["step"]
    want = _replayed_steps(proj, 6_000_000)
    # the median replayed step (the lower middle one of an even count: a replayed step)
    assert step["projected_ns"] == sorted(want)[(len(want) - 1) // 2]
    assert step["low_ns"] == min(want) and step["high_ns"] == max(want)
    measured = json.loads((real / "manifest.json").read_text())  # steps.parquet's, second way
    from analyzer.analyses.memory import read_steps, step_times

    st = step_times(read_steps(real / "steps.parquet"))
    assert step["measured_median_ns"] == round(statistics.median(st.loc[st["profiled"], "step_ns"]))
    assert step["error"] == (step["projected_ns"] - step["measured_median_ns"]) / step["measured_median_ns"]
    assert step["inside"] == (step["low_ns"] <= step["measured_median_ns"] <= step["high_ns"])
    assert measured["strategy"] == "fsdp2"


def test_the_arrival_wait_adds_to_each_calls_start_its_spread_to_the_interval(tmp_path):
    """The same projection with a link benchmark's table whose arrival curve of g=2 waits 2 ms
    (low 1, high 3) whatever the segment: each of the 6 calls starts 2 ms later (1 and 3 ms at
    the interval's ends); the assumption line says the mean wait; NCCL would add none."""
    from analyzer.analyses.linkmodel import read_link_table
    from analyzer.api import load_tables
    from analyzer.compare.projection import projected_step
    from analyzer.ingest.rundirs import find_job

    proj = _projection_of_rank0(tmp_path, "fsdp2")
    real = _copy(tmp_path, "fsdp2", "real")
    flat = _flat_curves(tmp_path, 1_000_000)
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"curves": json.loads(flat.read_text()), "arrival": [
        {"source": "hand-built", "group_size": 2, "nodes": 1, "rows": [
            {"segment_ns": 1_000_000, "wait_ns": 2_000_000, "low_ns": 1_000_000,
             "high_ns": 3_000_000}]}]}))
    res = _grade(proj, real, "--format", "json", "--link-model", table)
    assert res.exit_code == 0, res.output
    step = json.loads(res.output)["step"]
    want = _replayed_steps(proj, 6_000_000)
    assert step["projected_ns"] == sorted(want)[(len(want) - 1) // 2] + 6 * 2_000_000
    assert step["low_ns"] == min(want) + 6 * 1_000_000
    assert step["high_ns"] == max(want) + 6 * 3_000_000
    links = read_link_table([table])
    t = load_tables(proj)
    ps = projected_step(find_job(proj), t, links.curves, arrival=links.arrival)
    assert ps.assumptions[-1] == (
        "each collective starts its group's arrival wait after its last rank issues it, as the "
        "link benchmark measured it with every rank computing between calls (mean per call: "
        "g=2: 2 ms)")
    bare = projected_step(find_job(proj), t, links.curves)  # no arrival curve: said, none added
    assert bare.step_ns == step["projected_ns"] - 6 * 2_000_000
    assert bare.assumptions[-1] == (
        "no arrival wait measured for g=2 (nccl-tests, a report's transfers or an older link "
        "benchmark): those start when their last rank issues them")


def test_a_kind_without_a_link_curve_is_refused_in_one_line_with_exit_2(tmp_path):
    proj = _projection_of_rank0(tmp_path, "fsdp2")
    real = _copy(tmp_path, "fsdp2", "real")
    links = _flat_curves(tmp_path, 1000, kinds=("all_gather",))
    res = _grade(proj, real, "--link-model", links)
    assert res.exit_code == 2
    # the file that lacks the span is named first
    assert (f"{links}: reduce_scatter g=2 n=1: no link curve measured on this group span "
            "(curves of reduce_scatter: none)") in " ".join(res.output.split())


def test_several_runs_pool_their_step_times_and_each_is_graded(tmp_path):
    proj = _projection_of_rank0(tmp_path, "fsdp2")
    a, b = _copy(tmp_path, "fsdp2", "a"), _copy(tmp_path, "fsdp2", "b")
    res = _grade(proj, a, b, "--format", "json", "--link-model", _flat_curves(tmp_path, 1000))
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["runs"] == [str(a), str(b)]
    from analyzer.analyses.memory import read_steps, step_times

    one = int(step_times(read_steps(a / "steps.parquet"))["profiled"].sum())
    assert one >= 1 and got["step"]["measured_steps"] == 2 * one  # the same steps, twice
    other = _copy(tmp_path, "ddp", "other")
    res = _grade(proj, a, other)
    assert res.exit_code == 2 and f"{other}: not the configuration of {proj}" in res.output


def test_a_run_given_twice_is_refused_and_a_projection_as_run_has_no_step(tmp_path):
    proj = _projection_of_rank0(tmp_path, "fsdp2")
    real = _copy(tmp_path, "fsdp2", "real")
    res = _grade(proj, proj)
    assert res.exit_code == 2 and "given twice (as PROJECTION or another RUN)" in res.output
    # a projection as RUN grades the exact figures, but no step time: its times are one process's
    other = _projection_of_rank0(tmp_path / "b", "fsdp2") if (tmp_path / "b").mkdir() is None else None
    res = _grade(proj, other, "--format", "json", "--link-model", _flat_curves(tmp_path, 1000))
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["step"] is None
    res = _grade(proj, real, real)
    assert res.exit_code == 2 and "given twice (as PROJECTION or another RUN)" in res.output


def test_gate_skips_a_projection_it_has_no_numerics_to_gate(tmp_path):
    root = tmp_path / "traces"
    root.mkdir()
    _projection_of_rank0(root, "fsdp2")
    _copy(root, "fsdp2", "real")
    _edit_manifest(root / "real", run_name="real")
    res = runner.invoke(app, ["gate", str(root)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    # the projection's run name is its manifest's, fsdp2
    assert "SKIP fsdp2: not_recorded -- projection: the fake process group moves no data" in res.output
    assert ("gate: passed (1 projection(s) skipped: tracer project moves no data, so there are no "
            "numerics to gate: fsdp2)") in res.output


def test_a_bad_link_model_is_refused_even_without_a_projection(tmp_path):
    real = _copy(tmp_path, "fsdp2", "real")
    bad = tmp_path / "bad.txt"
    bad.write_text("garbage\n")
    res = runner.invoke(app, ["report", str(real), "--out", str(tmp_path / "r"),
                              "--link-model", str(bad)], env={"COLUMNS": "200"})
    assert res.exit_code == 2 and "not nccl-tests output" in res.output
    res = runner.invoke(app, ["report", str(real), "--out", str(tmp_path / "r"), "--format", "json",
                              "--link-model", str(_flat_curves(tmp_path, 1000))],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    warnings = json.loads((tmp_path / "r" / "report.json").read_text())["warnings"]
    assert ("--link-model: no run here is a projection (tracer project), so no step was "
            "projected with it") in warnings


def test_a_real_run_as_projection_with_the_projection_as_run_is_refused_as_swapped(tmp_path):
    proj = _projection_of_rank0(tmp_path, "fsdp2")
    real = _copy(tmp_path, "fsdp2", "real")
    res = _grade(real, proj)
    assert res.exit_code == 2
    assert res.output.strip() == (
        f"analyzer: {real}: not a projection (tracer project writes one), but RUN {proj} is: "
        f"the arguments are swapped; pass the projection first: analyzer grade {proj} {real}")
