"""Device and backend resolution, and the rank -> GPU mapping check (pure: no torch import).

The tracer runs one process per rank; on CUDA each process drives the GPU ``LOCAL_RANK`` of its
node. NCCL refuses two ranks of one communicator on the same GPU (it fails at the first
collective with "Duplicate GPU detected"), so with NCCL a node needs at least as many visible
GPUs as it has ranks; gloo has no such limit (ranks share GPUs round-robin). These functions
take the GPU count as an argument so that CPU tests can inject any count.
"""

from __future__ import annotations


def resolve_device_type(requested: str, cuda_available: bool) -> str:
    """``auto`` -> ``cuda`` when ``cuda_available`` else ``cpu``; ``cpu`` / ``cuda`` as given.

    Raises ``ValueError`` ("--device cuda: no CUDA device is available") for ``cuda`` without a
    GPU, or for an unknown name.
    """
    if requested == "auto":
        return "cuda" if cuda_available else "cpu"
    if requested == "cuda" and not cuda_available:
        raise ValueError("--device cuda: no CUDA device is available")
    if requested not in ("cpu", "cuda"):
        raise ValueError(f"--device {requested}: expected auto, cpu or cuda")
    return requested


def resolve_backend(requested: str, device_type: str) -> str:
    """``auto`` -> ``nccl`` on CUDA, ``gloo`` on CPU; an explicit backend is kept.

    Raises ``ValueError`` for ``nccl`` on CPU (NCCL only moves CUDA tensors).
    """
    if requested == "auto":
        return "nccl" if device_type == "cuda" else "gloo"
    if requested == "nccl" and device_type != "cuda":
        raise ValueError("--backend nccl: needs --device cuda (NCCL only moves CUDA tensors)")
    return requested


def check_ranks_fit(*, local_world_size: int, backend: str, device_type: str, gpu_count: int) -> None:
    """Raise ``ValueError`` with one line when this node's ranks cannot run on its GPUs.

    With NCCL on CUDA every local rank needs its own GPU: ``local_world_size <= gpu_count``.
    Nothing is checked on CPU or with gloo. The message names both numbers and the two ways out.
    """
    if device_type != "cuda":
        return
    if gpu_count < 1:
        raise ValueError("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    if backend == "nccl" and local_world_size > gpu_count:
        raise ValueError(
            f"--nproc {local_world_size}: NCCL needs one GPU per rank and this machine has "
            f"{gpu_count} visible GPU{'s' if gpu_count != 1 else ''}; use --nproc {gpu_count} "
            "or --backend gloo")


def gpu_for_local_rank(local_rank: int, gpu_count: int, backend: str) -> int:
    """The CUDA device index of local rank ``local_rank``.

    NCCL: ``local_rank`` itself, which must be < ``gpu_count`` (else ``ValueError`` naming both,
    e.g. torchrun ``--nproc_per_node`` larger than the visible GPUs). gloo: ``local_rank %
    gpu_count`` (ranks may share a GPU).
    """
    if gpu_count < 1:
        raise ValueError("--device cuda: no CUDA device is visible (CUDA_VISIBLE_DEVICES?)")
    if local_rank < 0:
        raise ValueError(f"LOCAL_RANK {local_rank}: must be >= 0")
    if backend == "nccl":
        if local_rank >= gpu_count:
            raise ValueError(
                f"LOCAL_RANK {local_rank}: NCCL needs one GPU per rank and this node has "
                f"{gpu_count} visible GPU{'s' if gpu_count != 1 else ''}; start at most "
                f"{gpu_count} ranks per node")
        return local_rank
    return local_rank % gpu_count
