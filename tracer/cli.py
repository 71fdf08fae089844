"""`tracer` command line (thin): parse options, call ``record_local`` or ``worker_main``.

Exit codes (analyzer/contract/errors.py ``ExitCode``): 0 ok, 1 a record failed (one line names the rank
and its first error), 2 bad options or a refused run dir (``rundir.check_run_dir``; another record
holds it), 130 interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT; from before the ``--model`` check
on). Under torchrun (RANK set) this process is that rank. It prints ``recorded <run dir>`` per
run it completed (under torchrun global rank 0 only), also before the one line of a failure.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from analyzer.contract.errors import ExitCode
from analyzer.contract.text import one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Record a model (the reference transformer or yours) single-device and distributed under torch.profiler.")
# click's UsageError (typer may vendor click): the base of every option / usage error.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@app.callback()
def _main() -> None:
    """paritytrace recorder."""


def _fail(code: int, message: str, recorded: list[Path] = ()) -> None:
    """One line on stderr, exit ``code``; first, on stdout, the runs that were ``recorded``."""
    for run_dir in recorded:
        typer.echo(one_line(f"recorded {run_dir}"))
    typer.echo(one_line(f"tracer: {message}"), err=True)
    raise typer.Exit(code)


@app.command()
def record(
    strategy: Annotated[str, typer.Option(
        help="single, ddp, fsdp, fsdp2, hsdp, fsdp2_tp, pp, all (the first four), or a "
             "comma-separated list (ddp,fsdp2,hsdp).")] = "all",
    nproc: Annotated[int, typer.Option(help="Ranks for distributed strategies (torchrun: its WORLD_SIZE).")] = 2,
    backend: Annotated[str, typer.Option(help="auto (gloo on CPU, nccl on CUDA), gloo or nccl.")] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu or cuda.")] = "auto",
    model: Annotated[str, typer.Option(
        help="What to train: reference, hf:gpt2, hf:llama, package.module:factory or "
             "path/to/file.py:factory (a function returning tracer.ModelSpec).")] = "reference",
    hidden: Annotated[int, typer.Option(help="Model width (--model reference).")] = 256,
    layers: Annotated[int, typer.Option(help="Transformer layers (--model reference).")] = 2,
    batch: Annotated[int, typer.Option(help="Global batch (divisible by the world size).")] = 8,
    seq: Annotated[int, typer.Option(help="Sequence length (--model reference).")] = 128,
    steps: Annotated[Optional[int], typer.Option(help="Total steps (default wait+warmup+active).")] = None,
    wait: Annotated[int, typer.Option(help="Profiler schedule wait (>= 1: step 0 is the numerics step).")] = 1,
    warmup: Annotated[int, typer.Option(help="Profiler schedule warmup.")] = 1,
    active: Annotated[int, typer.Option(help="Profiler schedule active steps.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of weights and data.")] = 0,
    precision: Annotated[str, typer.Option(help="fp32 or bf16 (autocast, fp32 master weights).")] = "fp32",
    lr: Annotated[Optional[float], typer.Option(help="Learning rate (default: sgd 0.1, adamw 1e-3).")] = None,
    optimizer: Annotated[str, typer.Option(help="sgd (plain) or adamw (torch defaults but the lr).")] = "sgd",
    mixed_precision: Annotated[Optional[str], typer.Option(
        help="PARAM,REDUCE,BUFFER dtypes (fp32, bf16, fp16), e.g. bf16,bf16,bf16: FSDP MixedPrecision, "
             "emulated in the baseline; ddp takes fp32,REDUCE,fp32.")] = None,
    activation_checkpointing: Annotated[bool, typer.Option(
        help="Non-reentrant activation checkpointing of every FSDP unit (baseline and ddp too).")] = False,
    bucket_cap_mb: Annotated[Optional[float], typer.Option(help="DDP bucket_cap_mb (default 25).")] = None,
    gradient_as_bucket_view: Annotated[bool, typer.Option(help="DDP gradient_as_bucket_view.")] = False,
    static_graph: Annotated[bool, typer.Option(help="DDP static_graph.")] = False,
    sharding_strategy: Annotated[str, typer.Option(help="FSDP: full_shard, shard_grad_op, no_shard.")] = "full_shard",
    wrap_min_params: Annotated[Optional[int], typer.Option(
        help="FSDP size_based_auto_wrap_policy min_num_params (default: one layer, 9h^2+8h).")] = None,
    backward_prefetch: Annotated[str, typer.Option(help="FSDP backward prefetch: pre, post, none.")] = "pre",
    forward_prefetch: Annotated[bool, typer.Option(help="FSDP forward prefetch.")] = False,
    reshard_after_forward: Annotated[Optional[bool], typer.Option(
        help="FSDP reshard after forward (default from the sharding strategy).")] = None,
    mesh: Annotated[Optional[str], typer.Option(
        help="hsdp: R,S = replicate x shard (R*S = ranks; default 2,N/2).")] = None,
    tp: Annotated[Optional[int], typer.Option(help="fsdp2_tp: tensor-parallel degree (default 2).")] = None,
    pp: Annotated[Optional[int], typer.Option(help="pp: pipeline stages (default 2).")] = None,
    pp_schedule: Annotated[Optional[str], typer.Option(help="pp: gpipe or 1f1b (default).")] = None,
    microbatches: Annotated[Optional[int], typer.Option(
        help="pp: microbatches per step (default 2 x stages).")] = None,
    out: Annotated[str, typer.Option(help="Output root; run dirs are OUT/NAME.")] = "traces",
    name: Annotated[Optional[str], typer.Option(help="Run name (default the strategy; with all: NAME-strategy).")] = None,
    timeout_s: Annotated[float, typer.Option("--timeout", help="Collective timeout and hang watchdog, seconds.")] = 60.0,
    fault: Annotated[Optional[str], typer.Option(
        help="Deliberate bug: skip-grad-sync (ddp), wrong-grad-scale, unsynced-init, "
             "skip-replicate-sync (hsdp), wrong-tp-placement (fsdp2_tp), skip-microbatch (pp), hang (ddp).")] = None,
    keep_tensors: Annotated[str, typer.Option(
        help="Kept baseline tensors: full (safetensors + summaries) or summaries (per-tensor summaries and sha256).")] = "full",
    golden: Annotated[Optional[str], typer.Option(
        help="Earlier run directory: reuse its batch and initial state, compare with its kept tensors.")] = None,
    data: Annotated[str, typer.Option(
        help="Input supply: memory (rows sliced once) or loader (DataLoader + DistributedSampler).")] = "memory",
    data_workers: Annotated[int, typer.Option(help="--data loader: DataLoader worker processes.")] = 0,
    data_sample_cost_ms: Annotated[float, typer.Option(
        help="--data loader: artificial cost per sample, ms (sleep; shows an input-bound run).")] = 0.0,
    repeat: Annotated[int, typer.Option(
        help="Record every chosen strategy N times, interleaved (A B C, B C A, C A B ...), as one "
             "experiment; run dirs NAME.r1 .. NAME.rN. 5 or more lets the report decide "
             "(README \"Deciding on a noisy machine\").")] = 1,
    experiment_id: Annotated[Optional[str], typer.Option(
        help="Experiment id (default: a new one per command); pass the same id to several "
             "torchrun commands to rank their runs together.")] = None,
    arm: Annotated[Optional[list[str]], typer.Option(
        help="A named arm, NAME=\"OPTIONS\" (repeatable): OPTIONS are tracer record options "
             "over the ones given outside the arms, e.g. --arm base=\"--strategy fsdp2\" --arm "
             "noreshard=\"--strategy fsdp2 --no-reshard-after-forward\". Each arm records one "
             "strategy; all arms are one experiment, interleaved over --repeat.")] = None,
    sweep: Annotated[Optional[list[str]], typer.Option(
        help="KEY=V1,V2[,...]: one arm per value of a recorder option (at most two --sweep: "
             "their grid), named KEY=V, e.g. --sweep bucket-cap-mb=1,25; ';' separates values "
             "that hold commas (mesh=2,4;4,2). With --arm: every arm x every value. At most 16 arms.")] = None,
    repeat_index: Annotated[int, typer.Option(hidden=True)] = 0,
    experiment_order: Annotated[Optional[str], typer.Option(hidden=True)] = None,
    arm_settings: Annotated[Optional[str], typer.Option(hidden=True)] = None,
    baseline_id: Annotated[Optional[str], typer.Option(hidden=True)] = None,
    ctx: typer.Context = typer.Option(None, hidden=True),
) -> None:
    """Record one strategy, a list, all four, or named arms into OUT/NAME run directories."""
    # every option but these five is a RecordConfig field of the same name
    options = {k: v for k, v in locals().items() if k not in ("strategy", "name", "ctx", "arm", "sweep")}
    if golden is not None:
        options["golden"] = str(Path(golden).resolve())
    where, sep, factory = model.rpartition(":")
    if sep and where.endswith(".py"):  # every process (workers, baseline) finds the same file
        options["model"] = f"{Path(where).expanduser().resolve()}:{factory}"
    from tracer.record import expand, interleave

    under_torchrun = "RANK" in os.environ
    spawned = os.environ.get("PARITYTRACE_LAUNCH") == "spawn"  # launch.LAUNCH_ENV: checked there
    if not under_torchrun:
        from tracer.launch import stop_on_signals

        # before any check runs model code: a stop signal from here on is one clean-up
        stop_on_signals()
    if under_torchrun and (strategy == "all" or "," in strategy):
        _fail(ExitCode.BAD_INPUT, f"--strategy {strategy}: under torchrun record one strategy per torchrun command")
    if under_torchrun and repeat > 1 and repeat_index == 0:  # spawned workers carry their index
        _fail(ExitCode.BAD_INPUT, f"--repeat {repeat}: under torchrun record one run per torchrun "
              "command; pass the same --experiment-id to each to rank them as one experiment")
    declared = bool(arm or sweep)
    if under_torchrun and declared:
        _fail(ExitCode.BAD_INPUT, f"--{'arm' if arm else 'sweep'}: under torchrun record one run "
              "per torchrun command (its options as that arm's); pass the same --experiment-id "
              "to each to rank them as one experiment")
    if declared and name is not None:
        _fail(ExitCode.BAD_INPUT, f"--name {name}: with --arm / --sweep each arm names its runs; "
              "drop --name")
    if under_torchrun and strategy != "single" and os.environ.get("WORLD_SIZE", "").isdigit():
        options["nproc"] = int(os.environ["WORLD_SIZE"])  # torchrun's world size wins
    try:
        if declared:
            configs = _declared_arms(ctx, arm or [], sweep or [], strategy, options)
        else:
            if strategy != "all" and "," not in strategy:  # typed on the command line, even at its default
                from tracer.config import check_taken

                check_taken(strategy, [k for k in options if _given(ctx, k)])
            configs = expand(strategy, name, **options)
        if not under_torchrun:
            configs = interleave(configs, experiment_id)
        elif repeat_index == 0:  # a torchrun rank: one run, its own experiment unless joined
            import uuid
            from dataclasses import replace

            configs = [replace(configs[0], repeat_index=1,
                               experiment_id=experiment_id or uuid.uuid4().hex)]
        if configs[0].golden is not None:
            from tracer.golden import check_golden

            for cfg in configs:
                check_golden(cfg)
        for model_name in dict.fromkeys(c.model for c in configs):  # arms may differ in it
            if model_name == "reference" or spawned:
                continue
            # before any worker, in a child under --timeout: a bad spec is one line, exit 2
            from tracer.speccheck import check_spec_isolated

            same = [c for c in configs if c.model == model_name]
            # fsdp2_tp first: the one strategy that needs more of the spec (its tp_plan)
            check_spec_isolated(next((c for c in same if c.strategy == "fsdp2_tp"),
                                     max(same, key=lambda c: c.world_size)))
        # before torch is imported: a refused folder or a held run dir stops at once
        if under_torchrun:  # rank 0 takes the lock when it clears the run dir (worker.run_rank)
            from tracer.rundir import check_run_dir, check_writable

            check_run_dir(configs[0].run_dir)
            check_writable(configs[0].run_dir)  # every rank, before the process group starts
        else:
            from tracer.record import claim_run_dirs

            claim_run_dirs(configs)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, str(exc))
    except KeyboardInterrupt:  # claim_run_dirs released what it had taken
        _fail(ExitCode.INTERRUPTED, _INTERRUPTED_EARLY)
    if under_torchrun:
        from tracer.worker import worker_main

        worker_main(configs[0])
        return
    _record_here(configs)


_INTERRUPTED = "interrupted; all workers stopped, the interrupted run has no manifest"
_INTERRUPTED_EARLY = "interrupted before any record started; nothing written"


def _declared_arms(ctx: typer.Context, arms: list[str], sweeps: list[str], strategy: str,
                   options: dict) -> list:
    """``--arm`` / ``--sweep`` -> one config per arm (tracer/arms.py). Raises ``ValueError``
    with one line."""
    from tracer.arms import expand_arms

    parse, kinds = arm_parser(ctx.command)
    given = [k for k in options if _given(ctx, k)]
    return expand_arms(arms, sweeps, strategy=strategy if _given(ctx, "strategy") else None,
                       common=options, given=given, parse=parse, option_kinds=kinds)


def arm_parser(command=None):
    """(parse, option kinds) for tracer/arms.py from ``record``'s own parser (``command``,
    default this app's), so an arm takes exactly the options the command takes: ``parse(argv)``
    -> {field: value} of the options given in ``argv`` (``ValueError`` with the parser's one
    line); kinds: every visible option's field -> whether it is an on/off flag."""
    if command is None:
        command = typer.main.get_command(app).commands["record"]
    params = {p.name: p for p in command.params if p.param_type_name == "option"}
    kinds = {n: bool(p.is_flag or p.secondary_opts) for n, p in params.items()
             if not p.hidden and n not in ("arm", "sweep", "name")}

    def parse(argv: list[str]) -> dict:
        if "--help" in argv:  # click would print the help and exit 0: nothing recorded
            raise ValueError("--help inside an arm; see tracer record --help for what an arm takes")
        try:
            sub = command.make_context("arm", list(argv), resilient_parsing=False)
        except _UsageError as exc:
            raise ValueError(exc.format_message()) from None
        given = {k: v for k, v in sub.params.items() if k != "ctx" and _given(sub, k)}
        for nested in ("arm", "sweep"):
            if nested in given:
                raise ValueError(f"--{nested} inside an arm; give every arm at the top level")
        return given

    return parse, kinds


def _given(ctx: typer.Context, option: str) -> bool:
    """Whether ``option`` was on the command line (click's parameter source)."""
    source = ctx.get_parameter_source(option)
    return source is not None and source.name == "COMMANDLINE"


def _record_here(configs) -> None:
    from tracer.launch import RecordFailed

    # Ctrl-C, SIGTERM, SIGHUP: one clean-up (stop_on_signals, installed before the claim)
    logging.basicConfig(level=logging.WARNING, format="tracer: %(message)s")
    from tracer.record import record_local, unrecorded

    done: list[Path] = []
    try:
        record_local(configs, done)
    except RecordFailed as exc:
        _fail(ExitCode.INTERNAL, f"record failed: {exc}; no manifest written{unrecorded(configs, done)}",
              done)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, f"{exc}{unrecorded(configs, done)}", done)
    except KeyboardInterrupt:
        _fail(ExitCode.INTERRUPTED, f"{_INTERRUPTED}{unrecorded(configs, done)}", done)
    except Exception:
        from tracer.launch import stop_requested

        if not stop_requested():
            raise
        # the stop signal's KeyboardInterrupt, turned into another error by an import
        _fail(ExitCode.INTERRUPTED, f"{_INTERRUPTED}{unrecorded(configs, done)}", done)
    for run_dir in done:
        typer.echo(one_line(f"recorded {run_dir}"))


def main() -> None:
    """Console-script entry point: one-line usage errors (exit 2), never a traceback for them."""
    try:
        code = app(standalone_mode=False)
    except _UsageError as exc:
        typer.echo(f"tracer: {exc.format_message()}", err=True)
        code = ExitCode.BAD_INPUT
    except typer.Exit as exc:
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("tracer: interrupted", err=True)
        code = ExitCode.INTERRUPTED
    _exit_without_teardown(code if isinstance(code, int) else 0)


def _exit_without_teardown(code: int) -> None:
    """Exit with ``code`` now, skipping the interpreter's teardown: with torch loaded it costs
    about 1 s of CPU on torch 2.13 (after every file is written and every worker reaped), and,
    torch loaded or not, a stop signal landing in it would print a traceback from an atexit
    hook or, once Python has restored the default handlers, end the process by that signal
    (exit -2 or -15, not the code said: seen for a SIGTERM just after the run dir was claimed).
    Only the console entry point does this; ``app`` invoked in-process returns normally."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:  # a reader that left early (| head): nothing more to say
            pass
    os._exit(code)
