"""Traces local to each Dask worker host (analyzer/ingest/hostlocal.py): the client does not see
the folder, the workers list it and parse each trace on a host that holds it.

The workers of a loopback cluster share this machine's filesystem, so the client's view is
taken away by patching ``hostlocal.client_sees`` (the one place the client asks): the
workers, unpatched, list and parse the folder. Oracle: ``analyzer report`` of an identical
copy that the client sees, with the local pool.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

distributed = pytest.importorskip(
    "distributed", reason="dask.distributed is not installed (pip install 'paritytrace[dask]')")

from analyzer.contract.errors import BadInput, ParityTraceError  # noqa: E402
from analyzer.contract.settings import DASK_TIMEOUT_S  # noqa: E402
from analyzer.ingest import cluster, hostlocal  # noqa: E402
from tests.analyzer.helpers import gloo_job as _job  # noqa: E402
from tests.analyzer.helpers import dask_ranks_ran  # noqa: E402
from tests.inputs import bad_input, cli  # noqa: E402

DEFAULT_WAIT_S = float(DASK_TIMEOUT_S.default)
"""The Dask wait with PARITYTRACE_DASK_TIMEOUT_S unset. A test that sets a shorter one checks it
ended before this: the setting was used (a bound the product's default sets, not a speed check)."""


def _hide(monkeypatch, folder: Path) -> None:
    """The client no longer sees ``folder`` (the workers still do)."""
    real = hostlocal.client_sees
    monkeypatch.setattr(hostlocal, "client_sees",
                        lambda p: not p.absolute().is_relative_to(folder) and real(p))


def _report(out: Path, root: Path) -> dict:
    return json.loads((out / "report.json").read_text().replace(str(root), "ROOT"))


def test_traces_only_the_workers_hold_give_the_local_report(tmp_path, local_cluster,
                                                            monkeypatch):
    here = _job(tmp_path / "here" / "job")
    there = tmp_path / "there" / "job"
    shutil.copytree(here, there)
    assert cli("report", str(here), "--out", str(tmp_path / "lo"), "--format",
               "json").returncode == 0
    _hide(monkeypatch, there)
    before = dask_ranks_ran(local_cluster)
    proc = cli("report", str(there), "--out", str(tmp_path / "do"), "--format", "json",
               "--scheduler", local_cluster.scheduler_address)
    assert proc.returncode == 0, proc.stderr
    assert dask_ranks_ran(local_cluster) - before == 6  # every rank parsed on a worker
    assert _report(tmp_path / "do", there) == _report(tmp_path / "lo", here)
    # no --out: there is no folder here to write beside; a relative path names nothing there
    bad_input(cli("report", str(there), "--scheduler", local_cluster.scheduler_address),
              str(there), "--out")
    monkeypatch.chdir(tmp_path / "there")
    bad_input(cli("report", "job", "--out", str(tmp_path / "o3"), "--scheduler",
                  local_cluster.scheduler_address), "relative path")


def test_summary_of_traces_only_the_workers_hold_equals_the_local_one(tmp_path, local_cluster,
                                                                      monkeypatch):
    here = _job(tmp_path / "here" / "job")
    there = tmp_path / "there" / "job"
    shutil.copytree(here, there)
    local = cli("summary", str(here), "--format", "json")
    assert local.returncode == 0, local.stderr
    _hide(monkeypatch, there)
    remote = cli("summary", str(there), "--format", "json", "--scheduler",
                 local_cluster.scheduler_address)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout.replace(str(there), "ROOT")) == \
        json.loads(local.stdout.replace(str(here), "ROOT"))
    bad_input(cli("summary", str(there), "--crosscheck", "hta", "--scheduler",
                  local_cluster.scheduler_address), "--crosscheck")


def test_no_worker_holding_the_folder_is_one_line(tmp_path, local_cluster):
    gone = tmp_path / "nowhere" / "job"
    bad_input(cli("report", str(gone), "--out", str(tmp_path / "o"), "--scheduler",
                  local_cluster.scheduler_address), str(gone), "no Dask worker holds")


def test_a_run_directory_on_the_workers_only_is_refused(tmp_path, local_cluster, monkeypatch,
                                                        ddp_run):
    from tests.inputs import copy_run

    run = copy_run(ddp_run, tmp_path / "there" / "ddp")
    _hide(monkeypatch, run)
    bad_input(cli("report", str(run), "--out", str(tmp_path / "o"), "--scheduler",
                  local_cluster.scheduler_address), "run directory", "client sees")


def _answer(*traces):
    return {"traces": [list(t) for t in traces], "notes": []}


def test_listings_join_by_host_and_refuse_one_path_holding_two_files():
    root = Path("/local/job")
    traces, pins, _ = hostlocal.merge_listings(root, {
        "tcp://10.0.0.1:4000": _answer(("/local/job/rank0.json", 10, 1)),
        "tcp://10.0.0.1:4001": _answer(("/local/job/rank0.json", 10, 1)),  # same host
        "tcp://10.0.0.2:4000": _answer(("/local/job/rank1.json", 12, 1)),
        "tcp://10.0.0.3:4000": {"missing": True},
        "tcp://10.0.0.4:4000": _answer(("/local/job/rank1.json", 12, 1)),  # a share: same file
    })
    assert traces == [Path("/local/job/rank0.json"), Path("/local/job/rank1.json")]
    assert pins == {"/local/job/rank0.json": ["10.0.0.1"],
                    "/local/job/rank1.json": ["10.0.0.2", "10.0.0.4"]}
    with pytest.raises(BadInput, match=r"rank0.json: this path holds different files on "
                                       r"different worker hosts \(10 bytes on 10.0.0.1; 11 "
                                       r"bytes on 10.0.0.2\)"):
        hostlocal.merge_listings(root, {"tcp://10.0.0.1:1": _answer(("/local/job/rank0.json",
                                                                     10, 1)),
                                        "tcp://10.0.0.2:1": _answer(("/local/job/rank0.json",
                                                                     11, 1))})
    with pytest.raises(BadInput, match="no Dask worker holds traces there"):
        hostlocal.merge_listings(root, {"tcp://10.0.0.3:4000": {"missing": True}})
    with pytest.raises(BadInput, match=r"tcp://10.0.0.3:4000.*listing /local/job: boom"):
        hostlocal.merge_listings(root, {"tcp://10.0.0.3:4000": {"error": "boom"}})


def test_a_trace_whose_host_has_no_worker_is_named_not_waited_for(tmp_path, local_cluster):
    trace = _job(tmp_path / "job", ranks=2) / "rank0.trace.json"
    with distributed.Client(local_cluster.scheduler_address, set_as_default=False) as client, \
            cluster.pinned({str(trace): ["10.255.255.1"]}):
        start = time.monotonic()
        with pytest.raises(ParityTraceError, match=r"rank0.trace.json: waited 1 s for a Dask "
                                                   r"worker on the host\(s\) that hold it "
                                                   r"\(10.255.255.1\)"):
            cluster.dask_map(client, local_cluster.scheduler_address, str, [trace], wait_s=1)
        assert time.monotonic() - start < DEFAULT_WAIT_S, "waited the default, not wait_s"
