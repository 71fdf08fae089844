"""Rich console and table columns for the CLIs' tables, readable in narrow or piped output.

A terminal keeps its own width. Piped or redirected output (``analyzer summary DIR | less``,
``> out.txt``) has no width: rich's 80-column default cut headers to ``ste… com…``, so a
non-terminal gets ``WIDE_COLUMNS`` unless ``COLUMNS`` says otherwise. Headers break at ``_``
into words (``exposed_comm_ms`` -> ``exposed / comm / ms``, units kept) and cells fold instead of
ending in ``…``, so nothing is lost when a terminal is narrow.
"""

from __future__ import annotations

import enum
import os
import sys


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

    con = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else WIDE_COLUMNS)

    def closed() -> None:
        con.quiet = True
        raise BrokenPipeError
    con.on_broken_pipe = closed
    return con


def add_column(table, name: str, *, justify: str = "right", key: bool = False) -> None:
    """Add column ``name`` to ``table``: header broken at ``_`` into words, cells folded when too
    narrow; ``key`` columns (rank, step, kind) never wrap."""
    table.add_column(name.replace("_", "\n"), justify=justify, no_wrap=key,
                     overflow="fold")
