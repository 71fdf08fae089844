"""A job's per-rank collectives and prefetch tables on disk once they pass a memory budget.

Why: the cross-rank phase (analyzer/analyses/crossrank.py) reads these two tables a batch of
ranks at a time, so the process holds one batch's rows plus aggregates per collective
instance and per rank, never every rank's rows at once. They are the two tables that grow with a rank's events
(tens of thousands of collectives, FSDP units x steps); the others (step windows, breakdown,
one step's timeline, device memory) have a row per step or per device and stay in memory.

Rule: the tables of a job stay in memory while their sum is under
``PARITYTRACE_TABLES_MEMORY`` (analyzer/contract/settings.py; 0 puts every rank on disk).
Past it each arriving rank's two tables are
written as Arrow IPC files (strings dictionary-encoded) into a private
temporary folder (``tempfile.mkdtemp``: mode 0700, under ``$TMPDIR``) and read back,
memory-mapped and only the columns asked for, by ``read``. The folder is removed when its
``Spill`` is garbage-collected, when its job is refused (``Spill.close``), and by
``remove_all`` before the CLI's ``os._exit`` (a stop signal included); it holds only what
this process wrote, and an owner file (analyzer/contract/owner.py): a folder left by a process
killed beyond any clean-up (SIGKILL) is removed by the next spill of this user (``sweep``)
once that process is provably dead.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import weakref
from pathlib import Path

from typing import TYPE_CHECKING

from analyzer.contract import owner, settings
from analyzer.contract.errors import BadInput, Reason

if TYPE_CHECKING:  # pandas / pyarrow load on use: a Spill stays cheap for a cached report
    import pandas as pd
    import pyarrow as pa

SPILLED = ("collectives", "prefetch")
"""The tables that go to disk: the ones whose rows grow with a rank's events."""
PREFIX = "paritytrace-tables-"
"""Name prefix of the spill folders in ``$TMPDIR``."""
ENV = settings.TABLES_MEMORY.name  # named in the refusals: the budget to raise
_SPILLED_FILE = re.compile(r"[0-9]+\.(collectives|prefetch)\.arrow")


def frame_bytes(df: pd.DataFrame) -> int:
    """Bytes ``df`` holds: its arrays (pandas' Arrow-backed strings: their buffers), plus each
    distinct Python object of its object columns once (rows there often share one object per
    value, which pandas' deep count would add once per row)."""
    import numpy as np

    if not len(df):
        return 0
    total = 0
    for name, dtype in df.dtypes.items():
        if isinstance(dtype, np.dtype) and dtype != object:
            total += len(df) * dtype.itemsize  # no Series built (memory_usage builds one a column)
            continue
        values = df[name].array
        total += int(values.nbytes)
        if dtype == object:
            values = values.to_numpy()
            ids = np.fromiter(map(id, values), np.int64, len(values))
            _, first = np.unique(ids, return_index=True)
            total += sum(sys.getsizeof(values[i]) for i in first.tolist())
    return total


class Spill:
    """Where one job's spilled tables live (module docstring). ``keep(result)`` is the hook
    ``pool.run_all`` calls on each rank's answer as it arrives."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = settings.tables_memory_bytes() if budget is None else budget
        self.held_bytes = 0
        """Bytes of the spillable tables kept in memory so far."""
        self.folder: Path | None = None
        self._n = 0
        self._remover: weakref.finalize | None = None

    def keep(self, result):
        """``result`` (a ``ranktables.RankTables``; anything else passes through) with its
        collectives and prefetch tables moved to disk once the job's held bytes would pass the
        budget. Raises ``BadInput`` (``unwritable``) when the temporary folder cannot be
        written."""
        if not hasattr(result, "spilled") or result.spilled:
            return result
        from analyzer.ingest.tablecache import table_of

        size = sum(len(result.tables[t]) for t in SPILLED)
        if self.held_bytes + size <= self.budget:
            self.held_bytes += size
            return result
        folder = self._folder()
        self._n += 1
        for t in SPILLED:
            path = folder / f"{self._n}.{t}.arrow"
            _write(path, t, table_of(result.tables.pop(t)))
            result.spilled[t] = str(path)
        return result

    def _folder(self) -> Path:
        if self.folder is None:
            try:
                sweep()
                folder = Path(tempfile.mkdtemp(prefix=PREFIX))
                self._remover = weakref.finalize(self, shutil.rmtree, str(folder), True)
                _REMOVERS.append(self._remover)
                owner.write_owner(folder)  # first: a SIGKILL from here leaves one sweep() removes
            except OSError as exc:
                self.close()
                raise BadInput(tempfile.gettempdir(), Reason.UNWRITABLE,
                               f"cannot hold the per-rank tables on disk ({exc.strerror})",
                               f"free space there, point TMPDIR elsewhere, or raise {ENV}"
                               ) from None
            self.folder = folder
        return self.folder

    def close(self) -> None:
        """Remove the folder now (the job's tables on disk are gone: only on the way out)."""
        if self._remover is not None:
            self._remover()  # a finalize runs once: later calls and remove_all do nothing


_REMOVERS: list[weakref.finalize] = []
"""Every ``Spill`` folder's remover: run when its ``Spill`` is collected, at exit, or by
``remove_all`` (the CLI ends with ``os._exit``, which runs neither)."""


def remove_all() -> None:
    """Remove every folder this process spilled to that is still there."""
    while _REMOVERS:
        _REMOVERS.pop()()


def sweep() -> list[Path]:
    """Remove the spill folders in ``$TMPDIR`` that analyzers killed beyond any clean-up
    (SIGKILL) left, when provably theirs (analyzer/contract/owner.py ``sweep``): they hold only
    spilled tables (``<n>.collectives.arrow``, ``<n>.prefetch.arrow``). Returns the folders
    removed."""
    return owner.sweep(Path(tempfile.gettempdir()), lambda name: name.startswith(PREFIX),
                      lambda rel: _SPILLED_FILE.fullmatch(rel) is not None)


def _write(path: Path, name: str, table: pa.Table) -> None:
    """``table`` as an Arrow IPC file, string columns dictionary-encoded (a process group's
    member list, kB at thousands of ranks, is written once, not once per collective)."""
    import pyarrow as pa

    from analyzer.contract import schemas

    if why := schemas.table_mismatch(table, schemas.TABLE_SCHEMAS[name]):
        raise ValueError(f"table {name}: {why}")
    table = pa.table([c.dictionary_encode() if pa.types.is_string(c.type)
                      or pa.types.is_large_string(c.type) else c for c in table.columns],
                     schema=pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type))
                                       if pa.types.is_string(f.type)
                                       or pa.types.is_large_string(f.type) else f
                                       for f in table.schema], metadata=table.schema.metadata))
    try:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    except OSError as exc:
        raise BadInput(path.parent, Reason.UNWRITABLE,
                       f"cannot hold the per-rank tables on disk ({exc})",
                       f"free space there, point TMPDIR elsewhere, or raise {ENV}") from None


def read_table(path: str, columns: list[str] | None = None) -> pa.Table:
    """The table ``Spill.keep`` wrote at ``path``, only ``columns`` (None: all), as Arrow:
    string columns decoded back to strings, the table's pandas metadata kept."""
    import pyarrow as pa

    with pa.memory_map(path) as src:
        table = pa.ipc.open_file(src).read_all()
    if columns is not None:
        table = table.select(columns)
    return pa.table([c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                     for c in table.columns],
                    schema=pa.schema([pa.field(f.name, f.type.value_type)
                                      if pa.types.is_dictionary(f.type) else f
                                      for f in table.schema], metadata=table.schema.metadata))


def read(path: str, columns: list[str] | None = None) -> pd.DataFrame:
    """``read_table(path, columns)`` as pandas."""
    return read_table(path, columns).to_pandas()
