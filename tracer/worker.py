"""One rank of a record: the same code under ``tracer record``'s own spawn and under torchrun.

Environment (set by torchrun, or by tracer.launch): RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT; from tracer.launch also PARITYTRACE_LAUNCH=spawn
and PARITYTRACE_CTRL_DIR (heartbeat and error files the launcher reads).

Sequence per rank: init the process group (timeout = ``--timeout``) -> [gated spawn: wait for
the launcher's start signal, the run dir prepared] -> [torchrun: rank 0 clears the run dir and
computes the baseline in a child process; barrier] -> load the baseline -> build, wrap -> steps
under the profiler (step 0 also records numerics, never profiled) -> write the trace, partial
numerics/steps tables -> barrier -> rank 0 merges the tables, writes the manifest last.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.distributed as dist

from analyzer.contract import settings
from analyzer.contract.atomic import atomic_path, write_atomic
from analyzer.contract.errors import ExitCode
from analyzer.contract.schemas import (GOLDEN_METRICS, MEMORY_CATEGORIES_NAME, MEMORY_CATEGORIES_SCHEMA, MEMORY_DIR,
                              MEMORY_PARQUET_NAME, MEMORY_SCHEMA, NUMERICS_NAME, NUMERICS_SCHEMA, RECORDING_NAME,
                              STEPS_NAME, STEPS_SCHEMA, Launch)
from analyzer.contract.strategies import is_reference
from tracer import devices, faults, flightrec, loop
from tracer.baseline import ACTIVATIONS_NAME, BASELINE_NAME, load_baseline, write_baseline_isolated
from tracer.compiling import compile_section, warmup_section
from tracer.config import RecordConfig
from tracer.launch import CTRL_ENV, GO_ENV, LAUNCH_ENV, STORE_FD_ENV, tmpdir_full
from tracer.manifest import build_manifest, machine_info, write_manifest
from tracer.model import precision_context, rank_rows
from tracer.modelspec import ModelSpec, buffer_names
from tracer.specload import load_spec
from tracer.numerics import ActivationRecorder, NumericsRows, rows_to_table, tensor_metrics
from tracer.rundir import PARTS_DIR, clear_run_dir
from tracer.strategies import SETUP, compared_tensors, full_view, tp_activation
from tracer.training import MixedPrecisionStep

log = logging.getLogger(__name__)

_PROCESS_START = time.time()  # after imports (torch): the log shows what follows


@dataclass(kw_only=True, slots=True)
class RankEnv:
    """Where this process sits in the job."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks."""
    local_rank: int
    """Rank on this node (selects the CUDA device)."""
    local_world_size: int
    """Ranks on this node."""
    launch: str
    """"spawn" (tracer record started it), "torchrun" or "single"."""
    ctrl_dir: Path | None
    """Launcher's control folder (spawn only)."""

    @classmethod
    def from_environ(cls, strategy: str) -> "RankEnv":
        """Read the torchrun-style environment; raises ``ValueError`` on a malformed one."""
        env = os.environ
        try:
            rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
            local_rank = int(env.get("LOCAL_RANK", rank))
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        except (KeyError, ValueError) as exc:
            raise ValueError(f"bad torchrun environment: {exc}") from None
        launch = env.get(LAUNCH_ENV, "torchrun")
        if is_reference(strategy) and launch == "spawn":
            launch = "single"
        ctrl = env.get(CTRL_ENV)
        return cls(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                   launch=launch, ctrl_dir=Path(ctrl) if ctrl else None)


class Heartbeat:
    """Writes ``rank<r>.hb`` ("<step> <phase>") in the control folder; the launcher's hang
    watchdog reads its mtime. No-op without a control folder (torchrun)."""

    def __init__(self, env: RankEnv):
        self.path = env.ctrl_dir / f"rank{env.rank}.hb" if env.ctrl_dir else None
        self.step = -1
        self.phase = "start"

    def beat(self, phase: str, step: int | None = None) -> None:
        """Record progress (and log it at INFO with the seconds since the process started)."""
        log.info("%.2fs %s %s", time.time() - _PROCESS_START, phase, "" if step is None else step)
        self.phase = phase
        if step is not None:
            self.step = step
        if self.path is not None:
            self.path.write_text(f"{self.step} {phase}\n")


def wait_for_go(hb: Heartbeat) -> None:
    """Gated start (``GO_ENV`` set by the launcher): block until the launcher has prepared the
    run dir (baseline placed) and sends one byte. Without ``GO_ENV``: return at once.
    Raises ``RuntimeError`` when the launcher closed the pipe without the signal."""
    fd_text = os.environ.pop(GO_ENV, None)
    if fd_text is None:
        return
    hb.beat("wait_for_launcher")
    fd = int(fd_text)
    try:
        got = os.read(fd, 1)
    finally:
        os.close(fd)
    if got != b"g":
        raise RuntimeError("the launcher closed the start signal without sending it (it failed preparing the run dir)")


def resolve_device(cfg: RecordConfig, local_rank: int) -> torch.device:
    """``cfg.device`` resolved (auto: cuda when available). CUDA: this process drives GPU
    ``devices.gpu_for_local_rank`` (NCCL: ``local_rank``, which must exist) and makes it current.
    Raises ``ValueError`` with one line when the GPU is missing."""
    kind = devices.resolve_device_type(cfg.device, torch.cuda.is_available())
    if kind == "cuda":
        backend = devices.resolve_backend(cfg.backend, kind)
        index = devices.gpu_for_local_rank(local_rank, torch.cuda.device_count(), backend)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def check_world(cfg: RecordConfig, env: RankEnv) -> None:
    """Refuse, before any rank waits for another, a world this config cannot run in: ``single``
    with more than one process (torchrun ``--nproc_per_node 2 ... --strategy single``), a global
    batch that does not divide by torchrun's world size, a spawned world of the wrong size.
    Raises ``ValueError`` with one line (every rank exits 2 with it)."""
    if cfg.row.is_reference and env.world_size != 1:
        raise ValueError(f"--strategy {cfg.strategy}: runs one process, not WORLD_SIZE {env.world_size}; "
                         "under torchrun pass --nproc_per_node 1, or record single without torchrun")
    if env.world_size != cfg.world_size and env.launch != "torchrun":
        raise ValueError(f"WORLD_SIZE {env.world_size} != expected {cfg.world_size}")
    if cfg.row.dim_of("stage"):  # the batch splits over dp = W / P pipelines, not W ranks
        from tracer.pipeline import check_world as check_pipeline_world

        check_pipeline_world(cfg, env.world_size)
        return
    dp = env.world_size // (cfg.tp_degree * cfg.pp_degree)  # the ranks that split the batch
    if cfg.batch % dp:
        raise ValueError(f"--batch {cfg.batch}: global batch must divide by the data-parallel size {dp}"
                         + ("" if dp == env.world_size else f" (WORLD_SIZE {env.world_size} / "
                            f"{cfg.tp_degree * cfg.pp_degree})"))


def rendezvous_store(env: RankEnv, timeout: timedelta) -> dist.Store | None:
    """The store of a spawned record's rendezvous, listening on loopback only (issue 43 R10):
    rank 0's TCPStore serves on the socket the launcher bound on 127.0.0.1
    (``launch.STORE_FD_ENV``), the other ranks connect to it, all under the ``default_pg``
    prefix env:// would give. None under torchrun (env://: what torchrun chose, across nodes
    too) and without the socket (rank 0 of an older launcher)."""
    fd = os.environ.pop(STORE_FD_ENV, None)
    if env.launch == "torchrun" or (env.rank == 0 and fd is None):
        return None
    host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if env.rank == 0:
        store = dist.TCPStore(host, port, env.world_size, True, timeout=timeout,
                              master_listen_fd=int(fd))
    else:
        store = dist.TCPStore(host, port, env.world_size, False, timeout=timeout)
    return dist.PrefixStore("default_pg", store)


def run_rank(cfg: RecordConfig, env: RankEnv, hb: Heartbeat) -> None:
    """Everything one rank does; raises on any failure (the caller reports it)."""
    torch.set_num_threads(1)
    load_avg = list(os.getloadavg())  # as the record starts (issue 20), before this run's work
    device = resolve_device(cfg, env.local_rank)
    backend = devices.resolve_backend(cfg.backend, device.type)
    hb.beat("init_process_group")
    flightrec.enable()  # before the first process group: torch reads the buffer size then
    timeout = timedelta(seconds=cfg.timeout_s)
    dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                            timeout=timeout, store=rendezvous_store(env, timeout))
    flightrec.listen(cfg.run_dir, env.rank, env.ctrl_dir)  # the launcher's dump requests
    baseline_path = cfg.run_dir / BASELINE_NAME
    wait_for_go(hb)
    if env.launch == "torchrun":
        if env.rank == 0:
            hb.beat("baseline")
            replaced = clear_run_dir(cfg.run_dir)
            if replaced is not None:  # torchrun: said by rank 0 as it happens (rank-prefixed)
                log.warning("%s: replacing %s", cfg.run_dir, replaced)
            write_baseline_isolated(cfg, device.type, baseline_path)
        dist.barrier()
    base, order = load_baseline(baseline_path, cfg, device.type)
    spec = load_spec(cfg)  # --model, re-created from its string in this process
    buffers, model_name = buffer_names(spec.model), type(spec.model).__name__  # before wrapping
    built = SETUP[cfg.strategy](cfg, spec, base, env.rank, env.world_size, device)
    if built.pipe is not None:
        from tracer.pipeline import PipelineStep

        step = PipelineStep(cfg, built.pipe, base, order, device)
    else:
        step = FlatStep(cfg, spec, built.model, base, env, device)
    numerics, step_rows, snapshot_table, categories = loop.train(cfg, step, base, env.rank, env.world_size,
                                                                 device, hb)
    add_golden_losses(numerics, base)
    hb.beat("write")
    write_rank_outputs(cfg, env.rank, numerics, step_rows, snapshot_table, categories)
    dist.barrier()
    if env.rank == 0:
        hb.beat("manifest")
        merge_parts(cfg.run_dir, env.world_size, with_memory=snapshot_table is not None)
        finish_kept(cfg)
        launch = Launch(method=env.launch, nnodes=max(1, env.world_size // max(1, env.local_world_size)),
                        master_addr=os.environ.get("MASTER_ADDR"),
                        master_port=int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None)
        manifest = build_manifest(cfg=cfg, run_dir=cfg.run_dir, world_size=env.world_size,
                                  backend=backend, device=device, launch=launch,
                                  num_params=built.num_params, fsdp_units=built.units, spec=spec,
                                  model_name=model_name, buffers=buffers, batch_x=base["batch.x"],
                                  machine=machine_info(load_avg, env.local_world_size), mesh=built.mesh,
                                  applied=built.applied,
                                  compiled=compile_section(cfg, built.model),
                                  warmup=warmup_section(cfg, step_rows))
        write_manifest(cfg.run_dir, manifest)
    hb.beat("done")


class FlatStep:
    """tracer/loop.py ``Step`` of a strategy that runs the whole model on every rank: one
    "forward", one "backward" on the rank's rows; the reference's ``--mixed-precision`` is the
    baseline's emulation (it has no FSDP to apply it). Its loss is its dp rows' (the T tp ranks
    of a dp group share it: the analyzer's mean over the W ranks, equal weights, is the global
    batch's mean); no step-0 rows for the reference."""

    def __init__(self, cfg: RecordConfig, spec: ModelSpec, model: torch.nn.Module, base: dict[str, torch.Tensor],
                 env: RankEnv, device: torch.device):
        self.cfg, self.spec, self.model, self.base, self.device = cfg, spec, model, base, device
        self.rank, self.world = env.rank, env.world_size
        self.reference = cfg.row.is_reference
        mixed = self.reference and cfg.mixed_precision is not None
        self.mp = MixedPrecisionStep(model, cfg, parts=1) if mixed else None
        dp_rank, dp_size = loop.dp_coords(cfg, self.rank, self.world)
        self.rows = rank_rows(cfg.batch, dp_size, dp_rank)
        self.loss: list[torch.Tensor] = []

    def recorder(self) -> ActivationRecorder:
        return ActivationRecorder(self.model, self.rows.stop - self.rows.start)

    def forward_backward(self, x, y, step, saved) -> list[torch.Tensor]:
        cfg, mp = self.cfg, self.mp
        if mp is not None:
            mp.refresh()
        forward = self.model if mp is None else (lambda inputs: mp.compute(mp.inputs(inputs)))
        with faults.grad_sync_context(self.model, cfg.fault):
            with torch.profiler.record_function("forward"), precision_context(cfg.precision, self.device.type), saved:
                # refilled, not replaced: the loop holds the list, the previous loss dies here (memory peaks)
                self.loss[:] = [self.spec.loss(forward(x), y)]
            faults.hang_before_backward(cfg.fault, self.rank, step)
            with torch.profiler.record_function("backward"):
                self.loss[0].backward()
                if mp is not None:
                    mp.accumulate()
                    mp.to_master()
        return self.loss

    def compare(self, numerics: NumericsRows, kind: str, recorder: ActivationRecorder) -> None:
        if self.reference:
            return
        if kind == "grad":
            record_activations(self.cfg, recorder, self.base, numerics, self.rank, self.rows)
        record_compared(self.cfg, self.model, self.base, numerics, kind, self.rank, self.world)

    def losses(self, values: list[float]) -> list[float]:
        return values


def write_rank_outputs(cfg: RecordConfig, rank: int, numerics: NumericsRows, step_rows: list[dict],
                       snapshot_table: pa.Table | None, categories: pa.Table) -> None:
    """This rank's partial tables, for rank 0 to merge."""
    parts = cfg.run_dir / PARTS_DIR
    parts.mkdir(exist_ok=True)
    tables = {"numerics": numerics.table(), "steps": rows_to_table(step_rows, STEPS_SCHEMA),
              "memory": snapshot_table, "categories": categories}
    for kind, table in tables.items():
        if table is not None:
            with atomic_path(parts / f"rank{rank}.{kind}.parquet") as tmp:
                pq.write_table(table, tmp)


def finish_kept(cfg: RecordConfig) -> None:
    """Before the manifest: drop the transient activation references, and with
    ``--keep-tensors summaries`` the kept tensors too (kept.parquet stays)."""
    (cfg.run_dir / ACTIVATIONS_NAME).unlink(missing_ok=True)
    if cfg.keep_tensors == "summaries":
        (cfg.run_dir / BASELINE_NAME).unlink(missing_ok=True)


def add_golden_losses(numerics: NumericsRows, base: dict[str, torch.Tensor]) -> None:
    """With ``--golden``: the golden baseline's loss per step as ``golden_ref_value`` rows."""
    if "golden.loss" not in base:
        return
    steps = {r["step"] for r in numerics.rows if r["kind"] == "loss"}
    for step, value in enumerate(base["golden.loss"].tolist()):
        if step in steps:
            numerics.add(step, "loss", "loss", 0, "golden_ref_value", value)


def record_activations(cfg: RecordConfig, recorder: ActivationRecorder, base: dict[str, torch.Tensor],
                       numerics: NumericsRows, rank: int, rows: slice) -> None:
    """Step-0 activations vs the baseline's rows of this rank's dp index (``rows``); fsdp2_tp:
    of those, the part this tp rank compares (``strategies.tp_activation``: the tp ranks of a
    dp group partition each output, so the reader's sums count every element once)."""
    tp = cfg.tp_degree
    for seq, name, out in recorder.items():
        if f"act.{name}" not in base:  # dim 0 is the rank's row count only by coincidence
            continue
        ref = base[f"act.{name}"][rows]
        if tp > 1:
            pair = tp_activation(out, ref, tp, rank % tp)
            if pair is None:
                continue
            out, ref = pair
        numerics.add_tensor(0, "activation", name, seq, tensor_metrics(out, ref, replicated=False))


def record_compared(cfg, model, base, numerics: NumericsRows, kind: str, rank: int,
                    world: int) -> None:
    """Step-0 ``kind`` tensors ("grad" before the optimizer step, "param" after it) vs the
    baseline, and with ``--golden`` vs the golden run's kept ones as GOLDEN_METRICS rows
    (analyzer/contract/schemas.py)."""
    golden = any(k.startswith(f"golden.{kind}.") for k in base)
    with full_view(model, cfg.strategy, with_grads=kind == "grad"):
        for prefix in (f"{kind}.", f"golden.{kind}.") if golden else (f"{kind}.",):
            for seq, fqn, local, ref, replicated in compared_tensors(
                    model, cfg.strategy, kind, rank, world, base, prefix):
                m = tensor_metrics(local, ref, replicated=replicated)
                if prefix == f"{kind}.":
                    numerics.add_tensor(0, kind, fqn, seq, m)
                    continue
                for metric in GOLDEN_METRICS:
                    numerics.add(0, kind, fqn, seq, metric, m[metric[len("golden_"):]])


def merge_parts(run_dir: Path, world: int, *, with_memory: bool, ranks: list[int] | None = None) -> None:
    """Concatenate every rank's partial tables into the run-dir files, then drop the parts.
    ``ranks``: the ranks that wrote them (default ``range(world)``; a projection: its roles)."""
    parts = run_dir / PARTS_DIR
    targets = [("numerics", NUMERICS_SCHEMA, run_dir / NUMERICS_NAME),
               ("steps", STEPS_SCHEMA, run_dir / STEPS_NAME),
               ("categories", MEMORY_CATEGORIES_SCHEMA, run_dir / MEMORY_CATEGORIES_NAME)]
    if with_memory:
        targets.append(("memory", MEMORY_SCHEMA, run_dir / MEMORY_DIR / MEMORY_PARQUET_NAME))
    for kind, schema, target in targets:
        tables = []
        for r in range(world) if ranks is None else ranks:
            part = parts / f"rank{r}.{kind}.parquet"
            if not part.exists():
                raise RuntimeError(f"rank {r} wrote no {kind} table ({part})")
            tables.append(read_part(part, schema))
        merged = pa.concat_tables(tables)
        if kind == "numerics":
            merged = merged.unify_dictionaries().combine_chunks()
        with atomic_path(target) as tmp:
            pq.write_table(merged.cast(schema), tmp)
    for f in parts.iterdir():
        f.unlink()
    parts.rmdir()


def read_part(path: Path, schema: pa.Schema) -> pa.Table:
    """A partial table as ``schema``. ``pq.ParquetFile.read``, not ``pq.read_table``: the
    latter goes through pyarrow.dataset, which imports pandas (0.3 s of CPU, never needed here).
    Raises ``ValueError`` (pyarrow's ArrowInvalid) when the columns do not cast to ``schema``."""
    with pq.ParquetFile(path) as f:
        return f.read().select(schema.names).cast(schema)


def _first_line(exc: BaseException) -> str:
    """``Type: first non-empty line of the message`` (``Type`` alone without one)."""
    text = next((ln.strip() for ln in str(exc).splitlines() if ln.strip()), "")
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def write_error(env: RankEnv, step: int, exc: BaseException, full: str | None = None) -> str:
    """Write this rank's first error for the launcher (``rank<r>.error.json``); return its line:
    ``full`` (``tmpdir_full``'s line) when the temporary folder is full, whatever ``exc`` says
    (a write cut short there surfaces as anything, e.g. a JSONDecodeError of a truncated export).
    A write of the error file that fails (in a full TMPDIR) is skipped: the launcher then reads
    the rank's log and the temporary folder itself. An exception raised from another (``raise
    ... from``) names its root cause too: torch's pipeline stage wraps a model's error in
    "[Stage 0] failed to run forward:", whose first line says nothing of why."""
    line = _first_line(exc)
    root, seen = exc, {id(exc)}
    while root.__cause__ is not None and id(root.__cause__) not in seen:
        root = root.__cause__
        seen.add(id(root))
    if root is not exc:  # a wrapper's line ("[Stage 0] failed to run forward:") hides the reason
        line += f" (caused by {_first_line(root)})"
    if isinstance(exc, SystemExit):  # no code of the tracer's exits inside run_rank
        line = f"the model code exited with status {exc.code} (sys.exit) during the record"
    line = full or line
    if env.ctrl_dir is not None:
        payload = json.dumps({"rank": env.rank, "time": time.time(), "step": step, "error": line})
        try:
            write_atomic(env.ctrl_dir / f"rank{env.rank}.error.json", payload)
        except OSError:
            pass
    return line


def dump_flight_recorder(cfg: RecordConfig, env: RankEnv) -> None:
    """A failing rank's Flight Recorder dump (tracer/flightrec.py), before its error is reported
    (the launcher stops its peers once it sees the error): only once its process group is up,
    and only into a run dir this record is writing (its marker present: never into a previous
    record's complete run dir, under torchrun before rank 0 cleared it)."""
    if dist.is_available() and dist.is_initialized() and (cfg.run_dir / RECORDING_NAME).exists():
        flightrec.dump(cfg.run_dir, env.rank)


def keep_traceback(cfg: RecordConfig, env: RankEnv) -> str:
    """Keep the traceback of the exception being handled where it helps and does not clutter:
    spawned by ``tracer record``, stderr is the rank's log (the launcher names its folder), so
    it goes there; under torchrun stderr is the user's terminal, which gets only the one line,
    so it goes to a temp file. Returns the text to append to that line ("" or " (traceback:
    PATH)")."""
    if env.ctrl_dir is not None:
        traceback.print_exc()
        return ""
    try:
        fd, name = tempfile.mkstemp(prefix=f"tracer-{cfg.run_name}-rank{env.rank}-", suffix=".traceback.txt")
        with os.fdopen(fd, "w") as f:
            traceback.print_exc(file=f)
    except OSError:  # nowhere to put it (a full /tmp): the line alone
        return ""
    return f" (traceback: {name})"


def worker_main(cfg: RecordConfig) -> None:
    """Run this rank and exit the process: 0 on success; 1 after reporting the first error.

    Exits with ``os._exit`` either way, after flushing: after a failure no atexit handler or
    process-group destructor can block on a dead or hung peer; after a success every file is
    written and closed, and the teardown with torch loaded costs ~1 s of CPU per rank."""
    try:
        env = RankEnv.from_environ(cfg.strategy)
        check_world(cfg, env)
    except ValueError as exc:  # bad options or environment: one line, no rank started
        sys.stderr.write(f"tracer: {exc}\n")  # one write: each rank under torchrun says it
        sys.stderr.flush()
        _exit_now(ExitCode.BAD_INPUT)
    logging.basicConfig(level=settings.log_level(), format=f"[rank{env.rank}] %(levelname)s %(name)s: %(message)s")
    said = _keep_stdout_for_the_tracer() if env.launch == "torchrun" else None
    hb = Heartbeat(env)
    try:
        run_rank(cfg, env, hb)
    except BaseException as exc:  # process boundary: report any failure (incl. Ctrl-C) and die
        dump_flight_recorder(cfg, env)
        full = tmpdir_full(env.ctrl_dir.parent if env.ctrl_dir is not None
                           else Path(tempfile.gettempdir()))
        line = write_error(env, hb.step, exc, full)
        where = "" if full else keep_traceback(cfg, env)  # a full TMPDIR: the line alone
        # one write, newline included: another process's line landed between print's two writes
        sys.stderr.write(f"tracer: rank {env.rank} failed at step {hb.step} ({hb.phase}): "
                         f"{line}{where}\n")
        sys.stderr.flush()
        _exit_now(ExitCode.INTERNAL)
    if env.launch == "torchrun" and env.rank == 0:  # the launcher says it otherwise (tracer.cli)
        if said is None:
            print(f"recorded {cfg.run_dir}", flush=True)
        else:
            sys.stdout.flush()
            os.write(said, f"recorded {cfg.run_dir}\n".encode())
    if dist.is_initialized():
        dist.destroy_process_group()
    logging.shutdown()  # flush and close the log handlers (the atexit hook os._exit skips)
    _exit_now(0)


def _keep_stdout_for_the_tracer() -> int | None:
    """Under torchrun the rank's stdout is the user's: point fd 1 at stderr for the rest of
    the rank, so what model code prints (even a line like ``recorded traces/ddp``) goes to
    stderr, and return a duplicate of the original stdout, on which only the tracer's own
    ``recorded`` line is written. None when the descriptors cannot be set up (then as before)."""
    try:
        sys.stdout.flush()
        kept = os.dup(1)
        os.dup2(2, 1)
    except OSError:
        return None
    return kept


def _exit_now(code: int) -> None:
    """Flush the standard streams, then end the process without the interpreter's teardown."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
