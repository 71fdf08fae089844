"""Environment variables (analyzer/contract/settings.py): each read there and nowhere else in the
analyzer and reports, each listed in docs/environment.md's table as the module states it, a bad value one
``BadInput`` line naming the variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from analyzer.contract import settings
from analyzer.contract.errors import BadInput

REPO = Path(__file__).resolve().parents[2]
NOT_SETTINGS = {"PARITYTRACE_HTA_RUNNER": "test hook of analyzer/compare/hta_child.py",
                "COLUMNS": "the terminal's width (analyzer/cli/richout.py), not ours to check"}


def _table_rows() -> list[tuple[str, ...]]:
    text = (REPO / "docs" / "environment.md").read_text()
    section = text.split("# Environment variables", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [tuple(cell.strip() for cell in row.strip("|").split("|")) for row in rows]


def test_environment_table_is_the_settings_module():
    assert _table_rows() == [(f"`{k.name}`", k.default, k.unit, k.what) for k in settings.KNOBS]


def _environment_reads(path: Path) -> list[str]:
    """Names read through ``os.environ.get(X)``, ``os.environ[X]`` or ``os.getenv(X)``; a name
    that is not a string literal is returned as the expression's source."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("os.environ.get", "os.getenv"):
            arg = node.args[0]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ":
            arg = node.slice
        else:
            continue
        found.append(arg.value if isinstance(arg, ast.Constant) else ast.unparse(arg))
    return found


def test_analyzer_and_reports_read_the_environment_only_through_settings():
    strays = []
    for folder in ("analyzer", "reports"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.name == "settings.py" and path.parent.name == "contract":
                continue
            strays += [f"{path.relative_to(REPO)}: {name}" for name in _environment_reads(path)
                       if name not in NOT_SETTINGS]
    assert not strays, "read these through analyzer/contract/settings.py: " + "; ".join(strays)


def test_the_scan_finds_a_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nos.environ.get('A')\nos.environ['B']\nos.getenv(NAME)\n")
    assert _environment_reads(probe) == ["A", "B", "NAME"]


@pytest.mark.parametrize("knob, value, read, expected", [
    (settings.TABLES_MEMORY, "1K", settings.tables_memory_bytes, 1024),
    (settings.TABLES_MEMORY, " 2g ", settings.tables_memory_bytes, 2 * 2**30),
    (settings.TABLES_MEMORY, "", settings.tables_memory_bytes, 256 * 2**20),
    (settings.MAX_TRACE_BYTES, "4096", settings.max_trace_bytes, 4096),
    (settings.MAX_TRACE_BYTES, "", settings.max_trace_bytes, None),
    (settings.DASK_TIMEOUT_S, "2.5", settings.dask_timeout_s, 2.5),
    (settings.DASK_TIMEOUT_S, "  ", settings.dask_timeout_s, 30.0),
    (settings.HTA_TIMEOUT_S, "7.5", settings.hta_timeout_s, 7.5),
    (settings.HTA_TIMEOUT_S, "", settings.hta_timeout_s, None),
    (settings.DASK_SCHEDULER_ADDRESS, "tcp://h:8786", settings.dask_scheduler_address, "tcp://h:8786"),
    (settings.LOG, "info", settings.log_level, "INFO"),
])
def test_a_value_is_read_in_its_unit_and_blank_is_the_default(monkeypatch, knob, value, read, expected):
    monkeypatch.setenv(knob.name, value)
    assert read() == expected


def test_cache_home_defaults_to_dot_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert settings.cache_home() == tmp_path
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.cache_home() == Path.home() / ".cache"


@pytest.mark.parametrize("knob, value, read, said", [
    (settings.TABLES_MEMORY, "lots", settings.tables_memory_bytes, "is 'lots', not a size"),
    (settings.TABLES_MEMORY, "1.5G", settings.tables_memory_bytes, "is '1.5G', not a size"),
    (settings.MAX_TRACE_BYTES, "0", settings.max_trace_bytes, "is '0', not a positive number of bytes"),
    (settings.MAX_TRACE_BYTES, "-5", settings.max_trace_bytes, "is '-5', not a positive number of bytes"),
    (settings.MAX_TRACE_BYTES, "\u00b2", settings.max_trace_bytes, "is '\u00b2', not a positive number of bytes"),
    (settings.DASK_TIMEOUT_S, "inf", settings.dask_timeout_s, "is 'inf', not a number of seconds > 0"),
    (settings.DASK_TIMEOUT_S, "0", settings.dask_timeout_s, "is '0', not a number of seconds > 0"),
    (settings.HTA_TIMEOUT_S, "soon", settings.hta_timeout_s, "is 'soon', not a number of seconds > 0"),
    (settings.HTA_TIMEOUT_S, "nan", settings.hta_timeout_s, "is 'nan', not a number of seconds > 0"),
    (settings.LOG, "LOUD", settings.log_level, "is 'LOUD', not a logging level"),
])
def test_a_bad_value_is_one_bad_option_line_naming_the_variable(monkeypatch, knob, value, read, said):
    monkeypatch.setenv(knob.name, value)
    with pytest.raises(BadInput) as caught:
        read()
    assert caught.value.reason == "bad_option"
    line = caught.value.one_line()
    assert "\n" not in line and line.startswith(f"{knob.name}: {said}")
    assert re.search(rf"{knob.name}=\S+|e\.g\. \S+|\(256M\)", line)  # says a value to set


@pytest.mark.parametrize("value", ["lots", "0", "\u00b2", "-1"])
def test_a_bad_cache_cap_is_a_warning_and_the_default(monkeypatch, caplog, value):
    monkeypatch.setenv(settings.CACHE_MAX_BYTES.name, value)
    assert settings.cache_max_bytes() == 2 * 2**30
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert settings.CACHE_MAX_BYTES.name in caplog.records[0].getMessage()


def test_every_command_refuses_a_bad_setting_before_its_work(monkeypatch, tmp_path):
    """A bad trace cap is refused even where the work would never read it (a report of a
    folder with no trace to decode: today's cause, a warm cache, skips the decode too)."""
    from typer.testing import CliRunner

    from analyzer.cli.app import app

    monkeypatch.setenv(settings.MAX_TRACE_BYTES.name, "-1")
    res = CliRunner().invoke(app, ["summary", str(tmp_path / "absent")])
    assert res.exit_code == 2
    assert "PARITYTRACE_MAX_TRACE_BYTES: is '-1'" in res.output
    monkeypatch.setenv(settings.MAX_TRACE_BYTES.name, "5")
    res = CliRunner().invoke(app, ["summary", str(tmp_path / "absent")])
    assert "PARITYTRACE_MAX_TRACE_BYTES" not in res.output  # the folder's own refusal instead
