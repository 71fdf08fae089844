"""Typed configuration of one ``tracer record`` run (one strategy, one run directory).

The CLI builds a ``RecordConfig`` per strategy (``all`` expands to four); the launcher turns it
back into command-line arguments for its workers (``to_argv``), so a spawned worker and a
torchrun worker parse the same options the same way.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from analyzer.contract import strategies

SHARDING_STRATEGIES = ("full_shard", "shard_grad_op", "no_shard")
BACKWARD_PREFETCH = ("pre", "post", "none")
BACKENDS = ("auto", "gloo", "nccl")
DEVICES = ("auto", "cpu", "cuda")
DATA_SOURCES = ("memory", "loader")
OPTIMIZERS = ("sgd", "adamw")
DEFAULT_LR = {"sgd": 0.1, "adamw": 1e-3}
"""``--lr`` when not given: SGD 0.1 (this tool's historical default); AdamW 1e-3 (torch's own)."""
MP_DTYPES = ("fp32", "bf16", "fp16")
"""Dtype names of ``--mixed-precision PARAM,REDUCE,BUFFER``."""

COMPILE_MODES = ("none", "blocks", "model")
"""``--compile``: no torch.compile; each transformer block (torchtitan's per-block compile); the
whole model (tracer/compiling.py)."""
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")
"""``--pp-schedule``: torch.distributed.pipelining ScheduleGPipe, Schedule1F1B (one stage per
rank), ScheduleInterleaved1F1B, ScheduleLoopedBFS, ScheduleInterleavedZeroBubble (``--pp-virtual``
V >= 1 stages per rank, looped placement) and ScheduleZBVZeroBubble, ScheduleDualPipeV (exactly
2 stages per rank, V placement); tracer/pipeline.py ``SCHEDULES``. All seven run on gloo / CPU
in torch 2.13."""
PP_MULTI_STAGE = ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zbv", "dualpipev")
"""Schedules that take several stages per rank (torch's ``PipelineScheduleMulti``)."""
PP_V_SHAPE = ("zbv", "dualpipev")
"""Schedules that need exactly 2 stages per rank, placed as a V (schedules.py
``ScheduleZBVZeroBubble`` / ``ScheduleDualPipeV``: "requires exactly 2 stages per rank")."""
MAX_REPEAT = 100
"""Largest ``--repeat``: far above what a decision needs (docs/howto/noisy-machine.md)."""
_EXPERIMENT_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
MAX_NPROC = 65536
"""Largest world ``tracer record`` takes (``--nproc``, torchrun's WORLD_SIZE): 2^16 ranks, above
the largest jobs run today; the built-in launcher, which starts every rank on this machine,
takes only as many as its memory holds (``record.check_ranks_fit_machine``)."""
MIN_TIMEOUT_S = 3.0
"""Smallest ``--timeout``: the collective timeout covers the rendezvous and the first
collectives, which a loaded machine slows (0.2 s failed a healthy 2-rank record as "rank 1
failed at step -1: Timed out waiting 200ms" on an idle 2-core machine); 3 s is also the
shortest the suite waits for a hung spec check."""
MAX_TIMEOUT_S = 7 * 24 * 3600
"""Largest ``--timeout``: one week, far above any useful wait and below what the waits it
drives accept (a poll() timeout is a C int of milliseconds, about 24.8 days: ``subprocess.run``
raises OverflowError beyond it); inf and nan are refused."""


def check_taken(strategy: str, given: list[str]) -> None:
    """Refuse options of ``given`` (field names) that ``strategy`` does not take.

    Raises ``ValueError`` with one line naming the first such option and who takes it.
    """
    for option in given:
        if option in strategies.STRATEGY_OPTIONS and not takes(strategy, option):
            takers = takers_of(option)
            raise ValueError(f"--{option.replace('_', '-')}: --strategy {strategy} does not take it "
                             f"(only {', '.join(takers)}); drop it or record {' / '.join(takers)}")


def takes(strategy: str, option: str) -> bool:
    """Whether ``strategy``'s row takes ``option`` (a RecordConfig field name); False for a name
    not in the table (``RecordConfig`` refuses it)."""
    row = strategies.spec(strategy)
    return row is not None and option in row.options


def takers_of(option: str) -> list[str]:
    """The strategies that take ``option`` (a RecordConfig field name), in table order."""
    return [s.name for s in strategies.TABLE.values() if option in s.options]


def _option(default: Any, help: str | None = None, *, flag: str | None = None,
            parser: Any = None, metavar: str | None = None) -> Any:
    """A ``RecordConfig`` field that is also a ``tracer record`` option: tracer/cli.py builds the
    command from these fields (name, type and default) and ``help`` (None: hidden, passed on by
    the launcher only); ``flag`` names the option when it is not ``--field-name``; ``parser``
    turns its text into the field's value when the type alone cannot (``parse_bucket_cap_mb``),
    ``metavar`` says what it takes in ``--help``."""
    return field(default=default, metadata={"help": help, "flag": flag, "parser": parser,
                                            "metavar": metavar})


def parse_bucket_cap_mb(text: str | float | None) -> float | None:
    """``--bucket-cap-mb`` as typed -> the field's value: ``default`` (exactly, lower case) ->
    None, torch's default buckets (``strategies.DDP_DEFAULT_BUCKET``); a number -> MiB as a
    float. Raises ``ValueError`` for anything else, other cases of ``default`` included: the
    value names a ``--sweep`` arm's run dir (``bucket-cap-mb=default``) and is the manifest's
    setting, so one setting has one spelling (``DEFAULT`` would name a second dir of it)."""
    if text is None or isinstance(text, (int, float)) and not isinstance(text, bool):
        return None if text is None else float(text)
    if str(text).strip() == strategies.DDP_DEFAULT_BUCKET:
        return None
    if str(text).strip().lower() == strategies.DDP_DEFAULT_BUCKET:
        raise ValueError(f"{text!r}: write {strategies.DDP_DEFAULT_BUCKET} in lower case, its "
                         "one spelling")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of MiB or {strategies.DDP_DEFAULT_BUCKET}") from None


def bucket_setting(bucket_cap_mb: float | None) -> float | str:
    """The bucket setting torch applies, as the manifest records it: the MiB given, or
    ``strategies.DDP_DEFAULT_BUCKET`` when none was (1 MiB first bucket, then 25 MiB)."""
    return strategies.DDP_DEFAULT_BUCKET if bucket_cap_mb is None else bucket_cap_mb


def layer_num_params(hidden: int) -> int:
    """Parameters of one ``SimpleTransformerLayer`` of width ``hidden``: 9h^2 + 8h.

    attn Linear(h, h): h^2 + h; mlp Linear(h, 4h) + Linear(4h, h): 8h^2 + 5h; LayerNorm: 2h.
    """
    return 9 * hidden * hidden + 8 * hidden


@dataclass(kw_only=True, slots=True)
class RecordConfig:
    """Everything one strategy's record needs. Raises ``ValueError`` naming a bad value. A field
    made by ``_option`` is a ``tracer record`` option; its help is its documentation, the
    docstring under it (where there is one) says more."""

    strategy: str
    """One of ``analyzer.contract.schemas.STRATEGIES`` (``all`` is expanded by the CLI)."""
    nproc: int = _option(2, "Ranks for distributed strategies (torchrun: its WORLD_SIZE).")
    """Ranks for distributed strategies (``single`` always runs 1). Under torchrun, WORLD_SIZE wins."""
    backend: str = _option("auto", "auto (gloo on CPU, nccl on CUDA), gloo or nccl.")
    device: str = _option("auto", "auto, cpu or cuda.")
    """``cpu``, ``cuda`` or ``auto`` (cuda when available)."""
    model: str = _option("reference", "What to train: reference, hf:gpt2, hf:llama (resized: "
                         "hf:llama?layers=4,hidden=256,heads=4,vocab=512,seq=32 or any config "
                         "key, hf:gpt2?n_embd=128), package.module:factory "
                         "or path/to/file.py:factory (a function returning tracer.ModelSpec).")
    hidden: int = _option(256, "Model width (--model reference).")
    """Model width h; activations are [batch, seq, h]."""
    layers: int = _option(2, "Transformer layers (--model reference).")
    batch: int = _option(8, "Global batch (divisible by the world size).")
    seq: int = _option(128, "Sequence length (--model reference).")
    steps: int | None = _option(None, "Total steps (default wait+warmup+active).")
    """Total training steps; default wait + warmup + active. Step 0 carries the numerics."""
    wait: int = _option(1, "Profiler schedule wait (>= 1: step 0 is the numerics step).")
    warmup: int = _option(1, "Profiler schedule warmup.")
    """Profiler schedule: warm-up steps (traced, discarded)."""
    active: int = _option(3, "Profiler schedule active steps.")
    seed: int = _option(0, "Seed of weights and data.")
    precision: str = _option("fp32", "fp32 or bf16 (autocast, fp32 master weights).")
    """``fp32`` or ``bf16`` (torch.autocast bf16, fp32 master weights and gradients)."""
    lr: float | None = _option(None, "Learning rate (default: sgd 0.1, adamw 1e-3).")
    """Learning rate; default ``DEFAULT_LR[optimizer]`` (``learning_rate``)."""
    optimizer: str = _option("sgd", "sgd (plain) or adamw (torch defaults but the lr).")
    """``sgd`` (plain, no momentum) or ``adamw`` (torch defaults: betas (0.9, 0.999), eps 1e-8,
    weight_decay 0.01; only the learning rate is ours)."""
    mixed_precision: str | None = _option(None, "PARAM,REDUCE,BUFFER dtypes (fp32, bf16, fp16), e.g. "
                                          "bf16,bf16,bf16: FSDP MixedPrecision, emulated in the baseline; "
                                          "ddp takes fp32,REDUCE,fp32.")
    """``PARAM,REDUCE,BUFFER`` dtypes (fp32, bf16, fp16): FSDP1 ``MixedPrecision``, FSDP2
    ``MixedPrecisionPolicy``, emulated in the baseline and DDP (tracer/training.py)."""
    activation_checkpointing: bool = _option(False, "Non-reentrant activation checkpointing of every FSDP "
                                             "unit (baseline and ddp too).")
    compile: str = _option("none", "torch.compile: none, blocks (each transformer block, as torchtitan) "
                           "or model (the whole model); the baseline is compiled the same way.")
    """``none``, ``blocks`` (``Module.compile(fullgraph=True)`` on each FSDP unit before the strategy
    wraps: torchtitan's per-block compile) or ``model`` (the root after it wraps); the baseline
    compiles the same modules (tracer/compiling.py). Needs ``--wait + --warmup >= 2``: step 0
    compiles with the numerics hooks, step 1 without them, and neither is profiled."""
    bucket_cap_mb: float | None = _option(None, "DDP bucket_cap_mb, MiB, or default (torch's: a 1 MiB "
                                          "first bucket, then 25 MiB).", parser=parse_bucket_cap_mb,
                                          metavar="<float|default>")
    """DDP gradient bucket size, MiB; None (``--bucket-cap-mb default``): torch's default, a 1 MiB
    first bucket then 25 MiB (``strategies.DDP_DEFAULT_BUCKET``), not the same as 25."""
    gradient_as_bucket_view: bool = _option(False, "DDP gradient_as_bucket_view.")
    """DDP ``gradient_as_bucket_view``: gradients are views into the reduction buckets."""
    static_graph: bool = _option(False, "DDP static_graph.")
    """DDP ``static_graph``: the graph is the same every step."""
    sharding_strategy: str = _option("full_shard", "FSDP: full_shard, shard_grad_op, no_shard.")
    """FSDP1 sharding strategy (full_shard, shard_grad_op, no_shard); FSDP2 accepts the first two."""
    wrap_min_params: int | None = _option(None, "FSDP size_based_auto_wrap_policy min_num_params (default: "
                                          "one layer, 9h^2+8h).")
    """size_based_auto_wrap_policy min_num_params; default one layer's (9h^2 + 8h): a unit per layer."""
    backward_prefetch: str = _option("pre", "FSDP backward prefetch: pre, post, none.")
    """FSDP backward prefetch: pre, post or none (FSDP2: pre only, its implicit prefetch)."""
    forward_prefetch: bool = _option(False, "FSDP forward prefetch.")
    """FSDP forward prefetch (FSDP2: explicit prefetch of the next unit)."""
    reshard_after_forward: bool | None = _option(None, "FSDP reshard after forward (default from the "
                                                 "sharding strategy).")
    """Default from the sharding strategy: full_shard -> True, shard_grad_op/no_shard -> False."""
    # FSDP2's explicit prefetch and partial resharding (issue 45): tracer/strategies.py apply_fsdp2
    fsdp2_prefetch: int = _option(0, "FSDP2 explicit prefetch depth N: each unit all_gathers the "
                                  "next N units in forward and the previous N in backward (0: "
                                  "FSDP2's own, none in forward, the previous unit in backward).")
    """Depth N of ``set_modules_to_forward_prefetch`` (the next N units) and
    ``set_modules_to_backward_prefetch`` (the previous N units) on every FSDP2 unit. One depth for
    both passes: torch 2.13 cannot express a backward depth below 1 (an empty backward list *is*
    the implicit prefetch of the previous unit, ``FSDPState._pre_backward``: ``default_prefetch =
    len(self._states_to_backward_prefetch) == 0``), so a separate backward depth could only be 1
    (the default) or the forward one; 0 keeps FSDP2's defaults."""
    reshard_after_forward_size: int | None = _option(None, "FSDP2 reshard_after_forward=N: after "
                                                     "forward, reshard each unit to groups of N "
                                                     "ranks, so backward all_gathers over N (a "
                                                     "divisor of the shard dimension, 1 < N < it).")
    """FSDP2 ``fully_shard(reshard_after_forward=N)`` (int): after forward the parameters stay
    sharded over groups of N consecutive ranks of the shard mesh (torch 2.13
    ``_fsdp_init._get_post_forward_mesh_info``: ``mesh.view(-1, N)``), and backward's all_gathers
    run over those N. torch takes a divisor of the shard dimension's size S; N = 1 is
    ``--no-reshard-after-forward`` and N = S is ``--reshard-after-forward`` (torch maps them so),
    refused here so that one setting has one spelling."""
    # GPU-only settings (issue 45): accepted on CUDA, refused on CPU (tracer/gpuonly.py)
    float8: bool = _option(False, "Float8 training: torchao convert_to_float8_training on the "
                           "Linear layers (tensorwise scaling), baseline too; CUDA only.")
    """torchao float8 training (``convert_to_float8_training``, its default tensorwise recipe) on
    every ``nn.Linear`` whose features divide by 16, in the ranks and the baseline alike; its
    parity tolerance is ``tolerance.float8_tolerance``. CUDA only: float8 matmuls
    (``torch._scaled_mm``) need a GPU of compute capability >= 8.9."""
    async_tp: bool = _option(False, "fsdp2_tp: async tensor parallel (inductor's micro-pipeline "
                             "TP over symmetric memory, each block compiled); CUDA only.")
    """Async TP: ``torch._inductor.config._micro_pipeline_tp = True`` and
    ``enable_symm_mem_for_group`` on the tp group, the transformer blocks compiled (inductor's
    pass fuses each all_gather / reduce_scatter with its matmul). CUDA only: symmetric memory
    and the fused kernels are CUDA's."""
    mesh: str | None = _option(None, "hsdp: R,S = replicate x shard (R*S = ranks; default 2,N/2).")
    """hsdp: ``R,S`` (replicate x shard, R*S = world size); default ``2,W/2``."""
    tp: int | None = _option(None, "fsdp2_tp: tensor-parallel degree (default 2).")
    """fsdp2_tp: tensor-parallel degree T (dp = world / T); default 2."""
    pp: int | None = _option(None, "pp: pipeline ranks P, one stage each or --pp-virtual (default 2).")
    """pp: pipeline-parallel ranks P (dp = world / P, FSDP2 over dp), each running one stage or
    ``--pp-virtual`` V; default 2."""
    pp_schedule: str | None = _option(None, "pp: gpipe, 1f1b (default), interleaved-1f1b, looped-bfs, "
                                      "interleaved-zb, zbv, dualpipev.")
    """pp: torch.distributed.pipelining schedule (``PP_SCHEDULES``)."""
    pp_virtual: int | None = _option(None, "pp: stages per rank V (multi-stage schedules; default 2): "
                                     "the model is cut into P x V stages.")
    """pp: virtual stages per rank V; the model is cut into P x V stages (tracer/pipeline.py
    ``stage_placement``). 1 for gpipe / 1f1b, exactly 2 for zbv / dualpipev; default 1 for the
    single-stage schedules, 2 for the others."""
    microbatches: int | None = _option(None, "pp: microbatches per step (default 2 x stages).")
    """pp: microbatches per step M; must divide the per-pipeline batch (batch / dp); default 2P."""
    out: str = _option("traces", "Output root; run dirs are OUT/NAME.")
    name: str | None = _option(None, "Run name (default the strategy; with all: NAME-strategy).")
    timeout_s: float = _option(60.0, "Collective timeout and hang watchdog, seconds.", flag="--timeout")
    """Collective / rendezvous timeout, and the launcher's hang watchdog (seconds); finite,
    in [``MIN_TIMEOUT_S``, ``MAX_TIMEOUT_S``]."""
    fault: str | None = _option(None, "Deliberate bug: skip-grad-sync (ddp), wrong-grad-scale, "
                                "unsynced-init, skip-replicate-sync (hsdp), wrong-tp-placement (fsdp2_tp), "
                                "skip-microbatch (pp), hang (ddp).")
    data: str = _option("memory", "Input supply: memory (rows sliced once) or loader (DataLoader + "
                        "DistributedSampler).")
    """Input supply (tracer/data.py): ``memory`` or ``loader`` (the same rows through a DataLoader)."""
    data_workers: int = _option(0, "--data loader: DataLoader worker processes.")
    """``--data loader``: DataLoader worker processes (0: batches are made in the rank itself)."""
    data_sample_cost_ms: float = _option(0.0, "--data loader: artificial cost per sample, ms (sleep; shows "
                                         "an input-bound run).")
    """``--data loader``: milliseconds slept per sample in the Dataset (an input-bound run)."""
    keep_tensors: str = _option("full", "Kept baseline tensors: full (safetensors + summaries) or summaries "
                                "(per-tensor summaries and sha256).")
    """What the run dir keeps of its baseline (analyzer/contract/schemas.py "kept tensors"):
    ``full`` (safetensors plus kept.parquet) or ``summaries`` (kept.parquet only)."""
    golden: str | None = _option(None, "Earlier run directory: reuse its batch and initial state, compare "
                                 "with its kept tensors.")
    """An earlier run directory whose kept inputs this record reuses and compares with (tracer/golden.py)."""
    repeat: int = _option(1, "Record every chosen strategy N times, interleaved (A B C, B C A, C A B ...), "
                          "as one experiment; run dirs NAME.r1 .. NAME.rN. 5 or more lets the report decide "
                          "(docs/howto/noisy-machine.md).")
    """``--repeat N``: runs of every chosen strategy, recorded interleaved (A B C A B C ...);
    with N > 1 the run dirs are ``<name>.r<k>``, k = 1..N (``run_name``)."""
    repeat_index: int = _option(0)
    """This run's repeat, 1..``repeat`` (0: not yet assigned, ``record.interleave`` sets it)."""
    experiment_id: str | None = _option(None, "Experiment id (default: a new one per command); pass the same "
                                        "id to several torchrun commands to rank their runs together.")
    """The experiment this run belongs to (analyzer/contract/schemas.py ``Experiment``); one per
    command when not given. Letters, digits, '-', '_' and '.' only."""
    experiment_order: str | None = _option(None)
    """The arms (run names without repeat suffix) of the experiment in recording order, comma-separated."""
    arm_settings: str | None = _option(None)
    """Declared arms (``--arm`` / ``--sweep``, tracer/arms.py): JSON object of this arm's value of
    every option on which the command's arms differ (the manifest's ``experiment.settings``);
    None for a record of strategies."""
    baseline_id: str | None = _option(None)
    """Declared arms: the id of the single-device baseline this run is checked against
    (``baseline.baseline_id``, set by ``record.record_local``; the manifest's
    ``experiment.baseline``)."""

    def __post_init__(self) -> None:
        # not at the top: ``tracer --help`` (built from these fields) need not load pyarrow
        from analyzer.contract.schemas import KEEP_TENSORS, PRECISIONS, STRATEGIES

        def bad(option: str, value: Any, why: str) -> ValueError:
            return ValueError(f"--{option.replace('_', '-')} {value}: {why}")  # the flag's spelling

        if self.strategy not in STRATEGIES:
            raise bad("strategy", self.strategy, f"expected one of {', '.join(STRATEGIES + ('all',))}")
        for option, allowed in (("backend", BACKENDS), ("device", DEVICES),
                                ("precision", PRECISIONS), ("sharding_strategy", SHARDING_STRATEGIES),
                                ("backward_prefetch", BACKWARD_PREFETCH), ("data", DATA_SOURCES),
                                ("keep_tensors", KEEP_TENSORS)):
            if getattr(self, option) not in allowed:
                raise bad(option.replace("_", "-"), getattr(self, option),
                          f"expected one of {', '.join(allowed)}")
        if self.backend == "nccl" and self.device == "cpu":
            raise bad("backend", "nccl", "needs --device cuda")
        for option in ("nproc", "hidden", "layers", "batch", "seq", "active"):
            value = getattr(self, option)
            if not isinstance(value, int) or value < 1:
                raise bad(option, value, "must be a positive integer")
        if self.nproc > MAX_NPROC:
            raise bad("nproc", self.nproc, f"must be at most {MAX_NPROC} ranks (the largest world "
                      "tracer record takes)")
        if self.wait < 1:
            raise bad("wait", self.wait, "must be >= 1 so step 0 (the numerics step) is not profiled")
        if self.warmup < 0:
            raise bad("warmup", self.warmup, "must be >= 0")
        if self.steps is not None and self.steps < self.profiled_until:
            raise bad("steps", self.steps, f"must be >= wait + warmup + active = {self.profiled_until}")
        if self.model != "reference":
            for option in ("hidden", "layers", "seq"):
                if getattr(self, option) != _DEFAULTS[option]:
                    raise bad(option, getattr(self, option),
                              f"only for --model reference; --model {self.model} builds its own "
                              "model and batch (tracer.ModelSpec)")
        self._check_mesh(bad)
        if self.batch % self.dp_size:
            raise bad("batch", self.batch, "global batch must divide by the " + (
                f"world size {self.world_size}" if self.dp_size == self.world_size else
                f"data-parallel size {self.dp_size} (world {self.world_size} / {self.strategy} "
                f"degree)") + f"; pass a multiple of {self.dp_size}")
        if self.optimizer not in OPTIMIZERS:
            raise bad("optimizer", self.optimizer, f"expected one of {', '.join(OPTIMIZERS)}")
        if self.lr is not None and not 0 < self.lr < float("inf"):
            raise bad("lr", self.lr, "must be a finite number > 0")
        self._check_training_options(bad)
        self._check_compile(bad)
        if not isinstance(self.repeat, int) or not 1 <= self.repeat <= MAX_REPEAT:
            raise bad("repeat", self.repeat, f"must be an integer from 1 to {MAX_REPEAT}")
        if not 0 <= self.repeat_index <= self.repeat:
            raise bad("repeat-index", self.repeat_index, f"must be from 0 to --repeat {self.repeat}")
        if self.experiment_id is not None and not _EXPERIMENT_ID.fullmatch(self.experiment_id):
            raise bad("experiment-id", self.experiment_id,
                      "use 1-64 letters, digits, '-', '_' or '.' (it names an experiment in reports)")
        if self.wrap_min_params is not None and self.wrap_min_params < 1:
            raise bad("wrap-min-params", self.wrap_min_params, "must be a positive integer")
        self._check_timeout(bad)
        self._check_wrapper(bad)
        self._check_fsdp2(bad)
        self._check_gpu_only(bad)
        if not isinstance(self.data_workers, int) or self.data_workers < 0:
            raise bad("data-workers", self.data_workers, "must be an integer >= 0")
        if not self.data_sample_cost_ms >= 0:
            raise bad("data-sample-cost-ms", self.data_sample_cost_ms, "must be >= 0")
        if self.data != "loader" and (self.data_workers or self.data_sample_cost_ms):
            option = "data-workers" if self.data_workers else "data-sample-cost-ms"
            raise bad(option, getattr(self, option.replace("-", "_")), "only with --data loader")
        if self.golden is not None and not str(self.golden).strip():
            raise bad("golden", repr(self.golden), "must be a run directory")
        if self.name is not None and (not self.name or "/" in self.name or self.name in (".", "..")):
            raise bad("name", self.name, "must be a plain directory name")
        if self.arm_settings is not None:
            try:
                ok = isinstance(json.loads(self.arm_settings), dict)
            except ValueError:
                ok = False
            if not ok:
                raise bad("arm-settings", self.arm_settings, "must be a JSON object")

    def _check_timeout(self, bad) -> None:
        """--timeout: finite, in [``MIN_TIMEOUT_S``, ``MAX_TIMEOUT_S``]."""
        if not (isinstance(self.timeout_s, (int, float)) and MIN_TIMEOUT_S <= self.timeout_s <= MAX_TIMEOUT_S):
            raise bad("timeout", self.timeout_s,
                      f"must be a finite number of seconds >= {MIN_TIMEOUT_S:g} and at most "
                      f"{MAX_TIMEOUT_S:g} (shorter fails a healthy record as a hang in its first "
                      "collectives; there is no 'no timeout': a hung collective would never be "
                      "reported)")

    def _check_wrapper(self, bad) -> None:
        """--fault (a known one, and one the strategy's row reproduces) and the FSDP options the
        strategy's wrapper cannot honour."""
        from analyzer.contract.schemas import FAULTS

        if self.fault is not None and self.fault not in FAULTS:
            raise bad("fault", self.fault, f"expected one of {', '.join(FAULTS)}")
        if self.fault is not None and self.fault not in self.row.faults:
            allowed = [s.name for s in strategies.TABLE.values() if self.fault in s.faults]
            raise bad("fault", self.fault,
                      f"not available for --strategy {self.strategy} (only {', '.join(allowed)})")
        if self.row.wrapper == "fsdp2":
            if self.sharding_strategy == "no_shard":
                raise bad("sharding-strategy", "no_shard", f"{self.strategy} (FSDP2) shards always; use ddp")
            if self.backward_prefetch != "pre":
                raise bad("backward-prefetch", self.backward_prefetch,
                          f"{self.strategy} (FSDP2) only has its implicit pre-backward prefetch: drop "
                          "the option or pass --backward-prefetch pre")
        if self.row.wrapper == "fsdp1" and self.reshard_after_forward is not None:
            implied = self.sharding_strategy == "full_shard"
            if self.reshard_after_forward != implied:
                raise bad("reshard-after-forward", self.reshard_after_forward,
                          f"FSDP1 derives it from --sharding-strategy {self.sharding_strategy} "
                          f"({implied}); pick the matching sharding strategy instead")

    def _check_fsdp2(self, bad) -> None:
        """--fsdp2-prefetch and --reshard-after-forward-size (FSDP2's explicit prefetch and
        partial resharding): values torch takes, one spelling per setting."""
        if not isinstance(self.fsdp2_prefetch, int) or self.fsdp2_prefetch < 0:
            raise bad("fsdp2-prefetch", self.fsdp2_prefetch, "must be an integer >= 0 (units "
                      "prefetched ahead; 0: FSDP2's own prefetch)")
        if self.fsdp2_prefetch and self.forward_prefetch:
            raise ValueError(f"--forward-prefetch and --fsdp2-prefetch {self.fsdp2_prefetch}: "
                             "both set FSDP2's forward prefetch; give one (--forward-prefetch is "
                             "a forward depth of 1 with FSDP2's implicit backward prefetch)")
        size = self.reshard_after_forward_size
        if size is None:
            return
        s = self.shard_size
        if not isinstance(size, int) or size < 1 or s % size:
            raise bad("reshard-after-forward-size", size, f"must divide the shard dimension's "
                      f"{s} ranks (torch's reshard_after_forward int: a group size to reshard to)")
        if size in (1, s):
            same = "--no-reshard-after-forward" if size == 1 else "--reshard-after-forward"
            raise bad("reshard-after-forward-size", size, f"is {same} (torch maps "
                      f"reshard_after_forward={size} to {size != 1}); pass a divisor of {s} "
                      f"other than 1 and {s}, or {same}")
        if self.reshard_after_forward is False or self.sharding_strategy != "full_shard":
            raise bad("reshard-after-forward-size", size, "reshards after forward: drop "
                      "--no-reshard-after-forward / --sharding-strategy shard_grad_op")

    def _check_gpu_only(self, bad) -> None:
        """--float8 and --async-tp: refused on CPU in one line naming why (torch is imported
        only when one is given and --device is auto)."""
        given = [o for o in ("float8", "async_tp") if getattr(self, o)]
        if not given:
            return
        device = self.device
        if device == "auto":
            import torch

            device = "cuda" if torch.cuda.is_available() else "cpu"
        why = {"float8": "float8 matmuls (torch._scaled_mm) run on CUDA GPUs of compute "
                         "capability >= 8.9 only",
               "async_tp": "async TP fuses collectives into matmuls over CUDA symmetric memory"}
        if device != "cuda":
            option = given[0]
            raise ValueError(f"--{option.replace('_', '-')}: needs --device cuda ({why[option]}); "
                             f"this record runs on {device}: drop it on CPU")
        import torch

        if not torch.cuda.is_available():  # --device cuda on a machine without one: first, the
            option = given[0]  # other checks (torchao, the capability) need a GPU to mean anything
            raise ValueError(f"--{option.replace('_', '-')}: needs a CUDA device ({why[option]}); "
                             "--device cuda but no CUDA device is available here")
        if self.float8:
            import importlib.util

            if importlib.util.find_spec("torchao") is None:
                raise ValueError("--float8: needs torchao (pip install torchao), not installed here")
            major, minor = torch.cuda.get_device_capability()
            if (major, minor) < (8, 9):
                raise ValueError(f"--float8: {why['float8']}; this GPU is {major}.{minor}")

    def _check_mesh(self, bad) -> None:
        """--mesh, --tp, --pp, --pp-schedule, --microbatches: parsed shapes that fit the world,
        the model and the batch, refused before anything runs (one line naming the value)."""
        if self._mesh_from_option:
            if self.mesh is None and (self.world_size < 4 or self.world_size % 2):
                raise bad("nproc", self.world_size, "hsdp's default mesh 2,N/2 needs an even "
                          "world of at least 4 ranks: pass --nproc 4 (or --mesh R,S)")
            r, s = self.mesh_shape
            if r * s != self.world_size:
                raise bad("mesh", self.mesh_text, f"replicate x shard = {r * s}, not the world size "
                          f"{self.world_size}; pass R,S with R*S = {self.world_size}")
            if r < 2 or s < 2:
                raise bad("mesh", self.mesh_text, "a dimension of 1 is not HSDP (R = 1 is fsdp2, "
                          "S = 1 replicates whole parameters like ddp); pass R, S >= 2 each "
                          "(at least 4 ranks)")
        for option in ("tp", "pp", "microbatches", "pp_virtual"):
            value = getattr(self, option)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise bad(option, value, "must be a positive integer")
        if self.pp_schedule is not None and self.pp_schedule not in PP_SCHEDULES:
            raise bad("pp-schedule", self.pp_schedule, f"expected one of {', '.join(PP_SCHEDULES)}")
        if self.row.dim_of("tensor"):
            t = self.tp_degree
            if t < 2 or self.world_size % t:
                raise bad("tp", t, f"must be >= 2 and divide the world size {self.world_size}")
            if self.model == "reference" and self.hidden % t:
                raise bad("tp", t, f"must divide --hidden {self.hidden} (the TP plan splits the "
                          "attention and MLP linears' output / input features by T)")
            from tracer.specform import hf_tp_refusal  # no torch: an hf: model's heads / ffn

            if (why := hf_tp_refusal(self.model, t)) is not None:
                raise bad("tp", t, why)
        if self.row.dim_of("stage"):
            p = self.pp_degree
            if p < 2 or self.world_size % p:
                raise bad("pp", p, f"must be >= 2 and divide the world size {self.world_size}")
            self._check_pp_virtual(bad)
            v = self.pp_virtual_stages
            if self.model == "reference" and p * v > self.layers:
                what = "more stages" if v == 1 else f"{p} x --pp-virtual {v} = {p * v} stages, more"
                raise bad("pp", p, f"{what} than --layers {self.layers}: each stage needs a layer")
            m, per_pipeline = self.pp_microbatches, self.batch // self.dp_size
            if self.batch % self.dp_size == 0 and per_pipeline % m:
                if self.microbatches is None:  # the default: say so, and what to pass instead
                    fits = max(d for d in range(1, m + 1) if per_pipeline % d == 0)
                    raise bad("microbatches", f"{m} (the default, 2 x --pp {p}; not passed)",
                              f"must divide the batch of each pipeline {per_pipeline} (--batch "
                              f"{self.batch} / dp {self.dp_size}); pass --microbatches {fits} "
                              f"or --batch {m * self.dp_size}")
                raise bad("microbatches", m, f"must divide the batch of each pipeline "
                          f"{per_pipeline} (--batch {self.batch} / dp {self.dp_size})")
            schedule = self.resolved_pp_schedule
            if schedule == "1f1b" and m < p:
                raise bad("microbatches", m, f"1f1b needs at least one microbatch per stage "
                          f"({p}); pass --microbatches >= {p} or --pp-schedule gpipe")
            rounds = max(1, m // p)  # schedules.py ScheduleInterleaved1F1B / ...ZeroBubble
            if schedule in ("interleaved-1f1b", "interleaved-zb") and m % rounds:
                raise bad("microbatches", m, f"{schedule} needs a multiple of its rounds "
                          f"max(1, M // P) = {rounds} (torch's rule); pass a multiple of {p}")
            if schedule == "dualpipev" and m < p * v:
                raise bad("microbatches", m, f"dualpipev needs at least as many microbatches as "
                          f"stages ({p * v}, torch's rule); pass --microbatches >= {p * v}")
            self._check_pp_scope(bad)

    def _check_pp_virtual(self, bad) -> None:
        """--pp-virtual against the schedule: 1 for the single-stage ones, 2 for the V ones."""
        v, schedule = self.pp_virtual, self.resolved_pp_schedule
        if v is None:
            return
        if schedule not in PP_MULTI_STAGE and v != 1:
            raise bad("pp-virtual", v, f"{schedule} runs one stage per rank; pass a multi-stage "
                      f"--pp-schedule ({', '.join(PP_MULTI_STAGE)})")
        if schedule in PP_V_SHAPE and v != 2:
            raise bad("pp-virtual", v, f"{schedule} needs exactly 2 stages per rank (torch's "
                      "rule); pass --pp-virtual 2")

    def _check_pp_scope(self, bad) -> None:
        """What ``--strategy pp`` does not record (yet), refused in one line saying why."""
        if self.model.startswith("hf:"):  # another --model: its pp_split is checked with the spec
            raise bad("model", self.model, "--strategy pp needs a stage-split hook "
                      "(ModelSpec.pp_split) and hf: models have none; record pp with --model "
                      "reference or your own ModelSpec with pp_split")
        if self.mixed_precision is not None:
            raise bad("mixed-precision", self.mixed_precision, "not recorded with --strategy pp "
                      "(the baseline emulates it per rank's rows, not per microbatch); drop it for pp")

    def _check_training_options(self, bad) -> None:
        """--mixed-precision, DDP's options and options a strategy does not take."""
        try:  # a config built in Python may say "default" as the command line does
            self.bucket_cap_mb = parse_bucket_cap_mb(self.bucket_cap_mb)
        except ValueError as exc:
            raise bad("bucket-cap-mb", self.bucket_cap_mb, str(exc)) from None
        if self.bucket_cap_mb is not None and not 0 < self.bucket_cap_mb < float("inf"):
            raise bad("bucket-cap-mb", self.bucket_cap_mb, "must be a finite number of MiB > 0")
        check_taken(self.strategy, [o for o in strategies.STRATEGY_OPTIONS if self.option_given(o)])
        if self.mixed_precision is None:
            return
        dtypes = self.mixed_precision_dtypes
        if len(dtypes) != 3 or any(d not in MP_DTYPES for d in dtypes):
            raise bad("mixed-precision", self.mixed_precision,
                      f"expected PARAM,REDUCE,BUFFER, each one of {', '.join(MP_DTYPES)} (e.g. bf16,bf16,bf16)")
        if self.precision != "fp32":
            raise bad("mixed-precision", self.mixed_precision,
                      f"one precision policy at a time: drop --precision {self.precision} (autocast)")
        if self.row.wrapper == "ddp" and (dtypes[0] != "fp32" or dtypes[2] != "fp32"):
            raise bad("mixed-precision", self.mixed_precision,
                      "ddp computes in its parameters' dtype (torch has no public DDP parameter "
                      "mixed precision): use fp32,REDUCE,fp32 (REDUCE via a compression comm hook), "
                      "--precision bf16 (autocast), or fsdp / fsdp2 (--strategy all includes ddp: "
                      "record single, fsdp and fsdp2 one by one)")

    def _check_compile(self, bad) -> None:
        """``--compile``: a known mode, two unprofiled steps, and refused in one line where the
        record cannot compile what the strategy runs (tracer/compiling.py ``refusal``)."""
        if self.compile not in COMPILE_MODES:
            raise bad("compile", self.compile, f"expected one of {', '.join(COMPILE_MODES)}")
        if self.compile == "none":
            return
        if self.wait + self.warmup < 2:
            raise bad("compile", self.compile, f"needs --wait + --warmup >= 2 (got {self.wait} + "
                      f"{self.warmup}): step 0 compiles with the numerics hooks, step 1 recompiles "
                      "without them, and neither may be profiled")
        from tracer.compiling import refusal

        why = refusal(self.row, self.compile, self.activation_checkpointing)
        if why is not None:
            raise bad("compile", self.compile, why)

    def option_given(self, option: str) -> bool:
        """Whether ``option`` differs from its default (what ``to_argv`` would pass on)."""
        default = next(f.default for f in fields(self) if f.name == option)
        return getattr(self, option) != default

    @property
    def mixed_precision_dtypes(self) -> tuple[str, ...]:
        """``--mixed-precision`` split (PARAM, REDUCE, BUFFER); ("fp32",) * 3 when None."""
        if self.mixed_precision is None:
            return ("fp32", "fp32", "fp32")
        return tuple(d.strip() for d in self.mixed_precision.split(","))

    @property
    def learning_rate(self) -> float:
        """``lr``, defaulted by the optimizer (``DEFAULT_LR``)."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    @property
    def row(self) -> strategies.StrategySpec:
        """The strategy's row of the table (analyzer/contract/strategies.py)."""
        return strategies.TABLE[self.strategy]

    @property
    def _mesh_from_option(self) -> bool:
        """A replicate x shard mesh, its shape given by ``--mesh R,S`` (hsdp)."""
        return bool(self.row.dim_of("replicate") and self.row.dim_of("shard"))

    @property
    def world_size(self) -> int:
        """1 for the reference (``single``), else ``nproc``."""
        return 1 if self.row.is_reference else self.nproc

    @property
    def mesh_text(self) -> str:
        """``--mesh`` as given, or its default."""
        return self.mesh if self.mesh is not None else f"2,{self.world_size // 2}"

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """The 2-D mesh of a mesh strategy (``schemas.Mesh.shape``): hsdp (R, S) from
        ``--mesh``, fsdp2_tp (W / T, T), pp (W / P, P); (world,) for the flat strategies.
        Raises ``ValueError`` for a ``--mesh`` that is not two positive integers."""
        if self._mesh_from_option:
            parts = self.mesh_text.split(",")
            if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
                raise ValueError(f"--mesh {self.mesh_text}: expected R,S (replicate x shard), two "
                                 "positive integers, e.g. 2,2")
            return int(parts[0]), int(parts[1])
        if self.row.is_flat:
            return (self.world_size,)
        degree = self.tp_degree * self.pp_degree  # (dp, X): X the tensor or stage degree
        return self.world_size // degree, degree

    @property
    def tp_degree(self) -> int:
        """``--tp`` or its default 2 (a strategy with a tensor dimension: fsdp2_tp); 1 for others."""
        return (self.tp or 2) if self.row.dim_of("tensor") else 1

    @property
    def pp_degree(self) -> int:
        """``--pp`` or its default 2 (a strategy with a stage dimension: pp); 1 for others."""
        return (self.pp or 2) if self.row.dim_of("stage") else 1

    @property
    def pp_microbatches(self) -> int:
        """``--microbatches`` or its default 2P (pp)."""
        return self.microbatches or 2 * self.pp_degree

    @property
    def resolved_pp_schedule(self) -> str:
        """``--pp-schedule`` or its default 1f1b."""
        return self.pp_schedule or "1f1b"

    @property
    def pp_virtual_stages(self) -> int:
        """``--pp-virtual`` or its default: 2 for a multi-stage schedule, else 1."""
        if self.pp_virtual is not None:
            return self.pp_virtual
        return 2 if self.resolved_pp_schedule in PP_MULTI_STAGE else 1

    @property
    def dp_size(self) -> int:
        """Ranks that split the global batch: the world, over T (fsdp2_tp) or P (pp); hsdp's
        replicate and shard dimensions both split it."""
        return self.world_size // (self.tp_degree * self.pp_degree)

    @property
    def profiled_until(self) -> int:
        """First step after the profiler's active window (wait + warmup + active)."""
        return self.wait + self.warmup + self.active

    @property
    def total_steps(self) -> int:
        """Steps actually run."""
        return self.steps if self.steps is not None else self.profiled_until

    @property
    def arm(self) -> str:
        """The run name without its repeat suffix: ``--name``, or the strategy."""
        return self.name or self.strategy

    @property
    def run_name(self) -> str:
        """Run-directory name: ``arm``, with ``.r<k>`` for repeat k of ``--repeat N`` > 1."""
        return f"{self.arm}.r{self.repeat_index}" if self.repeat > 1 and self.repeat_index else self.arm

    @property
    def run_dir(self) -> Path:
        """``out/run_name``."""
        return Path(self.out) / self.run_name

    @property
    def auto_wrap_min_params(self) -> int:
        """Resolved size_based_auto_wrap_policy threshold."""
        return self.wrap_min_params if self.wrap_min_params is not None else layer_num_params(self.hidden)

    @property
    def resolved_reshard_after_forward(self) -> bool | int:
        """reshard_after_forward as passed to torch: ``--reshard-after-forward-size`` N (an int,
        FSDP2), else the flag, else defaulted from the sharding strategy."""
        if self.reshard_after_forward_size is not None:
            return self.reshard_after_forward_size
        if self.reshard_after_forward is not None:
            return self.reshard_after_forward
        return self.sharding_strategy == "full_shard"

    @property
    def shard_size(self) -> int:
        """Ranks of the dimension FSDP shards over: hsdp's S, fsdp2_tp's dp, else the world."""
        if self.row.dim_of("shard") is None or self.row.is_flat:
            return self.world_size
        return self.mesh_shape[self.row.dims.index(self.row.dim_of("shard"))]

    def strategy_options(self) -> dict[str, Any]:
        """The manifest's ``strategy_options`` (empty for single). The mesh strategies lead with
        their mesh options (hsdp ``mesh`` "RxS", fsdp2_tp ``tp``, pp ``pp``, ``pp_schedule``,
        ``microbatches``), so reports that name a run's options name its mesh too."""
        taken, out = self.row.options, {}
        if "mesh" in taken:
            out["mesh"] = "x".join(map(str, self.mesh_shape))
        if "tp" in taken:
            out["tp"] = self.tp_degree
        if "pp" in taken:
            out.update(pp=self.pp_degree, pp_schedule=self.resolved_pp_schedule,
                       microbatches=self.pp_microbatches)
            if self.pp_virtual_stages != 1:  # runs before it had none: their options stay as they were
                out["pp_virtual"] = self.pp_virtual_stages
        if "bucket_cap_mb" in taken:
            out.update(bucket_cap_mb=bucket_setting(self.bucket_cap_mb),
                       gradient_as_bucket_view=self.gradient_as_bucket_view,
                       static_graph=self.static_graph)
        if "sharding_strategy" in taken:
            out.update(sharding_strategy=self.sharding_strategy,
                       auto_wrap_min_num_params=self.auto_wrap_min_params,
                       backward_prefetch=self.backward_prefetch,
                       forward_prefetch=self.forward_prefetch,
                       reshard_after_forward=self.resolved_reshard_after_forward)
        if "fsdp2_prefetch" in taken:  # as asked; the worker replaces it with what torch used
            out["fsdp2_prefetch"] = {"forward": self.fsdp2_prefetch or int(self.forward_prefetch),
                                     "backward": self.fsdp2_prefetch or "implicit"}
        for option in ("float8", "async_tp"):  # GPU-only: written where on (a CPU run has none)
            if option in taken and getattr(self, option):
                out[option] = True
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (JSON-able) of every field."""
        return asdict(self)

    def to_argv(self) -> list[str]:
        """``tracer record`` arguments that reproduce this config (for spawned workers)."""
        argv = ["--strategy", self.strategy, "--name", self.arm]
        for f in fields(self):  # the CLI's options are the fields (tracer/cli.py)
            value = getattr(self, f.name)
            if f.name in ("strategy", "name") or value is None or value == f.default:
                continue
            option = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
            if isinstance(value, bool):
                argv.append(option if value else "--no-" + option[2:])
            else:
                argv += [option, repr(value) if isinstance(value, float) else str(value)]
        return argv


_DEFAULTS = {f.name: f.default for f in fields(RecordConfig)}
