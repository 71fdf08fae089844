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
