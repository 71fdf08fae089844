"""Tracer GPU code paths that run without a GPU: device / backend resolution, the rank -> GPU
check (fake GPU counts injected), the snapshot converter on a dict shaped like torch's
``_snapshot()``, and the CUDA branches of the worker with torch.cuda faked."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
import torch

from analyzer.contract import schemas
from tracer import devices, worker
from tracer.config import RecordConfig
from tracer.memory import snapshot_to_table


@pytest.mark.parametrize("requested,available,expected", [
    ("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cuda", True, "cuda")])
def test_device_resolution(requested, available, expected):
    assert devices.resolve_device_type(requested, available) == expected


def test_cuda_without_gpu_is_a_one_line_error():
    with pytest.raises(ValueError, match="^--device cuda: no CUDA device is available$"):
        devices.resolve_device_type("cuda", False)


@pytest.mark.parametrize("requested,device_type,expected", [
    ("auto", "cuda", "nccl"), ("auto", "cpu", "gloo"), ("gloo", "cuda", "gloo"), ("nccl", "cuda", "nccl")])
def test_backend_resolution(requested, device_type, expected):
    assert devices.resolve_backend(requested, device_type) == expected


def test_nccl_on_cpu_refused():
    with pytest.raises(ValueError, match="needs --device cuda"):
        devices.resolve_backend("nccl", "cpu")


@pytest.mark.parametrize("ranks,gpus", [(1, 1), (2, 2), (2, 8), (8, 8)])
def test_nccl_ranks_that_fit(ranks, gpus):
    devices.check_ranks_fit(local_world_size=ranks, backend="nccl", device_type="cuda", gpu_count=gpus)


@pytest.mark.parametrize("ranks,gpus", [(2, 1), (3, 2), (9, 8)])
def test_more_nccl_ranks_than_gpus(ranks, gpus):
    with pytest.raises(ValueError) as info:
        devices.check_ranks_fit(local_world_size=ranks, backend="nccl", device_type="cuda", gpu_count=gpus)
    msg = str(info.value)
    assert "\n" not in msg and f"--nproc {ranks}" in msg and f"{gpus} visible GPU" in msg
    assert f"use --nproc {gpus}" in msg


def test_gloo_and_cpu_are_not_limited_by_gpus():
    devices.check_ranks_fit(local_world_size=4, backend="gloo", device_type="cuda", gpu_count=1)
    devices.check_ranks_fit(local_world_size=4, backend="gloo", device_type="cpu", gpu_count=0)
    with pytest.raises(ValueError, match="no CUDA device is visible"):
        devices.check_ranks_fit(local_world_size=1, backend="gloo", device_type="cuda", gpu_count=0)


def test_rank_to_gpu_mapping():
    assert [devices.gpu_for_local_rank(r, 4, "nccl") for r in range(4)] == [0, 1, 2, 3]
    assert [devices.gpu_for_local_rank(r, 2, "gloo") for r in range(4)] == [0, 1, 0, 1]
    with pytest.raises(ValueError, match="LOCAL_RANK 2: NCCL needs one GPU per rank .* 2 visible GPUs"):
        devices.gpu_for_local_rank(2, 2, "nccl")


class FakeCuda:
    """Stands in for torch.cuda's device queries; records set_device calls."""

    def __init__(self, count):
        self.count, self.current = count, None

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: self.count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: self.count)
        monkeypatch.setattr(torch.cuda, "set_device", lambda i: setattr(self, "current", i))


def test_worker_places_each_rank_on_its_own_gpu(monkeypatch):
    fake = FakeCuda(4)
    fake.install(monkeypatch)
    cfg = RecordConfig(strategy="ddp", nproc=4, device="auto")
    dev = worker.resolve_device(cfg, local_rank=3)
    assert (dev.type, dev.index, fake.current) == ("cuda", 3, 3)
    assert devices.resolve_backend(cfg.backend, dev.type) == "nccl"


def test_worker_refuses_a_rank_without_a_gpu(monkeypatch):
    FakeCuda(1).install(monkeypatch)
    cfg = RecordConfig(strategy="ddp", nproc=2, device="cuda")
    with pytest.raises(ValueError, match="LOCAL_RANK 1: NCCL needs one GPU per rank"):
        worker.resolve_device(cfg, local_rank=1)


def test_worker_on_cpu_machine(monkeypatch):
    FakeCuda(0).install(monkeypatch)
    cfg = RecordConfig(strategy="ddp", nproc=2)
    dev = worker.resolve_device(cfg, local_rank=1)
    assert dev.type == "cpu" and devices.resolve_backend(cfg.backend, dev.type) == "gloo"


def torch_shaped_snapshot():
    """A snapshot with every key torch 2.11 / 2.13 ``_snapshot()`` writes (memory_snapshot.cpp):
    two segments on two streams, three blocks of the three states, Python frames innermost first
    (``stacks="python"``), and a device trace the converter must ignore."""
    frame = lambda f, line, name: {"filename": f, "line": line, "name": name}  # noqa: E731
    return {
        "segments": [
            {"device": 0, "address": 139_800_000_000_000, "total_size": 2_097_152,
             "allocated_size": 1_572_864, "active_size": 1_572_864, "requested_size": 1_500_000,
             "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False,
             "frames": [],
             "blocks": [
                 {"address": 139_800_000_000_000, "size": 1_048_576, "requested_size": 1_000_000,
                  "state": "active_allocated",
                  "frames": [frame("/usr/lib/python3/site-packages/torch/nn/modules/linear.py", 125, "forward"),
                             frame("/repo/tracer/model.py", 40, "forward"),
                             frame("/repo/tracer/worker.py", 250, "train")]},
                 {"address": 139_800_001_048_576, "size": 524_288, "requested_size": 500_000,
                  "state": "active_pending_free", "frames": []},
                 {"address": 139_800_001_572_864, "size": 524_288, "requested_size": 0,
                  "state": "inactive", "frames": []}]},
            {"device": 0, "address": 139_900_000_000_000, "total_size": 2_097_152,
             "allocated_size": 2_097_152, "active_size": 2_097_152, "requested_size": 2_097_152,
             "stream": 94_000_000_001, "segment_type": "large", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": [],
             "blocks": [
                 {"address": 139_900_000_000_000, "size": 2_097_152, "requested_size": 2_097_152,
                  "state": "active_allocated",
                  "frames": [frame("/usr/lib/python3/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 300, "foreach_all_gather")]}]},
        ],
        "device_traces": [[{"action": "alloc", "addr": 139_800_000_000_000, "size": 1_048_576,
                            "stream": 0, "time_us": 1, "frames": []}]],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1},
    }


def test_converter_on_torch_shaped_snapshot(tmp_path):
    table = snapshot_to_table(torch_shaped_snapshot(), rank=1)
    assert table.schema.equals(schemas.MEMORY_SCHEMA)
    pq.write_table(table, tmp_path / "memory.parquet")
    rows = pq.read_table(tmp_path / "memory.parquet").to_pylist()
    assert len(rows) == 4  # one per block; the device trace adds none
    assert [r["state"] for r in rows] == ["active_allocated", "active_pending_free", "inactive",
                                          "active_allocated"]
    # per segment: the blocks tile it (sizes add up to total_size), as the allocator guarantees
    assert sum(r["block_size_bytes"] for r in rows[:3]) == 2_097_152
    assert [r["segment_address"] for r in rows] == [139_800_000_000_000] * 3 + [139_900_000_000_000]
    assert [r["stream"] for r in rows] == [0, 0, 0, 94_000_000_001]
    assert [r["requested_size_bytes"] for r in rows] == [1_000_000, 500_000, 0, 2_097_152]
    # innermost frame outside torch; a block allocated inside torch only has none
    assert rows[0]["top_frame"] == "/repo/tracer/model.py:40:forward"
    assert rows[3]["top_frame"] is None and rows[1]["top_frame"] is None
    assert {r["rank"] for r in rows} == {1}


def test_launcher_refuses_more_nccl_ranks_than_gpus_before_writing(tmp_path):
    from tracer.record import check_gpus, expand

    configs = expand("all", None, nproc=2, device="cuda", out=str(tmp_path))
    with pytest.raises(ValueError, match=r"^--nproc 2: NCCL needs one GPU per rank and this machine has 1 visible GPU;"):
        check_gpus(configs, gpu_count=1)
    check_gpus(configs, gpu_count=2)  # fits
    check_gpus(expand("all", None, nproc=2, device="cuda", backend="gloo", out=str(tmp_path)), gpu_count=1)
    check_gpus(expand("all", None, nproc=1, device="cuda", out=str(tmp_path)), gpu_count=1)
    assert list(tmp_path.iterdir()) == []  # the check writes nothing


def test_cli_one_line_exit_2_when_ranks_exceed_gpus(tmp_path, monkeypatch):
    """The CLI path with a fake one-GPU machine: one line on stderr, exit 2, no run dir."""
    from typer.testing import CliRunner

    from tracer.cli import app

    FakeCuda(1).install(monkeypatch)
    monkeypatch.delenv("RANK", raising=False)
    res = CliRunner().invoke(app, ["record", "--strategy", "ddp", "--nproc", "2", "--device", "cuda",
                                   "--out", str(tmp_path / "t")])
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines == ["tracer: --nproc 2: NCCL needs one GPU per rank and this machine has 1 visible GPU; "
                     "use --nproc 1 or --backend gloo"]
    assert not (tmp_path / "t").exists()
