"""Traces local to each Dask worker host: a job whose folder the client does not see.

A multi-node job often writes each rank's trace on its own host (local NVMe, ``/tmp``). With
``--scheduler``, when the input path does not exist on the client, the rule is:

1. The path must be absolute (a relative one means nothing on another host) and name one
   folder of foreign traces, or one trace file, at that same path on the hosts that hold it.
   A run directory (``manifest.json``) is refused: its parity needs its numerics on the
   client; put it on a shared path.
2. Every connected worker runs the local discovery (analyzer/ingest/rundirs.py ``discover``)
   on that path on its own host and sends back the traces it lists (path, size, mtime). A host
   without the path lists nothing; a worker with other code is refused as for any task.
3. The job is the union of the hosts' traces, in name order; each trace is parsed only by a
   worker on a host that listed it (Dask's ``workers=`` restriction by host, so a restarted
   worker on that host still qualifies; ``cluster.pinned``). The same path listed by several
   hosts is one file when size and mtime agree (a share some hosts mount), parsed on any of
   them; when they differ the job is refused naming the hosts (give the files distinct names).
4. Ranks come from the traces as always (the rank rule, analyzer/ingest/pipeline.py); the
   report needs ``--out`` (there is no input folder on the client to write beside) and is not
   cached; the per-rank tables caches are the workers', in each host's user cache.
A host whose workers all leave while its traces wait: ``ParityTraceError`` naming the traces
and the host after ``PARITYTRACE_DASK_TIMEOUT_S`` (analyzer/ingest/cluster.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from analyzer.contract import settings
from analyzer.contract.errors import BadInput, ParityTraceError, Reason


def client_sees(path: Path) -> bool:
    """True when ``path`` exists on this machine (the client)."""
    return path.exists()


def list_here(root: str, expected: str) -> bytes:
    """Run on a worker: the traces this host holds at ``root`` (module docstring, item 2),
    as ``daskwire.encode`` bytes of {"traces": [[path, size, mtime_ns], ...], "notes": [...]},
    {"missing": True}, or {"error": one line}."""
    from analyzer.ingest import daskwire

    return daskwire.encode(_listing(root, expected))


def _listing(root: str, expected: str) -> dict[str, Any]:
    from analyzer.ingest import cluster, rundirs

    if cluster.fingerprint() != expected:
        return {"error": "this Dask worker runs other analyzer code or library versions "
                         "(pandas, pyarrow, numpy, msgspec) than the client"}
    path = Path(root)
    if not path.exists():
        return {"missing": True}
    try:
        found = rundirs.discover(path)
        if found.layout == "foreign" and len(found.runs) == 1:
            stats = [t.stat() for t in found.runs[0].traces]
    except BadInput as exc:
        return {"error": exc.one_line()}
    except OSError as exc:
        return {"error": f"{root}: cannot list it ({exc})"}
    if found.layout != "foreign" or len(found.runs) != 1:
        return {"error": f"{root}: is a run directory or a traces root on this host; parity "
                         "needs its numerics on the client: put it on a path the client "
                         "sees (a shared filesystem)"}
    run = found.runs[0]
    return {"traces": [[str(t), st.st_size, st.st_mtime_ns] for t, st in zip(run.traces, stats)],
            "notes": list(run.notes)}


class _Listing(msgspec.Struct, forbid_unknown_fields=True):
    """A worker's answer, as ``list_here`` makes it (checked on the client)."""

    traces: list[tuple[str, int, int]] = []
    notes: list[str] = []
    missing: bool = False
    error: str | None = None


def read_answer(answer: Any) -> dict[str, Any]:
    """A worker's ``Client.run`` answer to ``list_here``, decoded and checked
    (analyzer/ingest/daskwire.py): the listing, or {"error": one line}."""
    from analyzer.ingest import daskwire

    if isinstance(answer, BaseException) and not isinstance(answer, daskwire.Refused):
        # a worker that failed to answer
        text = " ".join(str(answer).split()) if not isinstance(
            answer.args[0] if answer.args else None, bytes | bytearray) else \
            "its error is a pickle, which this client does not load"
        return {"error": f"{type(answer).__name__}: {text}"[:300]}
    try:
        listing = msgspec.convert(daskwire.decode(answer), _Listing)
    except (daskwire.Refused, msgspec.ValidationError) as exc:
        return {"error": f"refused its answer ({' '.join(str(exc).split())})"[:300]}
    if listing.error is not None:
        return {"error": listing.error}
    if listing.missing:
        return {"missing": True}
    return {"traces": [list(t) for t in listing.traces], "notes": listing.notes}


def merge_listings(root: Path, listings: dict[str, dict[str, Any]]
                   ) -> tuple[list[Path], dict[str, list[str]], list[str]]:
    """The job from every worker's ``list_here`` answer (worker address -> answer): (traces
    in name order, trace -> the hosts that hold it, notes). Raises ``BadInput`` naming the
    worker when one answers an error, the hosts when one path holds different files on them,
    and ``root`` when no worker holds it."""
    from analyzer.ingest.cluster import worker_host

    seen: dict[str, dict[tuple[int, int], list[str]]] = {}
    notes: list[str] = []
    for address, answer in sorted(listings.items()):
        if "error" in answer:
            raise BadInput(address, Reason.BAD_OPTION, f"Dask worker listing {root}: "
                           f"{answer['error']}", "fix it on that host, or stop that worker")
        host = worker_host(address)
        for path, size, mtime in answer.get("traces", []):
            hosts = seen.setdefault(path, {}).setdefault((int(size), int(mtime)), [])
            if host not in hosts:
                hosts.append(host)
        notes += [n for n in answer.get("notes", []) if n not in notes]
    for path, versions in sorted(seen.items()):
        if len(versions) > 1:
            where = "; ".join(f"{s:,} bytes on {', '.join(h)}" for (s, _), h in
                              sorted(versions.items()))
            raise BadInput(path, "mixed_jobs", f"this path holds different files on different "
                           f"worker hosts ({where})", "give each host's traces distinct names "
                           "(e.g. rank<N>.json), or keep one job per folder")
    if not seen:
        raise BadInput(root, "missing", "no such folder on this machine, and no Dask worker "
                       f"holds traces there ({len(listings)} worker(s) asked)",
                       "check the path; workers must be running on the hosts that hold it")
    pins = {p: next(iter(v.values())) for p, v in seen.items()}
    return [Path(p) for p in sorted(seen, key=lambda p: (Path(p).name, p))], pins, notes


@contextlib.contextmanager
def remote_job(root: Path, dask_map) -> Iterator[None]:
    """Inside the block, ``rundirs.discover(root)`` is the job the workers hold at ``root``
    and each of its traces goes only to workers on its hosts. ``dask_map``: what
    ``cluster.connected`` yields. Raises ``BadInput`` (exit 2) for a relative path, a
    listing that fails (module docstring), and when no worker connects within
    ``settings.dask_timeout_s()`` (``ParityTraceError``, exit 1)."""
    from analyzer.ingest import cluster, rundirs

    if not root.is_absolute():
        raise BadInput(root, "missing", "no such file or folder here, and a relative path "
                       "cannot name a folder on the Dask workers' hosts",
                       "give the absolute path the workers see")
    client = dask_map.client()
    try:
        client.wait_for_workers(1, timeout=settings.dask_timeout_s())
    except (TimeoutError, OSError):
        raise ParityTraceError(f"{root}: waited {settings.dask_timeout_s():g} s for a Dask worker "
                               "to list the traces (none connected); start workers on the "
                               "hosts that hold them and rerun") from None
    try:
        listings = client.run(list_here, str(root), cluster.fingerprint(), on_error="return",
                              callback_timeout=settings.dask_timeout_s())
    except TimeoutError:
        raise ParityTraceError(f"{root}: waited {settings.dask_timeout_s():g} s for the Dask workers "
                               "to list the traces (one stuck, or gone); rerun") from None
    listings = {w: read_answer(a) for w, a in listings.items()}
    traces, pins, notes = merge_listings(root, listings)
    found = rundirs.Discovery(root=root, layout="foreign", runs=[rundirs.RunDir(
        path=root, name=root.name, manifest=None, traces=traces, notes=notes)])
    with rundirs.elsewhere(found), cluster.pinned(pins):
        yield
