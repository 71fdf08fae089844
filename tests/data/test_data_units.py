"""tracer/data.py and the --data options, in-process (no record): the DataLoader path hands each
rank exactly the memory path's rows, with and without worker processes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tests.data.conftest import REPO
from tracer.config import RecordConfig
from tracer.data import Batches, FixedBatchDataset


def _batch(b=6, seq=3, hidden=4):
    g = torch.Generator().manual_seed(7)
    return torch.randn(b, seq, hidden, generator=g), torch.randn(b, seq, hidden, generator=g)


def test_distributed_sampler_alone_interleaves():
    """Why the dataset is laid out rank-major: on plain indices DistributedSampler(shuffle=False)
    gives rank 1 of 2 the odd items, not the second half."""
    from torch.utils.data.distributed import DistributedSampler
    assert list(DistributedSampler(range(6), num_replicas=2, rank=1, shuffle=False)) == [1, 3, 5]


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_loader_rows_equal_memory_rows(world, workers):
    x, y = _batch()
    per = x.shape[0] // world
    cfg = RecordConfig(strategy="single" if world == 1 else "ddp", nproc=max(world, 2),
                       batch=6, steps=3, wait=1, warmup=1, active=1, data="loader",
                       data_workers=workers)
    for rank in range(world):
        want = slice(rank * per, (rank + 1) * per)  # [r*B/W, (r+1)*B/W), independently
        b = Batches(cfg, x, y, rank=rank, world_size=world, device=torch.device("cpu"))
        b.start()
        try:
            for _ in range(cfg.total_steps):  # every step the same rows, in order
                xb, yb = b.next()
                assert torch.equal(xb, x[want]) and torch.equal(yb, y[want])
        finally:
            b.close()


def test_dataset_length_and_bounds():
    x, y = _batch()
    ds = FixedBatchDataset(x, y, world_size=2, steps=4)
    assert len(ds) == 24
    assert [ds.row(k) for k in range(6)] == [0, 3, 1, 4, 2, 5]
    with pytest.raises(IndexError):
        ds[24]
    with pytest.raises(ValueError, match="does not divide"):
        FixedBatchDataset(x, y, world_size=4, steps=1)


@pytest.mark.parametrize("kwargs, option", [
    ({"data": "disk"}, "--data disk"),
    ({"data_workers": 2}, "--data-workers 2"),
    ({"data_sample_cost_ms": 3.0}, "--data-sample-cost-ms 3.0"),
    ({"data": "loader", "data_workers": -1}, "--data-workers -1"),
    ({"data": "loader", "data_sample_cost_ms": -1.0}, "--data-sample-cost-ms -1.0"),
])
def test_bad_data_options_name_the_option(kwargs, option):
    with pytest.raises(ValueError, match=f"^{option}:"):
        RecordConfig(strategy="ddp", **kwargs)


def test_loader_options_survive_to_argv():
    cfg = RecordConfig(strategy="ddp", data="loader", data_workers=2, data_sample_cost_ms=1.5)
    argv = cfg.to_argv()
    i = argv.index("--data")
    assert argv[i:i + 6] == ["--data", "loader", "--data-workers", "2", "--data-sample-cost-ms", "1.5"]
    assert "--data" not in RecordConfig(strategy="ddp").to_argv()


@pytest.mark.record
def test_cli_refuses_workers_without_loader(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tracer", "record", "--strategy", "ddp",
                           "--data-workers", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip() == "tracer: --data-workers 2: only with --data loader"
    assert not any(tmp_path.iterdir())
