"""analyzer/cli_coerce.py: str / float / Path / bool options without pydantic give exactly
what typer's own coercion gives (the oracle: typer's ``build_runtime_param``), and a report
run imports neither pydantic nor rich."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

typer_coercion = pytest.importorskip("typer._coercion")

from typer.main import get_command  # noqa: E402

from analyzer import cli_coerce  # noqa: E402
from analyzer.cli import app  # noqa: E402

VALUES = {
    "rtol": ["1e-3", ".5", "2.", "-0", "-1.5E+07", "007", "1" * 80, "inf", "nan", "+1", " 1",
             "1_0", "0x10", "abc", ""],
    "directory": ["runs/a", "", ".", "a b", "~/x", "/tmp"],
    "fmt": ["md,json", "", "ü"],
    "allow_incomplete": ["true", "0"],
}


def _outcome(rp, value, param, ctx):
    try:
        got = rp._coerce_value(value, param=param, ctx=ctx)
    except Exception as exc:  # the oracle's own error: compared by type and message
        return ("error", type(exc).__name__, str(exc))
    return ("ok", type(got).__name__, repr(got))


def test_plain_params_equal_typers_own_coercion():
    group = get_command(app)
    report = group.commands["report"]
    assert isinstance(report, cli_coerce.Command)
    ctx = report.make_context("report", ["somewhere"])
    params = {p.name: p for p in report.params}
    for name, values in VALUES.items():
        p = params[name]
        d = p.type_descriptor
        fast = cli_coerce._PlainParam(parameter_info=d.parameter_info, annotation=d.annotation,
                                      descriptor=d)
        own = typer_coercion.build_runtime_param(d)
        for v in values:
            assert _outcome(fast, v, p, ctx) == _outcome(own, v, p, ctx), (name, v)
        assert fast.coerce(None, param=p, ctx=ctx) is None


def test_other_params_keep_typers_coercion():
    group = get_command(app)
    summary = group.commands["summary"]
    summary.make_context("summary", ["somewhere"])
    kinds = {p.name: type(p._runtime_param).__name__ for p in summary.params}
    assert kinds["path"] == "_PlainParam"
    assert kinds["fmt"] != "_PlainParam"  # an Enum: typer's choice adapter
    assert kinds["jobs"] != "_PlainParam"  # an int with min=1: typer's bounds check


def test_report_run_imports_neither_pydantic_nor_rich(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "analyzer", "report",
                           str(tmp_path / "missing"), "--rtol", "1e-3", "--format", "md"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2])
    assert proc.returncode == 2, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "typer" in imported  # the check itself sees imports
    assert "pydantic" not in imported
    assert "rich.console" not in imported
