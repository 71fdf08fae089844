"""Two stop signals in one burst end a command once, with no traceback: the first raises
``KeyboardInterrupt``, the second finds a handler that does nothing. (With ``SIG_IGN`` set by
the first handler, CPython raised "OSError: Signal 15 ignored due to race condition" for the
second, a traceback in the middle of the clean-up.) Each case runs in a child interpreter, whose
signal handlers it may change."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BURST = """
import os, signal, sys
sys.path.insert(0, {repo!r})
{install}
both = {{signal.SIGTERM, signal.{other}}}
signal.pthread_sigmask(signal.SIG_BLOCK, both)  # both pending before either is handled
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.{other})
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
    sum(range(10_000))
except KeyboardInterrupt:
    print("interrupted")
sum(range(10_000))
print("clean-up ran to its end")
"""


@pytest.mark.parametrize("install,other", [
    ("from analyzer.contract.stopping import stop_on_signals; stop_on_signals()", "SIGINT"),
    # the analyzer (cli/app.py ``run``) stops on SIGTERM and SIGHUP; Ctrl-C keeps Python's own
    # KeyboardInterrupt
    ("from analyzer.contract.stopping import stop_on_signals; "
     "stop_on_signals((signal.SIGTERM, signal.SIGHUP))", "SIGHUP"),
], ids=["tracer", "analyzer"])
def test_a_burst_of_stop_signals_interrupts_once_without_a_traceback(install, other):
    code = textwrap.dedent(BURST.format(repo=str(REPO), install=install, other=other))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["interrupted", "clean-up ran to its end"], proc.stdout
    assert proc.stderr == ""
