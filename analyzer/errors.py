"""The contract's codes: exit codes, reason codes, and the typed errors that carry them.

Part of the contract between tracer and analyzer, with analyzer/schemas.py (what the files
hold) and analyzer/atomic.py (how they are written); the tracer imports these three and
nothing else of the analyzer (tests/tracer/test_contract.py). It stays a module of its own,
standard library only, because schemas.py imports pyarrow: every command imports the errors,
and a cached report must not pay for pyarrow. README "Exit codes and errors" lists every code.
"""

from __future__ import annotations

import enum
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Process exit status of ``analyzer`` and ``tracer``."""

    OK = 0
    INTERNAL = 1
    """A bug in the analyzer; for ``tracer``, a record that failed."""
    BAD_INPUT = 2
    """Bad input or usage: one line names the file, what is wrong and what to do."""
    GATE_FAILED = 3
    """``gate`` (``drift --check``): a run is not numerically equivalent to its reference."""
    INTERRUPTED = 130
    """Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it)."""


class Reason(str, enum.Enum):
    """The stable reason code of a ``BadInput``: one per kind of problem, the file in ``path``."""

    __str__ = str.__str__  # the code itself in messages and f-strings, not "Reason.MISSING"

    INTERNAL = "internal"
    """Not bad input: a worker process died or failed (``ParityTraceError``, exit 1)."""
    MISSING = "missing"
    """The path given does not exist."""
    NOT_A_FOLDER = "not_a_folder"
    """A file was given where a folder is needed."""
    EMPTY = "empty"
    """The folder holds no trace file and no run directory."""
    UNREADABLE = "unreadable"
    """A trace cannot be read (I/O error)."""
    TRUNCATED = "truncated"
    """A trace's gzip stream or JSON ends early or is corrupt."""
    NOT_A_TRACE = "not_a_trace"
    """A JSON file that is not a Chrome/Kineto trace (no ``traceEvents`` list of objects)."""
    NO_EVENTS = "no_events"
    """A trace holds no complete (ph X) event with a valid ts and dur."""
    DUPLICATE_RANK = "duplicate_rank"
    """Two traces of the folder are the same rank."""
    NO_RANK = "no_rank"
    """Traces without ``distributedInfo.rank`` and without ``rank<N>``/``worker<N>`` names."""
    MIXED_RANK_INFO = "mixed_rank_info"
    """Some traces of the folder carry a rank and others do not."""
    WORLD_SIZE_MISMATCH = "world_size_mismatch"
    """World sizes of the traces (or of the traces and the manifest) disagree."""
    MIXED_JOBS = "mixed_jobs"
    """Traces of different jobs (backends, process-group members) in one folder."""
    RANK_OUT_OF_RANGE = "rank_out_of_range"
    """A rank at or beyond the world size."""
    BAD_FOLDER = "bad_folder"
    """Several of the problems above in one folder: each is in ``BadInput.problems``."""
    INCOMPLETE_RUN = "incomplete_run"
    """A run directory without manifest.json (a record that did not finish)."""
    FOREIGN_IN_ROOT = "foreign_in_root"
    """A sub-folder of a traces root holds traces that ``tracer record`` did not write."""
    DUPLICATE_RUN = "duplicate_run"
    """Two run directories of a traces root share a run name."""
    BAD_RUN_FILE = "bad_run_file"
    """A run-directory file (manifest, Parquet table, safetensors) is unreadable, lacks fields,
    or has a newer schema version."""
    MISSING_FILE = "missing_file"
    """A file listed in manifest.json is missing."""
    FILE_CHANGED = "file_changed"
    """A file's size or sha256 (or a kept tensor's) differs from what the record wrote."""
    NO_KEPT = "no_kept"
    """A run recorded before baseline tensors were kept (``drift``)."""
    BAD_OPTION = "bad_option"
    """An option's value is invalid, or names what the input lacks (a step, a rank)."""
    UNMERGEABLE = "unmergeable"
    """The merged trace would break the Trace Event Format."""
    HTA_MISSING = "hta_missing"
    """``--crosscheck hta`` without HolisticTraceAnalysis installed."""
    UNWRITABLE = "unwritable"
    """An output cannot be written: its folder is marked read-only, or the write failed."""
    OUT_IS_DIR = "out_is_dir"
    """``-o`` names an existing folder where a file is written."""
    OUT_IS_FILE = "out_is_file"
    """``--out`` names a file where a folder is needed."""


class ParityTraceError(Exception):
    """Base of every error the CLIs turn into a one-line message and an exit code."""

    exit_code = ExitCode.INTERNAL
    reason = Reason.INTERNAL


class BadInput(ParityTraceError):
    """An input file or folder cannot be used.

    ``path`` names it, ``reason`` is a ``Reason`` (a plain string that is not a member raises
    ``ValueError``), ``fix`` says what to do. ``problems`` may hold further ``BadInput``s
    found in the same folder, so that all are reported at once.
    """

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, path: Path | str, reason: Reason | str, message: str, fix: str = "",
                 problems: list["BadInput"] | None = None):
        self.path = str(path)
        self.reason = Reason(reason)
        self.message = message
        self.fix = fix
        self.problems = problems or []
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text}; {self.fix}" if self.fix else text
