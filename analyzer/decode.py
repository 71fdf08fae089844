"""Decode one Kineto / Chrome trace file into a columnar event table (no classification).

Typed decoding with msgspec: only the fields the analyzer needs are declared; everything else in
the JSON is skipped by the decoder without building Python objects. The structs are untracked by
the cycle collector (``gc=False``; decoded JSON cannot form cycles): with tracking, the
collector's passes over ~10^5 new objects doubled the decode time of a 40 MB trace. Hot argument fields are typed
strictly (fast path); a trace whose values have other types (e.g. a string ``External id``) is
decoded again with lenient ``Any`` fields (slow path, same result).

Times: ``ts`` and ``dur`` are JSON numbers in microseconds, sometimes with sub-µs decimals
(``1712195495520854.8``). A float64 cannot hold such an epoch timestamp to the nanosecond (its
spacing there is 0.25 µs), so both are kept as raw JSON text (``msgspec.Raw``) and converted
exactly, vectorised, from the decimal digits to int64 nanoseconds, **rounding half up** on the
fourth decimal (0.5 ns and above goes up). Numbers in exponent form fall back to
``round(float * 1000)``. Events whose ts or dur is missing, negative or not a number are skipped,
counted, and reported as one warning line each kind.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from analyzer.errors import BadInput

_NULL = msgspec.Raw(b"null")


class _Args(msgspec.Struct, gc=False):
    """The ``args`` keys the analyzer reads (fast path: strict types for hot keys)."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_lc: int | None = msgspec.field(default=None, name="external id")  # tb_plugin
    correlation: int | None = None
    stream: int | str | None = None
    coll_name: str | None = msgspec.field(default=None, name="Collective name")
    in_nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    out_nelems: int | None = msgspec.field(default=None, name="Out msg nelems")
    group_size: int | None = msgspec.field(default=None, name="Group size")
    dtype: str | None = None
    pg_name: str | int | None = msgspec.field(default=None, name="Process Group Name")
    pg_id: int | str | None = msgspec.field(default=None, name="Process Group ID")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    meta_name: str | None = msgspec.field(default=None, name="name")  # ph "M" thread_name


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = -1
    tid: int | str = -1
    ts: msgspec.Raw = _NULL
    dur: msgspec.Raw = _NULL
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event]
    distributedInfo: Any = None
    deviceProperties: Any = None


class _LArgs(msgspec.Struct, gc=False):
    """Lenient twin of ``_Args``: any JSON value is accepted."""

    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_lc: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    stream: Any = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    pg_ranks: msgspec.Raw = msgspec.field(default=_NULL, name="Process Group Ranks")
    input_dims: msgspec.Raw = msgspec.field(default=_NULL, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NULL, name="Input type")
    meta_name: Any = msgspec.field(default=None, name="name")


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
    deviceProperties: Any = None


_STRICT = msgspec.json.Decoder(_Trace)
_LENIENT = msgspec.json.Decoder(_LTrace)

GPU_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync",
                      "gpu_sync"})
"""Kineto categories of events that run on a GPU stream (compared lower-cased: the tb_plugin's
test traces write ``Kernel``)."""

DTYPE_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2,
    "bfloat16": 2, "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2,
    "char": 1, "signed char": 1, "int8": 1, "byte": 1, "unsigned char": 1, "uint8": 1,
    "bool": 1, "complexfloat": 8, "complexdouble": 16, "complexhalf": 4,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}
"""Element size in bytes by dtype name as traces write it (``Float``, ``c10::BFloat16``,
``float``), lower-cased and without ``c10::``."""

_COMM_PREFIXES = ("nccl:", "gloo:", "c10d::", "record_param_comms", "mpi:", "ucc:")


def dtype_bytes(name: Any) -> int:
    """Bytes per element of the dtype ``name`` (trace spelling), -1 when unknown."""
    if not isinstance(name, str):
        return -1
    key = name.lower().removeprefix("c10::").strip()
    return DTYPE_BYTES.get(key, -1)


@dataclass(slots=True)
class Decoded:
    """One decoded trace file.

    ``events``: one row per complete event (``ph == "X"``) with valid ts/dur; columns name, cat,
    pid, tid (str), ts_ns, dur_ns, end_ns (int64), is_gpu (bool), stream, correlation,
    external_id (int64, -1 absent), thread_name (str, "" unknown), and argument columns
    coll_name, dtype, pg (str or None), in_nelems, out_nelems, group_size, shape_numel,
    shape_elem_bytes (int64, -1 unknown), pg_ranks (str or None).
    """

    events: pd.DataFrame
    distributed_info: dict[str, Any] | None
    device_count: int
    warnings: list[str] = field(default_factory=list)


def read_bytes(path: Path) -> bytes:
    """Read a ``.json`` or ``.json.gz`` trace. Raises ``BadInput`` (reason ``truncated``)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInput(path, "unreadable", f"cannot read the file ({exc.strerror})",
                       "check the path and its permissions") from None
    return decompress(raw, path)


def decompress(raw: bytes, path: Path | str) -> bytes:
    """Gunzip ``raw`` when it is gzip, else return it. Raises ``BadInput`` (``truncated``)."""
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
            raise BadInput(path, "truncated", f"truncated or corrupt gzip ({exc})",
                           "copy the trace again or re-record it") from None
    return raw


def decode_file(path: Path) -> Decoded:
    """Decode the trace at ``path``. Raises ``BadInput`` for truncated / non-trace files."""
    return decode_bytes(read_bytes(path), path)


def decode_bytes(data: bytes, path: Path | str = "<bytes>") -> Decoded:
    """Decode trace JSON ``data`` (see ``Decoded``). ``path`` is only used in messages."""
    try:
        trace = _STRICT.decode(data)
    except msgspec.ValidationError:
        trace = None
    except msgspec.DecodeError as exc:
        if "UTF-8" not in str(exc):
            _refuse_not_json(data, path)
            raise BadInput(path, "truncated", f"truncated or invalid JSON ({exc})",
                           "copy the trace again or re-record it") from None
        # Names can carry bytes that are not UTF-8 (C++ symbols, paths): replace them with
        # U+FFFD and analyse the rest, saying so, rather than refusing the whole trace.
        data = data.decode("utf-8", errors="replace").encode("utf-8")
        return _with_warning(decode_bytes(data, path), f"{path}: invalid UTF-8 bytes in "
                             "strings were replaced by U+FFFD")
    if trace is None:
        try:
            trace = _LENIENT.decode(data)
        except msgspec.ValidationError as exc:
            raise BadInput(path, "not_a_trace",
                           f"not a Chrome/Kineto trace: no traceEvents list of objects ({exc})",
                           "pass PyTorch profiler traces (export_chrome_trace / "
                           "tensorboard_trace_handler output)") from None
        except msgspec.DecodeError as exc:  # the strict pass stopped at a type, before this
            raise BadInput(path, "truncated", f"truncated or invalid JSON ({exc})",
                           "copy the trace again or re-record it") from None
    return _columns(trace, path)


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


def _with_warning(dec: Decoded, line: str) -> Decoded:
    dec.warnings.insert(0, line)
    return dec


def parse_decimal_ns(raws: list[msgspec.Raw]) -> tuple[np.ndarray, np.ndarray]:
    """Exact conversion of JSON numbers in µs (raw text) to int64 ns, vectorised.

    Returns ``(values_ns, ok)``; ``ok`` is False for null/missing, strings, negatives and
    anything that is not a number (value 0 there). Rounds half up on the 4th decimal. Works
    column by column over the tokens' characters (Horner's rule), so the cost is
    O(tokens x longest token) numpy operations on short arrays.
    """
    n = len(raws)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, bool)
    blob = b"\x00".join(raws) + b"\x00"
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


_MAX_TOKEN = 32
_MAX_US = (2**63 - 1) // 1000 - 1
_POW10 = np.array([1, 10, 100, 1000], np.int64)


def _categorical(values: list[str]) -> pd.Categorical:
    """Categorical from a list of str, coded with a dict (much faster than hashing through
    pandas' string arrays for few distinct values and many rows)."""
    codes_of: dict[str, int] = {}
    codes = np.fromiter((codes_of.setdefault(v, len(codes_of)) for v in values), np.int32,
                        count=len(values))
    return pd.Categorical.from_codes(codes, categories=pd.Index(list(codes_of), dtype="str"))


def _take(c: pd.Categorical, codes: np.ndarray) -> pd.Categorical:
    """Categorical of ``c``'s values at positions ``codes``, with only the categories used, in
    order of first use (as ``_categorical`` of the expanded list would give)."""
    row = c.codes[codes]
    used, first = np.unique(row, return_index=True)
    used = used[np.argsort(first)]
    remap = np.full(len(c.categories), -1, np.int32)
    remap[used] = np.arange(len(used), dtype=np.int32)
    return pd.Categorical.from_codes(remap[row], categories=c.categories[used])


_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


def _as_int(v: Any) -> int:
    """``v`` when it is an int that fits int64, else -1 (unknown)."""
    return v if type(v) is int and _I64_MIN <= v <= _I64_MAX else -1


def _as_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if type(v) is str else str(v)


def _shape(dims_raw: msgspec.Raw, type_raw: msgspec.Raw) -> tuple[int, int]:
    """(numel of the first tensor input, its element size), -1 when unknown."""
    try:
        dims = msgspec.json.decode(dims_raw)
        types = msgspec.json.decode(type_raw)
    except msgspec.DecodeError:
        return -1, -1
    if not isinstance(dims, list) or not dims:
        return -1, -1
    first = dims[0]
    if not isinstance(first, list) or not first or not all(type(d) is int for d in first):
        return -1, -1
    numel = 1
    for d in first:
        numel *= d
    if numel < 0 or numel > _I64_MAX:
        return -1, -1
    size = dtype_bytes(types[0]) if isinstance(types, list) and types else -1
    return numel, size


def _columns(trace: _Trace | _LTrace, path: Path | str) -> Decoded:
    evs = trace.traceEvents
    warnings: list[str] = []
    # thread names from metadata events (last one wins, as trace viewers do)
    thread_names: dict[tuple[str, str], str] = {}
    for e in evs:
        if e.ph == "M" and e.name == "thread_name" and e.args is not None:
            thread_names[(str(e.pid), str(e.tid))] = _as_str(e.args.meta_name) or ""
    xs = [e for e in evs if e.ph == "X"]
    ts, ts_ok = parse_decimal_ns([e.ts for e in xs])
    dur, dur_ok = parse_decimal_ns([e.dur for e in xs])
    ok = ts_ok & dur_ok
    n_bad_ts = int((~ts_ok).sum())
    n_bad_dur = int((ts_ok & ~dur_ok).sum())
    if n_bad_ts:
        warnings.append(f"{path}: skipped {n_bad_ts} complete events with a missing, negative or "
                        "non-numeric ts")
    if n_bad_dur:
        warnings.append(f"{path}: skipped {n_bad_dur} complete events with a missing, negative "
                        "or non-numeric dur")
    if not ok.all():
        keep = np.flatnonzero(ok)
        xs = [xs[i] for i in keep]
        ts, dur = ts[keep], dur[keep]

    strict = isinstance(trace, _Trace)
    # (name, cat) coded in one pass; name and cat columns come from the distinct pairs
    nc_of: dict[tuple[str, str], int] = {}
    if strict:  # typed: name/cat are str, ids int or None
        gen_nc = (nc_of.setdefault((e.name, e.cat), len(nc_of)) for e in xs)
    else:
        gen_nc = (nc_of.setdefault((_as_str(e.name) or "", _as_str(e.cat) or ""), len(nc_of))
                  for e in xs)
    nc_codes = np.fromiter(gen_nc, np.int32, count=len(xs))
    # (pid, tid) coded in one pass; pid, tid and thread_name columns come from the pairs
    pair_of: dict[Any, int] = {}
    if strict:  # int | str: hashable, and str() of each distinct pair only
        gen = (pair_of.setdefault((e.pid, e.tid), len(pair_of)) for e in xs)
    else:
        gen = (pair_of.setdefault((str(e.pid), str(e.tid)), len(pair_of)) for e in xs)
    pair_codes = np.fromiter(gen, np.int32, count=len(xs))
    u_pid = [str(p) for p, _ in pair_of]
    u_tid = [str(t) for _, t in pair_of]
    u_tn = [thread_names.get(pt, "") for pt in zip(u_pid, u_tid)]
    no_args = _Args()
    args = [e.args if e.args is not None else no_args for e in xs]
    ext = corr = None
    if strict:
        try:
            ext = np.array([a.external_id if a.external_id is not None else
                            (a.external_id_lc if a.external_id_lc is not None else -1)
                            for a in args], dtype=np.int64)
            corr = np.array([-1 if a.correlation is None else a.correlation for a in args],
                            dtype=np.int64)
        except OverflowError:  # ids beyond int64 (msgspec's int takes up to uint64)
            ext = corr = None
    if ext is None or corr is None:
        ext = np.array([_as_int(a.external_id) if a.external_id is not None
                        else _as_int(a.external_id_lc) for a in args], dtype=np.int64)
        corr = np.array([_as_int(a.correlation) for a in args], dtype=np.int64)
    stream_raw = [a.stream for a in args]

    cat_c = _take(_categorical([c for _, c in nc_of]), nc_codes)
    gpu_cat = np.array([str(x).lower() in GPU_CATS for x in cat_c.categories], dtype=bool)
    is_gpu = gpu_cat[cat_c.codes] if len(cat_c.categories) else np.zeros(len(xs), bool)
    stream = np.full(len(xs), -1, np.int64)
    for i in np.flatnonzero(is_gpu):
        s = stream_raw[i]
        if type(s) is int:
            stream[i] = _as_int(s)
        else:
            t = u_tid[pair_codes[i]].removeprefix("stream").strip()
            stream[i] = int(t) if t.isascii() and t.isdigit() and len(t) < 19 else -1

    # collective arguments: only comm-related rows carry them; parse shapes for those only
    name_c = _take(_categorical([nm for nm, _ in nc_of]), nc_codes)
    comm_name = np.array([str(x).startswith(_COMM_PREFIXES) for x in name_c.categories], bool)
    is_comm_name = comm_name[name_c.codes] if len(name_c.categories) else np.zeros(len(xs), bool)
    carries = is_comm_name | np.array([a.coll_name is not None for a in args], bool)
    n = len(xs)
    coll_name = np.full(n, None, object)
    dtype = np.full(n, None, object)
    pg = np.full(n, None, object)
    pg_ranks = np.full(n, None, object)
    in_nelems = np.full(n, -1, np.int64)
    out_nelems = np.full(n, -1, np.int64)
    group_size = np.full(n, -1, np.int64)
    shape_numel = np.full(n, -1, np.int64)
    shape_bytes = np.full(n, -1, np.int64)
    for i in np.flatnonzero(carries):
        a = args[i]
        coll_name[i] = _as_str(a.coll_name)
        dtype[i] = _as_str(a.dtype)
        pg[i] = _as_str(a.pg_name) if a.pg_name is not None else _as_str(a.pg_id)
        if a.pg_ranks is not _NULL:
            r = msgspec.json.decode(a.pg_ranks)
            pg_ranks[i] = None if r is None else r if isinstance(r, str) else json.dumps(r)
        in_nelems[i] = _as_int(a.in_nelems)
        out_nelems[i] = _as_int(a.out_nelems)
        group_size[i] = _as_int(a.group_size)
        if a.input_dims is not _NULL:
            shape_numel[i], shape_bytes[i] = _shape(a.input_dims, a.input_type)

    df = pd.DataFrame({
        "name": name_c,
        "cat": cat_c,
        "pid": _take(_categorical(u_pid), pair_codes),
        "tid": _take(_categorical(u_tid), pair_codes),
        "ts_ns": ts,
        "dur_ns": dur,
        "end_ns": ts + dur,
        "is_gpu": is_gpu,
        "stream": stream,
        "correlation": corr,
        "external_id": ext,
        "thread_name": _take(_categorical(u_tn), pair_codes),
        "coll_name": coll_name,
        "dtype": dtype,
        "pg": pg,
        "pg_ranks": pg_ranks,
        "in_nelems": in_nelems,
        "out_nelems": out_nelems,
        "group_size": group_size,
        "shape_numel": shape_numel,
        "shape_elem_bytes": shape_bytes,
    })
    di = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else None
    dp = trace.deviceProperties
    return Decoded(events=df, distributed_info=di,
                   device_count=len(dp) if isinstance(dp, list) else 0, warnings=warnings)
