"""List a folder's entries without following symlinks out of it or into a loop.

Every folder walk of the analyzer (run discovery, trace discovery, merge) goes through
``entries``: a symlink is followed only when its target resolves *inside* the folder given by
the user (the walk's ``root``) and, for a folder, when the target is not the root itself or a
folder above the link (a loop). Everything else is left out and named in ``skipped`` so the
caller can say so. Walks here are one level deep; nothing recurses.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from analyzer.contract.errors import BadInput

log = logging.getLogger(__name__)


def _inside(target: Path, root: Path) -> bool:
    return target == root or root in target.parents


def entries(folder: Path, *, root: Path | None = None) -> tuple[list[Path], list[str]]:
    """Children of ``folder`` that are safe to open, sorted by name, and one line per skipped
    symlink (``"<link>: symlink to <target> outside <root>; skipped"``).

    ``root`` is the folder the user passed (default ``folder``); links must stay inside it.
    Raises ``OSError`` when ``folder`` cannot be listed, ``BadInput`` (``check_name``) for a
    child whose name is not UTF-8.
    """
    base = Path(os.path.realpath(root if root is not None else folder))
    keep: list[Path] = []
    skipped: list[str] = []
    for p in sorted(folder.iterdir()):
        check_name(p)
        why = link_skipped(p, base) if p.is_symlink() else None
        if why is None:
            keep.append(p)
        else:
            skipped.append(why)
    for line in skipped:
        log.info("%s", line)
    return keep, skipped


def link_skipped(link: Path, base: Path) -> str | None:
    """Why a walk of the folder ``base`` (resolved) does not follow the symlink ``link`` below
    it, one line (``"<link>: symlink to <target> outside <base>; skipped"``, a loop back to a
    folder above it, a broken link), or None when it follows it: the rule of every folder walk
    (``entries``; the report cache's key walk, reports/cache.py)."""
    target = Path(os.path.realpath(link))
    if not _inside(target, base):
        return f"{link}: symlink to {target} outside {base}; skipped"
    if target.is_dir() and _inside(Path(os.path.realpath(link.parent)), target):
        return f"{link}: symlink to {target} loops back to a folder above it; skipped"
    if not target.exists():
        return f"{link}: broken symlink; skipped"
    return None


def linked_folder(link: Path, root: Path) -> Path | None:
    """The folder a symlink ``link`` in ``root`` names outside it, None when it names no folder,
    ``root`` itself or a folder above it (a loop). The one way out of the folder the user gave:
    a traces root's link to a run directory (analyzer/ingest/rundirs.py ``linked_run``)."""
    real_root, target = Path(os.path.realpath(root)), Path(os.path.realpath(link))
    if not link.is_symlink() or not target.is_dir() or _inside(real_root, target):
        return None
    return target


def shown(path: Path | str) -> str:
    """``path`` as text that can be printed and written as UTF-8: bytes of a name that is not
    UTF-8 (Python keeps them as lone surrogates, PEP 383) written as ``\\xff``."""
    return os.fsencode(path).decode("utf-8", errors="backslashreplace")


def check_name(path: Path) -> None:
    """Raise ``BadInput`` (``bad_name``, the name shown with ``\\xNN`` escapes) when ``path``
    is not UTF-8: names go into report.json, Markdown and the terminal, all UTF-8, where a
    name Python holds as lone surrogates (PEP 383) cannot be written."""
    text = str(path)
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        pass
    else:
        return
    bad = Path(path)
    while bad.parent != bad and _utf8(str(bad.parent)) is False:
        bad = bad.parent  # the outermost component that is not UTF-8
    if bad == Path(path) and not os.path.isdir(path):
        raise BadInput(shown(path), "bad_name", "the file name is not valid UTF-8, so it "
                       "cannot be written in a report", "rename the file (or move it out of "
                       "the folder)") from None
    raise BadInput(shown(bad), "bad_name", "the folder name is not valid UTF-8, so it cannot "
                   "be written in a report", "rename the folder") from None


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


DATASET_MARKER = "paritytrace-tables.json"
"""The file ``analyzer report --tables-out`` writes last in its dataset (analyzer/ingest/dataset.py)."""


OUTPUT_MARKER = "paritytraceOutput"
"""First key of every JSON file the analyzer writes that a folder walk could take for a trace
(``analyzer summary --format json -o``, ``analyzer merge -o``), its value the command."""
_OUTPUT_HEAD = re.compile(rb'\A\s*\{\s*"(?:%s"\s*:\s*"(?P<cmd>[^"]{0,40})"|(?P<report>schema_version)")'
                          % OUTPUT_MARKER.encode())
_SNIFF_BYTES = 4096


def analyzer_output(path: Path) -> str | None:
    """Why ``path`` is a file the analyzer wrote, whatever its name, or None: its JSON (gzip or
    not) starts with ``OUTPUT_MARKER`` (summary -o, merge -o) or with report.json's
    ``schema_version`` key (``report --out``; Kineto writes ``schemaVersion``, never that).
    Reads at most the first 4 KiB of JSON; an unreadable file is None (the decode says why)."""
    import zlib

    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
            if head[:2] == b"\x1f\x8b":
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                head = d.decompress(head + f.read(60 * 1024), _SNIFF_BYTES)
    except (OSError, zlib.error):
        return None
    m = _OUTPUT_HEAD.match(head)
    if m is None:
        return None
    if m.group("report"):
        return "a report.json written by analyzer report"
    return f"written by {m.group('cmd').decode('ascii', 'replace')}"


def not_an_input(name: str) -> str | None:
    """Why a file named ``name`` in a trace folder is not a trace to analyse, or None.

    Hidden files (a leading dot: macOS ``._worker0.json`` resource forks, the tracer's
    ``.tmp-<pid>-rank0.trace.json.gz`` left by a killed record) and the analyzer's own outputs
    (``*.offsets.json`` merge sidecars, ``*perfetto_manifest.json`` manifests, ``merged.*`` /
    ``*.merged.*`` traces written by ``analyzer merge``) are skipped by every folder walk
    rather than failing the folder.
    """
    if name.startswith("."):
        return "hidden file (a macOS ._ file or a temporary file of a killed record)"
    if name.endswith(".offsets.json"):
        return "sidecar written by analyzer merge"
    if name.endswith("perfetto_manifest.json"):  # analyzer/timeline/perfetto.py, or Perfetto's
        return "Perfetto merge manifest (analyzer merge --perfetto-manifest)"
    if name.startswith("merged.") or ".merged." in name:
        return "merged trace written by analyzer merge"
    if name == DATASET_MARKER:
        return "the marker of a dataset written by analyzer report --tables-out"
    return None

