"""The report as typed objects (report.json is ``encode(Report)``), and the analysis options.

The analysis (analyzer/compare/runs.py) builds a ``Report``; ranking (compare.py), drift and the
renderers (reports/) read its attributes. Light on purpose: msgspec only, no pandas / numpy, so
a cached report decodes and renders without them (reports/cache.py). Field names are
report.json's keys; units are in the names (``_ns``, ``_bytes``, ``_gbps``, ``_frac``) or, for
the fields of a ``..._ns`` / ``..._bytes`` object, in its name.

Rule of every struct that holds measured floats (``_Figures``): a NaN or infinite value is
stored as None, as JSON has neither; ``null`` in report.json means "not measured".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from analyzer.contract import strategies
from analyzer.contract.errors import BadInput
from analyzer.contract.tolerance import Tolerance

REPORT_SCHEMA_VERSION = 1

MAX_OVERRIDE = {"rtol": 0.1, "atol": 1e-4}
"""The largest ``--rtol`` / ``--atol`` a user may pass: beyond them the gate no longer tests
numerical equivalence. rtol 0.1 (a 10 % error) is ~6x the loosest ``torch.testing.assert_close``
default (bfloat16's 1.6e-2); atol 1e-4 is 10x the fp32 / bf16 default and well below the
reference gradients' scale (~3e-3): at atol 1e-2 a ``--fault wrong-grad-scale`` run (gradients
off by 2x) passed the gate, at 1e-3 it failed on 3 tensors, at 1e-4 on 17. At both bounds such
runs fail (tests/cli/test_tolerance_options.py)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ToleranceOverride:
    """The user's ``--rtol`` / ``--atol`` (None: the precision's default), validated here once.

    Raises ``BadInput`` (reason ``bad_option``) naming the option (``--atol`` for a bad
    atol) for a negative, NaN or infinite value, with an example value for that option, or for
    one above its bound in ``MAX_OVERRIDE`` (the message states the bound). ``-0.0`` passes (it
    equals 0); ``parity.tolerance_for`` stores it as ``0.0`` so that no report shows "rtol -0"."""

    rtol: float | None = None
    """Relative tolerance (dimensionless)."""
    atol: float | None = None
    """Absolute tolerance (in the tensor's units)."""

    def __post_init__(self) -> None:
        for name, value in (("--rtol", self.rtol), ("--atol", self.atol)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise BadInput(name, "bad_option", f"must be a finite number >= 0, got {value!r}",
                               f"pass e.g. {name} 1e-5 (or leave it out for the precision's default)")
            bound = MAX_OVERRIDE[name[2:]]
            if value is not None and value > bound:
                raise BadInput(name, "bad_option", f"{value!r} is above the bound {bound:g}: so "
                               "loose a tolerance no longer tests numerical equivalence (a gradient "
                               "off by 2x could pass)",
                               f"pass {name} <= {bound:g} (or leave it out for the precision's default)")


@dataclass(frozen=True, kw_only=True, slots=True)
class AnalysisOptions:
    """What the user chose for an analysis (``analyzer report`` / ``gate``)."""

    tolerance: ToleranceOverride = field(default_factory=ToleranceOverride)
    """Overrides of the parity tolerance."""
    allow_incomplete: bool = False
    """Analyse run directories without manifest.json as found (marked incomplete)."""
    jobs: int | None = None
    """Processes parsing ranks (None: one per CPU, at most one per file)."""
    device_memory_bytes: int | None = None
    """``--device-memory``: one device's memory, for the fits / does not fit line (None: no line)."""
    link_model: tuple[str, ...] = ()
    """``--link-model``: link model files (the link benchmark's JSON, nccl-tests output) for a
    projection's step (analyzer/compare/projection.py); () none: no projected step."""
    ranks_per_node: int | None = None
    """``--ranks-per-node``: the target's ranks per node for a projected step (None: the whole
    world on one node)."""

    def __post_init__(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {self.jobs!r}")


class _Figures(msgspec.Struct, kw_only=True):
    def __post_init__(self) -> None:
        for name in self.__struct_fields__:
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v):
                setattr(self, name, None)


Num = int | float | None


class FirstDivergence(_Figures, kw_only=True):
    """The first check that failed (analyzer/analyses/parity.py order); ``subject`` names it in text
    (``grad layers.0.attn.weight``, ``the loss``). ``rel_l2`` is the loss's relative diff."""

    tensor: str
    kind: str
    step: int
    rel_l2: float | None
    max_abs_diff: float | None
    limit: float | None
    nonfinite: Num
    tolerance: Tolerance
    subject: str

    def describe(self, *, limit_terms: bool = True) -> str:
        """One line: ``grad w (step 0): max |diff| 3e-3 > limit 1e-5 (atol 1e-05 + rtol 1.3e-06 x
        max |ref|), rel L2 2e-2``, without the parenthesis when not ``limit_terms``; ``grad w
        (step 0) has NaN/inf values`` when a value or a metric is not finite."""
        where = f"{self.subject} (step {self.step})"
        if (self.nonfinite or 0) > 0 or None in (self.max_abs_diff, self.rel_l2, self.limit):
            return f"{where} has NaN/inf values"
        terms = f"atol {self.tolerance.atol:.3g} + rtol {self.tolerance.rtol:.3g} x max |ref|"
        if self.kind == "loss":  # the divergence envelope (Tolerance.envelope)
            terms = f"{self.step + 1} x (atol {self.tolerance.atol:.3g} + rtol {self.tolerance.rtol:.3g} x |ref|)"
        terms = f" ({terms})" if limit_terms else ""
        return (f"{where}: max |diff| {self.max_abs_diff:.3g} > limit {self.limit:.3g}{terms}, "
                f"rel L2 {self.rel_l2:.3g}")


class FailedCheck(_Figures, kw_only=True):
    kind: str
    tensor: str
    step: int
    rel_l2: float | None
    max_abs_diff: float | None
    limit: float | None


class LossStep(_Figures, kw_only=True):
    """The loss at one recorded step: ``loss`` the run's (mean over ranks), ``ref`` the
    baseline's for the same step, ``limit`` the divergence envelope |loss - ref| must stay
    within (``Tolerance.envelope``)."""

    step: int
    loss: float
    ref: float
    limit: float


class Parity(_Figures, kw_only=True):
    """A run's parity verdict: status one of ``pass``, ``fail``, ``not_recorded``, ``reference``
    (the single run); ``failed_checks``: the first 10 failed tensor checks; ``loss_curve``: the
    loss of every recorded step beside the baseline's (empty without loss rows)."""

    status: Literal["pass", "fail", "not_recorded", "reference"]
    reason: str
    tolerance: Tolerance | None = None
    max_grad_rel_l2: float | None = None
    loss_max_rel_diff: float | None = None
    first_divergence: FirstDivergence | None = None
    failed_checks: list[FailedCheck] = []
    loss_curve: list[LossStep] = []


class StepTime(_Figures, kw_only=True):
    """Step times (ns) of the run's profiled steps: median and p90 (numpy's linear
    interpolation), n, min, max; ``source`` says where they come from (None without steps)."""

    median: float | None = None
    p90: float | None = None
    n: int = 0
    min: int | None = None
    max: int | None = None
    source: str | None = None
    values_ns: list[int] = []
    """Every profiled step's time, in step order: what the ranking's interval resamples."""


class MemoryRank(msgspec.Struct, kw_only=True):
    rank: int
    peak_rss_bytes: int | None
    profiler_allocated_peak_bytes: int | None
    cuda_max_allocated_bytes: int | None
    cuda_max_reserved_bytes: int | None


class MemoryCategory(msgspec.Struct, kw_only=True):
    """Bytes one rank holds in one category (memory_categories.parquet): ``category`` one of
    ``schemas.MEMORY_CATEGORIES`` (parameters, gradients, optimizer_state, activations, peak);
    ``reserved_bytes`` on the CUDA peak row only; ``source`` how it was measured."""

    rank: int
    category: str
    bytes: int
    reserved_bytes: int | None = None
    source: str = ""


class SnapshotCategory(msgspec.Struct, kw_only=True):
    """Live blocks of a CUDA allocator snapshot by the snapshot's own category."""

    rank: int
    category: str
    blocks: int
    bytes: int


class SnapshotTotal(msgspec.Struct, kw_only=True):
    """A rank's CUDA allocator snapshot in total: live (allocated) and all blocks (reserved);
    beside the categories (``memory.snapshot_agreement``; None without them): ``held_bytes``
    (parameters + optimizer state, what lives between steps) and ``agrees`` (held <= allocated
    <= peak, reserved <= peak reserved)."""

    rank: int
    allocated_bytes: int
    reserved_bytes: int
    held_bytes: int | None = None
    agrees: bool | None = None


class Allocation(msgspec.Struct, kw_only=True):
    rank: int
    block_size_bytes: int
    requested_size_bytes: int | None
    category: str
    top_frame: str | None


class DeviceMemory(msgspec.Struct, kw_only=True):
    """Peak memory of one device of one rank from the trace's ``[memory]`` events
    (analyzer/analyses/memory.py ``device_peaks``); ``device`` e.g. ``cuda:0``;
    ``peak_reserved_bytes`` None when the events do not say; ``start_bytes`` the live bytes
    assumed before the first event (frees of blocks allocated before the window)."""

    rank: int
    device: str
    events: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    start_bytes: int
    source: str


class MemoryFit(msgspec.Struct, kw_only=True):
    """``analyzer report --device-memory``: does the run's largest per-rank peak fit one device
    of ``device_bytes``? ``needed_bytes`` (None: no memory figure), ``basis`` which figure it is,
    ``spare_bytes`` = device_bytes - needed_bytes (negative: short by that much)."""

    device_bytes: int
    needed_bytes: int | None
    basis: str
    fits: bool | None
    """True / False; None when not known: no memory figure, or the figure is a lower bound
    (``lower_bound``) that fits -- the true peak may not. A lower bound above the device is
    False: the true peak is larger still."""
    spare_bytes: int | None
    lower_bound: bool = False
    """``needed_bytes`` is a lower bound of the peak (``Memory.peak_lower_bound``)."""


class ShardingRank(_Figures, kw_only=True):
    """One rank's parameters: what the sharding predicts (analyzer/analyses/sharding.py)
    beside what the rank holds (memory_categories.parquet ``parameters``)."""

    rank: int
    stage: int = -1
    """pp: the rank's pipeline stage; -1 otherwise."""
    expected_elements: float | None
    """The rank's share of the model's N parameters (elements; formula of ``ShardingPrediction``)."""
    expected_bytes: float | None
    """``expected_elements`` x 4 (fp32 parameters)."""
    padded_bytes: int | None = None
    """What the rank holds when the parameters' shapes are known (reference model): its padded
    FSDP2 shards (ceil(d0 / group) rows per parameter) x 4; None when not known."""
    measured_bytes: int | None = None
    check: str = "not_measured"
    """``exact`` (measured == padded_bytes), ``differs`` (padded known, measured another),
    ``at_least`` (no padded figure; measured >= expected_bytes), ``below`` (measured under the
    share), ``not_measured`` (no categories)."""
    gradients_expected_bytes: float | None = None
    """The gradients follow the parameters' shards (fp32 ``.grad`` of each local shard): the
    padded figure when known, else the share's bytes (a lower bound)."""
    gradients_measured_bytes: int | None = None
    gradients_check: str = "not_measured"
    """As ``check``, for memory_categories.parquet ``gradients``."""
    optimizer_state_expected_bytes: float | None = None
    """SGD (no momentum): 0; AdamW: exp_avg + exp_avg_sq (2 x the local view's elements x 4
    bytes: torch.chunk rows, without FSDP2's padding) + a 4-byte ``step`` per parameter tensor (analyzer/analyses/sharding.py
    ``optimizer_state_elements``); a lower bound without the shapes; None: unknown optimizer."""
    optimizer_state_measured_bytes: int | None = None
    optimizer_state_check: str = "not_measured"
    """As ``check``, for ``optimizer_state``."""


class ShardingPrediction(_Figures, kw_only=True):
    """What the run's sharding predicts for its parameters, gradients and optimizer state
    (analyzer/analyses/sharding.py): ``ratio`` = the largest rank's share of the N parameters
    (``largest_rank``; pp: the first rank of the stage with the most), the ratio to DDP the
    Memory section's "sharding predicts" column shows for the three sharded categories;
    ``formula`` it in symbols; ``exact``: every rank's ``padded_bytes`` is known (else each
    rank's share is a lower bound, ``basis`` says why)."""

    formula: str
    ratio: float | None
    largest_rank: int | None
    exact: bool
    basis: str
    bytes_per_element: int = 4
    ranks: list[ShardingRank] = []


class Memory(msgspec.Struct, kw_only=True):
    """A run's memory. ``peak_allocated_bytes``: the largest per-rank peak and
    ``peak_source`` where it comes from -- memory_categories.parquet's ``peak`` (CUDA allocator
    peak, or on CPU the sum of the categories) when recorded, else the traces' ``[memory]``
    events (foreign traces), else steps.parquet's CUDA / profiler-window peak (older records).
    ``by_category``: rows {rank, category, bytes} (issue 19); ``ranks``: steps.parquet's peaks
    (process RSS among them); ``devices``: the traces' ``[memory]`` peaks; from the CUDA allocator
    snapshot: ``snapshot_by_category``, ``snapshot_totals``, ``largest``; ``fit`` with
    ``--device-memory``."""

    peak_rss_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_source: str | None = None
    ranks: list[MemoryRank] = []
    by_category: list[MemoryCategory] = []
    devices: list[DeviceMemory] = []
    snapshot_by_category: list[SnapshotCategory] = []
    snapshot_totals: list[SnapshotTotal] = []
    largest: list[Allocation] = []
    fit: MemoryFit | None = None
    peak_lower_bound: bool = False
    """``peak_allocated_bytes`` is a lower bound of the true peak: a CPU record's sum of
    categories (the allocator keeps no peak; transient buffers are missing), a profiler-window
    peak (misses what was allocated before profiling), or a CPU trace's ``[memory]`` events."""
    sharding: ShardingPrediction | None = None
    """What the sharding predicts per rank (issue 27); None for foreign traces, an unknown
    strategy or FSDP1 options without a prediction."""


class CommKind(_Figures, kw_only=True):
    """One collective kind of a run: per-rank means over all profiled steps (collectives
    launched outside every ProfilerStep left out; without ProfilerStep the whole trace, step 0)
    of count, time_ns (a sum of durations: collectives running at once count each) and bytes
    (over the instances whose bytes are known; None when none is); ``unknown_bytes``: instances
    whose bytes the trace does not tell (all ranks); busbw over the ranks (nccl-tests); the
    ``_per_step`` figures count collectives inside profiled steps divided by the rank's profiled
    steps, mean over ranks."""

    count: float
    time_ns: float
    bytes: float | None
    busbw_gbps: float | None
    count_per_step: float | None
    time_ns_per_step: float | None
    bytes_per_step: float | None
    unknown_bytes: int = 0
    transfer_ns: float | None = None
    """Per-rank mean of all profiled steps' transfer time (analyzer/analyses/commsplit.py: from
    the last rank's start of each measured instance -- matched and one instance by the bound
    of analyzer/analyses/clock.py -- to its end); transfer_ns + wait_ns + not_measured_ns =
    time_ns. None when no instance of the kind is measured."""
    wait_ns: float | None = None
    """Per-rank mean of all profiled steps' time spent inside measured instances waiting for
    the group's last rank to start them (None: none measured)."""
    transfer_ns_per_step: float | None = None
    wait_ns_per_step: float | None = None
    not_measured_ns: float | None = None
    """Per-rank mean of the time in instances that are not measured (unmatched, outside the
    one-instance bound, or on a rank whose clock is inconsistent): neither wait nor transfer."""
    not_measured_ns_per_step: float | None = None
    transfer_busbw_gbps: float | None = None
    """busbw over the ranks (nccl-tests, as ``busbw_gbps``) with transfer time in place of the
    whole duration, over the measured instances only: the bandwidth of the data's movement,
    without the wait for the slowest rank that ``busbw_gbps`` includes. None when no
    instance is measured."""


class CommGroup(_Figures, kw_only=True):
    """One (kind, process group, dtype) of a run, all profiled steps (as ``CommKind``): per-rank
    means of count, time_ns (sum of durations) and bytes (known instances; None when none is
    known) over the ``n_ranks`` ranks that ran it (the group's members seen in the traces, not
    every rank of the job); ``pg`` "", ``pg_ranks`` "" and ``dtype`` "" when the trace does not
    say; ``group_size`` None when unknown (analyzer/ingest/commid.py); busbw over the ranks
    with the group's size (nccl-tests; None when the size is unknown)."""

    kind: str
    pg: str
    pg_ranks: str
    group_size: int | None
    dtype: str
    n_ranks: int | None = None
    """Ranks that ran this (kind, pg, dtype): what the per-rank means divide by (None in a
    report.json written before the field)."""
    count: float
    time_ns: float
    bytes: float | None
    unknown_bytes: int
    busbw_gbps: float | None
    transfer_busbw_gbps: float | None = None
    """busbw from transfer time (``CommKind.transfer_busbw_gbps``)."""
    mesh_dim: str = ""
    """The mesh dimension of ``pg`` (analyzer/analyses/meshdims.py ``dim_of``: "shard", "tp",
    "world", an ``inferred_...`` name, "unknown"); "" in a report.json written before the
    field."""
    mesh_dim_source: str = ""
    """How ``mesh_dim`` was found: "pg_desc" (torch's ``mesh_<name>`` description), "manifest"
    (the manifest's mesh), "ranks" (inferred from the group's ranks), "none"; "" before the
    field."""


class MeshDimComm(_Figures, kw_only=True):
    """The collectives of one mesh dimension of a run (analyzer/analyses/meshdims.py), all
    profiled steps (as ``CommGroup``): per-rank means over the ``n_ranks`` ranks that ran any
    of them. ``time_ns``: sum of durations; ``union_ns``: time with at least one of the
    dimension's collectives running, inside the step windows (never above the steps);
    ``exposed_ns``: the part of ``union_ns`` no computation overlaps (the interval algebra of
    the breakdown's ``exposed_comm_ns``); the ``_per_step`` figures: a rank's figure over its
    profiled steps, mean over the ranks. ``bytes``: nccl-tests bytes of the instances whose
    bytes are known (None: none is); busbw with the dimension's ``group_size`` (nccl-tests
    factors; None when the size is unknown, except broadcast / send_recv). transfer / wait /
    not measured as ``CommKind``'s."""

    name: str
    """"replicate", "shard", "dp", "tp", "pp" (manifest or pg_desc), "world" (the default
    group), ``inferred_consecutive_n<k>`` / ``inferred_stride<s>_n<k>`` /
    ``inferred_group_<pg>`` (from the group's ranks), "unknown" (no process group named)."""
    source: str
    """"pg_desc", "manifest", "ranks" or "none" (``CommGroup.mesh_dim_source``)."""
    group_size: int | None
    groups: int | None
    """Distinct named process groups of the dimension over the ranks (None: none named)."""
    pgs: list[str] = []
    kinds: list[str] = []
    n_ranks: int
    count: float
    time_ns: float
    union_ns: float
    exposed_ns: float
    time_ns_per_step: float | None = None
    union_ns_per_step: float | None = None
    exposed_ns_per_step: float | None = None
    bytes: float | None = None
    unknown_bytes: int = 0
    busbw_gbps: float | None = None
    transfer_busbw_gbps: float | None = None
    transfer_ns: float | None = None
    wait_ns: float | None = None
    not_measured_ns: float | None = None


class CommRank(_Figures, kw_only=True):
    """One (rank, collective kind) of a run, split into transfer and waiting for the group's
    slowest rank (analyzer/analyses/commsplit.py): sums over all profiled steps (as
    ``CommKind``), ``time_ns`` = ``transfer_ns`` + ``wait_ns`` + ``not_measured_ns`` (sum of
    durations); ``unmatched`` instances (no match on another rank with a usable clock) and
    ``inconsistent`` ones (matched, outside the one-instance bound of
    analyzer/analyses/clock.py) are not measured; ``transfer_ns`` / ``wait_ns`` None when no
    instance is measured; the ``_per_step`` figures: the rank's collectives inside profiled
    steps over its number of profiled steps (None without steps)."""

    rank: int
    kind: str
    count: int
    time_ns: int
    transfer_ns: int | None
    wait_ns: int | None
    unmatched: int
    not_measured_ns: int = 0
    inconsistent: int = 0
    measured: int = 0
    time_ns_per_step: float | None = None
    transfer_ns_per_step: float | None = None
    wait_ns_per_step: float | None = None
    not_measured_ns_per_step: float | None = None


class DataSupply(_Figures, kw_only=True):
    """The run's data supply (analyzer/analyses/datasupply.py); ``workers`` ... ``sampler`` are the
    manifest's ``data`` entry and absent when it has none."""

    source: str | None
    workers: int | UnsetType = UNSET
    pin_memory: bool | UnsetType = UNSET
    sample_cost_ms: float | UnsetType = UNSET
    sampler: str | UnsetType = UNSET
    threshold_frac: float
    data_wait_frac: float | None = None
    worst_rank: int | None = None
    worst_rank_frac: float | None = None
    worst_rank_exposed_comm_frac: float | None = None
    input_bound: bool = False
    input_bound_steps: int = 0
    steps: int = 0


class RankFigures(_Figures, kw_only=True):
    """One rank: means per profiled step (ns) and shares over its steps."""

    rank: int
    steps: int
    step_ns: float | None
    compute_ns: float | None
    comm_ns: float | None
    exposed_comm_ns: float | None
    data_wait_ns: float | None
    other_ns: float | None
    idle_ns: float | None
    overlap_frac: float | None
    data_wait_frac: float | None
    input_bound_steps: int
    clock_offset_ns: int | None = None
    """This rank's clock minus the lowest rank's, from matched collective ends
    (analyzer/analyses/clock.py, the offset ``summary`` and ``merge`` use); None when it is
    not measured (``clock`` "unresolved", "inconsistent" or "unmatched": 0 is applied)."""
    clock: str | None = None
    """``clock.estimate_offsets``' state of this rank's clock: reference, measured,
    unresolved (|estimate| < its MAD), inconsistent (causality bounds contradict), unmatched;
    None for a one-rank run."""
    last_step_tail_ns: int | None = None
    """GPU rank: the idle of its last profiled step after its last device activity, the window
    its first device work + its CPU ProfilerStep span gives a step no next step ends
    (analyzer/analyses/breakdown.py, analyzer/ingest/steps.py rule 4); 0 when the window ends
    at its last device work. Included in ``idle_ns`` (as last_step_tail_ns / steps) and
    ``step_ns``; HTA and TraceLens, which measure idle up to the last kernel, do not count it.
    None on a CPU rank."""
    transfer_ns: float | None = None
    """Its collectives' transfer per profiled step: the part of each measured collective after
    the group's last rank started it (analyzer/analyses/commsplit.py), summed over kinds (the
    rank's ``comm_ranks[].transfer_ns_per_step``); 0 without collectives, None when the rank
    has collectives and none is measured (issue 42)."""
    work_ns: float | None = None
    """The rank's own work per profiled step: ``compute_ns`` + ``transfer_ns`` (a transfer under
    computation counts in both), never its waiting for other ranks or its idle; what the
    imbalance finding compares (analyzer/analyses/findings.py). None when either is None."""


class StepBar(_Figures, kw_only=True):
    """One profiled step: means over ranks (ns)."""

    step: int
    step_ns: float | None
    compute_ns: float | None
    exposed_comm_ns: float | None
    data_wait_ns: float | None
    other_ns: float | None
    idle_ns: float | None


class Interval(msgspec.Struct, kw_only=True):
    lane: str
    kind: str
    start_ns: int
    end_ns: int


class Timeline(msgspec.Struct, kw_only=True):
    """Compute and communication intervals of one rank's first profiled step, times from the
    step's start."""

    rank: int
    step: int
    step_ns: int
    intervals: list[Interval]
    start_ns: int = 0
    """In ``RunEntry.rank_timelines``: this rank's step start on aligned clocks (its trace
    clock minus ``ranks[].clock_offset_ns``; 0 applied where not measured) minus the earliest
    such start among the run's ranks, so ``start_ns + intervals[].start_ns`` puts every rank
    on one time axis. 0 in ``RunEntry.timeline``."""


class PrefetchUnit(_Figures, kw_only=True):
    phase: str
    unit: str
    n: int
    prefetched: float | None
    comm_ns: float | None
    hidden_frac: float | None
    slack_ns: float | None
    min_slack_ns: Num
    ahead_units: int | None = None
    """The most units ahead of its use one of the unit's all_gathers was issued (issue 45): 0
    its own hook issued each, 1 the previous unit's hook (FSDP2's implicit backward prefetch,
    explicit depth 1), 2 two units before (explicit depth 2); analyzer/analyses/prefetch.py.
    None where not known."""
    group_size: int | None = None
    """Ranks each of the unit's all_gathers in this phase ran over, when they all agree (FSDP2
    ``reshard_after_forward=N``: N in backward); None when they differ or are not known."""


class Prefetch(_Figures, kw_only=True):
    """FSDP all_gathers of all ranks and profiled steps (analyzer/analyses/prefetch.py), per unit."""

    all_gathers: int
    prefetched: int
    comm_ns: int
    hidden_ns: int
    hidden_frac: float | None
    late: int
    unknown: int  # all_gathers whose slack could not be measured (no consumer / execution)
    wait_ns: int
    labels: str
    note: str | None
    units: list[PrefetchUnit]


class PipelineStage(_Figures, kw_only=True):
    """One pipeline stage of a ``pp`` run (analyzer/analyses/pipeline.py ``stage_bubbles``):
    means per rank and profiled step (ns) over the stage's ``ranks``; bubble_ns =
    exposed_comm_ns + idle_ns of the breakdown (``Pipeline.bubble_rule``), bubble_frac = its
    sum over the stage's ranks and steps / their step time."""

    stage: int
    ranks: list[int]
    rank_steps: int
    step_ns: float | None
    compute_ns: float | None
    bubble_ns: float | None
    bubble_frac: float | None


class PipelinePair(_Figures, kw_only=True):
    """Send / recv calls from stage ``src_stage`` to ``dst_stage`` (-1: not known), per
    profiled step, summed over the ranks of both stages (analyzer/analyses/pipeline.py
    ``p2p_pairs``): a send counts on the sender, a recv on the receiver, so a complete trace
    has sends == recvs; ``calls`` - sends - recvs: direction not known; bytes None when no
    call says; ``peer_source`` how the peer stage is known: ``peer`` (the tracer's pg tag
    names the peer rank), ``mesh`` (no peer, two stages: the other one), ``unknown``."""

    src_stage: int
    dst_stage: int
    peer_source: str
    calls: float
    sends: float
    recvs: float
    send_bytes: float | None
    recv_bytes: float | None
    time_ns: float
    send_ns: float
    recv_ns: float


class Pipeline(_Figures, kw_only=True):
    """Pipeline parallelism of a ``pp`` run (issue 27): ``stages`` P, ``microbatches`` M,
    ``schedule`` (tracer/config.py PP_SCHEDULES), ``dp`` ranks per stage; ``ideal_bubble_frac``:
    the schedule's formula, (P - 1) / (M + P - 1) for gpipe / 1f1b (analyzer/analyses/
    pipeline.py ``IDEAL_BUBBLES``, ``ideal_source``; None without M) beside each stage's measured
    bubble (``per_stage``) and the traffic between stages (``pairs``)."""

    stages: int
    microbatches: int | None
    schedule: str | None
    dp: int
    ideal_bubble_frac: float | None
    ideal_source: str
    bubble_rule: str
    per_stage: list[PipelineStage] = []
    pairs: list[PipelinePair] = []
    virtual_stages: int = 1
    """Stages per pp rank V (``--pp-virtual``; the model is cut into ``stages`` x V stages, and
    ``per_stage`` lists the pp ranks' coordinates, each with all its V stages); 1 for gpipe /
    1f1b and runs recorded before issue 45."""
    schedule_class: str | None = None
    """The torch.distributed.pipelining class the run used (the manifest's
    ``mesh.pp_schedule_class``); None in runs recorded before issue 45."""
    stage_ids: list[list[int]] = []
    """Per pp rank (``per_stage``'s ``stage`` coordinate), the global stage indices it ran (the
    manifest's ``mesh.pp_stage_ids``: zbv's rank 0 runs stages 0 and 2P - 1); empty in runs
    recorded before issue 45 (one stage per rank, its coordinate)."""


class TraceInfo(msgspec.Struct, kw_only=True):
    whole_trace_mode: bool
    rank_sources: list[str]
    missing_ranks: list[int]
    device_kind: str
    trace_warnings: list[str]


class StragglerCause(_Figures, kw_only=True):
    """Why rank ``rank`` is the one its peers wait for (issue 28, analyzer/analyses/straggler.py):
    over the measured collectives of ``kind`` it started last (``times_last``), its lateness
    (``late_ns``: the sum of their start skews, what the others waited) split into what the
    traces hold before each of them, against its peers over the same interval: device compute
    longer than theirs, host-side delay (its device idle while the next work was not yet
    launched), data wait, an earlier collective of its own, its step's start after the first
    rank's where the gap begins there (late_step_start, issue 42: the delay lies before the
    step's window), and what none of these explains (``split_ns``, summing to ``late_ns``). ``cause``: the part that explains at least
    ``CAUSE_THRESHOLD`` of it (``explained_frac``), else None ("cause not established");
    ``rule`` says how it was found."""

    rank: int
    kind: str
    times_last: int
    late_ns: float
    split_ns: dict[str, float] = {}
    cause: str | None = None
    explained_frac: float | None = None
    rule: str = ""


class Evidence(msgspec.Struct, kw_only=True):
    """One figure a finding rests on: ``value`` in ``unit`` ("ns", "bytes", "frac", "GB/s",
    "count"), and ``path``, the JSON pointer (RFC 6901) of the same figure in report.json
    (e.g. "/runs/2/ranks/0/exposed_comm_ns"), so a reader -- and a test -- can check it."""

    figure: str
    value: float | None
    unit: str
    path: str


class Finding(msgspec.Struct, kw_only=True):
    """A conclusion drawn from the report's figures (issue 28, analyzer/analyses/findings.py):
    ``kind`` (FINDING_KINDS), a one-line ``title``, what it concerns (``runs``, ``ranks``,
    FSDP ``units``, ``mesh_dims``), its ``evidence``, a ``cause`` where one is established and
    the ``cause_rule`` that established it with the share of the effect it explains
    (``explained_frac``; a cause is named only at or above ``CAUSE_THRESHOLD``), a suggested
    ``action`` where one follows, and ``severity_ns``: the step time at stake, per step (ns)."""

    kind: str
    title: str
    runs: list[str] = []
    ranks: list[int] = []
    units: list[str] = []
    mesh_dims: list[str] = []
    evidence: list[Evidence] = []
    cause: str | None = None
    cause_rule: str | None = None
    explained_frac: float | None = None
    action: str | None = None
    severity_ns: float | None = None


class FlightRecorderRank(msgspec.Struct, kw_only=True):
    """One rank of a process group in its Flight Recorder dump (analyzer/analyses/flightrec.py)."""

    rank: int
    """Global rank (from the dump's file name, as torch's fr_trace takes it)."""
    last_enqueued_seq: int
    """The last collective of the group it entered: its newest collective entry (pg_status where that counts collectives alone)."""
    last_completed_seq: int
    """The last sequence number it completed (gloo: ended, unless a member never entered it: then ``failed_seq``)."""
    waiting_in: str | None = None
    """The first collective it entered and had not completed ("all_reduce #8"); None when none."""
    failed_seq: int | None = None
    """The collective it entered that ended without completing: gloo retires a failed (e.g.
    timed-out) collective as it does a completed one, so one a dumped member never entered
    ended in error on the ranks that ended it (their ``last_completed_seq`` stays below it);
    None when none is known."""


class FlightRecorderMismatch(msgspec.Struct, kw_only=True):
    """A rank's entry of one collective that does not match the reference rank's by torch
    fr_trace's ``Op.match`` (its state check left out)."""

    seq: int
    """The collective's sequence number in its process group (``collective_seq_id``)."""
    kind: str
    """The reference rank's kind of it ("all_reduce")."""
    fr_state: str
    """fr_trace's MatchState: COLLECTIVE_TYPE_MISMATCH, SIZE_OR_SYNTAX_MISMATCH or COLLECTIVE_DTYPE_MISMATCH."""
    mismatch: str
    """The same in a word: kind, size or dtype."""
    rank: int
    """The rank whose entry differs."""
    reference_rank: int
    """The rank it is compared with: the lowest rank holding the collective (fr_trace's first rank)."""
    detail: str
    """What differs, e.g. "input sizes [[8]] where the reference has [[4]]"."""


class FlightRecorderP2P(msgspec.Struct, kw_only=True):
    """A send or recv one rank entered and did not complete, whose peer never entered the
    matching op (its dump holds no pending recv / send with that rank)."""

    rank: int
    """The global rank that entered the op."""
    op: str
    """send or recv."""
    peer: int
    """The global rank it sends to / receives from."""
    p2p_seq: int
    """Its ``p2p_seq_id``: the rank's count of point-to-point ops in the group (sends and recvs
    together, every peer: ProcessGroupNCCL ``seqP2P_``)."""


class FlightRecorderGroup(msgspec.Struct, kw_only=True):
    """One process group across the ranks' Flight Recorder dumps (analyzer/analyses/flightrec.py)."""

    pg: str
    """FR's process group name ("0": the default group)."""
    desc: str = ""
    """Its description (default_pg, or the group_desc given to new_group)."""
    ranks: list[int] = []
    """Its member global ranks."""
    ranks_source: str = ""
    """Where the members come from: pg_config (a dump's), world (the default group), dumps (the ranks naming it)."""
    dumped_ranks: list[int] = []
    """Members with a dump."""
    missing_dumps: list[int] = []
    """Members without a dump (nothing is known of them)."""
    last_completed_seq: int | None = None
    """The last sequence number every dumped member completed; None when no member has a dump."""
    next_seq: int | None = None
    """The first collective some member never entered; None when every member entered the same last one."""
    next_kind: str | None = None
    """Its kind ("all_reduce"), from the members that entered it."""
    never_entered: list[int] = []
    """The members that never entered ``next_seq``."""
    entered: list[int] = []
    """The members that entered ``next_seq`` and waited in it."""
    per_rank: list[FlightRecorderRank] = []
    """Each dumped member's last entered and completed collective."""
    mismatches: list[FlightRecorderMismatch] = []
    """The group's first kind / size / dtype mismatch, one row per differing rank ([] when none)."""
    statement: str = ""
    """The line the report prints for ``verdict`` ("rank 1 never entered all_reduce #7 of process
    group 0; rank 0 waited in it"); "" when ``verdict`` is "" (then ``summary`` says the state)."""
    verdict: str = ""
    """What the dumps establish for the group (analyzer/analyses/flightrec.py): "" none (every
    member completed its last collective, no collective recorded, or a member without a dump
    and nothing else wrong); "collective_hang" (a member never entered the next collective, or
    every member entered it and some did not complete it); "mismatch" (no collective hang, and
    fr_trace's Op.match finds a kind / size / dtype mismatch);
    "p2p_pending" (no collective verdict, and a send or recv a member entered and did not
    complete whose peer never entered the matching op). Collective verdicts come from the
    group's collective entries only: a group with only send / recv entries never gets one."""
    p2p_pending: list[FlightRecorderP2P] = []
    """The point-to-point ops a member entered and did not complete whose peer's dump holds no
    pending matching op ([] when none), by rank."""
    summary: str = ""
    """The group's state in one line whatever its verdict ("process group 0: every rank completed
    all_reduce #3, its last"); the Hangs section prints it where no group has a verdict."""


class FlightRecorder(msgspec.Struct, kw_only=True):
    """Issue 30: what the run's Flight Recorder JSON dumps say (a failed record's
    ``rank<r>.flightrec.json``, or FR dumps beside foreign traces), per process group."""

    dumps: list[str] = []
    """The dump files read, by rank."""
    ranks: list[int] = []
    """The ranks they are of."""
    groups: list[FlightRecorderGroup] = []
    """One entry per process group named in the dumps, in group-name order."""
    rule: str = ""
    """How entered, completed and mismatches are decided (analyzer/analyses/flightrec.py)."""
    notes: list[str] = []
    """What the analysis set aside: a group's pg_status that counts point-to-point ops, pg_config ranks no group of the job can hold, dumps without entries."""
    pickled_ranks: list[int] = []
    """Ranks whose dump beside the others is in torch's pickle format (``nccl_trace_rank_<r>``):
    never read; the groups' lines say "its dump is a pickle (not read)" for them, not "no dump"."""


RANK_TIMELINES_MAX = 16
"""The most ranks ``RunEntry.rank_timelines`` holds (the lowest ranks): a picture of more is
not read rank by rank, and report.json stays small."""
FINDING_KINDS = ("hang", "parity_failed", "straggler", "exposed_communication", "prefetch_late",
                 "input_bound", "host_bound", "imbalance", "memory_does_not_fit", "low_busbw",
                 "mesh_dimension", "pipeline_bubble")
CAUSE_THRESHOLD = 0.8
"""A cause is named only when it explains at least this share of the effect (TraceML's 80 %)."""


def machine_busy(machine: dict | None) -> bool:
    """The one rule of a busy record (a RunEntry's ``machine``, the manifest's ``Machine`` as a
    dict): oversubscribed, or its 1-minute load at the start at or above its usable CPUs.
    False without a machine (foreign traces) or without its figures."""
    m = machine or {}
    cpus, load = m.get("usable_cpus"), (m.get("load_avg") or [None])[0]
    return bool(cpus) and (bool(m.get("oversubscribed")) or (load is not None and load >= cpus))


class ProjectedStep(_Figures, kw_only=True):
    """A projection's training step at world ``world_size`` (analyzer/compare/projection.py):
    the roles' compute and collective calls replayed with each call's time on the link model
    (analyzer/analyses/projstep.py). Times in ns."""

    world_size: int
    """The projected world N."""
    steps: int
    """Profiled steps of the projection replayed."""
    step_ns: int
    """Median over those steps of the replayed step (the slowest role's)."""
    low_ns: int
    """The interval's low end: the fastest step replayed with each link time's low."""
    high_ns: int
    """Its high end: the slowest step replayed with each link time's high."""
    compute_ns: int
    """The median step's compute (the slowest role's, x ``compute_scale``)."""
    comm_ns: int
    """Link time of the median step's calls of the slowest role, overlapped or not."""
    exposed_comm_ns: int
    """Its part under no compute: step_ns - compute_ns of the median step."""
    exposed_by_dim_ns: dict[str, int] = {}
    """Exposed communication per mesh dimension ("world" where the group is the world)."""
    tokens_per_s_per_device: float | None = None
    """global batch x sequence length / step / world size; None for inputs without a sequence."""
    overlap: str = ""
    """The overlap rule the replay applied."""
    compute_scale: float = 1.0
    """What the compute was multiplied by (CPU ranks sharing cores), 1 where not."""
    link_sources: list[str] = []
    """The link curves' sources."""
    outside_sizes: list[str] = []
    """Calls (kind, bytes) outside a curve's measured sizes: flagged, not extrapolated silently."""
    assumptions: list[str] = []
    """What the projection assumes beyond what it measured, one line each."""
    warnings: list[str] = []
    """What makes the step doubtful: compute and links measured on different kinds of machine."""


class RunEntry(_Figures, kw_only=True):
    """One run of the report. ``settings``/``options`` are the manifest's (None / {} for
    foreign traces); ``caveats`` say where a figure covers less than the whole run, ``notes``
    what loading skipped."""

    name: str
    path: str = ""
    strategy: str
    options: dict[str, Any] = {}
    fault: str | None = None
    world_size: int | None = None
    backend: str | None = None
    device: str | None = None
    settings: dict[str, Any] | None = None
    parity: Parity
    traces: list[str] = []
    step_time_ns: StepTime = msgspec.field(default_factory=StepTime)
    memory: Memory = msgspec.field(default_factory=Memory)
    communication: dict[str, CommKind] = {}
    comm_groups: list[CommGroup] = []
    comm_ranks: list[CommRank] = []
    """Per rank and kind: transfer and waiting for the slowest rank (``CommRank``)."""
    mesh_dims: list[MeshDimComm] = []
    """Communication per mesh dimension (``MeshDimComm``): the manifest mesh's dimensions in
    order, then "world", then the rest; [] without collectives (and in older report.json)."""
    comm_ns_per_step: float | None = None
    """Communication per profiled step: the union of the rank's collective intervals inside
    the step (time with at least one collective running; never above the step), mean over
    ranks and steps (breakdown comm_ns)."""
    profiled_steps: int | None = None
    overlap_frac: float | None = None
    exposed_comm_ns: float | None = None
    data: DataSupply | None = None
    ranks: list[RankFigures] = []
    prefetch: Prefetch | None = None
    steps: list[StepBar] = []
    timeline: Timeline | None = None
    rank_timelines: list[Timeline] = []
    """Issue 28: every rank's ``Timeline`` of the same profiled step (the lowest rank's first,
    the one ``timeline`` shows), ranks in order, at most ``RANK_TIMELINES_MAX`` (the lowest),
    each placed on the run's aligned time axis by ``start_ns``: report.html's per-rank
    timeline. A rank whose first profiled step is another one is left out; [] without traces
    (and in older report.json)."""
    trace_info: TraceInfo | None = None
    incomplete: bool = False
    caveats: list[str] = []
    notes: list[str] = []
    speedup_vs_single: float | None = None
    experiment: dict[str, Any] | None = None
    """The manifest's ``experiment`` (id, arm, repeat, repeats, order); None in older records
    and foreign traces."""
    machine: dict[str, Any] | None = None
    """The manifest's ``machine`` (load average, CPUs, threads per rank, oversubscribed)."""
    exposed_comm_step_ns: list[float] = []
    """Exposed communication of every profiled step (mean over ranks), in step order: what the
    performance gate's interval resamples."""
    pipeline: Pipeline | None = None
    """A ``pp`` run's stages, bubbles and stage-to-stage traffic (``Pipeline``); None for other
    runs."""
    stragglers: list[StragglerCause] = []
    """Issue 28: the ranks its collectives wait for, each with the cause of its lateness."""
    flight_recorder: FlightRecorder | None = None
    """Issue 30: the Flight Recorder dumps beside the run's traces (a failed record's, or FR
    JSON dumps in a folder of traces), per process group; None without dumps."""
    projection: dict[str, Any] | None = None
    """Issue 44: the manifest's ``projection`` of a ``tracer project`` run (world_size, roles_run,
    device, fake_process_group): its ranks are the roles run at that world size on torch's fake
    process group; None for a record or foreign traces. Fake tensors (``tracer project
    --fake-tensors``): ``fake_tensors`` true, ``op_durations`` "meta_kernels" (the trace's op
    times are not the device's), the assumed ``device_tflops`` (10^12 FLOP/s) and
    ``device_mem_gbps`` (10^9 bytes/s), and ``compute_estimate``: per role and operator,
    ``calls_per_step``, ``flops_per_step``, ``bytes_per_step``, ``estimated_ns_per_step``
    (a roofline of the two; null without them), and ``live_peak_bytes``: per role (its rank
    as a string), the peak of its live tensor bytes on its device in the profiled steps
    (tracer/livebytes.py); with real tensors false, "measured", null, null, [], {}."""
    projected_step: ProjectedStep | None = None
    """Issue 44 Deliver 3: a projection's step at its world size from the link model
    (``--link-model``; analyzer/compare/projection.py); None for a record, or without a link
    model."""
    compute_kernels_per_step: float | UnsetType = UNSET
    """Issue 45: kernels per rank per profiled step (mean over ranks and steps of the
    breakdown's ``compute_kernels``: GPU compute kernels, or on a CPU rank the compute ops
    that enclose no other, inductor's fused kernels among them); a count, free of step-time
    noise, compared between declared arms (``Ranking.differences``). Absent outside declared
    arms (``experiment.settings``) and without profiled steps."""
    compile_warmup: dict[str, Any] | UnsetType = UNSET
    """Issue 45: a ``--compile`` record's compile warm-up, the manifest's ``compile_warmup``:
    ``compile_ns_by_step`` (rank 0's time compiling in each step, ns), ``first_step_wall_ns``,
    ``profiled_compile_ns`` (compile time inside profiled steps, ns: in their step times; 0 when
    none). Absent for an eager run."""

    @property
    def arm(self) -> str:
        """The run's arm: ``experiment.arm`` (the run name without ``.r<k>``), else its name."""
        return (self.experiment or {}).get("arm") or self.name

    @property
    def is_reference(self) -> bool:
        """The reference, shown beside the ranking, never ranked (its strategy row's
        ``is_reference``) unless a declared arm (``experiment.settings``): the one definition
        the ranking (``Ranking.reference``) and every renderer read."""
        return (strategies.is_reference(self.strategy)
                and (self.experiment or {}).get("settings") is None)


class Noise(msgspec.Struct, kw_only=True):
    """Whether a ranking is a basis for a decision (ranking.py NOISE_RULE): ``close_pairs`` are
    ``[faster, slower, ratio - 1, why]`` for each neighbour pair of ``order`` that ``pairs``
    calls within noise; ``decisive`` when there is none."""

    cpu: bool
    close_pairs: list[tuple[str, str, float | None, str]]
    decisive: bool
    min_repeats: int = 5
    """Fewest repeats per arm for a decision (analyzer/compare/stats.py ``MIN_REPEATS``): below
    it no pair is called faster and no interval is shown (``Pair.undecided``)."""
    min_difference: float = 0.05
    """Smallest ratio beyond 1 called a difference (``stats.MIN_DIFFERENCE``, 0.05: 5 %): what
    identical records differ by on one machine."""


class Pair(_Figures, kw_only=True):
    """Two strategies (arms) of one experiment (analyzer/compare/ranking.py): ``ratio`` =
    ``slower``'s median step time / ``faster``'s (>= 1; ``faster`` is the one with the lower
    median, *called* faster only when ``decision`` is ``faster``), 95 % interval ``ci_low`` ..
    ``ci_high`` by ``method`` over ``repeats`` repeats per arm and ``steps`` steps in all;
    ``decision`` ``faster`` when the interval excludes 1 (and each arm has at least
    ``stats.MIN_REPEATS`` repeats), else ``within_noise``; ``repeats_needed``: repeats per arm
    that would resolve a difference of this ratio (None: unknown, e.g. below
    ``stats.MIN_REPEATS`` repeats, whose spread is no basis for a count);
    ``sentence``: the pair in words (declared arms named by their strategy and the settings in
    which they differ, analyzer/contract/arms.py). Below ``stats.MIN_REPEATS`` repeats
    ``ci_low`` / ``ci_high`` are kept but are no basis for a decision (the percentile interval of
    so few repeats is too narrow): the sentence and the decision line show the ratio alone,
    labelled (``undecided``)."""

    faster: str
    slower: str
    ratio: float | None
    ci_low: float | None
    ci_high: float | None
    method: str
    decision: Literal["faster", "within_noise"]
    repeats: int
    steps: int
    paired: bool
    repeats_needed: int | None = None
    sentence: str = ""
    undecided: Literal["one_run", "few_repeats", "small_difference", "interval_includes_1"] | None = None
    """Why ``decision`` is ``within_noise`` (None when ``faster``): ``one_run`` (1 repeat per
    arm: the interval holds one run's steps only) or ``few_repeats`` (2 to
    ``Noise.min_repeats`` - 1): too few to measure run-to-run variation, no interval shown;
    ``small_difference``: the interval excludes 1 but the ratio is under 1 +
    ``Noise.min_difference``, a difference identical records show on one machine;
    ``interval_includes_1``: the interval does not exclude 1."""


class Arm(_Figures, kw_only=True):
    """One arm of the ranked experiment (a strategy, or a declared arm of ``tracer record --arm``
    / ``--sweep``): its runs (one per repeat), median over all their profiled steps (ns), lowest
    peak allocated memory over them (bytes)."""

    name: str
    strategy: str
    runs: list[str]
    median_ns: float | None
    steps: int
    peak_allocated_bytes: int | None = None
    settings: dict[str, Any] = {}
    """A declared arm's recorder options on which the experiment's arms differ (the manifest's
    ``experiment.settings``, e.g. ``{"reshard_after_forward": false}``); ``{}`` for an arm of a
    strategy experiment, or when the declared arms differ in nothing."""
    label: str = ""
    """The arm in words: ``fsdp2 with reshard_after_forward=False``, the arm's name added where
    it says more than its settings (``(arm noreshard)``, analyzer/contract/arms.py); the name for
    an arm of a strategy experiment."""


class ArmDifference(msgspec.Struct, kw_only=True):
    """One figure on which the ranked arms of a declared experiment differ
    (analyzer/compare/armdiff.py), measured without step-time noise: what the runs did, per
    rank, not how long it took. ``what``: ``collective_calls`` / ``collective_bytes`` (``kind`` a collective kind,
    ``mesh_dim`` its mesh dimension; per rank, mean over the ranks of the dimension, per
    profiled step), ``memory`` (``kind`` a memory category of memory_categories.parquet, or
    ``peak`` for an allocator peak; bytes on the arm's largest rank) or ``memory_unseen`` (the
    arms differ in a setting whose memory lives in buffers this device's record cannot see:
    ``values`` all None, ``settings`` names them, ``why`` says what is not seen) or
    ``compute_kernels`` (issue 45: kernels per rank per profiled step,
    ``RunEntry.compute_kernels_per_step``; ``kind`` "compute")."""

    what: Literal["collective_calls", "collective_bytes", "memory", "memory_unseen", "compute_kernels"]
    """What the figure is: collective calls or bytes per step, memory per rank, or a memory
    effect this device's record cannot see."""
    kind: str = ""
    """The collective kind (``all_gather``) or the memory category (``parameters``, ``peak``);
    "" for ``memory_unseen``."""
    mesh_dim: str = ""
    """The collectives' mesh dimension (``CommGroup.mesh_dim``); "" for memory."""
    unit: Literal["calls_per_step", "bytes_per_step", "bytes", "kernels_per_step", ""] = ""
    """The unit of ``values``: calls or bytes per profiled step (per rank), bytes per rank;
    "" for ``memory_unseen``."""
    values: dict[str, float | None] = {}
    """Arm name -> its figure in ``unit`` (the mean over its repeats; memory: the largest over
    them), arms in the experiment's declared order; None: not measured."""
    settings: list[str] = []
    """``memory_unseen``: the declared settings the arms differ in whose memory effect is
    transient (analyzer/compare/armdiff.py ``TRANSIENT_MEMORY``)."""
    why: str = ""
    """``memory_unseen``: why the record cannot see it, e.g. ``CPU records sum categories;
    transient unsharded parameters are not seen``."""


class Ranking(msgspec.Struct, kw_only=True):
    """``status`` ``ranked`` (``order``: the arms fastest first, the single-device reference
    left out; ``pairs`` every two of them; ``noise``) or ``withheld``. ``experiment``: the id of
    the experiment ranked (None for older records); ``reference``: the single-device arm (None
    for declared arms: every arm is ranked); ``descriptive``: runs outside that experiment,
    compared in the tables only."""

    status: Literal["ranked", "withheld"]
    order: list[str]
    reason: str
    rule: str
    noise: Noise | UnsetType = UNSET
    pairs: list[Pair] = []
    arms: list[Arm] = []
    experiment: str | None = None
    reference: str | None = None
    descriptive: list[str] = []
    declared: bool = False
    """An experiment of declared arms (``tracer record --arm`` / ``--sweep``: its runs carry
    ``experiment.settings``): every arm is ranked, single-device ones too; an arm that failed
    parity or has none is left out (``reason`` names it and its first divergence) and the others
    are ranked; the settings the arms declare may differ (analyzer/compare/ranking.py
    ``OPTION_SETTINGS``)."""
    left_out: list[str] = []
    """Declared arms left out for their parity, one line each: ``arm skipgrad failed the parity
    gate (first divergence in grad layers.0.attn.weight)``."""
    missing: list[str] = []
    """What of the experiment (declared arms, or strategies recorded with ``--repeat``) is not
    in the report, one line each -- an arm its runs' ``experiment.order`` lists with no complete
    run here (``arm b: no complete run in this report, not ranked``), an arm with fewer complete
    repeats than ``experiment.repeats`` (``arm a: 1 of 4 repeats``; ranked on those it has)."""
    differences: list[ArmDifference] | UnsetType = UNSET
    """Declared arms (``declared``, ranked, two or more arms): the figures on which the arms
    differ that do not depend on step-time noise -- kernels per step (issue 45), collective
    calls and bytes per step by kind and mesh dimension, memory by category where the record can measure it, and
    ``memory_unseen`` where it cannot (analyzer/compare/armdiff.py); only figures that differ
    between arms (``[]``: none does). Absent from report.json otherwise."""

    def speedup(self, arm: Arm) -> float | None:
        """The ``reference`` arm's median step time over ``arm``'s; None without either."""
        ref = next((a for a in self.arms if a.name == self.reference), None)
        ok = ref is not None and ref.median_ns and arm.median_ns
        return ref.median_ns / arm.median_ns if ok else None


class DriftComparison(msgspec.Struct, kw_only=True):
    """One run's baseline against the reference's (analyzer/compare/drift.py), or why not (``error``)."""

    old: str
    new: str
    settings_differ: list[dict[str, Any]] | UnsetType = UNSET
    expectation: dict[str, Any] | UnsetType = UNSET
    ok: bool | UnsetType = UNSET
    verdict: str | UnsetType = UNSET
    beyond: list[str] | UnsetType = UNSET
    error: str | UnsetType = UNSET


class BaselineDrift(msgspec.Struct, kw_only=True):
    reference: str
    comparisons: list[DriftComparison]
    note: str


class ProjectionRow(_Figures, kw_only=True):
    """One projection of the report's "Projection at N ranks" section (issue 44): its projected
    step (``RunEntry.projected_step``), memory per rank, and whether its numerics are verified
    by a run of the report (analyzer/compare/projection.py ``projection_rows``)."""

    run: str
    """The projection's run name."""
    strategy: str
    """Its strategy."""
    world_size: int
    """The projected world N."""
    step_ns: int
    """The projected step (``ProjectedStep.step_ns``)."""
    low_ns: int
    """Its interval's low end."""
    high_ns: int
    """Its interval's high end."""
    tokens_per_s_per_device: float | None = None
    """``ProjectedStep.tokens_per_s_per_device``."""
    exposed_comm_ns: int
    """Exposed communication of the projected step."""
    state_bytes: int | None = None
    """Parameters + gradients + optimizer state of the largest role rank (memory_categories)."""
    peak_bytes: int | None = None
    """The largest per-rank peak (``Memory.peak_allocated_bytes``; CPU: the categories' sum)."""
    fits: bool | None = None
    """Against ``--device-memory`` (``Memory.fit.fits``); None without it."""
    verified_by: str | None = None
    """The run of the report whose parity passed with this strategy and options (its name);
    None: numerics not verified, not ranked."""
    rank: int | None = None
    """1 = the fastest projected step among the verified projections of its world size, batch,
    model, precision and training; None when not ranked."""
    measured_run: str | None = None
    """The runs of the report of the same configuration at the same world size (strategy,
    options, model, batch, precision, training), comma-separated: the projection is graded
    against them (repeats pooled, as ``analyzer grade`` pools them); None."""
    measured_median_ns: float | None = None
    """The median of their profiled step times, pooled (``runs[].step_time_ns.values_ns``)."""
    error: float | None = None
    """(step_ns - measured_median_ns) / measured_median_ns."""
    inside: bool | None = None
    """Whether the measured median lies in [low_ns, high_ns]."""


class Report(msgspec.Struct, kw_only=True):
    """report.json."""

    schema_version: int = REPORT_SCHEMA_VERSION
    root: str
    layout: str
    runs: list[RunEntry]
    ranking: Ranking
    settings_warnings: list[str] = []
    prefetch_comparisons: list[list[str]] = []
    baseline_drift: BaselineDrift | None = None
    warnings: list[str] = []
    findings: list[Finding] = []
    """Issue 28: what the figures show, most severe first (analyzer/analyses/findings.py)."""
    projections: list[ProjectionRow] = []
    """Issue 44: the projections with a projected step, fastest verified first
    (analyzer/compare/projection.py ``projection_rows``); [] without a link model."""


def encode(report: Report) -> str:
    """report.json's text: indented JSON and a final newline."""
    return msgspec.json.format(msgspec.json.encode(report), indent=2).decode() + "\n"


def decode(text: str | bytes) -> Report:
    """A ``Report`` from report.json's text. Raises ``msgspec.ValidationError`` when it does
    not have the report's shape."""
    return msgspec.json.decode(text, type=Report)


_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str, option: str = "--device-memory") -> int:
    """``80GiB``, ``80 GB``, ``1.5TiB``, ``81920MiB``, ``85899345920B`` -> bytes (int). Units: B,
    KB/MB/GB/TB (powers of 10), KiB/MiB/GiB/TiB (powers of 2), any case; the unit is required (a
    bare ``80`` could mean bytes or GiB). Raises ``BadInput`` (``bad_option``, naming ``option``)
    for anything else or a value under one byte."""
    import re

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _BYTE_UNITS or float(m.group(1)) * _BYTE_UNITS[unit] < 1:
        raise BadInput(option, "bad_option", f"{str(text)[:40]!r} is not an amount of memory",
                       f"pass e.g. {option} 80GiB (units B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return int(float(m.group(1)) * _BYTE_UNITS[unit])
