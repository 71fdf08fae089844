"""`analyzer summary DIR`: per-rank / per-step / per-kind tables (issue 3)."""

from __future__ import annotations


def register(app, run) -> None:
    """Add the ``summary`` command to ``app``; ``run`` maps typed errors to exit codes."""
