"""Write docs/report-reference.md: every report.json field, its type, unit and meaning.

Generated from the contract itself (analyzer/contract/report_types.py and tolerance.py): the
structs reachable from ``Report``, their fields in declaration order, each field's docstring
(the string under it), the struct's docstring above its table, and the unit read from the name
(the project's rule: ``_ns``, ``_bytes``, ``_gbps``, ``_frac``, ``_ms``; the fields of a
``..._ns`` object are ns). Fields the contract leaves undocumented get their meaning from
``NOTES`` below. Usage: ``PYTHONPATH=. python3 scripts/report_reference.py`` (``--check``:
exit 1 when the file is out of date; tests/test_docs.py runs the same comparison).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
import types
import typing
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "docs" / "report-reference.md"

NOTES = {
    "Report.schema_version": "report.json's schema version (`REPORT_SCHEMA_VERSION`).",
    "Report.root": "The input the report was made from (the `analyzer report DIR` argument).",
    "Report.layout": "What the input was: `root` (a traces root of run directories), `run` (one "
                     "run directory) or `foreign` (a folder of profiler traces, or one trace file).",
    "Report.runs": "One entry per run, in the report's order.",
    "Report.ranking": "The ranking by step time, or why it is withheld.",
    "Report.settings_warnings": "Settings that differ between runs and keep them from being ranked together.",
    "Report.prefetch_comparisons": "Groups (>= 2 run names) of one FSDP strategy whose options differ only in the prefetch settings: compared side by side.",
    "Report.baseline_drift": "Baseline drift between runs of different versions, device or precision; None when all agree.",
    "Report.warnings": "Report-wide warnings (shown in the verdict).",
    "RunEntry.name": "The run's name (its run directory's name; `ddp.r2` for a repeat).",
    "RunEntry.path": "The run directory or trace folder, as given.",
    "RunEntry.strategy": "The manifest's strategy (single, ddp, fsdp, fsdp2, hsdp, fsdp2_tp, pp); `unknown` for foreign traces.",
    "RunEntry.options": "The strategy's options from the manifest (bucket_cap_mb, sharding_strategy, ...).",
    "RunEntry.fault": "The `--fault` canary the run was recorded with; None for none.",
    "RunEntry.world_size": "Ranks of the run (manifest, else the traces).",
    "RunEntry.backend": "gloo or nccl (manifest, else the traces' distributedInfo).",
    "RunEntry.device": "cpu or cuda.",
    "RunEntry.settings": "The manifest's settings that decide whether runs are one experiment (versions, device, batch, seed, precision, training, data, launch).",
    "RunEntry.parity": "The run's parity verdict against the single-device baseline.",
    "RunEntry.traces": "The run's trace files.",
    "RunEntry.step_time_ns": "Step times of the profiled steps: the slowest rank's time per step (docs/method.md, Ranking by step time).",
    "RunEntry.memory": "Memory per rank by category, peaks and the fit line.",
    "RunEntry.communication": "Per collective kind (all_gather, reduce_scatter, all_reduce, ...): count, time, bytes, busbw.",
    "RunEntry.comm_groups": "Per (kind, process group, dtype).",
    "RunEntry.profiled_steps": "Profiled steps per rank in the traces.",
    "RunEntry.overlap_frac": "Share of communication time under computation, mean over ranks and steps.",
    "RunEntry.exposed_comm_ns": "Exposed communication (not under computation) per profiled step, mean over ranks.",
    "RunEntry.data": "The data supply and whether the run is input-bound.",
    "RunEntry.ranks": "Per rank: the breakdown of a mean profiled step.",
    "RunEntry.prefetch": "FSDP prefetch per unit; None for runs without FSDP all_gathers.",
    "RunEntry.steps": "Per profiled step: the breakdown, mean over ranks.",
    "RunEntry.timeline": "One rank's first profiled step as compute / communication intervals (the report's timeline).",
    "RunEntry.trace_info": "How the traces were read: whole-trace mode, rank sources, missing ranks, device kind, warnings.",
    "RunEntry.incomplete": "A run directory without manifest.json analysed under `--allow-incomplete` (not ranked).",
    "RunEntry.caveats": "Caveats shown in the verdict (clock offsets not resolved, matches that are not one instance, ...).",
    "RunEntry.notes": "Notes on what was read and left out (steps, device work without a launch, ...).",
    "RunEntry.speedup_vs_single": "The single-device run's median step time / this run's.",
    "Parity.status": "`pass`, `fail`, `not_recorded` (no numerics: foreign traces, or some missing) or `reference` (the single run).",
    "Parity.reason": "Why, in one sentence.",
    "Parity.tolerance": "The tolerance applied and its source.",
    "Parity.max_grad_rel_l2": "Largest relative L2 difference of a first-step gradient against the baseline.",
    "Parity.loss_max_rel_diff": "Largest relative difference of the loss against the baseline over the recorded steps.",
    "Parity.first_divergence": "The first check that failed; None when none did.",
    "Parity.failed_checks": "The first 10 failed tensor checks.",
    "Parity.loss_curve": "The loss of every recorded step beside the baseline's.",
    "FirstDivergence.tensor": "The tensor's name (FQN, or `loss`).",
    "FirstDivergence.kind": "activation, grad, param or loss.",
    "FirstDivergence.step": "The step of the check (0 for tensors; the loss's step).",
    "FirstDivergence.rel_l2": "Relative L2 difference against the baseline.",
    "FirstDivergence.max_abs_diff": "Largest absolute difference against the baseline.",
    "FirstDivergence.limit": "The limit max_abs_diff had to stay within: atol + rtol x max |ref| (loss: the divergence envelope).",
    "FirstDivergence.nonfinite": "NaN / inf values found.",
    "FirstDivergence.tolerance": "The tolerance applied.",
    "FirstDivergence.subject": "The check in words (`grad layers.0.attn.weight`, `the loss`).",
    "FailedCheck.kind": "activation, grad, param or loss.",
    "FailedCheck.tensor": "The tensor's name.",
    "FailedCheck.step": "The step of the check.",
    "FailedCheck.rel_l2": "Relative L2 difference.",
    "FailedCheck.max_abs_diff": "Largest absolute difference.",
    "FailedCheck.limit": "The limit it exceeded.",
    "LossStep.step": "The step.",
    "LossStep.loss": "The run's loss, mean over ranks.",
    "LossStep.ref": "The baseline's loss at the same step.",
    "LossStep.limit": "(step + 1) x (atol + rtol x |ref|), the divergence envelope.",
    "StepTime.median": "Median step time.",
    "StepTime.p90": "90th percentile (linear interpolation).",
    "StepTime.n": "Profiled steps counted.",
    "StepTime.min": "Shortest step.",
    "StepTime.max": "Longest step.",
    "StepTime.source": "Where the step times come from (steps.parquet wall time, or the traces' step windows).",
    "Memory.peak_rss_bytes": "Largest process RSS of a rank (the whole process: torch, Python, libraries).",
    "Memory.peak_allocated_bytes": "The largest per-rank peak (source: `peak_source`).",
    "Memory.peak_reserved_bytes": "The largest per-rank reserved peak (CUDA; None when not known).",
    "Memory.peak_source": "Where `peak_allocated_bytes` comes from.",
    "Memory.ranks": "Per rank: steps.parquet's peaks.",
    "Memory.by_category": "Rows {rank, category, bytes} from memory_categories.parquet.",
    "Memory.devices": "The traces' `[memory]` peaks per device.",
    "Memory.snapshot_by_category": "CUDA allocator snapshot: live blocks by the snapshot's category.",
    "Memory.snapshot_totals": "CUDA allocator snapshot totals per rank.",
    "Memory.largest": "The largest live blocks of the CUDA allocator snapshot.",
    "Memory.fit": "The fits / does not fit line of `--device-memory`; None without it.",
    "MemoryRank.rank": "The rank.",
    "MemoryRank.peak_rss_bytes": "Peak process RSS.",
    "MemoryRank.profiler_allocated_peak_bytes": "Peak allocated inside the profiler's window (misses what was allocated before).",
    "MemoryRank.cuda_max_allocated_bytes": "`torch.cuda.max_memory_allocated` over the steps after step 0.",
    "MemoryRank.cuda_max_reserved_bytes": "`torch.cuda.max_memory_reserved` over the same steps.",
    "MemoryCategory.rank": "The rank.",
    "MemoryCategory.category": "parameters, gradients, optimizer_state, activations or peak.",
    "MemoryCategory.bytes": "Bytes of the distinct storages (views once, padding counted).",
    "MemoryCategory.reserved_bytes": "CUDA peak row only: the reserved peak.",
    "MemoryCategory.source": "How it was measured.",
    "DeviceMemory.rank": "The rank.",
    "DeviceMemory.device": "The device, e.g. `cuda:0`.",
    "DeviceMemory.events": "`[memory]` events read.",
    "DeviceMemory.peak_allocated_bytes": "Peak of \"Total Allocated\".",
    "DeviceMemory.peak_reserved_bytes": "Peak of \"Total Reserved\"; None when the events do not say.",
    "DeviceMemory.start_bytes": "Live bytes assumed before the first event.",
    "DeviceMemory.source": "How the peak was found.",
    "SnapshotCategory.rank": "The rank.",
    "SnapshotCategory.category": "The snapshot's own category.",
    "SnapshotCategory.blocks": "Live blocks.",
    "SnapshotCategory.bytes": "Their bytes.",
    "SnapshotTotal.rank": "The rank.",
    "SnapshotTotal.allocated_bytes": "Live blocks' bytes.",
    "SnapshotTotal.reserved_bytes": "All blocks' bytes.",
    "SnapshotTotal.held_bytes": "Parameters + optimizer state (what lives between steps).",
    "SnapshotTotal.agrees": "held <= allocated <= peak and reserved <= peak reserved.",
    "Allocation.rank": "The rank.",
    "Allocation.block_size_bytes": "The block's size.",
    "Allocation.requested_size_bytes": "The size requested (None when not said).",
    "Allocation.category": "The snapshot's category.",
    "Allocation.top_frame": "The innermost user frame that allocated it.",
    "MemoryFit.device_bytes": "`--device-memory`.",
    "MemoryFit.needed_bytes": "The largest rank's peak (reserved when known, else allocated); None: no figure.",
    "MemoryFit.basis": "Which figure `needed_bytes` is.",
    "MemoryFit.spare_bytes": "device_bytes - needed_bytes (negative: short by that much).",
    "ShardingPrediction.formula": "The prediction in symbols (1/W, 1/S, ((N - N_tp) + N_tp/T)/dp of N, ...).",
    "ShardingPrediction.ratio": "The largest rank's share of the N parameters.",
    "ShardingPrediction.largest_rank": "The rank the ratio is of.",
    "ShardingPrediction.exact": "Every rank's padded figure is known (else each share is a lower bound).",
    "ShardingPrediction.basis": "Why the figures are exact or lower bounds.",
    "ShardingPrediction.bytes_per_element": "4 (fp32 parameters).",
    "ShardingPrediction.ranks": "Per rank: prediction beside measurement.",
    "ShardingRank.rank": "The rank.",
    "ShardingRank.measured_bytes": "memory_categories.parquet `parameters` of the rank.",
    "ShardingRank.gradients_measured_bytes": "memory_categories.parquet `gradients` of the rank.",
    "ShardingRank.optimizer_state_measured_bytes": "memory_categories.parquet `optimizer_state` of the rank.",
    "CommKind.count": "Calls per rank, all profiled steps.",
    "CommKind.time_ns": "Sum of durations per rank, all profiled steps.",
    "CommKind.bytes": "nccl-tests bytes per rank (known instances); None when none is known.",
    "CommKind.busbw_gbps": "Bus bandwidth from the whole duration (nccl-tests factors), over the ranks.",
    "CommKind.count_per_step": "Calls per profiled step.",
    "CommKind.time_ns_per_step": "Sum of durations per profiled step.",
    "CommKind.bytes_per_step": "Bytes per profiled step.",
    "CommKind.unknown_bytes": "Instances whose bytes the trace does not tell (all ranks).",
    "CommKind.transfer_ns_per_step": "Transfer time per profiled step.",
    "CommKind.wait_ns_per_step": "Waiting for the slowest rank per profiled step.",
    "CommKind.not_measured_ns_per_step": "Time not measured (neither wait nor transfer) per profiled step.",
    "CommGroup.kind": "Collective kind.",
    "CommGroup.pg": "Process group name; \"\" when the trace does not say.",
    "CommGroup.pg_ranks": "The group's ranks as the trace writes them; \"\" when not said.",
    "CommGroup.group_size": "The group's size; None when unknown.",
    "CommGroup.dtype": "The reduction's dtype; \"\" when not said.",
    "CommGroup.count": "Calls per rank of the group.",
    "CommGroup.time_ns": "Sum of durations per rank of the group.",
    "CommGroup.bytes": "nccl-tests bytes per rank (known instances).",
    "CommGroup.unknown_bytes": "Instances of unknown bytes.",
    "CommGroup.busbw_gbps": "Bus bandwidth with the group's size, whole duration.",
    "CommRank.rank": "The rank.",
    "CommRank.kind": "Collective kind.",
    "CommRank.count": "Calls, all profiled steps.",
    "CommRank.time_ns": "Sum of durations = transfer + wait + not measured.",
    "CommRank.transfer_ns": "From the group's latest start to the end, measured instances.",
    "CommRank.wait_ns": "From the rank's start to the group's latest start, measured instances.",
    "CommRank.unmatched": "Instances with no match on another rank with a usable clock.",
    "CommRank.not_measured_ns": "Time in instances not measured.",
    "CommRank.inconsistent": "Matched instances outside the one-instance bound.",
    "CommRank.measured": "Instances measured.",
    "CommRank.time_ns_per_step": "time_ns per profiled step.",
    "CommRank.transfer_ns_per_step": "transfer_ns per profiled step.",
    "CommRank.wait_ns_per_step": "wait_ns per profiled step.",
    "CommRank.not_measured_ns_per_step": "not_measured_ns per profiled step.",
    "MeshDimComm.group_size": "The dimension's group size; None when unknown.",
    "MeshDimComm.pgs": "The dimension's process groups.",
    "MeshDimComm.kinds": "Collective kinds on the dimension.",
    "MeshDimComm.n_ranks": "Ranks that ran any of them.",
    "MeshDimComm.count": "Calls per rank.",
    "MeshDimComm.time_ns": "Sum of durations per rank.",
    "MeshDimComm.union_ns": "Time with at least one of the dimension's collectives running, per rank.",
    "MeshDimComm.exposed_ns": "The part of union_ns no computation overlaps, per rank.",
    "MeshDimComm.time_ns_per_step": "time_ns per profiled step.",
    "MeshDimComm.union_ns_per_step": "union_ns per profiled step.",
    "MeshDimComm.exposed_ns_per_step": "exposed_ns per profiled step.",
    "MeshDimComm.bytes": "nccl-tests bytes (known instances).",
    "MeshDimComm.unknown_bytes": "Instances of unknown bytes.",
    "MeshDimComm.busbw_gbps": "Bus bandwidth with the dimension's group size, whole duration.",
    "MeshDimComm.transfer_busbw_gbps": "Bus bandwidth from transfer time.",
    "MeshDimComm.transfer_ns": "Transfer time per rank (as CommKind's).",
    "MeshDimComm.wait_ns": "Waiting for the slowest rank per rank.",
    "MeshDimComm.not_measured_ns": "Time not measured per rank.",
    "DataSupply.source": "memory or loader (the manifest's `data`); None for foreign traces.",
    "DataSupply.workers": "DataLoader worker processes (`--data-workers`).",
    "DataSupply.pin_memory": "Pinned memory (CUDA).",
    "DataSupply.sample_cost_ms": "`--data-sample-cost-ms`: the artificial cost per sample.",
    "DataSupply.sampler": "The sampler.",
    "DataSupply.threshold_frac": "The input-bound threshold: 0.20 of step time.",
    "DataSupply.data_wait_frac": "Data wait / step time over all ranks and steps.",
    "DataSupply.worst_rank": "The rank that waited most for data.",
    "DataSupply.worst_rank_frac": "Its data wait / its step time.",
    "DataSupply.worst_rank_exposed_comm_frac": "Its exposed communication / its step time.",
    "DataSupply.input_bound": "worst_rank_frac >= threshold_frac.",
    "DataSupply.input_bound_steps": "Steps over the threshold.",
    "DataSupply.steps": "Steps considered.",
    "RankFigures.rank": "The rank.",
    "RankFigures.steps": "Profiled steps of the rank.",
    "RankFigures.step_ns": "Step time (device window).",
    "RankFigures.compute_ns": "Computation.",
    "RankFigures.comm_ns": "Communication (union of its collectives' intervals).",
    "RankFigures.exposed_comm_ns": "Communication not under computation.",
    "RankFigures.data_wait_ns": "Data wait, neither computing nor communicating.",
    "RankFigures.other_ns": "Device activity of other kinds (memcpy, sync, work of no step).",
    "RankFigures.idle_ns": "No device activity: compute + exposed + data wait + other + idle = step.",
    "RankFigures.overlap_frac": "Share of communication under computation.",
    "RankFigures.data_wait_frac": "data_wait_ns / step_ns.",
    "RankFigures.input_bound_steps": "Steps with data wait at or over the threshold.",
    "StepBar.step": "The step number.",
    "StepBar.step_ns": "Step time.",
    "StepBar.compute_ns": "Computation.",
    "StepBar.exposed_comm_ns": "Exposed communication.",
    "StepBar.data_wait_ns": "Data wait.",
    "StepBar.other_ns": "Other device activity.",
    "StepBar.idle_ns": "Idle.",
    "Timeline.rank": "The rank shown.",
    "Timeline.step": "Its first profiled step.",
    "Timeline.step_ns": "That step's time.",
    "Timeline.intervals": "Merged intervals of the step.",
    "Interval.lane": "compute or comm.",
    "Interval.kind": "The collective kind (comm lane) or compute.",
    "Interval.start_ns": "Start, from the step's start.",
    "Interval.end_ns": "End, from the step's start.",
    "TraceInfo.whole_trace_mode": "No ProfilerStep: the whole trace is step 0.",
    "TraceInfo.rank_sources": "Where each rank number came from (distributedInfo, file name, single file).",
    "TraceInfo.missing_ranks": "Ranks of the world size with no trace.",
    "TraceInfo.device_kind": "cpu or cuda, from the traces.",
    "TraceInfo.trace_warnings": "What the decoder skipped or replaced, counted.",
    "Prefetch.all_gathers": "FSDP all_gathers, all ranks and profiled steps.",
    "Prefetch.prefetched": "Those issued before the computation needing them started.",
    "Prefetch.comm_ns": "Their communication time.",
    "Prefetch.hidden_ns": "The part under computation.",
    "Prefetch.hidden_frac": "hidden_ns / comm_ns.",
    "Prefetch.late": "All_gathers that finished after their consumer was ready (negative slack).",
    "Prefetch.unknown": "All_gathers whose slack could not be measured (no consumer found).",
    "Prefetch.wait_ns": "Time the compute stream waited for late all_gathers.",
    "Prefetch.labels": "Which labels named the units (FSDP2 module FQNs, FSDP1 `#k`).",
    "Prefetch.note": "A note on how the units were read; None when there is nothing to say.",
    "Prefetch.units": "Per (phase, unit).",
    "PrefetchUnit.phase": "forward or backward.",
    "PrefetchUnit.unit": "FSDP2: the module's FQN (`(root)`); FSDP1: `#k`, the k-th all_gather of the phase.",
    "PrefetchUnit.n": "All_gathers of the unit.",
    "PrefetchUnit.prefetched": "Share issued before the computation needing them.",
    "PrefetchUnit.comm_ns": "Mean communication time.",
    "PrefetchUnit.hidden_frac": "Share of it under computation.",
    "PrefetchUnit.slack_ns": "Mean time between the all_gather's end and its consumer's ready time (negative: the compute waited).",
    "PrefetchUnit.min_slack_ns": "The smallest slack.",
    "PipelineStage.stage": "The stage.",
    "PipelineStage.ranks": "Its ranks.",
    "PipelineStage.rank_steps": "Rank-steps averaged.",
    "PipelineStage.step_ns": "Step time.",
    "PipelineStage.compute_ns": "Computation.",
    "PipelineStage.bubble_ns": "exposed_comm_ns + idle_ns of the breakdown.",
    "PipelineStage.bubble_frac": "bubble / step time over the stage's ranks and steps.",
    "Pipeline.stages": "P, the pipeline's pp ranks (stages when V = 1).",
    "Pipeline.microbatches": "M; None when not known.",
    "Pipeline.schedule": "--pp-schedule: gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zbv, dualpipev.",
    "Pipeline.dp": "Data-parallel ranks per stage.",
    "Pipeline.ideal_bubble_frac": "The schedule's ideal bubble share: (P - 1) / (M + P - 1) for gpipe / 1f1b, "
                                  "(P - 1) / (V M + P - 1) interleaved-1f1b / looped-bfs, (P - 1) / (3 V M + P - 1) "
                                  "interleaved-zb, 0 zbv, None dualpipev (no closed form).",
    "Pipeline.ideal_source": "The formula's source (analyzer/analyses/pipeline.py IDEAL_BUBBLES).",
    "Pipeline.virtual_stages": "V, stages per pp rank (1 for gpipe / 1f1b and runs before issue 45).",
    "Pipeline.schedule_class": "The torch.distributed.pipelining class the run used; None before issue 45.",
    "Pipeline.bubble_rule": "How the measured bubble is computed.",
    "Pipeline.per_stage": "Per stage.",
    "Pipeline.pairs": "Per stage pair.",
    "PipelinePair.src_stage": "Sending stage (-1: not known).",
    "PipelinePair.dst_stage": "Receiving stage (-1: not known).",
    "PipelinePair.peer_source": "peer, mesh or unknown.",
    "PipelinePair.calls": "Calls per profiled step.",
    "PipelinePair.sends": "Sends per profiled step.",
    "PipelinePair.recvs": "Recvs per profiled step.",
    "PipelinePair.send_bytes": "Bytes sent per profiled step.",
    "PipelinePair.recv_bytes": "Bytes received per profiled step.",
    "PipelinePair.time_ns": "Time per profiled step.",
    "PipelinePair.send_ns": "Send time per profiled step.",
    "PipelinePair.recv_ns": "Recv time per profiled step.",
    "StragglerCause.rank": "The rank its peers wait for.",
    "StragglerCause.kind": "The collective kind.",
    "StragglerCause.times_last": "Measured instances it started last.",
    "StragglerCause.late_ns": "Sum of their start skews: what the others waited.",
    "StragglerCause.split_ns": "late_ns split into device_compute, host_delay, data_wait, own_collective, late_step_start (it entered the step after the first rank), unexplained.",
    "StragglerCause.cause": "The part explaining at least CAUSE_THRESHOLD (0.8) of late_ns; None: cause not established.",
    "StragglerCause.explained_frac": "The share of late_ns the cause explains.",
    "StragglerCause.rule": "How the cause was found.",
    "Ranking.status": "ranked or withheld.",
    "Ranking.order": "The arms, fastest first (the reference left out).",
    "Ranking.reason": "Why withheld, or the rule's outcome.",
    "Ranking.rule": "The ranking rule in words.",
    "Ranking.noise": "Whether the order is a basis for a decision.",
    "Ranking.pairs": "Every two arms.",
    "Ranking.arms": "One entry per strategy of the ranked experiment.",
    "Ranking.experiment": "The experiment id ranked; None for older records.",
    "Ranking.reference": "The single-device arm.",
    "Ranking.descriptive": "Runs outside the experiment, in the tables only.",
    "Noise.cpu": "The runs were recorded on CPU (timings carry +-30-50 % noise).",
    "Noise.close_pairs": "[faster, slower, ratio - 1, why] per neighbour pair within noise.",
    "Noise.decisive": "No neighbour pair is within noise.",
    "Pair.faster": "The arm with the lower median.",
    "Pair.slower": "The other.",
    "Pair.ratio": "slower's median step time / faster's (>= 1).",
    "Pair.ci_low": "Lower end of the 95 % interval of the ratio.",
    "Pair.ci_high": "Upper end.",
    "Pair.method": "How the interval was computed (hierarchical bootstrap).",
    "Pair.decision": "faster or within_noise.",
    "Pair.repeats": "Repeats per arm (the fewer).",
    "Pair.steps": "Both arms' profiled steps together.",
    "Pair.paired": "Repeats resampled by the same index (recorded back to back).",
    "Pair.repeats_needed": "Repeats per arm that would resolve this ratio; None: unknown.",
    "Pair.sentence": "The pair in words.",
    "Arm.name": "The arm (run name without `.rN`).",
    "Arm.strategy": "Its strategy.",
    "Arm.runs": "Its runs, one per repeat.",
    "Arm.median_ns": "Median over all their profiled steps.",
    "Arm.steps": "Profiled steps over its runs.",
    "Arm.peak_allocated_bytes": "Lowest peak allocated memory over its runs.",
    "BaselineDrift.reference": "The run every settings group is compared with.",
    "BaselineDrift.comparisons": "One per settings group.",
    "BaselineDrift.note": "What the section means.",
    "DriftComparison.old": "The reference's baseline.",
    "DriftComparison.new": "This run's baseline.",
    "DriftComparison.settings_differ": "The settings that differ.",
    "DriftComparison.expectation": "The tolerance applied and why (bitwise, or the precision tolerance).",
    "DriftComparison.ok": "Within the tolerance.",
    "DriftComparison.verdict": "The verdict in words.",
    "DriftComparison.beyond": "Tensors beyond the tolerance.",
    "DriftComparison.error": "Why no comparison was made.",
    "Finding.kind": "One of FINDING_KINDS (parity_failed, straggler, exposed_communication, ...).",
    "Finding.title": "The finding in one line.",
    "Finding.runs": "Runs it concerns.",
    "Finding.ranks": "Ranks it concerns.",
    "Finding.units": "FSDP units it concerns.",
    "Finding.mesh_dims": "Mesh dimensions it concerns.",
    "Finding.evidence": "The figures it rests on.",
    "Finding.cause": "The cause, when established; None: cause not established.",
    "Finding.cause_rule": "The rule that established it.",
    "Finding.explained_frac": "The share of the effect the cause explains (named only at >= 0.8).",
    "Finding.action": "What to try (the FSDP / DDP / DataLoader option); None when none follows.",
    "Finding.severity_ns": "The step time at stake, per step.",
    "Evidence.figure": "The figure's name.",
    "Evidence.value": "Its value, in `unit`.",
    "Evidence.unit": "ns, bytes, frac, GB/s or count.",
    "Evidence.path": "JSON pointer (RFC 6901) of the same figure in report.json.",
}


def _field_docs(module) -> dict[tuple[str, str], str]:
    """(class, field) -> the docstring written under the field."""
    tree = ast.parse(inspect.getsource(module))
    docs = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for st, nxt in zip(node.body, node.body[1:] + [None]):
            if (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[(node.name, st.target.id)] = inspect.cleandoc(nxt.value.value)
    return docs


def _type_name(t) -> str:
    import msgspec
    origin, args = typing.get_origin(t), typing.get_args(t)
    if t is type(None):
        return "null"
    if t is msgspec.UnsetType:
        return "absent"
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in args)
    if origin is list:
        return f"list[{_type_name(args[0])}]"
    if origin is tuple:
        return "[" + ", ".join(_type_name(a) for a in args) + "]"
    if origin is dict:
        return f"object[{_type_name(args[0])}, {_type_name(args[1])}]"
    if origin is typing.Literal:
        return " \\| ".join(f'"{a}"' for a in args)
    if t is typing.Any:
        return "any"
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return f"[{t.__name__}](#{t.__name__.lower()})"
    return {int: "int", float: "float", str: "string", bool: "bool"}.get(t, str(t))


def _structs(t):
    import msgspec
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        yield t
    for a in typing.get_args(t):
        yield from _structs(a)


def unit(field: str, parent_field: str | None) -> str:
    for suffix, u in (("_ns_per_step", "ns per profiled step"), ("_bytes_per_step", "bytes per profiled step"),
                      ("_per_step", "per profiled step"), ("_ns", "ns"), ("_bytes", "bytes"),
                      ("_gbps", "GB/s (10^9 bytes/s)"), ("_frac", "fraction, 0..1"), ("_ms", "ms")):
        if field.endswith(suffix):
            return u
    if field == "bytes":
        return "bytes"
    if parent_field and parent_field.endswith("_ns") and field in ("median", "p90", "min", "max"):
        return "ns"
    return ""


def render() -> str:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from analyzer.contract import report_types as rt, tolerance
    docs = {**_field_docs(tolerance), **_field_docs(rt)}
    order, paths, parent = [], {}, {}
    queue = [(rt.Report, "", None)]
    while queue:  # breadth first: each struct under the shortest path that reaches it
        cls, path, via = queue.pop(0)
        paths.setdefault(cls, []).append(path or "(top level)")
        if cls in order:
            continue
        order.append(cls)
        parent[cls] = via
        hints = typing.get_type_hints(cls)
        for f in cls.__struct_fields__:
            hint = hints[f]
            sep = "[]" if typing.get_origin(hint) is list or list in [typing.get_origin(a) for a in typing.get_args(hint)] else ""
            if typing.get_origin(hint) is dict:
                sep = ".<key>"
            for sub in _structs(hint):
                queue.append((sub, f"{path}.{f}{sep}".lstrip("."), f))
    lines = ["# report.json reference", "",
             "Every field of `report.json`, generated by `scripts/report_reference.py` from the "
             "contract, `analyzer/contract/report_types.py` (tests/test_docs.py fails when this "
             "file is out of date). Units are in the names: `_ns` nanoseconds (int64 where "
             "integral), `_bytes` bytes, `_gbps` GB/s = 10^9 bytes per second, `_frac` a "
             "fraction 0..1, `_per_step` per profiled step; the fields of a `..._ns` object are "
             "ns. `null` means \"not measured\" (a NaN or infinite figure is stored as null). How "
             "each figure is measured: [method.md](method.md).", "",
             "Structs: " + ", ".join(f"[{c.__name__}](#{c.__name__.lower()})" for c in order), ""]
    for cls in order:
        lines += [f"## {cls.__name__}", ""]
        where = sorted(set(paths[cls]))
        lines += ["At " + ", ".join(f"`{p}`" for p in where) + ".", ""]
        if cls.__doc__ and cls.__doc__ != rt.msgspec.Struct.__doc__:
            lines += [" ".join(inspect.cleandoc(cls.__doc__).split()), ""]
        lines += ["| field | type | unit | meaning |", "|---|---|---|---|"]
        hints = typing.get_type_hints(cls)
        for f in cls.__struct_fields__:
            meaning = docs.get((cls.__name__, f)) or NOTES.get(f"{cls.__name__}.{f}", "")
            meaning = " ".join(meaning.split()).replace("|", "\\|")
            lines.append(f"| `{f}` | {_type_name(hints[f])} | {unit(f, parent[cls])} | {meaning} |")
        lines.append("")
    return "\n".join(lines)


def undocumented() -> list[str]:
    """Fields with neither a docstring in the contract nor a note here (tests want none)."""
    from analyzer.contract import report_types as rt
    docs = _field_docs(rt)
    text = render()
    missing = []
    for line in text.splitlines():
        if line.startswith("## "):
            cls = line[3:]
        elif line.startswith("| `") and line.rstrip().endswith("|  |"):
            missing.append(f"{cls}.{line.split('`')[1]}")
    return missing


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(REPO)} is out of date: run scripts/report_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(REPO)}")
    missing = undocumented()
    if missing:
        print("undocumented: " + ", ".join(missing), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
