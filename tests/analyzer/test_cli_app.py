"""The `analyzer` app's contract: every reason code raised is a ``Reason`` and documented once
in docs/errors.md's table, exit codes are ``ExitCode``s, and a report run does not import rich."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from analyzer.contract.errors import BadInput, ExitCode, Reason
from tests.inputs import cli

REPO = Path(__file__).parents[2]
PRODUCT = [p for pkg in ("analyzer", "reports", "tracer") for p in sorted((REPO / pkg).rglob("*.py"))]


def _raised_reasons() -> list[tuple[str, str]]:
    """(where, code) for the reason of every ``BadInput(...)`` call in product code: its second
    argument or ``reason=``, a literal or ``Reason.X``; another expression must pass on an
    existing error's ``.reason``."""
    found = []
    for path in PRODUCT:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            name = getattr(node, "func", None)
            if getattr(name, "id", getattr(name, "attr", None)) != "BadInput":
                continue
            if any(isinstance(a, ast.Starred) for a in node.args):
                continue  # BadInput(*fields) rebuilds an error raised elsewhere
            args = node.args[1:2] + [k.value for k in node.keywords if k.arg == "reason"]
            assert len(args) == 1, f"{path}:{node.lineno}: BadInput without a reason"
            arg, where = args[0], f"{path.relative_to(REPO)}:{node.lineno}"
            if isinstance(arg, ast.Constant):
                found.append((where, arg.value))
            elif isinstance(arg, ast.Attribute) and getattr(arg.value, "id", None) == "Reason":
                found.append((where, getattr(Reason, arg.attr).value))
            else:
                assert isinstance(arg, ast.Attribute) and arg.attr == "reason", \
                    f"{where}: reason {ast.unparse(arg)} is neither a code nor an error's .reason"
    return found


def test_every_reason_raised_is_a_member():
    found = _raised_reasons()
    assert len(found) > 60  # the scan sees the raise sites
    members = {r.value for r in Reason}
    unknown = [(where, code) for where, code in found if code not in members]
    assert unknown == []
    unused = members - {code for _, code in found} - {Reason.INTERNAL}
    assert unused == set()  # a code nothing raises is not a code


def test_reason_is_a_string_and_unknown_codes_are_refused():
    err = BadInput("x.json", "truncated", "cut")
    assert err.reason is Reason.TRUNCATED and err.reason == "truncated"
    assert f"{err.reason}" == "truncated" and err.exit_code == ExitCode.BAD_INPUT == 2
    try:
        BadInput("x.json", "truncatd", "cut")
    except ValueError as exc:
        assert "truncatd" in str(exc)
    else:
        raise AssertionError("a misspelt reason was accepted")


def test_errors_doc_lists_every_reason_once_and_every_exit_code():
    section = (REPO / "docs" / "errors.md").read_text()
    codes = Counter()
    exits = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) > 2 and "`" in cells[1]:
            codes.update(re.findall(r"`([a-z_]+)`", cells[1]))
        elif len(cells) > 2 and cells[1].strip().isdigit():
            exits.add(int(cells[1]))
    assert codes == Counter({r.value: 1 for r in Reason})
    assert exits == {int(c) for c in ExitCode}


@pytest.mark.integration
def test_report_run_does_not_import_rich(tmp_path):
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "analyzer", "report",
                           str(tmp_path / "missing"), "--rtol", "1e-3", "--format", "md"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == ExitCode.BAD_INPUT, proc.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "typer" in imported  # the check itself sees imports
    assert "rich.console" not in imported


@pytest.mark.parametrize("args", [("report", ""), ("summary", ""), ("merge", ""), ("gate", ""),
                                  ("drift", "", "x"), ("report", " ")])
def test_an_empty_path_is_a_usage_error_not_the_current_folder(args, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "." would be an empty folder: a different error
    proc = cli(*args)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "an empty path" in lines[0] and "Traceback" not in proc.stderr
