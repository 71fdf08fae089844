"""How a stop signal ends a command (``tracer record``'s launcher: ``STOP_SIGNALS``; ``analyzer``:
SIGTERM and SIGHUP): the first raises ``KeyboardInterrupt`` once, and a short section that
creates something the clean-up must find can defer it until that is bound to a name
(``stop_signals_held``). Standard library only: ``tracer.rundir`` takes its lock under it."""

from __future__ import annotations

import contextlib
import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
"""Signals that stop a record: Ctrl-C, ``kill`` / a batch system, a closed terminal, Ctrl-\\
(SIGQUIT, whose default core dump would skip the clean-up)."""

_STOPPED: list[int] = []
_HOLDING: list[int] = []
"""Non-empty inside ``stop_signals_held``: a marker, then the signal that came meanwhile."""


def stop_requested() -> bool:
    """True once a stop signal reached ``stop_on_signals``' handler: its KeyboardInterrupt may
    surface as another exception (raised inside a C extension's module init, an import of
    pyarrow or ssl turns it into a TypeError), which is then the interruption, not a failure."""
    return bool(_STOPPED)


def _ignore(signum, frame) -> None:
    """A stop signal after the first: nothing to do (the clean-up it started runs on)."""


def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    """Make the first of ``signals`` raise ``KeyboardInterrupt`` and ignore every later one and
    Ctrl-C (the clean-up it starts then runs to its end: one line, exit 130, no traceback, no
    worker and no staging folder left). A signal this process inherited as ignored (``nohup``:
    SIGHUP) stays ignored. Call in the main thread before anything is written."""
    def on_stop(signum, frame):
        # later signals go to a handler that does nothing, not SIG_IGN: CPython raises "OSError:
        # Signal N ignored due to race condition" for a signal that arrived before the switch
        # and finds SIG_IGN when its turn comes (two signals in one burst: a traceback)
        for s in (*signals, signal.SIGINT):
            signal.signal(s, _ignore)
        _STOPPED.append(signum)
        if _HOLDING:  # raised where the held section ends (stop_signals_held)
            _HOLDING.append(signum)
            return
        raise KeyboardInterrupt

    for s in signals:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, on_stop)


@contextlib.contextmanager
def stop_signals_held():
    """Inside the ``with``, a stop signal does not raise (``stop_on_signals``' handler notes
    it); it is raised as ``KeyboardInterrupt`` on leaving the outermost one. For a short section
    that creates something the clean-up must find: it is bound to a name before the stop can
    interrupt. Not ``pthread_sigmask``: with the main thread blocking them, the kernel hands the
    signals to another thread (numpy's BLAS threads), and CPython 3.11 on Linux then runs the
    handler only when the main thread next happens to check (seen in a test: at its next block)."""
    outermost = not _HOLDING
    if outermost:
        _HOLDING.append(0)
    try:
        yield
    finally:
        if outermost:
            stopped = len(_HOLDING) > 1
            _HOLDING.clear()
            if stopped:
                raise KeyboardInterrupt
