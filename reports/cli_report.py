"""`analyzer report DIR` and `analyzer gate DIR` (issue 4)."""

from __future__ import annotations


def register(app, run) -> None:
    """Add the ``report`` and ``gate`` commands to ``app``; ``run`` maps typed errors to exit codes."""
