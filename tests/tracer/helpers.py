"""Helpers for tracer tests: run the CLI, read numerics, check the process table.

Everything here is computed independently of tracer's own code (rel L2 from the raw sums,
sha256 with hashlib, traces read with gzip/json).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import psutil

REPO = Path(__file__).resolve().parents[2]
# Tiny shapes: the numerics and the launch paths do not depend on the model width.
TINY = ["--hidden", "32", "--seq", "8", "--batch", "4"]
TAG_ENV = "PARITYTRACE_TEST_TAG"


from tests.inputs import HANG_S  # noqa: E402, F401 - the tracer tests' hang guard


def run_tracer(args: list[str], cwd: Path, *, env_extra: dict | None = None,
               timeout: float | None = None,
               module: list[str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
    """Run ``python -m tracer record ARGS`` (or ``module``) tagged with a unique env value.

    Returns (completed process, tag); the tag finds leftover processes (``alive_with_tag``).
    ``timeout`` (s): none by default; a record that hangs is stopped by the suite's
    pytest-timeout (pyproject.toml), whose exception kills the child as a timeout would.
    """
    tag = uuid.uuid4().hex
    # TMPDIR: failed records keep their worker logs in a temp folder; keep it inside the test's.
    env = dict(os.environ, TMPDIR=str(cwd), **(env_extra or {}), **{TAG_ENV: tag})
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = module if module is not None else [sys.executable, "-m", "tracer", "record"]
    proc = subprocess.run(cmd + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, tag


def alive_with_tag(tag: str, wait_s: float = 5.0) -> list[int]:
    """PIDs of live processes whose environment carries ``tag`` (waits up to ``wait_s`` for
    them to disappear, as the kernel reaps killed processes asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for p in psutil.process_iter(["pid"]):
            try:
                if p.environ().get(TAG_ENV) == tag and p.status() != psutil.STATUS_ZOMBIE:
                    pids.append(p.pid)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def tensor_rel_l2(numerics: pd.DataFrame, kind: str) -> dict[str, float]:
    """Per tensor of ``kind``: relative L2 difference to the baseline.

    Sharded tensors (replicated == 0): sqrt(sum of diff_sq_sum / sum of ref_sq_sum) over ranks;
    replicated ones: the worst rank's sqrt(diff_sq_sum / ref_sq_sum).
    """
    sub = numerics[numerics["kind"] == kind]
    wide = sub.pivot_table(index=["tensor", "rank"], columns="metric", values="value",
                           observed=True).reset_index()
    out = {}
    for tensor, g in wide.groupby("tensor", observed=True):
        if (g["replicated"] == 1.0).all():
            out[str(tensor)] = max(math.sqrt(d / r) if r else math.sqrt(d)
                                   for d, r in zip(g["diff_sq_sum"], g["ref_sq_sum"]))
        else:
            d, r = g["diff_sq_sum"].sum(), g["ref_sq_sum"].sum()
            out[str(tensor)] = math.sqrt(d / r) if r else math.sqrt(d)
    return out
