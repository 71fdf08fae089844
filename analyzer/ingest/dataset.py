"""``--tables-out DIR``: the per-rank tables as a hive-partitioned Parquet dataset.

Layout (one sub-dataset per table; partition values in the folder names, not in the files)::

    DIR/paritytrace-tables.json                 written last: its presence means complete
    DIR/<table>/run=<run>/rank=<rank>/part-0.parquet

``<table>`` is one of:

* ``breakdown``   one row per rank and step (``schemas.BREAKDOWN_SCHEMA``): step_ns =
  compute_ns + exposed_comm_ns + data_wait_ns + other_ns + idle_ns exactly;
* ``collectives`` one row per collective instance (``schemas.COLLECTIVES_SCHEMA``), group_size
  after the world-size fallback (analyzer/ingest/commid.py);
* ``prefetch``    one row per FSDP unit all_gather (``schemas.PREFETCH_SCHEMA``);
* ``steps``       one row per ProfilerStep window (``schemas.STEP_WINDOWS_SCHEMA``);
* ``timeline``    the merged compute / per-kind comm intervals of the rank's first step
  (``schemas.TIMELINE_SCHEMA``; the step is ``ranks.timeline_step``);
* ``device_memory`` one row per device of the rank's ``[memory]`` profiler events
  (``schemas.DEVICE_MEMORY_SCHEMA``: peak allocated / reserved bytes);
* ``ranks``       one row per rank (``RANKS_SCHEMA``): the trace, how its rank was found, the
  world size, the device kind, the whole-trace overlap, the decoder's and step rules' notes.

Every time is int64 nanoseconds on the rank's trace clock; names are dictionary strings;
``_frac`` columns are 0..1. The ``rank`` column of the tables above is the ``rank=`` partition
(not stored in the files), ``run`` the run's name (``run=``, percent-encoded as pyarrow's
hive partitioning writes it: a name of letters, digits, ``-_.`` is unchanged). A rank with no
row in a table has no file there, but a table with no row at all in a run (``prefetch``
without FSDP) keeps one empty file, under the run's lowest rank, so that a glob always finds
its schema. Read it with, e.g.::

    duckdb -c "SELECT run, rank, avg(exposed_comm_ns) FROM
               read_parquet('DIR/breakdown/**/*.parquet', hive_partitioning=true) GROUP BY ALL"
    pyarrow.dataset.dataset("DIR/breakdown", partitioning="hive")
    polars.scan_parquet("DIR/breakdown/**/*.parquet", hive_partitioning=True)

Writing is atomic for the whole folder: the dataset is written into a hidden sibling folder
(``.tmp-<random>-<name>``) while the analysis runs; when the analysis ends it replaces ``DIR``
(two renames: ``DIR`` is away for an instant, never half-written); on an error it is removed.
A staging folder left by a run killed beyond any clean-up (SIGKILL) is removed by the next
``--tables-out`` to the same ``DIR`` once its owner is provably dead (``sweep``).
``DIR`` may be new, an empty folder, or a dataset this tool wrote (``paritytrace-tables.json``
and nothing but its table folders); anything else is refused (``unwritable``), as are a symlink
and a folder inside the input.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from analyzer.contract import owner
from analyzer.contract.errors import BadInput, Reason
from analyzer.ingest.fswalk import DATASET_MARKER as MARKER

FORMAT = "paritytrace-tables"
VERSION = 1
TABLES = ("breakdown", "collectives", "prefetch", "steps", "timeline", "device_memory", "ranks")
MAX_OPEN_FILES = 64
"""Files the dataset writer keeps open at once. Rows come sorted by rank, so each rank's file
is written whole and closed; 1,024 open Parquet writers held ~80 MB more at 4,096 ranks
(bench/RESULTS.md, issue 46)."""
_PER_RANK = ("steps", "timeline", "device_memory")  # RankTables' own, without a rank column
_OPEN: list["_Writer"] = []  # the innermost open ``writing()``


def ranks_schema():
    """The ``ranks`` table: one row per rank (module docstring)."""
    import pyarrow as pa

    return pa.schema([
        ("trace", pa.string()), ("sha256", pa.string()), ("rank_source", pa.string()),
        ("world_size", pa.int64()), ("device_kind", pa.string()),
        ("whole_trace_mode", pa.bool_()), ("empty", pa.bool_()), ("timeline_step", pa.int64()),
        ("whole_overlap_ns", pa.int64()), ("whole_comm_ns", pa.int64()),
        ("first_ns", pa.int64()), ("warnings", pa.list_(pa.string()))])


def partitioning():
    """The hive partitioning of every table (run string, rank int64), for
    ``pyarrow.dataset.dataset(DIR / table, partitioning=partitioning())``."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    return ds.partitioning(pa.schema([("run", pa.string()), ("rank", pa.int64())]),
                           flavor="hive")


def check_target(out: Path, inputs: Path) -> None:
    """Refuse ``out`` as ``--tables-out`` before any analysis (module docstring; the caller
    checks first that its nearest existing folder is writable). Raises ``BadInput``."""
    if out.is_symlink():
        raise BadInput(out, Reason.UNWRITABLE, "is a symlink; --tables-out is never written "
                       "through one", "pass the folder itself")
    real_in, real_out = os.path.realpath(inputs), os.path.realpath(out)
    if os.path.commonpath([real_in, real_out]) == real_in:
        raise BadInput(out, Reason.UNWRITABLE, f"is inside the input {inputs}; the dataset would "
                       "be read back as input", "pass --tables-out a folder outside the input")
    if out.is_dir() and not _ours(out):
        raise BadInput(out, Reason.UNWRITABLE, f"holds files the analyzer did not write (no "
                       f"{MARKER}, or files it does not list); --tables-out replaces only "
                       "a dataset it wrote", "pass --tables-out a new or empty folder")


def _ours(out: Path) -> bool:
    """True for an empty folder or a dataset this module wrote: its marker lists every file it
    wrote, and the folder holds those files and nothing else (no other file, however deep, and
    no symlink), so replacing it deletes nothing a user put there."""
    names = set(os.listdir(out))
    if not names:
        return True
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not (isinstance(marker, dict) and marker.get("format") == FORMAT
            and isinstance(marker.get("files"), list)):
        return False
    listed = {str(f) for f in marker["files"]} | {MARKER}
    for folder, dirs, files in os.walk(out):
        here = Path(folder)
        if any((here / d).is_symlink() for d in dirs):
            return False
        for f in files:
            if (here / f).is_symlink() or (here / f).relative_to(out).as_posix() not in listed:
                return False
    return True


def _written(stage: Path) -> list[str]:
    """Every file under ``stage``, as posix paths relative to it (the marker's ``files``)."""
    return sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())


NAME_MAX = 255
"""The longest file name (bytes) of the file systems the dataset is written to (ext4, xfs,
btrfs, NTFS, APFS: 255)."""


def partition_name(run_name: str) -> str:
    """``run=<run_name percent-encoded>`` (pyarrow's hive form), within ``NAME_MAX`` bytes: a
    longer one (28 CJK characters are 252 bytes encoded) keeps the longest prefix of whole
    characters that fits and ends in ``~`` and 12 hex digits of the name's BLAKE2b, so that two
    long names that share a prefix stay two partitions; ``paritytrace-tables.json`` maps each
    partition to the full run name."""
    import hashlib

    part = f"run={quote(run_name, safe='')}"
    if len(part.encode()) <= NAME_MAX:
        return part
    tag = "~" + hashlib.blake2b(run_name.encode("utf-8", "surrogatepass"),
                                digest_size=6).hexdigest()
    keep = ""
    for ch in run_name:
        if len(f"run={quote(keep + ch, safe='')}{tag}".encode()) > NAME_MAX:
            break
        keep += ch
    return f"run={quote(keep, safe='')}{tag}"


class _Writer:
    def __init__(self, stage: Path) -> None:
        self.stage = stage
        self.runs: list[dict] = []

    def add(self, run_name: str, job) -> None:
        """Write the tables of one job (``pipeline.JobTables``) under ``run=<run_name>``: each
        table converted to Arrow once and split by rank by ``pyarrow.dataset.write_dataset``
        (C++: no per-file Python work, which cost ~10 ms a rank)."""
        import numpy as np
        import pandas as pd
        import pyarrow as pa

        from analyzer.contract import schemas
        from analyzer.ingest.spill import SPILLED

        part = partition_name(run_name)
        if any(r["partition"] == part for r in self.runs):
            raise BadInput(job.root, Reason.DUPLICATE_RUN, f"a second run named {run_name!r}",
                           "rename one of the runs")
        tables = {"breakdown": pa.Table.from_pandas(job.breakdown, preserve_index=False)}
        for name in _PER_RANK:  # per rank, without a rank column: add it (Arrow: no frame a rank)
            parts = [(r.rank, t) for r in job.ranks if (t := r.table(name)).num_rows]
            tables[name] = pa.concat_tables(
                [t.append_column("rank", pa.array(np.full(t.num_rows, rank, np.int64)))
                 for rank, t in parts], promote_options="permissive") if parts else None
        # a plain JSON trace's SHA-256 is not computed by its parse (docs/caches.md): here
        rows = [{"rank": r.rank, "trace": str(r.path),
                 "sha256": r.sha256 or schemas.sha256_file(r.path),
                 "rank_source": r.rank_source, "world_size": job.world_size,
                 "device_kind": r.device_kind, "whole_trace_mode": r.whole_trace_mode,
                 "empty": r.empty, "timeline_step": r.timeline_step,
                 "whole_overlap_ns": r.whole_overlap_ns, "whole_comm_ns": r.whole_comm_ns,
                 "first_ns": r.first_ns, "warnings": list(r.warnings)} for r in job.ranks]
        lowest = min((r.rank for r in job.ranks), default=0)
        for name in TABLES:
            schema = ranks_schema() if name == "ranks" else schemas.TABLE_SCHEMAS[name]
            fields = [f for f in schema if f.name != "rank"] + [pa.field("rank", pa.int64())]
            target = pa.schema(fields)

            def arrow(df: pd.DataFrame | pa.Table):
                if not isinstance(df, pa.Table):
                    df = pa.Table.from_pandas(df, preserve_index=False)
                return df.select([f.name for f in fields]).cast(target)

            wrote = False
            if name == "ranks":
                _write_ranks(pa.Table.from_pylist(rows, schema=target), self.stage / name / part,
                             len(job.ranks))
                wrote = True
            elif name in SPILLED:  # read and written a batch of ranks at a time
                for held, df in job.batches(name):
                    if len(df):
                        _write_ranks(arrow(df), self.stage / name / part, len(held))
                        wrote = True
            elif tables[name] is not None and tables[name].num_rows:
                _write_ranks(arrow(tables[name]), self.stage / name / part, len(job.ranks))
                wrote = True
            if not wrote:  # no row in this run: one empty file keeps the table's schema readable
                empty = target.remove(len(fields) - 1).empty_table()
                _write_file(empty, self.stage / name / part / f"rank={lowest}" / "part-0.parquet")
        self.runs.append({"run": run_name, "partition": part, "root": str(job.root),
                          "ranks": [r.rank for r in job.ranks], "world_size": job.world_size})


def _write_ranks(table, folder: Path, n_ranks: int) -> None:
    """``table`` (with a ``rank`` column) as ``folder/rank=<r>/part-0.parquet``, rows in order;
    ``folder`` may hold other ranks' partitions already (an earlier batch of ranks)."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    ds.write_dataset(table, folder, format="parquet", basename_template="part-{i}.parquet",
                     partitioning=ds.partitioning(pa.schema([("rank", pa.int64())]),
                                                  flavor="hive"),
                     file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
                     use_threads=False, max_partitions=max(n_ranks, 1) + 1,
                     max_open_files=MAX_OPEN_FILES, existing_data_behavior="overwrite_or_ignore")


def _write_file(table, path: Path) -> None:
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd")


def offer(run_name: str, job) -> None:
    """Called by the ingest with each job it loaded (``pipeline.load_run``): written to the
    innermost open ``writing()`` dataset, if any."""
    if _OPEN:
        _OPEN[-1].add(run_name, job)


@contextlib.contextmanager
def writing(out: Path) -> Iterator[None]:
    """While the block runs, every job loaded goes to a staging folder beside ``out``; when it
    ends normally the staging folder replaces ``out`` (module docstring). ``check_target``
    first. Raises ``BadInput`` (``unwritable``) when the folder cannot be written."""
    from analyzer.contract.atomic import write_atomic

    out = Path(os.path.abspath(out))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep(out)
        stage = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-", suffix=f"-{out.name}"))
        owner.write_owner(stage)  # first: a SIGKILL from here on leaves a folder a later run sweeps
    except OSError as exc:
        raise BadInput(out, Reason.UNWRITABLE, f"cannot be written ({exc.strerror})",
                       "pass --tables-out to a writable folder") from None
    writer = _Writer(stage)
    _OPEN.append(writer)
    try:
        yield
        _OPEN.remove(writer)
        os.chmod(stage, 0o777 & ~_umask())
        (stage / owner.OWNER_NAME).unlink()  # not part of the dataset
        write_atomic(stage / MARKER, json.dumps(
            {"format": FORMAT, "version": VERSION, "tables": list(TABLES),
             "partitioning": ["run", "rank"], "runs": writer.runs,
             "files": _written(stage)}, indent=1) + "\n")
        _swap(stage, out)
    except OSError as exc:
        raise BadInput(out, Reason.UNWRITABLE, f"cannot be written ({exc.strerror})",
                       "pass --tables-out to a writable folder") from None
    finally:
        if writer in _OPEN:
            _OPEN.remove(writer)
        shutil.rmtree(stage, ignore_errors=True)


def sweep(out: Path) -> list[Path]:
    """Remove the staging folders (``.tmp-*-<out's name>`` beside ``out``) that runs killed
    beyond any clean-up (SIGKILL) left, when provably theirs (analyzer/contract/owner.py
    ``sweep``): they hold nothing but dataset files (Parquet, the marker; a replaced dataset
    moved aside). Returns the folders removed."""
    suffix = f"-{out.name}"

    def staged(rel: str) -> bool:
        if rel.endswith("/"):  # a table's folder (or the dataset moved aside) on top, any below
            return "/" in rel[:-1] or rel[:-1] in (*TABLES, out.name)
        f = rel.rsplit("/", 1)[-1]
        return f.endswith(".parquet") or f == MARKER or (f.startswith(".tmp-") and f.endswith(MARKER))
    return owner.sweep(out.parent, lambda n: n.startswith(".tmp-") and n.endswith(suffix), staged)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _swap(stage: Path, out: Path) -> None:
    """Put ``stage`` at ``out``: rename over a missing or empty ``out``; else move the old
    dataset aside, rename, remove the old one (checked ours again just before)."""
    try:
        os.rename(stage, out)
        return
    except OSError:
        if not out.is_dir():
            raise
    if not _ours(out):  # changed since check_target
        raise OSError(39, "holds files the analyzer did not write", str(out))
    old = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-old-", suffix=f"-{out.name}"))
    owner.write_owner(old)
    os.rename(out, old / out.name)
    try:
        os.rename(stage, out)
    except OSError:
        os.rename(old / out.name, out)  # put the old dataset back
        raise
    finally:
        shutil.rmtree(old, ignore_errors=True)
