"""Hand the clock offsets to Perfetto: a ``perfetto_manifest`` beside the merged trace
(``analyzer merge --perfetto-manifest``, issue 30 item 4).

Perfetto's own multi-trace merge (``trace_processor util merge``, Perfetto v58.2) opens one
archive of trace files and places a clockless file (Chrome JSON: Kineto's traces) on the
timeline only from a manifest. The format, version 1, is documented at
https://perfetto.dev/docs/reference/perfetto-manifest (reader:
src/trace_processor/plugins/perfetto_manifest/perfetto_manifest_reader.cc); what we write:

    {"perfetto_manifest": {
       "version": 1,
       "files": [
         {"path": "rank0.trace.json.gz", "machine": {"name": "rank 0"}},
         {"path": "rank1.trace.json.gz", "machine": {"name": "rank 1"},
          "clocks": {"sync_to": {"file": "rank0.trace.json.gz"}, "offset_ns": -1001000}}],
       "attributes": {"paritytrace.command": "analyzer merge", "paritytrace.ref_rank": 0}}}

- ``path``: the trace's base name: ``util merge`` names each archive member after its input's
  base name, and the manifest's paths must match them (util_subcommand.cc).
- ``clocks`` without ``clock`` pins a clockless file's own timeline to the reference file's
  (``sync_to.file`` without ``clock``: that file's own timeline). ``offset_ns`` (integer ns):
  "at a common instant, the source clock reads T when the reference clock reads T +
  offset_ns" (a positive value moves the file later). ``analyzer merge`` writes a rank's event
  at ``rank time - offset`` on the reference clock (analyzer/analyses/clock.py), so the
  manifest's offset is minus the offset merge applied (0 where merge applied none: unaligned,
  ``--no-align``, an offset it could not resolve); every rank but the reference is pinned, so
  none is left for Perfetto to guess or drop.
- ``machine``: one named machine per rank, so that two ranks' equal pids (Kineto's GPU
  processes are numbered by device: every node has a pid 0) stay apart, as merge puts each rank
  in its own process.
- ``attributes``: namespaced keys (the reference rank), shown in Perfetto's metadata table.
No ``trace_time``: the files have no clock it could name.
"""

from __future__ import annotations

from pathlib import Path

import msgspec

from analyzer.contract.atomic import write_atomic
from analyzer.contract.errors import BadInput

MANIFEST_VERSION = 1
"""The manifest format version Perfetto reads (the only one, stable)."""
MANIFEST_SUFFIX = ".perfetto_manifest.json"
"""``merged.trace.json.gz`` -> ``merged.perfetto_manifest.json`` beside it."""


def beside(out: Path, suffix: str) -> Path:
    """The file of the merged trace ``out`` with ``suffix`` after its stem, in its folder
    (``merged.trace.json.gz``, ``.offsets.json`` -> ``merged.offsets.json``)."""
    ends = (".trace.json.gz", ".json.gz", ".trace.json", ".json", ".gz")
    stem = next((out.name[: -len(e)] for e in ends if out.name.endswith(e)), out.name)
    return out.with_name(stem + suffix)


def manifest_path_for(out: Path) -> Path:
    """Where the manifest of the merged trace ``out`` goes (``MANIFEST_SUFFIX``)."""
    return beside(out, MANIFEST_SUFFIX)


def check_names(traces: dict[int, Path], root: Path | str) -> None:
    """Raise ``BadInput`` (``bad_option``) when two ranks' traces share a base name: Perfetto's
    archive members are named by base name, so the manifest could not tell them apart."""
    seen: dict[str, int] = {}
    for rank, path in sorted(traces.items()):
        if path.name in seen:
            raise BadInput(root, "bad_option", f"ranks {seen[path.name]} and {rank} have traces "
                           f"of the same file name {path.name!r}: a perfetto_manifest names "
                           "files by base name (trace_processor util merge)",
                           "rename one of them, or merge without --perfetto-manifest")
        seen[path.name] = rank


def build_manifest(traces: dict[int, Path], applied_ns: dict[int, int], ref_rank: int) -> dict:
    """The manifest (a dict, module docstring) for rank -> trace file ``traces``, the offset
    ``analyzer merge`` applied to each rank (``applied_ns``, int ns: aligned time = rank time -
    offset) and the reference rank. Ranks in rank order, each once. Raises ``KeyError`` when
    a rank has no applied offset."""
    ref = traces[ref_rank].name
    files = []
    for rank in sorted(traces):
        entry: dict = {"path": traces[rank].name, "machine": {"name": f"rank {rank}"}}
        if rank != ref_rank:
            entry["clocks"] = {"sync_to": {"file": ref}, "offset_ns": -int(applied_ns[rank])}
        files.append(entry)
    return {"perfetto_manifest": {
        "version": MANIFEST_VERSION,
        "files": files,
        "attributes": {"paritytrace.command": "analyzer merge", "paritytrace.ref_rank": ref_rank},
    }}


def write_manifest(path: Path, manifest: dict) -> None:
    """Write ``manifest`` to ``path`` atomically (contract/atomic.py), its first key first:
    Perfetto finds a manifest by content, a file starting with ``{"perfetto_manifest"``.
    Raises ``OSError``."""
    write_atomic(path, msgspec.json.format(msgspec.json.encode(manifest), indent=2) + b"\n")


def util_merge_command(manifest: Path, traces: dict[int, Path], archive: Path) -> str:
    """The shell command that packs ``traces`` and ``manifest`` into ``archive`` for Perfetto
    (``trace_processor util merge``), paths quoted for a POSIX shell."""
    import shlex

    paths = " ".join(shlex.quote(str(traces[r])) for r in sorted(traces))
    return (f"trace_processor util merge -o {shlex.quote(str(archive))} --manifest "
            f"{shlex.quote(str(manifest))} {paths}")
