"""memory_categories.parquet of a real 2-rank AdamW record: every strategy's parameters,
gradients and optimizer state per rank against the exact count worked out here from the model's
parameter shapes and each strategy's sharding rule (the oracle does not use tracer/footprint.py).

Hidden 5 makes every sharded size odd, so the padding rules are exercised:
- DDP / single: every rank holds every parameter; N = sum of numels, 4 bytes each.
- FSDP1 (``use_orig_params=True``; torch/distributed/fsdp/_flat_param.py
  ``_init_flat_param_and_metadata``): per unit, the parameters in registration order, each
  starting at a multiple of 16 bytes (4 fp32 elements: padding before it), then the whole padded
  to a multiple of W; each rank holds 1/W of it.
- FSDP2 (``fully_shard``; torch/distributed/fsdp/_fully_shard/_fsdp_param.py): each parameter
  sharded on dim 0 into W chunks of ceil(d0 / W) rows, padded to that size on every rank.
- AdamW: exp_avg and exp_avg_sq shaped like the parameter *as the optimizer sees it* (FSDP1: the
  rank's unpadded part of each original parameter; FSDP2: the unpadded local shard), plus a
  4-byte ``step`` tensor per parameter that has a state.
"""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from tests.tracer.helpers import REPO, run_tracer

pytestmark = pytest.mark.record

W = 2
HIDDEN, LAYERS = 5, 2
FP32 = 4


def _layer_shapes(h: int) -> list[tuple[str, tuple[int, ...]]]:
    """One SimpleTransformerLayer's parameters in registration order (tracer/model.py)."""
    return [("attn.weight", (h, h)), ("attn.bias", (h,)), ("mlp.0.weight", (4 * h, h)),
            ("mlp.0.bias", (4 * h,)), ("mlp.2.weight", (h, 4 * h)), ("mlp.2.bias", (h,)),
            ("norm.weight", (h,)), ("norm.bias", (h,))]


SHAPES = [(f"layers.{i}.{n}", s) for i in range(LAYERS) for n, s in _layer_shapes(HIDDEN)]
N = sum(math.prod(s) for _, s in SHAPES)


def fsdp1_expected(units: list[str], rank: int) -> dict[str, int]:
    """Bytes of the rank's flat-parameter shards and of AdamW's state over its parts of the
    original parameters (module docstring rule)."""
    params = state_elems = with_state = 0
    for unit in units:
        offsets, total = [], 0
        for name, shape in SHAPES:
            if not name.startswith(unit + "."):
                continue
            total += (-total) % 4  # align the start to 16 bytes
            offsets.append((total, math.prod(shape)))
            total += math.prod(shape)
        total += (-total) % W
        shard = total // W
        params += shard * FP32
        lo, hi = rank * shard, (rank + 1) * shard
        for start, numel in offsets:
            mine = max(0, min(hi, start + numel) - max(lo, start))
            state_elems += mine
            with_state += mine > 0
    return {"parameters": params, "gradients": params,
            "optimizer_state": 2 * state_elems * FP32 + with_state * FP32}


def fsdp2_expected(rank: int) -> dict[str, int]:
    padded = local = 0
    for _, shape in SHAPES:
        rows = math.ceil(shape[0] / W)
        rest = math.prod(shape[1:])
        padded += rows * rest
        local += max(0, min(shape[0], (rank + 1) * rows) - rank * rows) * rest
    return {"parameters": padded * FP32, "gradients": padded * FP32,
            "optimizer_state": 2 * local * FP32 + len(SHAPES) * FP32}


def replicated_expected() -> dict[str, int]:
    return {"parameters": N * FP32, "gradients": N * FP32,
            "optimizer_state": 2 * N * FP32 + len(SHAPES) * FP32}


@pytest.fixture(scope="module")
def adamw_all(tmp_path_factory):
    out = tmp_path_factory.mktemp("memcat")
    proc, _ = run_tracer(["--strategy", "all", "--optimizer", "adamw", "--hidden", str(HIDDEN),
                          "--layers", str(LAYERS), "--seq", "4", "--batch", "4", "--warmup", "0",
                          "--active", "1", "--out", str(out)], cwd=out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def categories(run_dir) -> dict[int, dict[str, int]]:
    t = pq.read_table(run_dir / "memory_categories.parquet").to_pylist()
    out: dict[int, dict[str, int]] = {}
    for r in t:
        out.setdefault(r["rank"], {})[r["category"]] = r["bytes"]
    return out


def test_sharded_state_equals_the_exact_count_from_parameter_sizes(adamw_all):
    manifest = json.loads((adamw_all / "fsdp" / "manifest.json").read_text())
    units = manifest["strategy_options"]["fsdp_units"]
    assert manifest["model"]["num_params"] == N
    expected = {"single": {0: replicated_expected()},
                "ddp": {r: replicated_expected() for r in range(W)},
                "fsdp": {r: fsdp1_expected(units, r) for r in range(W)},
                "fsdp2": {r: fsdp2_expected(r) for r in range(W)}}
    for strategy, ranks in expected.items():
        got = categories(adamw_all / strategy)
        assert sorted(got) == sorted(ranks), strategy
        for rank, want in ranks.items():
            for cat, b in want.items():
                assert got[rank][cat] == b, (strategy, rank, cat, got[rank][cat], b)


def test_fsdp_holds_about_half_of_ddp_per_rank(adamw_all):
    """params + grads + optimizer state: FSDP / FSDP2 per rank = DDP's / W plus the padding,
    which here stays under 25 % of it (hidden 5: FSDP2 keeps ceil(5 / 2) = 3 of every 5 rows on
    each rank, 20 % over a half; at real widths it is a fraction of a percent)."""
    ddp = categories(adamw_all / "ddp")[0]
    held = ("parameters", "gradients", "optimizer_state")
    ddp_sum = sum(ddp[c] for c in held)
    for strategy in ("fsdp", "fsdp2"):
        for rank, cats in categories(adamw_all / strategy).items():
            mine = sum(cats[c] for c in held)
            assert ddp_sum / W - 2 * len(SHAPES) * FP32 <= mine <= 1.25 * ddp_sum / W, (strategy, rank)


def test_activations_do_not_depend_on_the_sharding_and_peak_is_the_cpu_sum(adamw_all):
    """Activations (saved tensors, parameters left out) are the same on every distributed
    strategy: the same rows per rank through the same layers; the single run's (the whole global
    batch) are larger. On CPU the peak row is the sum of the other four."""
    acts = {s: {r: c["activations"] for r, c in categories(adamw_all / s).items()}
            for s in ("single", "ddp", "fsdp", "fsdp2")}
    assert acts["ddp"][0] > 0
    assert acts["ddp"] == acts["fsdp"] == acts["fsdp2"]
    assert acts["single"][0] > acts["ddp"][0]
    for s in acts:
        for cats in categories(adamw_all / s).values():
            assert cats["peak"] == sum(cats[c] for c in ("parameters", "gradients",
                                                         "optimizer_state", "activations"))


def test_saved_activations_count_what_backward_keeps_not_the_weights():
    """Linear(4, 3) -> GELU on x [2, 4]: autograd keeps x for the weight's gradient (32 bytes)
    and GELU's input, the linear output [2, 3] (24 bytes); the weight's transpose it also keeps
    is a view of a parameter, left out. A view of a saved tensor's storage counts once; a slice
    of a larger storage, the part it reaches."""
    import torch

    from tracer.footprint import SavedActivations, storage_bytes

    with torch.random.fork_rng():  # the seed is this test's: the process's RNG put back
        torch.manual_seed(0)
        lin = torch.nn.Linear(4, 3)
        x = torch.randn(2, 4)
    with SavedActivations() as saved:
        y = torch.nn.functional.gelu(lin(x))
    assert saved.bytes == 2 * 4 * FP32 + 2 * 3 * FP32
    y.sum().backward()  # the saved tensors were left intact
    assert lin.weight.grad is not None
    t = torch.zeros(10)
    assert storage_bytes([t, t[2:5], t.view(2, 5), None]) == 10 * FP32
    # a rank's rows of the global batch: x[4:6] of x [8, 4] saved by the linear: its 2 rows,
    # 32 bytes, not the 128-byte batch; with the output [2, 3]: 24 bytes more
    with torch.random.fork_rng():
        torch.manual_seed(0)
        batch = torch.randn(8, 4)
    with SavedActivations() as saved:
        y = torch.nn.functional.gelu(lin(batch[4:6]))
    assert saved.bytes == 2 * 4 * FP32 + 2 * 3 * FP32


def test_cuda_peak_is_the_largest_after_step_0():
    """fixtures/gpu_shaped build.py steps_rows (MiB): rank 0 allocated 300, 420, 410 and reserved
    512, 640, 640 -> (420, 640): step 0 (numerics capture) is left out; a one-step run keeps
    it; CPU rows (no CUDA column) give None."""
    import importlib.util

    from tracer.footprint import peak_from_steps

    spec = importlib.util.spec_from_file_location("gpu_build", REPO / "fixtures" / "gpu_shaped" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    rows = [r for r in build.steps_rows() if r["rank"] == 0]
    assert peak_from_steps(rows) == (420 * 2**20, 640 * 2**20)
    assert peak_from_steps(rows[:1]) == (300 * 2**20, 512 * 2**20)
    cpu = [{**r, "cuda_max_allocated_bytes": None, "cuda_max_reserved_bytes": None} for r in rows]
    assert peak_from_steps(cpu) == (None, None)
