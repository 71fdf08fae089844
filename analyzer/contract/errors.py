"""The contract's codes: exit codes, reason codes, and the typed errors that carry them.

Part of the contract between tracer and analyzer, with analyzer/contract/schemas.py (what the files
hold) and analyzer/contract/atomic.py (how they are written); the tracer imports these three and
nothing else of the analyzer (tests/tracer/test_contract.py). It stays a module of its own,
standard library only, because schemas.py imports pyarrow: every command imports the errors,
and a cached report must not pay for pyarrow. docs/errors.md lists every code.
"""

from __future__ import annotations

import enum
from pathlib import Path


class ExitCode(enum.IntEnum):
    """Process exit status of ``analyzer`` and ``tracer``."""

    OK = 0
    INTERNAL = 1  #: a bug in the analyzer; ``tracer``: a record failed
    BAD_INPUT = 2  #: bad input or usage: one line names the file, what is wrong, what to do
    GATE_FAILED = 3  #: ``gate``, ``drift --check``: a run is not numerically equivalent
    REGRESSION = 4  #: ``gate --baseline``: a metric's interval lies wholly above the allowed regression
    INTERRUPTED = 130  #: Ctrl-C or SIGTERM (128 + SIGINT, as a shell reports it)


class Reason(str, enum.Enum):
    """The stable reason code of a ``BadInput``: one per kind of problem, the file in ``path``."""

    __str__ = str.__str__  # the code itself in messages and f-strings, not "Reason.MISSING"

    INTERNAL = "internal"  #: not bad input: a parse worker died or failed (exit 1)
    MISSING = "missing"  #: the path given does not exist
    NOT_A_FOLDER = "not_a_folder"  #: a file was given where a folder is needed
    EMPTY = "empty"  #: the folder holds no trace file and no run directory
    UNREADABLE = "unreadable"  #: a trace cannot be read (I/O error)
    TRUNCATED = "truncated"  #: a trace's gzip stream or JSON ends early or is corrupt
    TOO_LARGE = "too_large"  #: a trace over PARITYTRACE_MAX_TRACE_BYTES of JSON (gzip bomb)
    BAD_NAME = "bad_name"  #: a file name that is not UTF-8 (cannot be written in a report)
    NOT_A_TRACE = "not_a_trace"  #: JSON without a ``traceEvents`` list of objects
    PICKLE_DUMP = "pickle_dump"  #: a pickled Flight Recorder dump (never unpickled)
    NO_EVENTS = "no_events"  #: a trace without a complete (ph X) event with valid ts and dur
    DUPLICATE_RANK = "duplicate_rank"  #: two traces of the folder are the same rank
    NO_RANK = "no_rank"  #: no ``distributedInfo.rank`` and no ``rank<N>``/``worker<N>`` names
    MIXED_RANK_INFO = "mixed_rank_info"  #: some traces carry a rank and others do not
    WORLD_SIZE_MISMATCH = "world_size_mismatch"  #: traces (or traces and manifest) disagree
    MIXED_JOBS = "mixed_jobs"  #: traces of different jobs (backends, group members) mixed
    RANK_OUT_OF_RANGE = "rank_out_of_range"  #: a rank at or beyond the world size
    BAD_FOLDER = "bad_folder"  #: several problems in one folder, each in ``problems``
    INCOMPLETE_RUN = "incomplete_run"  #: a run directory without manifest.json
    FOREIGN_IN_ROOT = "foreign_in_root"  #: traces root sub-folder not written by the tracer
    DUPLICATE_RUN = "duplicate_run"  #: two run directories of a traces root share a name
    BAD_RUN_FILE = "bad_run_file"  #: a run-dir file unreadable, incomplete or of newer schema
    MISSING_FILE = "missing_file"  #: a file listed in manifest.json is missing
    FILE_CHANGED = "file_changed"  #: size or sha256 differs from the record's (file, tensor)
    NO_KEPT = "no_kept"  #: recorded before baseline tensors were kept (``drift``)
    BAD_OPTION = "bad_option"  #: an option's value is invalid or names what the input lacks
    OTHER_CONFIGURATION = "other_configuration"  #: ``grade``: RUN is not the projection's configuration
    UNMERGEABLE = "unmergeable"  #: the merged trace would break the Trace Event Format
    HTA_MISSING = "hta_missing"  #: ``--crosscheck hta`` without HolisticTraceAnalysis
    UNWRITABLE = "unwritable"  #: an output's folder is marked read-only, or the write failed
    OUT_IS_DIR = "out_is_dir"  #: ``-o`` names an existing folder where a file is written
    OUT_IS_FILE = "out_is_file"  #: ``--out`` names a file where a folder is needed
    OUT_IS_INPUT = "out_is_input"  #: ``merge -o`` / ``summary -o`` names one of the files it reads
    NOT_NCCL_TESTS = "not_nccl_tests"  #: a link-model input that is not nccl-tests output
    NO_LINK_CURVE = "no_link_curve"  #: no link curve of the kind and group span (or size) asked


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

    def __reduce__(self):
        # pickled by its fields (the default would call __init__ with the one line alone), so a
        # worker process can raise it and the caller re-raise it unchanged (analyzer/ingest/pool.py)
        return type(self), (self.path, self.reason, self.message, self.fix, self.problems)

    def one_line(self) -> str:
        text = f"{self.path}: {self.message}"
        return f"{text}; {self.fix}" if self.fix else text
