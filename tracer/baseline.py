"""The single-device baseline every distributed record is compared with, and what is kept of it.

One process runs the model on the whole global batch (same seed, initial weights, data and
precision policy as the ranks, one torch thread) and writes, into the run directory (never
pickle; layout and meaning in analyzer/contract/schemas.py, "kept tensors"):

    baseline.safetensors      the kept golden tensors: batch.x, batch.y (the global batch as
                              the ModelSpec's make_batch returns it: [B, S, H] fp32 for the
                              reference model, [B, S] int64 token ids for hf:), init.<fqn> (initial parameters), grad.<fqn>
                              (step-0 gradients, before the optimizer step), param.<fqn>
                              (parameters after the first optimizer step), loss ([steps] fp64)
    kept.parquet              per kept tensor: summary and sha256 of its stored bytes
    .baseline.activations.safetensors   act.<fqn>: step-0 forward output of each module,
                              [B, S, H or 4H]; the ranks compare with it, then rank 0 removes it
                              before the manifest (hidden: never listed, never kept)
    golden.parquet            with ``--golden``: this baseline against the golden run's tensors
metadata of baseline.safetensors: ``config`` (the fields that determine the numbers, JSON); of
the activations file also ``activation_order``.

With ``--golden PATH`` the batch and the initial state are not drawn from the seed but read from
PATH's baseline.safetensors (byte for byte), so a torch upgrade or a new precision policy is
measured on exactly the golden run's inputs.

Where it runs: ``tracer record`` (no torchrun) computes it in the parent before spawning ranks
(on CUDA in a child process, so the parent holds no GPU memory while ranks run). Under torchrun
there is no parent: global rank 0 runs ``python -m tracer.baseline`` as a child process and every
rank waits at a barrier, so no rank's memory peaks include the baseline. Multi-node runs
therefore need the run directory on a filesystem all nodes share (as the manifest does).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from analyzer.contract.atomic import atomic_path
from analyzer.contract.schemas import GOLDEN_NAME, KEPT_NAME, KEPT_SCHEMA, KEPT_TENSORS_NAME, NUMERICS_SCHEMA, kept_row
from tracer.config import RecordConfig
from tracer.model import precision_context, rank_rows
from tracer.modelspec import load_parameters
from tracer.specload import load_spec
from tracer.numerics import ActivationRecorder, clean_fqn, rows_to_table, tensor_metrics
from tracer.strategies import unit_names
from tracer.training import MixedPrecisionStep, apply_checkpointing, build_optimizer, micro_batches

BASELINE_NAME = KEPT_TENSORS_NAME
ACTIVATIONS_NAME = ".baseline.activations.safetensors"
"""Transient: the ranks' activation references, removed by rank 0 before the manifest."""
BASELINE_FILES = (BASELINE_NAME, ACTIVATIONS_NAME, KEPT_NAME, GOLDEN_NAME)
"""Every file the baseline process may write into a run directory."""
_ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
              torch.int64: "I64", torch.int32: "I32", torch.bool: "BOOL"}
_KEY_FIELDS = ("model", "hidden", "layers", "batch", "seq", "seed", "precision", "optimizer",
               "mixed_precision", "activation_checkpointing")


def baseline_key(cfg: RecordConfig, device_type: str) -> dict:
    """The settings that determine the baseline's numbers (stored in its metadata)."""
    key = {f: getattr(cfg, f) for f in _KEY_FIELDS}
    key["lr"] = cfg.learning_rate
    key["steps"] = cfg.total_steps
    key["device_type"] = device_type
    key["micro_batches"] = micro_batches(cfg)
    if cfg.float8:  # only where on: every other baseline keeps its id
        key["float8"] = True
    if cfg.compile != "none":  # absent when off: the ids of eager configs stay what they were
        key["compile"] = cfg.compile
    return key


def baseline_id(cfg: RecordConfig, device_type: str) -> str:
    """Which baseline ``cfg`` needs: the first 12 hex digits of the SHA-256 of its
    ``baseline_key`` (configs with equal ids share one baseline; manifest ``experiment.baseline``)."""
    import hashlib

    text = json.dumps(baseline_key(cfg, device_type), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def compute_baseline(cfg: RecordConfig, device_type: str,
                     golden: dict[str, torch.Tensor] | None = None) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Run ``cfg.total_steps`` optimizer steps on the global batch, with the training setup of
    tracer/training.py (optimizer, mixed precision emulated, activation checkpointing); return
    (tensors, metadata).

    ``golden``: a golden run's kept tensors; its ``batch.*`` and ``init.*`` replace the seeded
    batch and initial weights. Tensors are on CPU, contiguous. Uses one torch thread, as every
    rank does.
    """
    torch.set_num_threads(1)
    device = torch.device(device_type)
    spec = load_spec(cfg)  # --model: the same spec as every rank's (tracer/specload.py)
    model = spec.model
    if golden is None:
        x, y = spec.make_batch(cfg.batch, cfg.seed)
    else:
        load_parameters(model, golden, "init.")
        x, y = golden["batch.x"].clone(), golden["batch.y"].clone()
    tensors: dict[str, torch.Tensor] = {"batch.x": x, "batch.y": y}
    for name, p in model.named_parameters():
        tensors[f"init.{name}"] = p.detach().clone()
    if cfg.float8:  # the ranks' float8 model (tracer/gpuonly.py), so parity compares like with like
        from tracer.gpuonly import apply_float8

        apply_float8(model)
    if cfg.activation_checkpointing:
        apply_checkpointing(model, unit_names(model, spec))
    compile_like_ranks(model, cfg, spec)
    model.to(device)
    xd, yd = x.to(device), y.to(device)
    opt = build_optimizer(cfg, model.parameters())
    mp = MixedPrecisionStep(model, cfg)
    losses = []
    order: list[str] = []
    for step in range(cfg.total_steps):
        mp.refresh()
        loss, acts = _forward_backward(mp, spec, xd, yd, cfg, device_type, record=step == 0)
        mp.to_master()
        if step == 0:
            for name, out in acts.items():
                tensors[f"act.{name}"] = out
                order.append(name)
            for name, p in named_parameters(model):
                tensors[f"grad.{name}"] = p.grad.detach().cpu().clone()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step == 0:
            for name, p in named_parameters(model):
                tensors[f"param.{name}"] = p.detach().cpu().clone()
        losses.append(loss)
    tensors["loss"] = torch.tensor(losses, dtype=torch.float64)
    meta = {"config": json.dumps(baseline_key(cfg, device_type), sort_keys=True),
            "activation_order": json.dumps(order)}
    return tensors, meta


def compile_like_ranks(model: torch.nn.Module, cfg: RecordConfig, spec) -> None:
    """``--compile``: the baseline's model compiled as the ranks' (tracer/compiling.py), so
    parity compares a compiled run with a compiled reference: ``blocks`` the same units (after
    activation checkpointing, as the ranks), ``model`` the root. No-op for ``none``."""
    from tracer import compiling

    if cfg.compile == "blocks":
        compiling.compile_blocks(model, unit_names(model, spec))
    elif cfg.compile == "model":
        compiling.compile_model(model)


def _forward_backward(mp: MixedPrecisionStep, spec, x: torch.Tensor, y: torch.Tensor,
                      cfg: RecordConfig, device_type: str, *,
                      record: bool) -> tuple[float, dict[str, torch.Tensor]]:
    """One step's forward and backward over the global batch, as ``mp.micro_batches``
    micro-batches of the ranks' rows (tracer/training.py). Returns (loss: the mean of the
    micro-batches' losses, as the analyzer averages the ranks'; with ``record`` each module's
    output, [B, ...] on CPU, the micro-batches' rows concatenated in rank order)."""
    parts = mp.micro_batches
    losses: list[float] = []
    acts: dict[str, list[torch.Tensor]] = {}
    for r in range(parts):
        rows = rank_rows(cfg.batch, parts, r)
        recorder = ActivationRecorder(mp.compute, rows.stop - rows.start) if record else None
        with precision_context(cfg.precision, device_type):
            loss = spec.loss(mp.compute(mp.inputs(x[rows])), y[rows])
        if recorder is not None:
            recorder.__exit__()
            for _, name, out in recorder.items():
                acts.setdefault(name, []).append(out.cpu())
        loss.backward()
        mp.accumulate()
        losses.append(float(loss.detach()))
    joined = {name: torch.cat(outs).contiguous() for name, outs in acts.items()}
    return sum(losses) / parts, joined


def named_parameters(model: torch.nn.Module):
    """(clean FQN, parameter): names without the checkpoint wrapper's part."""
    return ((clean_fqn(n), p) for n, p in model.named_parameters())


def _save_safetensors(tensors: dict[str, torch.Tensor], meta: dict[str, str], path: Path) -> None:
    """Write atomically (analyzer/contract/atomic.py)."""
    with atomic_path(path) as tmp:
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)


def kept_rows(tensors: dict[str, torch.Tensor]) -> list[dict]:
    """KEPT_SCHEMA rows (analyzer.contract.schemas.kept_row) of the kept tensors, in name order."""
    rows = []
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        rows.append(kept_row(name, _ST_DTYPES[t.dtype], list(t.shape), raw, t.to(torch.float64).numpy()))
    return rows


def golden_rows(tensors: dict[str, torch.Tensor], golden: dict[str, torch.Tensor]) -> list[dict]:
    """NUMERICS_SCHEMA rows (rank 0) of this baseline against the golden run's kept tensors:
    loss per step (steps both ran), grad / param at step 0 (TENSOR_METRICS, ref = golden)."""
    rows: list[dict] = []

    def add(step, kind, tensor, seq, metric, value):
        rows.append({"rank": 0, "step": step, "kind": kind, "tensor": tensor, "seq": seq,
                     "metric": metric, "value": value})

    new_loss, old_loss = tensors["loss"].tolist(), golden["loss"].tolist()
    for step in range(min(len(new_loss), len(old_loss))):
        add(step, "loss", "loss", 0, "value", new_loss[step])
        add(step, "loss", "loss", 0, "ref_value", old_loss[step])
    for kind in ("grad", "param"):
        names = [k for k in tensors if k.startswith(kind + ".")]
        for seq, key in enumerate(names):
            if key not in golden:
                continue
            metrics = tensor_metrics(tensors[key], golden[key], replicated=True)
            for metric, value in metrics.items():
                add(0, kind, key[len(kind) + 1:], seq, metric, value)
    return rows


def save_baseline(tensors: dict[str, torch.Tensor], meta: dict[str, str], path: Path, *,
                  golden: dict[str, torch.Tensor] | None = None) -> None:
    """Write the baseline files beside ``path`` (the run dir's baseline.safetensors), each
    atomically: the kept tensors, their kept.parquet rows, the transient activations, and with
    ``golden`` golden.parquet. baseline.safetensors comes last, so its presence means the others
    are whole.

    Raises ``ValueError`` (one line, ``write_failure``) when the folder cannot take the files:
    no space left on the device, read-only, permission denied. The file being written is then
    removed (atomic_path): a failed write leaves no file that looks complete.
    """
    path = Path(path)
    kept = {k: v for k, v in tensors.items() if not k.startswith("act.")}
    acts = {k: v for k, v in tensors.items() if k.startswith("act.")}
    try:
        _save_safetensors(acts, meta, path.with_name(ACTIVATIONS_NAME))
        tables = {KEPT_NAME: rows_to_table(kept_rows(kept), KEPT_SCHEMA)}
        if golden is not None:
            tables[GOLDEN_NAME] = rows_to_table(golden_rows(kept, golden), NUMERICS_SCHEMA)
        for name, table in tables.items():
            with atomic_path(path.with_name(name)) as tmp:
                pq.write_table(table, tmp)
        _save_safetensors(kept, {"config": meta["config"]}, path)
    except Exception as exc:
        failure = write_failure(exc, path.parent)
        if failure is None:
            raise
        raise failure from None


def write_failure(exc: BaseException, folder: Path) -> ValueError | None:
    """The one-line ``ValueError`` for a failed write into ``folder``, or None when ``exc`` is not
    a write failure of the filesystem (a bug: let it propagate).

    Disk full is recognised in each writer's form: ``OSError`` with errno ENOSPC (Python,
    pyarrow: "[errno 28] No space left on device") and safetensors' ``SafetensorError``, which
    carries only the text ("I/O error: No space left on device (os error 28)"). The folder
    named is the one the user chose: the hidden staging folder of ``tracer record`` is replaced
    by its parent, the ``--out`` folder.
    """
    from tracer.rundir import STAGING_PREFIX

    staging = next((p for p in (folder, *folder.parents) if p.name.startswith(STAGING_PREFIX)), None)
    if staging is not None:  # the baselines of declared arms sit in folders under it
        folder = staging.parent
    no_space = os.strerror(errno.ENOSPC)
    if (isinstance(exc, OSError) and exc.errno == errno.ENOSPC) or no_space in str(exc):
        return ValueError(f"{folder}: no space left on device while writing the baseline; "
                          "free space there or choose another --out")
    if isinstance(exc, OSError) and exc.errno is not None:
        return ValueError(f"{folder}: cannot write the baseline ({os.strerror(exc.errno)}); "
                          "choose a writable --out")
    return None


def write_baseline(cfg: RecordConfig, device_type: str, path: Path) -> None:
    """Compute and save the baseline in this process (with ``cfg.golden``: on its batch and
    initial state, and compared with its tensors)."""
    golden = None
    if cfg.golden is not None:
        from tracer.golden import load_golden

        golden = load_golden(cfg.golden)
    tensors, meta = compute_baseline(cfg, device_type, golden)
    save_baseline(tensors, meta, path, golden=golden)


def write_baseline_isolated(cfg: RecordConfig, device_type: str, path: Path) -> None:
    """Compute and save the baseline in a child process (``python -m tracer.baseline``).

    Raises ``ValueError`` with the child's one line when it refused (exit 2: bad golden run,
    no space left, unwritable folder), ``RuntimeError`` with its last stderr line when it
    failed otherwise, exceeded the hang watchdog's limit (``2 * --timeout + HANG_SLACK_S``:
    it imports torch first, slow on a loaded machine) or exited 0 without the file (model code
    ended it: ``sys.exit(0)``, ``os._exit(0)``).
    """
    from tracer.launch import HANG_SLACK_S

    cmd = [sys.executable, "-m", "tracer.baseline", json.dumps(cfg.to_dict()), device_type, str(path)]
    limit_s = 2 * cfg.timeout_s + HANG_SLACK_S  # the ranks' hang watchdog: its torch import counts
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit_s)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"baseline process exceeded {limit_s:g}s (2 x --timeout + "
                           f"{HANG_SLACK_S:g}s, as the hang watchdog)") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        if proc.returncode == _REFUSED and lines:
            raise ValueError(lines[-1])
        raise RuntimeError(f"baseline process failed: {lines[-1] if lines else proc.returncode}")
    if not Path(path).is_file():  # written last (save_baseline): exit 0 without it is not ours
        raise RuntimeError("the model code exited with status 0 during the baseline (sys.exit or "
                           "os._exit), before it was written")


def load_baseline(path: Path, cfg: RecordConfig, device_type: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Load ``baseline.safetensors`` and the activations beside it; returns (tensors on CPU,
    activation order). With ``cfg.golden`` the golden run's grad.* / param.* / loss are added
    under ``golden.<name>``.

    Raises ``ValueError`` when the file was computed for different settings.
    """
    from safetensors import safe_open

    path = Path(path)
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    stored = json.loads(meta.get("config", "{}"))
    wanted = baseline_key(cfg, device_type)
    if stored != wanted:
        raise ValueError(f"{path}: baseline computed for {stored}, this run needs {wanted}")
    acts_path = path.with_name(ACTIVATIONS_NAME)
    with safe_open(str(acts_path), framework="pt") as f:
        order = json.loads((f.metadata() or {})["activation_order"])
    tensors = {**load_file(str(path)), **load_file(str(acts_path))}
    if cfg.golden is not None:
        from tracer.golden import load_golden

        for k, v in load_golden(cfg.golden).items():
            if k.split(".", 1)[0] in ("grad", "param", "loss"):
                tensors[f"golden.{k}"] = v
    return tensors, order


_REFUSED = 2
"""Exit status of ``python -m tracer.baseline`` when it refused with one line (``ValueError``)."""


def _main(argv: list[str]) -> int:
    cfg = RecordConfig(**json.loads(argv[0]))
    try:
        write_baseline(cfg, argv[1], Path(argv[2]))
    except ValueError as exc:  # one line for the parent (write_baseline_isolated), no traceback
        print(str(exc), file=sys.stderr, flush=True)
        return _REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
