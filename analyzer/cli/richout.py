"""Rich console and table columns for the CLIs' tables, readable in narrow or piped output.

A terminal keeps its own width. Piped or redirected output (``analyzer summary DIR | less``,
``> out.txt``) has no width: rich's 80-column default cut headers to ``ste… com…``, so a
non-terminal gets ``WIDE_COLUMNS`` unless ``COLUMNS`` says otherwise. Headers break at ``_``
into words (``exposed_comm_ms`` -> ``exposed / comm / ms``, units kept) and cells fold instead of
ending in ``…``, so nothing is lost when a terminal is narrow.

Everything the CLIs print goes through here (``console``, ``echo``) and loses its C0/C1 control
characters (``clean``): a trace's kernel name, a run directory's name or a path could otherwise
carry ``ESC [ 31 m`` (or the one-byte CSI ``\x9b``) and recolour, move or retitle the user's
terminal (the "terminal escape injection" class of CVE-2021-25743 and friends). Rich markup is
off: a ``[bold]`` in a trace name is printed, not applied.
"""

from __future__ import annotations

import enum
import os
import re
import sys

from analyzer.contract.text import one_line as one_line_text, show_bidi

_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
"""C0 controls but newline, DEL, C1 controls (ECMA-48)."""


def clean(text: object, *, one_line: bool = False) -> str:
    """``str(text)`` without C0/C1 control characters (a tab becomes a space, so columns of
    words stay apart) and with bidirectional controls shown as their ``\\uXXXX`` escape
    (analyzer/contract/text.py). A newline is kept unless ``one_line``; then it is shown as
    ``\\n``, so a name holding one cannot print a line of its own (a forged ``gate: passed``)."""
    if one_line:
        return one_line_text(str(text))
    return _CONTROL.sub("", show_bidi(str(text).replace("\t", " ")))


def echo(text: object = "", *, err: bool = False, one_line: bool = False) -> None:
    """``typer.echo`` of ``clean(text, one_line=one_line)``: every plain line the CLIs print
    (``one_line``: a line built around names from the input, which must stay one line)."""
    import typer

    typer.echo(clean(text, one_line=one_line), err=err)


class Format(str, enum.Enum):
    """``--format`` of the commands that print a table or JSON."""

    table = "table"
    json = "json"


WIDE_COLUMNS = 200
"""Width of output that is not a terminal (characters)."""


def console():
    """A ``rich.console.Console`` for stdout: the terminal's width on a TTY, else ``COLUMNS``
    or ``WIDE_COLUMNS``. A closed pipe (``| head``) raises ``BrokenPipeError`` for the CLI to
    end quietly with 0 (rich's own handler exits 1)."""
    from rich.console import Console

    class _Clean(Console):
        """Strings reach the output through ``render_str`` (printed text and table cells)."""

        def render_str(self, text: str, **kwargs):
            return super().render_str(clean(text), **kwargs)

    con = _Clean(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else WIDE_COLUMNS,
                 markup=False, highlight=False, emoji=False)

    def closed() -> None:
        con.quiet = True
        raise BrokenPipeError
    con.on_broken_pipe = closed
    return con


def table(title: str):
    """A ``rich.table.Table`` drawn compactly (a rule under the header, one space between
    columns, none at the edges), so that a dozen numeric columns fit 80 characters."""
    from rich import box
    from rich.table import Table

    return Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 0))


def add_column(table, name: str, *, justify: str = "right", key: bool = False) -> None:
    """Add column ``name`` to ``table``: header broken at ``_`` into words, cells folded when too
    narrow; ``key`` columns (rank, step, kind) never wrap."""
    table.add_column(header(name), justify=justify, no_wrap=key, overflow="fold")


def header(name: str) -> str:
    """A column name as a header: words at ``_`` on lines of their own, units as written in
    the reports (``gbps`` -> ``GB/s``, ``ms`` kept)."""
    words = ["GB/s" if w == "gbps" else w for w in name.split("_")]
    return "\n".join(words)
