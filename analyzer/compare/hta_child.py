"""The child process that runs HolisticTraceAnalysis for ``--crosscheck hta``
(analyzer/compare/crosscheck_hta.py ``run_hta_overlap`` starts it).

``python -m analyzer.compare.hta_child TRACE_DIR RESULT_JSON``: runs HTA's
get_comm_comp_overlap on TRACE_DIR (``crosscheck_hta.hta_overlap_in_process``) and writes
RESULT_JSON atomically: {"rank": [int], "hta_overlap_pct": [float or null]}, or
{"error": {"type": name, "message": text}} when HTA raised. Plain JSON, so the parent never
unpickles anything. Everything HTA logs or prints goes to this process's stdout and stderr,
which the parent points at a file of its own (off the terminal). HTA's fork pool starts here,
inside the process group the parent kills on a timeout; this process also ends when the parent
does (analyzer/contract/children.py ``spawn``), so a parent killed with SIGKILL leaves no HTA
running on.

``PARITYTRACE_HTA_RUNNER=module:function`` (tests only) runs that function in HTA's place,
with TRACE_DIR as its argument and the same result contract.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import sys


def _runner():
    spec = os.environ.get("PARITYTRACE_HTA_RUNNER")
    if not spec:
        from analyzer.compare.crosscheck_hta import hta_overlap_in_process

        return hta_overlap_in_process
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str]) -> int:
    trace_dir, result = argv
    logging.basicConfig(stream=sys.stderr, level=logging.INFO)  # this process only
    try:
        data = _runner()(trace_dir)
    except Exception as exc:  # HTA's failure is data for the parent, not a crash here
        text = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
        data = {"error": {"type": type(exc).__name__, "message": text}}
    tmp = f"{result}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
