"""``tracer project``: a record's training step at world size N, from one process (issue 44).

Each distinct role of the job runs as rank r of a world of N on torch's fake process group
(torch/testing/_internal/distributed/fake_pg.py: ``FakeProcessGroup``, which completes every
collective at once and moves no data), under the profiler, on this device. The step is the
record's own: the strategy's setup hook (tracer/strategies.py ``SETUP``), the record's step
(tracer/worker.py ``FlatStep``, tracer/pipeline.py ``PipelineStep``) and loop (tracer/loop.py
``train``), the same trace, memory categories, steps and manifest writers. So the run directory
reads like a record's, with ``rank<r>.trace.json.gz`` for each role's rank only, and a manifest
whose ``projection`` section (analyzer/contract/schemas.py ``Projection``) says so.

What it gives at N: each role's local shapes, every collective call (kind, process group,
dtype, bytes) and memory per rank by category. What it does not: numerics (a fake collective
returns whatever its output buffer held: the analyzer says "not verified", never pass / fail),
step time at N (a later part of issue 44: the link model).

Collective identity: the fake group runs no transfer op (gloo's ``gloo:*`` ops carry a record's
dtype and bytes), so the analyzer counts each call's ``c10d::*`` op instead, once
(analyzer/ingest/classify.py ``FAKE_BACKEND``: a tensor-parallel call's
``_c10d_functional::*`` op around it is not counted again); and a ``c10d::*`` op that takes
tensor lists records no dtype, so on the fake group the tracer's process-group tag carries the
call's first tensor, a torch.distributed call's and a funcol call's alike (tracer/pgtag.py
``tensor_note``, ``schemas.PG_TAG_PREFIX``). A collective torch issues from C++, outside the
Python calls the tag wraps (DDP's bucket rebuild broadcast in its second iteration), has its
kind and process group but no bytes (-1, unknown) in a projection.

Roles: the ranks whose shapes differ (``roles``), each in a child process of its own, one
after another (``run_role_isolated``: a process keeps its process groups by name).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tracer.config import RecordConfig
from tracer.fakeproject import (FakeOptions, check_fake_tensors, decide_fake_tensors, fake_projection,
                                shapes_only)

log = logging.getLogger(__name__)

FAKE_BACKEND = "fake"
"""``torch.distributed.Backend.FAKE``: registered by importing
torch.testing._internal.distributed.fake_pg."""


def roles(cfg: RecordConfig) -> list[int]:
    """The global ranks a projection runs: one per distinct role of the job.

    Flat strategies and hsdp: rank 0. Every rank issues the same collectives with the same
    shapes and holds the same parameter and gradient bytes (FSDP2 pads each shard to
    ``ceil(dim0 / S)`` rows, torch/distributed/fsdp/_fully_shard/_fsdp_param.py; FSDP1 pads its
    flat parameter to a multiple of N). Not quite everything: AdamW's state follows each rank's
    unpadded local view, smaller on the last ranks where a dim 0 does not divide by the shard
    group (analyzer/analyses/sharding.py gives every rank's); the projection measures rank 0's,
    the largest. fsdp2_tp: ranks 0..T-1, the tp group of dp index 0 (the (dp, tp) mesh is
    row-major). A split that does not divide evenly gives tp ranks different local shapes
    (DTensor ``Shard`` cuts as ``torch.chunk``: 10 features over 3 tp ranks are 4, 4 and 2;
    tests/tracer/test_project.py projects and grades it); with an even one they hold and send
    the same, and T is small. pp: ranks 0..P-1, one per stage (the (dp, pp) mesh is
    row-major: rank = dp * P + stage, ``schemas.Mesh``)."""
    row = cfg.row
    if row.dim_of("stage"):
        return list(range(cfg.pp_degree))
    if row.dim_of("tensor"):
        return list(range(cfg.tp_degree))
    return [0]


def check_projection(cfg: RecordConfig) -> None:
    """Refuse what a projection cannot run, with one line naming the option (``ValueError``):
    the reference (it runs one process, nothing to project), a world under 2, a fault canary
    (no numerics to catch it), and a world the batch or mesh does not divide
    (tracer/worker.py ``check_world``, the record's own check)."""
    from tracer.worker import RankEnv, check_world

    if cfg.row.is_reference:
        raise ValueError(f"--strategy {cfg.strategy}: the single-device reference has no world "
                         "to project; choose a distributed strategy")
    if cfg.world_size < 2:
        raise ValueError(f"--nproc {cfg.world_size}: a projection is of a world of 2 ranks or "
                         "more; pass the world size to project")
    if cfg.fault is not None:
        raise ValueError(f"--fault {cfg.fault}: a fault canary plants a numerics error, and a "
                         "projection computes no numerics to catch it; drop --fault")
    env = RankEnv(rank=0, world_size=cfg.world_size, local_rank=0, local_world_size=1,
                  launch="project", ctrl_dir=None)
    check_world(cfg, env)


def co_runners(device_type: str, world: int, ranks_per_node: int | None,
               fake_tensors: bool = False) -> int:
    """Copies of a role run at once to measure its compute: on CPU the target node's ranks
    (``ranks_per_node``, default the whole world), at most this machine's usable CPUs, so the
    compute carries what the node's other ranks cost it (shared cores' caches and memory
    bandwidth, SMT siblings: measured here, two copies of a 2-rank ddp step on 2 vCPUs took
    1.7-2x one copy's time, as the real 2-rank record's compute did). Time-sharing beyond the
    CPUs is the analyzer's (``ProjectedStep.compute_scale``). On a GPU 1: a rank per device;
    with fake tensors 1: no compute is measured (tracer/fakeproject.py estimates it)."""
    if device_type != "cpu" or fake_tensors:
        return 1
    return max(1, min(ranks_per_node or world, len(os.sched_getaffinity(0))))


def project(cfg: RecordConfig, fake: FakeOptions | None = None, *,
            ranks_per_node: int | None = None) -> Path:
    """Project ``cfg`` (a record's options; ``cfg.nproc`` the world N) into ``cfg.run_dir``.

    Claims the run dir as a record does (tracer/record.py ``claim_run_dirs``), writes the
    record's inputs in this process (initial weights, batch; no numerics baseline:
    tracer/projinputs.py), runs every role of ``roles`` in a child process of its own, one
    after another, each beside its ``co_runners`` - 1 twins (``run_role_isolated``), and
    writes the manifest last, with ``ranks_per_node`` (the target's; None: the world) and the
    co-runners. Returns the run dir. Raises ``ValueError`` (one line) for options a projection
    refuses or a run dir it may not write, ``RuntimeError`` with the child's last line when a
    role fails (the run dir is then left incomplete, no manifest). ``fake``:
    tracer/fakeproject.py ``FakeOptions`` (default: real tensors); with fake tensors (asked,
    or decided: ``decide_fake_tensors``) no inputs file is computed but the batch's."""
    from dataclasses import replace

    import torch

    from tracer import devices
    from analyzer.contract.schemas import RECORDING_NAME
    from tracer.baseline import BASELINE_NAME
    from tracer.projinputs import write_projection_inputs
    from tracer.record import _release, claim_run_dirs
    from tracer.rundir import abandon_record, clear_run_dir, finish_record

    check_projection(cfg)
    device_type = devices.resolve_device_type(cfg.device, torch.cuda.is_available())
    cfg = replace(cfg, device=device_type)
    fake = fake or FakeOptions()
    fake = replace(fake, fake_tensors=decide_fake_tensors(cfg, device_type, fake))
    if fake.fake_tensors:
        check_fake_tensors(cfg)
    elif fake.device_tflops is not None:  # undecided, then real: the ops' times are measured
        log.warning("--device-tflops / --device-mem-gbps unused: the model fits, real tensors "
                    "measure each op on %s", device_type)
    claim_run_dirs([cfg])
    try:
        replaced = clear_run_dir(cfg.run_dir)
        # the marker's second line: the analyzer's clean-up hint says tracer project, not record
        fd = os.open(cfg.run_dir / RECORDING_NAME, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        with os.fdopen(fd, "a") as marker:
            marker.write("project\n")
        if replaced is not None:
            log.warning("%s: replacing %s", cfg.run_dir, replaced)
        write_projection_inputs(cfg, device_type, cfg.run_dir / BASELINE_NAME, fake.fake_tensors)
        ranks = roles(cfg)
        co = co_runners(device_type, cfg.world_size, ranks_per_node, fake.fake_tensors)
        twin_ns = {str(rank): run_role_isolated(cfg, rank, fake, co=co) for rank in ranks}
        write_projection_manifest(cfg, ranks, fake, ranks_per_node=ranks_per_node or cfg.world_size,
                                  co=co, twin_ns={k: v for k, v in twin_ns.items() if v})
        finish_record(cfg.run_dir)
    except BaseException:
        abandon_record(cfg.run_dir)
        raise
    finally:
        _release([cfg])
    return cfg.run_dir


def run_role_isolated(cfg: RecordConfig, rank: int, fake: FakeOptions | None = None, *,
                      co: int = 1) -> list[int]:
    """``run_role`` in a child process (``python -m tracer.project``): DTensor and DeviceMesh
    keep process groups by name across ``destroy_process_group`` (measured: a second role of
    fsdp2_tp in one process fails with "Could not resolve the process group registered under
    the name 1"), so every role gets a fresh process. With ``co`` > 1, ``co`` - 1 twins run
    the same role at the same time, each into a scratch run dir of its own (removed after):
    the node's other ranks (``co_runners``). Returns the twins' profiled step wall times (ns).
    Raises ``RuntimeError`` with the child's last stderr line when it, or a twin, fails."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile
    from dataclasses import replace

    from dataclasses import asdict

    def start(c: RecordConfig) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "tracer.project", json.dumps(c.to_dict()),
                                 str(rank), json.dumps(asdict(fake or FakeOptions()))],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    with tempfile.TemporaryDirectory(prefix="paritytrace-twins-") as tmp:
        twins = []
        for k in range(1, co):
            twin = replace(cfg, out=tmp, name=f"twin{k}")
            twin.run_dir.mkdir(parents=True)
            for f in cfg.run_dir.iterdir():  # the inputs' files: all the run dir holds yet
                if f.is_file():
                    shutil.copyfile(f, twin.run_dir / f.name)
            twins.append(twin)
        procs = [start(cfg)] + [start(t) for t in twins]
        errs = [p.communicate()[1] for p in procs]
        for who, proc, err in zip(["rank"] + ["a twin of rank"] * len(twins), procs, errs):
            if proc.returncode != 0:
                lines = [ln for ln in err.strip().splitlines() if ln.strip()]
                raise RuntimeError(f"{who} {rank} of the projection failed: "
                                   f"{lines[-1] if lines else f'exit {proc.returncode}'}")
        return [ns for t in twins for ns in _profiled_wall_ns(t, rank)]


def _profiled_wall_ns(cfg: RecordConfig, rank: int) -> list[int]:
    """The profiled steps' wall times of ``rank`` in ``cfg``'s partial steps table (a twin's:
    more samples of the role's compute under the same contention)."""
    import pyarrow.parquet as pq

    from tracer.rundir import PARTS_DIR

    t = pq.read_table(cfg.run_dir / PARTS_DIR / f"rank{rank}.steps.parquet",
                      columns=["profiled", "wall_ns"]).to_pylist()
    return [int(r["wall_ns"]) for r in t if r["profiled"] and r["wall_ns"] is not None]


def _role_facts_path(cfg: RecordConfig, rank: int) -> Path:
    from tracer.rundir import PARTS_DIR

    return cfg.run_dir / PARTS_DIR / f"rank{rank}.role.json"


def run_role(cfg: RecordConfig, rank: int, cost=None, fake: FakeOptions | None = None) -> None:
    """Rank ``rank`` of a world of ``cfg.world_size`` on the fake group, in this process: the
    record's setup, step and loop (tracer/worker.py ``run_rank`` without its rendezvous,
    barriers and launcher), its trace and partial tables written, and the facts the manifest
    needs (``_role_facts_path``: parameter count, units, mesh, model class, buffers; with fake
    tensors the compute estimate). ``cost``: the role's tracer/fakeproject.py ``OpCost`` when it
    runs under FakeTensorMode (``fake_role``), else None."""
    import msgspec
    import torch
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from tracer import loop
    from tracer.baseline import BASELINE_NAME, load_baseline
    from tracer.modelspec import buffer_names
    from tracer.fakeproject import fake_inputs, fake_step_outputs
    from tracer.projinputs import Unverified
    from tracer.specload import load_spec
    from tracer.strategies import SETUP
    from tracer.worker import FlatStep, Heartbeat, RankEnv, add_golden_losses, resolve_device, write_rank_outputs

    torch.set_num_threads(1)  # as a record's rank
    world = cfg.world_size
    env = RankEnv(rank=rank, world_size=world, local_rank=0, local_world_size=1,
                  launch="project", ctrl_dir=None)
    device = resolve_device(cfg, 0)  # every role on this one device
    dist.init_process_group(FAKE_BACKEND, rank=rank, world_size=world, store=FakeStore())
    if cost is None:
        base, order = load_baseline(cfg.run_dir / BASELINE_NAME, cfg, device.type)
    else:  # fake tensors: no real inputs (tracer/fakeproject.py)
        base, order = fake_inputs(cfg), []
    spec = load_spec(cfg)
    buffers, model_name = buffer_names(spec.model), type(spec.model).__name__
    built = SETUP[cfg.strategy](cfg, spec, base, rank, world, device)
    if built.pipe is not None:
        from tracer.pipeline import PipelineStep

        step = PipelineStep(cfg, built.pipe, base, order, device)
    else:
        step = FlatStep(cfg, spec, built.model, base, env, device)
    step = Unverified(step, losses_kept=cost is None, cost=cost)  # no baseline (tracer/projinputs.py)
    numerics, step_rows, snapshot, categories = loop.train(cfg, step, base, rank, world, device,
                                                           Heartbeat(env))
    if cost is not None:  # fake storage is not allocated: no allocator peaks (tracer/fakeproject.py)
        step_rows, categories = fake_step_outputs(rank, step_rows, categories)
    add_golden_losses(numerics, base)
    write_rank_outputs(cfg, rank, numerics, step_rows, snapshot, categories)
    facts = {"num_params": built.num_params, "units": built.units, "mesh": built.mesh,
             "model_name": model_name, "buffers": buffers, "device": str(device),
             "with_memory": snapshot is not None,
             "compute_estimate": None if cost is None else cost.rows(rank, fake or FakeOptions()),
             "live_peak_bytes": None if cost is None else cost.live.peak}
    _role_facts_path(cfg, rank).write_bytes(msgspec.json.encode(facts))


def write_projection_manifest(cfg: RecordConfig, ranks: list[int], fake: FakeOptions | None = None,
                              *, ranks_per_node: int | None = None, co: int = 1,
                              twin_ns: dict[str, list[int]] | None = None) -> None:
    """Merge the roles' partial tables and write the manifest (tracer/manifest.py
    ``build_manifest``, the first role's facts) with its ``projection`` section; backend
    ``"fake"``; with fake tensors the section's fake-tensor fields (``fake_projection``)."""
    import msgspec
    import torch

    from analyzer.contract.schemas import Launch, Mesh, Projection
    from tracer.baseline import BASELINE_NAME
    from tracer.manifest import build_manifest, machine_info, write_manifest
    from tracer.specload import load_spec
    from tracer.worker import finish_kept, merge_parts

    facts = msgspec.json.decode(_role_facts_path(cfg, ranks[0]).read_bytes())
    roles = {rank: msgspec.json.decode(_role_facts_path(cfg, rank).read_bytes()) for rank in ranks}
    estimates = [row for rank in ranks for row in roles[rank].get("compute_estimate") or []]
    live_peaks = {rank: roles[rank]["live_peak_bytes"] for rank in ranks
                  if roles[rank].get("live_peak_bytes") is not None}
    for rank in ranks:
        _role_facts_path(cfg, rank).unlink()
    from safetensors import safe_open

    with safe_open(str(cfg.run_dir / BASELINE_NAME), framework="pt") as f:
        batch_x = f.get_tensor("batch.x")
    merge_parts(cfg.run_dir, cfg.world_size, with_memory=facts["with_memory"], ranks=ranks)
    finish_kept(cfg)
    device = torch.device(facts["device"])
    mesh = None if facts["mesh"] is None else msgspec.convert(facts["mesh"], Mesh)
    launch = Launch(method="project", nnodes=1, master_addr=None, master_port=None)
    with shapes_only((fake or FakeOptions()).fake_tensors):  # the manifest reads the spec's settings
        spec = load_spec(cfg)
    manifest = build_manifest(cfg=cfg, run_dir=cfg.run_dir, world_size=cfg.world_size,
                              backend=FAKE_BACKEND, device=device, launch=launch,
                              num_params=facts["num_params"], fsdp_units=facts["units"],
                              spec=spec, model_name=facts["model_name"],
                              buffers=facts["buffers"], batch_x=batch_x,
                              machine=_machine(machine_info(list(os.getloadavg()), co)),
                              mesh=mesh)
    manifest.projection = Projection(world_size=cfg.world_size, roles_run=list(ranks),
                                     device=device.type, fake_process_group=True,
                                     ranks_per_node=ranks_per_node or cfg.world_size,
                                     co_runners=co, co_runner_step_ns=twin_ns or {},
                                     **fake_projection(fake or FakeOptions(), estimates, live_peaks))
    write_manifest(cfg.run_dir, manifest)


def _machine(m):
    """The machine section as the roles ran: one torch thread each (``run_role``, as a record's
    rank), ``co`` processes at once; this parent process's own thread count is not theirs."""
    import msgspec

    return msgspec.structs.replace(m, threads_per_rank=1,
                                   oversubscribed=m.ranks_on_host > m.usable_cpus)


def _main(argv: list[str]) -> int:
    """Child entry (``run_role_isolated``): ``python -m tracer.project CONFIG_JSON RANK
    [FAKE_OPTIONS_JSON]``."""
    import json
    import sys

    from tracer.fakeproject import fake_role

    logging.basicConfig(level=logging.WARNING, format=f"[rank{argv[1]}] %(levelname)s %(name)s: %(message)s")
    try:
        cfg = RecordConfig(**json.loads(argv[0]))
        fake = FakeOptions(**json.loads(argv[2])) if len(argv) > 2 else FakeOptions()
        with fake_role(cfg, bool(fake.fake_tensors)) as cost:
            run_role(cfg, int(argv[1]), cost, fake)
    except Exception as exc:  # process boundary: the parent reports the last line
        import traceback

        traceback.print_exc()
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"{type(exc).__name__}: {text}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
