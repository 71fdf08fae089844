"""`analyzer gate DIR`: the parity gate (issue 4) and, with ``--baseline OLD`` (the previous
runs), the performance gate (issue 20, analyzer/compare/perfgate.py).

Exit codes (docs/errors.md "Exit codes and errors", ``ExitCode``): 0 every run passed parity and no
metric regressed; 2 bad input or option; 3 a run is not numerically equivalent or not verified
(checked first: speed figures of wrong numbers do not count); 4 a regression: the 95 % interval
of new / old step time, exposed communication or peak allocated memory lies wholly above
1 + ``--max-regression`` with at least ``stats.MIN_REPEATS`` runs on each side. With
``--baseline`` both folders are analysed and checked (readable, a strategy in common, the same
settings) before anything is printed: a bad OLD is one line, exit 2, never after PASS lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from analyzer.cli import input_path

if TYPE_CHECKING:
    from analyzer.contract.report_types import RunEntry

GATE_ALLOW_INCOMPLETE_HELP = (
    "Accept run directories without manifest.json (a record that did not finish): listed SKIP, "
    "not gated (they alone never pass).")
GATE_HELP = (
    "Exit 0 when every run passes the parity gate (the single-device run counts), 3 otherwise. "
    "With --baseline OLD, the previous runs, also compare performance with OLD, strategy by "
    "strategy: exit 4 when the 95 % interval of new/old step time, exposed communication or "
    "peak allocated memory lies wholly above 1 + --max-regression with enough runs a side "
    "(record both with --repeat 5; noise alone never fails it). Exit 2: bad input, or OLD "
    "without a strategy in common or recorded under other settings.")


def gate_lines(runs: list[RunEntry]) -> tuple[bool, list[str]]:
    """(every run passed, one line per run and the verdict line). The reference run counts as
    a pass; an incomplete run (included only with ``--allow-incomplete``) and a projection
    (``tracer project``: no data moved) have no parity to gate: listed as SKIP; the verdict then says it was skipped, so it never reads as a pass of
    that run. A run without numerics (or with a rank or tensor missing from them) is "not
    verified" -- a failure, never called "not numerically equivalent"."""
    lines, ok = [], True
    failed, unverified = False, False
    for r in runs:
        passed = r.parity.status in ("pass", "reference")
        skip = r.incomplete or r.projection is not None
        ok &= passed or skip
        failed |= r.parity.status == "fail" and not skip
        unverified |= r.parity.status == "not_recorded" and not skip
        word = "SKIP" if skip else "PASS" if passed else "FAIL"
        lines.append(f"{word} {r.name}: {r.parity.status} -- {r.parity.reason}")
    skipped = [r.name for r in runs if r.incomplete]
    projected = [r.name for r in runs if r.projection is not None and not r.incomplete]
    # nothing was gated: incomplete runs beside no verified distributed run (at most the
    # single-device reference) never pass
    verified = [r for r in runs if not r.incomplete and r.parity.status == "pass"]
    nothing = bool(skipped) and not verified
    ok = ok and not nothing
    tail = (f" ({len(skipped)} incomplete run(s) skipped, not verified: {', '.join(skipped)})"
            if skipped else "") + (
        f" ({len(projected)} projection(s) skipped: tracer project moves no data, so there are "
        f"no numerics to gate: {', '.join(projected)})" if projected else "")
    if ok:
        lines.append(f"gate: passed{tail}")
    else:
        why = ([" at least one run is not numerically equivalent to the baseline"] if failed else []) + (
            [" at least one run is not verified (no numerics, or a rank or tensor missing "
             "from them)"] if unverified else []) + (
            [" nothing was verified: no complete distributed run (only incomplete runs"
             + (" and the reference" if len(skipped) < len(runs) else "") + ")"]
            if nothing and not failed and not unverified else [])
        lines.append(f"gate: FAILED --{';'.join(why)}{tail}")
    return ok, lines


def perf_inputs(directory: Path, previous: Path, options
                ) -> tuple[list[RunEntry], list[RunEntry]]:
    """(NEW's runs, OLD's runs), both analysed (``runs.analyse``, cached), checked before the
    gate prints anything. Raises ``BadInput``: either folder missing or unreadable, no strategy
    in common, or a strategy's NEW and OLD runs recorded under different settings
    (``perfgate.mismatch``: the ranking's rule for one experiment)."""
    from analyzer.compare import perfgate, runs
    from analyzer.contract.errors import BadInput

    old = runs.analyse(previous, options).runs
    new = runs.analyse(directory, options).runs
    try:
        arms = perfgate.common_arms(new, old)
    except ValueError as exc:
        raise BadInput(previous, "bad_option", f"--baseline: {exc}",
                       "pass previous runs recorded with the same strategies (run names)") from None
    if diffs := perfgate.mismatch(arms, str(directory), str(previous)):
        raise BadInput(previous, "bad_option",
                       f"--baseline: recorded under other settings than {directory}, so its "
                       f"times do not compare with it: {'; '.join(diffs)}",
                       f"record {previous} with the same settings as {directory} (the same "
                       "tracer record options) and gate again")
    from analyzer.cli import richout

    for line in perfgate.mismatch(arms, str(directory), str(previous), keys=("versions",)):
        richout.echo(f"note: {line}: the comparison measures the upgrade as well", err=True,
                     one_line=True)
    return new, old


def register(app, run) -> None:
    """Add the ``gate`` command to ``app``; ``run`` maps typed errors to exit codes."""

    @app.command("gate", help=GATE_HELP)
    def gate_cmd(
        directory: Annotated[Path, typer.Argument(parser=input_path, help="Traces root or one run directory.")],
        rtol: Annotated[Optional[float], typer.Option("--rtol", help="Override the relative tolerance.")] = None,
        atol: Annotated[Optional[float], typer.Option("--atol", help="Override the absolute tolerance.")] = None,
        allow_incomplete: Annotated[bool, typer.Option("--allow-incomplete", help=GATE_ALLOW_INCOMPLETE_HELP)] = False,
        previous: Annotated[Optional[Path], typer.Option(
            "--baseline", parser=input_path, help="Previous runs: an earlier traces root (or run directory) to compare performance with.")] = None,
        max_regression: Annotated[Optional[str], typer.Option(
            "--max-regression", help="Allowed slow-down, e.g. 10% or 0.10 (default 10% with --baseline).")] = None,
    ) -> None:
        from analyzer.cli import richout
        from analyzer.compare import perfgate, runs
        from analyzer.contract.errors import ExitCode
        from analyzer.contract.report_types import AnalysisOptions, ToleranceOverride

        if max_regression is not None and previous is None:
            raise typer.BadParameter("needs --baseline OLD", param_hint="--max-regression")
        try:
            allowed = perfgate.parse_max_regression(max_regression or "10%")
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--max-regression") from None
        options = run(lambda: AnalysisOptions(tolerance=ToleranceOverride(rtol=rtol, atol=atol),
                                              allow_incomplete=allow_incomplete))
        if previous is None:
            entries = run(lambda: runs.gate(directory, options))
        else:  # analysed and checked before any line is printed
            entries, old = run(lambda: perf_inputs(directory, previous, options))
        ok, lines = gate_lines(entries)
        for line in lines:  # one line each, whatever a run or tensor name holds
            richout.echo(line, one_line=True)
        if not ok:
            raise typer.Exit(ExitCode.GATE_FAILED)
        if previous is None:
            return
        ok, lines = run(lambda: perfgate.lines(perfgate.compare(entries, old, allowed), allowed))
        for line in lines:
            richout.echo(line, one_line=True)
        if not ok:
            raise typer.Exit(ExitCode.REGRESSION)
