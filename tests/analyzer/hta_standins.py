"""Stand-ins for HolisticTraceAnalysis in the cross-check's child process
(``PARITYTRACE_HTA_RUNNER=tests.analyzer.hta_standins:NAME``, analyzer/compare/hta_child.py):
each takes the trace folder and behaves as HTA might. Standard library only, so the child
starts fast."""

from __future__ import annotations

import logging
import multiprocessing as mp
import sys
import threading

LOG_TEXT = "hta-standin-log-line"


def _chatter() -> None:
    """What HTA does on every run: log lines and prints on stdout and stderr."""
    logging.getLogger("hta").warning("%s via logging", LOG_TEXT)
    print(f"{LOG_TEXT} on stdout", flush=True)
    print(f"{LOG_TEXT} on stderr", file=sys.stderr, flush=True)


def _block(_) -> None:
    threading.Event().wait()  # never set


def hang(trace_dir: str) -> dict:
    """Logs, starts a fork pool as HTA does (hta/common/trace.py), and never returns: its
    workers block for ever, and so does this process."""
    _chatter()
    pool = mp.get_context("fork").Pool(2)
    pool.map(_block, [0, 1], chunksize=1)
    raise AssertionError("unreachable")


def chatty(trace_dir: str) -> dict:
    """Logs and prints, then returns a figure for rank 0: 12.34 %."""
    _chatter()
    return {"rank": [0], "hta_overlap_pct": [12.34]}


def key_error(trace_dir: str) -> dict:
    """Raises as HTA does under pandas 3.x on some traces, with a two-line message."""
    raise KeyError("'stream'\nsecond line of HTA's traceback text")


def dies(trace_dir: str) -> dict:
    """Ends the process without a result, as the kernel's OOM killer would."""
    _chatter()
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable")
