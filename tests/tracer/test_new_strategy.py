"""A new strategy is a row of the strategy table and a setup hook, nothing else (issue 41,
ARCHITECTURE.md "Adding a strategy"): a copy of the product code with a toy ``ddp2`` (ddp's row
under another name and colour, its hook calling ddp's) records, reports, passes parity and is
ranked, with no other file touched."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.record

REPO = Path(__file__).resolve().parents[2]
TABLE = Path("analyzer/contract/strategies.py")
SETUP = Path("tracer/strategies.py")

ROW = '''    _row("ddp2", "ddp", {"world": "replicate"}, DDP_OPTIONS,
         ("skip-grad-sync", *COMMON_FAULTS, "hang"), "#9c755f"),
'''
HOOK = '''

@registers("ddp2")
def setup_ddp2(cfg, spec, base, rank, world, device):
    """The toy strategy: DDP under another name."""
    return setup_ddp(cfg, spec, base, rank, world, device)
'''


def _changed_files(a: Path, b: Path) -> list[str]:
    """Paths (relative) of the *.py files that differ between the trees ``a`` and ``b``."""
    out = []
    for p in sorted(a.rglob("*.py")):
        rel = p.relative_to(a)
        if not (b / rel).exists() or not filecmp.cmp(p, b / rel, shallow=False):
            out.append(str(rel))
    return out + [str(q.relative_to(b)) for q in b.rglob("*.py") if not (a / q.relative_to(b)).exists()]


def _run(copy: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True)


def test_a_toy_strategy_is_a_table_row_and_a_setup_hook(tmp_path):
    copy = tmp_path / "code"
    for pkg in ("analyzer", "tracer", "reports"):
        shutil.copytree(REPO / pkg, copy / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    table = (copy / TABLE).read_text()
    anchor = '    _row("fsdp", "fsdp1"'
    assert anchor in table, "the table's fsdp row moved: update the anchor"
    (copy / TABLE).write_text(table.replace(anchor, ROW + anchor, 1))
    (copy / SETUP).write_text((copy / SETUP).read_text() + HOOK)
    changed = []
    for pkg in ("analyzer", "tracer", "reports"):
        changed += [f"{pkg}/{p}" for p in _changed_files(REPO / pkg, copy / pkg)]
    assert sorted(changed) == sorted([str(TABLE), str(SETUP)])

    out = tmp_path / "traces"
    rec = _run(copy, "-m", "tracer", "record", "--strategy", "single,ddp2,ddp", "--hidden", "32",
               "--seq", "8", "--warmup", "0", "--active", "2", "--out", str(out))
    assert rec.returncode == 0, rec.stderr[-3000:]
    assert json.loads((out / "ddp2" / "manifest.json").read_text())["strategy"] == "ddp2"
    rep = _run(copy, "-m", "analyzer", "report", str(out), "--format", "json,md",
               "--out", str(tmp_path / "report"))
    assert rep.returncode == 0, rep.stderr[-3000:]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    runs = {r["name"]: r for r in report["runs"]}
    assert runs["ddp2"]["parity"]["status"] == "pass"
    assert runs["single"]["parity"]["status"] == "reference"
    assert report["ranking"]["reference"] == "single"
    assert sorted(report["ranking"]["order"]) == ["ddp", "ddp2"]
    # ddp2 is ddp under another name: what sharding predicts, and the collectives per step
    assert runs["ddp2"]["memory"]["sharding"] == runs["ddp"]["memory"]["sharding"]
    per_step = {name: {k: (c["count_per_step"], c["bytes_per_step"])
                       for k, c in runs[name]["communication"].items()} for name in ("ddp", "ddp2")}
    assert per_step["ddp2"] == per_step["ddp"] and "all_reduce" in per_step["ddp2"]
    assert "ddp2" in (tmp_path / "report" / "report.md").read_text()
