"""What the analyzer accepts from a Dask cluster (``--scheduler``): data, never code.

A Dask cluster has no authentication unless it is started with TLS client certificates, and
distributed's client unpickles what its peers send: ``__Pickled__`` sub-objects (``ToPickle``)
whatever ``Client(deserializers=...)`` says, the "dask" family's ``type-serialized`` header,
and raw bytes fields of its own messages (a task's exception and traceback, the type of a
result, ``warn`` events, ``Client.run`` errors). A worker chooses the serializer of what it
sends back, so a task returning plain bytes does not stop one from sending a crafted pickle.

The rule, inside ``guarded(loop)`` (analyzer/ingest/cluster.py runs its ``distributed.Client``
on that event loop's thread):

* every message the client's comms read on that thread (TCP, TLS, WebSocket) is decoded by
  ``loads`` here, not by distributed: msgpack, and of distributed's serialized sub-objects only
  the ``msgpack`` family and the ``dask`` family's bytes (built from the frames; its pickled
  type is never read). Anything else -- ``__Pickled__``, the ``pickle`` family, another
  ``dask`` type, a collection, an unknown compression -- becomes a ``Refused`` placeholder
  (an exception object, so a task error it stands for stays an error);
* ``pickle.loads`` called on that thread raises ``PickleRefused`` (a ``TypeError``, which
  distributed's ``clean_exception`` turns into a plain ``Exception`` holding the bytes);
* a task's result is msgpack bytes made on the worker by ``encode`` and checked by
  ``decode`` here: the per-rank tables as Arrow IPC streams, each validated against
  ``schemas.TABLE_SCHEMAS`` and fully (``Table.validate(full=True)``), the metadata by type
  (msgspec); a ``BadInput`` or a failure travels as data, never as a pickled exception.
  A result that breaks these raises ``Refused``, which cluster.py says in one line.

Other threads (an in-process scheduler or worker, as in the tests) are untouched.
"""

from __future__ import annotations

import contextlib
import pickle
import pickletools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from analyzer.contract.errors import BadInput
from analyzer.ingest.tablecache import RankMeta


class Refused(Exception):
    """Something a Dask peer sent that this client does not decode (module docstring)."""


class PickleRefused(TypeError):
    """``pickle.loads`` on the guarded client thread."""


_GUARDED: set[int] = set()
_LOCK = threading.Lock()
_SAVED: dict[str, Any] = {}
_BYTES_TYPES = ("bytes", "bytearray", "memoryview")


# --- the client's comms -------------------------------------------------------------------------

def loads(frames: list) -> Any:
    """distributed's ``protocol.loads`` without pickle (module docstring). Raises ``EOFError``
    for frames that are not msgpack (the comm then closes, as for a truncated stream)."""
    import msgpack
    from distributed.protocol.utils import msgpack_opts

    def sub(obj: dict) -> Any:
        if "__Pickled__" in obj:
            return Refused("a pickled object (distributed's ToPickle)")
        if "__Serialized__" in obj:
            offset = obj["__Serialized__"]
            if offset is True and "data" in obj:  # the nested form
                header, sub_frames = obj["data"]
                return _serialized(header, list(sub_frames))
            if type(offset) is not int or not 0 < offset < len(frames):
                return Refused("a malformed serialized object")
            header = msgpack.loads(frames[offset], use_list=False, **msgpack_opts)
            n = header.get("num-sub-frames", 0) if isinstance(header, dict) else 0
            return _serialized(header, list(frames[offset + 1:offset + 1 + n]))
        if "__Enum__" in obj:
            return _enum(obj)
        if "__Set__" in obj:
            return set(obj.get("as-list", ()))
        if isinstance(obj.get("traceback"), Refused):  # clean_exception wants one or None
            obj["traceback"] = None
        return obj

    try:
        return msgpack.loads(frames[0], object_hook=sub, use_list=False, **msgpack_opts)
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as exc:
        raise EOFError(f"not Dask's protocol: {exc}") from None


def _serialized(header: Any, frames: list) -> Any:
    """One serialized sub-object: msgpack or the dask family's bytes, else ``Refused``."""
    import msgpack
    from distributed.protocol.compression import decompress
    from distributed.protocol.utils import msgpack_opts

    if not isinstance(header, dict):
        return Refused("a malformed serialized object")
    name, typ = header.get("serializer"), header.get("type")
    if name not in ("msgpack", "dask") or name == "dask" and typ not in _BYTES_TYPES:
        return Refused(f"data serialised with {name!r}" + (f" as {typ!r}" if typ else ""))
    try:
        if header.get("compression"):
            frames = decompress(header, frames)
        if "split-num-sub-frames" in header:
            frames = [b"".join(bytes(f) for f in frames[o:o + n]) for n, o in
                      zip(header["split-num-sub-frames"], header["split-offsets"])]
        data = b"".join(bytes(f) for f in frames)
        return msgpack.loads(data, use_list=False, **msgpack_opts) if name == "msgpack" else data
    except Exception as exc:  # hostile input: whatever the decompressor or msgpack raises
        return Refused(f"a damaged serialized object ({type(exc).__name__})")


def _enum(obj: dict) -> Any:
    """distributed's own enums (a worker's Status), looked up, never imported or called."""
    import enum

    module = sys.modules.get(str(obj.get("__module__")))
    if module is None or not module.__name__.split(".")[0] == "distributed":
        return Refused("an enum of another module")
    typ = getattr(module, str(obj.get("__name__")), None)
    if isinstance(typ, type) and issubclass(typ, enum.Enum) and obj.get("name") in \
            typ.__members__:
        return typ.__members__[obj["name"]]
    return Refused("an unknown enum")


async def _from_frames(frames, deserialize=True, deserializers=None, allow_offload=True):
    if threading.get_ident() in _GUARDED:
        return loads(frames)
    return await _SAVED["from_frames"](frames, deserialize=deserialize,
                                       deserializers=deserializers, allow_offload=allow_offload)


def _pickle_loads(data, /, *args, **kwargs):
    if threading.get_ident() in _GUARDED:
        raise PickleRefused("this client unpickles nothing a Dask cluster sends "
                            f"(a pickle of {pickled_class(data) or 'something'})")
    return _SAVED["pickle.loads"](data, *args, **kwargs)


def _comm_modules() -> list[Any]:
    import distributed.comm.tcp
    mods = [distributed.comm.tcp]
    with contextlib.suppress(ImportError):
        import distributed.comm.ws
        mods.append(distributed.comm.ws)
    return mods


@contextlib.contextmanager
def guarded(loop) -> Iterator[None]:
    """Inside the block, what is read on ``loop``'s thread (a running tornado IOLoop) follows
    the module's rule."""
    from distributed.utils import sync

    async def ident() -> int:
        return threading.get_ident()

    tid = sync(loop, ident)
    with _LOCK:
        if not _GUARDED:
            from distributed.comm import utils

            _SAVED["from_frames"] = utils.from_frames
            _SAVED["pickle.loads"] = pickle.loads
            for m in _comm_modules():
                m.from_frames = _from_frames
            pickle.loads = _pickle_loads
        _GUARDED.add(tid)
    try:
        yield
    finally:
        with _LOCK:
            _GUARDED.discard(tid)
            if not _GUARDED:
                for m in _comm_modules():
                    if m.from_frames is _from_frames:
                        m.from_frames = _SAVED["from_frames"]
                if pickle.loads is _pickle_loads:
                    pickle.loads = _SAVED["pickle.loads"]


def pickled_class(data: Any) -> str | None:
    """The first global a pickle names (``module.name``), read with pickletools, which
    executes nothing; None when ``data`` is not a pickle."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return None
    strings: list[str] = []
    try:
        for op, arg, _ in pickletools.genops(bytes(data)):
            if op.name in ("GLOBAL", "INST"):
                return str(arg).replace(" ", ".")
            if op.name == "STACK_GLOBAL" and len(strings) >= 2:
                return f"{strings[-2]}.{strings[-1]}"
            if isinstance(arg, str):
                strings.append(arg)
    except Exception:  # not a pickle, or a damaged one
        return None
    return None


# --- task results -------------------------------------------------------------------------------

class _Tables(msgspec.Struct, tag="tables", forbid_unknown_fields=True):
    path: str
    sha256: str
    cache_hit: bool
    meta: RankMeta
    tables: dict[str, bytes]


class _BadInput(msgspec.Struct, tag="bad_input", forbid_unknown_fields=True):
    path: str
    reason: str
    message: str
    fix: str


class _Failed(msgspec.Struct, tag="failed", forbid_unknown_fields=True):
    error: str
    """One line: what the task raised (type and message), or why the worker refused it."""


class _Value(msgspec.Struct, tag="value", forbid_unknown_fields=True):
    value: Any
    """A msgpack value (the results of small helpers: ``str``)."""


_Result = _Tables | _BadInput | _Failed | _Value


def encode(result: Any) -> bytes:
    """On the worker: ``result`` (``RankTables``, ``BadInput``, a msgpack value, or
    ``failed(line)``) as msgpack bytes."""
    from analyzer.ingest.ranktables import RankTables
    from analyzer.ingest.tablecache import checked

    if isinstance(result, RankTables):
        from analyzer.contract import schemas

        out: Any = _Tables(path=str(result.path), sha256=result.sha256,
                           cache_hit=result.cache_hit,
                           meta=RankMeta(**{k: getattr(result, k)
                                            for k in RankMeta.__struct_fields__}),
                           tables={t: checked(t, result.tables[t])
                                   for t in schemas.TABLE_SCHEMAS})
    elif isinstance(result, BadInput):
        if result.problems:  # a folder's several problems: the first says where to look
            result = result.problems[0]
        out = _BadInput(path=result.path, reason=result.reason.value, message=result.message,
                        fix=result.fix)
    elif isinstance(result, _Failed):
        out = result
    else:
        out = _Value(value=result)
    return msgspec.msgpack.encode(out)


def failed(line: str) -> _Failed:
    """A failure on the worker, for ``encode``."""
    return _Failed(error=line)


def decode(data: Any) -> Any:
    """On the client: what ``encode`` made, checked. Returns a ``RankTables``, a ``BadInput``,
    a ``failed`` (``.error``) or the value. Raises ``Refused`` (one line) for anything else:
    not bytes, not msgpack of these shapes, a table off its schema or damaged."""
    import pyarrow as pa

    from analyzer.contract import schemas
    from analyzer.ingest.ranktables import RankTables

    if isinstance(data, Refused):
        raise data
    if not isinstance(data, (bytes, bytearray)):
        raise Refused(f"a {type(data).__name__}, not the bytes a paritytrace task returns")
    try:
        out = msgspec.msgpack.decode(data, type=_Result)
    except msgspec.DecodeError as exc:  # ValidationError included
        raise Refused(f"not a paritytrace result ({exc})") from None
    if isinstance(out, _Value):
        return out.value
    if isinstance(out, _Failed):
        return out
    if isinstance(out, _BadInput):
        try:  # the worker's error, with its reason code (BadInput refuses an unknown one)
            return BadInput(out.path, out.reason, out.message, out.fix)
        except ValueError:
            raise Refused(f"an unknown reason code {out.reason!r}") from None
    if set(out.tables) != set(schemas.TABLE_SCHEMAS):
        raise Refused(f"tables {sorted(out.tables)}, expected {sorted(schemas.TABLE_SCHEMAS)}")
    tables = {}
    for name, blob in out.tables.items():
        try:
            table = pa.ipc.open_stream(pa.py_buffer(blob)).read_all()
            table.validate(full=True)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise Refused(f"table {name}: not a valid Arrow IPC stream ({exc})") from None
        if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[name]):
            raise Refused(f"table {name}: {why}")
        tables[name] = blob
    meta = msgspec.structs.asdict(out.meta)
    return RankTables(path=Path(out.path), sha256=out.sha256, cache_hit=out.cache_hit, **meta,
                      tables=tables)
