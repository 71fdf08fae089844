"""Typed errors with stable reason codes, shared by every CLI.

Exit codes (README "Exit codes"): 0 ok, 1 internal error, 2 bad input or usage, 3 parity gate
failed. A ``BadInput`` message is one line: the file, what is wrong, what to do.
"""

from __future__ import annotations

from pathlib import Path

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_BAD_INPUT = 2
EXIT_GATE_FAILED = 3


class ParityTraceError(Exception):
    """Base of every error the CLIs turn into a one-line message and an exit code."""

    exit_code = EXIT_INTERNAL
    reason = "internal"


class BadInput(ParityTraceError):
    """An input file or folder cannot be used.

    ``path`` names it, ``reason`` is a stable code (e.g. ``truncated``, ``not_a_trace``,
    ``duplicate_rank``), ``fix`` says what to do. ``problems`` may hold further ``BadInput``s
    found in the same folder, so that all are reported at once.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, path: Path | str, reason: str, message: str, fix: str = "",
                 problems: list["BadInput"] | None = None):
        self.path = str(path)
        self.reason = reason
        self.message = message
        self.fix = fix
        self.problems = problems or []
        super().__init__(self.one_line())

    def __reduce__(self):
        # pickled by its fields (the default would call __init__ with the one line alone), so a
        # worker process can raise it and the caller re-raise it unchanged (analyzer/parallel.py)
        return type(self), (self.path, self.reason, self.message, self.fix, self.problems)

    def one_line(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text}; {self.fix}" if self.fix else text


class GateFailed(ParityTraceError):
    """The parity gate found at least one run that is not numerically equivalent."""

    exit_code = EXIT_GATE_FAILED
    reason = "parity_failed"
