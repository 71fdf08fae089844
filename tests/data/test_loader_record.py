"""``tracer record --data`` (issue 10) on CPU/gloo: the loader feeds the memory path's rows
(bitwise the same first-step loss, parity passes), and an artificial per-sample cost shows up
as data wait in the analyzer's breakdown and in the report.

Oracles: the memory path's own numerics (bitwise loss), the sleep the dataset is told to take
(a lower bound: ``time.sleep`` never returns early, and with ``--data-workers 0`` it runs on the
rank's main thread inside the DataLoader's ``__next__`` range, where nothing else runs), and the
DistributedSampler rows computed here from ``model.rank_rows``. No timing upper bound is asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from analyzer.api import load_events, load_tables
from tests.data.conftest import REPO
from tests.inputs import copy_run, shared

pytestmark = pytest.mark.record

TINY = ["--hidden", "32", "--seq", "8", "--batch", "4", "--active", "2"]
COST_MS = 40.0
PER_RANK_BATCH = 2  # --batch 4 over 2 ranks
RUNS = {"mem": [], "loader0": ["--data", "loader"],
        "loader40": ["--data", "loader", "--data-sample-cost-ms", str(COST_MS)]}


@pytest.fixture(scope="session")
def records(tmp_path_factory):
    """Three DDP records (memory, loader without cost, loader with COST_MS per sample), run in
    parallel: root folder with run dirs ddp-<name>."""
    root = tmp_path_factory.mktemp("data-records")
    env = dict(os.environ, TMPDIR=str(root),
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "tracer", "record", "--strategy", "ddp", *TINY, *extra,
         "--out", str(root), "--name", f"ddp-{name}"],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for name, extra in RUNS.items()}
    for name, p in procs.items():
        _, err = p.communicate()
        assert p.returncode == 0, f"{name}: {err[-3000:]}"
    return shared(root)


def _first_losses(run_dir) -> dict[int, float]:
    n = pd.read_parquet(run_dir / "numerics.parquet")
    n = n[(n["kind"] == "loss") & (n["metric"] == "value") & (n["step"] == 0)]
    return {int(r): float(v) for r, v in zip(n["rank"], n["value"])}


def test_loader_gives_bitwise_the_memory_first_step_loss(records):
    mem = _first_losses(records / "ddp-mem")
    assert sorted(mem) == [0, 1]
    for name in ("loader0", "loader40"):
        assert _first_losses(records / f"ddp-{name}") == mem  # exact float equality


def test_manifest_records_the_data_supply(records):
    def data(name):
        return json.loads((records / f"ddp-{name}" / "manifest.json").read_text())["data"]
    assert data("mem") == {"source": "memory"}
    d = data("loader40")
    assert (d["source"], d["workers"], d["sample_cost_ms"], d["pin_memory"]) == \
        ("loader", 0, COST_MS, False)


def test_data_wait_follows_the_sample_cost(records, tmp_path):
    bd = {name: load_tables(copy_run(records / f"ddp-{name}", tmp_path / name)).breakdown
          for name in RUNS}
    parts = ["compute_ns", "exposed_comm_ns", "data_wait_ns", "other_ns", "idle_ns"]
    for b in bd.values():
        assert len(b) == 4 and (b[parts].sum(axis=1) == b["step_ns"]).all()
    # memory: no DataLoader range, nothing to wait for -- exactly 0
    assert (bd["mem"]["data_wait_ns"] == 0).all() and not bd["mem"]["input_bound"].any()
    ev, _ = load_events(tmp_path / "mem" / "rank0.trace.json.gz")
    assert not (ev["role"].astype(str) == "data").any()
    # loader: every step has its DataLoader range; with the cost, each rank-step waited at
    # least its samples' sleep
    assert (bd["loader0"]["data_wait_ns"] > 0).all()
    assert (bd["loader40"]["data_wait_ns"] >= PER_RANK_BATCH * COST_MS * 1e6).all()

    def share(b):
        return b["data_wait_ns"].sum() / b["step_ns"].sum()
    assert share(bd["loader40"]) > share(bd["loader0"]) > share(bd["mem"]) == 0


def test_report_shows_data_supply_and_parity(records, tmp_path):
    out = tmp_path / "report"
    root = tmp_path / "traces"
    for name in RUNS:  # copies: the report's caches land there
        copy_run(records / f"ddp-{name}", root / f"ddp-{name}")
    proc = subprocess.run([sys.executable, "-m", "analyzer", "report", str(root), "--out", str(out)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    rep = json.loads((out / "report.json").read_text())
    runs = {r["name"]: r for r in rep["runs"]}
    assert {r["parity"]["status"] for r in runs.values()} == {"pass"}
    hi = runs["ddp-loader40"]["data"]
    assert hi["source"] == "loader" and hi["input_bound"]
    assert runs["ddp-mem"]["data"]["data_wait_frac"] == 0 and not runs["ddp-mem"]["data"]["input_bound"]
    md = (out / "report.md").read_text()
    assert f"Input-bound: in ddp-loader40, rank {hi['worst_rank']} waited" in md
    assert "(loader, 0 workers, 40 ms/sample)" in md and "0.0 % (memory)" in md
    # runs fed differently, by three commands, are not one experiment: no ranking across them
    # (one is ranked alone, the others are compared in the tables only), and the report warns
    rk = rep["ranking"]
    assert len(rk["order"]) == 1 and rk["pairs"] == [] and len(rk["descriptive"]) == 2
    assert set(rk["order"] + rk["descriptive"]) == set(runs) and "not of experiment" in rk["reason"]
    assert any("differ in data" in w for w in rep["settings_warnings"])
