"""Where a command's outputs go: one guard for ``report --out``, ``merge -o`` and ``summary -o``.

An output that cannot go where it is asked is refused before any analysis, naming the path.
"Read-only" is the mode bits of the nearest existing folder, not ``os.access``: root passes
``os.access`` anyway, and a folder marked read-only (e.g. a shared corpus) stays untouched.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from analyzer.contract.atomic import write_atomic
from analyzer.contract.errors import BadInput, Reason


def check_out(path: Path, *, option: str, what: str, example: str = "") -> None:
    """Refuse ``path`` as the place of the output ``what`` (e.g. ``the merged trace``), given
    by ``option``. With ``example`` (a file name, e.g. ``summary.json``) ``path`` is a file and
    naming an existing folder is refused (``out_is_dir``); without, ``path`` is the folder the
    outputs go in and it, or its nearest existing parent, being a file is refused
    (``out_is_file``). Either way the nearest existing folder must not be marked read-only
    (``unwritable``). A file output that exists as anything but a regular file (a symlink, a
    device such as /dev/null, a FIFO) is refused too (``unwritable``): the write renames a new
    file over the path, which would replace what is there. Raises ``BadInput``."""
    if example and path.is_dir():
        raise BadInput(path, Reason.OUT_IS_DIR, f"{option} names an existing directory, not a file",
                       f"pass a file name, e.g. {option} {path / example}")
    if example and (kind := _not_regular(path)):
        raise BadInput(path, Reason.UNWRITABLE, f"is {kind}, not a regular file; {what} would "
                       "replace it", f"pass {option} a new file name, e.g. {option} /tmp/{example}")
    folder = path.parent if example else path
    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        if example:
            return  # the write names it: "cannot be written (Not a directory)"
        raise BadInput(existing, Reason.OUT_IS_FILE, f"is a file, not a folder ({option} names "
                       f"the folder {what} goes in)", f"pass {option} a folder")
    if not existing.stat().st_mode & 0o222:
        raise BadInput(existing, Reason.UNWRITABLE, f"is marked read-only; {what} cannot be "
                       "written there", _writable(option, example))


def default_report_dir(root: Path) -> Path:
    """``root/report``, the report folder when ``--out`` is not given. Raises ``BadInput``
    (``unwritable``) when it is a symlink or resolves outside ``root``: the report, and the
    removal of an earlier one's files, would land wherever the link points, e.g. in a folder
    of someone else's that happens to hold a ``report.md``."""
    out = root / "report"
    real_root = os.path.realpath(root)
    real_out = os.path.realpath(out)
    if out.is_symlink() or os.path.commonpath([real_root, real_out]) != real_root:
        raise BadInput(out, Reason.UNWRITABLE, f"is a symlink to {real_out}, outside the input; "
                       "the default report folder is written only inside the input",
                       "remove the link, or pass --out to the folder you want")
    return out


def write_out(path: Path, data: str | bytes, *, option: str, example: str = "") -> None:
    """``write_atomic`` (analyzer/contract/atomic.py), an ``OSError`` becoming ``BadInput``
    (``unwritable``) naming ``path``; ``option`` and ``example`` as for ``check_out``; a
    ``path`` that exists as anything but a regular file is refused unwritten, as there."""
    if kind := _not_regular(path):
        raise BadInput(path, Reason.UNWRITABLE, f"is {kind}, not a regular file; it would be "
                       "replaced", _writable(option, example))
    try:
        write_atomic(path, data)
    except OSError as exc:
        raise BadInput(path, Reason.UNWRITABLE, f"cannot be written ({exc.strerror})",
                       _writable(option, example)) from None


def _not_regular(path: Path) -> str | None:
    """What ``path`` is when it exists as anything but a regular file (a link is not
    followed), else None."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    for test, kind in ((stat.S_ISREG, None), (stat.S_ISLNK, "a symlink"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def _writable(option: str, example: str) -> str:
    if example:
        return f"pass {option} a file in a writable folder, e.g. {option} /tmp/{example}"
    return f"pass {option} to a writable folder"

