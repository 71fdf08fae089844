"""``--compile``: torch.compile applied the same way to the baseline and to every strategy's ranks.

``blocks`` is torchtitan's per-block compile (torchtitan ``apply_compile``: ``torch.compile`` of
each transformer block with ``fullgraph=True``, after tensor parallel and activation
checkpointing, before FSDP): here each FSDP unit (``strategies.unit_names``: the reference
model's layers, an ``hf:`` model's decoder blocks), compiled in place with ``Module.compile``
(torch/nn/modules/module.py: the module's ``_call_impl`` compiled, its FQNs and parameters
unchanged, so the numerics compare the same names; torchtitan's ``register_module`` of an
``OptimizedModule`` adds ``_orig_mod.`` to every name). ``model`` compiles the root after the
strategy wraps it (torchtitan's docstring: "Alternatively one can compile the whole model
(after applying DP)"), with graph breaks allowed: DDP's forward is split at its buckets by
dynamo's DDPOptimizer (torch/_dynamo/backends/distributed.py), FSDP2's hooks are not traced
(``torch._dynamo.config.skip_fsdp_hooks``).

What a compiled record differs in, and where it is measured:
- the first forward / backward of a compiled module compiles it (dynamo, AOTAutograd, inductor:
  C++ kernels on CPU through the machine's compiler, Triton on CUDA). Step 0 compiles with the
  numerics hooks on (tracer/numerics.py ``ActivationRecorder``), step 1 recompiles without
  them (dynamo guards on a module's hooks); ``RecordConfig`` requires both steps unprofiled,
  and ``CompileClock`` measures each step's compile seconds (dynamo's own timers) for the
  manifest's ``compile_warmup``, apart from the profiled steps; ``training.compile`` says what
  torch ran (``compile_section``).
- inductor fuses and reorders the elementwise and reduction work of a block, so a compiled
  run's sums are not the eager run's: parity compares with a baseline compiled the same way,
  under the tolerance of analyzer/contract/tolerance.py ``compile_tolerance``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a module is compiled, not to check a config
    from torch import nn

    from analyzer.contract.strategies import StrategySpec

BACKEND = "inductor"
"""torch.compile's default backend, the one torchtitan uses."""
BLOCK_OPTIONS = {"backend": BACKEND, "fullgraph": True}
"""``Module.compile`` keywords of ``--compile blocks`` (torchtitan's)."""
MODEL_OPTIONS = {"backend": BACKEND, "fullgraph": False}
"""``Module.compile`` keywords of ``--compile model``: the wrappers' hooks break the graph."""


CHECKPOINT_REFUSAL = (
    "not recorded with --activation-checkpointing: compiling the checkpointed block "
    "(torchtitan's order) meets the step-0 numerics hooks inside torch's checkpoint operator, "
    "which dynamo refuses (\"HOP: Unsafe side effect\"), and a checkpoint around the compiled "
    "block fails its recompute check (CheckpointError: recomputed tensors' metadata differ); "
    "drop one of them")
"""Measured on torch 2.13 (fsdp2, reference model, both ways): the one-line refusal of
``--compile`` with ``--activation-checkpointing``."""


def refusal(row: "StrategySpec", mode: str, checkpointing: bool = False) -> str | None:
    """Why ``--compile mode`` is not recorded with strategy ``row`` (and activation
    ``checkpointing``: ``CHECKPOINT_REFUSAL``), in one line, or None.

    FSDP1 ``model``: dynamo "skips tracing all the torch.distributed.fsdp code" (torch/
    distributed/fsdp/_dynamo_utils.py, its note on FSDP-wrapped modules), so a compiled
    ``FullyShardedDataParallel`` root runs eagerly: recorded, it compiled nothing (0 s of
    compile in every step, no module compiled) against a compiled baseline. ``blocks`` compiles
    inside FSDP1's units and is taken (``use_orig_params=True``, which FSDP1's docstring says
    torch.compile requires: tracer/strategies.py ``apply_fsdp``). Every other wrapper takes
    both modes, pp per stage (tracer/strategies.py ``setup_pp``)."""
    if checkpointing:
        return CHECKPOINT_REFUSAL
    if mode == "model" and row.wrapper == "fsdp1":
        return ("dynamo skips FullyShardedDataParallel's code (torch/distributed/fsdp/_dynamo_utils.py), "
                "so a compiled FSDP1 root runs eagerly and compiles nothing; use --compile blocks "
                "(inside its units) or --strategy fsdp2")
    return None


def profile_kernels() -> None:
    """Name inductor's C++ kernels in the trace: ``torch._inductor.config.cpp.enable_kernel_profile``
    (torch/_inductor/codegen/cpp.py: a ``RECORD_FUNCTION`` per ``cpp_fused_*`` kernel; off by
    default, its env var TORCHINDUCTOR_CPP_ENABLE_KERNEL_PROFILE). Without it a CPU trace shows
    only the graph call around them (analyzer/ingest/classify.py ``COMPILED_RE``). It adds the
    profiler's record per kernel, as eager ops have; the arithmetic is unchanged. Triton
    kernels on CUDA are traced by CUPTI without it."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True


def compile_blocks(model: "nn.Module", units: list[str]) -> list[str]:
    """``--compile blocks``: ``Module.compile(**BLOCK_OPTIONS)`` on each module of ``units``
    (FQNs, ``strategies.unit_names``; cleaned, ``numerics.clean_fqn``), before the strategy
    wraps it (FSDP1: inside its units; never with activation checkpointing: ``refusal``).
    Returns the FQNs compiled, in order. Raises ``ValueError`` when there is no block to compile."""
    from tracer.numerics import clean_fqn

    if not units:
        raise ValueError("--compile blocks: the model has no transformer blocks to compile "
                         "(ModelSpec.units is empty); use --compile model")
    names: dict = {}
    for n, m in model.named_modules():  # the block itself, inside FSDP1's and checkpoint's wrappers
        if type(m).__name__ not in ("FullyShardedDataParallel", "CheckpointWrapper"):
            names.setdefault(clean_fqn(n), m)
    profile_kernels()
    done = [clean_fqn(fqn) for fqn in units]  # the baseline lists them after checkpointing
    allow_recompiles(len(done))
    for fqn in done:
        names[fqn].compile(**BLOCK_OPTIONS)
    return done


def allow_recompiles(blocks: int) -> None:
    """Let dynamo compile the blocks' shared forward once per block at step 0: the numerics
    hooks' closures hold each module's name, and dynamo guards on it (measured: "guard failure
    ... __closure__[0].cell_contents == 'layers.1.mlp.0'"), so the B blocks of one class make B
    graphs of one code object, past ``torch._dynamo.config.recompile_limit`` (8) from 5 blocks
    on, which ``fullgraph=True`` turns into a failure (FailOnRecompileLimitHit); step 1 runs
    without hooks and shares one graph. The limit is raised to 2 B + 8, never lowered."""
    import torch._dynamo.config as dynamo_config

    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 2 * blocks + 8)


def compile_model(model: "nn.Module") -> list[str]:
    """``--compile model``: ``Module.compile(**MODEL_OPTIONS)`` on the root, after the strategy
    wraps it. Returns ``[""]`` (the root's FQN)."""
    profile_kernels()
    model.compile(**MODEL_OPTIONS)
    return [""]


def recompile_copy(source: "nn.Module", copy: "nn.Module") -> None:
    """After ``copy.deepcopy(source)``: compile in ``copy`` the modules compiled in ``source``
    (a deep copy keeps the source's compiled call, bound to the source's modules: the copy
    would run the source's parameters). The same options; modules matched by position."""
    for src, dst in zip(source.modules(), copy.modules()):
        if getattr(src, "_compiled_call_impl", None) is not None:
            dst._compiled_call_impl = None
            dst.compile(**(BLOCK_OPTIONS if src is not source else MODEL_OPTIONS))


def compiled_modules(model: "nn.Module") -> list[str]:
    """Clean FQNs of the modules of ``model`` that run compiled ("" for the root), in order."""
    from tracer.numerics import clean_fqn

    return [clean_fqn(n) for n, m in model.named_modules()
            if getattr(m, "_compiled_call_impl", None) is not None]


class CompileClock:
    """Seconds torch spent compiling, read from dynamo's cumulative timers
    (torch/_dynamo/utils.py ``calculate_time_spent``: ``entire_frame_compile`` for the forward,
    ``entire_backward_compile`` for AOTAutograd's lazy backward compile). ``lap()`` returns the
    nanoseconds compiled since the previous lap (the first: since construction)."""

    def __init__(self) -> None:
        self._last_ns = self._total_ns()

    @staticmethod
    def _total_ns() -> int:
        from torch._dynamo.utils import calculate_time_spent

        return int(round(calculate_time_spent().get("total_wall_time", 0.0) * 1e9))

    def lap(self) -> int:
        now = self._total_ns()
        spent, self._last_ns = now - self._last_ns, now
        return max(0, spent)


def compile_section(cfg, model: "nn.Module"):
    """The manifest's ``Training.compile`` (analyzer/contract/schemas.py ``Compile``: what torch
    ran) from rank 0's wrapped model; None for ``--compile none``."""
    from analyzer.contract.schemas import Compile

    if cfg.compile == "none":
        return None
    options = BLOCK_OPTIONS if cfg.compile == "blocks" else MODEL_OPTIONS
    return Compile(mode=cfg.compile, backend=options["backend"], fullgraph=options["fullgraph"],
                   modules=compiled_modules(model))


def warmup_section(cfg, step_rows: list[dict]):
    """The manifest's ``compile_warmup`` (``schemas.CompileWarmup``) from rank 0's step rows
    (``compile_ns`` per step, tracer/loop.py); None for ``--compile none``. Raises
    ``RuntimeError`` when no step compiled anything (as FSDP1's root would: ``refusal``)."""
    from analyzer.contract.schemas import CompileWarmup

    if cfg.compile == "none":
        return None
    by_step = [int(r.get("compile_ns", 0)) for r in step_rows]
    if step_rows and not any(by_step):  # dynamo traces even on a warm inductor cache
        raise RuntimeError(f"--compile {cfg.compile}: torch compiled nothing in {len(by_step)} steps "
                           "(the wrapper's code ran eagerly); the record would compare an eager "
                           "run with a compiled baseline")
    return CompileWarmup(compile_ns_by_step=by_step,
                         first_step_wall_ns=int(step_rows[0]["wall_ns"]) if step_rows else 0,
                         profiled_compile_ns=sum(n for r, n in zip(step_rows, by_step) if r["profiled"]))
