"""Refusals name the option as the user types it, and say when a value is a default."""
import pytest

from tracer.config import RecordConfig


def _refusal(**kw) -> str:
    with pytest.raises(ValueError) as err:
        RecordConfig(**kw)
    return str(err.value)


def test_default_microbatches_refusal_says_it_is_the_default_and_what_to_pass():
    says = _refusal(strategy="pp", pp_schedule="interleaved-1f1b", pp_virtual=2, hidden=32,
                    layers=8, batch=4, seq=16, nproc=4)
    assert says == ("--microbatches 4 (the default, 2 x --pp 2; not passed): must divide the "
                    "batch of each pipeline 2 (--batch 4 / dp 2); pass --microbatches 2 or --batch 8")


def test_passed_microbatches_refusal_is_unchanged():
    says = _refusal(strategy="pp", pp=2, microbatches=3, batch=8, nproc=4)
    assert says == "--microbatches 3: must divide the batch of each pipeline 4 (--batch 8 / dp 2)"


def test_refusal_spells_the_option_with_dashes():
    says = _refusal(strategy="pp", pp_schedule="interleaved-1f1b", pp_virtual=0, hidden=32,
                    layers=8, batch=4, seq=16, nproc=4)
    assert says == "--pp-virtual 0: must be a positive integer"


def test_float8_on_cuda_without_a_gpu_says_there_is_no_cuda_device():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    says = _refusal(strategy="fsdp2", nproc=2, float8=True, device="cuda")
    assert says == ("--float8: needs a CUDA device (float8 matmuls (torch._scaled_mm) run on CUDA "
                    "GPUs of compute capability >= 8.9 only); --device cuda but no CUDA device "
                    "is available here")
