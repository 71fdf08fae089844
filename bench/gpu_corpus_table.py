"""Per corpus GPU trace: the figures a user acts on, for a before/after table (issue 16).

Usage: PARITYTRACE_CORPUS=../shared/corpus python bench/gpu_corpus_table.py [--json OUT]

Per trace: steps, median step (device window), median CPU step, idle/step, comm/step, bytes per
kind, whether windows overlap, and the trace's device-idle total (the union of every device
event's complement inside [first device event, last device event]; gpu_user_annotation ranges
are not device work) as the bound summed idle must
respect.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analyzer.analyses import intervals as iv  # noqa: E402
from analyzer.api import load_events, load_tables  # noqa: E402

TRACES = ["single/v100_ddp_subus_timestamps.json.gz", "single/a100_ddp_rank0_nccl_args.json.gz",
          "single/b200_allgather_rank0.json.gz", "single/mtia_inference_rank0.json.gz",
          "single/cupti_range_profiler.json.gz", "single/rocm_mi250_truncated_last_step.json.gz",
          "single/resnet_dataloader_1gpu.json.gz", "single/sglang_cudagraph_capture.json.gz",
          "dlrm_ddp_8rank_v100/worker0.pt.trace.json.gz"]


def device_idle_ns(ev) -> int:
    gpu = ev["is_gpu"].to_numpy(dtype=bool) & (ev["role"].astype(str) != "annotation").to_numpy()
    if not gpu.any():
        return 0
    s, e = ev["ts_ns"].to_numpy()[gpu], ev["end_ns"].to_numpy()[gpu]
    busy = iv.merge(s, e)
    return int(e.max() - s.min()) - iv.measure(busy)


def row(rel: str, corpus: Path) -> dict:
    p = corpus / rel
    jt = load_tables(p, jobs=1)
    b = jt.breakdown
    if "device_work" in b:  # steps that launched no device work stay out of medians
        b = b[b["device_work"]]
    ev, steps = load_events(p)
    st = steps.sort_values("start_ns")
    overl = bool((st["start_ns"].to_numpy()[1:] < st["end_ns"].to_numpy()[:-1]).any())
    c = jt.collectives
    kinds = {}
    for k, g in c.groupby("kind"):
        known = g["bytes"] >= 0
        kinds[str(k)] = {"count": int(len(g)), "bytes": int(g.loc[known, "bytes"].sum()),
                         "unknown": int((~known).sum())}
    cpu = (steps["cpu_end_ns"] - steps["cpu_start_ns"]) if "cpu_end_ns" in steps else None
    return {"trace": rel, "device": jt.ranks[0].device_kind, "steps": int(len(b)),
            "median_step_ms": float(np.median(b["step_ns"])) / 1e6 if len(b) else None,
            "median_cpu_step_ms": float(np.median(cpu)) / 1e6 if cpu is not None and len(cpu) else None,
            "idle_per_step_ms": float(b["idle_ns"].mean()) / 1e6 if len(b) else None,
            "sum_idle_ms": float(b["idle_ns"].sum()) / 1e6,
            "comm_per_step_ms": float(b["comm_ns"].mean()) / 1e6 if len(b) else None,
            "device_idle_ms": device_idle_ns(ev) / 1e6, "windows_overlap": overl,
            "bytes_by_kind": kinds, "notes": list(jt.warnings)}


def main() -> None:
    corpus = Path(os.environ["PARITYTRACE_CORPUS"])
    rows = [row(t, corpus) for t in TRACES]
    for r in rows:
        print(json.dumps(r))
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
