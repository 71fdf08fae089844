"""Python rows -> an Arrow table of an exact schema, assembled from Arrow buffers with NumPy.

Why not ``pa.array``: on any Python list (or NumPy array) it first asks whether the input is a
pandas object, which imports pandas: about 0.3 s of CPU per process with torch loaded (pyarrow
26, pandas 3.1). The tracer never needs pandas, and ``tracer record --strategy all`` starts nine
processes that each write a table. Every column here is built with ``pa.Array.from_buffers``
from a validity bitmap (LSB-first, 1 = valid), int32 offsets and a values buffer, the layouts of
the Arrow columnar format specification (https://arrow.apache.org/docs/format/Columnar.html),
for the types the run-dir schemas use: int32, int64, float64, bool, string, list<int64> and
dictionary<int32, string>. The result equals ``pa.Table.from_pydict`` of the same rows (tested).
"""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
import pyarrow as pa

_NUMERIC = {pa.int32(): np.int32, pa.int64(): np.int64, pa.float64(): np.float64}


def rows_to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts keyed by the schema's field names) -> a table of exactly ``schema``.

    Raises ``KeyError`` for a missing field, ``TypeError`` naming the field for a value of the
    wrong kind or a type outside the supported ones, ``OverflowError`` for an integer that does
    not fit.
    """
    columns = []
    for field in schema:
        try:
            columns.append(column([r[field.name] for r in rows], field.type))
        except TypeError as exc:
            raise TypeError(f"field {field.name!r}: {exc}") from None
    return pa.Table.from_arrays(columns, schema=schema)


def column(values: list[Any], type_: pa.DataType) -> pa.Array:
    """One Arrow array of ``type_`` from Python values (None = null)."""
    n = len(values)
    if pa.types.is_dictionary(type_):
        if type_.index_type != pa.int32():
            raise TypeError(f"dictionary index type {type_.index_type} is not supported")
        codes: dict[Any, int] = {}  # first-appearance order, as pyarrow's dictionary builder
        indices = [None if v is None else codes.setdefault(v, len(codes)) for v in values]
        return pa.DictionaryArray.from_arrays(column(indices, pa.int32()), column(list(codes), type_.value_type))
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    null_count = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    if type_ == pa.string():
        encoded = [b"" if v is None else _text(v).encode("utf-8") for v in values]
        return pa.Array.from_buffers(type_, n, [bitmap, _offsets(len(b) for b in encoded), pa.py_buffer(b"".join(encoded))],
                                     null_count=null_count)
    if pa.types.is_list(type_):
        lists = [[] if v is None else list(v) for v in values]
        child = column([x for items in lists for x in items], type_.value_type)
        return pa.Array.from_buffers(type_, n, [bitmap, _offsets(len(items) for items in lists)],
                                     null_count=null_count, children=[child])
    if type_ == pa.bool_():
        bits = np.fromiter((_flag(v) for v in values), dtype=bool, count=n)
        return pa.Array.from_buffers(type_, n, [bitmap, pa.py_buffer(np.packbits(bits, bitorder="little"))],
                                     null_count=null_count)
    if type_ in _NUMERIC:
        check = _float if type_ == pa.float64() else _integer
        data = np.array([0 if v is None else check(v) for v in values], dtype=_NUMERIC[type_])
        return pa.Array.from_buffers(type_, n, [bitmap, pa.py_buffer(data)], null_count=null_count)
    raise TypeError(f"Arrow type {type_} is not supported")


def _offsets(lengths) -> pa.Buffer:
    lengths = np.fromiter(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    if ends.size and ends[-1] > np.iinfo(np.int32).max:
        raise OverflowError("more than 2**31 - 1 bytes or items in one column")
    return pa.py_buffer(np.concatenate([[0], ends]).astype(np.int32))


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"expected str, got {type(v).__name__}")
    return v


def _flag(v: Any) -> bool:
    if v is None:
        return False
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"expected bool, got {type(v).__name__}")
    return bool(v)


def _integer(v: Any) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, Integral):
        raise TypeError(f"expected an integer, got {type(v).__name__}")
    return int(v)


def _float(v: Any) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, Real):
        raise TypeError(f"expected a number, got {type(v).__name__}")
    return float(v)
