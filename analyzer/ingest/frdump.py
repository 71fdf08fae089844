"""Flight Recorder JSON dumps beside traces: which files they are, their ranks, reading them.

A dump is a JSON object in the schema of ``torch._C._distributed_c10d._dump_fr_trace_json``
(keys ``version``, ``entries``, ``pg_config``, ``pg_status``, ``comm_lib_version``,
``nccl_comm_state``; analyzer/analyses/flightrec.py ``Dump``). Pickle dumps (torch's default
``TORCH_FR_DUMP_TEMP_FILE`` files, ``nccl_trace_rank_<r>``) are never read, never unpickled:
one is known by its pickle protocol header alone (``starts_as_pickle``) and refused as what it
is, given on its own, under a dump's name or a ``*.json`` name beside traces.

Which files: in a run directory ``rank<r>.flightrec.json`` (contract ``schemas.flightrec_name``, what a
failed ``tracer record`` writes); in a folder of foreign traces any ``*.json`` / ``*.json.gz``
whose first key is one of the dump's own (``is_dump``: a Kineto trace starts with
``schemaVersion``, ``traceEvents``, ``distributedInfo`` or ``deviceProperties``, never one of
them), which is then not a trace. The rank is the number the file name ends with (before
``.json``), as fr_trace's loader takes it (``components/loader.py``: a dump holds no rank).
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import msgspec

from analyzer.analyses.flightrec import Dump
from analyzer.contract.errors import BadInput

DUMP_KEYS = ("comm_lib_version", "entries", "nccl_comm_state", "nccl_version", "pg_config", "pg_status",
             "version")
_HEAD = re.compile(rb'\s*\{\s*"(' + b"|".join(k.encode() for k in DUMP_KEYS) + rb')"\s*:')
_SNIFF_BYTES = 4096
_OURS = re.compile(r"rank(\d{1,9})\.flightrec\.json")
_RANK = re.compile(r"(\d{1,9})$")
MAX_DUMP_BYTES = 256 << 20
"""A dump larger than this (decompressed) is refused: 2000 entries with stack frames are a few MiB."""


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        head = f.read(_SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head + f.read(60 * 1024), _SNIFF_BYTES)
    return head


def starts_as_pickle(head: bytes) -> bool:
    """True when ``head`` (a file's first bytes, gunzipped) opens with a pickle protocol header:
    the PROTO opcode 0x80 and a protocol number 2-5. Only the header is looked at; nothing is
    ever unpickled (unpickling runs code the file chooses)."""
    return len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def is_pickle(path: Path) -> bool:
    """True when ``path`` (gzip or not) starts as a pickle does (``starts_as_pickle``): torch's
    default Flight Recorder dump (``nccl_trace_rank_<r>``), never read. An unreadable file is
    not one (its reader says why)."""
    try:
        return starts_as_pickle(_head(path))
    except (OSError, zlib.error):
        return False


def pickle_refusal(path: Path) -> BadInput:
    """The refusal of a pickled Flight Recorder dump: what it is, that it is never read, and how
    to dump JSON instead."""
    return BadInput(path, "pickle_dump", "is a pickled Flight Recorder dump (torch's default "
                    "format): pickle dumps are never read, unpickling a file runs code it chooses",
                    "dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on each "
                    "rank (tracer record does; the recorder is on with TORCH_NCCL_TRACE_BUFFER_SIZE"
                    " > 0); or move the pickle out of the folder")


def is_dump(path: Path) -> bool:
    """True when ``path`` is a ``*.json`` / ``*.json.gz`` file (gzip or not) starting with a
    Flight Recorder dump's key, or with a pickle header (a pickled dump under a JSON name:
    ``read_dump`` refuses it as such, never as a trace); an unreadable file is not one (the
    trace reader says why)."""
    if not path.name.endswith((".json", ".json.gz")):
        return False
    try:
        head = _head(path)
    except (OSError, zlib.error):
        return False
    return _HEAD.match(head) is not None or starts_as_pickle(head)


def in_run_dir(children: list[Path]) -> list[Path]:
    """A run directory's dumps: the ``rank<r>.flightrec.json`` files among ``children``."""
    return sorted(p for p in children if p.is_file() and _OURS.fullmatch(p.name))


def dump_rank(path: Path) -> int | None:
    """The rank a dump's file name ends with (``rank1.flightrec.json`` -> 1,
    ``fr_trace_rank_3.json`` -> 3), None when it ends with no number."""
    m = _OURS.fullmatch(path.name)
    if m:
        return int(m.group(1))
    stem = path.name.removesuffix(".gz").removesuffix(".json")
    m = _RANK.search(stem)
    return int(m.group(1)) if m else None


def read_dump(path: Path) -> Dump:
    """One dump, validated against the schema. Raises ``BadInput`` naming the file."""
    rank = dump_rank(path)
    if rank is None:
        raise BadInput(path, "no_rank", "a Flight Recorder dump whose file name ends with no rank "
                       "number (fr_trace takes the rank from the name, a dump holds none)",
                       "rename it to end with its rank, e.g. fr_rank0.json")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            with gzip.open(path, "rb") as f:
                raw = f.read(MAX_DUMP_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise BadInput(path, "unreadable", f"cannot read the Flight Recorder dump ({exc})") from None
    if starts_as_pickle(raw[:2]):
        raise pickle_refusal(path)
    if len(raw) > MAX_DUMP_BYTES:
        raise BadInput(path, "too_large", f"Flight Recorder dump over {MAX_DUMP_BYTES >> 20} MiB of JSON")
    try:
        dump = msgspec.json.decode(raw, type=Dump)
    except msgspec.ValidationError as exc:
        raise BadInput(path, "bad_run_file", f"not a Flight Recorder JSON dump: {exc}",
                       "pass dumps of torch's _dump_fr_trace_json") from None
    except msgspec.DecodeError as exc:
        raise BadInput(path, "truncated", f"the Flight Recorder dump is not valid JSON: {exc}") from None
    dump.rank, dump.path = rank, str(path)
    return dump


def read_dumps(paths: list[Path]) -> list[Dump]:
    """Every dump of ``paths``, one per rank. Raises ``BadInput``: a malformed dump, or two of
    one rank (``duplicate_rank``, naming both)."""
    dumps = [read_dump(p) for p in paths]
    seen: dict[int, str] = {}
    for d in dumps:
        if d.rank in seen:
            raise BadInput(d.path, "duplicate_rank", f"a second Flight Recorder dump of rank {d.rank} "
                           f"(also {seen[d.rank]})", "keep one dump per rank in the folder")
        seen[d.rank] = d.path
    return sorted(dumps, key=lambda d: d.rank)


def flight_recorder(paths: list[Path], world_size: int | None = None):
    """The report's ``FlightRecorder`` of the dumps at ``paths`` (analyses/flightrec.py), None
    when there are none."""
    from analyzer.analyses import flightrec

    if not paths:
        return None
    return flightrec.analyse(read_dumps(paths), world_size)
