"""Which process owns a temporary folder, and whether that process is provably dead.

Part of the contract because both programs leave temporary folders that a SIGKILL (or a
SIGQUIT's core dump, a power cut) cannot remove: the tracer's baseline staging folders
(``.tracer-baseline-*`` under ``--out``), the analyzer's spill folders (``paritytrace-tables-*``
in ``$TMPDIR``), ``--tables-out`` staging folders (``.tmp-*-<name>`` beside it) and the atomic
writer's temp folders (``.tmp-<random>-<name>`` beside the file, contract/atomic.py). Each such
folder gets an owner file (``OWNER_NAME``) as its first entry: the creator's pid, its start time
(``/proc/<pid>/stat`` field 22, clock ticks since boot), the boot id and the host name. A later
run sweeps a leftover only when ``owner_dead`` proves that owner gone: same host, and another
boot, or no process with that pid, or one with another start time (a reused pid). Anything else
(no owner file, a malformed one, another host, no ``/proc``) is not provably dead and stays.
``sweep`` is the one sweep of such leftovers; each caller says which names are its folders and
which entries it writes in them.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
from collections.abc import Callable
from pathlib import Path

OWNER_NAME = ".paritytrace-owner"
"""The owner file inside a swept temporary folder."""
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def _boot_id() -> str | None:
    try:
        return _BOOT_ID.read_text().strip() or None
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot, or None when there is no such
    process (or no ``/proc``)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and ')': the fields after the last ')' are plain
    fields = raw[raw.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 overall: 3 fields are before this slice
    except (IndexError, ValueError):
        return None


def identity(pid: int | None = None) -> str | None:
    """``"<pid> <start ticks> <boot id> <host>"`` of ``pid`` (default: this process), or None
    where it cannot be told (no ``/proc``)."""
    pid = os.getpid() if pid is None else pid
    ticks, boot = start_ticks(pid), _boot_id()
    if ticks is None or boot is None:
        return None
    return f"{pid} {ticks} {boot} {socket.gethostname()}"


def write_owner(folder: Path) -> None:
    """Write this process's ``identity`` into ``folder/OWNER_NAME`` (nothing where it cannot
    be told: such a folder is then never swept). Raises ``OSError``."""
    ident = identity()
    if ident is not None:
        (Path(folder) / OWNER_NAME).write_text(ident + "\n")


def dead(ident: str) -> bool:
    """True when the process ``ident`` (an ``identity`` string) is provably gone (module doc)."""
    parts = ident.split()
    if len(parts) != 4 or not parts[0].isdigit() or not parts[1].isdigit():
        return False
    pid, ticks, boot, host = int(parts[0]), int(parts[1]), parts[2], parts[3]
    if host != socket.gethostname():
        return False  # a shared filesystem: another host's pids are not ours to look up
    here = _boot_id()
    if here is None:
        return False
    if boot != here:
        return True  # the machine rebooted since: every process of that boot is gone
    return start_ticks(pid) != ticks


def owner_dead(folder: Path) -> bool:
    """True when ``folder`` holds an owner file naming a process that is provably gone, and
    ``folder`` belongs to this user (a sweep never removes another user's folder)."""
    folder = Path(folder)
    try:
        if folder.is_symlink() or folder.lstat().st_uid != os.geteuid():
            return False
        text = (folder / OWNER_NAME).read_text(errors="replace")
    except OSError:
        return False
    return dead(text.strip())


def sweep(parent: Path, is_ours: Callable[[str], bool],
          allowed: Callable[[str], bool]) -> list[Path]:
    """Remove the folders in ``parent`` that processes killed beyond any clean-up left, and only
    those provably theirs: a folder whose name ``is_ours`` accepts, ``owner_dead`` (this user's,
    no symlink, its owner provably gone), holding nothing but its owner file and entries that
    ``allowed`` accepts (their '/'-separated paths relative to the folder, a folder's ending in
    '/'): regular files and folders only, no symlink at any depth. Returns the folders removed;
    one it cannot read or remove stays (never raises ``OSError``)."""
    removed = []
    try:
        candidates = [p for p in Path(parent).iterdir() if is_ours(p.name)]
    except OSError:
        return removed
    for d in candidates:
        try:
            if d.is_dir() and owner_dead(d) and _holds_only(d, allowed):
                shutil.rmtree(d)
                removed.append(d)
        except OSError:
            continue
    return removed


def _holds_only(folder: Path, allowed: Callable[[str], bool]) -> bool:
    """``sweep``'s test of a folder's contents. Raises ``OSError`` for one it cannot list."""
    def fail(exc: OSError):
        raise exc

    for here, dirs, files in os.walk(folder, onerror=fail):  # symlinks are not followed
        rel = Path(here).relative_to(folder)
        for name, want in [(n, stat.S_ISDIR) for n in dirs] + [(n, stat.S_ISREG) for n in files]:
            path = (rel / name).as_posix() + ("/" if want is stat.S_ISDIR else "")
            if not want(os.lstat(Path(here) / name).st_mode):
                return False  # a symlink, a device, a fifo
            if path != OWNER_NAME and not allowed(path):
                return False
    return True
