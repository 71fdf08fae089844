"""A ``dask worker --preload`` for tests/analyzer/test_dask_trust.py: a worker that misbehaves
as ``$PARITYTRACE_TEST_WORKER`` says, once it has run our task honestly.

Whatever serializers the requester asks for, the worker picks its own:

* ``dask-type``: each bytes result goes out in the "dask" family with a crafted pickle as its
  ``type-serialized`` header (distributed's client unpickles it to find the type);
* ``pickle``: each bytes result goes out as a crafted pickle ("pickle" family);
* ``schema``: the per-rank tables are valid msgpack whose ``steps`` table breaks its schema;
* ``block``: ``get_data`` (the scheduler fetching a finished result) touches
  ``$PARITYTRACE_TEST_MARKER.fetching`` and never answers.

The crafted pickle creates ``$PARITYTRACE_TEST_MARKER`` where it is unpickled: the file
existing means a peer's code ran there.
"""

from __future__ import annotations

import asyncio
import os
import pickle

MODE = os.environ["PARITYTRACE_TEST_WORKER"]
MARKER = os.environ["PARITYTRACE_TEST_MARKER"]


class Crafted:
    def __reduce__(self):
        return (open, (MARKER, "w"))  # unpickling it creates the marker file


def _ours(x) -> bool:
    """A result of our task or listing: daskwire.encode's tagged msgpack (or, before it, the
    object)."""
    return isinstance(x, bytes) and b"type" in x[:16] or type(x).__name__ == "RankTables" \
        or isinstance(x, dict) and {"traces", "missing", "error"} & set(x)  # hostlocal's


import distributed.protocol.core as _core  # noqa: E402

FIRST = not getattr(_core, "_paritytrace_crafted", False)  # dask imports a preload twice
_core._paritytrace_crafted = True

if FIRST and MODE in ("dask-type", "pickle"):
    from distributed.protocol.serialize import families, register_serialization_family

    honest = {name: families[name] for name in ("dask", "pickle")}

    def crafted_dask(x, context=None):
        if not _ours(x):
            return honest["dask"][0](x, context=context)
        if MODE == "pickle":
            raise NotImplementedError  # distributed tries the next family: pickle
        return {"type": "bytes", "sub-header": {},
                "type-serialized": pickle.dumps(Crafted())}, [x]

    def crafted_pickle(x, context=None):
        if not _ours(x):
            return honest["pickle"][0](x, context=context)
        return {"writeable": ()}, [pickle.dumps(Crafted())]

    register_serialization_family("dask", crafted_dask, honest["dask"][1])
    register_serialization_family("pickle", crafted_pickle, honest["pickle"][1])

    from distributed.protocol import core

    asked = core.serialize_and_split

    def own_choice(x, serializers=None, *args, **kwargs):  # whatever the requester asked for
        return asked(x, ("dask", "pickle"), *args, **kwargs)

    core.serialize_and_split = own_choice

if FIRST and MODE == "schema":
    import msgspec
    import pyarrow as pa

    from analyzer.ingest import daskwire

    honest_encode = daskwire.encode

    def off_schema(result):
        blob = msgspec.msgpack.decode(honest_encode(result))
        if blob.get("type") == "tables":
            sink = pa.BufferOutputStream()
            table = pa.table({"step": pa.array(["not", "int64"])})
            with pa.ipc.new_stream(sink, table.schema) as w:
                w.write_table(table)
            blob["tables"]["steps"] = sink.getvalue().to_pybytes()
        return msgspec.msgpack.encode(blob)

    daskwire.encode = off_schema


def dask_setup(worker) -> None:
    if MODE != "block":
        return

    async def get_data(*args, **kwargs):
        open(MARKER + ".fetching", "w").close()
        await asyncio.Event().wait()  # until the process is killed

    worker.handlers["get_data"] = get_data
