"""The environment variables a user may set, each read and checked here and nowhere else.

``KNOBS`` lists them (docs/environment.md is that table; tests/analyzer/
test_settings.py keeps the two equal). Each has one reader below; a value it cannot use is
``BadInput`` (``bad_option``, exit 2) in one line naming the variable, what it holds and a
value to set (a bad ``PARITYTRACE_CACHE_MAX_BYTES`` is only logged). An unset or blank
variable takes its default. Variables the recorder sets for its own processes
(``PARITYTRACE_LAUNCH``, ``PARITYTRACE_GO_FD`` ...) and test hooks (``PARITYTRACE_HTA_RUNNER``,
``PARITYTRACE_INJECT``) are plumbing, not settings.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from analyzer.contract.errors import BadInput, Reason


@dataclass(frozen=True, slots=True)
class Knob:
    """One variable: its ``name``, ``default`` and ``unit`` as the docs say them, ``what`` it sets."""

    name: str
    default: str
    unit: str
    what: str


TABLES_MEMORY = Knob("PARITYTRACE_TABLES_MEMORY", "256M", "bytes, K/M/G/T suffix (powers of 1024)",
                     "memory for a job's per-rank collectives and prefetch tables; past it they "
                     "spill to disk (0: every rank on disk)")
MAX_TRACE_BYTES = Knob("PARITYTRACE_MAX_TRACE_BYTES", "min(8 GiB, memory / (10 x workers)), at least 64 MiB",
                       "bytes", "largest trace JSON read (gunzipped), a gzip bomb's stop; bytes of "
                       "JSON, not memory: decoding takes up to ~10x them")
DASK_TIMEOUT_S = Knob("PARITYTRACE_DASK_TIMEOUT_S", "30", "s", "Dask: connect timeout and the longest wait "
                      "with no worker, no scheduler or an unfetched result")
DASK_SCHEDULER_ADDRESS = Knob("DASK_SCHEDULER_ADDRESS", "unset: local processes", "tcp://HOST:PORT",
                              "the Dask scheduler of `--scheduler` when that option is not given")
HTA_TIMEOUT_S = Knob("PARITYTRACE_HTA_TIMEOUT_S", "300 + 1 per MB of trace JSON", "s",
                     "longest `--crosscheck hta` run")
XDG_CACHE_HOME = Knob("XDG_CACHE_HOME", "~/.cache", "folder",
                      "caches under `$XDG_CACHE_HOME/paritytrace` (docs/caches.md)")
LOG = Knob("PARITYTRACE_LOG", "WARNING", "logging level",
           "the recorder's log level per rank (INFO: each rank's phases with timestamps)")
CACHE_MAX_BYTES = Knob("PARITYTRACE_CACHE_MAX_BYTES", "2147483648 (2 GiB)", "bytes", "cap of each "
                       "cache folder; past it the least recently used files go (docs/caches.md)")
KNOBS = (TABLES_MEMORY, MAX_TRACE_BYTES, DASK_TIMEOUT_S, DASK_SCHEDULER_ADDRESS, HTA_TIMEOUT_S,
         XDG_CACHE_HOME, CACHE_MAX_BYTES, LOG)

_SIZE = re.compile(r"^\s*([0-9]+)([KMGT]?)\s*$", re.IGNORECASE | re.ASCII)


def _raw(knob: Knob) -> str | None:
    """The variable's value, stripped; None when unset or blank."""
    text = os.environ.get(knob.name, "").strip()
    return text or None


def _seconds(knob: Knob, example: str) -> float | None:
    """A finite number of seconds > 0, or None when unset."""
    raw = _raw(knob)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise BadInput(knob.name, Reason.BAD_OPTION, f"is {raw!r}, not a number of seconds > 0",
                       f"set it to e.g. {example}")
    return value


def tables_memory_bytes() -> int:
    """``PARITYTRACE_TABLES_MEMORY``, bytes (analyzer/ingest/spill.py); default 256 MiB."""
    raw = _raw(TABLES_MEMORY) or "256M"
    m = _SIZE.match(raw)
    if m is None:
        raise BadInput(TABLES_MEMORY.name, Reason.BAD_OPTION, f"is {raw!r}, not a size",
                       "set it to bytes with an optional K/M/G/T suffix (256M), or unset it")
    return int(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper())


def max_trace_bytes() -> int | None:
    """``PARITYTRACE_MAX_TRACE_BYTES``, bytes; None when unset (decode.py ``default_max_trace_bytes``)."""
    raw = _raw(MAX_TRACE_BYTES)
    if raw is not None and not (raw.isascii() and raw.isdigit() and int(raw) > 0):
        raise BadInput(MAX_TRACE_BYTES.name, Reason.BAD_OPTION,
                       f"is {raw!r}, not a positive number of bytes",
                       f"set e.g. {MAX_TRACE_BYTES.name}={8 * 2**30}")
    return None if raw is None else int(raw)


def dask_timeout_s() -> float:
    """``PARITYTRACE_DASK_TIMEOUT_S``, s (default 30; analyzer/ingest/cluster.py)."""
    return _seconds(DASK_TIMEOUT_S, "30") or 30.0


def dask_scheduler_address() -> str | None:
    """``DASK_SCHEDULER_ADDRESS`` or None (cluster.py ``scheduler_address`` checks it)."""
    return _raw(DASK_SCHEDULER_ADDRESS)


def hta_timeout_s() -> float | None:
    """``PARITYTRACE_HTA_TIMEOUT_S``, s; None when unset (crosscheck_hta.py ``timeout_s``)."""
    return _seconds(HTA_TIMEOUT_S, "600")


def cache_home() -> Path:
    """``$XDG_CACHE_HOME``, default ``~/.cache`` (the XDG base directory rule)."""
    return Path(_raw(XDG_CACHE_HOME) or Path.home() / ".cache")


_SAID: set[str] = set()
"""Ignored values already warned about in this process (one line each, not one per cache write)."""


def cache_max_bytes() -> int:
    """``PARITYTRACE_CACHE_MAX_BYTES``, bytes, default 2 GiB (cachekey.py ``trim``); not a
    positive int: a warning (once per value and process), and the default used (a cache cap is
    no reason to refuse a report)."""
    raw = _raw(CACHE_MAX_BYTES)
    if raw is not None and not (raw.isascii() and raw.isdigit() and int(raw) > 0):
        if raw not in _SAID:
            _SAID.add(raw)
            logging.getLogger(__name__).warning("ignoring %s=%r: not a positive int",
                                                CACHE_MAX_BYTES.name, raw)
        raw = None
    return int(raw or 2 * 2**30)


def log_level() -> str:
    """``PARITYTRACE_LOG`` upper-cased (a ``logging`` level name), default WARNING."""
    level = (_raw(LOG) or "WARNING").upper()
    if level not in _LEVELS:
        raise BadInput(LOG.name, Reason.BAD_OPTION, f"is {_raw(LOG)!r}, not a logging level",
                       f"set one of {', '.join(_LEVELS)}, e.g. {LOG.name}=INFO")
    return level


_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def check_all() -> None:
    """Read every setting a command may use, so that a bad value is refused (``BadInput``)
    before any work, not when (or whether) the work reaches it: a warm cache skips the decode
    that reads the trace cap, and the recorder's ranks read the log level after the baseline."""
    for read in (tables_memory_bytes, max_trace_bytes, dask_timeout_s, hta_timeout_s, log_level):
        read()
