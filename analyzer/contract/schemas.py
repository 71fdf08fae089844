"""The one contract between ``tracer`` (writer) and ``analyzer`` (reader).

Nothing else crosses the two packages. The tracer imports this module; the analyzer reads
run directories only through it. It imports no torch.

Run directory (one per strategy run, ``traces/<run-name>/``)::

    manifest.json               written last, atomically: its presence means the run completed
    rank<r>.trace.json.gz       Kineto/Chrome trace per rank, with ``distributedInfo``
    numerics.parquet            NUMERICS_SCHEMA, long format
    baseline.safetensors        the kept golden tensors (KEPT_*; absent with --keep-tensors summaries)
    kept.parquet                KEPT_SCHEMA: per kept tensor its summary and sha256
    golden.parquet              with --golden only: this baseline against the golden run's tensors
    steps.parquet               STEPS_SCHEMA, one row per rank and step
    memory/rank<r>.snapshot.pickle   CUDA only: torch.cuda.memory._snapshot() for memory_viz
    memory/memory.parquet       CUDA only: MEMORY_SCHEMA, the snapshots converted at record time
    memory_categories.parquet   MEMORY_CATEGORIES_SCHEMA: per rank, bytes by category (issue 19)
    rank<r>.flightrec.json      a failed record only: the rank's Flight Recorder as JSON (torch's
                                fr_trace schema; tracer/flightrec.py), read by analyzer/ingest/frdump.py
    .tracer-recording           RECORDING_NAME: present while a record writes the folder, and left
                                by a record that failed or was killed; the record removes it after
                                writing manifest.json. A reader treats a run dir holding it as
                                incomplete *whether or not* manifest.json is there (a re-record
                                writes it before removing the previous manifest).
    .tracer-lock                LOCK_NAME: the record's fcntl.flock lock file (kept; empty of meaning
                                to a reader)

Only the files above are the tracer's (``manifest.files`` lists the non-hidden ones). Anything else
in a run dir -- an old analyzer's ``<trace>.tables.msgpack`` caches, a ``report/`` folder, merge
outputs -- is not listed, not removed by a re-record, and must not be read as a record's input.
A traces root never holds a run dir named ``REPORT_DIR_NAME`` (``tracer record`` refuses the name:
the analyzer writes its report there).

Any change to a field's meaning or type bumps ``SCHEMA_VERSION``; a reader refuses a newer one.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import pyarrow as pa
from msgspec import UNSET, UnsetType

from analyzer.contract.tolerance import Tolerance
from analyzer.contract import strategies

SCHEMA_VERSION = 1

MANIFEST_NAME = "manifest.json"
NUMERICS_NAME = "numerics.parquet"
STEPS_NAME = "steps.parquet"
MEMORY_DIR = "memory"
MEMORY_PARQUET_NAME = "memory.parquet"
MEMORY_CATEGORIES_NAME = "memory_categories.parquet"
TRACE_GLOB = "rank*.trace.json.gz"
RECORDING_NAME = ".tracer-recording"
"""Marker of a record in progress (or one that failed / was killed): the run dir is incomplete."""
LOCK_NAME = ".tracer-lock"
"""The lock file ``tracer record`` holds (fcntl.flock) while it writes a run dir."""
REPORT_DIR_NAME = "report"
"""The folder ``analyzer report`` writes in the folder it reads; never a run name."""


def trace_name(rank: int) -> str:
    """File name of rank ``rank``'s Chrome trace inside a run directory."""
    return f"rank{rank}.trace.json.gz"


def flightrec_name(rank: int) -> str:
    """File name of rank ``rank``'s Flight Recorder JSON dump (torch's FR schema) inside a run
    directory: written only by a record that failed (tracer/flightrec.py), never listed in a
    manifest."""
    return f"rank{rank}.flightrec.json"


Strategy = Literal[tuple(strategies.TABLE)]  # type: ignore[valid-type]
STRATEGIES: tuple[str, ...] = tuple(strategies.TABLE)
"""Strategy names, from the strategy table (contract/strategies.py): the reference ``single``
(one process) and the distributed ones, flat or on a 2-D ``DeviceMesh`` (manifest ``mesh``)."""
FLAT_STRATEGIES: tuple[str, ...] = tuple(strategies.all_set())
"""What ``--strategy all`` records: the 1-D set."""

PG_TAG_PREFIX = "paritytrace::pg "
"""A ``tracer record`` trace names the process group of every collective it issues: a CPU
``user_annotation`` named ``PG_TAG_PREFIX + "<pg_name>"`` (``ProcessGroup.group_name``, the
``pg_name`` of ``distributedInfo.pg_config``, whose ``pg_desc`` is ``mesh_<dim name>`` for a
DeviceMesh dimension) encloses the call on the calling thread, for send / recv followed by
``" peer <global rank>"``. gloo traces carry no process group on the collective itself (no
``record_param_comms``): this is how the analyzer tells a mesh dimension's collectives apart
there (tracer/pgtag.py writes it, analyzer/ingest/classify.py reads it).

On torch's fake process group (``tracer project``, issue 44) the name also carries, before any
peer, ``PG_TAG_TENSOR + "<dtype> <numel>"``: the call's first tensor argument (a list of
tensors: their summed elements), dtype as torch names it without ``torch.`` (``float32``). The
fake group runs no transfer op, and the ``c10d::*`` op of a call that takes tensor lists
(``allreduce_``, ``allgather_``) records no dtype (Kineto's ``Input type`` is ``TensorList``):
the tag is then the only place its dtype and bytes are written. The first tensor argument is
what a ``c10d::*`` op records first (the output: an all_gather's whole buffer, a
reduce_scatter's piece), read by the same rule (analyzer/ingest/commid.py ``total_bytes``)."""
PG_TAG_TENSOR = " tensor "
"""Marks the tensor note of a process-group tag (``PG_TAG_PREFIX``)."""

PRECISIONS = ("fp32", "bf16")

# --- numerics.parquet ------------------------------------------------------------------------
#
# Long format. One row = one metric of one tensor on one rank at one step.
#
# kind:
#   "loss"        tensor = "loss". metrics: "value" (this rank's loss on its slice of the global
#                 batch; the global distributed loss is the mean over ranks, slices being equal),
#                 "ref_value" (the single-device baseline's loss on the whole global batch).
#                 Recorded at every step.
#   "activation"  tensor = module FQN ("layers.0.mlp.2"); forward output at step 0 of this rank's
#                 slice, compared with the rows of the baseline output that belong to that slice.
#                 seq = forward call order (0 = first module to finish its forward).
#   "grad"        tensor = parameter FQN as in the unwrapped model ("layers.0.attn.weight"); the
#                 gradient after the first backward (step 0), before the optimizer step. For
#                 sharded strategies a rank holds a shard and is compared with the matching slice of
#                 the baseline gradient; metrics are summed/maxed across ranks by the reader.
#                 seq = parameter registration order.
#   "param"       same as "grad" for the parameter values after the first optimizer step.
#
# metrics for activation / grad / param (all float64; sums are over this rank's elements):
#   numel          number of elements this rank compared
#   sq_sum         sum of x**2 of the distributed tensor (gradient norm = sqrt of the sum over
#                  the shards that partition the tensor)
#   ref_sq_sum     sum of r**2 of the matching baseline elements
#   diff_sq_sum    sum of (x - r)**2
#   max_abs_diff   max |x - r|
#   max_abs_ref    max |r|
#   nonfinite      count of NaN / inf elements in x
#   replicated     1.0 when every rank holds the whole tensor (DDP, single), 0.0 when the ranks'
#                  elements partition it (FSDP shards). Readers reduce replicated tensors by taking
#                  the worst rank, sharded ones by summing the sums and maxing the maxima.
#
# For the ``single`` strategy the distributed tensor *is* the baseline: it records loss only
# (value == ref_value) and the reader reports parity as "reference".
NUMERICS_KINDS = ("loss", "activation", "grad", "param")
TENSOR_METRICS = ("numel", "sq_sum", "ref_sq_sum", "diff_sq_sum", "max_abs_diff", "max_abs_ref",
                  "nonfinite", "replicated")


def _run_file_schema(*fields: pa.Field) -> pa.Schema:
    """The schema of a run directory's Parquet file, stamped with ``SCHEMA_VERSION``."""
    return pa.schema(fields, metadata={"paritytrace.schema_version": str(SCHEMA_VERSION)})


NUMERICS_SCHEMA = _run_file_schema(
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("step", pa.int32(), nullable=False),
    pa.field("kind", pa.dictionary(pa.int32(), pa.string()), nullable=False),
    pa.field("tensor", pa.dictionary(pa.int32(), pa.string()), nullable=False),
    pa.field("seq", pa.int32(), nullable=False),
    pa.field("metric", pa.dictionary(pa.int32(), pa.string()), nullable=False),
    pa.field("value", pa.float64(), nullable=True),
)

# --- steps.parquet ---------------------------------------------------------------------------
#
# One row per rank and step (all steps, profiled or not). Wall time is measured around the whole
# training step (forward, backward, optimizer) with time.perf_counter_ns after a device sync;
# with ``--data loader`` it includes fetching the step's batch (manifest ``data``). Memory peaks
# are per step: peak_rss_bytes is the process's high-water RSS so far (ru_maxrss, monotonic);
# profiler_allocated_peak_bytes is the peak of the profiler's [memory] "Total Allocated" during
# the step (null on unprofiled steps); the CUDA columns are torch.cuda.max_memory_allocated /
# max_memory_reserved after reset at the step's start (null on CPU).
STEPS_SCHEMA = _run_file_schema(
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("step", pa.int32(), nullable=False),
    pa.field("profiled", pa.bool_(), nullable=False),
    pa.field("wall_ns", pa.int64(), nullable=False),
    pa.field("peak_rss_bytes", pa.int64(), nullable=True),
    pa.field("profiler_allocated_peak_bytes", pa.int64(), nullable=True),
    pa.field("cuda_max_allocated_bytes", pa.int64(), nullable=True),
    pa.field("cuda_max_reserved_bytes", pa.int64(), nullable=True),
)

# --- memory/memory.parquet (CUDA only) -------------------------------------------------------
#
# One row per live block of each rank's allocator snapshot (torch.cuda.memory._snapshot()),
# converted at record time so the analyzer never unpickles.
MEMORY_SCHEMA = _run_file_schema(
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("segment_address", pa.int64(), nullable=True),
    pa.field("block_size_bytes", pa.int64(), nullable=False),
    pa.field("requested_size_bytes", pa.int64(), nullable=True),
    pa.field("state", pa.string(), nullable=False),  # active_allocated, inactive, ...
    pa.field("stream", pa.int64(), nullable=True),
    pa.field("category", pa.string(), nullable=True),  # parameter / gradient / activation / ...
    pa.field("top_frame", pa.string(), nullable=True),  # innermost user frame "file:line:func"
)

# --- memory_categories.parquet (issue 19) ------------------------------------------------------
#
# One row per rank and category: what each rank holds, counted from its own tensors, never from
# the profiler's window (which misses everything allocated before profiling starts). Bytes are
# those of the distinct storages behind the tensors (a DTensor: its local tensor), so views
# count once and padding counts: FSDP1's flat-parameter local shard including its alignment and
# world-size padding, FSDP2's padded Shard(0) buffers.
#   parameters       the model's parameters as the rank holds them at rest (after the step-0
#                    optimizer step; sharded strategies: the local shards)
#   gradients        the ``.grad`` tensors after the step-0 backward, before the optimizer
#                    (FSDP: the reduce-scattered shards; DDP's communication buckets are not
#                    gradients and are not counted unless ``gradient_as_bucket_view`` makes the
#                    gradients views into them)
#   optimizer_state  every tensor of ``optimizer.state`` after the step-0 optimizer step
#                    (AdamW: exp_avg, exp_avg_sq and the ``step`` tensor; SGD without momentum:
#                    none, 0)
#   activations      the tensors autograd saved for backward during the step-0 forward
#                    (torch.autograd.graph.saved_tensors_hooks), parameters and views of them
#                    left out; each distinct storage once
#   peak             CUDA: the largest torch.cuda.max_memory_allocated over the steps after
#                    step 0 (peak stats reset at each step's start, so everything live before the
#                    step counts; step 0 is left out, it also holds the numerics capture), step 0
#                    when it is the only one; ``reserved_bytes`` likewise from
#                    max_memory_reserved. CPU: the sum of the four categories above (the
#                    allocator gives no peak; the profiler's figure covers its window only).
# source says how the row was measured: "tensors", "saved_tensors_hooks",
# "cuda_max_allocated", "sum_of_categories".
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "peak")
MEMORY_CATEGORIES_SCHEMA = _run_file_schema(
    pa.field("rank", pa.int32(), nullable=False),
    pa.field("category", pa.string(), nullable=False),  # one of MEMORY_CATEGORIES
    pa.field("bytes", pa.int64(), nullable=False),
    pa.field("reserved_bytes", pa.int64(), nullable=True),  # peak on CUDA only
    pa.field("source", pa.string(), nullable=False),
)

# --- the analyzer's per-rank tables (analyzer/ingest/ranktables.py) -------------------------
#
# Not run-directory files: the tables every command reads, one set per rank, kept in the tables
# cache (analyzer/ingest/tablecache.py), checked when it is written and read (``table_mismatch``).
_TYPES = {"i": pa.int64(), "f": pa.float64(), "b": pa.bool_(), "s": pa.large_string()}


def _columns(spec: str) -> pa.Schema:
    """``"name name:f ..."``: int64 columns unless ``:f`` float64, ``:b`` bool, ``:s`` string."""
    return pa.schema([(c.split(":")[0], _TYPES[(c + ":i").split(":")[1]]) for c in spec.split()])


STEP_WINDOWS_SCHEMA = _columns("step cpu_start_ns cpu_end_ns start_ns end_ns device_work:b")
"""One row per ProfilerStep of the rank's step track: cpu_start_ns, cpu_end_ns (the CPU span,
clipped at the next span's start), start_ns, end_ns (the window the breakdown measures: on a GPU
rank the device window, from the first device work the step launched to the next step's, the
last step's to its first device work + its CPU span or its last device work if later; on a
CPU rank the span extended to the end of its gloo work, clipped at the next span's start),
device_work (False: a GPU-rank step that launched no device work, empty window). Rules:
analyzer/ingest/steps.py. Whole-trace mode: one row, step 0, the whole trace."""
BREAKDOWN_SCHEMA = _columns("rank step step_start_ns step_ns compute_ns comm_ns overlap_ns exposed_comm_ns "
                            "other_ns idle_ns overlap_frac:f data_wait_ns data_wait_frac:f input_bound:b "
                            "cpu_step_ns device_work:b last_step_tail_ns compute_kernels")
"""Per rank and step time breakdown (analyzer/analyses/breakdown.py): step_ns = the window's
length, cpu_step_ns = the CPU ProfilerStep span's; device_work False: left out of medians and
means; last_step_tail_ns: the idle of a GPU rank's last step after its last device activity
(0 elsewhere); compute_kernels: the kernels the step ran (``breakdown.compute_kernels``)."""
COLLECTIVES_SCHEMA = _columns("rank step pg:s seq kind:s start_ns end_ns dur_ns bytes rule:s name:s "
                              "group_size dtype:s pg_ranks:s enqueue_start_ns enqueue_end_ns event_idx "
                              "peer pg_desc:s union_ns exposed_ns gap_ns gap_compute_ns gap_host_ns "
                              "gap_data_ns gap_coll_ns pg_seq comms_id:s seq_source:s")
"""One row per collective instance per rank (analyzer/analyses/collectives.py); bytes -1 and
dtype / pg_ranks / pg_desc "" when the trace does not say, peer -1 (a send / recv's global
peer rank, from the tracer's process-group tag); union_ns / exposed_ns: the row's share of its
process group's communication, and of its part under no computation, in the step windows
(analyzer/analyses/breakdown.py ``comm_shares``); gap_ns: the interval before the row from
its anchor (the end of the rank's previous collective of the same process group, else its
step's start) and its parts gap_compute_ns, gap_host_ns, gap_data_ns, gap_coll_ns (computation,
host delay, data wait, another collective: analyzer/analyses/straggler.py ``gap_parts``; gap_ns
-1 where not computed); seq: the row's cross-rank key within its pg, from seq_source ("Seq",
"Comms Id" or "order": analyzer/analyses/matchkey.py); pg_seq: the trace's per process group
sequence number (-1 unknown), comms_id: its Comms Id ("" unknown)."""
PREFETCH_SCHEMA = _columns("rank step phase:s unit:s prefetched:b issued_ns comm_start_ns finished_ns "
                           "need_ns comm_ns hidden_ns hidden_frac:f slack_ns labels:s ahead_units "
                           "group_size")
"""One row per FSDP unit all_gather per rank (analyzer/analyses/prefetch.py); ahead_units and
group_size (issue 45: how many units ahead it was issued, the ranks it gathered over) are <NA>
where not known."""
TIMELINE_SCHEMA = _columns("lane:s kind:s start_ns end_ns")
"""Merged compute and per-kind comm intervals of one step (breakdown.timeline_rows)."""
NO_VALUE = -(2**63)
"""The ``[memory]`` events' amounts (totals, bytes: any sign) where an event does not say
(analyzer/ingest/decode.py ``memory_events``)."""
DEVICE_MEMORY_SCHEMA = _columns("device_type device_id events peak_allocated_bytes "
                                "peak_reserved_bytes start_bytes source:s")
"""One row per device of the rank's ``[memory]`` profiler events (analyzer/analyses/memory.py
``device_peaks``): device_type (Kineto's number: 0 CPU, 1 CUDA, 6 HIP ...; -1 unknown),
device_id, events, peak_allocated_bytes, peak_reserved_bytes (-1 when the events do not say),
start_bytes (the live bytes assumed before the first event, > 0 only when frees of blocks
allocated before the window would otherwise make the running total negative), source (which
figure the peak comes from)."""
TABLE_SCHEMAS = {"steps": STEP_WINDOWS_SCHEMA, "breakdown": BREAKDOWN_SCHEMA,
                 "collectives": COLLECTIVES_SCHEMA, "prefetch": PREFETCH_SCHEMA, "timeline": TIMELINE_SCHEMA,
                 "device_memory": DEVICE_MEMORY_SCHEMA}


def table_mismatch(table: pa.Table, schema: pa.Schema) -> str | None:
    """Why ``table`` does not follow ``schema`` (column names in order, then types), None when it
    does. String and large string are one type; an empty table's columns may be untyped (null)."""
    if table.schema.names != schema.names:
        return f"columns {table.schema.names}, expected {schema.names}"
    for f, want in zip(table.schema, schema.types):
        if (pa.large_string() if f.type == pa.string() else f.type) != want \
                and not (f.type == pa.null() and table.num_rows == 0):
            return f"column {f.name} is {f.type}, expected {want}"
    return None


# --- manifest.json: ``Manifest`` ---------------------------------------------------------------
#
# Every field without a default is required. Readers ignore keys they do not know.
FAULTS = ("skip-grad-sync", "wrong-grad-scale", "unsynced-init", "skip-replicate-sync",
          "wrong-tp-placement", "skip-microbatch", "hang")


class Device(msgspec.Struct, kw_only=True):
    type: str  # "cpu" | "cuda"
    name: str
    count: int  # visible CUDA devices, or logical CPUs


class Launch(msgspec.Struct, kw_only=True):
    method: str  # "spawn" | "torchrun" | "single" | "project" (``tracer project``, issue 44)
    nnodes: int
    master_addr: str | None
    master_port: int | None


class Versions(msgspec.Struct, kw_only=True):
    python: str
    torch: str
    cuda: str | None  # None on CPU
    cudnn: int | None
    nccl: str | None
    paritytrace: str | None


class Model(msgspec.Struct, kw_only=True):
    name: str  # the model's class name ("SimpleTransformer" for --model reference)
    hidden: int  # --model reference: its width; other specs: 0 (not a parameter of theirs)
    layers: int  # --model reference: its layer count; other specs: 0
    num_params: int  # parameters (a tied one once)
    spec: str = "reference"  # ``tracer record --model`` (absent in older records: reference)
    buffers_not_compared: list[str] = []
    """Buffer FQNs (BatchNorm running statistics, rotary tables): not in the numerics, since the
    optimizer does not train them and each rank updates its own from its rows
    (docs/howto/your-model.md); their effect on the numbers shows in the activations and the
    loss."""
    config: dict[str, Any] | None = None
    """The model's configuration as torch built it (``tracer.ModelSpec.config``; ``hf:`` models:
    their transformers config after the overrides, read back from the built model, e.g.
    ``num_hidden_layers``, ``hidden_size``, ``head_dim``); None where the spec gives none
    (reference: ``hidden`` and ``layers`` say it)."""


class Batch(msgspec.Struct, kw_only=True):
    """The input's shape is [global_batch, seq_len, hidden] (reference model); other specs:
    seq_len and hidden are the inputs' dims 1 and 2, 0 where the inputs have no such dim."""
    global_batch: int
    seq_len: int
    per_rank_batch: int
    hidden: int


class Profiler(msgspec.Struct, kw_only=True, omit_defaults=True):
    wait: int | None = None
    warmup: int | None = None
    active: int | None = None
    activities: list[str] | None = None
    record_shapes: bool | None = None
    profile_memory: bool | None = None


class Baseline(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the baseline was obtained."""
    kind: str | None = None  # "in-process" | "separate-process"
    description: str | None = None
    file: str | None = None  # the run-dir file holding it, "baseline.safetensors"


class FileEntry(msgspec.Struct, kw_only=True):
    path: str  # relative to the run directory
    size_bytes: int
    sha256: str  # hex, of the file's bytes (``sha256_file``)


class Data(msgspec.Struct, kw_only=True, omit_defaults=True):
    """How the input was supplied (tracer/data.py): ``memory``, or ``loader``: the same rows as
    memory through a DataLoader with a DistributedSampler, fetched inside each step."""
    source: str
    workers: int | UnsetType = UNSET
    pin_memory: bool | UnsetType = UNSET
    sample_cost_ms: float | UnsetType = UNSET
    sampler: str | UnsetType = UNSET


class Golden(msgspec.Struct, kw_only=True):
    """The golden run a ``tracer record --golden`` reused. ``*_sha256_equal``: this record's kept
    batch / initial state are byte-identical to the golden's, tensor by tensor."""
    path: str
    run_id: str
    run_name: str
    strategy: str
    precision: str
    versions: Versions
    device: Device
    kept_sha256: str  # of its baseline.safetensors
    batch_sha256_equal: bool
    init_sha256_equal: bool


class Compile(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``tracer record --compile`` as torch ran it (issue 45; tracer/compiling.py): a setting,
    compared as the rest of ``Training``."""
    mode: str
    """``blocks`` (each transformer block, torchtitan's per-block compile) or ``model``."""
    backend: str
    """torch.compile backend (``inductor``)."""
    fullgraph: bool
    """Whether a graph break was an error (``blocks``) or allowed (``model``)."""
    modules: list[str] = []
    """Clean FQNs of the modules rank 0 ran compiled ("" the root), as found after setup."""


class CompileWarmup(msgspec.Struct, kw_only=True):
    """The compile warm-up of a ``--compile`` record, measured (issue 45): rank 0's seconds of
    compiling per step (torch/_dynamo/utils.py ``calculate_time_spent``, forward and backward),
    inside those steps' ``wall_ns`` (steps.parquet) and never in a profiled step's unless
    ``profiled_compile_ns`` says so. A measurement, not a setting: never compared between runs."""
    compile_ns_by_step: list[int]
    """Per step, ns (step 0: with the numerics hooks; step 1: recompiled without them)."""
    first_step_wall_ns: int
    """Step 0's wall time, ns, the compile included (step 0 is never profiled)."""
    profiled_compile_ns: int
    """Compile time inside profiled steps, ns: 0 when they ran what was compiled before them."""


class Training(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The training setup (issue 18; tracer/training.py), the same for the baseline and the ranks."""
    optimizer: dict[str, Any]
    """{name: "sgd" | "adamw", lr, weight_decay, and for adamw betas, eps; for sgd momentum}."""
    mixed_precision: list[str] | None = None
    """[PARAM, REDUCE, BUFFER] dtype names ("fp32", "bf16", "fp16"), None without the option."""
    activation_checkpointing: bool = False
    compile: Compile | None = None
    """``--compile`` (None: eager)."""


class Experiment(msgspec.Struct, kw_only=True):
    """The experiment a run belongs to (issue 20): every run one ``tracer record`` command
    recorded -- each chosen strategy, ``--repeat N`` times, interleaved with each round's order
    rotated (A B C, B C A, C A B ...) --
    shares one ``id``; the analyzer ranks only runs of one experiment together."""
    id: str  # uuid4 hex, or the user's ``--experiment-id`` (to join torchrun commands)
    arm: str  # the run name without its repeat suffix (``ddp`` for ``ddp.r2``): what is compared
    repeat: int = 1  # this run's repeat, 1-based
    repeats: int = 1  # ``--repeat``: runs of every arm
    order: list[str] = []  # the arms in the order this run's round recorded them (rotated per round)
    settings: dict[str, Any] | None = None
    """Declared arms (``tracer record --arm`` / ``--sweep``, issue 29): this arm's value of every
    recorder option (a ``tracer.config.RecordConfig`` field name, e.g. ``reshard_after_forward``)
    on which the experiment's arms differ; ``{}`` when they differ in none (identical arms).
    None: an experiment of strategies (``--strategy a,b``), whose runs may differ in strategy
    and strategy options only."""
    baseline: str | None = None
    """Declared arms: which single-device baseline the arm's numerics were checked against (the
    first 12 hex digits of the SHA-256 of the settings that determine the baseline's numbers);
    arms with equal ids share one baseline, an arm that changes the numerics (precision,
    training, batch, model) has its own."""


class Machine(msgspec.Struct, kw_only=True):
    """The machine while the run was recorded (issue 20): a busy or oversubscribed machine
    explains a slow or noisy run."""
    load_avg: list[float]  # 1, 5 and 15 minute load average as the record started (os.getloadavg)
    cpu_count: int  # logical CPUs (os.cpu_count)
    usable_cpus: int  # CPUs the record may run on (os.sched_getaffinity)
    threads_per_rank: int  # torch intra-op threads of each rank (torch.get_num_threads)
    ranks_on_host: int  # ranks of this run on this machine (LOCAL_WORLD_SIZE)
    oversubscribed: bool  # ranks_on_host x threads_per_rank > usable_cpus


class Mesh(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The ``DeviceMesh`` of a mesh strategy (issue 27): ``hsdp`` ["replicate", "shard"],
    ``fsdp2_tp`` ["dp", "tp"], ``pp`` ["dp", "pp"]; rank = row-major index of its coordinates
    (``init_device_mesh``): on a mesh of shape [A, B], rank r sits at (r // B, r % B), and the
    group of the last dimension holds consecutive ranks."""
    shape: list[int]
    dim_names: list[str]
    tp_plan: dict[str, str] = {}
    """fsdp2_tp: module FQN -> "colwise" | "rowwise" (torch.distributed.tensor.parallel styles)."""
    tp_sharded_params: int = 0
    """fsdp2_tp: parameters (elements) that the TP plan shards over the tp dimension."""
    pp_schedule: str | None = None  # pp: --pp-schedule (tracer/config.py PP_SCHEDULES)
    microbatches: int | None = None  # pp: microbatches per step
    pp_stages: list[list[str]] = []
    """pp: per stage, the module FQNs it owns (the reference model: its layers)."""
    stage_params: list[int] = []
    """pp: parameters (elements) each stage owns."""
    pp_schedule_class: str | None = None
    """pp: the torch.distributed.pipelining schedule class the run used (``ScheduleZBVZeroBubble``);
    None in runs recorded before issue 45 (``ScheduleGPipe`` / ``Schedule1F1B``)."""
    pp_stage_ids: list[list[int]] = []
    """pp: per pp rank, the global stage indices it ran (P x V stages, V per rank; ``pp_stages``
    and ``stage_params`` are per pp rank, all its stages together). Empty in runs recorded
    before issue 45: one stage per rank."""

    @property
    def pp_virtual_stages(self) -> int:
        """Stages per pp rank V (1 when ``pp_stage_ids`` is empty)."""
        return len(self.pp_stage_ids[0]) if self.pp_stage_ids else 1

    def group_ranks(self, dim: int) -> list[list[int]]:
        """The groups of dimension ``dim``: lists of global ranks, each sorted."""
        import itertools
        strides = [1] * len(self.shape)
        for i in range(len(self.shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * self.shape[i + 1]
        others = [range(n) if i != dim else range(1) for i, n in enumerate(self.shape)]
        return [[sum(c * s for c, s in zip(coord, strides)) + k * strides[dim]
                 for k in range(self.shape[dim])] for coord in itertools.product(*others)]


class OpEstimate(msgspec.Struct, kw_only=True):
    """One operator's compute in one role's step of a projection on fake tensors
    (tracer/opcost.py ``OpCost``): the profiled steps' mean."""
    rank: int  # the role's global rank
    op: str  # "aten::mm": the operator's namespace and overload packet
    calls_per_step: int
    flops_per_step: int  # torch/utils/flop_counter.py flop_registry; 0: no formula for the op
    bytes_per_step: int  # its tensor arguments' and results' bytes, each read or written once
    estimated_ns_per_step: int | None  # roofline with Projection.device_tflops / device_mem_gbps; None without them


class Projection(msgspec.Struct, kw_only=True):
    """A run that ``tracer project`` made (issue 44), not a record: its ranks ran one after
    another in one process, each as rank r of a world of ``world_size`` on torch's fake process
    group (torch/testing/_internal/distributed/fake_pg.py), which completes every collective
    without moving data. Its trace files exist for ``roles_run`` only; its shapes, collective
    calls and bytes and memory per rank are the job's at ``world_size``, its numerics are not
    (parity: not verified), its step times are one process's, not the job's."""
    world_size: int  # the projected world N (== Manifest.world_size)
    roles_run: list[int]  # the global ranks that ran (one per distinct role), each a rank<r> trace
    device: str  # "cpu" | "cuda": where the roles ran
    fake_process_group: bool = True  # collectives on torch's fake group: no data moved
    ranks_per_node: int | None = None  # the target's (tracer project --ranks-per-node; None: older)
    co_runners: int = 1  # copies of each role run at once to measure its compute (tracer/project.py)
    co_runner_step_ns: dict[str, list[int]] = msgspec.field(default_factory=dict)
    """Per role (its global rank, a string: a JSON key), the co-runners' profiled step wall
    times (ns): more samples of its compute under the same contention, for the projected step's
    interval (analyzer/compare/projection.py); empty with one runner."""
    fake_tensors: bool = False
    """The roles ran under torch's FakeTensorMode (``tracer project --fake-tensors``, or decided
    because the model did not fit this device): no storage, no values. Collective calls and
    bytes, parameter / gradient / optimizer-state bytes and activations (saved for backward,
    step 0) are the job's; the ``peak`` category is their sum (no allocator figures: none is
    allocated); op durations in the trace are the meta kernels' (``op_durations``)."""
    op_durations: str = "measured"
    """What the trace's op durations are: "measured" (real tensors on ``device``) or
    "meta_kernels" (fake tensors: not the device's; the estimate is ``compute_estimate``)."""
    device_tflops: float | None = None  # assumed peak of the target device, 10^12 FLOP/s (estimate input)
    device_mem_gbps: float | None = None  # assumed memory bandwidth, 10^9 bytes/s (estimate input)
    compute_estimate: list[OpEstimate] = msgspec.field(default_factory=list)
    """Fake tensors: per role and operator, calls, FLOPs, bytes and the roofline time per step
    (tracer/opcost.py); empty with real tensors."""
    live_peak_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    """Fake tensors: per role (its global rank, a string: a JSON key), the peak of its live
    tensor bytes on its device in the profiled steps (tracer/livebytes.py: no allocator
    rounding or caching); empty with real tensors, whose allocator peak is in steps.parquet."""


class Manifest(msgspec.Struct, kw_only=True, omit_defaults=True):
    """``manifest.json``, written last (atomically) by global rank 0."""
    schema_version: int  # == SCHEMA_VERSION
    run_id: str  # unique (uuid4 hex)
    run_name: str  # the run directory's name
    created_utc: str  # ISO 8601
    strategy: Strategy
    strategy_options: dict[str, Any]
    """For fsdp/fsdp2 {sharding_strategy, auto_wrap_min_num_params, backward_prefetch,
    forward_prefetch, reshard_after_forward, fsdp_units (wrapped module FQNs, post-order)}; for
    ddp {bucket_cap_mb, gradient_as_bucket_view, static_graph}: ``bucket_cap_mb`` the MiB given,
    or ``"default"`` (``strategies.DDP_DEFAULT_BUCKET``) when none was: torch's 1 MiB first
    bucket, then 25 MiB -- another setting than an explicit 25 (records before issue 42 wrote
    25.0 for both)."""
    fault: str | None  # one of FAULTS (a deliberate bug, see tracer)
    precision: str  # one of PRECISIONS
    world_size: int
    backend: str | None  # "gloo" | "nccl" | None (single)
    device: Device
    launch: Launch
    versions: Versions
    model: Model
    batch: Batch
    seed: int
    steps: int  # total steps run
    profiler: Profiler
    tolerance: Tolerance  # what the tracer applied (readers recompute it from the precision)
    baseline: Baseline
    files: list[FileEntry]  # every other file in the run directory
    keep_tensors: str | None = None  # "full" | "summaries": what was kept of the baseline (KEPT_*)
    golden: Golden | None = None  # with ``tracer record --golden`` only
    data: Data | None = None  # issue 10; absent in older records, which were fed from memory
    training: Training | None = None  # issue 18; absent in older records: plain SGD, fp32 / autocast
    experiment: Experiment | None = None  # issue 20; absent in older records
    machine: Machine | None = None  # issue 20; absent in older records
    mesh: Mesh | None = None  # issue 27: the mesh strategies only
    projection: Projection | None = None
    """issue 44: set by ``tracer project`` only (absent in a record): the run is a projection
    at ``Projection.world_size`` from one process, not a measured job. Additive: no
    ``SCHEMA_VERSION`` bump (a reader that does not know the key ignores it)."""
    compile_warmup: CompileWarmup | None = None
    """issue 45: ``--compile`` records only: the compile warm-up, apart from the step time.
    Additive, as ``projection``."""

    def file(self, path: str) -> FileEntry | None:
        """The ``files`` entry of ``path``, None when it is not listed."""
        return next((f for f in self.files if f.path == path), None)


# --- kept tensors: baseline.safetensors, kept.parquet, golden.parquet (issue 9) -------------
#
# Every record keeps its baseline's golden tensors, so later records can be re-compared with it:
#   baseline.safetensors  (``--keep-tensors full``, the default) safetensors, never a pickle:
#       batch.x, batch.y  the fixed global batch (inputs, MSE targets), [B, S, H] fp32
#       init.<fqn>        the initial parameters
#       grad.<fqn>        the step-0 gradients, before the optimizer step
#       param.<fqn>       the parameters after the first optimizer step
#       loss              the baseline loss per step, [steps] fp64
#     metadata "config": JSON of the settings that determine the numbers. Size: the batch plus
#     three copies of the parameters (about 16 MB at the default shapes).
#   kept.parquet          KEPT_SCHEMA, both modes: one row per kept tensor with its summary and the
#                         sha256 of its raw bytes as stored (row-major, little-endian, the
#                         safetensors data block). ``--keep-tensors summaries`` keeps only this.
#   golden.parquet        (``--golden`` only) NUMERICS_SCHEMA rows (rank 0) of this record's
#                         baseline against the golden run's kept tensors: kind "loss" per step
#                         (value = this baseline, ref_value = golden), "grad" and "param" at step 0
#                         (TENSOR_METRICS with ref = the golden tensor).
# With ``--golden`` the ranks also compare their step-0 tensors with the golden ones:
# numerics.parquet then carries, on grad / param rows, the GOLDEN_METRICS (same meaning and
# reduction across ranks as the metric without the prefix, with the golden tensor as reference)
# and, on loss rows, "golden_ref_value" (the golden baseline's loss at that step).
KEPT_NAME = "kept.parquet"
KEPT_TENSORS_NAME = "baseline.safetensors"
GOLDEN_NAME = "golden.parquet"
KEEP_TENSORS = ("full", "summaries")
KEPT_GROUPS = ("batch", "init", "grad", "param", "loss")
"""Tensor-name prefixes of the kept tensors (``grad.layers.0.attn.weight`` is in group grad)."""
GOLDEN_METRICS = ("golden_ref_sq_sum", "golden_diff_sq_sum", "golden_max_abs_diff", "golden_max_abs_ref")
KEPT_SCHEMA = _run_file_schema(
    pa.field("group", pa.string(), nullable=False),  # one of KEPT_GROUPS
    pa.field("tensor", pa.string(), nullable=False),  # full kept name, "grad.layers.0.attn.weight"
    pa.field("dtype", pa.string(), nullable=False),  # safetensors dtype code: F32, F64, BF16, ...
    pa.field("shape", pa.list_(pa.int64()), nullable=False),
    pa.field("numel", pa.int64(), nullable=False),
    pa.field("sha256", pa.string(), nullable=False),  # hex, of the tensor's raw stored bytes
    pa.field("sum", pa.float64(), nullable=False),  # float64 sums over every element
    pa.field("sq_sum", pa.float64(), nullable=False),
    pa.field("min", pa.float64(), nullable=True),  # null for an empty tensor
    pa.field("max", pa.float64(), nullable=True),
    pa.field("max_abs", pa.float64(), nullable=True),
    pa.field("nonfinite", pa.int64(), nullable=False),
)


def kept_row(tensor: str, dtype: str, shape: list[int], raw: bytes, values: Any) -> dict[str, Any]:
    """One KEPT_SCHEMA row: ``raw`` are the tensor's stored bytes (hashed), ``values`` its
    elements as a float64 numpy array (summed). Used by the tracer when it writes kept.parquet and
    by the analyzer when it re-derives the row from baseline.safetensors (tamper check)."""
    import hashlib

    import numpy as np

    v = np.asarray(values, dtype=np.float64).reshape(-1)
    finite = np.isfinite(v)
    empty = v.size == 0
    return {"group": tensor.split(".", 1)[0], "tensor": tensor, "dtype": dtype,
            "shape": [int(d) for d in shape], "numel": int(v.size),
            "sha256": hashlib.sha256(raw).hexdigest(),
            "sum": float(v.sum()), "sq_sum": float((v * v).sum()),
            "min": None if empty else float(v.min()), "max": None if empty else float(v.max()),
            "max_abs": None if empty else float(np.abs(v).max()),
            "nonfinite": int(v.size - finite.sum())}


# AdamW, parameters after the first step. torch's AdamW at step 1 has m / (1 - b1) = g and
# sqrt(v / (1 - b2)) = |g|, so each element moves by lr * f(g), f(g) = g / (|g| + eps), after the
# weight decay p * (1 - lr * wd) (the same on every side: the initial weights are identical).
# f is normalised: |f| < 1, and |f'(g)| = eps / (|g| + eps)^2 <= 1 / eps. A gradient element that
# differs by d from the baseline's therefore moves its parameter by at most lr * min(2, d / eps)
# more: for |g| near eps a rounding difference flips the update's sign (2 lr at worst), while for
# |g| >> eps the update is lr * sign(g) whatever the rounding. The parity rule adds, per
# parameter tensor, ``adam_first_step_bound(lr, eps, d)`` to its limit, with d the tensor's
# measured step-0 gradient max_abs_diff (so a gradient that matches exactly leaves the plain
# tolerance). SGD moves by lr * d at most, far inside rtol * max|p|: nothing is added.
def adam_first_step_bound(lr: float, eps: float, grad_max_abs_diff: float) -> float:
    """Largest change of one parameter element by AdamW's first step caused by a gradient
    difference of ``grad_max_abs_diff``: ``lr * min(2, grad_max_abs_diff / eps)`` (rule above).
    A NaN difference gives NaN (the tensor then fails; ``min`` would drop it)."""
    if grad_max_abs_diff != grad_max_abs_diff:
        return grad_max_abs_diff
    return lr * min(2.0, grad_max_abs_diff / eps)


def sha256_file(path: Path | str) -> str:
    """Hex sha256 of a file's bytes, as the manifest's ``files[].sha256`` records it.

    Read in 1 MiB chunks, so memory stays flat for large traces. Raises ``OSError``.
    """
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


class SchemaError(ValueError):
    """A run-directory file does not follow this contract (missing key, newer schema version).

    ``path`` names the file; the message says what is wrong and what to do.
    """

    def __init__(self, path: Path | str, message: str):
        self.path = str(path)
        super().__init__(f"{path}: {message}")


_RUN_NAMES = "|".join(re.escape(n) for n in (NUMERICS_NAME, STEPS_NAME, KEPT_NAME, GOLDEN_NAME,
                                             KEPT_TENSORS_NAME, MEMORY_CATEGORIES_NAME))
RUN_FILE = re.compile(rf"(rank(\d{{1,9}})\.trace\.json\.gz|{_RUN_NAMES}|{re.escape(MEMORY_DIR)}/"
                      rf"(?:rank(\d{{1,9}})\.snapshot\.pickle|{re.escape(MEMORY_PARQUET_NAME)})"
                      rf"|rank(\d{{1,9}})\.flightrec\.json)",
                      re.ASCII)
"""The relative paths of the files ``tracer record`` writes in a run directory besides the
manifest (``fullmatch``; the tracer's own ``tracer/rundir.py`` ``TRACER_FILE`` names the same
files): the only paths a manifest may list (``read_manifest``)."""


def manifest_files_problem(manifest: Manifest) -> str | None:
    """Why ``manifest.files`` cannot be what the tracer wrote, None when it can: a path that is
    not one of the tracer's file names (``RUN_FILE``), a rank at or beyond ``world_size`` in a
    name, a path listed twice, more entries than the tracer writes (one trace and one memory
    snapshot per rank, each other file once)."""
    most = 2 * max(manifest.world_size, 1) + 7
    if len(manifest.files) > most:
        return (f"lists {len(manifest.files):,} files, more than the {most:,} tracer record "
                f"writes for world_size {manifest.world_size}")
    seen: set[str] = set()
    for i, f in enumerate(manifest.files):
        m = RUN_FILE.fullmatch(f.path)
        if m is None:
            return (f"entry $.files[{i}].path {_quoted(f.path)} is not a file tracer record "
                    "writes")
        rank = m.group(2) or m.group(3) or m.group(4)
        if rank is not None and int(rank) >= manifest.world_size:
            return (f"entry $.files[{i}].path {_quoted(f.path)} names rank {int(rank)}, beyond "
                    f"world_size {manifest.world_size}")
        if f.path in seen:
            return f"entry $.files[{i}].path {_quoted(f.path)} is listed twice"
        seen.add(f.path)
        if f.size_bytes < 0:
            return f"entry $.files[{i}].size_bytes {f.size_bytes} is negative"
    return None


def _quoted(text: str) -> str:
    """``text`` as a Python literal, cut at 80 characters (escapes NUL and other controls)."""
    shown = repr(text)
    return shown if len(shown) <= 80 else shown[:77] + "..."


MODULES_PER_PARAM = 4
"""Modules without parameters a record may name per parameter element (containers,
activations, dropouts: they come with the modules that hold the parameters): part of
``max_run_file_rows``."""
MODULE_ALLOWANCE = 1_000
"""Modules a record may name beyond ``MODULES_PER_PARAM`` per parameter (a model of very few
parameters): part of ``max_run_file_rows``."""
LOSS_METRICS = ("value", "ref_value")
"""The metrics of numerics.parquet's loss rows (one each per rank and step)."""
BATCH_TENSORS = 16
"""The most batch tensors a record keeps (kept.parquet group ``batch``: ``batch.x``, ``batch.y``)."""


def max_run_file_rows(manifest: Manifest, name: str) -> int | None:
    """The most rows the tracer can write in run file ``name`` (``NUMERICS_NAME`` ...) of the
    record ``manifest`` describes, None when the manifest does not bound it (memory.parquet:
    allocator blocks). Every parameter holds at least one element, so a rank names at most
    ``model.num_params`` parameters (grad and param rows each) and, for activations, at most
    ``MODULES_PER_PARAM`` modules per parameter plus ``MODULE_ALLOWANCE``; numerics has a row per
    metric of each (the golden metrics only in a ``--golden`` record) and ``LOSS_METRICS`` rows
    per step (golden.parquet: rank 0's grad, param and loss rows); kept.parquet a row per kept
tensor; steps.parquet a row per rank and step. Read from the file's footer before the file
    is read (analyzer/analyses/memory.py ``read_parquet``): a small file of many rows cannot
    fill the memory. The rule's looseness is ``num_params``: it counts elements, and the rows
    count tensors (a record names about a thousandth as many)."""
    world = max(manifest.world_size, 1)
    steps = max(manifest.steps, 0) + 1
    params = max(manifest.model.num_params, 0)
    modules = MODULES_PER_PARAM * params + MODULE_ALLOWANCE
    metrics = len(TENSOR_METRICS) + (len(GOLDEN_METRICS) if manifest.golden is not None else 0)
    if name == NUMERICS_NAME:
        return world * (metrics * (2 * params + modules) + steps * len(LOSS_METRICS))
    if name == STEPS_NAME:
        return world * steps
    if name == KEPT_NAME:
        return 3 * params + BATCH_TENSORS + steps  # init, grad, param; batch; loss
    if name == GOLDEN_NAME:  # numerics rows of rank 0: grad and param, loss per step
        return 2 * params * len(TENSOR_METRICS) + steps * len(LOSS_METRICS)
    if name == MEMORY_CATEGORIES_NAME:
        return world * len(MEMORY_CATEGORIES)
    return None


MAX_MANIFEST_BYTES = 64 << 20
"""The largest manifest.json read (a record's is a few KB, ~200 bytes per listed file)."""


def read_manifest(path: Path | str) -> Manifest:
    """Read and validate a ``manifest.json``.

    Raises ``SchemaError`` naming the file when it is not JSON, carries a ``schema_version``
    newer than this reader's, lacks a required key or has a value of the wrong type.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size > MAX_MANIFEST_BYTES:
                raise SchemaError(path, f"is {size:,} bytes, more than any manifest tracer record "
                                  f"writes ({MAX_MANIFEST_BYTES:,}); re-record the run")
            data = msgspec.json.decode(fh.read())
    except (OSError, msgspec.DecodeError) as exc:
        raise SchemaError(path, f"not a readable JSON manifest ({exc}); re-record the run") from None
    except RecursionError:
        raise SchemaError(path, "JSON nested too deeply to be a manifest; re-record the "
                          "run") from None
    if not isinstance(data, dict):
        raise SchemaError(path, "manifest is not a JSON object; re-record the run")
    version = data.get("schema_version")
    if type(version) is not int or version < 1:  # bool is an int to isinstance
        shown = "none" if version is None else msgspec.json.encode(version).decode()[:40]
        raise SchemaError(path, f"schema_version {shown} is not a version number (whole, >= 1); "
                          "re-record the run")
    if version > SCHEMA_VERSION:
        raise SchemaError(
            path,
            f"schema_version {version} is newer than this analyzer's {SCHEMA_VERSION}; "
            "upgrade paritytrace",
        )
    missing = [f.name for f in msgspec.structs.fields(Manifest) if f.required and f.name not in data]
    if missing:
        raise SchemaError(path, f"manifest lacks {', '.join(missing)}; re-record the run")
    try:
        manifest = msgspec.convert(data, Manifest)
    except msgspec.ValidationError as exc:
        raise SchemaError(path, f"manifest: {exc}; re-record the run") from None
    if not manifest.files:  # the tracer lists every file: an empty list would skip every check
        raise SchemaError(path, "manifest lists no files ($.files is empty), so nothing of the "
                          "run could be checked against the record; re-record the run")
    for i, f in enumerate(manifest.files):
        if why := unsafe_run_path(f.path):
            raise SchemaError(path, f"manifest entry $.files[{i}].path {_quoted(f.path)} {why}; "
                              "re-record the run")
    if why := manifest_files_problem(manifest):
        raise SchemaError(path, f"manifest {why}; re-record the run")
    if why := mesh_problem(manifest):
        raise SchemaError(path, f"manifest $.mesh {why}; re-record the run")
    if why := strategy_options_problem(manifest):
        raise SchemaError(path, f"manifest $.strategy_options{why}; re-record the run")
    return manifest


OPTION_MANIFEST_KEYS: dict[str, tuple[str, ...]] = {
    "wrap_min_params": ("auto_wrap_min_num_params", "fsdp_unit_classes", "fsdp_units"),
}
"""A strategy option (``strategies.StrategySpec.options``, RecordConfig field names) -> the keys
the record writes for it in ``strategy_options`` (tracer/config.py ``strategy_options``,
tracer/manifest.py ``build_manifest``: the FSDP units come with the wrap option); an option not
listed is written under its own name."""


def strategy_options_problem(m: Manifest) -> str | None:
    """Why ``m.strategy_options`` cannot be what ``tracer record --strategy m.strategy`` wrote,
    None when it can: a key of an option the strategy does not take (its row's ``options``,
    analyzer/contract/strategies.py: the strategy was edited, or the options), or a ddp
    ``bucket_cap_mb`` that is neither a positive finite number of MiB nor exactly
    ``strategies.DDP_DEFAULT_BUCKET``. The text starts where the JSON path ``$.strategy_options``
    ends (``" lists ..."``, ``".bucket_cap_mb ..."``)."""
    row = strategies.spec(m.strategy)
    if row is None:  # the Strategy literal refused any other name already
        return None
    taken = {k for o in row.options for k in OPTION_MANIFEST_KEYS.get(o, (o,))}
    foreign = [k for k in m.strategy_options if k not in taken]
    if foreign:
        return (f" lists {', '.join(k if k.isidentifier() else _quoted(k) for k in foreign)}, "
                f"which {m.strategy} does not take: the strategy or its options were edited")
    if "bucket_cap_mb" in m.strategy_options:
        value = m.strategy_options["bucket_cap_mb"]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (value == strategies.DDP_DEFAULT_BUCKET
                or (number and math.isfinite(value) and value > 0)):
            shown = repr(value) if number else msgspec.json.encode(value).decode()
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            return (f".bucket_cap_mb {shown} is neither a positive number of MiB nor "
                    f'"{strategies.DDP_DEFAULT_BUCKET}"')
    return None


def mesh_problem(m: Manifest) -> str | None:
    """Why ``m.mesh`` cannot describe the run's ranks, or None: a mesh strategy without one;
    sizes that are not positive or whose product is not the world size; dimension names that
    are not the strategy's (its row's ``dims``) or not one per size; a pipelined strategy with
    microbatches < 1, or stages / stage parameters not one per stage."""
    mesh, row = m.mesh, strategies.spec(m.strategy)
    if row is None or row.is_flat:
        return None
    if mesh is None:
        return f"is missing: a {m.strategy} record describes its DeviceMesh"
    if not mesh.shape or any(not isinstance(n, int) or n < 1 for n in mesh.shape):
        return f"shape {mesh.shape} is not a list of positive sizes"
    if math.prod(mesh.shape) != m.world_size:
        return f"shape {mesh.shape} holds {math.prod(mesh.shape)} ranks, not world_size {m.world_size}"
    if tuple(mesh.dim_names) != row.dims or len(mesh.dim_names) != len(mesh.shape):
        return (f"dim_names {mesh.dim_names} are not {list(row.dims)}, one per "
                f"size of shape {mesh.shape}")
    if stage_dim := row.dim_of("stage"):
        stages = mesh.shape[mesh.dim_names.index(stage_dim)]
        if mesh.microbatches is None or mesh.microbatches < 1:
            return f"microbatches {mesh.microbatches} is not a positive count"
        for field in ("pp_stages", "stage_params"):
            if len(getattr(mesh, field)) != stages:
                return f"{field} lists {len(getattr(mesh, field))} stages, not the {stages} of its shape"
    return None


def unsafe_run_path(rel: str) -> str | None:
    """Why ``rel`` (a ``files[].path`` of the manifest) does not name a file inside the run
    directory by its text alone, or None: empty, absolute (POSIX or Windows drive), or with a
    ``..`` part. Links out of the folder need the file system: analyzer/ingest/rundirs.py."""
    from pathlib import PurePosixPath, PureWindowsPath

    if not rel or rel in (".", "./"):
        return "is empty"
    if PurePosixPath(rel).is_absolute() or PureWindowsPath(rel).drive or rel.startswith("\\"):
        return "is absolute"
    if ".." in PurePosixPath(rel.replace("\\", "/")).parts:
        return "climbs out of the run directory (..)"
    return None


def check_parquet_version(path: Path | str, schema: pa.Schema) -> None:
    """Raise ``SchemaError`` when the Parquet file at ``path`` was written by a newer schema."""
    import pyarrow.parquet as pq

    path = Path(path)
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid) as exc:
        raise SchemaError(path, f"not a readable Parquet file ({exc}); re-record the run") from None
    raw = meta.get(b"paritytrace.schema_version")
    if raw is None:
        raise SchemaError(path, "no paritytrace schema version; re-record the run")
    if not raw.isdigit() or len(raw) > 9:
        raise SchemaError(path, f"paritytrace schema version {raw[:40]!r} is not a version "
                          "number; re-record the run")
    if int(raw) > SCHEMA_VERSION:
        raise SchemaError(
            path,
            f"schema_version {int(raw)} is newer than this analyzer's {SCHEMA_VERSION}; "
            "upgrade paritytrace",
        )
