"""How a stop signal ends the launcher of ``tracer record``: Ctrl-C, SIGTERM, SIGHUP or SIGQUIT
raises ``KeyboardInterrupt`` once, and a short section that creates something the clean-up must
find can hold those signals until it is bound to a name (``stop_signals_held``). Torch-free:
``tracer.rundir`` takes its lock under it."""

from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals that stop a record: Ctrl-C, ``kill`` / a batch system, a closed terminal, Ctrl-\\
(SIGQUIT, whose default core dump would skip the clean-up)."""

_STOPPED: list[int] = []


def stop_requested() -> bool:
    """True once a stop signal reached ``stop_on_signals``' handler: its KeyboardInterrupt may
    surface as another exception (raised inside a C extension's module init, an import of
    pyarrow or ssl turns it into a TypeError), which is then the interruption, not a failure."""
    return bool(_STOPPED)


def stop_on_signals() -> None:
    """Make the first ``STOP_SIGNALS`` signal raise ``KeyboardInterrupt`` and ignore every
    later one (the clean-up it starts then runs to its end: one line, exit 130, no traceback,
    no worker and no staging folder left). A signal this process inherited as ignored (``nohup``:
    SIGHUP) stays ignored. Call in the main thread before anything is written."""
    def on_stop(signum, frame):
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN)
        _STOPPED.append(signum)
        raise KeyboardInterrupt

    for s in STOP_SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, on_stop)


@contextlib.contextmanager
def stop_signals_held():
    """Block ``STOP_SIGNALS`` inside the ``with``: what it creates is bound to a name the
    clean-up sees before a stop signal can interrupt. One that came meanwhile is raised (as
    ``stop_on_signals``' KeyboardInterrupt) on leaving."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:  # the mask as it was (nested: still held); a pending signal is raised here
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
