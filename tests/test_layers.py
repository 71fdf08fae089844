"""The layer marks are true (tests/layers.py): a test that starts a program, records or reads the
corpus without the mark that allows it fails, and one that uses a record fixture without the
``record`` mark is refused at collection. Each case runs a small pytest session in this process
(pytester) with the suite's own hooks, so the guard checked is the one the suite runs."""

from __future__ import annotations

import sys

import pytest

from tests import layers

pytest_plugins = ["pytester"]
pytestmark = pytest.mark.integration  # the inner tests start a child interpreter

HOOKS = ("from tests.conftest import pytest_configure, pytest_collection_modifyitems, "
         "pytest_runtest_setup, _marks_true\n")


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.delenv("PARITYTRACE_LAYERS_LOG", raising=False)
    pytester.makeconftest(HOOKS)
    return pytester


def test_argv_of_a_record_needs_the_record_mark():
    py = sys.executable
    assert layers.needs([py, "-m", "tracer", "record", "--strategy", "ddp"]) == layers.RECORD
    assert layers.needs(["torchrun", "--nproc_per_node", "2", "-m", "tracer"]) == layers.RECORD
    assert layers.needs([py, "tests/analyzer/gloo_record.py", "/tmp/x"]) == layers.RECORD
    assert layers.needs([py, "-m", "analyzer", "report", "traces"]) == layers.INTEGRATION
    assert layers.needs(["chromium", "--headless"]) == layers.INTEGRATION


def test_a_fast_test_that_starts_a_program_fails_naming_it(inner):
    inner.makepyfile(test_x="""
        import subprocess, sys
        def test_spawns():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """)
    res = inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    res.assert_outcomes(passed=1, errors=1)  # its teardown fails it
    assert "started" in res.stdout.str() and "needs the integration mark" in res.stdout.str()


def test_the_same_test_with_the_integration_mark_passes(inner):
    inner.makepyfile(test_x="""
        import subprocess, sys, pytest
        @pytest.mark.integration
        def test_spawns():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        """)
    inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist").assert_outcomes(passed=1)


def test_a_test_that_records_needs_the_record_mark_not_integration(inner):
    inner.makepyfile(test_x="""
        import subprocess, sys, pytest
        @pytest.mark.integration
        def test_records():
            # exits at once (no such strategy); starting it is what counts
            subprocess.run([sys.executable, "-m", "tracer", "record", "--strategy", "nope"])
        """)
    res = inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    res.assert_outcomes(passed=1, errors=1)  # its teardown fails it
    assert "needs the record mark" in res.stdout.str()


def test_a_fast_test_that_reads_the_corpus_fails(inner, tmp_path, monkeypatch):
    corpus = tmp_path / "corpus"
    (corpus / "job").mkdir(parents=True)
    (corpus / "job" / "rank0.json").write_text("{}")
    monkeypatch.setattr(layers, "_CORPUS", str(corpus))
    inner.makepyfile(test_x=f"""
        from pathlib import Path
        def test_reads():
            assert Path({str(corpus / "job" / "rank0.json")!r}).read_text() == "{{}}"
        def test_writes_a_neighbour_named_like_it():
            Path({str(tmp_path / "corpus-other.txt")!r}).write_text("x")
        """)
    res = inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    res.assert_outcomes(passed=2, errors=1)
    assert "read the corpus" in res.stdout.str()


def test_a_record_fixture_without_the_record_mark_is_refused_at_collection(inner, monkeypatch):
    monkeypatch.setattr(layers, "RECORD_FIXTURES", {"some_run"})
    inner.makepyfile(test_x="""
        import pytest
        @pytest.fixture
        def some_run():
            return 1
        def test_reads(some_run):
            assert some_run == 1
        @pytest.mark.record
        def test_marked(some_run):
            assert some_run == 1
        """)
    res = inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "test_x.py::test_reads uses some_run without the record mark" in res.stderr.str()
    assert "test_marked" not in res.stderr.str()


def test_unmarked_tests_are_put_in_the_fast_layer(inner):
    inner.makepyfile(test_x="""
        import pytest
        def test_plain():
            pass
        @pytest.mark.integration
        def test_marked():
            pass
        """)
    res = inner.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-m", "fast")
    res.assert_outcomes(passed=1, deselected=1)
