"""The per-rank map on a Dask distributed cluster (``analyzer report --scheduler ADDRESS``).

``connected(address)`` connects to a running Dask scheduler; inside it, the one ingest path's
per-rank map (analyzer/ingest/pipeline.py ``parse_files`` -> analyzer/ingest/pool.py ``run_all``)
submits one Dask task per trace instead of using local processes. Everything else -- discovery,
the per-rank tables caches the client can read, the rank rule, the checks, the cross-rank
phase -- stays in this process, which receives only each rank's small tables.

Where the traces are (the path rule): when the client sees the input, the client and every
worker see it at the same absolute path (a shared filesystem: NFS, Lustre, GPFS, a bind mount
of the same share). The client discovers the traces and sends each worker a path made absolute
on the client; a worker that cannot read it says so as for a local run (``unreadable``, naming
the trace). When the client does not see the input, the traces are local to worker hosts: the
workers list them and each is parsed on a host that holds it (analyzer/ingest/hostlocal.py
states that rule; ``pinned`` sends a trace only to its hosts). The per-rank tables cache is
written in the worker's ``$XDG_CACHE_HOME``, under the trace's path as the worker sees it, so a
second run from a client of the same home (same path, same cache key) reads it back without
Dask.

Failures, each one line, never a hang:

* the address is malformed or no scheduler answers within ``PARITYTRACE_DASK_TIMEOUT_S``
  (analyzer/contract/settings.py): ``BadInput`` (exit 2) naming the address;
* a worker runs other analyzer code or library versions than the client (the per-rank tables
  cache key, analyzer/ingest/cachekey.py, differs): ``BadInput`` naming the worker;
* a task raising an exception other than ``BadInput`` is retried ``RETRIES`` times on its
  worker (an NFS hiccup), then ``ParityTraceError`` naming the trace; tasks return their
  results and errors as data (analyzer/ingest/daskwire.py), never a pickle: what the cluster
  sends that is not such data, or is off its schema, is ``ParityTraceError`` naming the trace,
  and none of it runs here;
* a finished result not fetched within ``PARITYTRACE_DASK_TIMEOUT_S`` (the workers holding it
  gone, none to compute it again): ``ParityTraceError`` naming the trace;
* a worker that dies (killed, out of memory) has its trace rerun on another worker by the
  scheduler; one that kills ``distributed.scheduler.allowed-failures`` + 1 workers (default
  3 + 1) raises ``ParityTraceError`` naming it;
* no worker connected, or the scheduler unreachable, for ``PARITYTRACE_DASK_TIMEOUT_S`` while
  traces wait: ``ParityTraceError`` naming them; likewise for traces pinned to hosts where no
  worker is connected, naming the hosts. The waiting traces are cancelled on the way out.

A ``tcp://`` scheduler that is not on loopback is warned of once (``warn_if_open``): Dask
has no authentication by default, so the cluster's network is the trust boundary.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from analyzer.contract import settings
from analyzer.contract.errors import BadInput, ParityTraceError, Reason

log = logging.getLogger(__name__)

RETRIES = 2
"""Reruns of a task that raised (not of a ``BadInput``, which is returned, not raised)."""
LOCAL = "local"
"""``--scheduler local``: the local process pool even when ``DASK_SCHEDULER_ADDRESS`` is set."""
_POLL_S = 0.05


def scheduler_address(option: str | None) -> str | None:
    """The scheduler to use: ``option`` (``--scheduler``), else ``$DASK_SCHEDULER_ADDRESS``;
    None (or ``local``) means the local process pool. Raises ``BadInput`` for a port out of
    1..65535 (said at once, not after a connect timeout)."""
    from urllib.parse import urlsplit

    address = option if option is not None else settings.dask_scheduler_address()
    address = (address or "").strip()
    if not address or address == LOCAL:
        return None
    try:
        port = urlsplit(address if "://" in address else f"tcp://{address}").port
    except ValueError:
        port = 0
    if port is not None and not 0 < port < 65536:
        raise BadInput(address, Reason.BAD_OPTION, "is not a scheduler address (its port is "
                       "not 1-65535)", "pass the tcp://HOST:PORT `dask scheduler` prints as "
                       "'Scheduler at'")
    return address


_WARNED: set[str] = set()


def warn_if_open(address: str) -> bool:
    """Say once per process, as a warning, that ``address`` is reached without TLS on a
    non-loopback interface: Dask has no authentication by default, so whoever reaches that
    network can join as a worker (what it sends back is only ever decoded as data,
    analyzer/ingest/daskwire.py). Returns True when it warned."""
    import ipaddress
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else f"tcp://{address}")
    if parts.scheme not in ("tcp", "ws") or address in _WARNED:
        return False
    host = (parts.hostname or "").lower()
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return False
    _WARNED.add(address)
    log.warning("warning: --scheduler %s is not loopback and not tls://: anyone who reaches "
                "that network can join the cluster (README 'Beyond one machine': TLS with "
                "client certificates, or a private network)", address)
    return True


def _quiet_distributed() -> list[tuple[logging.Logger, int]]:
    """Silence dask.distributed's own loggers (``distributed``, ``distributed.client`` ... each
    has its level and handler): their reconnect, lost-worker and rescheduling lines are said
    once, in our words. Returns what to restore."""
    names = ["distributed"] + [n for n in logging.Logger.manager.loggerDict
                               if n.startswith("distributed.")]
    saved = [(lg, lg.level) for lg in map(logging.getLogger, names)]
    for lg, _ in saved:
        lg.setLevel(logging.CRITICAL + 1)
    return saved


def fingerprint() -> str:
    """This process's per-rank tables code and library versions (the cache key of nothing)."""
    from analyzer.ingest.cachekey import cache_key
    from analyzer.ingest.tablecache import CODE_MODULES

    return cache_key("", CODE_MODULES)


def _call(fn: Callable[[Any], Any], item: Any, expected: str, where: str) -> bytes:
    """The task run on a worker: refuse other code, then ``fn(item)`` (``item`` a path made
    absolute on the client; the result's ``path`` set back to ``where``'s relative form),
    retried ``RETRIES`` times when it raises. Returns ``daskwire.encode`` bytes: the result,
    a ``BadInput`` or the failure, as data (analyzer/ingest/daskwire.py)."""
    from analyzer.ingest import daskwire

    if fingerprint() != expected:
        from distributed import get_worker

        return daskwire.encode(BadInput(
            get_worker().address, Reason.BAD_OPTION, "this Dask worker runs other analyzer "
            "code or library versions (pandas, pyarrow, numpy, msgspec) than the client, so "
            "its tables could differ", "install the same paritytrace and libraries on every "
            "worker and the client"))
    for attempt in range(RETRIES + 1):
        try:
            out = fn(item)
            break
        except ParityTraceError as exc:
            return daskwire.encode(exc if isinstance(exc, BadInput) else
                                   daskwire.failed(" ".join(str(exc).split())))
        except Exception as exc:  # an NFS hiccup: run it again; the last one is said
            why = f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
    else:
        return daskwire.encode(daskwire.failed(f"{where}: a Dask worker failed on it "
                                               f"{RETRIES + 1} times: {why}"))
    if isinstance(item, Path) and getattr(out, "path", None) == item:
        out.path = Path(where)
    return daskwire.encode(out)


@contextlib.contextmanager
def connected(address: str) -> Iterator[Callable[..., list]]:
    """Make the Dask scheduler at ``address`` the per-rank map of ``pool.run_all`` inside the
    block, connecting on the first map that has traces to parse (when every rank is cached it
    is never contacted). Yields the map (``fn``, items, keep) -> results, whose ``client()``
    connects now and returns the ``distributed.Client``. Raises ``BadInput``
    (exit 2) when dask.distributed is not installed, the address is malformed or no scheduler
    answers within ``PARITYTRACE_DASK_TIMEOUT_S``."""
    from analyzer.ingest import pool

    wait_s = settings.dask_timeout_s()
    warn_if_open(address)
    saved = _quiet_distributed()
    clients: list[Any] = []
    try:
        with contextlib.ExitStack() as stack:
            def client() -> Any:
                if not clients:
                    clients.append(stack.enter_context(_client(address, wait_s)))
                return clients[0]

            def run(fn: Callable[[Any], Any], items: Sequence[Any],
                    keep: Callable[[Any], Any] | None = None) -> list:
                if not items:  # every rank cached: the scheduler is never contacted
                    return []
                return dask_map(client(), address, fn, items, wait_s=wait_s, keep=keep)

            run.client = client  # type: ignore[attr-defined]  # hostlocal.py lists with it

            pool.push_map(run)
            try:
                yield run
            finally:
                pool.pop_map(run)
    finally:
        for lg, level in saved:
            lg.setLevel(level)


@contextlib.contextmanager
def _client(address: str, wait_s: float) -> Iterator[Any]:
    """A ``distributed.Client`` of ``address``, closed after the block (``connected``)."""
    try:
        import distributed
    except ImportError:
        raise BadInput(address, Reason.BAD_OPTION, "--scheduler needs dask.distributed, which "
                       "is not installed", "pip install 'paritytrace[dask]', or drop "
                       "--scheduler to use the local cores") from None
    from distributed.utils import LoopRunner

    from analyzer.ingest import daskwire

    saved = _quiet_distributed()  # now that its modules made their loggers
    made: dict[str, Any] = {}
    # the client's own event loop, guarded before the first byte is read on it: what the
    # cluster sends is decoded as data, nothing unpickled (analyzer/ingest/daskwire.py)
    runner = LoopRunner()
    runner.start()
    # what distributed leaves on it when interrupted (a gather cancelled by Ctrl-C / SIGTERM:
    # "Task exception was never retrieved ... AllExit") is not ours to print: debug only
    runner.loop.asyncio_loop.set_exception_handler(
        lambda _loop, context: log.debug("dask client loop: %s", context.get("message")))
    guard = contextlib.ExitStack()

    def make() -> None:
        try:
            guard.enter_context(daskwire.guarded(runner.loop))
            made["client"] = distributed.Client(
                address, timeout=wait_s, set_as_default=False, loop=runner.loop,
                direct_to_workers=False, deserializers=["msgpack", "dask"])
        except BaseException as exc:  # said below, in the caller's thread
            made["error"] = exc

    def stop() -> None:
        with contextlib.suppress(Exception):
            runner.stop()
        guard.close()  # after the loop ended: nothing more is read on it
        for lg, level in saved:
            lg.setLevel(level)

    # in a thread with a deadline: Dask's timeout does not cover the handshake, so a server
    # that is not a scheduler (the dashboard's HTTP port) would be waited on forever, and one
    # that speaks first (an SSH banner) is read as a frame length
    maker = threading.Thread(target=make, name="paritytrace-dask-connect", daemon=True)
    maker.start()
    maker.join(wait_s + 5)
    if "client" not in made:
        stop()
        exc = made.get("error")
        if isinstance(exc, KeyboardInterrupt):
            raise exc
        why = "no Dask handshake within {:g} s: the dashboard's port (8787) or another " \
            "service?".format(wait_s + 5) if exc is None else \
            "what it sent is not Dask's protocol" if isinstance(exc, MemoryError) else \
            (" ".join(str(exc).split()) or type(exc).__name__)[:200]
        raise BadInput(address, Reason.BAD_OPTION, f"no Dask scheduler answers there ({why})",
                       "start one (`dask scheduler`) and pass the tcp://HOST:PORT it prints as "
                       "'Scheduler at', or leave --scheduler / DASK_SCHEDULER_ADDRESS unset for "
                       "the local cores")
    client = made["client"]
    for topic in ("print", "warn"):  # a worker's prints and warnings: not on our stderr
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(topic)

    try:
        yield client
    finally:
        with contextlib.suppress(Exception):  # closing must not hide the block's error
            client.close(timeout=min(wait_s, 5))
        stop()


def dask_map(client, address: str, fn: Callable[[Any], Any], items: Sequence[Any], *,
             wait_s: float, keep: Callable[[Any], Any] | None = None) -> list:
    """``[keep(fn(x)) for x in items]`` as one Dask task per item (submitted in order: the
    caller passes the largest trace first; ``keep`` runs here on each result as it arrives,
    None: the identity), results in input order; failures as the module says."""
    from distributed import as_completed

    if not items:
        return []
    finger = fingerprint()
    futures = {}
    for i, x in enumerate(items):
        sent = Path(os.path.abspath(x)) if isinstance(x, Path) else x
        hosts = _PINS.get(str(sent))  # a trace only these hosts hold (hostlocal.py)
        f = client.submit(_call, fn, sent, finger, str(x), pure=False,
                          key=f"paritytrace-rank-{i}-{os.urandom(6).hex()}",
                          workers=hosts, allow_other_workers=False if hosts else None)
        futures[f] = i
    out: dict[int, Any] = {}
    done_q = as_completed(list(futures), loop=client.loop)
    stalled_since: float | None = None
    orphaned_since: float | None = None
    next_check = 0.0
    try:
        while len(out) < len(items):
            batch = done_q.next_batch(block=False)
            for f in batch:
                i = futures[f]
                if f.status == "finished":
                    got = fetch(client, f, items[i], address, wait_s)
                    if got is None:  # lost with its worker, computed again: wait for it
                        done_q.add(f)
                        continue
                    out[i] = got if keep is None else keep(got)
                    f.release()
                    continue
                if f.status == "error":
                    raise _task_error(items[i], address, f)
                raise ParityTraceError(f"{items[i]}: its Dask task was {f.status} (the "
                                       f"scheduler {address} went away?); rerun")
            if batch:
                stalled_since = None
                continue
            now = time.monotonic()
            if now >= next_check:
                next_check = now + 0.5
                left = [i for i in range(len(items)) if i not in out]
                orphans = _orphans(client, [items[i] for i in left])
                orphaned_since = (orphaned_since or now) if orphans else None
                if orphaned_since is not None and now - orphaned_since >= wait_s:
                    raise ParityTraceError(
                        f"{', '.join(map(str, orphans[:5]))}{' ...' if len(orphans) > 5 else ''}"
                        f": waited {wait_s:g} s for a Dask worker on the host(s) that hold "
                        f"{'it' if len(orphans) == 1 else 'these traces'} "
                        f"({', '.join(sorted({h for o in orphans for h in _PINS.get(str(o), [])}))}), "
                        f"none connected to {address}; restart the worker(s) there and rerun")
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


def fetch(client, f, item: Any, address: str, wait_s: float) -> Any:
    """The decoded result of the finished future ``f`` (``daskwire.decode``), waiting at most
    ``wait_s``; None when it was lost meanwhile and is being computed again. Raises
    ``ParityTraceError`` naming ``item`` when it cannot be fetched in time (the workers
    holding it left, none connected) or for a result this client refuses."""
    from analyzer.ingest import daskwire

    try:
        data = f.result(timeout=wait_s)
    except TimeoutError:
        if f.status in ("pending", "lost") and not _stalled(client):
            return None
        raise ParityTraceError(
            f"{item}: waited {wait_s:g} s to fetch its tables from the Dask cluster "
            f"{address} (the worker holding them left, and no other has them); start "
            "workers and rerun") from None
    except Exception:  # an error the task turned into meanwhile
        raise _task_error(item, address, f) from None
    try:
        got = daskwire.decode(data)
    except daskwire.Refused as exc:
        raise ParityTraceError(_refused(item, address, str(exc))) from None
    if isinstance(got, daskwire._Failed):
        raise ParityTraceError(got.error)
    return got


def _refused(item: Any, address: str, what: str) -> str:
    return (f"{item}: refused what the Dask cluster {address} sent back for it ({what}): "
            "this client decodes data only, never a pickle; run the same paritytrace on "
            "every worker, and keep the cluster private (TLS with client certificates, or a "
            "private network: README 'Beyond one machine')")


def _task_error(item: Any, address: str, f) -> ParityTraceError:
    """The error of the erred future ``f``, from what the scheduler sent, never unpickled:
    our tasks return their errors as data, so a task error is the scheduler's KilledWorker
    (recognised by the class its pickle names, analyzer/ingest/daskwire.py
    ``pickled_class``) or something this client refuses."""
    from analyzer.ingest import daskwire

    exc = f._state.exception  # set_error's: clean_exception left the refused pickle as bytes
    raw = exc.args[0] if isinstance(exc, Exception) and exc.args else None
    name = daskwire.pickled_class(raw) if isinstance(raw, bytes | bytearray) else None
    if name == "distributed.scheduler.KilledWorker":
        return ParityTraceError(
            f"{item}: the Dask workers parsing it died (killed, or out of memory) as many "
            "times as the scheduler allows (distributed.scheduler.allowed-failures); give the "
            "workers more memory (dask worker --memory-limit) and rerun")
    if isinstance(exc, daskwire.Refused):
        return ParityTraceError(_refused(item, address, f"an error that is {exc}"))
    return ParityTraceError(
        f"{item}: its Dask task failed on a worker of {address} with an error sent as a pickle "
        f"({name or 'unreadable'}), which this client does not load; run the same paritytrace "
        "and libraries on every worker (one without them cannot load the task) and rerun")


_PINS: dict[str, list[str]] = {}
"""Trace (absolute path) -> the hosts whose workers may parse it: traces local to worker
hosts (analyzer/ingest/hostlocal.py); a trace not here goes to any worker."""


@contextlib.contextmanager
def pinned(pins: dict[str, list[str]]) -> Iterator[None]:
    """Send each trace of ``pins`` only to workers on its hosts inside the block."""
    _PINS.update(pins)
    try:
        yield
    finally:
        for k in pins:
            _PINS.pop(k, None)


def _orphans(client, items: Sequence[Any]) -> list[Any]:
    """The pinned ``items`` none of whose hosts has a worker connected now."""
    key = {id(x): str(Path(os.path.abspath(x))) if isinstance(x, Path) else str(x) for x in items}
    pinned_items = [x for x in items if key[id(x)] in _PINS]
    if not pinned_items:
        return []
    try:
        alive = {worker_host(a) for a in client.scheduler_info(n_workers=-1).get("workers", {})}
    except TypeError:  # an older distributed without n_workers
        alive = {worker_host(a) for a in client.scheduler_info().get("workers", {})}
    except OSError:
        return []  # the scheduler is gone: _stalled says so
    return [x for x in pinned_items if not alive & set(_PINS[key[id(x)]])]


def worker_host(address: str) -> str:
    """The host of a worker address (``tcp://10.0.0.5:40123`` -> ``10.0.0.5``): what Dask's
    ``workers=`` restriction takes for "any worker on that host"."""
    from urllib.parse import urlsplit

    return urlsplit(address).hostname or address


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
