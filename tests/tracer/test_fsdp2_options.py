"""FSDP2's explicit prefetch depth and partial resharding, and the GPU-only settings (issue 45):
the options as RecordConfig fields (refusals in one line), which units each unit prefetches,
the manifest's options, arms and sweeps over them, float8's tolerance. Records: test_fsdp2_record."""

from __future__ import annotations

import json

import pytest

from analyzer.contract.tolerance import float8_tolerance
from tracer.arms import expand_arms
from tracer.cli import arm_parser
from tracer.config import _DEFAULTS, RecordConfig
from tracer.strategies import fsdp2_prefetch_units


def _refusal(**kw) -> str:
    with pytest.raises(ValueError) as exc:
        RecordConfig(**kw)
    return str(exc.value)


def test_prefetch_depth_names_the_next_and_previous_units():
    assert fsdp2_prefetch_units(3, 1, 1) == ([[1], [2], []], [[], [0], [1]])
    assert fsdp2_prefetch_units(3, 2, 2) == ([[1, 2], [2], []], [[], [0], [1, 0]])
    # --forward-prefetch: forward depth 1, backward left to FSDP2's implicit prefetch
    assert fsdp2_prefetch_units(3, 1, 0) == ([[1], [2], []], [[], [], []])
    assert fsdp2_prefetch_units(2, 0, 0) == ([[], []], [[], []])


def test_reshard_after_forward_size_takes_a_proper_divisor_of_the_shard_dimension():
    cfg = RecordConfig(strategy="fsdp2", nproc=4, reshard_after_forward_size=2)
    assert cfg.resolved_reshard_after_forward == 2
    assert cfg.strategy_options()["reshard_after_forward"] == 2
    assert _refusal(strategy="fsdp2", nproc=4, reshard_after_forward_size=3) == (
        "--reshard-after-forward-size 3: must divide the shard dimension's 4 ranks (torch's "
        "reshard_after_forward int: a group size to reshard to)")
    assert _refusal(strategy="fsdp2", nproc=4, reshard_after_forward_size=4) == (
        "--reshard-after-forward-size 4: is --reshard-after-forward (torch maps "
        "reshard_after_forward=4 to True); pass a divisor of 4 other than 1 and 4, or "
        "--reshard-after-forward")
    # hsdp: the shard dimension is S of --mesh R,S
    assert _refusal(strategy="hsdp", nproc=4, mesh="2,2", reshard_after_forward_size=2).startswith(
        "--reshard-after-forward-size 2: is --reshard-after-forward")
    assert "--no-reshard-after-forward" in _refusal(
        strategy="fsdp2", nproc=4, reshard_after_forward_size=2, reshard_after_forward=False)


def test_fsdp2_prefetch_is_fsdp2s_and_not_beside_forward_prefetch():
    assert _refusal(strategy="fsdp", fsdp2_prefetch=2).startswith(
        "--fsdp2-prefetch: --strategy fsdp does not take it (only fsdp2, hsdp, fsdp2_tp)")
    assert _refusal(strategy="fsdp2", fsdp2_prefetch=2, forward_prefetch=True).startswith(
        "--forward-prefetch and --fsdp2-prefetch 2: both set FSDP2's forward prefetch")
    assert _refusal(strategy="fsdp2", fsdp2_prefetch=-1).startswith("--fsdp2-prefetch -1: must be")
    opts = RecordConfig(strategy="fsdp2", fsdp2_prefetch=2).strategy_options()
    assert opts["fsdp2_prefetch"] == {"forward": 2, "backward": 2}
    opts = RecordConfig(strategy="fsdp2", forward_prefetch=True).strategy_options()
    assert opts["fsdp2_prefetch"] == {"forward": 1, "backward": "implicit"}
    assert "float8" not in opts and "async_tp" not in opts


@pytest.mark.parametrize("option, line", [
    ("float8", "--float8: needs --device cuda (float8 matmuls (torch._scaled_mm) run on CUDA GPUs "
               "of compute capability >= 8.9 only); this record runs on cpu: drop it on CPU"),
    ("async_tp", "--async-tp: needs --device cuda (async TP fuses collectives into matmuls over "
                 "CUDA symmetric memory); this record runs on cpu: drop it on CPU"),
])
def test_gpu_only_settings_are_refused_on_cpu_in_one_line(option, line):
    strategy = "fsdp2_tp" if option == "async_tp" else "fsdp2"
    assert _refusal(strategy=strategy, nproc=4, device="cpu", **{option: True}) == line


def test_gpu_only_settings_are_taken_by_their_strategies_only():
    assert _refusal(strategy="ddp", device="cpu", float8=True).startswith(
        "--float8: --strategy ddp does not take it (only fsdp2, hsdp)")
    assert _refusal(strategy="fsdp2", device="cpu", async_tp=True).startswith(
        "--async-tp: --strategy fsdp2 does not take it (only fsdp2_tp)")


def test_float8_and_async_tp_reach_the_workers_argv():
    # the CUDA path's plumbing without a GPU: the options a spawned worker parses
    cfg = RecordConfig(strategy="fsdp2_tp", nproc=4, device="cpu")
    object.__setattr__(cfg, "async_tp", True)  # past the CPU refusal, as on a CUDA machine
    assert "--async-tp" in cfg.to_argv()
    assert cfg.strategy_options()["async_tp"] is True


def _expand(sweeps, **given):
    parse, kinds = arm_parser()
    common = {k: v for k, v in _DEFAULTS.items() if k not in ("strategy", "name")}
    common.update(given)
    return expand_arms([], sweeps, strategy="fsdp2", common=common, given=list(given),
                       parse=parse, option_kinds=kinds)


def test_a_sweep_over_prefetch_depth_and_resharding_declares_both():
    configs = _expand(["fsdp2-prefetch=1,2", "reshard-after-forward-size=2,4"], nproc=8, batch=8)
    assert [c.arm for c in configs] == [
        "fsdp2-prefetch=1+reshard-after-forward-size=2", "fsdp2-prefetch=1+reshard-after-forward-size=4",
        "fsdp2-prefetch=2+reshard-after-forward-size=2", "fsdp2-prefetch=2+reshard-after-forward-size=4"]
    assert json.loads(configs[1].arm_settings) == {
        "fsdp2_prefetch": 1, "reshard_after_forward": 4, "reshard_after_forward_size": 4}


def test_float8_tolerance_is_twice_the_e5m2_and_e4m3_unit_roundoffs():
    tol = float8_tolerance()
    assert (tol.rtol, tol.atol, tol.precision) == (0.375, 1e-5, "float8 tensorwise")
    assert tol.describe().startswith("rtol 0.375, atol 1e-05; 2 (u_e5m2 + u_e4m3)")


def test_float8_on_cuda_without_torchao_is_refused_before_the_record(monkeypatch):
    import importlib.util

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "torchao" else real(name, *a))
    assert _refusal(strategy="fsdp2", float8=True) == (
        "--float8: needs torchao (pip install torchao), not installed here")


def test_async_tp_turns_on_inductors_pass_symmetric_memory_and_compiles_the_blocks(monkeypatch):
    # the CUDA path without a GPU: what apply_async_tp asks of torch, on stand-ins
    import torch
    import torch.distributed._symmetric_memory as symm

    from tracer.gpuonly import apply_async_tp
    from tracer.model import build_model

    groups = []
    monkeypatch.setattr(symm, "enable_symm_mem_for_group", groups.append)
    monkeypatch.setattr(torch._inductor.config, "_micro_pipeline_tp", False)

    class Mesh:
        def get_group(self):
            return type("G", (), {"group_name": "7"})()

    model = build_model(32, 2, 0)
    assert apply_async_tp(model, Mesh(), ["layers.0", "layers.1"]) is True
    assert groups == ["7"] and torch._inductor.config._micro_pipeline_tp is True
    assert all(layer._compiled_call_impl is not None for layer in model.layers)
    assert [n for n, _ in model.named_parameters()][:1] == ["layers.0.attn.weight"]  # FQNs kept
