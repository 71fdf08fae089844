"""tracer.arrow_rows against pyarrow's own conversion (``pa.array`` + ``Table.from_pydict``) as
the oracle, on every run-dir schema the tracer writes; and the tracer's table path without pandas."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analyzer import schemas
from tests.tracer.helpers import REPO
from tracer.arrow_rows import rows_to_table

SCHEMAS = {"numerics": schemas.NUMERICS_SCHEMA, "steps": schemas.STEPS_SCHEMA,
           "memory": schemas.MEMORY_SCHEMA, "kept": schemas.KEPT_SCHEMA}


def _oracle(rows, schema):
    return pa.Table.from_pydict({f.name: pa.array([r[f.name] for r in rows], type=f.type) for f in schema},
                                schema=schema)


def _parquet_bytes(table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6)  # any valid str


def _value(t: pa.DataType):
    if pa.types.is_dictionary(t):
        return st.sampled_from(["loss", "grad", "layers.0.attn.weight", "ünï", ""])
    if t == pa.string():
        return _TEXT
    if t == pa.int32():
        return st.integers(-2**31, 2**31 - 1)
    if t == pa.int64():
        return st.integers(-2**63, 2**63 - 1)
    if t == pa.float64():
        return st.floats(allow_nan=False)
    if t == pa.bool_():
        return st.booleans()
    if pa.types.is_list(t):
        return st.lists(st.integers(0, 2**40), max_size=4)
    raise AssertionError(t)


def _rows(schema):
    fields = {f.name: (st.none() | _value(f.type)) if f.nullable else _value(f.type) for f in schema}
    return st.lists(st.fixed_dictionaries(fields), max_size=12)


@pytest.mark.parametrize("name", sorted(SCHEMAS))
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_same_table_and_parquet_bytes_as_pyarrow(name, data):
    schema = SCHEMAS[name]
    rows = data.draw(_rows(schema))
    ours, theirs = rows_to_table(rows, schema), _oracle(rows, schema)
    assert ours.schema.equals(theirs.schema, check_metadata=True)
    assert ours.equals(theirs)
    assert ours.to_pylist() == rows
    assert _parquet_bytes(ours) == _parquet_bytes(theirs)


def test_nan_and_infinities_kept():
    rows = [{"rank": 0, "step": 0, "kind": "grad", "tensor": "w", "seq": 0, "metric": m, "value": v}
            for m, v in (("a", float("nan")), ("b", float("inf")), ("c", -float("inf")), ("d", None))]
    values = rows_to_table(rows, schemas.NUMERICS_SCHEMA).column("value").to_pylist()
    assert math.isnan(values[0]) and values[1:] == [float("inf"), -float("inf"), None]


@pytest.mark.parametrize("field, value, error", [
    ("step", 2.5, TypeError), ("step", True, TypeError), ("kind", 3, TypeError),
    ("value", "1.0", TypeError), ("step", 2**31, OverflowError)])
def test_wrong_values_are_refused(field, value, error):
    """Stricter than pyarrow (which truncates 2.5 to 2 in an int32 column): a float is never an
    integer here."""
    row = {"rank": 0, "step": 0, "kind": "loss", "tensor": "loss", "seq": 0, "metric": "value", "value": 1.0}
    row[field] = value
    with pytest.raises(error, match=field if error is TypeError else None):
        rows_to_table([row], schemas.NUMERICS_SCHEMA)


def test_rank_tables_written_and_merged_without_pandas(tmp_path):
    """What a rank and rank 0 do with tables (build, write, merge the parts) never imports
    pandas; a fresh interpreter, since this test process has pandas loaded."""
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from analyzer.schemas import STEPS_NAME, NUMERICS_NAME
        from tracer.numerics import NumericsRows
        from tracer.rundir import PARTS_DIR
        from tracer.worker import merge_parts, step_row, write_rank_outputs
        from tracer.config import RecordConfig
        import torch
        run_dir = Path({str(tmp_path)!r})
        cfg = RecordConfig(strategy="ddp", out=str(run_dir.parent), name=run_dir.name)
        for rank in (0, 1):
            rows = NumericsRows(rank)
            rows.add_loss(0, 1.5, 1.25)
            write_rank_outputs(cfg, rank, rows, [step_row(cfg, rank, 0, 123, torch.device("cpu"))], None)
        merge_parts(run_dir, 2, with_memory=False)
        assert (run_dir / STEPS_NAME).exists() and (run_dir / NUMERICS_NAME).exists()
        assert not (run_dir / PARTS_DIR).exists()
        print("pandas" in sys.modules)
    """)
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"
    steps = pq.read_table(tmp_path / schemas.STEPS_NAME)
    assert steps.schema.equals(schemas.STEPS_SCHEMA)
    assert steps.column("wall_ns").to_pylist() == [123, 123]
    numerics = pq.read_table(tmp_path / schemas.NUMERICS_NAME).to_pylist()
    assert sorted((r["rank"], r["metric"], r["value"]) for r in numerics) == [
        (0, "ref_value", 1.25), (0, "value", 1.5), (1, "ref_value", 1.25), (1, "value", 1.5)]
