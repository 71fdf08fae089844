"""Command-line values of str, float and Path parameters without pydantic.

typer (0.2x) coerces every parameter that is not a bool flag through a pydantic
``TypeAdapter``: importing pydantic and building the adapters of one command costs about
0.1 s, a tenth of a whole ``analyzer report`` whose tables are cached. ``Command`` and
``Group`` give the plain cases their value directly, exactly as typer's adapters would:

- ``str``: the text itself (typer: ``str(value)``);
- ``float`` without min/max/clamp: ``float(text)`` for a plain decimal (``1``, ``-0.5``,
  ``1e-3``, ``.5``, ``2.``), which pydantic parses to the same double (both round correctly);
- a ``pathlib.Path`` type: ``Path(text)`` (what pydantic builds), then typer's own
  ``coerce_cli_path`` for its exists/file/dir/resolve rules;
- any of these and ``bool`` left unset (``None``, e.g. ``--help``): ``None``, as typer's
  ``RuntimeParam.coerce`` answers before it looks at the type (a given bool flag is never
  coerced by typer).

Anything else (``inf``, an Enum, an int with ``min=``, a value that is not text, another
typer without these internals) goes through typer's own coercion, so results and error
messages stay typer's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.core import TyperCommand, TyperGroup

try:  # typer's coercion layer (0.2x); older typer uses click types and needs none of this
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
except ImportError:  # pragma: no cover - depends on the installed typer
    RuntimeParam = None

_DECIMAL = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _PlainParam(RuntimeParam):
        """Coercion of one str / float / Path / bool parameter; typer's own for other values."""

        descriptor: Any

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            ann = self.annotation
            if isinstance(value, str):
                if ann is str:
                    return value
                if ann is float:
                    if len(value) <= 64 and _DECIMAL.fullmatch(value):
                        return float(value)
                elif ann is not bool:  # a Path type (``_plain`` let nothing else in)
                    return coerce_cli_path(ann(value), self.parameter_info, path_type=ann,
                                           param=param, ctx=ctx)
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


def _plain(param: Any) -> bool:
    """Whether ``param`` is a single str, bool, unconstrained float or Path parameter whose
    coercion typer has not built yet."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or getattr(param, "_runtime_param", False) is not None:
        return False
    info = desc.parameter_info
    if (param.nargs != 1 or param.multiple or desc.file_annotation is not None
            or getattr(info, "parser", None) is not None):
        return False
    ann = desc.annotation
    if ann is str or ann is bool:
        return True
    if ann is float:
        return info.min is None and info.max is None and not info.clamp
    return (isinstance(ann, type) and issubclass(ann, Path)
            and getattr(info, "path_type", None) in (None, ann))


class _Plain:
    """Mixin of ``Command`` and ``Group``: plain parameters get ``_PlainParam`` before parsing."""

    def parse_args(self, ctx, args):
        if RuntimeParam is not None:
            for p in self.get_params(ctx):  # with the --help option click adds
                if _plain(p):
                    d = p.type_descriptor
                    try:
                        p._runtime_param = _PlainParam(parameter_info=d.parameter_info,
                                                       annotation=d.annotation, descriptor=d)
                    except TypeError:  # another typer's RuntimeParam: keep typer's coercion
                        continue
        return super().parse_args(ctx, args)


class Command(_Plain, TyperCommand):
    """A typer command whose plain parameters skip pydantic (module docstring)."""


class Group(_Plain, TyperGroup):
    """A typer group (the ``analyzer`` app and its options) whose plain parameters skip
    pydantic (module docstring)."""
