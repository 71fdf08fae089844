"""`analyzer` command line: thin commands that call one library function each.

Typed errors become one-line messages and exit codes (analyzer/contract/errors.py); a traceback is
printed only with ``--debug``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
from typing import Annotated, Callable, NoReturn, TypeVar

import typer

from analyzer.cli import drift as cli_drift, merge as cli_merge, report as cli_report
from analyzer.cli import gate as cli_gate, grade as cli_grade, summary as cli_summary
from analyzer.cli.richout import clean, echo
from analyzer.contract import settings, stopping
from analyzer.contract.errors import ExitCode, ParityTraceError, Reason

# rich_markup_mode=None: click's plain help, where a flag reads `--debug`, not `--debug <bool>`
# (typer 0.29's rich panels print a type after every option, flags included)
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  rich_markup_mode=None, help="Analyse paritytrace run directories or any PyTorch profiler traces.")
_state = {"debug": False}
T = TypeVar("T")


def _run(fn: Callable[[], T]) -> T:
    """Call ``fn``; map typed errors to a one-line message on stderr and their exit code."""
    try:
        settings.check_all()
        return fn()
    except ParityTraceError as exc:
        if _state["debug"]:
            raise
        problems = getattr(exc, "problems", [])
        head = str(exc)
        if problems and exc.reason == Reason.BAD_FOLDER:  # the message joins them all: list instead
            head = f"{exc.path}: {len(problems)} problems, one per line below"
        for line in [head] + [str(p) for p in problems]:
            echo(f"analyzer: {clean(line, one_line=True)}", err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("analyzer: interrupted", err=True)
        raise typer.Exit(ExitCode.INTERRUPTED) from None


@app.callback()
def _main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks.")] = False) -> None:
    _state["debug"] = debug


class _PipeClosed(Exception):
    """The reader of stdout went away (``analyzer summary DIR | head -1``). Not an OSError, so
    click does not turn it into its own silent exit 1 before ``main`` sees it."""


def _pipe_safe(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap a command so a ``BrokenPipeError`` (also rich's: analyzer/cli/richout.py) leaves it as
    ``_PipeClosed`` (signature kept: typer reads the options from it)."""

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BrokenPipeError:
            raise _PipeClosed() from None

    return wrapped


# Each command lives beside the library code it calls; heavy imports stay inside commands.
for _command in (cli_summary, cli_merge, cli_report, cli_gate, cli_drift, cli_grade):
    _command.register(app, _run)
for _info in app.registered_commands:
    _info.callback = _pipe_safe(_info.callback)


# click's UsageError (typer >= 0.2x ships its own copy of click): every usage error's base
_UsageError = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def main() -> None:
    """Console-script entry point."""
    from reports import cache

    cache.command_started()  # before the imports and parsing a report waits for
    try:
        rc = app(standalone_mode=False)
    except (BrokenPipeError, _PipeClosed):  # `analyzer ... | head`: the reader left; exit 0 quietly
        _quiet_stdout()
        sys.exit(0)
    except _UsageError as exc:  # bad option / argument: one line, exit 2
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `analyzer [CMD]`: its help
            exc.show()
        else:
            where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx else ""
            echo(f"analyzer: {clean(exc.format_message(), one_line=True)}{where}", err=True)
        sys.exit(ExitCode.BAD_INPUT)
    except typer.Abort:
        typer.echo("analyzer: interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    except SystemExit:
        raise
    except Exception as exc:  # a bug, not bad input: say so, keep the traceback behind --debug
        if _state["debug"]:
            raise
        echo(f"analyzer: internal error: {type(exc).__name__}: {clean(exc, one_line=True)} "
             "(rerun with --debug and report it)", err=True)
        sys.exit(ExitCode.INTERNAL)
    try:
        sys.stdout.flush()  # a pipe closed after the last write fails here, not in the command
    except BrokenPipeError:
        _quiet_stdout()
    sys.exit(rc if isinstance(rc, int) else 0)


def run() -> NoReturn:
    """Console-script entry point: ``main``, then, with the output flushed, end the process at
    once (``os._exit``): the interpreter's teardown of pandas / pyarrow costs about 0.1 s and
    does nothing for a finished command (files are written atomically and closed, the parse
    workers already stopped). ``main`` (tests call it) ends with ``SystemExit`` as usual.

    SIGTERM and SIGHUP (a batch system stopping the job, a closed terminal) are a Ctrl-C: the
    first raises ``KeyboardInterrupt``, so the command cleans up (parse workers, the
    ``--tables-out`` staging folder, the per-rank tables on disk) and exits 130 with one line;
    later ones are ignored so the clean-up runs to its end."""
    stopping.stop_on_signals((signal.SIGTERM, signal.SIGHUP))
    # Arrow's own allocator (mimalloc) keeps pages a parse freed: on the system's, a cold
    # report of 8 x 41 MB ranks peaks 25 MB lower (bench/RESULTS.md); a user's choice stands.
    # Read by Arrow when it first allocates: pyarrow is not imported yet (workers inherit it)
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        main()
        code = 0
    except SystemExit as exc:
        if not isinstance(exc.code, int) and exc.code is not None:
            raise  # a message to print: leave it to the interpreter
        code = exc.code or 0
    try:
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        _quiet_stdout()
    with contextlib.suppress(BrokenPipeError, ValueError):
        sys.stderr.flush()
    logging.shutdown()
    from analyzer.ingest import spill

    spill.remove_all()  # os._exit runs no finalizer: the per-rank tables on disk go here
    os._exit(code)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null after the reader of a pipe went away (``| head``), so the
    interpreter's flush at shutdown does not print "Exception ignored ... BrokenPipeError"
    (the recipe of the Python docs, signal module, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout without a file descriptor (captured in tests)
        pass


if __name__ == "__main__":
    run()
