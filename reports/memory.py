"""The report's Memory section (issue 19), for report.md and report.html: pure functions of the
report. What each rank holds by category, the ratio to DDP beside the ratio sharding predicts,
the fits / does not fit line of ``--device-memory``, the traces' ``[memory]`` peaks, the CUDA
snapshot, and process RSS apart (the whole process, not what the model needs).
"""

from __future__ import annotations

from typing import Any

from analyzer.contract import strategies
from analyzer.contract.report_types import Report, RunEntry
from reports import fmt, palette
from reports.definitions import Definition, define

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
"""The categories that add up (the fifth, ``peak``, is their sum on CPU, the allocator's on CUDA)."""
LABELS = {"parameters": "parameters", "gradients": "gradients",
          "optimizer_state": "optimizer state", "activations": "activations", "peak": "peak"}
SHARDED = ("parameters", "gradients", "optimizer_state")
PEAK_SOURCES = {"sum_of_categories": "sum of the categories (CPU)",
                "cuda_max_allocated": "CUDA allocator peak"}

SOURCES = (
    "Sources: parameters, gradients and optimizer state are counted from the tensors each rank "
    "holds (distinct storages, so FSDP's padding counts: FSDP1's flat-parameter shard, FSDP2's "
    "padded Shard(0) buffers; gradients after the first backward, optimizer state -- AdamW's "
    "exp_avg, exp_avg_sq and step -- after the first optimizer step); activations are the "
    "tensors autograd saved for backward in the first forward (saved-tensor hooks, parameters "
    "left out); peak is torch.cuda.max_memory_allocated on CUDA (reserved beside it) and on CPU "
    "the sum of the four categories. Written by the tracer to memory_categories.parquet. "
    "The CPU sum leaves out transient buffers (FSDP's all_gathered unit while it computes, "
    "communication buckets, temporaries), so it is what the rank holds between steps plus the "
    "saved activations, a lower bound of the true peak. "
    "Foreign traces have no categories: their peak comes from the trace's [memory] events. "
    "Each run's peak source is named in the table.")
RATIO_NOTE = (
    "Ratio to DDP: the run's largest per-rank figure over DDP's. Predicted: what sharding over W "
    "ranks gives -- 1/W for parameters, gradients and optimizer state under FULL_SHARD / "
    "SHARD_GRAD_OP (both keep only the local shard between steps; padding makes it slightly "
    "more), 1 under NO_SHARD; activations 1 (same rows per rank), W for the single-device run "
    "(the whole global batch).")
RSS_NOTE = (
    "Process RSS is the whole process's high-water resident memory (ru_maxrss): torch, Python, "
    "the libraries, the profiler and its buffers -- hundreds of MiB before the model -- so it is "
    "shown apart, never as the memory the model needs. The profiler-window peak is the largest "
    "\"Total Allocated\" of torch.profiler's [memory] events during a profiled step: it counts only "
    "what was allocated while profiling (a parameter made before is invisible), so it is no peak "
    "either; the CUDA columns are torch.cuda.max_memory_allocated / max_memory_reserved per step.")
DEVICE_NOTE = (
    "From the traces' [memory] events: peak allocated = the largest \"Total Allocated\" the "
    "allocator reported (events without it: the running sum of their Bytes); a free of a block "
    "allocated before the profiler started never makes the running total negative -- the "
    "smallest amount that keeps it >= 0 is taken as live from the start (\"live before the "
    "window\"). On CPU the totals cover only what the profiler saw.")


def size(b: Any) -> str:
    """Bytes as MiB, or KiB / B below a MiB (``fmt.data_bytes``); ``-`` when missing."""
    return "-" if b is None else fmt.data_bytes(b)


def gib(b: Any) -> str:
    """Bytes as GiB (2^30) from 1 GiB up, below it as ``size``; ``-`` when missing."""
    return "-" if b is None else f"{b / 2**30:.2f} GiB" if abs(b) >= 2**30 else size(abs(b))


def _by_rank(run: RunEntry) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for c in run.memory.by_category:
        out.setdefault(c.rank, {})[c.category] = c
    return out


def peak_name(run: RunEntry) -> str:
    """What the run's memory figure (``Memory.peak_allocated_bytes``) is, named for it: ``peak
    allocated`` where it is the allocator's peak, else the lower bound it is -- ``sum of
    categories (lower bound)`` (a CPU record: memory_categories.parquet's peak row is the sum of
    the categories, the allocator keeps no peak), ``profiler-window peak (lower bound)``
    (steps.parquet of an older record), ``[memory] events peak (lower bound)`` (a CPU trace's
    events: only what was allocated while profiling). ``-`` without a figure."""
    m = run.memory
    if m.peak_allocated_bytes is None:
        return "-"
    if not m.peak_lower_bound:
        return "peak allocated"
    if any(c.category == "peak" and c.source == "sum_of_categories" for c in m.by_category):
        return "sum of categories (lower bound)"
    if (m.peak_source or "").startswith("trace [memory] events"):
        return "[memory] events peak (lower bound)"
    return "profiler-window peak (lower bound)"


def peak_column(runs: list[RunEntry]) -> tuple[str, list[str]]:
    """The header and cells of a per-run memory column (``peak_name``): ``peak allocated per
    rank`` when every run's figure is the allocator's peak; ``memory per rank (sum of
    categories, lower bound)`` (or the one lower bound they share) when every one is that lower
    bound; else ``memory per rank (>= a lower bound)``, each lower bound's cell marked
    ``>=``."""
    names = {peak_name(r) for r in runs if r.memory.peak_allocated_bytes is not None}
    cells = [fmt.mib(r.memory.peak_allocated_bytes) for r in runs]
    if names <= {"peak allocated"}:
        return "peak allocated per rank", cells
    if len(names) == 1:
        what = next(iter(names)).replace(" (lower bound)", ", lower bound")
        return f"memory per rank ({what})", cells
    return "memory per rank (>= a lower bound)", [
        (">= " + c) if r.memory.peak_lower_bound and r.memory.peak_allocated_bytes is not None
        else c for r, c in zip(runs, cells)]


def largest(run: RunEntry, category: str) -> int | None:
    """The run's largest per-rank bytes in ``category`` (None without categories)."""
    vals = [c.bytes for c in run.memory.by_category if c.category == category]
    return max(vals) if vals else None


def category_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """Per run and rank: bytes by category and the peak with its source."""
    heads = ["run", "rank", *(LABELS[c] for c in CATEGORIES), "peak", "peak reserved", "peak source"]
    rows = []
    for r in report.runs:
        for rank, cats in sorted(_by_rank(r).items()):
            peak = cats.get("peak")
            rows.append([r.name, rank, *(size(cats[c].bytes) if c in cats else "-" for c in CATEGORIES),
                         size(peak.bytes if peak else None),
                         size(peak.reserved_bytes if peak else None),
                         PEAK_SOURCES.get(peak.source, peak.source) if peak else "-"])
    return heads, rows


def predicted_ratio(run: RunEntry, category: str, ddp: RunEntry) -> float | None:
    """What sharding predicts for ``run``'s ``category`` over DDP's (RATIO_NOTE, MESH_NOTE):
    ``memory.sharding``'s ratio; for activations 1 (DDP's world size for the reference), not
    predicted under tensor or pipeline parallelism. None: no prediction (the peak, unknown)."""
    row = strategies.spec(run.strategy)
    if category == "peak" or row is None:
        return None
    if category == "activations":
        if row.is_reference:
            return float(ddp.world_size or 1)
        return None if row.dim_of("tensor") or row.dim_of("stage") else 1.0
    sh = run.memory.sharding
    return sh.ratio if sh is not None else None


def reference_ddp(report: Report) -> RunEntry | None:
    """The DDP run the ratios are taken against: the first complete run of a DDP row
    (``wrapper`` ddp) with categories and no fault."""
    ddp = {s.name for s in strategies.TABLE.values() if s.wrapper == "ddp"}
    return next((r for r in report.runs if r.strategy in ddp and r.memory.by_category
                 and not r.fault and not r.incomplete), None)


def ratio_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """Per run with categories and category: its largest per-rank bytes, DDP's, the ratio, the
    prediction. Empty without a DDP run."""
    heads = ["run", "category", "largest per rank", "DDP per rank", "ratio to DDP", "sharding predicts"]
    ddp = reference_ddp(report)
    if ddp is None:
        return heads, []
    rows = []
    for r in report.runs:
        if r is ddp or not r.memory.by_category:
            continue
        for c in (*CATEGORIES, "peak"):
            mine, base = largest(r, c), largest(ddp, c)
            ratio = None if mine is None or not base else mine / base
            pred = predicted_ratio(r, c, ddp)
            rows.append([r.name, LABELS[c], size(mine), size(base), fmt.num(ratio, ".3f"),
                         "-" if pred is None else _fraction(pred, r, c, ddp)])
    return heads, rows


def _fraction(pred: float, run: RunEntry, category: str, ddp: RunEntry) -> str:
    sh = run.memory.sharding
    if category in SHARDED and sh is not None and not _flat(run):
        return f"{sh.formula} = {pred:.3f}"
    if category in SHARDED and pred < 1:
        return f"1/{run.world_size or 1} = {pred:.3f}"
    return f"{pred:.3f}"


def _flat(run: RunEntry) -> bool:
    """False for a strategy on a 2-D mesh (hsdp, fsdp2_tp, pp); True for the others, unknown
    ones too."""
    row = strategies.spec(run.strategy)
    return row is None or row.is_flat


def sharding_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """Per run with a sharding prediction (``Memory.sharding``) and rank: its share of the
    parameters, the bytes the sharding predicts (the padded figure when the shapes are known,
    else ">= " the share's bytes), what the rank holds, the check."""
    heads = ["run", "rank", "stage", "share of N (elements)", "sharding predicts",
             "parameters measured", "check", "gradients measured", "check",
             "optimizer state predicts", "optimizer state measured", "check"]
    rows = []
    for r in report.runs:
        sh = r.memory.sharding
        if sh is None:
            continue
        for k in sh.ranks:
            pred = (size(k.padded_bytes) if k.padded_bytes is not None
                    else "-" if k.expected_bytes is None else f">= {size(round(k.expected_bytes))}")
            opt = k.optimizer_state_expected_bytes
            opt_pred = ("-" if opt is None else size(round(opt))
                        if k.optimizer_state_check in ("exact", "differs") or not opt
                        else f">= {size(round(opt))}")
            rows.append([r.name, k.rank, "-" if k.stage < 0 else k.stage,
                         _elements(k.expected_elements), pred, size(k.measured_bytes),
                         CHECKS.get(k.check, k.check), size(k.gradients_measured_bytes),
                         CHECKS.get(k.gradients_check, k.gradients_check), opt_pred,
                         size(k.optimizer_state_measured_bytes),
                         CHECKS.get(k.optimizer_state_check, k.optimizer_state_check)])
    return heads, rows


def _elements(v: float | None) -> str:
    """``1,216`` when whole, ``1,215.5`` otherwise; ``-`` when missing."""
    return "-" if v is None else f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"


def sharding_lines(report: Report) -> list[str]:
    """One line per run with a prediction: its formula and whether the check is exact."""
    return [f"{r.name}: per rank {r.memory.sharding.formula} of the parameters; "
            f"{r.memory.sharding.basis}" for r in report.runs if r.memory.sharding]


CHECKS = {"exact": "exact", "differs": "DIFFERS", "at_least": "at least its share",
          "below": "BELOW its share", "not_measured": "not measured"}
MESH_NOTE = (
    "Mesh strategies: hsdp shards over the shard dimension S only (the replicate dimension "
    "copies): 1/S; fsdp2_tp: TP splits N_tp of the N parameters over T, then FSDP2 splits "
    "every local tensor over dp: ((N - N_tp) + N_tp/T)/dp of N; pp: a rank holds its stage's "
    "parameters split over dp, stage_params[stage]/dp of N -- the table's largest rank is "
    "the one of the stage with the most. Gradients and optimizer state follow the parameters. "
    "Activations: hsdp 1 (every rank its own rows, as DDP); fsdp2_tp and pp not predicted (TP "
    "splits some activations, a stage keeps those of its microbatches in flight).")
SHARDING_NOTE = (
    "Sharding predicts, per rank: its share of the model's N parameters (manifest "
    "model.num_params) x 4 bytes (fp32 parameters), beside the parameters it holds (the "
    "tracer counts a DTensor's local storage: FSDP2's padded shard). FSDP2 splits each "
    "parameter on dim 0 with torch.chunk into chunks of ceil(d0 / group) rows and pads every "
    "rank's shard to that, so a rank holds exactly its share when every d0 divides by the "
    "group and up to one row per parameter more otherwise. For the reference model the shapes "
    "are known and the padded figure is exact (check: exact / DIFFERS); for another model "
    "only the share is known, a lower bound (check: at least its share / BELOW its share). "
    "Gradients follow the parameters' shards (the same prediction); the optimizer state is 0 "
    "for SGD (no momentum) and for AdamW exp_avg + exp_avg_sq (twice the local view, "
    "torch.chunk's rows without FSDP2's padding: a rank past the last chunk holds none) + a "
    "4-byte step per parameter tensor.")


def fit_lines(report: Report) -> list[str]:
    """With ``--device-memory``: one line per run, fits / does not fit, with the margin."""
    out = []
    for r in report.runs:
        f = r.memory.fit
        if f is None:
            continue
        dev = gib(f.device_bytes)
        kind = "CPU record" if r.device == "cpu" else "profiler window only"  # of the lower bound
        # MemoryFit.basis says "peak allocated" for any allocated figure; a CPU record's is a sum
        basis = ("sum of categories" if f.basis == "peak allocated" and peak_name(r).startswith("sum")
                 else f.basis)
        bound = f"lower bound, {kind}: {basis} {gib(f.needed_bytes)} on its largest rank" \
            if f.lower_bound else ""
        if f.needed_bytes is None:
            out.append(f"{r.name}: unknown whether it fits one {dev} device (no memory figure)")
        elif f.fits is None:
            out.append(f"{r.name}: not known whether it fits one {dev} device ({bound}, "
                       f"{gib(f.spare_bytes)} under the device; the true peak holds transient "
                       "buffers this figure misses): record on the target device to know")
        elif not f.fits and f.lower_bound:
            out.append(f"{r.name}: does not fit at this batch on one {dev} device: needs "
                       f"{gib(-f.spare_bytes)} more even by a lower bound ({bound})")
        elif f.fits:
            out.append(f"{r.name}: fits at this batch on one {dev} device, with {gib(f.spare_bytes)} "
                       f"to spare ({f.basis} {gib(f.needed_bytes)} on its largest rank)")
        else:
            out.append(f"{r.name}: does not fit at this batch on one {dev} device: needs "
                       f"{gib(-f.spare_bytes)} more ({f.basis} {gib(f.needed_bytes)} on its "
                       "largest rank)")
    return out


def peak_source_lines(report: Report) -> list[str]:
    """One line per run: its memory figure named for what it is (``peak_name``) and where it
    comes from."""
    return [f"{r.name}: {peak_name(r)} {size(r.memory.peak_allocated_bytes)} per rank, from "
            f"{r.memory.peak_source}" for r in report.runs if r.memory.peak_source]


def rss_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """steps.parquet's per-rank figures: process RSS and the window-only / CUDA peaks."""
    return (["run", "rank", "process peak RSS (whole process)", "profiler-window peak (window only)",
             "CUDA peak allocated", "CUDA peak reserved"],
            [[r.name, m.rank, size(m.peak_rss_bytes), size(m.profiler_allocated_peak_bytes),
              size(m.cuda_max_allocated_bytes), size(m.cuda_max_reserved_bytes)]
             for r in report.runs for m in r.memory.ranks])


def device_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """The traces' [memory] peaks per run, rank and device, for runs without categories (a
    recorded run's are its profiler-window peaks, in ``rss_rows``)."""
    return (["run", "rank", "device", "[memory] events", "peak allocated", "peak reserved",
             "live before the window", "source"],
            [[r.name, d.rank, d.device, d.events, size(d.peak_allocated_bytes),
              size(d.peak_reserved_bytes), size(d.start_bytes), d.source]
             for r in report.runs if not r.memory.by_category for d in r.memory.devices])


def snapshot_rows(run: RunEntry) -> tuple[list[str], list[list[Any]]]:
    """A run's CUDA allocator snapshot: live blocks by the snapshot's category."""
    return (["rank", "category", "blocks", "bytes"],
            [[c.rank, c.category, c.blocks, size(c.bytes)] for c in run.memory.snapshot_by_category])


def snapshot_total_rows(run: RunEntry) -> tuple[list[str], list[list[Any]]]:
    """A run's CUDA snapshot totals beside the categories (``SnapshotTotal``)."""
    peaks = {c.rank: c for c in run.memory.by_category if c.category == "peak"}
    return (["rank", "snapshot allocated (live blocks)", "snapshot reserved (all blocks)",
             "parameters + optimizer state", "peak allocated", "peak reserved",
             "agree (held <= live <= peak)"],
            [[t.rank, size(t.allocated_bytes), size(t.reserved_bytes), size(t.held_bytes),
              size(peaks[t.rank].bytes if t.rank in peaks else None),
              size(peaks[t.rank].reserved_bytes if t.rank in peaks else None),
              "-" if t.agrees is None else "yes" if t.agrees else "no"]
             for t in run.memory.snapshot_totals])


def largest_rows(run: RunEntry) -> tuple[list[str], list[list[Any]]]:
    """A run's largest live allocations."""
    return (["rank", "size", "category", "where"],
            [[a.rank, size(a.block_size_bytes), a.category, a.top_frame or "-"]
             for a in run.memory.largest])


def bar_rows(report: Report) -> list[tuple[str, list[tuple[str, float, str, float]]]]:
    """The stacked bar per run: its largest-peak rank's categories (bytes), as (category,
    bytes, the run's strategy colour, the category's shade)."""
    col = palette.run_colors(report.runs)
    rows = []
    for r in report.runs:
        ranks = _by_rank(r)
        if not ranks:
            continue
        rank, cats = max(ranks.items(), key=lambda kv: (kv[1]["peak"].bytes if "peak" in kv[1] else 0, -kv[0]))
        rows.append((f"{palette.run_label(r)} (rank {rank})",
                     [(LABELS[c], cats[c].bytes if c in cats else 0, col[r.name],
                       palette.SHADES[LABELS[c]]) for c in CATEGORIES]))
    return rows


def definitions(report: Report) -> dict[str, Definition]:
    """The section's definitions (reports/definitions.py), by key."""
    return {"memory_sources": define("Memory categories and their sources", SOURCES),
            "ratio": define("Ratio to DDP and what sharding predicts", RATIO_NOTE,
                            MESH_NOTE if not all(_flat(r) for r in report.runs)
                            else ""),
            "sharding": define("Parameters per rank under sharding", SHARDING_NOTE),
            "device_memory": define("Peaks from memory events", DEVICE_NOTE),
            "rss": define("Process RSS and the profiler-window peak", RSS_NOTE)}


def markdown(report: Report, table, escape, link=lambda *keys: "") -> list[str]:
    """The section's report.md lines; ``table`` / ``escape`` are reports/markdown.py's;
    ``link(*keys)``: the line linking a table to its definitions (``definitions``)."""
    out = ["## Memory per rank", ""]
    heads, rows = category_rows(report)
    out += [table(heads, rows) if rows else "No memory categories (foreign traces, or a record "
            "made before they were written).", ""] + ([link("memory_sources"), ""] if rows else [])
    out += [f"- {escape(line)}" for line in peak_source_lines(report)] + [""]
    heads, rows = ratio_rows(report)
    if rows:
        out += ["### Ratio to DDP", "", table(heads, rows), "", link("ratio"), ""]
    heads, rows = sharding_rows(report)
    if rows:
        out += ["### Parameters per rank: what sharding predicts", "", table(heads, rows), "",
                link("sharding"), ""] + [f"- {escape(x)}" for x in sharding_lines(report)] + [""]
    fits = fit_lines(report)
    if fits:
        out += ["### Will it fit", ""] + [f"- {escape(line)}" for line in fits] + [""]
    heads, rows = device_rows(report)
    if rows:
        out += ["### Peaks from the traces' \\[memory\\] events", "", table(heads, rows), "",
                link("device_memory"), ""]
    for r in report.runs:
        if r.memory.snapshot_by_category:
            out += [f"CUDA allocator snapshot of {escape(r.name)} (live blocks by category):", "",
                    table(*snapshot_rows(r)), "", table(*snapshot_total_rows(r)), "",
                    "Largest live allocations:", "", table(*largest_rows(r)), ""]
    heads, rows = rss_rows(report)
    if rows:
        out += ["### Process RSS and the profiler window (shown apart)", "", table(heads, rows), "",
                link("rss"), ""]
    return out


def html(report: Report, table, hbars, e, measured=lambda *keys: "") -> list[str]:
    """The section's report.html parts; ``table`` / ``hbars`` / ``e`` are reports/html.py's;
    ``measured(*keys)``: the disclosure holding a table's definitions (``definitions``)."""
    parts = ["<h2>Memory per rank</h2>",
             hbars("Memory per rank by category (each run's rank with the largest peak)",
                   bar_rows(report), "MiB", 2**20,
                   palette.legend(report.runs, [LABELS[c] for c in CATEGORIES]))]
    heads, rows = category_rows(report)
    parts += [table(heads, rows) if rows else "<p>No memory categories (foreign traces, or a "
              "record made before they were written).</p>"] + ([measured("memory_sources")] if rows else [])
    lines = peak_source_lines(report)
    if lines:
        parts.append("<ul>" + "".join(f"<li>{e(x)}</li>" for x in lines) + "</ul>")
    heads, rows = ratio_rows(report)
    if rows:
        parts += ["<h3>Ratio to DDP</h3>", table(heads, rows), measured("ratio")]
    heads, rows = sharding_rows(report)
    if rows:
        parts += ["<h3>Parameters per rank: what sharding predicts</h3>", table(heads, rows),
                  measured("sharding"),
                  "<ul>" + "".join(f"<li>{e(x)}</li>" for x in sharding_lines(report)) + "</ul>"]
    fits = fit_lines(report)
    if fits:
        parts += ["<h3>Will it fit</h3>", "<ul>" + "".join(f"<li>{e(x)}</li>" for x in fits) + "</ul>"]
    heads, rows = device_rows(report)
    if rows:
        parts += ["<h3>Peaks from the traces' [memory] events</h3>", table(heads, rows),
                  measured("device_memory")]
    for r in report.runs:
        if r.memory.snapshot_by_category:
            parts += [f"<p>CUDA allocator snapshot of {e(r.name)} (live blocks by category):</p>",
                      table(*snapshot_rows(r)), table(*snapshot_total_rows(r)),
                      "<p>Largest live allocations:</p>", table(*largest_rows(r))]
    heads, rows = rss_rows(report)
    if rows:
        col = palette.run_colors(report.runs)
        rss = [(f"{palette.run_label(r)} rank {m.rank}",
                [("process peak RSS", m.peak_rss_bytes or 0, col[r.name],
                  palette.SHADES["process peak RSS"])])
               for r in report.runs for m in r.memory.ranks]
        parts += ["<h3>Process RSS and the profiler window (shown apart)</h3>",
                  hbars("Process peak RSS per rank (the whole process, not the model)", rss, "MiB",
                        2**20, palette.legend(report.runs, ["process peak RSS"])),
                  table(heads, rows), measured("rss")]
    return parts
