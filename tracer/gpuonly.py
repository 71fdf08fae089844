"""GPU-only training settings (issue 45): float8 training through torchao and async tensor
parallel. ``RecordConfig`` refuses both on CPU before anything runs (tracer/config.py
``_check_gpu_only``); these functions are the CUDA path, called by tracer/strategies.py (the
ranks) and tracer/baseline.py (float8: the baseline trains the same float8 model, so parity
compares like with like; its tolerance: analyzer/contract/tolerance.py ``float8_tolerance``).
"""

from __future__ import annotations

from torch import nn

FLOAT8_DIVISOR = 16
"""``torch._scaled_mm`` needs both matrix dimensions of a float8 operand divisible by 16; a
Linear whose in or out features are not is left in high precision (torchtitan's filter)."""


def float8_linear(module: nn.Module, _fqn: str) -> bool:
    """torchao's ``module_filter_fn``: True for an ``nn.Linear`` whose in and out features are
    multiples of ``FLOAT8_DIVISOR`` (the ones ``torch._scaled_mm`` takes)."""
    return (isinstance(module, nn.Linear) and module.in_features % FLOAT8_DIVISOR == 0
            and module.out_features % FLOAT8_DIVISOR == 0)


def apply_float8(model: nn.Module) -> int:
    """``torchao.float8.convert_to_float8_training`` on ``model`` in place, torchao's default
    config (tensorwise dynamic scaling: inputs and weights in float8_e4m3fn, the output
    gradient in float8_e5m2), ``float8_linear`` choosing the layers. Parameter names do not
    change (``Float8Linear`` is an ``nn.Linear``). Returns the number of Linear layers
    converted. Raises ``RuntimeError`` with one line when torchao is not installed or no Linear
    qualifies (a float8 run that trains nothing in float8 is not one)."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as exc:
        raise RuntimeError(f"--float8 needs torchao (pip install torchao): {exc}") from None
    convert_to_float8_training(model, module_filter_fn=float8_linear)
    converted = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
    if not converted:
        raise RuntimeError(f"--float8: no Linear layer has in and out features divisible by "
                           f"{FLOAT8_DIVISOR}; nothing would train in float8")
    return converted


def apply_async_tp(model: nn.Module, tp_mesh, units: list[str]) -> bool:
    """Async TP for fsdp2_tp (torch 2.13 ``torch.distributed.tensor.parallel`` docs, as
    torchtitan's ``maybe_enable_async_tp``): symmetric memory on the tp group
    (``torch.distributed._symmetric_memory.enable_symm_mem_for_group``), inductor's
    micro-pipeline TP pass on (``torch._inductor.config._micro_pipeline_tp = True``), which
    fuses each TP all_gather / reduce_scatter with its matmul in compiled code only, so every
    unit of ``units`` (module FQNs, the transformer blocks) is compiled in place
    (``nn.Module.compile``: parameter names keep their FQN). Returns True (the manifest's
    ``async_tp``). Called after ``apply_tp`` and before ``fully_shard``."""
    import torch
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    from tracer.numerics import clean_fqn

    torch._inductor.config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)
    for name in units:
        model.get_submodule(clean_fqn(name)).compile()
    return True
