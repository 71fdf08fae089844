"""``--model SPEC`` checked before any worker starts, in a child process under ``--timeout``.

Why a child: the check runs the user's code (import, factory, ``make_batch``, one forward and
loss: ``specload.check_spec``), and user code can do what no ``except`` sees in the process
that runs it: hang (before any worker exists, so no hang watchdog could stop it), call
``os._exit(0)`` (the launcher would end with status 0, having recorded nothing), or print lines
that read like the tracer's own. In a child the launcher stays in charge:

- the child writes ``STARTED`` once its imports are done (torch: seconds on a loaded machine,
  not the model's time), then has ``--timeout`` seconds for the check; past it, it is killed
  (its whole process group) and the check fails with one line naming the timeout;
- the child's verdict is a file (``RESULT``); a child that ended without one ended in the
  model code (``os._exit``, a signal), and the line says so with its status;
- its stdout and stderr go to a log file in a temporary folder (removed afterwards), never
  to the launcher's stdout;
- a stop signal on the launcher (``stopping.stop_on_signals``, installed before the check) kills
  the child's group and propagates as ``KeyboardInterrupt``; the child also dies with the
  launcher (``PR_SET_PDEATHSIG``).

Every failure is a ``ValueError`` of one line, ``--model SPEC: <problem>; <what to do>`` (the
CLI exits 2), as for the refusals of ``check_spec``. This module imports no torch; its
``_main`` (the child) does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analyzer.contract import children
from tracer.config import RecordConfig
from tracer.launch import HANG_SLACK_S

RESULT = "result.json"
STARTED = "started"
LOG = "check.log"


def check_spec_isolated(cfg: RecordConfig) -> None:
    """Run ``specload.check_spec(cfg)`` in a child process (module docstring). Raises
    ``ValueError`` (one line) when the spec is refused, the check exceeds ``cfg.timeout_s``
    after the child's imports, or the child ends without a verdict; ``KeyboardInterrupt``
    on a stop signal (the child killed)."""
    spec = cfg.model
    with tempfile.TemporaryDirectory(prefix="tracer-speccheck-") as tmp:
        folder = Path(tmp)
        proc = children.spawn([sys.executable, "-m", "tracer.speccheck", json.dumps(cfg.to_dict()),
                               str(folder)], folder / LOG)
        try:
            timed_out = _timed_out(proc, folder, cfg.timeout_s)
        finally:  # also on a stop signal; once it ended, what it started must not run on
            code, = children.kill(proc)
        if timed_out:
            raise ValueError(f"--model {spec}: the spec check (the factory, make_batch, one forward "
                             f"and loss) did not finish within --timeout {cfg.timeout_s:g}s; "
                             "fix the hang in the model code, or raise --timeout")
        try:
            verdict = json.loads((folder / RESULT).read_text())
        except (OSError, ValueError):
            verdict = None
        if verdict is None:
            how = (f"exited with status {code}" if code >= 0
                   else f"was killed by {signal.Signals(-code).name}" if -code in signal.valid_signals()
                   else f"was killed by signal {-code}")
            said = (children.log_lines(folder / LOG) or [""])[-1]
            raise ValueError(f"--model {spec}: the model code {how} during the spec check "
                             f"(os._exit or the like{'; its last line: ' + said if said else ''}), "
                             "before any worker started; never end the process from model code: "
                             "raise an exception instead")
        if not verdict.get("ok"):
            raise ValueError(verdict.get("error") or f"--model {spec}: refused")


def _timed_out(proc: subprocess.Popen, folder: Path, timeout_s: float) -> bool:
    """Whether the child ran ``timeout_s`` past ``STARTED`` (or never wrote it within
    ``timeout_s + HANG_SLACK_S``: the imports hung) before it ended."""
    begun = time.monotonic()
    while not children.exited(proc, children.POLL_S):
        started = folder / STARTED
        if started.exists():
            if time.time() - started.stat().st_mtime > timeout_s:
                return True
        elif time.monotonic() - begun > timeout_s + HANG_SLACK_S:
            return True
    return False


def _main(argv: list[str]) -> None:
    """The child: ``python -m tracer.speccheck CONFIG_JSON FOLDER``; always ends with
    ``os._exit(0)`` after writing its verdict (a model's own exit never writes one)."""
    from analyzer.contract.atomic import write_atomic
    from tracer.modelspec import SpecError
    from tracer.specload import check_spec

    cfg = RecordConfig(**json.loads(argv[0]))
    folder = Path(argv[1])
    (folder / STARTED).touch()
    try:
        check_spec(cfg)
        verdict = {"ok": True}
    except SpecError as exc:
        verdict = {"ok": False, "error": str(exc)}
    except BaseException as exc:  # the process boundary: say it in one line
        text = str(exc).strip().splitlines()
        verdict = {"ok": False, "error": f"--model {cfg.model}: the spec check raised "
                   f"{type(exc).__name__}: {text[0] if text else '(no message)'}; fix the model code"}
    write_atomic(folder / RESULT, json.dumps(verdict))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    _main(sys.argv[1:])
