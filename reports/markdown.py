"""report.md: the decision line, the verdict's details, then parity, memory, communication,
the ranking by step time and the remaining tables. Pure function of the report."""

from __future__ import annotations

import re
from typing import Any

from analyzer.contract.arms import settings_text
from analyzer.contract.report_types import Report, RunEntry
from analyzer.contract.text import show_bidi
from reports import armdiff, context
from reports import definitions as definitions_part
from reports import findings as findings_text
from reports import fmt, notes
from reports import hangs as hangs_section
from reports import memory as memory_section
from reports import pipeline as pipeline_section
from reports import projection as projection_section
from reports.decision import decision_input, decision_line, projected_lines
from reports.definitions import Cited, Definition, define
from reports.verdict import verdict

PERFETTO_HINT = "open in https://ui.perfetto.dev (Open trace file)"


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_SPECIAL = re.compile(r"([\\`*\[\]|~])")


def _underscores(m: re.Match) -> str:
    """A run of ``_`` kept when it sits between letters or digits (an intraword run can neither
    open nor close emphasis, CommonMark 0.31 section 6.2: ``all_reduce``, ``nccl__worker1``
    stay as written), else each ``_`` backslash-escaped."""
    s, i, j = m.string, m.start(), m.end()
    if i > 0 and j < len(s) and s[i - 1].isalnum() and s[j].isalnum():
        return m.group()
    return "\\_" * (j - i)


def escape(v: Any) -> str:
    """``str(v)`` as literal Markdown text, the same inside a table cell and outside one: every
    run of whitespace with a line break becomes one space (a newline would end a table row or
    start a block), C0/C1 control characters are dropped, bidirectional controls shown as their
    ``\\uXXXX`` escape (analyzer/contract/text.py), ``& < >`` become HTML entities (no
    tag, comment or entity of a trace name reaches a renderer), and ``\\ ` * _ [ ] | ~`` are
    backslash-escaped (CommonMark 0.31 section 2.4: any ASCII punctuation may be; ``|`` also
    inside GFM table cells, GFM spec 4.10; ``_`` only where it could open or close emphasis,
    ``_underscores``). Used for every string that comes from a trace, a manifest or a path:
    names, reasons, notes, paths, in and out of tables."""
    s = " ".join(str(v).splitlines())
    s = show_bidi(_CONTROL.sub("", s.replace("\t", " ")))  # analyzer/contract/text.py
    s = "".join(_ENTITIES.get(c, c) for c in s)
    return re.sub("_+", _underscores, _SPECIAL.sub(r"\\\1", s))


def table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured Markdown table; every header and cell through ``escape``."""
    lines = ["| " + " | ".join(escape(h) for h in headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def comparison_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """Headers and rows of the per-step comparison table (shared with the HTML renderer);
    step times are in ``ranking_rows``, the one place they are shown."""
    mem_head, mem = memory_section.peak_column(report.runs)  # a peak, or named the sum it is
    headers = ["run", "communication / step (per rank)", "exposed comm / step", "overlap",
               "data wait", mem_head, "peak RSS"]
    return headers, [[r.name, fmt.comm_kinds(r), fmt.ms(r.exposed_comm_ns),
                      fmt.pct(r.overlap_frac), fmt.data_supply(r.data),
                      m, fmt.mib(r.memory.peak_rss_bytes)]
                     for r, m in zip(report.runs, mem)]


REFERENCE = "reference"
"""What the ranking table and the plots call the single-device run: shown, never ranked."""


def ranking_rows(report: Report) -> tuple[list[str], list[list[Any]]]:
    """The ranking table (shared with html.py): ranked runs by their arm's position
    (``ranking.order``: the repeats of one arm share it), fastest first, then runs not ranked
    (``-``), then the single-device reference marked ``REFERENCE`` (declared arms have none:
    a single-device arm is ranked); median step time (``notes.STEP_TIME``) and speedup vs
    single; projections are left to their own section. Declared arms (``ranking.declared``): a
    column with each arm's declared settings."""
    rk = report.ranking
    pos = {n: i for i, n in enumerate(rk.order, 1)}
    ranked = sorted((r for r in report.runs if not r.is_reference and r.arm in pos),
                    key=lambda r: (pos[r.arm], (r.experiment or {}).get("repeat", 1), r.name))
    # projections: their own table (Projection at N ranks); their step times are one process's
    rest = [r for r in report.runs if r not in ranked and not r.is_reference
            and r.projection is None]
    refs = [r for r in report.runs if r.is_reference]
    rows = [[str(pos[r.arm]), r] for r in ranked] + [["-", r] for r in rest] + \
        [[REFERENCE, r] for r in refs]
    heads = ["rank", "run", "strategy and options", "parity", "median step time",
             "speedup vs single"]
    body = [[p, r.name, fmt.options(r), r.parity.status, fmt.ms(r.step_time_ns.median),
             fmt.speedup(r.speedup_vs_single)] for p, r in rows]
    if rk.declared:
        heads.insert(3, "declared settings")
        for row, (_, r) in zip(body, rows):
            row.insert(3, settings_text((r.experiment or {}).get("settings") or {}, keys=list(
                (r.experiment or {}).get("settings") or {})) or "-")
    return heads, body


COMPARISON_NOTE = (
    "Communication, exposed communication and overlap come from the traces: exposed = "
    "communication time not under computation; overlap = share of communication time "
    "under computation; data wait = share of step time spent fetching or waiting for input "
    "(DataLoader __next__ ranges and host-to-device copies) while neither computing nor "
    "communicating, all ranks and steps, with how the run was fed.")
CPU_COMPUTE_NOTE = (
    "On CPU traces computation is every main-thread op, including autograd ops inside "
    "which FSDP hooks wait for their all_gather; the FSDP prefetch section excludes that time.")
PARITY_RULE = (
    "Rule: per tensor, metrics are reduced across ranks (sharded tensors: sums summed, maxima "
    "maxed; replicated tensors: the worst rank). A tensor passes iff it has no NaN/inf and "
    "max |x - ref| <= atol + rtol * max |ref| (the max-norm form of "
    "torch.testing.assert_close, never stricter than it). The loss at each step (mean over "
    "ranks) passes iff |loss - ref| <= (step + 1) x (atol + rtol * |ref|), the divergence "
    "envelope. Every rank of the run must have "
    "written every tensor and the loss: a rank or a tensor missing is \"not verified\", a "
    "failure of the gate. Divergence is searched in activations (forward order), gradients, "
    "parameters after the first step, then loss.")
IDENTITY_NOTE = (
    "compute + exposed communication + data wait + other + idle = the rank's traced step, per "
    "rank and step (each instant counted once, in that order of precedence; the traced step "
    "per rank is in report.json ranks[].step_ns, the step time shown is under Ranking). ")
TAIL_NOTE = (
    "Of which last step's tail (GPU ranks): the part of idle that lies in the last profiled "
    "step after its last device work, per step (and in that step): the last step has no next "
    "step to end its window, so it runs to its first device work + its CPU ProfilerStep span, "
    "the idle a next step launching as it did would leave (report.json "
    "ranks[].last_step_tail_ns). HTA and TraceLens measure idle up to the last kernel and do "
    "not count it; idle minus it is theirs. No finding rests on it alone.")
BUSBW_NOTE = (
    "busbw from transfer time: the nccl-tests factors (all_reduce 2(n-1)/n, all_gather, "
    "reduce_scatter and all_to_all (n-1)/n, broadcast and send_recv 1) over the transfer time "
    "(the wait for the slowest rank left out, as it moves no data), the ranks' times combined "
    "before dividing as nccl-tests does: bytes x factor summed over ranks / transfer time "
    "summed over ranks, all profiled steps, measured instances only (\"-\" when none is "
    "measured, see Transfer and waiting); GB/s = 10^9 bytes per second. report.json keeps the "
    "busbw over whole durations as busbw_gbps. '-' also where no instance has both known bytes "
    "and a known group size (n): the factor needs n, and the trace does not always give it (see "
    "the group size rule under By process group and dtype).")
SPLIT_NOTE = (
    "Transfer and waiting: the same collective on every rank of its group is matched by "
    "process group, kind and order (on clocks aligned by the clock offset, see Time per rank); "
    "a rank's wait = from its start of the collective to the latest start among the group's "
    "ranks (waiting for the slowest rank, no data moves); transfer = the rest, from that latest "
    "start to its end. A match is accepted as one collective only when, on aligned clocks, "
    "the latest start is at most 50 µs after the earliest end (no rank leaves a collective "
    "before every rank entered it) and the ends lie within the shortest rank's duration + "
    "50 µs of each other (after the first rank has all the data the others need at most the "
    "rest of one transfer; 50 µs for timestamp rounding, completion latency and clock error). "
    "Not measured (neither wait nor transfer, \"-\" when no instance of the kind is): a "
    "collective no other rank was seen running (not matched), a match outside that bound "
    "(not one instance), or a rank whose clock offset is not measured (see the caveats). wait "
    "+ transfer + not measured = the collective's time on that rank, exactly. "
    "analyzer/analyses/commsplit.py, analyzer/analyses/clock.py.")


NOT_IN_TRACE = "not in trace"
"""A process group (or its ranks) the trace does not name: no Process Group Name / ID argument
on the kernel or its launching ops, and no single group in distributedInfo.pg_config."""
COMM_GROUP_HEADERS = ["run", "kind", "process group", "ranks", "group size", "dtype", "calls",
                      "time (sum)", "bytes", "busbw from transfer (GB/s)", "mesh dimension"]


def comm_group_rows(report: Report) -> list[list[Any]]:
    """Rows of the per (kind, process group, dtype) table (shared with the HTML renderer)."""
    return [[r.name, g.kind, g.pg or NOT_IN_TRACE, g.pg_ranks or NOT_IN_TRACE,
             g.group_size or "unknown", g.dtype or "unknown",
             fmt.count(g.count), fmt.ms(g.time_ns), fmt.data_bytes(g.bytes, g.unknown_bytes),
             fmt.num(g.transfer_busbw_gbps, ".3f"),
             f"{g.mesh_dim} ({g.mesh_dim_source})" if g.mesh_dim else "-"]  # "": older report.json
            for r in report.runs for g in r.comm_groups]


def mesh_runs(report: Report) -> list[RunEntry]:
    """The runs whose communication is shown per mesh dimension: any with more than one
    dimension, or on a mesh (a dimension named by torch's ``mesh_<name>`` description or by
    the manifest's mesh). (contract/schemas.py is not imported here: it brings pyarrow, which
    a cached report renders without, reports/cache.py.)"""
    return [r for r in report.runs
            if len(r.mesh_dims) > 1 or any(d.source in ("pg_desc", "manifest")
                                           and d.name not in ("world", "unknown")
                                           for d in r.mesh_dims)]


MESH_DIM_NOTE = (
    "Per mesh dimension: every collective's process group is one group of a DeviceMesh "
    "dimension, found from the group's description (torch's mesh_<name>: source pg_desc), "
    "else the run's manifest mesh (source manifest), else the group's ranks (source ranks: "
    "inferred_consecutive_n<k> = k consecutive ranks, inferred_stride<s>_n<k> = k ranks s "
    "apart); world = the default group; unknown = the trace does not name the group (a gloo "
    "trace without the tracer's process-group tags). Per rank (mean over the ranks that ran "
    "it), all profiled steps: calls; time = sum of durations; union = time with at least one "
    "of the dimension's collectives running (inside the step windows); exposed = the part of "
    "the union no computation overlaps; exposed share of step = the exposed time per profiled "
    "step over the traced step (both means over ranks): how much of a step waits on that "
    "dimension; bytes as nccl-tests counts them; busbw with the "
    "dimension's group size (nccl-tests factors), over whole durations and over transfer time; "
    "transfer, waiting for the slowest rank and not measured as in Transfer and waiting.")


def mesh_dim_rows(report: Report) -> Rows:
    """Per run and mesh dimension (``RunEntry.mesh_dims``, runs of ``mesh_runs``): the table
    of communication per mesh dimension (shared with html.py)."""
    return (["run", "dimension", "source", "group size", "groups", "kinds", "calls",
             "time (sum)", "union", "exposed", "exposed share of step", "bytes", "busbw (GB/s)",
             "busbw from transfer (GB/s)", "transfer", "waiting for slowest rank",
             "not measured"],
            [[r.name, d.name, d.source, d.group_size or "unknown",
              "-" if d.groups is None else d.groups, ", ".join(d.kinds), fmt.count(d.count),
              fmt.ms(d.time_ns), fmt.ms(d.union_ns), fmt.ms(d.exposed_ns),
              _step_share(d.exposed_ns_per_step, r),
              fmt.data_bytes(d.bytes, d.unknown_bytes), fmt.num(d.busbw_gbps, ".3f"),
              fmt.num(d.transfer_busbw_gbps, ".3f"), fmt.ms(d.transfer_ns), fmt.ms(d.wait_ns),
              fmt.ms(d.not_measured_ns)]
             for r in mesh_runs(report) for d in r.mesh_dims])


def _step_share(per_step_ns: float | None, run: RunEntry) -> str:
    """``per_step_ns`` (a rank's figure per profiled step, mean over ranks) over the run's
    traced step (``ranks[].step_ns``, mean over ranks): how much of a step it is."""
    steps = [k.step_ns for k in run.ranks if k.step_ns]
    if per_step_ns is None or not steps:
        return "-"
    return fmt.pct(per_step_ns / (sum(steps) / len(steps)))


def comm_split_rows(report: Report) -> Rows:
    """Per run, rank and kind: time, transfer and waiting for the slowest rank, per profiled
    step (shared with html.py)."""
    return (["run", "rank", "kind", "time / step (sum)", "transfer / step",
             "waiting for slowest rank / step", "not measured / step",
             "calls (all profiled steps)", "not matched", "not one instance"],
            [[r.name, c.rank, c.kind, fmt.ms(c.time_ns_per_step), fmt.ms(c.transfer_ns_per_step),
              fmt.ms(c.wait_ns_per_step), fmt.ms(c.not_measured_ns_per_step), c.count,
              c.unmatched, c.inconsistent]
             for r in report.runs for c in r.comm_ranks])


Rows = tuple[list[str], list[list[Any]]]
"""(headers, rows) of one table: markdown.py and html.py render the same rows."""


LOSS_NOTE = ("Loss per step: the run's loss (mean over ranks) and the baseline's at the same "
             "step, computed by one process on the whole batch with the same settings; the "
             "limit is the divergence envelope |loss - baseline| must stay within, (step + 1) x "
             "(atol + rtol x |baseline|), which grows with the step because each optimizer step "
             "can add one step's rounding (README \"Parity\").")


def loss_rows(report: Report) -> Rows:
    """The loss curve of every run, a row per (run, recorded step) (shared with html.py)."""
    rows = [[r.name, s.step, fmt.num(s.loss, ".6g"), fmt.num(s.ref, ".6g"),
             fmt.num(abs(s.loss - s.ref), ".2e"), fmt.num(s.limit, ".2e"),
             "yes" if abs(s.loss - s.ref) <= s.limit else "no"]
            for r in report.runs for s in r.parity.loss_curve]
    return ["run", "step", "loss", "baseline", "|diff|", "limit", "within"], rows


def parity_rows(report: Report) -> Rows:
    """The parity table: status, tolerance, figures, first divergence and why, per run."""
    rows = []
    for r in report.runs:
        p, fd = r.parity, r.parity.first_divergence
        rows.append([r.name, p.status, fmt.tolerance_line(p.tolerance),
                     fmt.num(p.max_grad_rel_l2), fmt.num(p.loss_max_rel_diff),
                     "-" if not fd else f"{fd.subject} (step {fd.step}): rel L2 "
                     f"{fmt.num(fd.rel_l2)}, max diff {fmt.num(fd.max_abs_diff)} > limit "
                     f"{fmt.num(fd.limit)}", p.reason])
    return (["run", "status", "tolerance", "max grad rel L2", "loss max rel diff",
             "first divergence", "why"], rows)


def rank_rows(report: Report) -> Rows:
    """Time per rank (mean per step), with each rank's clock offset; where a GPU rank is in the
    report, the idle of its last step after its last device work beside its idle
    (``RankFigures.last_step_tail_ns``, part of that idle: ``TAIL_NOTE``)."""
    tail = any(k.last_step_tail_ns is not None for r in report.runs for k in r.ranks)
    return (["run", "rank", "compute", "communication", "exposed comm", "overlap",
             "data wait", "other", "idle"] + (["of which last step's tail"] if tail else [])
            + ["clock offset"],
            [[r.name, k.rank, fmt.ms(k.compute_ns), fmt.ms(k.comm_ns),
              fmt.ms(k.exposed_comm_ns), fmt.pct(k.overlap_frac),
              f"{fmt.ms(k.data_wait_ns)} ({fmt.pct(k.data_wait_frac)})", fmt.ms(k.other_ns),
              fmt.ms(k.idle_ns)] + ([_tail(k)] if tail else [])
             + [fmt.ms(k.clock_offset_ns, ".3f")]
             for r in report.runs for k in r.ranks])


def _tail(k) -> str:
    """A rank's last-step tail as its share of the mean idle per step, and in its last step."""
    if k.last_step_tail_ns is None or not k.steps:
        return "-"
    return (f"{fmt.ms(k.last_step_tail_ns / k.steps)} ({fmt.ms(k.last_step_tail_ns)} in the "
            "last step)")


def comm_kind_rows(report: Report) -> Rows:
    """Communication by collective kind (per rank, mean per profiled step)."""
    return (["run", "kind", "profiled steps", "calls / step", "time / step (sum)",
             "transfer / step", "waiting for slowest rank / step", "not measured / step",
             "bytes / step", "busbw from transfer (GB/s)"],
            [[r.name, k, r.profiled_steps or "-", fmt.count(v.count_per_step),
              fmt.ms(v.time_ns_per_step), fmt.ms(v.transfer_ns_per_step),
              fmt.ms(v.wait_ns_per_step), fmt.ms(v.not_measured_ns_per_step),
              fmt.data_bytes(v.bytes_per_step, v.unknown_bytes),
              fmt.num(v.transfer_busbw_gbps, ".3f")]
             for r in report.runs for k, v in r.communication.items()])


def prefetch_rows(run: RunEntry) -> Rows:
    """A run's FSDP prefetch per (phase, unit)."""
    return (["phase", "unit", "issued as prefetch", "issued ahead (units, most)", "ranks gathered",
             "all_gather (mean duration)", "under computation", "ready before use (mean slack)",
             "ready before use (worst slack)"],
            [[u.phase, u.unit, fmt.pct(u.prefetched), fmt.count(u.ahead_units),
              fmt.count(u.group_size), fmt.ms(u.comm_ns), fmt.pct(u.hidden_frac),
              fmt.ms(u.slack_ns), fmt.ms(u.min_slack_ns)] for u in run.prefetch.units])


def prefetch_group_rows(report: Report, group: list[str]) -> Rows:
    """Runs that differ only in their prefetch settings, side by side; FSDP2 runs add their
    explicit prefetch depth as applied (``fsdp2_prefetch``: forward / backward)."""
    runs = [r for r in report.runs if r.name in group]
    depth = any("fsdp2_prefetch" in r.options for r in runs)

    def fsdp2(r) -> list[str]:
        d = r.options.get("fsdp2_prefetch")
        return [f"{d.get('forward')} / {d.get('backward')}" if isinstance(d, dict) else "-"] * depth

    return (["run", "backward_prefetch", "forward_prefetch"] + ["fsdp2_prefetch (forward / backward)"] * depth
            + ["median step", "under computation", "late all_gathers"],
            [[r.name, r.options.get("backward_prefetch"), r.options.get("forward_prefetch"), *fsdp2(r),
              fmt.ms(r.step_time_ns.median), fmt.pct(r.prefetch.hidden_frac if r.prefetch else None),
              _late(r.prefetch)] for r in runs])


def batch_shape(batch: dict) -> str:
    """The manifest's ``batch`` as the settings table shows it: ``global B x seq S x hidden H
    (per rank b)``, without ``x hidden`` where the hidden size is 0 (a custom model whose spec
    gives no size, tracer/manifest.py ``model_sizes``)."""
    hidden = batch.get("hidden")
    return (f"global {batch.get('global_batch')} x seq {batch.get('seq_len')}"
            f"{f' x hidden {hidden}' if hidden else ''} (per rank {batch.get('per_rank_batch')})")


def settings_rows(report: Report) -> Rows:
    """Recorded settings per run (manifest), or what the foreign traces tell."""
    rows = []
    for r in report.runs:
        s = r.settings
        if not s:
            ti = r.trace_info
            what = "incomplete run (no manifest.json)" if r.incomplete else "foreign traces"
            rows.append([r.name, what, ti.device_kind if ti else "-", "-", "-", "-",
                         f"rank from {', '.join((ti.rank_sources if ti else None) or ['-'])}"])
            continue
        v, d, b, la = s["versions"] or {}, s["device"] or {}, s["batch"] or {}, s["launch"] or {}
        rows.append([r.name, ", ".join(f"{k} {x}" for k, x in v.items() if x),
                     f"{d.get('type')} {d.get('name')}",
                     batch_shape(b), s["seed"],
                     fmt.precision_setting(s["precision"], s.get("training")),
                     f"{la.get('method')}, {r.world_size} rank(s), backend {r.backend}"])
    return ["run", "versions", "device", "batch shape", "seed", "precision and training",
            "launch"], rows


def drift_rows(report: Report) -> Rows:
    """Baseline drift: each run's baseline against the reference's."""
    rows = []
    for c in report.baseline_drift.comparisons if report.baseline_drift else []:
        if c.error:
            rows.append([c.old, c.new, "-", "-", f"not compared: {c.error}"])
            continue
        differ = "; ".join(f"{d['setting']} {d['old']} -> {d['new']}" for d in c.settings_differ)
        rows.append([c.old, c.new, differ or "-", c.expectation["why"],
                     ("OK " if c.ok else "DRIFT ") + c.verdict])
    return ["reference", "run", "settings that differ", "tolerance applied and why", "verdict"], rows


def definitions(report: Report) -> dict[str, Definition]:
    """Every definition a table of this report can cite, by key (shared with html.py): the
    texts of this module, notes.py, memory.py and pipeline.py, once each."""
    runs = report.runs
    cpu_fsdp = any(r.prefetch and r.device == "cpu" for r in runs)
    cpu_notes = list(dict.fromkeys(r.prefetch.note for r in runs if r.prefetch and r.prefetch.note))
    bubble = list(dict.fromkeys(r.pipeline.bubble_rule for r in runs if r.pipeline is not None))
    return {
        "parity": define("Parity rule", PARITY_RULE),
        "loss": define("Loss limit", LOSS_NOTE),
        "split": define("Transfer and waiting", SPLIT_NOTE),
        "busbw": define("busbw from transfer time", BUSBW_NOTE),
        "groups": define("Per process group and dtype", notes.COMM_GROUPS, raw=True),
        "mesh": define("Per mesh dimension", MESH_DIM_NOTE),
        "step_time": define("Step time", notes.STEP_TIME),
        "speedup": define("Speedup vs single", SPEEDUP_NOTE),
        "ranking": define("Ranking rule", f"Rule: {report.ranking.rule}"),
        "windows": define("Time windows and shares", notes.windows(runs) + " " + COMPARISON_NOTE
                          + (" " + CPU_COMPUTE_NOTE if cpu_fsdp else "")),
        "clock": define("Clock offset", notes.CLOCK_OFFSET, raw=True),
        "identity": define("Step identity", IDENTITY_NOTE + notes.OTHER_IDLE,
                           TAIL_NOTE if any(k.last_step_tail_ns is not None
                                            for r in runs for k in r.ranks) else ""),
        "bubble": define("Pipeline bubble", *bubble),
        "pairs": define("Send and recv between stages", pipeline_section.PAIR_NOTE),
        "prefetch_cpu": define("FSDP prefetch on CPU", *cpu_notes),
        "units": define("FSDP units", notes.UNIT_NAMES, raw=True),
        "slack": define("Prefetch slack", notes.SLACK, raw=True),
        **memory_section.definitions(report)}


SPEEDUP_NOTE = ("Speedup vs single = the single-device run's median step time / the run's, shown "
                "only for runs comparable with it (parity passed, same recorded settings); '-' "
                "otherwise.")


def measured_part(cited: Cited) -> list[str]:
    """report.md's closing part: every definition ``cited`` holds, under its own heading (the
    anchor the tables link to)."""
    out = [f"## {definitions_part.PART}", "",
           "Each table above links here; each definition and rule is written once.", ""]
    for d in cited:
        out += [f"### {d.title}", ""]
        for p in d.paragraphs:
            out += [p if d.raw else escape(p), ""]
    return out


def link_line(cited: Cited, *defs: Definition) -> str:
    """``How it is measured: [Parity rule](#parity-rule).``: a table's link to its entries of
    the closing part (recorded in ``cited``)."""
    return "How it is measured: " + ", ".join(
        f"[{escape(d.title)}](#{d.anchor})" for d in cited.cite(*defs)) + "."


DIFFERS = "What differs between the arms (counted, not timed: no noise in it):"


def first_screen(report: Report) -> list[str]:
    """The first lines of report.md: title, the decision line, what differs between declared
    arms (reports/armdiff.py), the context the figures were measured in (reports/context.py),
    the findings to act on (at most ``findings_text.TOP``, each one line with its evidence,
    cause and action; the rest counted), then the verdict's details."""
    out = ["# paritytrace report", "",
           f"**Decision:** {escape(decision_line(decision_input(report)))}", ""]
    out += [x for line in projected_lines(report) for x in (f"**Projected** {escape(line)}", "")]
    if diff := armdiff.lines(report):
        out += [f"**{DIFFERS}**", ""] + [f"- {escape(x)}" for x in diff] + [""]
    ctx = context.lines(report)
    if ctx:
        out += ["**Context:**", ""] + [f"- {escape(x)}" for x in ctx] + [""]
    out += [escape(findings_text.head(report)), ""]
    lines, rest = findings_text.first_screen(report)
    out += [f"{i}. {escape(x)}" for i, x in enumerate(lines, 1)]
    if lines:
        out.append("")
    if rest:
        out += [f"{'Also' if lines else 'Folded:'} {escape(rest)}: "
                "[Findings in full](#findings-in-full).", ""]
    out += [f"- {escape(s)}" for s in verdict(report)] + [""]
    return out


def caveats_part(report: Report) -> list[str]:
    """The "Caveats" section: each run's caveats, one bullet each (none: [])."""
    items = [f"- {escape(r.name)}: {escape(c)}" for r in report.runs for c in r.caveats]
    return ["## Caveats", "", *items, ""] if items else []


def render(report: Report) -> str:
    """The whole report.md text: every string from a trace, a manifest or a path through
    ``escape``. Order: the first screen (decision, top findings, the verdict's details), Parity,
    Memory, Communication, the ranking by step time, the remaining tables, the findings in full,
    then "How each figure is measured" (every definition, once; each table links to its own).
    Long because it lays out the report's sections in reading order, a few lines each, sharing
    ``cited`` (the definitions in the order the tables cite them): read whole, the order is
    the report's, the one reports/html.py ``render`` follows."""
    runs = report.runs
    defs = definitions(report)
    cited = Cited()

    def link(*keys: str) -> str:
        return link_line(cited, *(defs[k] for k in keys))

    out = first_screen(report)
    out += hangs_section.markdown(report, table, escape)  # issue 30: a hung record's cause first
    out += ["## Parity", "", table(*parity_rows(report)), "", link("parity"), ""]
    heads, rows = loss_rows(report)
    if rows:
        out += ["### Loss per step", "", table(heads, rows), "", link("loss"), ""]

    out += memory_section.markdown(report, table, escape,
                                   lambda *keys: link_line(cited, *(defs[k] for k in keys)))

    out += ["## Communication", ""]
    if fake := notes.projection_times(runs):
        out += [escape(fake), ""]
    heads, rows = comm_split_rows(report)
    out += ["### Transfer and waiting for the slowest rank (per rank, mean per profiled step)", "",
            table(heads, rows) if rows else "No collectives found.", "", link("split"), ""]
    heads, rows = comm_kind_rows(report)
    if rows:
        out += ["### By collective kind (per rank, mean per profiled step)", "",
                table(heads, rows), "", link("busbw"), ""]
    rows = comm_group_rows(report)
    if rows:
        out += ["### By process group and dtype (per rank, all profiled steps)", "",
                table(COMM_GROUP_HEADERS, rows), "", link("groups"), ""]
    heads, rows = mesh_dim_rows(report)
    if rows:
        out += ["### Communication per mesh dimension (per rank, all profiled steps)", "",
                table(heads, rows), "", link("mesh"), ""]

    rk = report.ranking
    out += ["## Ranking by step time", ""]
    if rk.status != "ranked":
        out += [f"**Withheld.** {escape(rk.reason)}", ""]
    out += [table(*ranking_rows(report)), ""]
    out += [f"- {escape(p.sentence)}" for p in rk.pairs] + ([""] if rk.pairs else [])
    out += ["Step-time source: " + escape("; ".join(notes.step_sources([r for r in runs if r.projection is None]))) + ".", "",
            link("step_time", "speedup", "ranking"), ""]
    out += projection_section.markdown(report, table, escape)
    out += ["## Time per step (per rank, mean per profiled step)", "",
            table(*comparison_rows(report)), ""]
    out += [escape(fake), ""] if fake else []
    out += [link("windows"), ""]

    heads, rows = rank_rows(report)
    out += ["## Time per rank (mean per step)", "", table(heads, rows) if rows else "No traces.",
            "", link("clock", "identity"), ""]
    out += pipeline_section.markdown(report, table, escape, link("bubble", "pairs")
                                     if pipeline_section.runs(report) else "")

    pf_runs = [r for r in runs if r.prefetch and r.projection is None]  # fake all_gathers
    if pf_runs:
        out += ["## FSDP prefetch", ""]
        for r in pf_runs:
            out += [escape(notes.prefetch_sentence(r)), "", table(*prefetch_rows(r)), ""]
        for group in report.prefetch_comparisons:
            out += ["Prefetch settings side by side (runs differ only in them):", "",
                    table(*prefetch_group_rows(report, group)), ""]
        keys = (["prefetch_cpu"] if defs["prefetch_cpu"].paragraphs else []) + ["units", "slack"]
        out += [link(*keys), ""]

    out += ["## Recorded settings", "", table(*settings_rows(report)), ""]
    if report.settings_warnings:
        out += ["The settings that differ are named under Ranking above.", ""]
    bd = report.baseline_drift
    if bd:
        out += ["## Baseline drift", ""]
        if not bd.comparisons:  # declared arms, each checked against its own baseline
            out += [escape(f"{bd.note[0].upper()}{bd.note[1:]}."), ""]
        else:
            out += [escape(f"{bd.note[0].upper()}{bd.note[1:]}. Reference: {bd.reference}."), "",
                    table(*drift_rows(report)), "",
                    "Per-tensor figures: `analyzer drift REFERENCE RUN`.", ""]
    for w in report.warnings:
        out += [f"Note: {escape(w)}", ""]

    out += caveats_part(report)
    out += ["## Trace files", "", f"Each is a Chrome trace; {PERFETTO_HINT}.", ""]
    out += [f"- {escape(r.name)}: {escape(t)}" for r in runs for t in r.traces]
    out.append("")
    found = findings_text.ordered(report)
    if found:
        out += ["## Findings in full", "",
                "Each finding's evidence with its place in report.json (a JSON pointer) and the "
                "rule that established its cause.", ""]
        for i, f in enumerate(found, 1):
            first, *rest = findings_text.full(f)
            out += [f"{i}. {escape(first)}"] + [f"   - {escape(x)}" for x in rest]
        out.append("")
    out += measured_part(cited)
    return "\n".join(out)


def _late(p) -> str:
    """Late all_gathers of a run's prefetch summary, with those not measured; "-" without one."""
    if p is None:
        return "-"
    return f"{p.late} (+{p.unknown} not measured)" if p.unknown else str(p.late)
