"""Flight Recorder JSON dumps beside traces: which files they are, their ranks, reading them.

A dump is a JSON object in the schema of ``torch._C._distributed_c10d._dump_fr_trace_json``
(keys ``version``, ``entries``, ``pg_config``, ``pg_status``, ``comm_lib_version``,
``nccl_comm_state``; analyzer/analyses/flightrec.py ``Dump``). Pickle dumps (torch's default
``TORCH_FR_DUMP_TEMP_FILE`` files, ``nccl_trace_rank_<r>``) are never read, never unpickled:
one is known by its pickle protocol header alone (``starts_as_pickle``) and refused as what it
is, given on its own, under a dump's name or a ``*.json`` name beside traces, or as a folder's
only inputs (``pickle_dumps``: named ``<prefix><rank>`` as torch writes them).

Which files: in a run directory ``rank<r>.flightrec.json`` (contract ``schemas.flightrec_name``, what a
failed ``tracer record`` writes); in a folder of foreign traces any ``*.json`` / ``*.json.gz``
whose first key is one of the dump's own (``is_dump``: a Kineto trace starts with
``schemaVersion``, ``traceEvents``, ``distributedInfo`` or ``deviceProperties``, never one of
them), which is then not a trace. The rank is the number the file name ends with (before
``.json``), as fr_trace's loader takes it (``components/loader.py``: a dump holds no rank).

What a dump may cost (``read_dump``): its rank is below the job's world size (the manifest's or
the traces'; when none states it, ``distinfo.MAX_WORLD_SIZE``), checked from its name before
anything is read; the file is opened without blocking and must be a regular file of at most
``MAX_DUMP_BYTES`` (gunzipped: read no further) before it is read; its nesting is bounded by
msgspec's (a deeper dump is refused); its groups' ranks are parsed by the one parser of ranks
(``distinfo.ranks``), bounded by the same world size: a ranks value that cannot be a group of
that job is unknown (the group's members then come from the world or the dumps), never parsed
further. ``MAX_DUMP_BYTES`` bounds JSON bytes, not memory: the decoded entries take a few times
their JSON's size.
"""

from __future__ import annotations

import gzip
import os
import re
import stat
import zlib
from pathlib import Path

import msgspec

from analyzer.analyses.flightrec import Dump
from analyzer.contract.errors import BadInput
from analyzer.ingest import distinfo

DUMP_KEYS = ("comm_lib_version", "entries", "nccl_comm_state", "nccl_version", "pg_config", "pg_status",
             "version")
_HEAD = re.compile(rb'\s*\{\s*"(' + b"|".join(k.encode() for k in DUMP_KEYS) + rb')"\s*:')
_SNIFF_BYTES = 4096
_OURS = re.compile(r"rank(\d{1,9})\.flightrec\.json")
_RANK = re.compile(r"(\d{1,9})$")
MAX_DUMP_BYTES = 256 << 20
"""A dump larger than this (decompressed) is refused: 2000 entries with stack frames are a few MiB."""


def _open_regular(path: Path):
    """``path`` opened for reading when it is a regular file: opened without blocking (a FIFO
    cannot hang the open) and its type taken from the open file (``fstat``), so a FIFO or a
    device (``/dev/zero``) is refused before a byte is read. Symlinks are followed: the folder
    walk (analyzer/ingest/fswalk.py) keeps only those that stay inside the input. Raises
    ``OSError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    fh = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        fh.close()
        raise OSError(f"not a regular file: {path}")
    return fh


def _head(path: Path) -> bytes:
    with _open_regular(path) as f:
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


_PICKLE_NAME = re.compile(r"[\w\-.]*?(\d{1,9})(\.pkl|\.pickle)?")
"""torch's pickled dump names: ``<prefix><rank>``, the prefix ``TORCH_FR_DUMP_TEMP_FILE`` /
``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` (default ``nccl_trace_rank_``: ProcessGroupNCCL's
``DebugInfoWriter``), e.g. ``nccl_trace_rank_3``, ``job_dump_3`` -- fr_trace's loader takes the
rank as the digits its names end with (components/loader.py ``exp``)."""


def pickle_dumps(children: list[Path]) -> list[Path]:
    """The pickled Flight Recorder dumps among a folder's ``children``: regular files named
    ``<prefix><rank>`` (``_PICKLE_NAME``) that start as a pickle (``is_pickle``: the header
    alone, never unpickled)."""
    return sorted(p for p in children if _PICKLE_NAME.fullmatch(p.name) and p.is_file() and is_pickle(p))


def pickle_rank(path: Path) -> int | None:
    """The rank a pickled dump's name ends with (``nccl_trace_rank_1`` -> 1; ``_PICKLE_NAME``,
    as fr_trace's loader takes it), None when it ends with none."""
    m = _PICKLE_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else None


def pickle_line(path: Path) -> str:
    """The note and caveat naming a pickled dump found beside traces or JSON dumps (one line):
    what it is, that it is not read, and how to get the JSON form."""
    return (f"{path.name}: a Flight Recorder dump in torch's pickle format, not read (never "
            "unpickled); dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on "
            "each rank, written as <prefix><rank>.json beside the traces")


def pickle_folder_refusal(folder: Path, pickles: list[Path]) -> BadInput:
    """The refusal of a folder whose only inputs are pickled Flight Recorder dumps: it names
    them as such, says they are never unpickled and how to get the JSON form (one line)."""
    names = ", ".join(p.name for p in pickles[:3]) + (f" and {len(pickles) - 3} more" if len(pickles) > 3 else "")
    return BadInput(folder, "pickle_dump", f"holds no trace, only Flight Recorder dumps in torch's pickle "
                    f"format ({names}): pickle dumps are never read, unpickling a file runs code it "
                    "chooses", "dump JSON instead: torch._C._distributed_c10d._dump_fr_trace_json() on each "
                    "rank, written as <prefix><rank>.json beside the traces (tracer record writes "
                    "rank<r>.flightrec.json on a failed record)")


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


def _too_large(path: Path) -> BadInput:
    return BadInput(path, "too_large", f"Flight Recorder dump over {MAX_DUMP_BYTES >> 20} MiB of JSON",
                    "move it out of the folder; a dump of torch's _dump_fr_trace_json is a few MiB")


def _read_bytes(path: Path) -> bytes:
    """The JSON bytes of the dump at ``path`` (gunzipped), read only from a regular file, and
    no more than ``MAX_DUMP_BYTES`` + 1 of them: a larger file is refused by its size before
    it is read. Raises ``BadInput``."""
    try:
        with _open_regular(path) as f:
            size_bytes = os.fstat(f.fileno()).st_size
            head = f.read(2)
            if head == b"\x1f\x8b":
                f.seek(0)
                with gzip.GzipFile(fileobj=f, mode="rb") as z:
                    return z.read(MAX_DUMP_BYTES + 1)
            if size_bytes > MAX_DUMP_BYTES:
                raise _too_large(path)
            return head + f.read(MAX_DUMP_BYTES + 1 - len(head))
    except (OSError, EOFError, zlib.error) as exc:
        raise BadInput(path, "unreadable", f"cannot read the Flight Recorder dump ({exc})",
                       "pass a regular file, or move it out of the folder") from None


def _rank_bound(path: Path, rank: int, world_size: int | None) -> None:
    """Refuse a dump whose rank is outside the job (``world_size``, stated by its manifest or
    traces; None: ``distinfo.MAX_WORLD_SIZE``)."""
    most = distinfo.MAX_WORLD_SIZE if world_size is None else world_size
    if rank >= most:
        whose = (f"the job's world size is {world_size}" if world_size is not None else
                 f"no job holds more than {most} ranks here (analyzer/ingest/distinfo.py MAX_WORLD_SIZE)")
        raise BadInput(path, "rank_out_of_range", f"a Flight Recorder dump of rank {rank}, but {whose}",
                       "remove the dump, or name it by its rank (rank<N>.flightrec.json, fr_rank<N>.json)")


def read_dump(path: Path, world_size: int | None = None, notes: list[str] | None = None) -> Dump:
    """One dump, validated against the schema, its rank below ``world_size`` (the job's, as its
    manifest or traces state it; None: unknown) and its groups' ``ranks`` parsed (a list of
    ints, or [] when they cannot be a group of the job: one line each appended to ``notes``).
    Raises ``BadInput`` naming the file."""
    rank = dump_rank(path)
    if rank is None:
        raise BadInput(path, "no_rank", "a Flight Recorder dump whose file name ends with no rank "
                       "number (fr_trace takes the rank from the name, a dump holds none)",
                       "rename it to end with its rank, e.g. fr_rank0.json")
    _rank_bound(path, rank, world_size)
    raw = _read_bytes(path)
    if starts_as_pickle(raw[:2]):
        raise pickle_refusal(path)
    if len(raw) > MAX_DUMP_BYTES:
        raise _too_large(path)
    try:
        dump = msgspec.json.decode(raw, type=Dump)
    except msgspec.ValidationError as exc:
        raise BadInput(path, "bad_run_file", f"not a Flight Recorder JSON dump: {exc}",
                       "pass dumps of torch's _dump_fr_trace_json") from None
    except msgspec.DecodeError as exc:
        raise BadInput(path, "truncated", f"the Flight Recorder dump is not valid JSON: {exc}",
                       "re-dump it, or move it out of the folder to analyse the rest") from None
    except RecursionError:  # msgspec's bound on nesting (the interpreter's recursion limit)
        raise BadInput(path, "bad_run_file", "not a Flight Recorder JSON dump: nested too deep "
                       "for one (torch's nest a few levels)", "pass dumps of torch's _dump_fr_trace_json"
                       ) from None
    most = distinfo.MAX_WORLD_SIZE if world_size is None else world_size
    for name, cfg in dump.pg_config.items():
        ranks = distinfo.ranks(cfg.ranks, world_size, most=most)
        if ranks is None and cfg.ranks not in ("", "[]", []) and notes is not None:
            notes.append(f"{path}: process group {name}'s pg_config ranks are not a group of a job of "
                         f"{most} ranks; set aside")
        cfg.ranks = list(ranks or ())
    dump.rank, dump.path = rank, str(path)
    return dump


def read_dumps(paths: list[Path], world_size: int | None = None, notes: list[str] | None = None) -> list[Dump]:
    """Every dump of ``paths``, one per rank, each below ``world_size`` (``read_dump``). Raises
    ``BadInput``: a malformed dump, or two of one rank (``duplicate_rank``, naming both)."""
    dumps = [read_dump(p, world_size, notes) for p in paths]
    seen: dict[int, str] = {}
    for d in dumps:
        if d.rank in seen:
            raise BadInput(d.path, "duplicate_rank", f"a second Flight Recorder dump of rank {d.rank} "
                           f"(also {seen[d.rank]})", "keep one dump per rank in the folder")
        seen[d.rank] = d.path
    return sorted(dumps, key=lambda d: d.rank)


def flight_recorder(paths: list[Path], world_size: int | None = None, *, world_stated: bool = True,
                    pickles: list[Path] = ()):
    """The report's ``FlightRecorder`` of the dumps at ``paths`` (analyses/flightrec.py), None
    when there are none and no ``pickles``. ``world_size``: the job's; ``world_stated``: whether
    its manifest or a trace states it (then it bounds the dumps' ranks), rather than it being
    inferred from the traces' ranks (then ``distinfo.MAX_WORLD_SIZE`` does). ``pickles``: the
    pickled dumps beside them (``pickle_dumps``), never read: each is named in the notes
    (``pickle_line``) and its rank, where its name gives one below the bound, is a member
    whose dump is a pickle rather than one without a dump."""
    from analyzer.analyses import flightrec

    if not paths and not pickles:
        return None
    notes: list[str] = []
    most = world_size if world_stated and world_size is not None else distinfo.MAX_WORLD_SIZE
    pickled = sorted({r for p in pickles if (r := pickle_rank(p)) is not None and r < most})
    fr = flightrec.analyse(read_dumps(paths, world_size if world_stated else None, notes), world_size,
                           pickled_ranks=pickled)
    fr.notes += notes + [pickle_line(p) for p in pickles]
    return fr
