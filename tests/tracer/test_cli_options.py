"""``tracer record``'s options are ``RecordConfig``'s fields (tracer/cli.py builds them from
tracer/config.py), and the refusals of what one command cannot record are one line, exit 2."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main

from tests.tracer.helpers import run_tracer
from tracer.cli import app
from tracer.config import RecordConfig

LAUNCHER_ONLY = {"repeat_index", "experiment_order", "arm_settings", "baseline_id"}
"""Fields the launcher passes to its workers; hidden from ``--help``."""


def _record_options() -> dict:
    command = typer.main.get_command(app).commands["record"]
    return {p.name: p for p in command.params}


def test_every_config_field_is_a_record_option_with_its_default_and_help():
    options = _record_options()
    for f in dataclasses.fields(RecordConfig):
        if f.name == "strategy":  # the command's takes lists and 'all'
            continue
        option = options[f.name]
        assert option.default == f.default, f.name
        assert option.help == f.metadata.get("help"), f.name
        assert option.hidden == (f.name in LAUNCHER_ONLY), f"{f.name}: a visible option needs help"
    assert options["timeout_s"].opts == ["--timeout"]
    assert options["reshard_after_forward"].secondary_opts == ["--no-reshard-after-forward"]
    assert set(options) - {f.name for f in dataclasses.fields(RecordConfig)} == {"arm", "sweep"}


@pytest.mark.record
@pytest.mark.parametrize("args, torchrun, said", [
    (["--strategy", "all"], True, "--strategy all: under torchrun record one strategy per torchrun command"),
    (["--strategy", "ddp", "--repeat", "2"], True, "--repeat 2: under torchrun record one run per torchrun"),
    (["--strategy", "ddp", "--arm", "a="], True, "--arm: under torchrun record one run per torchrun"),
    (["--arm", "a=", "--name", "x"], False, "--name x: with --arm / --sweep each arm names its runs"),
])
def test_what_one_command_cannot_record_is_one_line_exit_2(tmp_path, args, torchrun, said):
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"} if torchrun else {}
    proc, _ = run_tracer([*args, "--out", str(tmp_path / "out")], tmp_path, env_extra=env)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("tracer: ") and said in line
    assert not (tmp_path / "out").exists()


def test_a_bad_log_level_is_refused_before_the_record_starts(tmp_path, monkeypatch):
    """PARITYTRACE_LOG is read by each rank after the baseline: a bad value is refused up
    front, one line, exit 2, nothing written."""
    from typer.testing import CliRunner

    monkeypatch.setenv("PARITYTRACE_LOG", "LOUD")
    res = CliRunner().invoke(app, ["record", "--strategy", "ddp", "--out", str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert "PARITYTRACE_LOG: is 'LOUD', not a logging level" in res.output
    assert not (tmp_path / "out").exists()


# -- --nproc: bounded before anything starts ------------------------------------------------------

def test_nproc_above_the_largest_world_is_refused():
    from tracer.config import MAX_NPROC

    with pytest.raises(ValueError, match=f"^--nproc {MAX_NPROC + 1}: must be at most {MAX_NPROC} ranks"):
        RecordConfig(strategy="ddp", nproc=MAX_NPROC + 1, batch=MAX_NPROC + 1)
    RecordConfig(strategy="ddp", nproc=MAX_NPROC, batch=MAX_NPROC)


def test_the_built_in_launcher_takes_only_the_ranks_this_machine_holds():
    from tracer.record import RANK_MEMORY_BYTES, check_ranks_fit_machine

    memory = 16 * RANK_MEMORY_BYTES
    check_ranks_fit_machine([RecordConfig(strategy="ddp", nproc=16, batch=16)], memory)
    check_ranks_fit_machine([RecordConfig(strategy="single", nproc=64, batch=64)], memory)  # 1 rank
    with pytest.raises(ValueError, match=r"^--nproc 17: the built-in launcher .* hold at most 16; "
                                         r"pass --nproc 16 or less, or launch across machines with torchrun$"):
        check_ranks_fit_machine([RecordConfig(strategy="ddp", nproc=17, batch=17)], memory)
    check_ranks_fit_machine([RecordConfig(strategy="ddp", nproc=17, batch=17)], None)  # unknown: unchecked


@pytest.mark.record
def test_nproc_beyond_the_machine_is_one_line_before_any_rank_starts(tmp_path):
    """65536 ranks of at least 256 MiB each (16 TiB): refused in one line, exit 2, before a
    worker starts (``alive_with_tag``) or the run dir is made."""
    from tests.tracer.helpers import alive_with_tag

    proc, tag = run_tracer(["--strategy", "ddp", "--nproc", "65536", "--batch", "65536",
                            "--out", str(tmp_path / "o")], tmp_path, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("tracer: --nproc 65536: the built-in launcher starts every rank"), lines
    assert not (tmp_path / "o").exists() and alive_with_tag(tag) == []
