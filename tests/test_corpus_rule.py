"""The suite runs in a fresh clone with no corpus beside it: corpus tests skip, saying why."""

from __future__ import annotations

import pytest

import os
import subprocess
import sys
from pathlib import Path

from tests import corpus as corpus_rule

REPO = Path(__file__).resolve().parents[1]


def _pytest_without_corpus(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != corpus_rule.ENV}
    # a folder beside the repo named like the old fixed location must not be found either
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", *args]
    return subprocess.run(cmd,
                          cwd=REPO, env=env, capture_output=True, text=True)


def test_corpus_root_is_none_when_the_variable_is_unset(monkeypatch):
    monkeypatch.delenv(corpus_rule.ENV, raising=False)
    assert corpus_rule.corpus_root() is None


def test_corpus_root_is_none_when_the_variable_names_no_folder(monkeypatch, tmp_path):
    monkeypatch.setenv(corpus_rule.ENV, str(tmp_path / "absent"))
    assert corpus_rule.corpus_root() is None


def test_corpus_root_is_the_folder_the_variable_names(monkeypatch, tmp_path):
    monkeypatch.setenv(corpus_rule.ENV, str(tmp_path))
    assert corpus_rule.corpus_root() == tmp_path.resolve()


@pytest.mark.integration
def test_whole_suite_collects_without_the_corpus(tmp_path):
    proc = _pytest_without_corpus("--collect-only", "-q", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "error" not in proc.stdout.lower().splitlines()[-1], proc.stdout[-500:]


@pytest.mark.integration
def test_corpus_tests_skip_with_a_reason_naming_the_variable(tmp_path):
    proc = _pytest_without_corpus("-q", "-rs", "tests/reports/test_busbw.py",
                                  "tests/reports/test_integrity.py::"
                                  "test_communication_per_profiled_step_against_the_corpus_readme",
                                  tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:]
    skips = [ln for ln in proc.stdout.splitlines() if ln.startswith("SKIPPED")]
    assert skips and all(corpus_rule.ENV in ln for ln in skips), proc.stdout[-2000:]
