"""Decode one Kineto / Chrome trace file into a columnar event table (``Decoded``; no classification).

msgspec decodes only the fields the analyzer needs, into structs the cycle collector does not
track (``gc=False``: its passes over ~10^5 new objects doubled the decode time of a 40 MB
trace). Events are a tagged union on ``ph``: X and M events get their fields, every other phase
none (``_PHASES``). Strict decoders come first (``_TYPED``); a trace with values of other types
is decoded again leniently (``_LENIENT``) to the same table (tests/analyzer/test_fastpaths.py).
Columns are read out with C-level loops (``_columns``).

Times: ``ts`` / ``dur`` are µs, sometimes with sub-µs decimals (``1712195495520854.8``) that a
float64 cannot hold to the ns at epoch scale: they are converted exactly to int64 ns
(``parse_decimal_ns``, half up on the fourth decimal). Events whose ts or dur is missing,
negative or not a number are skipped and counted in one warning line per kind.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import count, repeat
from operator import attrgetter, is_not
from pathlib import Path
from typing import Annotated, Any, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from analyzer.analyses.memory import memory_bytes
from analyzer.contract.errors import BadInput
from analyzer.contract.schemas import NO_VALUE
from analyzer.ingest.quoterepair import repair_quotes

_NULL = msgspec.Raw(b"null")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys the analyzer reads (fast path: strict types for hot keys)."""

    external_id: int | None = msgspec.field(default=-1, name="External id")
    external_id_lc: int | None = msgspec.field(default=-1, name="external id")  # tb_plugin
    correlation: int | None = -1  # ids default to -1 (absent): columns built in one C loop
    stream: int | str | None = None
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_id: int | str | None = msgspec.field(default=None, name="Process Group ID")
    pg_desc: str | None = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    # per process group sequence number and cross-rank collective id: record_param_comms,
    # copied onto the kernel by kineto #1296 / #1300 and the Python exporter (pytorch #184273)
    seq: int | str | None = msgspec.field(default=None, name="Seq")
    comms_id: msgspec.Raw = msgspec.field(default=_NULL, name="Comms Id")
    # CUPTI's graph node of a kernel / memcpy / memset replayed from a CUDA graph (0: none)
    graph_node: int | None = msgspec.field(default=-1, name="graph node id")


class _MArgs(msgspec.Struct, gc=False):
    meta_name: str | None = msgspec.field(default=None, name="name")  # thread_name's name


class _M(msgspec.Struct, gc=False, tag_field="ph", tag="M"):
    """A metadata event (``thread_name`` names a thread)."""

    name: str = ""
    pid: int | str = -1
    tid: int | str = -1
    args: _MArgs | None = None


_PHASES = "BEiIbneCstfPONDVvRc()"
"""Chrome trace event phases other than X and M (Trace Event Format): decoded as structs with
no fields, so their contents (e.g. flow events, a quarter of a Kineto trace) are skipped
without building objects."""
_KNOWN_PHASES = frozenset("XM" + _PHASES)
_OTHERS = tuple(msgspec.defstruct(f"_Ph{ord(t)}", [("name", msgspec.Raw, _NULL),
                                                  ("ts", msgspec.Raw, _NULL)],
                                  tag_field="ph", tag=t, gc=False) for t in _PHASES)
"""Their name and ts are kept as raw JSON (no string built): whether the trace has ``[memory]``
events (``Decoded.memory_events``) and ``Decoded.other_times``, without reading it again."""


def _trace_type(time_type: Any, default: Any) -> tuple[type, type]:
    """(strict trace type, its complete-event type) where ``ts`` / ``dur`` are ``time_type``."""
    x = msgspec.defstruct("_X", [("name", str, ""), ("cat", str, ""), ("pid", int | str, -1),
                                 ("tid", int | str, -1), ("ts", time_type, default),
                                 ("dur", time_type, default), ("args", _Args | None, None)],
                          tag_field="ph", tag="X", gc=False)
    event = Union[(x, _M, *_OTHERS)]  # noqa: UP007 - a tagged union needs typing.Union here
    trace = msgspec.defstruct("_Trace", [("traceEvents", list[event]),
                                         ("distributedInfo", Any, None),
                                         ("schemaVersion", Any, None)], gc=False)
    return trace, x


_MAX_US = (2**63 - 1) // 1000 - 1
_WholeUs = Annotated[int, msgspec.Meta(ge=0, le=_MAX_US)]
_TraceUs, _XUs = _trace_type(_WholeUs, -1)
"""Whole-µs times (older Kineto): plain ints in range; missing ones are -1."""
_Trace, _X = _trace_type(msgspec.Raw, _NULL)
"""Any JSON for times (decimals: ``1712195495520854.8``), converted by ``parse_decimal_ns``."""


_LArgs = msgspec.defstruct(  # lenient twin of ``_Args``: any JSON value is accepted
    "_LArgs", [(f.name, msgspec.Raw, _NULL) if f.type is msgspec.Raw else (f.name, Any, None)
               for f in msgspec.structs.fields(_Args)] + [("meta_name", Any, None)],
    rename={f.name: f.encode_name for f in msgspec.structs.fields(_Args)} | {"meta_name": "name"},
    gc=False)


class _LEvent(msgspec.Struct, gc=False):
    ph: Any = ""
    name: Any = ""
    cat: Any = ""
    pid: Any = -1
    tid: Any = -1
    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL
    args: _LArgs | None = None


class _LTrace(msgspec.Struct, gc=False):
    traceEvents: list[_LEvent]
    distributedInfo: Any = None
    schemaVersion: Any = None


_TYPED = (msgspec.json.Decoder(_TraceUs), msgspec.json.Decoder(_Trace))
"""Tried in this order; a trace neither accepts (another phase, a value of another type, a
time that is not a whole µs in range) is decoded by ``_LENIENT``."""
_LENIENT = msgspec.json.Decoder(_LTrace)

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync",
                      "gpu_sync", "memcpy", "memset"})
"""Kineto categories of events that run on a GPU stream (compared lower-cased: the tb_plugin's
test traces write ``Kernel``; ``memcpy`` / ``memset``: the categories Kineto wrote before
``gpu_memcpy`` / ``gpu_memset``, analyzer/ingest/classify.py ``EARLY_DEVICE_CATS``)."""

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "long int": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2,
    "char": 1, "signed char": 1, "int8": 1, "byte": 1, "unsigned char": 1, "uint8": 1,
    "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}
"""Element size in bytes by dtype name as traces write it (``Float``, ``c10::BFloat16``,
``float``), lower-cased and without ``c10::``."""

_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms", "mpi:", "ucc:", "symm_mem::",
                  "hccl:")


def dtype_bytes(name: Any) -> int:
    """Bytes per element of the dtype ``name`` (trace spelling), -1 when unknown."""
    if not isinstance(name, str):
        return -1
    key = name.lower().removeprefix("c10::").strip()
    return DTYPE_BYTES.get(key, -1)


@dataclass(slots=True)
class Decoded:
    """One decoded trace file.

    ``events``: one row per complete event (``ph == "X"``) with valid ts/dur, sorted by ts_ns
    then longest first (file order among equals: the order classification needs), with the
    columns of analyzer/api.py's event table that the file gives: name ... external_id,
    thread_name ("" unknown) and the arguments coll_name, dtype (the ``dtype`` argument, else
    the first ``Input type`` naming a dtype), pg, in_nelems ... shape2_numel, pg_ranks, pg_desc
    (``Process Group Description``); plus seq_arg (``Seq``: the per process group sequence
    number, int64 -1 unknown), comms_id (``Comms Id`` as text, None unknown), graph_node
    (``graph node id``, int64, 0 or -1: not replayed from a CUDA graph).
    """

    events: pd.DataFrame
    distributed_info: dict[str, Any] | None
    warnings: list[str] = field(default_factory=list)
    repaired_json: bytes | None = None
    """The JSON as repaired in memory when the file's needed a repair (``repair``), for the
    readers of the same bytes (``memory_events``); None otherwise. The file is never changed."""
    memory_events: bool = False
    """An event is named ``[memory]``: ``memory_events`` may find some (it reads them)."""
    other_times: tuple[np.ndarray, np.ndarray] | None = None
    """(ts in int64 ns, ok) of every traceEvents entry by position, read (``parse_decimal_ns``)
    for those neither complete nor metadata events, ok False elsewhere; None unless asked."""


MAX_TRACE_ENV = "PARITYTRACE_MAX_TRACE_BYTES"
"""Environment variable that sets the largest trace the analyzer reads, in bytes of JSON (after
gunzip): every command reads traces through ``decompress`` / ``check_size``, in the command's
process and in its worker processes, so one variable reaches them all."""
DEFAULT_MAX_TRACE_BYTES = 8 << 30
"""The most the default cap can be, 8 GiB of JSON: above the largest real traces we know of (a
2 GB rank). The default itself is ``default_max_trace_bytes``: what a process can afford."""
MIN_DEFAULT_MAX_TRACE_BYTES = 64 << 20
"""The least the default cap is, whatever the machine (a tiny container still reads a trace)."""
RAM_SHARE = 10
"""A worker's cap is 1 / ``RAM_SHARE`` of its share of the memory: the cap counts bytes of
JSON, and decoding holds the gzip bytes, the JSON, the decoded events and their tables at
once: measured peaks of dense events are ~9x the JSON (200 MB: 1.76 GB RSS; issue 43 R7's
550 MB: 5.4 GB). A trace that still runs out of memory is one line naming the file
(``ranktables.out_of_memory``)."""
_CHUNK_BYTES = 16 << 20
"""The most output one inflate call of the chunked loop makes (``_gunzip``). 4 and 8 MiB
chunks were no faster with ISA-L, and slower with zlib (issue 46)."""


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_max_trace_bytes(workers: int | None = None) -> int:
    """The cap when ``MAX_TRACE_ENV`` is unset: min(8 GiB, memory / (``RAM_SHARE`` x
    ``workers``)), at least 64 MiB; ``workers`` (default: the CPU count, the process pool's
    size) is how many processes decode a trace at once. A gzip bomb (deflate expands zeros
    ~1000:1) therefore stops before the memory of the machine is full, and a real trace over
    it is refused with the variable to raise."""
    share = memory_bytes() // (RAM_SHARE * max(1, workers or cpu_count()))
    if share <= 0:
        return DEFAULT_MAX_TRACE_BYTES
    return max(MIN_DEFAULT_MAX_TRACE_BYTES, min(DEFAULT_MAX_TRACE_BYTES, share))


def max_trace_bytes(workers: int | None = None) -> int:
    """The size cap (``MAX_TRACE_ENV``, else ``default_max_trace_bytes(workers)``). Raises
    ``BadInput`` (``bad_option``) when the variable is set to anything but a positive
    integer."""
    from analyzer.contract.settings import max_trace_bytes as setting

    cap = setting()
    return default_max_trace_bytes(workers) if cap is None else cap


def too_large(path: Path | str, what: str, cap: int, size: int = 0) -> BadInput:
    """The refusal of a trace over the cap ``cap`` (bytes): names the cap and a value that
    would admit it: the trace's ``size`` (bytes, when known; 0 when the read stopped at the
    cap) rounded up to a MiB, at least 4 x the cap."""
    admit = max(cap * 4, -(-size // 2**20) * 2**20)
    return BadInput(path, "too_large", f"{what} is over the analyzer's limit of {cap:,} bytes "
                    f"of trace JSON ({MAX_TRACE_ENV})",
                    f"if the trace is genuine, raise the limit, e.g. {MAX_TRACE_ENV}={admit}")


try:  # ISA-L's inflate: zlib's API at ~2x its speed (issue 46: 40 MB, ~29 vs ~57 ms)
    from isal import isal_zlib as INFLATE

    _INFLATE_ERROR: type[Exception] = INFLATE.error
except ImportError:  # a platform without an isal wheel: the standard library's
    INFLATE = zlib
    _INFLATE_ERROR = zlib.error
"""The inflate module ``_gunzip`` uses: ``isal.isal_zlib`` (python-isal, bindings to Intel's
ISA-L) where it imports, else ``zlib``. Both give the ``decompressobj(wbits=31)`` API whose
``max_length`` bounds each call's output, so the gzip-bomb cap is enforced as the bytes are
produced: the gzip trailer's size (ISIZE, the size mod 2^32, forgeable) is never trusted.
libdeflate (``deflate``) was as fast here, but its one-shot API needs the output size up
front, from ISIZE (a liar's or wrapped value) or the cap (an allocation of up to 8 GiB), and
deflate 0.9.0's ``gzip_decompress`` returns the first of several members without a word.
ISA-L checks the trailer's CRC-32 and size as zlib does; its errors are said in zlib's words
(``decompress`` runs zlib on a file ISA-L refuses)."""


def decompress(raw: bytes, path: Path | str, max_bytes: int | None = None) -> bytes:
    """Gunzip ``raw`` when it is gzip, else return it, streaming in chunks so that no more than
    ``max_bytes`` (default ``max_trace_bytes()``) are ever produced: a small file that expands
    without bound (a gzip bomb) is refused once the output passes the cap, not after it fills
    the memory. Concatenated gzip members are read as one stream (as ``gzip.decompress`` does),
    in time linear in the file whatever their number (``_gunzip``).
    The chunks go into one growing buffer that becomes the result without a copy
    (``io.BytesIO.getvalue``), so the JSON is held once, not as chunks and their join.
    Inflated by ``INFLATE`` (ISA-L where installed, else zlib: ``_gunzip``).
    Raises ``BadInput``: ``truncated`` (corrupt or cut short), ``too_large`` (over the cap)."""
    cap = max_trace_bytes() if max_bytes is None else max_bytes
    if raw[:2] != b"\x1f\x8b":
        if len(raw) > cap:
            raise too_large(path, f"{len(raw):,} bytes of JSON", cap, len(raw))
        return raw
    try:
        return _gunzip(raw, path, cap, INFLATE)
    except (EOFError, zlib.error) as exc:
        raise _corrupt(path, exc) from None
    except _INFLATE_ERROR:
        pass  # ISA-L's error is left behind: its class cannot be pickled (igzip_lib.IsalError)
    try:  # zlib's words for it, as the refusal has always said
        return _gunzip(raw, path, cap, zlib)
    except (EOFError, zlib.error) as exc:
        raise _corrupt(path, exc) from None


def _corrupt(path: Path | str, exc: Exception) -> BadInput:
    """The refusal of a gzip stream that is cut short or corrupt (``exc``: zlib's error, or
    ``_gunzip``'s ``EOFError``)."""
    return BadInput(path, "truncated", f"truncated or corrupt gzip ({exc})",
                    "copy the trace again or re-record it")


_FIRST_IN_BYTES = 1 << 10
"""The first piece of a gzip member fed to zlib; each next piece of the same member is twice
the last, up to ``_MAX_IN_BYTES``. zlib copies what follows a member's end into
``unused_data`` (and what it had no room to inflate into ``unconsumed_tail``): fed the whole
rest of the file, a file of many small members cost the rest of the file per member, quadratic
(160k members: 18 s). Pieces that grow from small cost at most twice a member's own bytes."""
_MAX_IN_BYTES = 4 << 20
"""The largest piece of compressed input fed at once: at most a quarter of a ``_CHUNK_BYTES``
of output is copied as a tail per chunk (a bomb's ~1000:1 too). 1 MiB pieces cost ~15 % more
CPU on a 190 MB trace than whole-file input; 4 MiB pieces cost the same."""


def _gunzip(raw: bytes, path: Path | str, cap: int, inflate: Any = zlib) -> bytes:
    """``raw``'s gzip members inflated one after another into one buffer, at most ``cap`` bytes
    (``too_large`` past it); trailing zero bytes (padding some copies add) are ignored.
    ``inflate``: ``zlib`` or a module of its API (``INFLATE``). Raises ``EOFError`` for a
    stream cut short, ``inflate.error`` for a corrupt one.

    ISA-L inflates the first member in one call bounded by the cap, and its buffer is the
    result when no member follows: it grows one buffer, so a 40 MB trace costs ~29 ms, as
    libdeflate's one shot, against ~44 in chunks (their fresh pages, the copy into ``out``),
    and a bomb stops at the cap as in chunks (``out`` held up to the cap there too). zlib's
    buffer is built of blocks joined at the end (CPython's ``_BlocksOutputBuffer``): twice the
    JSON at the peak in one call, so zlib inflates in chunks (``_CHUNK_BYTES``)."""
    out = io.BytesIO()
    size = 0
    view = memoryview(raw).toreadonly()
    pos, end = 0, len(view)
    if inflate is not zlib:  # the first member in one call, its buffer returned as is
        d = inflate.decompressobj(wbits=31)
        first = d.decompress(view, cap + 1)
        if len(first) > cap:
            raise too_large(path, "the gunzipped trace", cap)
        if not d.eof:  # under the cap, yet not ended: the input ran out
            raise EOFError("compressed file ended before the end-of-stream marker")
        rest = d.unused_data
        if not rest.strip(b"\x00"):
            return first  # one member (and zero padding): no copy into the buffer
        out.write(first)
        size, pos = len(first), end - len(rest)
    while pos < end:
        if view[pos] == 0 and not raw[pos:].strip(b"\x00"):
            break  # zero padding to the end (checked once: anything else fails in zlib)
        d = inflate.decompressobj(wbits=31)  # one gzip member
        piece = _FIRST_IN_BYTES
        while not d.eof:
            if pos >= end:
                raise EOFError("compressed file ended before the end-of-stream marker")
            data = view[pos:pos + piece]
            pos += len(data)
            piece = min(2 * piece, _MAX_IN_BYTES)
            while True:  # inflate this piece, a chunk of output at a time
                chunk = d.decompress(data, min(_CHUNK_BYTES, cap + 1 - size))
                size += len(chunk)
                if size > cap:
                    raise too_large(path, "the gunzipped trace", cap)
                if chunk:
                    out.write(chunk)
                data = d.unconsumed_tail
                if d.eof or not data and not chunk:
                    break
        pos -= len(d.unused_data)  # the next member starts where this one ended
    return out.getvalue()  # the buffer itself (no copy while no view of it is exported)


def decode_bytes(data: bytes, path: Path | str = "<bytes>", *, other_times: bool = False
                 ) -> Decoded:
    """Decode trace JSON ``data`` (see ``Decoded``; ``other_times``: fill that field too):
    ``columns(parse(data, path, other_times=...), path)``. Raises ``BadInput`` as ``parse``."""
    return columns(parse(data, path, other_times=other_times), path)


@dataclass(slots=True)
class Parsed:
    """A trace decoded into msgspec structs, its columns not built yet (``columns``). The JSON
    is held here only: a caller that is done with it sets ``json`` to None before
    ``columns``, so that the bytes (about a third of a rank's peak) are freed first."""

    trace: Any
    """The decoded trace struct, or the ``Decoded`` of a file that needed a repair."""
    json: bytes | None
    """The bytes decoded (a repaired file's repaired bytes): what ``memory_events`` reads."""
    memory_events: bool
    """An event is named ``[memory]`` (``Decoded.memory_events``)."""
    complete: tuple | None = None
    """The complete events: their index in traceEvents, the events, their names, categories,
    pids, tids and thread names coded (``_coded_names``); None for a repaired file. The
    trace's own list of events is emptied."""
    warnings: list[str] = field(default_factory=list)
    """Events skipped so far (no or an unknown phase)."""
    other_times: tuple[np.ndarray, np.ndarray] | None = None
    """``Decoded.other_times`` when asked for."""


def parse(data: bytes, path: Path | str = "<bytes>", *, other_times: bool = False) -> Parsed:
    """Decode trace JSON ``data`` into its structs (``Parsed``). ``path`` is only used in
    messages. A leading UTF-8 byte-order mark (an editor's save) is dropped: JSON (RFC 8259
    8.1) lets a reader ignore it. Raises ``BadInput``: ``truncated``, ``not_a_trace`` (also
    for JSON nested deeper than the decoder's recursion limit, and a ``schemaVersion`` that is
    not a whole number >= 0: Kineto writes 1)."""
    try:
        trace, data = _decode_trace(data, path, other_times)
    except RecursionError:
        raise too_deep(path) from None
    if isinstance(trace, Decoded):  # repaired: built already
        json_bytes, trace.repaired_json = trace.repaired_json or data, None
        return Parsed(trace, json_bytes, trace.memory_events)
    version = trace.schemaVersion
    if version is not None and not (type(version) is int and version >= 0):
        raise BadInput(path, "not_a_trace", f"schemaVersion {_shown(version)} is not a "
                       "version number (Kineto writes 1)",
                       "pass PyTorch profiler traces, or fix the trace's schemaVersion")
    return _parsed(trace, data, path, other_times)


def _parsed(trace: Any, data: bytes, path: Path | str = "<bytes>", other_times: bool = False
            ) -> Parsed:
    """``Parsed`` of the decoded trace struct ``trace`` of ``data``: its complete events
    taken, the others dropped (``other_times``: their times read first)."""
    warnings: list[str] = []
    event_idx, xs, thread_names, other_idx, memory = _complete_events(trace, path, warnings)
    evs, times = trace.traceEvents, None
    if other_times:  # Decoded.other_times
        times = np.zeros(len(evs), np.int64), np.zeros(len(evs), bool)
        times[0][other_idx], times[1][other_idx] = parse_decimal_ns(
            [evs[i].ts for i in other_idx.tolist()])
    trace.traceEvents = evs = []  # the other events go now
    coded = _coded_names(xs, not isinstance(trace, _LTrace), thread_names)
    memory = memory or "[memory]" in coded["name"][1]
    return Parsed(trace, data, memory, (event_idx, xs, coded), warnings, times)


def columns(parsed: Parsed, path: Path | str = "<bytes>") -> Decoded:
    """The ``Decoded`` table of ``parsed`` (its structs are dropped as they are read); its
    ``repaired_json`` is ``parsed.json`` when the file needed a repair. ``path`` is only used
    in messages."""
    if isinstance(parsed.trace, Decoded):
        parsed.trace.repaired_json = parsed.json
        return parsed.trace
    dec = _columns(parsed, path)
    dec.memory_events = parsed.memory_events
    return dec


def too_deep(path: Path | str) -> BadInput:
    """The refusal of JSON nested deeper than the decoder's recursion limit (msgspec raises
    ``RecursionError``: an attack on the parser, no profiler writes it)."""
    return BadInput(path, "not_a_trace", "JSON nested too deeply to be a profiler trace",
                    "pass PyTorch profiler traces (export_chrome_trace / "
                    "tensorboard_trace_handler output)")


def _shown(value: Any) -> str:
    text = msgspec.json.encode(value).decode()
    return text if len(text) <= 40 else text[:37] + "..."


def _decode_trace(data: bytes, path: Path | str, other_times: bool) -> tuple[Any, bytes]:
    """(the decoded trace struct, or an already built ``Decoded`` after a repair; the data
    it came from)."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        trace = _decode_typed(data)
    except msgspec.DecodeError as exc:
        return _decode_repaired(data, path, exc, other_times)
    if trace is None:
        try:
            trace = _LENIENT.decode(data)
        except msgspec.ValidationError as exc:
            raise BadInput(path, "not_a_trace",
                           f"not a Chrome/Kineto trace: no traceEvents list of objects ({exc})",
                           "pass PyTorch profiler traces (export_chrome_trace / "
                           "tensorboard_trace_handler output)") from None
        except msgspec.DecodeError as exc:  # the strict pass stopped at a type, before this
            return _decode_repaired(data, path, exc, other_times)
    return trace, data


def _decode_repaired(data: bytes, path: Path | str, exc: msgspec.DecodeError,
                     other_times: bool) -> tuple[Decoded, bytes]:
    """``data``, which msgspec refused with ``exc``, repaired (``repair``) and decoded, the
    repair's note first among the warnings. Raises ``BadInput``: what ``repair`` raises, and
    the refusal of ``exc`` when a quote repair was not all the file needed."""
    fixed, line = repair(data, path, exc)
    try:
        dec = decode_bytes(fixed, path, other_times=other_times)
    except BadInput as err:  # quotes were not all that was wrong: refused as before
        if line.endswith(QUOTES_NOTE) and err.reason == "truncated":
            raise _invalid_json(path, exc) from None
        raise
    dec.warnings.insert(0, line)
    if dec.repaired_json is None:  # the innermost repair's bytes are the final ones
        dec.repaired_json = fixed
    return dec, fixed


def repair(data: bytes, path: Path | str, exc: msgspec.DecodeError) -> tuple[bytes, str]:
    """``data``, which msgspec refused with ``exc``, made readable, and the warning line that
    says how: NaN / Infinity numbers (Python's json writes them) as null; bytes that are not
    UTF-8 (C++ symbols, paths in names) replaced by U+FFFD; unescaped ``"`` inside strings
    escaped (``quoterepair.repair_quotes``: only when its rule explains the failure), rather
    than refusing the whole trace. The caller decodes the result strictly again; a quote
    repair that does not give a trace is refused with the original error. Raises
    ``BadInput`` (``not_a_trace``, ``truncated``) for anything else."""
    if _at_non_finite(data, str(exc)):
        return _non_finite_as_null(data, path), (f"{path}: NaN / Infinity numbers (not JSON; "
                                                 "Python's json writes them) were read as null")
    if "surrogate" in str(exc):
        fixed = _LONE_SURROGATE.sub(rb"\\ufffd", data)
        if fixed != data:
            return fixed, (f"{path}: \\u escapes of lone UTF-16 surrogates (no character) in "
                           "strings were replaced by U+FFFD")
    if "UTF-8" not in str(exc):
        _refuse_not_json(data, path)
        fixed = repair_quotes(data)  # None unless quotes inside strings explain it
        if fixed is None:
            raise _invalid_json(path, exc)
        n = fixed[1]
        return fixed[0], f"{path}: {n} string{'s' if n != 1 else ''} repaired: {QUOTES_NOTE}"
    return (data.decode("utf-8", errors="replace").encode("utf-8"),
            f"{path}: invalid UTF-8 bytes in strings were replaced by U+FFFD")


QUOTES_NOTE = ("event names with unescaped double quotes inside (exporters before kineto "
               "#1459, pytorch#146900), read with the quotes as written; the file is unchanged")
"""The end of the note of a quote repair (``repair``), after the number of strings."""


def _invalid_json(path: Path | str, exc: msgspec.DecodeError) -> BadInput:
    """The one-line refusal of JSON nothing repairs (reason ``truncated``)."""
    return BadInput(path, "truncated", f"truncated or invalid JSON ({exc})",
                    "copy the trace again or re-record it")


def _decode_typed(data: bytes) -> Any:
    """``data`` decoded by the first of ``_TYPED`` that accepts it; None when neither does.
    Raises ``msgspec.DecodeError`` (not JSON, truncated, invalid UTF-8)."""
    for decoder in _TYPED:
        try:
            return decoder.decode(data)
        except msgspec.ValidationError:
            continue
    return None


def _at_non_finite(data: bytes, message: str) -> bool:
    """True when msgspec stopped (``... (byte N)``) at a ``NaN`` / ``Infinity`` token."""
    m = re.search(r"\(byte (\d+)\)$", message)
    return m is not None and data[int(m.group(1)):].startswith((b"NaN", b"Infinity"))


_LONE_SURROGATE = re.compile(rb"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})"
                             rb"|(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}")
"""A ``\\uD800``-``\\uDFFF`` escape that is not half of a surrogate pair: JSON text that names no
character (RFC 8259 8.2), which msgspec refuses and Python's json turns into a string no UTF-8
writer takes."""


def _non_finite_as_null(data: bytes, path: Path | str) -> bytes:
    """``data`` with NaN / Infinity written as null, read by Python's json (which accepts
    them; slow, for these files only). Raises ``BadInput`` (``truncated``)."""
    data = _LONE_SURROGATE.sub(rb"\\ufffd", data)  # json.loads takes them, msgspec writes none
    try:
        return msgspec.json.encode(json.loads(data))  # msgspec writes non-finite as null
    except (ValueError, RecursionError) as exc:
        raise BadInput(path, "truncated", f"truncated or invalid JSON ({exc})",
                       "copy the trace again or re-record it") from None


def _refuse_not_json(data: bytes, path: Path | str) -> None:
    """Raise ``BadInput`` (reason ``not_a_trace``) when ``data`` does not even start like a
    trace: its first non-blank byte is not ``{`` (a Chrome trace is a JSON object; a UTF-8 BOM
    is allowed). Returns for data that starts like JSON and is broken later (truncated)."""
    head = data.lstrip(b"\xef\xbb\xbf").lstrip()
    if head[:1] == b"{":
        return
    shown = head[:20].decode("utf-8", errors="replace").split("\n")[0]
    what = "is empty" if not head else f"is not JSON (starts with {shown!r})"
    raise BadInput(path, "not_a_trace", f"{what}: not a Chrome/Kineto trace",
                   "pass PyTorch profiler traces (export_chrome_trace / "
                   "tensorboard_trace_handler output)") from None


def parse_decimal_ns(raws: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray]:
    """Exact conversion of JSON numbers in µs (raw text) to int64 ns, vectorised.

    Returns ``(values_ns, ok)``; ``ok`` is False for null/missing, strings, negatives and
    anything that is not a number (value 0 there). Rounds half up on the 4th decimal. Plain
    decimals with at most three decimals (what Kineto writes) go through Arrow's exact
    string -> decimal cast (``_parse_decimal_arrow``); otherwise the general parser works
    column by column over the tokens' characters (Horner's rule), so the cost is
    O(tokens x longest token) numpy operations on short arrays.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    blob = b"\x00" + b"\x00".join(raws)
    fast = _parse_decimal_arrow(blob, n)
    if fast is not None:
        return fast, np.ones(n, bool)
    blob = blob[1:] + b"\x00"
    c = np.frombuffer(blob, np.uint8)
    ends = np.flatnonzero(c == 0)
    starts = np.empty(n, np.int64)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    width = int(min(lengths.max(), _MAX_TOKEN))
    acc = np.zeros(n, np.int64)  # integer part, µs
    frac = np.zeros(n, np.int64)  # first three decimals
    nfrac = np.zeros(n, np.int64)
    round_up = np.zeros(n, bool)
    seen_dot = np.zeros(n, bool)
    nint = np.zeros(n, np.int64)
    bad = (lengths == 0) | (lengths > _MAX_TOKEN)
    exp_form = np.zeros(n, bool)
    for j in range(width):
        active = lengths > j
        ch = c[np.minimum(starts + j, len(c) - 1)]
        d = ch.astype(np.int64) - 48
        isd = active & (d >= 0) & (d <= 9)
        isdot = active & (ch == 46)
        exp_form |= active & ((ch == 101) | (ch == 69))
        bad |= active & ~isd & ~isdot
        bad |= isdot & seen_dot
        seen_dot |= isdot
        intd = isd & ~seen_dot
        acc = np.where(intd, acc * 10 + d, acc)
        nint += intd
        fr = isd & seen_dot & (nfrac < 3)
        frac = np.where(fr, frac * 10 + d, frac)
        r4 = isd & seen_dot & (nfrac == 3)
        round_up |= r4 & (d >= 5)
        nfrac += fr | r4
    bad |= nint == 0
    bad |= (nint > 16) | (acc > _MAX_US)
    nfrac3 = np.minimum(nfrac, 3)
    values = acc * 1000 + frac * _POW10[3 - nfrac3] + round_up
    # exponent form (1.5e3): the exact path does not apply, fall back to float
    for i in np.flatnonzero(exp_form & (lengths <= _MAX_TOKEN)):
        try:
            v = float(bytes(raws[i]))
        except ValueError:
            continue
        if np.isfinite(v) and 0 <= v < _MAX_US:
            values[i] = int(round(v * 1000.0))
            bad[i] = False
    values[bad] = 0
    return values, ~bad


def _parse_decimal_arrow(blob: bytes, n: int) -> np.ndarray | None:
    """Fast path of ``parse_decimal_ns`` (the same results where it answers): Arrow's exact
    string -> decimal128(38, 3) cast, whose unscaled integer is the value in ns. ``blob`` holds
    the ``n`` tokens each preceded by a NUL; each NUL is turned into a leading ``0`` of its
    token. None (use the general parser) unless every token is a plain non-negative decimal
    with at most three decimals that fits int64 ns: exponents, signs, empty tokens, null,
    strings, sub-ns digits (which need rounding half up) and huge values all go the slow way."""
    if b"e" in blob or b"E" in blob or b"-" in blob or b"+" in blob:
        return None
    c = np.frombuffer(blob, np.uint8).copy()
    seps = np.flatnonzero(c == 0)
    if len(seps) != n or seps[0] != 0 or len(c) >= 2**31:
        return None
    offsets = np.empty(n + 1, np.int32)
    offsets[:n] = seps
    offsets[n] = len(c)
    if (np.diff(offsets) < 2).any():  # an empty token
        return None
    c[seps] = 48  # token i is now "0<token>"
    strings = pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(c))
    if b"." not in blob:  # whole µs only (older Kineto): the int64 cast is 4x faster
        try:
            us = pc.cast(strings, pa.int64()).to_numpy(zero_copy_only=False)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        if (us < 0).any() or (us > _MAX_US).any():
            return None
        return us * 1000
    try:
        dec = pc.cast(strings, pa.decimal128(38, 3))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if dec.null_count:
        return None
    words = np.frombuffer(dec.buffers()[1], np.int64, count=2 * n).reshape(n, 2)
    low, high = words[:, 0], words[:, 1]
    if (high != 0).any() or (low < 0).any() or (low > _MAX_US * 1000).any():
        return None
    return low.copy()


_MAX_TOKEN = 32
_POW10 = np.array([1, 10, 100, 1000], np.int64)


def _str_codes(values: Iterable[Any], n: int | None = None, *, as_str: bool = True
               ) -> tuple[np.ndarray, list[Any]]:
    """(int32 code of each value, distinct values in order of first use) of ``n`` hashable
    values (default: len(values)), in one C-level loop (a defaultdict whose missing keys take
    the next code); an iterator is consumed as it goes (no list of the values is held).
    ``as_str``: distinct values written as str, and values equal once written so (``1`` and
    ``"1"``) share a code."""
    code_of: defaultdict[Any, int] = defaultdict(count().__next__)
    count_ = len(values) if n is None else n  # type: ignore[arg-type]
    codes = np.fromiter(map(code_of.__getitem__, values), np.int32, count=count_)
    if not as_str:
        return codes, list(code_of)
    strs = [v if type(v) is str else str(v) for v in code_of]
    if len(set(strs)) != len(strs):
        first: dict[str, int] = {}
        remap = np.array([first.setdefault(v, len(first)) for v in strs], np.int32)
        codes, strs = remap[codes], list(first)
    return codes, strs


def _part_codes(combos: list[tuple], k: int, combo_codes: np.ndarray
                ) -> tuple[np.ndarray, list[str]]:
    """(code of each row, distinct values as str) of field ``k`` of coded tuples."""
    part, values = _str_codes([c[k] for c in combos])
    return (part[combo_codes] if len(combo_codes) else np.zeros(0, np.int32)), values


def _cat(codes: np.ndarray, values: list[str], order: np.ndarray, kept: np.ndarray
         ) -> pd.Categorical:
    """Categorical of ``values[codes[order]]`` whose categories are the values used there, in
    order of first use in file order (``codes`` are in file order; ``order`` selects and
    sorts rows; ``kept`` = the selected rows in file order)."""
    n, k = len(codes), len(values)
    if len(kept) == n:  # every row kept: codes are already numbered in order of first use
        return pd.Categorical.from_codes(codes[order], categories=pd.Index(values, dtype="str"))
    first = np.full(k, n, np.int64)
    first[codes[kept[::-1]]] = kept[::-1]  # the last write wins: the first use
    used = np.flatnonzero(first < n)
    used = used[np.argsort(first[used], kind="stable")]
    remap = np.full(k, -1, np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    return pd.Categorical.from_codes(remap[codes[order]],
                                     categories=pd.Index([values[i] for i in used], dtype="str"))


def _int_column(args: list, attr: str, fallback: str | None = None, *,
                strict: bool, huge: list[int] | None = None) -> np.ndarray:
    """int64 column of ``args``' attribute ``attr`` (-1 when absent / not an int64; when
    ``fallback`` is given its attribute is used where ``attr`` is absent). ``strict``: the
    values are int (default -1) or None, as the strict decoder gives them. ``huge``: a list
    the count of integers beyond int64 (read as absent) is appended to."""
    n = len(args)
    if strict:
        try:  # one C loop; None (JSON null) or ints beyond int64 take the loop below
            out = np.fromiter(map(attrgetter(attr), args), np.int64, count=n)
            if fallback is not None:
                other = np.fromiter(map(attrgetter(fallback), args), np.int64, count=n)
                out = np.where(out == -1, other, out)
            return out
        except (TypeError, OverflowError):
            pass
    vals = [getattr(a, attr) for a in args]
    if fallback is not None:
        vals = [v if v is not None and v != -1 else getattr(a, fallback)
                for v, a in zip(vals, args)]
    if huge is not None:
        huge.append(sum(1 for v in vals if type(v) is int and not _I64_MIN <= v <= _I64_MAX))
    return np.array([_as_int(v) for v in vals], dtype=np.int64)


_STR = pd.StringDtype("pyarrow", na_value=np.nan)  # pandas' default ``str`` dtype


def str_array(values: np.ndarray) -> pd.api.extensions.ExtensionArray:
    """pandas ``str`` array of an object array of str / None, built by Arrow in C (five times
    faster than pandas' own inference on a mostly-None column)."""
    return pd.Series(pa.array(values, type=pa.string(), from_pandas=True), dtype=_STR).array


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _as_int(v: Any) -> int:
    """``v`` when it is an int that fits int64, else -1 (unknown)."""
    return v if type(v) is int and _I64_MIN <= v <= _I64_MAX else -1


def _arg_int(v: Any) -> int:
    """``_as_int`` that also reads a whole number written as a string (``"1024"``): CUDA-graph
    kernel annotations stringify every value (pytorch #179768, ``_chrome_trace_export.py``)."""
    if type(v) is str and v.isascii() and v.isdigit() and len(v) < 19:
        return int(v)
    return _as_int(v)


def _raw_id(raw: msgspec.Raw) -> str | None:
    """An id argument as text (``Comms Id``: a uint64 number, or a string), None for null."""
    v = msgspec.json.decode(raw)
    return None if v is None or isinstance(v, (dict, list)) else str(v)


def _stream_arg(v: Any) -> int:
    """An ``args.stream`` value as pandas' ``to_numeric(errors="coerce")`` reads it, which is
    how HolisticTraceAnalysis reads it (hta/utils/utils.py ``normalize_gpu_stream_numbers``):
    an int, a finite float (truncated) or a string of decimal digits; anything else (absent,
    ``"0x0"`` as ROCm writes it) is -1."""
    if type(v) is int:
        return _as_int(v)
    if type(v) is float and math.isfinite(v) and abs(v) < 2**63:
        return int(v)
    if type(v) is str:
        t = v.strip()
        if t.lstrip("+-").isdigit() and t.isascii() and len(t) < 19:
            return int(t)
    return -1


def _as_str(v: Any) -> str | None:
    return v if v is None or type(v) is str else str(v)


def _first_type(type_raw: msgspec.Raw) -> str | None:
    """The first ``Input type`` when it names a dtype (``c10::BFloat16``, ``float``), else None."""
    try:
        types = msgspec.json.decode(type_raw)
    except msgspec.DecodeError:
        return None
    t = types[0] if isinstance(types, list) and types else None
    return t if isinstance(t, str) and dtype_bytes(t) > 0 else None


def _numel(dims: Any) -> int:
    """Elements of one tensor's ``Input Dims`` entry (a list of int sizes), -1 when it is not
    one (a tensor list, a scalar's ``[]``, a negative or oversized product)."""
    if not isinstance(dims, list) or not dims or not all(type(d) is int for d in dims):
        return -1
    numel = math.prod(dims)
    return numel if 0 <= numel <= _I64_MAX else -1


def _shape(dims_raw: msgspec.Raw, type_raw: msgspec.Raw) -> tuple[int, int, int]:
    """(numel of the first tensor input, its element size, numel of the second tensor input),
    -1 when unknown. A c10d op records (output, input): ``c10d::_allgather_base_`` the whole
    buffer then the piece, ``c10d::_reduce_scatter_base_`` the piece then the whole."""
    try:
        dims = msgspec.json.decode(dims_raw)
        types = msgspec.json.decode(type_raw)
    except msgspec.DecodeError:
        return -1, -1, -1
    if not isinstance(dims, list) or not dims:
        return -1, -1, -1
    numel = _numel(dims[0])
    if numel < 0:
        return -1, -1, -1
    size = dtype_bytes(types[0]) if isinstance(types, list) and types else -1
    return numel, size, _numel(dims[1]) if len(dims) > 1 else -1


def _columns(parsed: Parsed, path: Path | str) -> Decoded:
    """The ``Decoded`` table of a decoded trace: rows sorted by (ts_ns, longest first), file
    order among equals. Each pass over the events is one C-level loop (``map``,
    ``attrgetter``, a defaultdict coder); Python-level work runs per distinct value, or per
    row only for GPU rows and the few rows that carry collective arguments. The events are
    dropped once read (``parsed.complete`` left None)."""
    trace, warnings, times = parsed.trace, parsed.warnings, parsed.other_times
    strict = not isinstance(trace, _LTrace)
    event_idx, xs, coded = parsed.complete
    parsed.complete = None
    ts, dur, order, kept = _times(trace, xs, path, warnings)
    no_args = _Args() if strict else _LArgs()
    args = [e.args if e.args is not None else no_args for e in xs]
    cat_codes, u_cat = coded["cat"]
    is_gpu = np.array([c.lower() in GPU_CATS for c in u_cat], bool)[cat_codes] if len(args) \
        else np.zeros(0, bool)
    stream, stream_arg = _streams(args, is_gpu, *coded["tid"])
    huge: list[int] = []
    ext = _int_column(args, "external_id", "external_id_lc", strict=strict, huge=huge)
    corr = _int_column(args, "correlation", strict=strict, huge=huge)
    graph_node = _int_column(args, "graph_node", strict=strict, huge=huge)
    if sum(huge):  # no profiler writes one: the launch links of those events are lost
        warnings.append(f"{path}: {sum(huge)} External id / correlation / graph node id "
                        "values beyond 64 bits read as absent (no launch link)")
    coll_rows, coll = _collective_args(args, coded["name"])
    n_all = len(args)
    # each event with its args in one pass (one walk of memory, not two); the last holders of
    # raw JSON values: the trace's bytes are freed here too
    del args, xs
    coll = _spread(n_all, coll_rows, coll, order)
    end = ts + dur
    df = pd.DataFrame(copy=False, data={  # fresh arrays: no copy, no consolidation
        **{c: _cat(*coded[c], order, kept) for c in ("name", "cat", "pid", "tid")},
        "event_idx": event_idx[order], "ts_ns": ts[order], "dur_ns": dur[order],
        "end_ns": end[order], "is_gpu": is_gpu[order], "stream": stream[order],
        "stream_arg": stream_arg[order], "correlation": corr[order], "external_id": ext[order],
        "thread_name": _cat(*coded["thread_name"], order, kept),
        **coll, "graph_node": graph_node[order],
    })
    di = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else None
    return Decoded(events=df, distributed_info=di, warnings=warnings, other_times=times)


def _complete_events(trace: Any, path: Path | str, warnings: list[str]
                     ) -> tuple[np.ndarray, list, dict[tuple[str, str], str], np.ndarray, bool]:
    """(index in traceEvents of each complete (X) event, the X events, thread names by (pid,
    tid) from the metadata events: the last one wins, as trace viewers do; the index of each
    event neither complete nor metadata; whether an event other than a complete one is named
    ``[memory]``). On a lenient decode, events of no or an unknown phase are counted in
    ``warnings``."""
    evs = trace.traceEvents
    if not isinstance(trace, _LTrace):  # a tagged union: the event's type says its phase
        kinds = {_XUs: 1, _X: 1, _M: 2}
        kind = np.fromiter(map(kinds.get, map(type, evs), repeat(0)), np.int8, count=len(evs))
        event_idx = np.flatnonzero(kind == 1)  # one pass over the events, then only the rows
        xs = list(map(evs.__getitem__, event_idx.tolist()))
        metas = list(map(evs.__getitem__, np.flatnonzero(kind == 2).tolist()))
        other_idx = np.flatnonzero(kind == 0)
        memory = _MEMORY_RAW in map(attrgetter("name"), map(evs.__getitem__, other_idx.tolist()))
    else:
        event_idx = np.array([i for i, e in enumerate(evs) if e.ph == "X"], np.int64)
        xs = [evs[i] for i in event_idx.tolist()]
        metas = [e for e in evs if e.ph == "M"]
        other_idx = np.array([i for i, e in enumerate(evs) if e.ph != "X" and e.ph != "M"], np.int64)
        memory = any(e.name == "[memory]" for e in evs)
        n_odd = sum(1 for e in evs if not (type(e.ph) is str and e.ph in _KNOWN_PHASES))
        if n_odd:  # the strict decoders accept only known phases: only this path sees them
            warnings.append(f"{path}: skipped {n_odd} events with no or an unknown phase "
                            "(\"ph\"), which the Chrome trace format does not define")
    thread_names: dict[tuple[str, str], str] = {}
    memory = memory or any(e.name == "[memory]" for e in metas)
    for e in metas:
        if e.name == "thread_name" and e.args is not None:
            thread_names[(str(e.pid), str(e.tid))] = _as_str(e.args.meta_name) or ""
    return event_idx, xs, thread_names, other_idx, memory


def _times(trace: Any, xs: list, path: Path | str, warnings: list[str]
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ts_ns, dur_ns of every X event in file order, 0 where invalid; ``order``: the rows kept,
    sorted; ``kept``: the rows kept, in file order). Events with an invalid ts or dur are
    counted in ``warnings``."""
    n_all = len(xs)
    if isinstance(trace, _TraceUs):  # whole µs, validated in range by the decoder
        ts = np.fromiter(map(attrgetter("ts"), xs), np.int64, count=n_all)
        dur = np.fromiter(map(attrgetter("dur"), xs), np.int64, count=n_all)
        ts_ok, dur_ok = ts >= 0, dur >= 0  # -1: missing
        ts, dur = np.where(ts_ok, ts * 1000, 0), np.where(dur_ok, dur * 1000, 0)
    else:
        times, times_ok = parse_decimal_ns([*map(attrgetter("ts"), xs),
                                            *map(attrgetter("dur"), xs)])
        ts, dur = times[:n_all], times[n_all:]
        ts_ok, dur_ok = times_ok[:n_all], times_ok[n_all:]
    n_bad_ts = int((~ts_ok).sum())
    n_bad_dur = int((ts_ok & ~dur_ok).sum())
    if n_bad_ts:
        warnings.append(f"{path}: skipped {n_bad_ts} complete events with a missing, negative or "
                        "non-numeric ts")
    if n_bad_dur:
        warnings.append(f"{path}: skipped {n_bad_dur} complete events with a missing, negative "
                        "or non-numeric dur")
    # every column is built in file order, then rows are kept and sorted with ``order``
    order = np.lexsort((-(ts + dur), ts))  # stable: file order among equal (ts, end)
    ok = ts_ok & dur_ok
    kept = np.flatnonzero(ok)
    if len(kept) < n_all:
        order = order[ok[order]]
    return ts, dur, order, kept


def _coded_names(xs: list, strict: bool, thread_names: dict[tuple[str, str], str]
                 ) -> dict[str, tuple[np.ndarray, list[str]]]:
    """(code of each event, distinct values) of name, cat, pid, tid and thread_name: the four
    coded together in one pass, then split per distinct combination."""
    if strict:
        combos = map(attrgetter("name", "cat", "pid", "tid"), xs)
    else:  # any JSON value: as the strict types would give it
        combos = ((_as_str(e.name) or "", _as_str(e.cat) or "", str(e.pid), str(e.tid))
                  for e in xs)
    combo_codes, u_combo = _str_codes(combos, len(xs), as_str=False)
    out = {c: _part_codes(u_combo, k, combo_codes)
           for k, c in enumerate(("name", "cat", "pid", "tid"))}
    tn_of_combo, u_tn = _str_codes([thread_names.get((str(c[2]), str(c[3])), "")
                                    for c in u_combo])
    out["thread_name"] = (tn_of_combo[combo_codes], u_tn)
    return out


def _streams(args: list, is_gpu: np.ndarray, tid_codes: np.ndarray, u_tid: list[str]
             ) -> tuple[np.ndarray, np.ndarray]:
    """(stream: a GPU row's ``stream`` argument, else the number in its tid, -1 on CPU rows;
    stream_arg: every row's ``stream`` argument as written, -1 absent). HolisticTraceAnalysis
    takes a row as a GPU kernel only with a stream >= 0 there (analyzer/compare/crosscheck_hta.py)."""
    n_all = len(args)
    stream = np.full(n_all, -1, np.int64)
    for i in np.flatnonzero(is_gpu).tolist():
        s = args[i].stream
        if type(s) is int:
            stream[i] = _as_int(s)
        else:
            t = u_tid[tid_codes[i]].removeprefix("stream").strip()
            stream[i] = int(t) if t.isascii() and t.isdigit() and len(t) < 19 else -1
    stream_raw = list(map(attrgetter("stream"), args))
    stream_at = np.flatnonzero(np.fromiter(map(is_not, stream_raw, repeat(None)), bool,
                                           count=n_all))
    stream_arg = np.full(n_all, -1, np.int64)
    present = list(map(stream_raw.__getitem__, stream_at.tolist()))
    try:  # one C loop when every value is a number (as pandas: floats truncated)
        stream_arg[stream_at] = np.fromiter(present, np.int64, count=len(present))
    except (TypeError, ValueError, OverflowError):  # "0x0", "7", ints beyond int64
        stream_arg[stream_at] = np.fromiter(map(_stream_arg, present), np.int64,
                                            count=len(present))
    return stream, stream_arg


_ARG_COLUMNS = ("coll_name", "dtype", "pg", "pg_ranks", "pg_desc", "in_nelems", "out_nelems",
                "group_size", "shape_numel", "shape_elem_bytes", "shape2_numel", "seq_arg",
                "comms_id")
"""The collective-argument columns, in the table's order: str (``_STR_ARGS``), else int64."""
_STR_ARGS = frozenset({"coll_name", "dtype", "pg", "pg_ranks", "pg_desc", "comms_id"})


def _collective_args(args: list, name: tuple[np.ndarray, list[str]]
                     ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(the rows that carry collective arguments, in file order; their ``_ARG_COLUMNS``: str
    objects (None unknown) or int64 (-1 unknown), one value per such row). Only comm-related
    rows carry them (a comm name, ``_COMM_PREFIXES``, or a ``Collective name``): they are read,
    and shapes parsed, for those only. ``_spread`` makes them columns."""
    n_all = len(args)
    codes, u_name = name
    comm_name = np.array([x.startswith(_COMM_PREFIXES) for x in u_name], bool)
    carries = comm_name[codes] if n_all else np.zeros(0, bool)
    carries |= np.fromiter(map(is_not, map(attrgetter("coll_name"), args), repeat(None)), bool,
                           count=n_all)
    rows = np.flatnonzero(carries)
    m = len(rows)
    out = {c: np.full(m, None, object) if c in _STR_ARGS else np.full(m, -1, np.int64)
           for c in _ARG_COLUMNS}
    (coll_name, dtype, pg, pg_ranks, pg_desc, n_in, n_out, group, numel, elem, numel2, seq,
     comms_id) = out.values()
    for k, i in enumerate(rows.tolist()):
        a = args[i]
        coll_name[k] = _as_str(a.coll_name)
        dtype[k] = _as_str(a.dtype)
        pg[k] = _as_str(a.pg_name) if a.pg_name is not None else _as_str(a.pg_id)
        pg_desc[k] = _as_str(a.pg_desc)
        if a.pg_ranks is not _NULL:
            r = msgspec.json.decode(a.pg_ranks)
            pg_ranks[k] = None if r is None else r if isinstance(r, str) else json.dumps(r)
        n_in[k], n_out[k] = _arg_int(a.in_nelems), _arg_int(a.out_nelems)
        group[k], seq[k] = _arg_int(a.group_size), _arg_int(a.seq)
        if a.comms_id is not _NULL:
            comms_id[k] = _raw_id(a.comms_id)
        if a.input_dims is not _NULL:
            numel[k], elem[k], numel2[k] = _shape(a.input_dims, a.input_type)
        if dtype[k] is None and a.input_type is not _NULL:  # the first tensor's element type
            dtype[k] = _first_type(a.input_type)
    return rows, out


def _spread(n_all: int, rows: np.ndarray, out: dict[str, np.ndarray], order: np.ndarray
            ) -> dict[str, Any]:
    """The ``_ARG_COLUMNS`` (``_collective_args``' values of ``rows`` among ``n_all`` rows)
    of the rows ``order`` selects and sorts: pandas strings, or int64 (-1 unknown)."""
    m = len(rows)
    at = np.full(n_all, -1, np.int64)  # carrying rows -> all rows, sorted
    at[rows] = np.arange(m)
    at = at[order]
    carried = at >= 0
    take = pa.array(at, mask=~carried)
    for c, values in out.items():
        if c in _STR_ARGS:
            out[c] = pd.Series(pa.array(values, type=pa.string(), from_pandas=True).take(take),
                               dtype=_STR).array
        else:
            out[c] = np.where(carried, values[np.maximum(at, 0)], -1) if m else \
                np.full(len(at), -1)
    return out


# --- [memory] instant events (issue 19) ------------------------------------------------------
#
# torch.profiler(profile_memory=True) writes one instant event per allocation and free:
#   {"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "ts": ..., "args": {
#    "Device Type": 0 CPU / 1 CUDA / 6 HIP ..., "Device Id": ..., "Addr": ..., "Bytes": signed
#    (negative for a free), "Total Allocated": the allocator's total after the event,
#    "Total Reserved": the caching allocator's reserve after it}}
# (Kineto ``MemoryTraceEvent``; on CPU the totals count only what the profiler saw.) They are read
# in a second, light pass (names as raw bytes, args parsed for [memory] events only), only when
# the main decode saw one (``Decoded.memory_events``).
_MEMORY_NAME = b'"[memory]"'
_MEMORY_RAW = msgspec.Raw(_MEMORY_NAME)


class _MemArgs(msgspec.Struct, gc=False):
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    nbytes: Any = msgspec.field(default=None, name="Bytes")


class _MemEvent(msgspec.Struct, gc=False):
    name: msgspec.Raw = _NULL
    ts: msgspec.Raw = _NULL
    args: msgspec.Raw = _NULL


_MEM_TRACE = msgspec.json.Decoder(msgspec.defstruct(
    "_MemTrace", [("traceEvents", list[_MemEvent])], gc=False))
_MEM_ARGS = msgspec.json.Decoder(_MemArgs)
MEMORY_EVENT_COLUMNS = ("ts_ns", "device_type", "device_id", "total_allocated", "total_reserved",
                        "bytes")


def _whole(v: Any, missing: int) -> int:
    """A JSON number as a whole int64, ``missing`` when absent, not a number or out of range."""
    if type(v) is float and v.is_integer():
        v = int(v)
    return v if type(v) is int and -_I64_MAX <= v <= _I64_MAX else missing


def memory_events(data: bytes) -> tuple[pd.DataFrame, list[str]]:
    """The ``[memory]`` instant events of trace JSON ``data``: (table, warnings). Columns
    ``MEMORY_EVENT_COLUMNS``, all int64; device_type / device_id -1 and the amounts
    (total_allocated, total_reserved, bytes: negative for a free, and totals relative to the
    window can be) ``NO_VALUE`` where the event does not say; rows in file order, events with a bad ts left out and counted in
    a warning. Empty when the file has none, or when its JSON is not readable here (the main
    decode says why; a warning says the memory events were not read)."""
    empty = pd.DataFrame({c: np.zeros(0, np.int64) for c in MEMORY_EVENT_COLUMNS})
    if _MEMORY_NAME not in data:
        return empty, []
    try:
        evs = _MEM_TRACE.decode(data).traceEvents
    except (msgspec.DecodeError, RecursionError):
        return empty, ["[memory] events not read: the trace's JSON needed repair"]
    mem = [e for e in evs if bytes(e.name) == _MEMORY_NAME]
    if not mem:
        return empty, []
    ts, ok = parse_decimal_ns([e.ts for e in mem])
    cols: dict[str, list[int]] = {c: [] for c in MEMORY_EVENT_COLUMNS[1:]}
    for e in mem:
        try:
            a = _MEM_ARGS.decode(e.args) if bytes(e.args) != b"null" else _MemArgs()
        except msgspec.DecodeError:  # args that are not an object: nothing known
            a = _MemArgs()
        for c, v in zip(MEMORY_EVENT_COLUMNS[1:], (a.device_type, a.device_id, a.total_allocated,
                                                   a.total_reserved, a.nbytes)):
            cols[c].append(_whole(v, -1 if c.startswith("device") else NO_VALUE))
    df = pd.DataFrame({"ts_ns": ts, **{c: np.asarray(v, np.int64) for c, v in cols.items()}})
    warnings = []
    if not ok.all():
        warnings.append(f"skipped {int((~ok).sum())} [memory] events with a missing, negative or "
                        "non-numeric ts")
    return df[ok].reset_index(drop=True), warnings
