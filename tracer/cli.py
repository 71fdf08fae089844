"""`tracer` command line (thin): parse options, call ``record_local`` or ``worker_main``. The
options of ``record`` are ``RecordConfig``'s fields (tracer/config.py), built from them.

Exit codes (analyzer/contract/errors.py ``ExitCode``): 0 ok, 1 a record failed (one line names the rank
and its first error), 2 bad options or a refused run dir (``rundir.check_run_dir``; another record
holds it), 130 interrupted (SIGINT, SIGTERM, SIGHUP, SIGQUIT; from before the ``--model`` check
on). Under torchrun (RANK set) this process is that rank. It prints ``recorded <run dir>`` per
run it completed (under torchrun global rank 0 only), also before the one line of a failure.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path
from typing import Annotated, Optional, get_type_hints

import typer

from analyzer.contract.errors import ExitCode
from analyzer.contract.strategies import TABLE, all_set, is_reference
from analyzer.contract.text import one_line
from tracer.config import RecordConfig, check_taken

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None,
                  help="Record a model (the reference transformer or yours) single-device and distributed under torch.profiler.")
# click's UsageError (typer may vendor click): the base of every option / usage error.
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


@app.callback()
def _main() -> None:
    """paritytrace recorder."""


_SAID: list[str] = []
"""The line ``_fail`` said, if any: typer returns 130 for a ``KeyboardInterrupt`` that ends a
command, saying nothing (``main`` then says it)."""


def _fail(code: int, message: str, recorded: list[Path] = ()) -> None:
    """One line on stderr, exit ``code``; first, on stdout, the runs that were ``recorded``."""
    for run_dir in recorded:
        typer.echo(one_line(f"recorded {run_dir}"))
    typer.echo(one_line(f"tracer: {message}"), err=True)
    _SAID.append(message)
    raise typer.Exit(code)


def _config_options(command):
    """Give ``command`` one keyword option per ``RecordConfig`` field but ``strategy`` (a list
    here), after its first parameter: name, type, default and help are the field's
    (tracer/config.py ``_option``), so an option is declared once."""
    types = get_type_hints(RecordConfig)
    derived = []
    for f in fields(RecordConfig):
        if f.name == "strategy":
            continue
        help_text = f.metadata.get("help")
        parser = f.metadata.get("parser")
        option = typer.Option(*filter(None, [f.metadata.get("flag")]), help=help_text,
                              hidden=help_text is None, parser=parser and _as_bad_parameter(parser),
                              metavar=f.metadata.get("metavar"))
        derived.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                         annotation=Annotated[types[f.name], option]))
    own = list(inspect.signature(command, eval_str=True).parameters.values())  # ends in **options
    command.__signature__ = inspect.Signature([own[0], *derived, *own[1:-1]])
    return command


def _as_bad_parameter(parse):
    """``parse`` with its ``ValueError`` raised as click's ``BadParameter``: the one line says
    the option and the parser's words, nothing more."""
    def parsed(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return parsed


@app.command()
@_config_options
def record(
    strategy: Annotated[str, typer.Option(
        help=f"{', '.join(TABLE)}, all (the first {len(all_set())}), or a "
             "comma-separated list (ddp,fsdp2,hsdp).")] = "all",
    *,
    arm: Annotated[Optional[list[str]], typer.Option(
        help="A named arm, NAME=\"OPTIONS\" (repeatable): OPTIONS are tracer record options "
             "over the ones given outside the arms, e.g. --arm base=\"--strategy fsdp2\" --arm "
             "noreshard=\"--strategy fsdp2 --no-reshard-after-forward\". Each arm records one "
             "strategy; all arms are one experiment, interleaved over --repeat.")] = None,
    sweep: Annotated[Optional[list[str]], typer.Option(
        help="KEY=V1,V2[,...]: one arm per value of a recorder option (at most two --sweep: "
             "their grid), named KEY=V, e.g. --sweep bucket-cap-mb=default,25; ';' separates values "
             "that hold commas (mesh=2,4;4,2). With --arm: every arm x every value. At most 16 arms.")] = None,
    ctx: typer.Context = typer.Option(None, hidden=True),
    **options,
) -> None:
    """Record one strategy, a list, all four, or named arms into OUT/NAME run directories."""
    under_torchrun = "RANK" in os.environ
    if not under_torchrun:
        from analyzer.contract.stopping import stop_on_signals

        # before any check runs model code: a stop signal from here on is one clean-up
        stop_on_signals()
    try:
        _check_combination(strategy, arm, sweep, options, under_torchrun)
        configs = _configs(ctx, strategy, arm or [], sweep or [], _resolved(options, strategy),
                           under_torchrun)
        _check_before_start(configs, under_torchrun)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, str(exc))
    except KeyboardInterrupt:  # claim_run_dirs released what it had taken
        _fail(ExitCode.INTERRUPTED, _INTERRUPTED_EARLY)
    if under_torchrun:
        from tracer.worker import worker_main

        worker_main(configs[0])
        return
    _record_here(configs)


PROJECTED_STRATEGIES = tuple(name for name, row in TABLE.items() if not row.is_reference)
"""What ``tracer project`` runs (issue 44): every distributed strategy (pp: each stage is given
its static shapes, tracer/pipeline.py ``stage_shapes``, so no shape exchange needs data the fake
group cannot move; fsdp2_tp: the tp ranks of dp index 0)."""


@app.command()
@_config_options
def project(
    strategy: Annotated[str, typer.Option(
        help=f"One of {', '.join(PROJECTED_STRATEGIES)}.")] = "fsdp2",
    *,
    ranks_per_node: Annotated[Optional[int], typer.Option(
        "--ranks-per-node", min=1,
        help="The target's ranks per node (default: all N on one node). On CPU each role's "
             "compute is measured with this many copies running at once, up to this machine's "
             "CPUs, so it carries the contention of the node's other ranks.")] = None,
    fake_tensors: Annotated[Optional[bool], typer.Option(
        "--fake-tensors/--real-tensors",
        help="Run the roles under torch's FakeTensorMode (no storage, no values: for a model "
             "too large for this device) or with real tensors. Default: fake only when the "
             "model's parameters and one rank's parameters + gradients + optimizer state do "
             "not fit this device's free memory (one log line says so).")] = None,
    device_tflops: Annotated[Optional[float], typer.Option(
        help="With fake tensors: the target device's assumed peak, 10^12 FLOP/s, for the "
             "per-op compute estimate (a roofline with --device-mem-gbps).")] = None,
    device_mem_gbps: Annotated[Optional[float], typer.Option(
        help="With fake tensors: the target device's assumed memory bandwidth, 10^9 "
             "bytes/s.")] = None,
    ctx: typer.Context = typer.Option(None, hidden=True),
    **options,
) -> None:
    """Project one strategy at --nproc N ranks from ONE process (torch's fake process group,
    no data moved), on this device, into OUT/NAME: a run directory the analyzer reads like a
    record, holding each distinct role's rank at N (rank 0 of a flat strategy or hsdp; of
    fsdp2_tp the tp ranks 0..T-1 of dp index 0; of pp ranks 0..P-1, one per stage): its local
    shapes, every collective call with its process group, kind, dtype and bytes, and memory
    per rank by category (parameters, gradients, optimizer state, activations). The manifest
    says it is projected; its numerics are not verified (no data moves); its step times are
    this one process's: analyzer report --link-model projects the step at N from them.
    Options as tracer record's (--backend and --repeat do not apply)."""
    from analyzer.contract.stopping import stop_on_signals

    stop_on_signals()
    try:
        if strategy not in PROJECTED_STRATEGIES:
            raise ValueError(f"--strategy {strategy}: tracer project runs "
                             f"{', '.join(PROJECTED_STRATEGIES)} so far")
        for option, default in (("repeat", 1), ("backend", "auto")):  # one process, the fake group
            if options[option] != default:
                raise ValueError(f"--{option} {options[option]}: tracer project runs one process on "
                                 "torch's fake process group; drop it")
        check_taken(strategy, [k for k in options if _given(ctx, k)])
        cfg = RecordConfig(strategy=strategy, **_resolved(options, strategy))
        from tracer.fakeproject import FakeOptions

        fake = FakeOptions(fake_tensors=fake_tensors, device_tflops=device_tflops,
                           device_mem_gbps=device_mem_gbps)
        # as one torchrun rank: one process (no N-rank memory check), the run dir only checked
        # (tracer.project.project claims it)
        _check_before_start([cfg], under_torchrun=True)
        from tracer.project import check_projection, project as run_projection

        check_projection(cfg)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, str(exc))
    except KeyboardInterrupt:
        _fail(ExitCode.INTERRUPTED, _INTERRUPTED_EARLY)
    logging.basicConfig(level=logging.WARNING, format="tracer: %(message)s")
    try:
        run_dir = run_projection(cfg, fake, ranks_per_node=ranks_per_node)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, str(exc))
    except RuntimeError as exc:  # a role's child failed: its last line
        _fail(ExitCode.INTERNAL, f"projection failed: {exc}; no manifest written")
    except KeyboardInterrupt:
        _fail(ExitCode.INTERRUPTED, _INTERRUPTED)
    typer.echo(one_line(f"projected {run_dir}"))


def _resolved(options: dict, strategy: str) -> dict:
    """``options`` with ``--golden`` and a ``--model path/file.py:factory`` made absolute, so that
    every process (workers, baseline) finds the same files; under torchrun its world size."""
    options = dict(options)
    if options["golden"] is not None:
        options["golden"] = str(Path(options["golden"]).resolve())
    where, sep, factory = options["model"].rpartition(":")
    if sep and where.endswith(".py"):
        options["model"] = f"{Path(where).expanduser().resolve()}:{factory}"
    if "RANK" in os.environ and not is_reference(strategy) and os.environ.get("WORLD_SIZE", "").isdigit():
        options["nproc"] = int(os.environ["WORLD_SIZE"])  # torchrun's world size wins
    return options


def _check_combination(strategy: str, arm, sweep, options: dict, under_torchrun: bool) -> None:
    """Refuse what one command cannot record (``ValueError``, one line): under torchrun one
    run per command; ``--name`` with declared arms."""
    how = "pass the same --experiment-id to each to rank them as one experiment"
    if under_torchrun and (strategy == "all" or "," in strategy):
        raise ValueError(f"--strategy {strategy}: under torchrun record one strategy per torchrun command")
    if under_torchrun and options["repeat"] > 1 and options["repeat_index"] == 0:  # workers carry theirs
        raise ValueError(f"--repeat {options['repeat']}: under torchrun record one run per torchrun "
                         f"command; {how}")
    if under_torchrun and (arm or sweep):
        raise ValueError(f"--{'arm' if arm else 'sweep'}: under torchrun record one run per "
                         f"torchrun command (its options as that arm's); {how}")
    if (arm or sweep) and options["name"] is not None:
        raise ValueError(f"--name {options['name']}: with --arm / --sweep each arm names its runs; "
                         "drop --name")


def _configs(ctx: typer.Context, strategy: str, arms: list[str], sweeps: list[str], options: dict,
             under_torchrun: bool) -> list:
    """One ``RecordConfig`` per run, in recording order (interleaved repeats; under torchrun the
    one run of this command). Raises ``ValueError`` with one line."""
    from tracer.record import expand, interleave

    if arms or sweeps:
        configs = _declared_arms(ctx, arms, sweeps, strategy,
                                 {k: v for k, v in options.items() if k != "name"})
    else:
        if strategy != "all" and "," not in strategy:  # typed on the command line, even at its default
            check_taken(strategy, [k for k in options if _given(ctx, k)])
        configs = expand(strategy, **options)
    if not under_torchrun:
        return interleave(configs, options["experiment_id"])
    if options["repeat_index"]:  # a spawned worker: its config is the launcher's
        return configs
    import uuid
    from dataclasses import replace

    # a torchrun rank: one run, its own experiment unless joined
    return [replace(configs[0], repeat_index=1, experiment_id=options["experiment_id"] or uuid.uuid4().hex)]


def _check_before_start(configs: list, under_torchrun: bool) -> None:
    """Before torch is imported or a worker starts: each ``--model`` names a model
    (``specform.parse_spec``: its form, its file), the built-in launcher's ranks fit this
    machine's memory, the golden run, each user model spec (in a child under --timeout), then
    the run dirs (a refused folder or a held run dir stops at once).
    Raises ``ValueError`` with one line."""
    from analyzer.contract import settings
    from analyzer.contract.errors import BadInput
    from tracer.specform import parse_spec

    for model_name in dict.fromkeys(c.model for c in configs):  # no torch, no model code yet
        parse_spec(model_name)  # a missing file, an unknown family: one line, nothing started
    try:
        settings.log_level()  # read by each rank after the baseline: refused here, before it
    except BadInput as exc:
        raise ValueError(exc.one_line()) from None
    if not under_torchrun:  # all ranks on this machine: as many as its memory holds
        from tracer.record import check_ranks_fit_machine, machine_memory_bytes

        check_ranks_fit_machine(configs, machine_memory_bytes())
    if configs[0].golden is not None:
        from tracer.golden import check_golden

        for cfg in configs:
            check_golden(cfg)
    spawned = os.environ.get("PARITYTRACE_LAUNCH") == "spawn"  # launch.LAUNCH_ENV: checked there
    for model_name in dict.fromkeys(c.model for c in configs):  # arms may differ in it
        if model_name == "reference" or spawned:
            continue
        from tracer.speccheck import check_spec_isolated

        same = [c for c in configs if c.model == model_name]
        # a tensor-parallel or pipelined strategy first: it needs more of the spec (tp_plan, pp_split)
        check_spec_isolated(next((c for c in same if c.row.dim_of("tensor") or c.row.dim_of("stage")),
                                 max(same, key=lambda c: c.world_size)))
    if under_torchrun:  # rank 0 takes the lock when it clears the run dir (worker.run_rank)
        from tracer.rundir import check_run_dir, check_writable

        check_run_dir(configs[0].run_dir)
        check_writable(configs[0].run_dir)  # every rank, before the process group starts
    else:
        import tracer.launch  # noqa: F401  before the claim: _record_here's imports are then instant
        from tracer.record import claim_run_dirs

        claim_run_dirs(configs)


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
    from tracer.record import REPLACED, record_local, unrecorded
    from tracer.rundir import incomplete_hint

    # Ctrl-C, SIGTERM, SIGHUP: one clean-up (stop_on_signals, installed before the claim)
    done: list[Path] = []
    REPLACED.clear()  # this command's only (app may be invoked twice in one process)

    def replaced() -> list[str]:  # the finished runs the recorded ones replaced
        return [f"{d} replaced {REPLACED[d]}" for d in done if d in REPLACED]

    def left() -> str:  # which runs were (not) recorded, how to clean up the incomplete ones,
        # and what the recorded ones replaced: all in the command's one line
        return (unrecorded(configs, done) + incomplete_hint(
            [c.run_dir for c in configs if c.run_dir not in done], REPLACED)
            + "".join(f"; {s}" for s in replaced()))

    try:
        logging.basicConfig(level=logging.WARNING, format="tracer: %(message)s")
        record_local(configs, done)
    except RecordFailed as exc:
        _fail(ExitCode.INTERNAL, f"record failed: {exc}; no manifest written{left()}", done)
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, f"{exc}{left()}", done)
    except KeyboardInterrupt:
        _fail(ExitCode.INTERRUPTED, f"{_INTERRUPTED}{left()}", done)
    except Exception:
        from analyzer.contract.stopping import stop_requested

        if not stop_requested():
            raise
        # the stop signal's KeyboardInterrupt, turned into another error by an import
        _fail(ExitCode.INTERRUPTED, f"{_INTERRUPTED}{left()}", done)
    for run_dir in done:
        typer.echo(one_line(f"recorded {run_dir}"))
    for cfg in configs:  # what torch applied below what was asked (tracer.strategies imports
        if cfg.fsdp2_prefetch and cfg.run_dir in done:  # torch: only when it was asked)
            from tracer.strategies import prefetch_cut_of

            if cut := prefetch_cut_of(cfg.fsdp2_prefetch, cfg.run_dir):
                typer.echo(one_line(f"tracer: {cut}"), err=True)
    for line in replaced():  # never lose a finished run silently (issue 42)
        typer.echo(one_line(f"tracer: {line}"), err=True)


def _sizes(text: str) -> tuple[int, ...]:
    """``--sizes 1024,4096,...`` -> bytes; ``ValueError`` for an item that is not an integer."""
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise ValueError(f"{text!r}: comma-separated sizes in bytes, e.g. 1024,65536") from None


@app.command()
def linkbench(
    nproc: Annotated[int, typer.Option(
        help="Local processes P: groups of every size g dividing P (g >= 2) are measured, all "
             "P / g groups at once.")] = 2,
    out: Annotated[Path, typer.Option(
        help="The JSON file the curves go to (the link model's table form).")] = Path("links.json"),
    iters: Annotated[int, typer.Option(help="Timed calls per kind and size (after one warm-up).")] = 5,
    sizes: Annotated[Optional[str], typer.Option(
        help="Comma-separated sizes in bytes (nccl-tests bytes), each a multiple of 4 x P; "
             "default 2^10..2^24 by x4.", metavar="BYTES,...")] = None,
) -> None:
    """Measure this machine's links for a projection's step time: each collective
    kind (all_reduce, all_gather, reduce_scatter, all_to_all, send_recv) at each size on
    groups of each size g that divides --nproc, gloo on CPU or NCCL when P GPUs are visible;
    per size the mean of every call of every rank and a spread (10th..90th percentile of the
    calls); on gloo also the wait for a group's last rank when every rank computes between
    calls (the arrival wait of ranks sharing cores). Writes them to --out for analyzer report /
    grade --link-model. More processes than CPUs measure a shared machine (said); a time that
    falls as the size grows is noise (said: rerun on a quiet machine or with more --iters)."""
    from analyzer.contract.errors import BadInput
    from analyzer.contract.outpaths import check_out
    from analyzer.contract.stopping import stop_on_signals
    from tracer import linkbench as bench

    stop_on_signals()
    try:
        chosen = bench.SIZES_BYTES if sizes is None else _sizes(sizes)
        bench.check_options(nproc, iters, chosen, bench.KINDS)
        check_out(out, option="--out", what="the link curves", example="links.json")
        above = next(p for p in out.absolute().parents if p.exists())
        if not above.is_dir():  # refused now, not after the whole benchmark ran
            raise ValueError(f"{above}: is a file, not a folder; pass --out a file in a folder")
    except ValueError as exc:
        _fail(ExitCode.BAD_INPUT, str(exc))
    except BadInput as exc:
        _fail(ExitCode.BAD_INPUT, exc.one_line())
    cpus = len(os.sched_getaffinity(0))
    if nproc > cpus:
        typer.echo(one_line(f"tracer: {nproc} processes on {cpus} usable CPUs: the curves carry "
                            "this machine's oversubscription, as a record of that many ranks "
                            "here would"), err=True)
    try:
        table = bench.run_linkbench(out, world=nproc, iters=iters, sizes=chosen)
    except KeyboardInterrupt:
        _fail(ExitCode.INTERRUPTED, "interrupted; no link curves written")
    except OSError as exc:  # the write of --out
        _fail(ExitCode.BAD_INPUT, f"{out}: cannot be written ({exc.strerror})")
    curves = table["curves"]
    spans = ", ".join(f"g={g}" for g in dict.fromkeys(c["group_size"] for c in curves))
    waits = "; ".join(f"g={a['group_size']}: " + ", ".join(
        f"{r['wait_ns'] / 1e6:.2g} ms [{r['low_ns'] / 1e6:.2g}..{r['high_ns'] / 1e6:.2g}] after "
        f"{r['segment_ns'] / 1e6:g} ms" for r in a["rows"]) for a in table["arrival"])
    typer.echo(one_line(f"wrote {out}: {len(curves)} curves ({spans}; "
                        f"{len(bench.KINDS)} kinds x {len(chosen)} sizes each)"
                        + (f"; arrival wait per call {waits} of compute" if waits else "")))
    for line in bench.falling(curves) + bench.arrival_noise(table["arrival"]):
        typer.echo(one_line(f"tracer: {line}"), err=True)


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
        code = ExitCode.INTERRUPTED
    if code == ExitCode.INTERRUPTED and not _SAID:
        typer.echo("tracer: interrupted", err=True)
    if "tracer.rundir" in sys.modules:  # no lock was taken otherwise
        sys.modules["tracer.rundir"].unlock_all()
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
        with contextlib.suppress(BrokenPipeError):  # a reader that left early (| head)
            stream.flush()
    os._exit(code)
