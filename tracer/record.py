"""``tracer record`` as a library call: expand ``all``, prepare run dirs and the baseline, launch.

``record_local`` is the path without torchrun (this process is the launcher, not a rank);
``worker.worker_main`` is the path of every rank (spawned by ``record_local`` or by torchrun).
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

from analyzer.contract.schemas import FLAT_STRATEGIES, STRATEGIES
from analyzer.contract.strategies import STRATEGY_OPTIONS, is_reference
from tracer.config import RecordConfig, takers_of, takes
from tracer.rundir import STAGING_PREFIX

log = logging.getLogger(__name__)


def chosen_strategies(strategy: str) -> list[str]:
    """``--strategy`` as a list: ``all`` -> single, ddp, fsdp, fsdp2 (the 1-D set,
    ``schemas.FLAT_STRATEGIES``); ``ddp,fsdp2`` -> both, in that order (any of
    ``schemas.STRATEGIES``, the mesh ones too); one name -> itself. Raises ``ValueError`` for an
    empty or repeated name."""
    if strategy == "all":
        return list(FLAT_STRATEGIES)
    names = [s.strip() for s in strategy.split(",")]
    if "all" in names:
        raise ValueError(f"--strategy {strategy}: all is the whole 1-D set ({', '.join(FLAT_STRATEGIES)}) "
                         "and cannot be listed with others; list the strategies instead "
                         f"(e.g. {','.join(FLAT_STRATEGIES)},hsdp)")
    if "" in names or len(set(names)) != len(names):
        raise ValueError(f"--strategy {strategy}: expected one of {', '.join(STRATEGIES)}, all, "
                         "or a comma-separated list of distinct strategies (ddp,fsdp2)")
    return names


def expand(strategy: str, name: str | None, **options: Any) -> list[RecordConfig]:
    """Configs for ``strategy`` (``all`` -> single, ddp, fsdp, fsdp2; a list ``ddp,fsdp2`` ->
    those; with ``name`` and several strategies the run dirs are ``<name>-<strategy>``). With
    several strategies a fault applies to the distributed ones only, and each strategy gets
    only the strategy options its row takes (``StrategySpec.options``).

    Raises ``ValueError`` naming the bad option.
    """
    chosen = chosen_strategies(strategy)
    if len(chosen) == 1:
        return [RecordConfig(strategy=chosen[0], name=name, **options)]
    from tracer.config import _DEFAULTS

    for option in STRATEGY_OPTIONS:  # given, but for none of the listed strategies: a mistake
        if options.get(option, _DEFAULTS[option]) != _DEFAULTS[option] and not any(
                takes(s, option) for s in chosen):
            takers = takers_of(option)
            raise ValueError(f"--{option.replace('_', '-')}: no strategy of --strategy {strategy} "
                             f"takes it (only {', '.join(takers)}); drop it or add one of them")
    configs = []
    for s in chosen:
        opts = dict(options)
        if is_reference(s):
            opts["fault"] = None
        for option in STRATEGY_OPTIONS:  # each strategy of "all" gets only the options it takes
            if not takes(s, option):
                opts.pop(option, None)
        configs.append(RecordConfig(strategy=s, name=f"{name}-{s}" if name else None, **opts))
    return configs


def interleave(configs: list[RecordConfig], experiment_id: str | None = None) -> list[RecordConfig]:
    """One experiment (issue 20): every config ``repeat`` times, interleaved round by round, each
    round's order rotated by one (A B C, B C A, C A B, A B C ...), so that load drifting over the
    command hits every strategy alike and no strategy always takes the same place in a round
    (measured on the 2-core machine: with A B C every round, two identical arms differed by a
    steady 3 %, the first one faster). Each gets its ``repeat_index`` (1..N: run dir
    ``<name>.r<k>`` when N > 1), the one ``experiment_id`` (``experiment_id``, else a new uuid4
    hex) and its round's order of arms."""
    import uuid
    from dataclasses import replace

    exp = experiment_id or uuid.uuid4().hex
    out = []
    for k in range(1, configs[0].repeat + 1):
        shift = (k - 1) % len(configs)
        round_ = configs[shift:] + configs[:shift]
        order = ",".join(c.arm for c in round_)
        out += [replace(c, repeat_index=k, experiment_id=exp, experiment_order=order) for c in round_]
    return out


def oversubscription(configs: list[RecordConfig], usable_cpus: int, threads_per_rank: int = 1
                     ) -> str | None:
    """A warning when a config's ranks on this machine x ``threads_per_rank`` (the workers set
    torch to 1 intra-op thread) exceed ``usable_cpus``: ranks then share cores and step times
    measure the machine's scheduler as much as the strategy. None when every config fits."""
    over = sorted({c.world_size for c in configs if c.world_size * threads_per_rank > usable_cpus})
    if not over:
        return None
    return (f"warning: {over[-1]} ranks x {threads_per_rank} thread(s) per rank > {usable_cpus} "
            "usable CPU core(s): the machine is oversubscribed, ranks share cores and step times "
            "are noisy; record fewer ranks (--nproc) or on a larger machine")


def check_gpus(configs: list[RecordConfig], gpu_count: int) -> None:
    """Before anything is written: every config's ranks fit this machine's GPUs (one process
    per GPU with NCCL; ``devices.check_ranks_fit``). ``configs`` carry a resolved device.
    Raises ``ValueError`` with one line (the CLI exits 2)."""
    from tracer import devices

    for cfg in configs:
        backend = devices.resolve_backend(cfg.backend, cfg.device)
        devices.check_ranks_fit(local_world_size=cfg.world_size, backend=backend,
                                device_type=cfg.device, gpu_count=gpu_count)


RANK_MEMORY_BYTES = 256 << 20
"""The least memory one rank of the built-in launcher holds: a Python process with torch
imported and a gloo process group (about 400 MB measured on CPU with the tiniest model)."""


def machine_memory_bytes() -> int | None:
    """This machine's memory, or the cgroup's limit when lower (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``); None when neither can be read."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        total = None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            total = min(total, int(text)) if total else int(text)
    return total


def check_ranks_fit_machine(configs: list[RecordConfig], memory_bytes: int | None) -> None:
    """Before anything starts: the built-in launcher starts all of a config's ranks on this
    machine, each holding at least ``RANK_MEMORY_BYTES``; refuse (``ValueError``, one line, the
    CLI exits 2) a world that ``memory_bytes`` (``machine_memory_bytes``; None: not checked)
    cannot hold, instead of starting ranks until the machine runs out (issue 43 R11). A job
    larger than one machine is launched with torchrun, one node at a time."""
    if not memory_bytes:
        return
    most = max(1, memory_bytes // RANK_MEMORY_BYTES)
    for cfg in configs:
        if cfg.world_size > most:
            raise ValueError(f"--nproc {cfg.world_size}: the built-in launcher starts every rank on "
                             f"this machine, each a process of at least {RANK_MEMORY_BYTES >> 20} MiB, "
                             f"and its {memory_bytes / (1 << 30):.1f} GiB of memory hold at most "
                             f"{most}; pass --nproc {most} or less, or launch across machines with "
                             "torchrun")


def _place(src: Path, dst: Path) -> None:
    """Hard-link ``src`` to ``dst`` (copy across filesystems).

    Safe for earlier records sharing the old ``dst`` inode: ``dst`` is unlinked, never written
    in place, and every baseline file is itself written as temp + ``os.replace`` (a new inode),
    so a run dir that still links the previous baseline keeps its bytes (and its sha256).
    """
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def _cannot_prepare(path: Path, exc: OSError) -> ValueError:
    return ValueError(f"{path}: cannot prepare the run directory ({exc.strerror or exc}); "
                      "choose a writable --out")


def record_local(configs: list[RecordConfig], done: list[Path] | None = None) -> list[Path]:
    """Record each config with spawned workers; return the run directories.

    Computes the baseline once (all configs share its settings) into a hidden staging folder
    under ``--out`` while the first strategy's workers start
    (``launch.run_workers(prepare=...)``), then runs the strategies one after another. Every run
    dir is checked and locked first (``claim_run_dirs``); one is cleared (record marker written,
    ``rundir.clear_run_dir``) and gets the baseline only when its own record starts, so runs
    that never started keep their previous complete contents; its marker is removed once its
    ranks all exited 0, and a failed or interrupted one is left without manifest
    (``rundir.abandon_record``). The staging folder is removed and the locks released at the
    end, either way. Raises ``launch.RecordFailed`` on the first failed record,
    ``KeyboardInterrupt`` on Ctrl-C (workers killed either way), ``ValueError`` for an unusable
    device or output folder or a run dir another record holds, ``RuntimeError`` when the
    baseline cannot be computed. ``done``: a list that gets each run dir as its record
    completes, so a caller can say which ones a failure left unrecorded (``unrecorded``).
    Long because the staging folder and the run-dir locks it takes are released on every exit
    path, which one function sees whole.
    """
    import tempfile
    from dataclasses import replace
    from functools import partial

    # The CLI may have claimed the run dirs already: refused or interrupted (Ctrl-C while torch
    # is imported) before the first record starts, leave no lock and no folder made behind.
    staging: Path | None = None
    try:
        from tracer.baseline import BASELINE_NAME, baseline_id, write_baseline, write_baseline_isolated
        from tracer.launch import run_workers
        from analyzer.contract.stopping import stop_signals_held
        from analyzer.contract.owner import write_owner
        from tracer.rundir import abandon_record, finish_record, staged_baseline, sweep_leftovers

        import torch

        from tracer import devices

        device_type = devices.resolve_device_type(configs[0].device, torch.cuda.is_available())
        configs = [replace(c, device=device_type) for c in configs]
        if device_type == "cuda":
            check_gpus(configs, torch.cuda.device_count())
        claim_run_dirs(configs)
        warning = oversubscription(configs, len(os.sched_getaffinity(0)))
        if warning:
            log.warning("%s", warning)
        for out in dict.fromkeys(c.run_dir.parent for c in configs):  # what killed records left
            for path in sweep_leftovers(out):
                log.info("removed %s, left by a killed record", path)
        try:  # same filesystem as the run dirs, so placing the baseline is a hard link
            with stop_signals_held():  # a stop between mkdtemp and here would leak the folder
                staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=configs[0].run_dir.parent))
            write_owner(staging)  # first: a SIGKILL from here on leaves a folder a later record sweeps
        except OSError as exc:
            raise _cannot_prepare(configs[0].run_dir.parent, exc) from None
        # One baseline per set of numerics settings (``baseline.baseline_id``): every config of a
        # strategy list shares one; a declared arm that changes the numerics (precision,
        # training, batch) gets its own, computed when its first run is prepared.
        ids = [baseline_id(c, device_type) for c in configs]
        configs = [replace(c, baseline_id=i) if c.arm_settings is not None else c
                   for c, i in zip(configs, ids)]
        folders = {i: staging / staged_baseline(i) for i in dict.fromkeys(ids)}
    except BaseException:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        _release(configs)
        raise

    def baseline_then_prepare(cfg: RecordConfig, bid: str) -> None:
        folder = folders[bid]
        if not (folder / BASELINE_NAME).exists():
            folder.mkdir(exist_ok=True)
            # CUDA: keep the launcher free of a CUDA context while ranks run; --model SPEC: the
            # user's code never runs in the launcher (its os._exit(0) would end it with status 0)
            if device_type == "cuda" or cfg.model != "reference":
                write_baseline_isolated(cfg, device_type, folder / BASELINE_NAME)
            else:
                write_baseline(cfg, device_type, folder / BASELINE_NAME)
        prepare_run_dir(cfg, folder)

    done = [] if done is None else done
    try:
        for i, (cfg, bid) in enumerate(zip(configs, ids)):
            log.info("recording %s into %s", cfg.strategy, cfg.run_dir)
            try:
                if i == 0:  # the baseline computes while the first run's workers start
                    run_workers(cfg, prepare=partial(baseline_then_prepare, cfg, bid))
                else:
                    baseline_then_prepare(cfg, bid)
                    run_workers(cfg)
            except BaseException:
                abandon_record(cfg.run_dir)
                raise
            finish_record(cfg.run_dir)
            done.append(cfg.run_dir)
        return done
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        _release(configs)


def unrecorded(configs: list[RecordConfig], done: list[Path]) -> str:
    """For the one line of a failed or interrupted command of several runs (``--repeat``, a
    strategy list): which runs it recorded and which it did not ("" for a single run)."""
    if len(configs) < 2:
        return ""
    kept = {Path(d) for d in done}
    missing = [c.run_name for c in configs if c.run_dir not in kept]
    got = [c.run_name for c in configs if c.run_dir in kept]
    return (f"; {len(got)} of {len(configs)} runs recorded ({', '.join(got) or 'none'}), "
            f"not recorded: {', '.join(missing)}")


def claim_run_dirs(configs: list[RecordConfig]) -> None:
    """Before torch is imported or anything is written: check every config's run dir
    (``rundir.check_run_dir``) and take its record lock (``rundir.lock_run_dir``, held until
    ``record_local`` ends or the process exits), so a refused or concurrent record stops at
    once with one line. Raises ``ValueError`` (``rundir.RunDirBusy`` for a held lock); on a
    raise, a stop signal's ``KeyboardInterrupt`` included, no lock is kept."""
    from tracer.rundir import check_run_dir, check_writable, lock_run_dir

    try:
        for cfg in configs:
            check_run_dir(cfg.run_dir)
            check_writable(cfg.run_dir)
        for cfg in configs:
            try:
                lock_run_dir(cfg.run_dir)
            except OSError as exc:
                raise _cannot_prepare(cfg.run_dir, exc) from None
    except (ValueError, KeyboardInterrupt):
        _release(configs)
        raise


def _release(configs: list[RecordConfig]) -> None:
    from tracer.rundir import unlock_run_dir

    for cfg in reversed(configs):  # the first run dir's lock made the shared parent folder
        unlock_run_dir(cfg.run_dir)


REPLACED: dict[Path, str] = {}
"""Run dir -> the finished run this process's record replaced there (``rundir.finished_run``'s
words), for the CLI to say with the outcome (tracer/cli.py ``_record_here``)."""


def prepare_run_dir(cfg: RecordConfig, staging: Path) -> None:
    """Clear ``cfg.run_dir`` (``rundir.clear_run_dir``; a finished run it held is named in
    ``REPLACED``) and place the staged baseline files in it (hard links). Raises ``ValueError``
    when the folder cannot be written."""
    from tracer.baseline import BASELINE_FILES
    from tracer.rundir import clear_run_dir

    try:
        replaced = clear_run_dir(cfg.run_dir)
    except OSError as exc:
        raise _cannot_prepare(cfg.run_dir, exc) from None
    if replaced is not None:
        REPLACED[cfg.run_dir] = replaced
    for name in BASELINE_FILES:
        if (staging / name).exists():
            _place(staging / name, cfg.run_dir / name)
