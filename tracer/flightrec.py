"""PyTorch's Flight Recorder in a record: enable it, dump it as JSON when a record fails.

The Flight Recorder (FR) keeps, per rank, a ring buffer of the last collectives each process
group enqueued: process group, ``collective_seq_id``, kind (``profiling_name``), sizes, dtypes,
state, plus ``pg_status`` (last enqueued / started / completed sequence number per group). Its
JSON dump (``torch._C._distributed_c10d._dump_fr_trace_json``) is the schema
``torch/distributed/flight_recorder/fr_trace.py`` reads. Never the pickle dump.

What torch 2.13 records (tested, CPU build): NCCL (``ProcessGroupNCCL``) and gloo
(``ProcessGroupGloo``) both record into the one FR buffer. For gloo the entries' ``state`` stays
``scheduled`` and ``time_discovered_*`` 0 (no started/completed tracking per entry); completion
is in ``pg_status`` (``last_completed_collective``, which counts a collective that failed, e.g.
timed out, as completed); ``pg_config`` holds no group membership (one entry named ""), so
``dump`` adds each group's ranks from ``torch.distributed`` (``supplement_pg_config``). gloo
records no send / recv (``ProcessGroupGloo::enqueue``, where it records, is collective-only),
yet its ``pg_status`` and entries' ``op_id`` count them (its ``seq_``): after all_reduce, 10
sends, all_reduce, the second all_reduce is ``collective_seq_id`` 2, ``op_id`` 12, and
``pg_status`` says 12 (fixtures/flightrec/build_gloo_p2p_hang.py). So a gloo pp hang's dumps
hold nothing of the send / recv it hung in (fixtures/flightrec/gloo_pp_hang).

Dumps are written to ``rank<r>.flightrec.json`` in the run dir (``FLIGHTREC_NAME``), a name
the contract lists as the tracer's (``schemas.RUN_FILE``), so a re-record removes them; they
exist only in run dirs whose record failed (no manifest).

When: a rank whose record fails dumps before it exits (``tracer.worker.worker_main``); with
``tracer record``'s own launcher, every rank still alive is asked for a dump before it is
stopped (``tracer.launch``): ``DumpListener`` is a thread blocked on a pipe from the launcher,
so it answers while the main thread waits in a collective or in Python code (not while a C
call holds the GIL: then the launcher's wait ends at its deadline and the rank has no dump).
Under torchrun no process can ask a peer, so only the ranks that fail write dumps.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

from analyzer.contract.atomic import write_atomic
from analyzer.contract.schemas import flightrec_name

log = logging.getLogger(__name__)

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
NCCL_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
BUFFER_ENTRIES = 2000
"""Entries the ring buffer keeps when the user set no size (torch's documented example size;
each entry is a few hundred bytes of host memory)."""
REQUEST_ENV = "PARITYTRACE_FR_FD"
"""Spawned workers: the inherited fd on which the launcher asks for a dump (one byte)."""
LISTENING_SUFFIX = ".flightrec.listening"
"""``rank<r>`` + this in the launcher's control folder: the rank's ``DumpListener`` runs."""
DONE_SUFFIX = ".flightrec.done"
"""``rank<r>`` + this in the launcher's control folder: the rank answered a dump request (the
file holds "ok" or why there is no dump)."""


def enable() -> None:
    """Turn the Flight Recorder on for the process groups created after this call (torch reads
    the size when the first group starts recording): ``TORCH_FR_BUFFER_SIZE`` =
    ``BUFFER_ENTRIES`` unless the user set it or the NCCL-specific name (their size is kept,
    0 included, which turns it off)."""
    if BUFFER_ENV not in os.environ and NCCL_BUFFER_ENV not in os.environ:
        os.environ[BUFFER_ENV] = str(BUFFER_ENTRIES)


def dump_api():
    """torch's JSON dump function, or None when the installed torch has none:
    ``_dump_fr_trace_json`` (every backend that records, torch >= 2.7), else the older
    NCCL-only ``_dump_nccl_trace_json``."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    return getattr(c10d, "_dump_fr_trace_json", None) or getattr(c10d, "_dump_nccl_trace_json", None)


def group_memberships() -> dict[str, dict[str, str]]:
    """``pg_config`` entries for every process group of this process, from torch.distributed:
    {group name: {"name", "desc", "ranks": "[0, 1]"}} (global ranks, FR's own string form)."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    out = {}
    world = getattr(c10d, "_world", None)
    if world is None or not dist.is_initialized():
        return out
    for pg, name in list(world.pg_names.items()):
        ranks = sorted(world.pg_group_ranks.get(pg, {}).keys())
        desc = getattr(pg, "group_desc", "") or ("default_pg" if pg is dist.GroupMember.WORLD else "")
        out[str(name)] = {"name": str(name), "desc": desc, "ranks": str(ranks)}
    return out


def supplement_pg_config(dump: dict, members: dict[str, dict[str, str]]) -> dict:
    """``dump`` with ``pg_config`` entries added for the groups it lacks or holds without ranks
    (gloo in torch 2.13 records none); entries torch filled are kept as they are."""
    config = dump.get("pg_config")
    if not isinstance(config, dict):
        config = {}
    for name, entry in members.items():
        have = config.get(name)
        if not isinstance(have, dict) or have.get("ranks") in (None, "", "[]"):
            config[name] = entry
    unnamed = config.get("")
    if isinstance(unnamed, dict) and unnamed.get("ranks") in (None, "", "[]"):
        del config[""]  # gloo's placeholder: names no group
    dump["pg_config"] = config
    return dump


def dump(run_dir: Path, rank: int) -> str:
    """Write this rank's Flight Recorder as JSON to ``run_dir/rank<r>.flightrec.json``
    (atomically; a later dump replaces an earlier one). Returns "ok" or why nothing was
    written; never raises (it runs while a record is failing)."""
    api = dump_api()
    if api is None:
        return "this torch has no JSON dump of the Flight Recorder"
    if os.environ.get(BUFFER_ENV, os.environ.get(NCCL_BUFFER_ENV)) == "0":
        return f"the Flight Recorder is off ({BUFFER_ENV}=0)"
    try:
        data = json.loads(api())
        data = supplement_pg_config(data, group_memberships())
        write_atomic(run_dir / flightrec_name(rank), json.dumps(data, sort_keys=True))
    except Exception as exc:  # noqa: BLE001 - a failing record: report, never mask its error
        log.warning("rank %d: no Flight Recorder dump: %s: %s", rank, type(exc).__name__, exc)
        return f"{type(exc).__name__}: {exc}"
    return "ok"


class DumpListener:
    """A daemon thread that dumps this rank's Flight Recorder each time the launcher writes a
    byte on ``fd`` (``REQUEST_ENV``), then writes ``rank<r>.flightrec.done`` in the control
    folder; it ends when the launcher closes the pipe."""

    def __init__(self, fd: int, run_dir: Path, rank: int, ctrl_dir: Path):
        self.fd, self.run_dir, self.rank, self.ctrl_dir = fd, run_dir, rank, ctrl_dir
        self.thread = threading.Thread(target=self._run, name="paritytrace-flightrec", daemon=True)

    def start(self) -> "DumpListener":
        self.thread.start()
        write_atomic(self.ctrl_dir / f"rank{self.rank}{LISTENING_SUFFIX}", "")
        return self

    def _run(self) -> None:
        try:
            while os.read(self.fd, 1):
                said = dump(self.run_dir, self.rank)
                write_atomic(self.ctrl_dir / f"rank{self.rank}{DONE_SUFFIX}", said)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)


def listen(run_dir: Path, rank: int, ctrl_dir: Path | None) -> DumpListener | None:
    """Start the ``DumpListener`` when the launcher passed a request fd (spawned workers)."""
    fd_text = os.environ.pop(REQUEST_ENV, None)
    if fd_text is None or ctrl_dir is None:
        return None
    return DumpListener(int(fd_text), run_dir, rank, ctrl_dir).start()
