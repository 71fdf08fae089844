"""The per-rank map on a Dask distributed cluster (``analyzer report --scheduler ADDRESS``).

``connected(address)`` connects to a running Dask scheduler; inside it, the one ingest path's
per-rank map (analyzer/ingest/pipeline.py ``parse_files`` -> analyzer/ingest/pool.py ``run_all``)
submits one Dask task per trace instead of using local processes. Everything else -- discovery,
the per-rank tables caches the client can read, the rank rule, the checks, the cross-rank
phase -- stays in this process, which receives only each rank's small tables.

Where the traces are (the path rule): the client and every worker see the input folder at the
same absolute path (a shared filesystem: NFS, Lustre, GPFS, a bind mount of the same share).
The client discovers the traces and sends each worker a path made absolute on the client; a
worker that cannot read it says so as for a local run (``unreadable``, naming the trace). Traces
local to each host must first be put on such a share (or copied to one host). The per-rank
tables cache is written where the worker sees the trace (beside it when the folder is writable,
else the worker's ``$XDG_CACHE_HOME``), so a second run reads it back without Dask.

Failures, each one line, never a hang:

* the address is malformed or no scheduler answers within ``PARITYTRACE_DASK_TIMEOUT_S``
  (default 30): ``BadInput`` (exit 2) naming the address;
* a worker runs other analyzer code or library versions than the client (the per-rank tables
  cache key, analyzer/ingest/cachekey.py, differs): ``BadInput`` naming the worker;
* a task raising an exception other than ``BadInput`` is retried ``RETRIES`` times (an NFS
  hiccup), then ``ParityTraceError`` naming the trace;
* a worker that dies (killed, out of memory) has its trace rerun on another worker by the
  scheduler; one that kills ``distributed.scheduler.allowed-failures`` + 1 workers (default
  3 + 1) raises ``ParityTraceError`` naming it;
* no worker connected, or the scheduler unreachable, for ``PARITYTRACE_DASK_TIMEOUT_S`` while
  traces wait: ``ParityTraceError`` naming them. The waiting traces are cancelled on the way out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from analyzer.contract.errors import BadInput, ParityTraceError, Reason

RETRIES = 2
"""Reruns of a task that raised (not of a ``BadInput``, which is returned, not raised)."""
LOCAL = "local"
"""``--scheduler local``: the local process pool even when ``DASK_SCHEDULER_ADDRESS`` is set."""
_POLL_S = 0.05


def timeout_s() -> float:
    """``PARITYTRACE_DASK_TIMEOUT_S`` (default 30): the connect timeout and the longest wait
    with no worker or no scheduler. Raises ``BadInput`` for a value that is not a positive
    number."""
    raw = os.environ.get("PARITYTRACE_DASK_TIMEOUT_S", "30")
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise BadInput("PARITYTRACE_DASK_TIMEOUT_S", Reason.BAD_OPTION,
                       f"is {raw!r}, not a number of seconds > 0", "set it to e.g. 30")
    return value


def scheduler_address(option: str | None) -> str | None:
    """The scheduler to use: ``option`` (``--scheduler``), else ``$DASK_SCHEDULER_ADDRESS``;
    None (or ``local``) means the local process pool."""
    address = option if option is not None else os.environ.get("DASK_SCHEDULER_ADDRESS")
    address = (address or "").strip()
    return None if not address or address == LOCAL else address


def _fingerprint() -> str:
    """This process's per-rank tables code and library versions (the cache key of nothing)."""
    from analyzer.ingest.cachekey import cache_key
    from analyzer.ingest.pipeline import CODE_MODULES

    return cache_key("", CODE_MODULES)


def _call(fn: Callable[[Any], Any], item: Any, fingerprint: str, where: str) -> Any:
    """The task run on a worker: refuse other code, then ``fn(item)`` (``item`` a path made
    absolute on the client; the result's ``path`` set back to ``where``'s relative form)."""
    mine = _fingerprint()
    if mine != fingerprint:
        from distributed import get_worker

        raise BadInput(get_worker().address, Reason.BAD_OPTION,
                       "this Dask worker runs other analyzer code or library versions (pandas, "
                       "pyarrow, numpy, msgspec) than the client, so its tables could differ",
                       "install the same paritytrace and libraries on every worker and the "
                       "client")
    out = fn(item)
    if isinstance(item, Path) and getattr(out, "path", None) == item:
        out.path = Path(where)
    return out


@contextlib.contextmanager
def connected(address: str) -> Iterator[Callable[..., list]]:
    """Make the Dask scheduler at ``address`` the per-rank map of ``pool.run_all`` inside the
    block, connecting on the first map that has traces to parse (when every rank is cached it
    is never contacted). Yields the map (``fn``, items, keep) -> results. Raises ``BadInput``
    (exit 2) when dask.distributed is not installed, the address is malformed or no scheduler
    answers within ``timeout_s()``."""
    from analyzer.ingest import pool

    wait_s = timeout_s()
    quiet = logging.getLogger("distributed")  # its reconnect / lost-worker lines: said once by us
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    clients: list[Any] = []
    try:
        with contextlib.ExitStack() as stack:
            def run(fn: Callable[[Any], Any], items: Sequence[Any],
                    keep: Callable[[Any], Any] | None = None) -> list:
                if not items:  # every rank cached: the scheduler is never contacted
                    return []
                if not clients:
                    clients.append(stack.enter_context(_client(address, wait_s)))
                return dask_map(clients[0], address, fn, items, wait_s=wait_s, keep=keep)

            pool.push_map(run)
            try:
                yield run
            finally:
                pool.pop_map(run)
    finally:
        quiet.setLevel(level)


@contextlib.contextmanager
def _client(address: str, wait_s: float) -> Iterator[Any]:
    """A ``distributed.Client`` of ``address``, closed after the block (``connected``)."""
    try:
        import distributed
    except ImportError:
        raise BadInput(address, Reason.BAD_OPTION, "--scheduler needs dask.distributed, which "
                       "is not installed", "pip install 'paritytrace[dask]', or drop "
                       "--scheduler to use the local cores") from None
    try:
        client = distributed.Client(address, timeout=wait_s, set_as_default=False)
    except (OSError, ValueError, TypeError) as exc:  # TimeoutError is an OSError
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BadInput(address, Reason.BAD_OPTION, f"no Dask scheduler answers there ({why})",
                       "start one (`dask scheduler`) and pass its tcp://HOST:PORT, or leave "
                       "--scheduler / DASK_SCHEDULER_ADDRESS unset for the local cores"
                       ) from None

    try:
        yield client
    finally:
        with contextlib.suppress(Exception):  # closing must not hide the block's error
            client.close(timeout=min(wait_s, 5))


def dask_map(client, address: str, fn: Callable[[Any], Any], items: Sequence[Any], *,
             wait_s: float, keep: Callable[[Any], Any] | None = None) -> list:
    """``[keep(fn(x)) for x in items]`` as one Dask task per item (submitted in order: the
    caller passes the largest trace first; ``keep`` runs here on each result as it arrives,
    None: the identity), results in input order; failures as the module says."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    if not items:
        return []
    finger = _fingerprint()
    futures = {}
    for i, x in enumerate(items):
        sent = Path(os.path.abspath(x)) if isinstance(x, Path) else x
        f = client.submit(_call, fn, sent, finger, str(x), pure=False, retries=RETRIES,
                          key=f"paritytrace-rank-{i}-{os.urandom(6).hex()}")
        futures[f] = i
    out: dict[int, Any] = {}
    done_q = as_completed(list(futures), loop=client.loop)
    stalled_since: float | None = None
    next_check = 0.0
    try:
        while len(out) < len(items):
            batch = done_q.next_batch(block=False)
            for f in batch:
                i = futures[f]
                if f.status == "finished":
                    out[i] = f.result() if keep is None else keep(f.result())
                    f.release()
                    continue
                exc = f.exception() if f.status == "error" else None
                if isinstance(exc, ParityTraceError):
                    raise exc
                if isinstance(exc, KilledWorker):
                    raise ParityTraceError(
                        f"{items[i]}: the Dask workers parsing it died (killed, or out of "
                        "memory) as many times as the scheduler allows "
                        "(distributed.scheduler.allowed-failures); give the workers more "
                        "memory (dask worker --memory-limit) and rerun") from None
                if exc is not None:
                    raise ParityTraceError(f"{items[i]}: a Dask worker failed on it "
                                           f"{RETRIES + 1} times: {type(exc).__name__}: "
                                           f"{' '.join(str(exc).split())}") from exc
                raise ParityTraceError(f"{items[i]}: its Dask task was {f.status} (the "
                                       f"scheduler {address} went away?); rerun")
            if batch:
                stalled_since = None
                continue
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.5
                if _stalled(client):
                    stalled_since = stalled_since or now
                    if now - stalled_since >= wait_s:
                        left = [str(items[i]) for i in sorted(set(range(len(items))) - set(out))]
                        raise ParityTraceError(
                            f"{', '.join(left[:5])}{' ...' if len(left) > 5 else ''}: waited "
                            f"{wait_s:g} s for a Dask worker of {address} (none connected, or "
                            "the scheduler unreachable) to parse "
                            f"{'it' if len(left) == 1 else f'these {len(left)} traces'}; start "
                            f"workers (dask worker {address}) and rerun")
                else:
                    stalled_since = None
            time.sleep(_POLL_S)
    finally:
        if len(out) < len(items):
            with contextlib.suppress(Exception):
                client.cancel([f for f, i in futures.items() if i not in out])
    return [out[i] for i in range(len(items))]


def _stalled(client) -> bool:
    """True when nothing can run: the client is not connected, or no worker is."""
    if client.status != "running":
        return True
    try:
        return not client.scheduler_info(n_workers=-1).get("workers")
    except TypeError:  # an older distributed without n_workers
        return not client.scheduler_info().get("workers")
    except OSError:
        return True
