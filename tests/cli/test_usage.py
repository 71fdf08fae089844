"""Usage errors and --help: an unknown format, a missing argument, a misspelt command and merge
options that match nothing are one line (exit 2); --help says what an option does."""

from __future__ import annotations

import pytest

from tests.inputs import bad_input, cli, cli_proc, copy_run


@pytest.mark.integration
def test_unknown_report_format_and_missing_argument(tmp_path, ddp_run):  # usage errors
    bad_input(cli("report", str(ddp_run), "--format", "pdf", "--out", str(tmp_path / "o")),
              "unknown format(s) pdf", "analyzer report --help")
    bad_input(cli("report"), "Missing argument", "--help")
    bad_input(cli_proc("sumary", str(ddp_run)), "No such command 'sumary'")


def test_merge_options_that_match_nothing(tmp_path, ddp_run):
    run = str(copy_run(ddp_run, tmp_path / "ddp"))  # the parse caches land beside the copy
    out = str(tmp_path / "m.json.gz")
    bad_input(cli("merge", run, "-o", out, "--steps", "99"), "no trace has ProfilerStep [99]")
    bad_input(cli("merge", run, "-o", out, "--ref-rank", "7"), "no trace of rank 7")
    bad_input(cli("merge", run, "-o", out, "--steps", "two"), "--steps")


def _help(cmd: str) -> str:
    """``analyzer CMD --help`` as one line of words (rich's box characters removed)."""
    import re

    return " ".join(re.sub(r"[\u2500-\u257f]", " ", cli(cmd, "--help").stdout).split())


def test_allow_incomplete_help_says_what_it_does():
    for cmd in ("report", "gate"):
        text = _help(cmd)
        assert "Skip runs without a manifest" not in text and "partial rank sets" not in text
    assert "as found: marked incomplete, parity not checked" in _help("report")
    assert "Folders of foreign traces need no flag" in _help("report")
    assert "listed SKIP, not gated" in _help("gate")
