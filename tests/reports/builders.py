"""Hand-built run-directory pieces with exact answers, shared by the report tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES


def tensor_rows(*, rank, kind, tensor, seq, step=0, numel=4.0, sq_sum=1.0, ref_sq_sum=1.0,
                diff_sq_sum=None, max_abs_diff=0.0, max_abs_ref=1.0, nonfinite=0.0,
                replicated=1.0):
    """The eight metric rows of one tensor on one rank; ``diff_sq_sum`` defaults to
    ``max_abs_diff ** 2`` (one element off by the maximum): sums a tensor can have."""
    if diff_sq_sum is None:
        diff_sq_sum = max_abs_diff ** 2
    vals = dict(numel=numel, sq_sum=sq_sum, ref_sq_sum=ref_sq_sum, diff_sq_sum=diff_sq_sum,
                max_abs_diff=max_abs_diff, max_abs_ref=max_abs_ref, nonfinite=nonfinite,
                replicated=replicated)
    return [dict(rank=rank, step=step, kind=kind, tensor=tensor, seq=seq, metric=m, value=v)
            for m, v in vals.items()]


def loss_rows(*, rank, step, value, ref):
    return [dict(rank=rank, step=step, kind="loss", tensor="loss", seq=0, metric="value", value=value),
            dict(rank=rank, step=step, kind="loss", tensor="loss", seq=0, metric="ref_value", value=ref)]


def write_numerics(path: Path, rows: list[dict]) -> None:
    cols = {n: [r[n] for r in rows] for n in schemas.NUMERICS_SCHEMA.names}
    table = pa.Table.from_pydict(
        {"rank": pa.array(cols["rank"], pa.int32()), "step": pa.array(cols["step"], pa.int32()),
         "kind": pa.array(cols["kind"]).dictionary_encode(),
         "tensor": pa.array(cols["tensor"]).dictionary_encode(),
         "seq": pa.array(cols["seq"], pa.int32()),
         "metric": pa.array(cols["metric"]).dictionary_encode(),
         "value": pa.array(cols["value"], pa.float64())}).cast(schemas.NUMERICS_SCHEMA)
    pq.write_table(table, path)


def write_steps(path: Path, rows: list[dict]) -> None:
    data = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schemas.STEPS_SCHEMA}
    pq.write_table(pa.Table.from_pydict(data, schema=schemas.STEPS_SCHEMA), path)


def write_memory(path: Path, rows: list[dict]) -> None:
    data = {f.name: pa.array([r.get(f.name) for r in rows], f.type) for f in schemas.MEMORY_SCHEMA}
    pq.write_table(pa.Table.from_pydict(data, schema=schemas.MEMORY_SCHEMA), path)


def write_categories(path: Path, per_rank: dict[int, dict[str, int]], source: str = "sum_of_categories"
                     ) -> None:
    """memory_categories.parquet: ``per_rank`` {rank: {category: bytes}}; a missing ``peak`` is
    the sum of the others (the CPU rule)."""
    rows = []
    for rank, cats in per_rank.items():
        cats = {**cats, "peak": cats.get("peak", sum(cats.values()))}
        rows += [{"rank": rank, "category": c, "bytes": b, "reserved_bytes": None,
                  "source": source if c == "peak" else "tensors"} for c, b in cats.items()]
    data = {f.name: pa.array([r[f.name] for r in rows], f.type) for f in schemas.MEMORY_CATEGORIES_SCHEMA}
    pq.write_table(pa.Table.from_pydict(data, schema=schemas.MEMORY_CATEGORIES_SCHEMA), path)


def manifest(*, run_name, strategy, world_size=2, precision="fp32", fault=None, options=None,
             device="cpu", torch_version="2.13.0", global_batch=8, seed=0, method="spawn",
             training=None, experiment=None, machine=None, mesh=None, model=None):
    """A manifest dict; ``mesh`` (a ``schemas.Mesh`` dict) for the mesh strategies, ``model``
    in place of the default 100-parameter one."""
    extra = {k: v for k, v in (("training", training), ("experiment", experiment),
                               ("machine", machine), ("mesh", mesh)) if v is not None}
    return {**extra,
        "schema_version": schemas.SCHEMA_VERSION, "run_id": f"id-{run_name}", "run_name": run_name,
        "created_utc": "2026-01-01T00:00:00Z", "strategy": strategy,
        "strategy_options": options or {}, "fault": fault, "precision": precision,
        "world_size": 1 if strategy == "single" else world_size,
        "backend": None if strategy == "single" else ("gloo" if device == "cpu" else "nccl"),
        "device": {"type": device, "name": device.upper(), "count": 1},
        "launch": {"method": "single" if strategy == "single" else method, "nnodes": 1,
                   "master_addr": None, "master_port": None},
        "versions": {"python": "3.11.7", "torch": torch_version, "cuda": None, "cudnn": None,
                     "nccl": None, "paritytrace": "0.1.0"},
        "model": model or {"name": "SimpleTransformer", "hidden": 16, "layers": 2, "num_params": 100},
        "batch": {"global_batch": global_batch, "seq_len": 4,
                  "per_rank_batch": global_batch if strategy == "single" else global_batch // world_size,
                  "hidden": 16},
        "seed": seed, "steps": 3,
        "profiler": {"wait": 0, "warmup": 1, "active": 2, "activities": ["cpu"],
                     "record_shapes": False, "profile_memory": True},
        "tolerance": msgspec.to_builtins(TOLERANCES[precision]),
        "baseline": {"kind": "in-process", "description": "hand-built"},
        "files": [],
    }


def typed(fields: dict, **changes) -> schemas.Manifest:
    """``fields`` (a ``manifest()`` dict, with ``changes``) as the analyzer reads it from disk."""
    return msgspec.convert({**fields, **changes}, schemas.Manifest)


def write_manifest(run_dir: Path, data: dict) -> None:
    """Write ``data`` as the manifest, its ``files`` listing every file of ``run_dir`` with its
    size and SHA-256 as the tracer does (hashlib here; an empty list is refused)."""
    import hashlib

    data = {**data, "files": [
        {"path": p.name, "size_bytes": p.stat().st_size,
         "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(run_dir.iterdir()) if p.is_file() and p.name != schemas.MANIFEST_NAME]}
    (run_dir / schemas.MANIFEST_NAME).write_text(json.dumps(data, indent=1), encoding="utf-8")


def limit(max_abs_ref: float) -> float:
    """atol + rtol * max_abs_ref for fp32 (the oracle, written out independently)."""
    return 1e-5 + 1.3e-6 * max_abs_ref


__all__ = ["tensor_rows", "loss_rows", "write_numerics", "write_steps", "write_memory",
           "manifest", "write_manifest", "limit", "math"]


def event(name, ts, end, *, role="compute", cat="cpu_op", tid="1", is_gpu=False, stream=-1,
          correlation=-1, coll_kind=None, step=0, bytes_=-1):
    """One row of the api event table (analyzer/api.py columns), times in ns."""
    return dict(name=name, cat=cat, pid="1", tid=tid, ts_ns=ts, dur_ns=end - ts, end_ns=end,
                is_gpu=is_gpu, stream=stream, correlation=correlation, external_id=-1, step=step,
                role=role, coll_kind=coll_kind, bytes=bytes_, pg=None, rule="hand-built")


def events(rows):
    import pandas as pd

    df = pd.DataFrame(rows)
    for c in ("ts_ns", "dur_ns", "end_ns", "stream", "correlation", "external_id", "step", "bytes"):
        df[c] = df[c].astype("int64")
    return df


def write_run(run_dir: Path, *, strategy: str, walls: dict[int, tuple[int, ...]],
              grad_diff: float = 0.0, tensor: str = "layers.0.attn.weight", peak_alloc: int = 10 << 20,
              categories: dict[int, dict[str, int]] | None = None, **manifest_kw) -> None:
    """A complete hand-built run directory (no traces): manifest, numerics, steps.

    ``walls`` maps step -> per-rank wall_ns; step 0 is unprofiled, the rest profiled.
    ``grad_diff`` is the max |diff| of the one gradient (max |ref| 1.0: fp32 limit 1.13e-5).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    world = len(next(iter(walls.values())))
    rows = []
    for rank in range(world):
        for step in walls:
            rows += loss_rows(rank=rank, step=step, value=2.0, ref=2.0)
        if strategy != "single":
            rows += tensor_rows(rank=rank, kind="activation", tensor="layers.0", seq=0)
            rows += tensor_rows(rank=rank, kind="grad", tensor=tensor, seq=0, max_abs_diff=grad_diff,
                                diff_sq_sum=grad_diff ** 2, replicated=1.0)
            rows += tensor_rows(rank=rank, kind="param", tensor=tensor, seq=0)
    write_numerics(run_dir / "numerics.parquet", rows)
    srows = [dict(rank=rank, step=step, profiled=step > 0, wall_ns=w[rank], peak_rss_bytes=(200 << 20) + rank,
                  profiler_allocated_peak_bytes=peak_alloc + rank)
             for step, w in walls.items() for rank in range(world)]
    write_steps(run_dir / "steps.parquet", srows)
    if categories is not None:
        write_categories(run_dir / schemas.MEMORY_CATEGORIES_NAME, categories)
    data = manifest(run_name=run_dir.name, strategy=strategy, world_size=world, **manifest_kw)
    data["steps"] = max(data["steps"], len(walls) - 1)  # the steps.parquet rows are bounded by it
    write_manifest(run_dir, data)


def build_root(root: Path, *, fault: bool = False) -> Path:
    """A traces root: single (steps 10/10/10 ms), ddp (slowest rank 5, 6, 8 ms), fsdp2 (8/9/9 ms).

    Exact answers: medians of profiled steps (1, 2): single 10 ms, ddp 7 ms, fsdp2 9 ms ->
    order ddp, fsdp2, single; speedups 10/7 and 10/9. With ``fault`` the ddp gradient differs
    by 1e-3 (> limit 1.13e-5): ranking withheld naming ddp and layers.0.attn.weight.
    """
    ms = 1_000_000
    write_run(root / "single", strategy="single", walls={0: (10 * ms,), 1: (10 * ms,), 2: (10 * ms,)})
    write_run(root / "ddp", strategy="ddp", walls={0: (50 * ms, 1), 1: (5 * ms, 6 * ms), 2: (8 * ms, 7 * ms)},
              grad_diff=1e-3 if fault else 1e-6, fault="wrong-grad-scale" if fault else None)
    write_run(root / "fsdp2", strategy="fsdp2", walls={0: (1, 1), 1: (9 * ms, 8 * ms), 2: (9 * ms, 9 * ms)},
              options={"reshard_after_forward": True})
    return root


if __name__ == "__main__":  # regenerate fixtures/report (python3 -m tests.reports.builders)
    import shutil
    import sys

    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "fixtures/report")
    for name, fault in (("clean", False), ("fault", True)):
        shutil.rmtree(dest / name, ignore_errors=True)
        build_root(dest / name, fault=fault)


def details(md: str) -> str:
    """The verdict's sentences under report.md's decision line (its bullet list), as one
    string: the text a reader gets before the first section."""
    head = md.split("\n## ", 1)[0]
    for label in ("\n**Context:**", "\n**What differs between the arms"):
        parts = head.split(label, 1)
        if len(parts) == 2:  # a labelled list before them (label, blank, list, blank): not theirs
            head = parts[0] + "\n" + parts[1].split("\n\n", 2)[-1]
    return " ".join(line[2:] for line in head.splitlines() if line.startswith("- "))


def caveats(md: str) -> list[str]:
    """report.md's Caveats section, one string per run's caveat ("ddp: ..."); [] without one."""
    if "\n## Caveats\n\n" not in md:
        return []
    block = md.split("\n## Caveats\n\n", 1)[1].split("\n\n", 1)[0]
    return [line[2:] for line in block.splitlines()]


def context(md: str) -> list[str]:
    """report.md's context list (reports/context.py), one string per line; [] without one."""
    head = md.split("\n## ", 1)[0]
    if "\n**Context:**\n\n" not in head:
        return []
    block = head.split("\n**Context:**\n\n", 1)[1].split("\n\n", 1)[0]
    return [line[2:] for line in block.splitlines()]


def decision(md: str) -> str:
    """report.md's decision line (the first line after the title), without its label."""
    line = md.splitlines()[2]
    assert line.startswith("**Decision:** "), line
    return line.removeprefix("**Decision:** ")


def findings() -> list:
    """Hand-built findings (contract ``Finding``) with exact display answers, given out of
    severity order: a straggler with an established cause (explains 86 % >= 80 %), exposed
    communication whose cause explains too little (70 %: "cause not established"), an
    input-bound run with no stake measured, and a low-busbw finding."""
    from analyzer.contract.report_types import Evidence, Finding

    return [
        Finding(kind="exposed_communication", title="ddp's all_reduce is exposed",
                runs=["ddp"], evidence=[Evidence(figure="exposed communication", value=1.5e6,
                                                 unit="ns", path="/runs/1/exposed_comm_ns"),
                                        Evidence(figure="overlap", value=0.125, unit="frac",
                                                 path="/runs/1/overlap_frac")],
                cause="bucket too large", cause_rule="bucket rule", explained_frac=0.7,
                action="lower bucket_cap_mb", severity_ns=1.5e6),
        Finding(kind="straggler", title="all_to_all waits for rank 3", runs=["ddp"], ranks=[3],
                evidence=[Evidence(figure="late", value=4.2e6, unit="ns",
                                   path="/runs/1/stragglers/0/late_ns"),
                          Evidence(figure="times last", value=12, unit="count",
                                   path="/runs/1/stragglers/0/times_last")],
                cause="host-side delay", cause_rule="host delay >= 80 % of the lateness",
                explained_frac=0.86, action="look for host work before the collective",
                severity_ns=4.2e6),
        Finding(kind="input_bound", title="fsdp2 waits for its input", runs=["fsdp2"],
                evidence=[Evidence(figure="data wait", value=0.38, unit="frac",
                                   path="/runs/2/data/data_wait_frac")],
                action="raise DataLoader num_workers"),
        Finding(kind="low_busbw", title="fsdp2 all_gather busbw below the run's best",
                runs=["fsdp2"], evidence=[Evidence(figure="busbw", value=1.25, unit="GB/s",
                                                   path="/runs/2/communication/all_gather/busbw_gbps"),
                                          Evidence(figure="bytes", value=3 * 2**20, unit="bytes",
                                                   path="/runs/2/communication/all_gather/bytes")],
                severity_ns=0.2e6),
    ]


FINDING_LINES = [
    "straggler (4.20 ms/step at stake): all_to_all waits for rank 3; evidence: late 4.20 ms, "
    "times last 12; cause: host-side delay (explains 86.0 %); try: look for host work before "
    "the collective",
    "exposed communication (1.50 ms/step at stake): ddp's all_reduce is exposed; evidence: "
    "exposed communication 1.50 ms, overlap 12.5 %; cause not established; try: lower "
    "bucket_cap_mb",
    "low busbw (0.20 ms/step at stake): fsdp2 all_gather busbw below the run's best; evidence: "
    "busbw 1.25 GB/s, bytes 3.0 MiB; cause not established",
    "input-bound (stake not measured): fsdp2 waits for its input; evidence: data wait 38.0 %; "
    "cause not established; try: raise DataLoader num_workers",
]
"""``findings()``' lines on the first screen, most severe first (written by hand)."""
