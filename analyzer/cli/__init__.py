"""The ``analyzer`` command line (analyzer/cli/app.py): one thin module per command family."""

from pathlib import Path


def input_path(value: str) -> Path:
    """A path argument or option as typed: an empty one is a usage error, not the current
    folder (``Path("")`` is ``.``). typer ``parser=`` of every command's path arguments and
    options (inputs and outputs)."""
    if not str(value).strip():
        import typer

        raise typer.BadParameter("an empty path; give a folder or file")
    return Path(value)
