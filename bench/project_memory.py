"""Per-rank memory of projections beside the sharding arithmetic (issue 44, Deliver 6).

    python3 bench/project_memory.py collect RUN_DIR... --out memory.json
    python3 bench/project_memory.py markdown memory.json [--title TEXT] [--command TEXT]

``collect`` (no torch): per projection run directory (``tracer project``) and per role it ran,
the allocator peak -- ``torch.cuda.max_memory_allocated`` of the role's process, reset at the
start of each step (tracer/loop.py; steps.parquet ``cuda_max_allocated_bytes``), the largest
over its profiled steps; None on CPU or on fake tensors, whose storage is not allocated -- the
memory the tracer measured by category (memory_categories.parquet), with fake tensors the live-bytes peak (the manifest's
``projection.live_peak_bytes``, tracer/livebytes.py), and what the sharding
arithmetic expects the rank to hold (analyzer/analyses/sharding.py ``predict``: parameters and
gradients the padded shard x 4 bytes, optimizer state ``optimizer_state_elements``).
``markdown``: those rows as a bench/RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")


def collect(run_dir: Path) -> list[dict]:
    """One row per role of the projection in ``run_dir`` (module docstring). Raises
    ``ValueError`` when ``run_dir`` is not a projection."""
    import msgspec
    import pyarrow.parquet as pq

    from analyzer.analyses import sharding
    from analyzer.contract.schemas import Manifest

    m = msgspec.json.decode((run_dir / "manifest.json").read_bytes(), type=Manifest)
    if m.projection is None:
        raise ValueError(f"{run_dir}: not a projection (its manifest has no projection section)")
    steps = pq.read_table(run_dir / "steps.parquet").to_pylist()
    cats = pq.read_table(run_dir / "memory_categories.parquet").to_pylist()
    pred = sharding.predict(m) or {"ranks": []}
    by_rank = {r["rank"]: r for r in pred["ranks"]}
    optimizer = m.training.optimizer.get("name", "") if m.training is not None else ""
    rows = []
    for rank in m.projection.roles_run:
        peaks = [s["cuda_max_allocated_bytes"] for s in steps
                 if s["rank"] == rank and s["profiled"] and s["cuda_max_allocated_bytes"] is not None]
        measured = {c["category"]: c["bytes"] for c in cats if c["rank"] == rank}
        p = by_rank.get(rank)
        expected = {}
        if p is not None and p["padded_elements"] is not None:
            expected["parameters"] = expected["gradients"] = p["padded_elements"] * sharding.BYTES_PER_ELEMENT
            opt, exact = sharding.optimizer_state_elements(optimizer, p["unpadded_elements"],
                                                           p["expected_elements"], p["tensors"])
            expected["optimizer_state"] = int(opt) if opt is not None and exact else None
        rows.append({
            "run": m.run_name, "strategy": m.strategy, "mesh": m.strategy_options.get("mesh"),
            "world_size": m.world_size, "rank": rank, "device": m.projection.device,
            "fake_tensors": m.projection.fake_tensors, "hidden": m.model.hidden,
            "precision": m.precision,
            "cuda_max_allocated_bytes": max(peaks) if peaks else None,
            "live_peak_bytes": m.projection.live_peak_bytes.get(str(rank)),
            "measured_bytes": {c: measured.get(c) for c in CATEGORIES},
            "expected_bytes": {c: expected.get(c) for c in CATEGORIES[:3]},
        })
    return rows


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:,.1f}"


def markdown(rows: list[dict], title: str, command: str) -> str:
    """A bench/RESULTS.md section of ``collect``'s rows."""
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    out = [f"### {title}, {day}", "", f"`{command}`" if command else "", "",
           "| run | strategy | world | rank | device | tensors | allocator peak MiB | live peak MiB (fake) "
           "| parameters MiB (expected) "
           "| gradients MiB (expected) | optimizer state MiB (expected) | activations MiB | "
           "parameters + gradients + optimizer state = arithmetic |",
           "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        meas, exp = r["measured_bytes"], r["expected_bytes"]
        same = all(exp[c] is not None and meas[c] == exp[c] for c in CATEGORIES[:3])
        out.append(
            f"| {r['run']} | {r['strategy']}{' ' + r['mesh'] if r['mesh'] else ''} | {r['world_size']} | {r['rank']} | {r['device']} | "
            f"{'fake' if r['fake_tensors'] else 'real'} | {_mib(r['cuda_max_allocated_bytes'])} | "
            f"{_mib(r.get('live_peak_bytes'))} | "
            + " | ".join(f"{_mib(meas[c])} ({_mib(exp[c])})" for c in CATEGORIES[:3])
            + f" | {_mib(meas['activations'])} | {'yes, to the byte' if same else 'no'} |")
    out += ["", "Allocator peak: `torch.cuda.max_memory_allocated` of the role's process, reset at "
            "each step, the largest over the profiled steps (\"-\" on CPU or fake tensors). "
            "Live peak: fake tensors only, the role's live tensor bytes on its device in the "
            "profiled steps (tracer/livebytes.py; no allocator rounding or caching). "
            "Expected: analyzer/analyses/sharding.py (padded FSDP2 shards x 4 bytes; AdamW state "
            "of the local views + a 4-byte step per tensor).", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collect")
    c.add_argument("runs", nargs="+", type=Path)
    c.add_argument("--out", type=Path, required=True)
    md = sub.add_parser("markdown")
    md.add_argument("json", type=Path)
    md.add_argument("--title", default="Projected per-rank memory on the GPU (issue 44)")
    md.add_argument("--command", default="scripts/device_check.sh OUTDIR")
    args = ap.parse_args(argv)
    if args.cmd == "collect":
        rows = [row for run in args.runs for row in collect(run)]
        args.out.write_text(json.dumps(rows, indent=1))
        for r in rows:
            print(json.dumps(r))
        return 0
    print(markdown(json.loads(args.json.read_text()), args.title, args.command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
