"""Compare runs and rank them -- only runs of one experiment, only when their numerics are trusted.

Works on the report's run entries (``report_types.RunEntry``, the ``runs[]`` of report.json).

Ranking rule (stated in every output as ``RANKING_RULE``): one experiment is ranked -- the runs
one ``tracer record`` command recorded (one experiment id in their manifests; ``--repeat N``
records each strategy N times, interleaved). Runs of other experiments are compared in the
tables only, with a warning; runs recorded before experiment ids count as one experiment when
their settings agree, with a warning that this cannot be checked. Within it, runs are grouped by
arm (the run name without its ``.r<k>`` repeat suffix); the single-device arm is the reference,
not ranked. Arms are ordered by the median of all their profiled step times (a distributed
step lasts as long as its slowest rank), ties broken by the lower per-rank memory peak
(``Memory.peak_allocated_bytes``: what the rank holds, analyzer/compare/footprint.py). Each two
arms get a ``Pair``: the ratio of their median step times with a 95 % interval
(analyzer/compare/stats.py); one is called faster only when the interval excludes 1, the ratio
is at least 1 + ``stats.MIN_DIFFERENCE`` and both have ``stats.MIN_REPEATS`` repeats, else the
pair is "within noise at this sample size", with the repeats that would resolve it (below
``stats.MIN_REPEATS`` repeats the sentence shows the ratio alone, labelled, never an interval;
a steady gap under 1 + ``stats.MIN_DIFFERENCE`` reads "less than 5 % apart"). The ranking is
withheld when a run of the experiment failed parity or has none recorded, or its runs were not
recorded under the same settings.

Declared arms (issue 29: ``tracer record --arm NAME="OPTIONS"`` / ``--sweep KEY=V1,V2``; the
runs carry ``experiment.settings``): the user named every arm, so every arm is ranked, a
single-device one too (no reference). An arm whose run failed parity or has none is left out,
named with its first divergence, and the others are ranked. The settings in ``SETTINGS`` may
differ where a declared option explains it (``OPTION_SETTINGS``, ``explained_settings``): the
arms declare ``precision``, so ``precision`` may differ, as long as each arm's repeats agree.
Pair sentences name the arms by strategy and the settings in which they differ
(analyzer/contract/arms.py). The declared settings are checked before they are believed
(``settings_problems``): repeats of one arm that declare different settings, a declared setting
the run's own manifest contradicts (its strategy options, precision or strategy), or runs of the
experiment without declared settings beside runs with them withhold the ranking, named.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable

from analyzer.compare import armdiff, stats
from analyzer.contract import strategies
from analyzer.contract.arms import arm_label, pair_labels, same_value
from analyzer.contract.report_types import Arm, Noise, Pair, Ranking, RunEntry, machine_busy
from analyzer.contract.text import one_line

RANKING_RULE = (
    "Only the runs of one experiment (one tracer record command: one experiment id) are ranked, "
    "and only when every one passed the parity gate; the single-device run is the reference "
    "and the speedup base, not ranked. Strategies (a run name without its .rN repeat suffix) "
    "are ordered by the median of all their profiled step times, fastest first (a distributed "
    "step lasts as long as its slowest rank); ties broken by the lower per-rank memory peak "
    "(Memory section: what the rank holds, not the profiler window). Runs "
    "recorded under different settings are never ranked together; runs of other experiments "
    "are compared in the tables only; an incomplete run (no manifest.json, --allow-incomplete) "
    "is left out."
)

NOISE_RULE = (
    "Noise: for each two strategies, the ratio of their median step times has a 95 % "
    "confidence interval (" + stats.METHOD + "); one is called faster only when the interval "
    f"excludes 1, the ratio is at least {1 + stats.MIN_DIFFERENCE:.2f} (smaller differences "
    "occur between identical records on one machine) and each has at least "
    f"{stats.MIN_REPEATS} repeats (tracer record --repeat), otherwise the pair is within noise "
    f"at this sample size. Below {stats.MIN_REPEATS} repeats no interval is shown: the ratio "
    "alone, labelled with the repeats it rests on."
)

ARMS_RULE = (
    "Declared arms (tracer record --arm / --sweep): every arm is ranked, single-device ones "
    "too; an arm whose run failed the parity gate or has none is left out, named, and the "
    "others are ranked. Its runs may differ from the other arms' in a setting its declared "
    "options change (precision, training, batch, model, data, seed, device), as long as the "
    "repeats of each arm agree; any other difference (versions, launch, ...) withholds the "
    "ranking."
)

SETTINGS = ("versions", "device", "batch", "seed", "model", "precision", "training", "launch",
            "data")
"""Manifest settings that must agree for runs to be one experiment. ``data`` (issue 10): how
the input was supplied; a record without it was fed from memory (the only way before).
``training`` (issue 18): optimizer, mixed-precision policy, activation checkpointing -- a run
with another training setup computes other numbers and times, so it is never ranked beside."""


OPTION_SETTINGS: dict[str, tuple[str, ...]] = {
    "data": ("data",), "data_workers": ("data",), "data_sample_cost_ms": ("data",),
    "precision": ("precision",),
    "optimizer": ("training",), "lr": ("training",), "mixed_precision": ("training",),
    "activation_checkpointing": ("training",), "compile": ("training",),
    "batch": ("batch",), "seq": ("batch",), "hidden": ("model", "batch"),
    "layers": ("model",), "model": ("model",),
    "seed": ("seed",), "device": ("device",),
}
"""Declared arms: recorder option (a ``tracer.config.RecordConfig`` field, the keys of the
manifest's ``experiment.settings``) -> the ``SETTINGS`` it changes. An option not here
(``strategy``, ``nproc``, ``bucket_cap_mb``, ...) changes none of them."""


def setting_of(run: RunEntry, key: str) -> Any:
    """``run``'s value of ``key`` (a ``SETTINGS`` name) as runs are compared on it: the
    per-rank batch, launch details past method and nnodes, device count left out."""
    s = run.settings or {}
    value = s.get(key)
    if key == "batch" and isinstance(value, dict):
        # per-rank batch differs by design between single and distributed runs
        return {k: v for k, v in value.items() if k != "per_rank_batch"}
    if key == "launch" and isinstance(value, dict):
        if strategies.is_reference(run.strategy):
            return None  # the baseline is not launched; nothing to compare
        return {k: v for k, v in value.items() if k in ("method", "nnodes")}
    if key == "data":
        if not isinstance(value, dict):
            return {"source": "memory"}
        return {k: v for k, v in value.items() if k in ("source", "workers", "sample_cost_ms")}
    if key == "device" and isinstance(value, dict):
        return {k: v for k, v in value.items() if k in ("type", "name")}
    return value


def show_setting(v: Any) -> str:
    """A setting's value as readable text: ``type cpu, name AMD EPYC`` for a dict (never a
    Python repr), ``-`` for None."""
    if isinstance(v, dict):
        return ", ".join(f"{k} {show_setting(x)}" for k, x in v.items() if x is not None) or "-"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(show_setting(x) for x in v) + "]"
    return "-" if v is None else str(v)


def declared(run: RunEntry) -> dict[str, Any] | None:
    """The run's declared settings (manifest ``experiment.settings``): a dict for an arm of
    ``tracer record --arm`` / ``--sweep``, None otherwise."""
    return (run.experiment or {}).get("settings")


def is_declared(runs: list[RunEntry]) -> bool:
    """True when the recorded runs (those with settings) are one experiment of declared arms:
    one experiment id, and every one of them carries ``experiment.settings``."""
    recorded = [r for r in runs if r.settings]
    return (bool(recorded) and len({experiment_id(r) for r in recorded}) == 1
            and experiment_id(recorded[0]) is not None
            and all(declared(r) is not None for r in recorded))


def explained_settings(runs: list[RunEntry]) -> set[str]:
    """The ``SETTINGS`` keys on which ``runs`` may differ: for one experiment of declared arms
    (``is_declared``), each key a declared option maps to (``OPTION_SETTINGS``) on which the
    runs of every arm (its repeats) agree among themselves; empty otherwise. The one rule for
    both the ranking and the report's settings warnings."""
    if not is_declared(runs):
        return set()
    recorded = [r for r in runs if r.settings]
    keys = {k for r in recorded for o in declared(r) for k in OPTION_SETTINGS.get(o, ())}
    by_arm: dict[str, list[RunEntry]] = {}
    for r in recorded:
        by_arm.setdefault(r.arm, []).append(r)
    return {k for k in keys
            if all(len({show_setting(setting_of(r, k)) for r in rs}) == 1 for rs in by_arm.values())}


def settings_differences(runs: list[RunEntry],
                         label: Callable[[RunEntry], str] | None = None,
                         keys: tuple[str, ...] = SETTINGS) -> list[str]:
    """One warning line per setting in ``keys`` (default ``SETTINGS``) on which the recorded runs
    disagree, naming the runs (``label(run)``, default the run name; equal labels are named
    once) and their values. Foreign runs (no settings) are ignored; so are differences a
    declared arm explains (``explained_settings``)."""
    recorded = [r for r in runs if r.settings]
    explained = explained_settings(runs)
    out = []
    for key in keys:
        if key in explained:
            continue
        seen: dict[str, dict[str, None]] = {}
        for r in recorded:
            v = setting_of(r, key)
            if v is None and key == "launch":
                continue
            seen.setdefault(show_setting(v), {})[label(r) if label else r.name] = None
        if len(seen) > 1:
            parts = "; ".join(f"{', '.join(names)}: {v}" for v, names in seen.items())
            out.append(f"runs differ in {key} ({parts})")
    return out


OPTION_KEYS: dict[str, str] = {
    **{k: k for k in ("bucket_cap_mb", "reshard_after_forward", "static_graph",
                      "gradient_as_bucket_view", "forward_prefetch", "backward_prefetch",
                      "sharding_strategy", "mesh", "tp", "pp", "pp_schedule", "microbatches")},
    "wrap_min_params": "auto_wrap_min_num_params",
}
"""Declared option (a key of ``experiment.settings``) -> its key in the manifest's
``strategy_options`` (tracer/config.py ``strategy_options``), where the record wrote the value
it applied."""


def _contradictions(run: RunEntry) -> list[str]:
    """Where ``run``'s ``experiment.settings`` disagree with what its own manifest says it ran:
    a strategy option against ``strategy_options`` (only keys present there: an option its
    strategy does not take is absent; ``mesh`` by its degrees, the record writes ``2,2`` as
    ``2x2``), ``precision`` and ``strategy`` against the manifest's."""
    out = []
    for key, said in (declared(run) or {}).items():
        if key == "strategy":
            where, have = "strategy", run.strategy
        elif key == "precision":
            where, have = "precision", (run.settings or {}).get("precision")
        elif OPTION_KEYS.get(key) in run.options:
            opt = OPTION_KEYS[key]
            where, have = "strategy_options" + ("" if opt == key else f" {opt}="), run.options[opt]
        else:
            continue
        if key == "mesh":  # --mesh "2,2" is written "2x2" in strategy_options
            agree = re.findall(r"\d+", str(said)) == re.findall(r"\d+", str(have))
        else:
            agree = same_value(said, have)
        if not agree:
            out.append(f"run {one_line(run.name)}: experiment.settings says "
                       f"{one_line(f'{key}={said}')}, its "
                       f"{where}{'' if where.endswith('=') else ' '}{one_line(str(have))}: "
                       "the manifest was edited; re-record")
    return out


def settings_problems(runs: list[RunEntry]) -> list[str]:
    """Why the declared settings of ``runs`` (one experiment's) cannot be trusted, one line
    each; empty when they can. Some runs declaring arms and others not (``experiment.settings``
    None): the experiment is neither, refused. Repeats of one arm declaring different settings:
    one line per arm naming the settings and values. A run whose declared settings its own
    manifest contradicts (``_contradictions``): one line per run and setting."""
    recorded = [r for r in runs if r.settings]
    plain = [r for r in recorded if declared(r) is None]
    if plain and len(plain) < len(recorded):
        exp = experiment_id(recorded[0]) or "-"
        return [f"run{'s' if len(plain) > 1 else ''} {', '.join(one_line(r.name) for r in plain)} "
                f"of experiment {one_line(exp[:8])} carr{'y' if len(plain) > 1 else 'ies'} no "
                "experiment.settings while its other runs declare arms (tracer record --arm / "
                "--sweep): the manifests were edited or joined from different commands; "
                "re-record"]
    if not recorded or plain:
        return []
    out = []
    by_arm: dict[str, list[RunEntry]] = {}
    for r in recorded:
        by_arm.setdefault(r.arm, []).append(r)
    for arm, rs in by_arm.items():
        keys = dict.fromkeys(k for r in rs for k in declared(r))
        parts = []
        for k in keys:
            values: list[Any] = []
            for r in rs:
                v = declared(r).get(k)
                if not any(same_value(v, x) for x in values):
                    values.append(v)
            if len(values) > 1:
                parts.append(f"{k}: {' vs '.join(str(v) for v in values)}")
        if parts:
            out.append(f"arm {arm}'s repeats disagree in their declared settings "
                       f"({one_line('; '.join(parts))})")
    return out + [line for r in recorded for line in _contradictions(r)]


def missing_arms(runs: list[RunEntry]) -> list[str]:
    """What of a declared experiment is not in ``runs`` (its complete runs in the report): one
    line per arm that some run's ``experiment.order`` lists but no run here is of (``arm b:
    recorded in this experiment, no complete run in this report``; ``strategy fsdp: ...`` for a
    strategy list, which declares no arms), then one per arm with fewer repeats here than
    ``experiment.repeats`` (``arm a: 1 of 4 repeats``). Runs deleted, or left out as incomplete,
    are named this way rather than the report going silent about them."""
    exps = [r.experiment or {} for r in runs]
    by_arm: dict[str, set[int]] = {}
    for r, e in zip(runs, exps):
        by_arm.setdefault(r.arm, set()).add(e.get("repeat", 1))
    listed = dict.fromkeys(a for e in exps for a in e.get("order") or [])
    want = max((e.get("repeats", 1) for e in exps), default=1)
    # declared arms (--arm / --sweep) are arms; a strategy list's members are its strategies
    what = "arm" if any(e.get("settings") is not None for e in exps) else "strategy"
    out = [f"{what} {one_line(a)}: recorded in this experiment, no complete run in this report"
           for a in listed if a not in by_arm]
    out += [f"{what} {one_line(a)}: {len(reps)} of {want} repeats" for a, reps in by_arm.items()
            if len(reps) < want]
    return out


def _peak(run: RunEntry) -> float:
    """The tie-break: the run's largest per-rank peak (``Memory.peak_allocated_bytes``, chosen
    by analyzer/compare/footprint.py: recorded categories first); inf when unknown."""
    v = run.memory.peak_allocated_bytes
    return math.inf if v is None else float(v)


def experiment_id(run: RunEntry) -> str | None:
    """The run's experiment id (manifest ``experiment.id``), None for older records and foreign
    traces."""
    return (run.experiment or {}).get("id")


def ranked_experiment(runs: list[RunEntry]) -> tuple[list[RunEntry], list[RunEntry], list[str]]:
    """(the runs of the experiment to rank, the others, warnings). The experiment with the most
    distributed runs, then the most runs (ties: the smallest id), among those with an id; runs
    without an id (recorded before experiment ids, or foreign traces) are one group, ranked only
    when no run has an id, with a warning that one command cannot be told from several."""
    groups: dict[str | None, list[RunEntry]] = {}
    for r in runs:
        groups.setdefault(experiment_id(r), []).append(r)
    ids = [k for k in groups if k is not None]
    if not ids:
        legacy = groups.get(None, [])
        warn = ([f"runs {', '.join(r.name for r in legacy)} carry no experiment id (recorded "
                 "before tracer record --repeat, or foreign traces): ranked as one experiment, "
                 "but whether one command recorded them cannot be checked; record them together "
                 "(tracer record --strategy ... --repeat 5) for a decision"]
                if sum(1 for r in legacy if not strategies.is_reference(r.strategy)) > 1 else [])
        return legacy, [], warn
    distributed = lambda k: sum(not strategies.is_reference(r.strategy) for r in groups[k])
    chosen = min(ids, key=lambda k: (-distributed(k), -len(groups[k]), k))
    others = [r for r in runs if experiment_id(r) != chosen]
    warn = []
    if others:
        warn.append(f"runs {', '.join(r.name for r in others)} are not of experiment "
                    f"{chosen[:8]} (recorded by another tracer record command, or before "
                    "experiment ids): compared in the tables only, never ranked with it")
    return groups[chosen], others, warn


def busy_machine(runs: list[RunEntry]) -> str | None:
    """A note when a run was recorded on a busy or oversubscribed machine (manifest ``machine``):
    its 1-minute load average at the start at or above its usable CPUs, or ranks x threads above
    them. None when no run says so (or none recorded the machine)."""
    busy = [(r.name, r.machine) for r in runs if machine_busy(r.machine)]
    if not busy:
        return None
    worst = max(m["load_avg"][0] for _, m in busy)
    over = [n for n, m in busy if m["oversubscribed"]]
    return (f"{len(busy)} of {len(runs)} run(s) were recorded on a busy machine (1-minute load "
            f"average up to {worst:g} on {busy[0][1]['usable_cpus']} usable CPUs"
            + (f"; oversubscribed: {', '.join(over)}" if over else "")
            + "): expect wide intervals")


def _steps(run: RunEntry) -> list[float]:
    st = run.step_time_ns
    if st.values_ns:
        return [float(v) for v in st.values_ns]
    return [float(st.median)] if st.median else []


def _arms(runs: list[RunEntry]) -> list[tuple[Arm, list[RunEntry]]]:
    """Runs grouped by arm, each arm's runs in repeat order."""
    groups: dict[str, list[RunEntry]] = {}
    for r in runs:
        groups.setdefault(r.arm, []).append(r)
    out = []
    for name, rs in groups.items():
        rs = sorted(rs, key=lambda r: ((r.experiment or {}).get("repeat", 1), r.name))
        steps = [v for r in rs for v in _steps(r)]
        peaks = [_peak(r) for r in rs]
        settings = declared(rs[0])
        out.append((Arm(name=name, strategy=rs[0].strategy, runs=[r.name for r in rs],
                        median_ns=stats.median(steps) if steps else None, steps=len(steps),
                        peak_allocated_bytes=None if min(peaks) == math.inf else int(min(peaks)),
                        settings=dict(settings or {}),
                        label=arm_label(name, rs[0].strategy, settings)),
                    rs))
    return out


def _who(name: str, runs: list[RunEntry]) -> tuple[str, str, dict[str, Any] | None]:
    return name, runs[0].strategy, declared(runs[0])


def compare_arms(a: tuple[str, list[RunEntry]], b: tuple[str, list[RunEntry]]) -> Pair:
    """The ``Pair`` of two arms (name, runs in repeat order), each with step times: B's median
    over A's when A's is lower (else the other way round) with its interval (``stats.ratio_ci``;
    repeats paired by index when both arms hold the same repeats of one experiment).
    Raises ``ValueError`` when an arm has no step time."""
    (na, ra), (nb, rb) = a, b
    sa = [x for x in (_steps(r) for r in ra) if x]
    sb = [x for x in (_steps(r) for r in rb) if x]
    if not sa or not sb:
        raise ValueError(f"{na if not sa else nb}: no step times")
    if stats.median([v for x in sa for v in x]) > stats.median([v for x in sb for v in x]):
        (na, ra, sa), (nb, rb, sb) = (nb, rb, sb), (na, ra, sa)
    reps = lambda rs: [((r.experiment or {}).get("id"), (r.experiment or {}).get("repeat")) for r in rs]
    paired = (len(sa) == len(sb) >= 2 and len(sa) == len(ra) == len(rb)
              and [k[1] for k in reps(ra)] == [k[1] for k in reps(rb)]
              and len({k[0] for k in reps(ra) + reps(rb)}) == 1 and reps(ra)[0][0] is not None)
    ci = stats.ratio_ci(sa, sb, paired=paired)
    undecided = undecided_why(ci)
    small = ci.ratio < 1 + stats.MIN_DIFFERENCE
    need = (stats.repeats_to_resolve(ci.log_sd, ci.ratio, repeats=ci.repeats)
            if undecided is not None and not small else None)
    fa, sl = pair_labels(_who(na, ra), _who(nb, rb))
    return Pair(faster=na, slower=nb, ratio=ci.ratio, ci_low=ci.ci_low, ci_high=ci.ci_high,
                method=stats.METHOD, decision="faster" if undecided is None else "within_noise",
                repeats=ci.repeats, steps=ci.steps, paired=paired, repeats_needed=need,
                undecided=undecided, sentence=pair_sentence(fa, sl, ci, undecided, need))


def undecided_why(ci: stats.RatioCI) -> str | None:
    """Why a pair is not called faster (``Pair.undecided``), None when it is: too few repeats
    first (``one_run``, ``few_repeats``: below ``stats.MIN_REPEATS``), then an interval that
    does not exclude 1 (``interval_includes_1``), then a ratio under 1 +
    ``stats.MIN_DIFFERENCE`` (``small_difference``)."""
    if ci.repeats < stats.MIN_REPEATS:
        return "one_run" if ci.repeats <= 1 else "few_repeats"
    if not ci.ci_low > 1:
        return "interval_includes_1"
    if ci.ratio < 1 + stats.MIN_DIFFERENCE:
        return "small_difference"
    return None


def ratio_basis(ratio: float, repeats: int, steps: int) -> str:
    """The ratio below ``stats.MIN_REPEATS`` repeats, labelled with what it rests on (never an
    interval): ``1.89x, steps of one run only, 6 steps in all`` / ``1.40x from 3 repeats, too few
    for an interval, 18 steps in all``."""
    rests = ("steps of one run only" if repeats <= 1 else
             f"from {repeats} repeats, too few for an interval")
    return f"{ratio:.2f}x{',' if repeats <= 1 else ''} {rests}, {steps} steps in all"


def pair_sentence(faster: str, slower: str, ci: stats.RatioCI, undecided: str | None,
                  need: int | None) -> str:
    """The pair in words (``faster`` / ``slower``: the arms' labels): ``fsdp2 is 1.31x faster
    than ddp (95 % CI 1.18-1.45, 5 repeats, 50 steps in all)``; below ``stats.MIN_REPEATS``
    repeats the ratio alone (``ratio_basis``) and what would decide; ``less than 5 % apart``
    for a steady gap under 1 + ``stats.MIN_DIFFERENCE``; else ``within noise at this sample
    size`` with the repeats that would resolve it."""
    figures = (f"95 % CI {ci.ci_low:.2f}-{ci.ci_high:.2f}, {ci.repeats} repeat"
               f"{'s' if ci.repeats != 1 else ''}, {ci.steps} steps in all")
    least = f"{stats.MIN_DIFFERENCE * 100:g} %"
    if undecided is None:
        return f"{faster} is {ci.ratio:.2f}x faster than {slower} ({figures})"
    if undecided in ("one_run", "few_repeats"):
        each = f"{ci.repeats} run{'s' if ci.repeats != 1 else ''} each"
        return (f"{faster} vs {slower}: within noise at this sample size "
                f"({ratio_basis(ci.ratio, ci.repeats, ci.steps)}; {each}: record both with "
                f"tracer record --repeat {stats.MIN_REPEATS} or more to decide, "
                f"fewer than {stats.MIN_REPEATS} repeats cannot measure run-to-run variation)")
    if undecided == "small_difference":
        return (f"{faster} vs {slower}: less than {least} apart (ratio {ci.ratio:.2f}, "
                f"{figures}): the difference identical records show on one machine, not called "
                "faster")
    text = (f"{faster} vs {slower}: within noise at this sample size (ratio {ci.ratio:.2f}, "
            f"{figures})")
    if ci.ratio < 1 + stats.MIN_DIFFERENCE:
        return text + (f"; a difference under {least} is not called one: identical records "
                       "differ by that much on one machine")
    if need is not None:
        return text + f"; about {need} repeats per arm would resolve a {ci.ratio:.2f}x difference"
    return text + "; no practical number of repeats would resolve so small a difference"


def _parity_problem(r: RunEntry) -> str | None:
    """Why ``r``'s speed does not count: ``failed the parity gate (first divergence in grad
    x)`` / ``has no parity verdict (...)``; None when it passed (or is the reference)."""
    p = r.parity
    if p.status == "fail":
        what = (f"first divergence in {p.first_divergence.subject}" if p.first_divergence
                else p.reason)
        return f"failed the parity gate ({what})"
    if p.status == "not_recorded":
        return f"has no parity verdict ({p.reason})"
    return None


def _withheld_reason(untrusted: list[str], withheld: list[str], diffs: list[str],
                     dropped: list[str], *, no_arm_passed: bool, timed: bool) -> str | None:
    """Why ``rank_runs`` withholds the ranking before comparing step times, the first cause that
    holds: declared settings that cannot be trusted (``untrusted``), runs that failed parity
    (``withheld``, undeclared arms), runs that are not one experiment (``diffs``), no declared
    arm left (``dropped``: why each was left out), no run timed. None when none holds."""
    if untrusted:
        return "; ".join(untrusted) + ("; the runs are not one experiment either: "
                                       + "; ".join(diffs) if diffs else "")
    if withheld:
        return ("; ".join(withheld) + ". Speed figures of a run whose numerics are not verified "
                "do not count.")
    if diffs:
        return ("the runs are not one experiment: " + "; ".join(diffs)
                + ". Record them together with the same settings.")
    if no_arm_passed:
        return "; ".join(dropped + ["no arm passed the parity gate"])
    return None if timed else "no run has a measured step time"


def rank_runs(runs: list[RunEntry]) -> Ranking:
    """The ranking (module docstring): ``order`` (arms, fastest first, the reference left out;
    empty when withheld), ``pairs``, ``arms``, ``reason``, ``rule``, ``noise``, the experiment
    ranked and the runs left to the tables (``descriptive``); for declared arms ``declared``,
    every arm ranked, ``left_out`` the arms that failed parity; ``missing`` the arms or
    repeats of the experiment absent from the report (``missing_arms``), for any experiment."""
    left_out = [r.name for r in runs if r.incomplete]
    # left out: incomplete runs (README); projections, ranked apart (Report.projections)
    complete = [r for r in runs if not r.incomplete and r.projection is None]
    runs, others, warns = ranked_experiment(complete)
    exp = experiment_id(runs[0]) if runs else None
    arms_declared = is_declared(runs)
    rule = RANKING_RULE + (" " + ARMS_RULE if arms_declared else "")
    extra = dict(experiment=exp, descriptive=[r.name for r in others], declared=arms_declared)
    missing = missing_arms(runs)  # declared arms or a record of strategies with --repeat
    extra["missing"] = missing
    warns = missing + warns  # said whether the ranking is made or withheld
    untrusted = settings_problems(runs)
    problems = [(r, why) for r in runs if (why := _parity_problem(r))]
    dropped: list[str] = []
    if arms_declared:  # a failed arm is left out, the others ranked
        bad: dict[str, str] = {}
        for r, why in problems:
            bad.setdefault(r.arm, why)  # its first run's problem
        extra["left_out"] = [f"arm {a} {why}" for a, why in bad.items()]
        dropped = [f"arm {a} left out: {why}" for a, why in bad.items()]
        withheld = []
    else:
        bad, withheld = {}, [f"run {r.name} {why}" for r, why in problems]
    diffs = settings_differences(runs)
    kept = [r for r in runs if r.arm not in bad]
    timed = [r for r in kept if _steps(r)]
    reason = _withheld_reason(untrusted, withheld, diffs, dropped,
                              no_arm_passed=arms_declared and not kept, timed=bool(timed))
    if reason:
        return Ranking(status="withheld", order=[], reason="; ".join([reason] + warns),
                       rule=rule, **extra)
    # memory before communication: a run that does not fit the device (--device-memory) is
    # not a choice, however fast (the single-device reference stays the speedup base)
    unfit = [r.name for r in timed if not r.is_reference
             and r.memory.fit is not None and r.memory.fit.fits is False]
    timed = [r for r in timed if r.name not in unfit]
    if unfit and not any(not r.is_reference for r in timed):
        return Ranking(status="withheld", order=[], reason="; ".join(
            [f"no {'arm' if arms_declared else 'distributed run'} fits the device "
             f"(--device-memory): {', '.join(unfit)} do not fit"] + warns), rule=rule, **extra)
    arms = _arms(timed)
    ref = next((a for a, rs in arms if rs[0].is_reference), None)
    ranked = sorted(((a, rs) for a, rs in arms if a is not ref),
                    key=lambda x: (x[0].median_ns, x[0].peak_allocated_bytes or math.inf, x[0].name))
    pairs = [compare_arms((a.name, ra), (b.name, rb))
             for i, (a, ra) in enumerate(ranked) for b, rb in ranked[i + 1:]]
    what = (f"arm{'' if len(ranked) == 1 else 's'}" if arms_declared else
            f"strateg{'y' if len(ranked) == 1 else 'ies'}")
    reason = (f"{len(ranked)} {what} of "
              f"{'experiment ' + exp[:8] if exp else 'runs without an experiment id'} passed "
              f"parity ({len(timed)} run(s))" + (f"; reference: {ref.name}" if ref else ""))
    if dropped:
        reason += "; " + "; ".join(dropped)
    untimed = [r.name for r in kept if not _steps(r)]
    if untimed:
        reason += f"; not ranked for lack of step times: {', '.join(untimed)}"
    if left_out:
        reason += f"; left out as incomplete (no manifest.json): {', '.join(left_out)}"
    if unfit:
        reason += f"; not ranked, they do not fit the device (--device-memory): {', '.join(unfit)}"
    if warns:
        reason += "; " + "; ".join(warns)
    if busy := busy_machine(timed):
        reason += "; " + busy
    order = [a.name for a, _ in ranked]
    out = Ranking(status="ranked", order=order, reason=reason,
                  rule=rule + " " + NOISE_RULE, pairs=pairs,
                  arms=[a for a, _ in ranked] + ([ref] if ref else []),
                  reference=ref.name if ref else None,
                  noise=ranking_noise(order, pairs, cpu=any((r.device or "cpu") == "cpu" for r in timed)),
                  **extra)
    if arms_declared and len(order) >= 2:  # what the arms did, beside their step times
        out.differences = armdiff.differences(timed, out)
    return out


def ranking_noise(order: list[str], pairs: list[Pair], *, cpu: bool) -> Noise:
    """Whether the ranked ``order`` (arms, fastest first) is a basis for a decision
    (``NOISE_RULE``): ``close_pairs`` = ``[faster, slower, ratio - 1, sentence]`` of each
    neighbour pair whose ``Pair`` is within noise; ``decisive`` when none is."""
    by = {(p.faster, p.slower): p for p in pairs}
    by.update({(p.slower, p.faster): p for p in pairs})
    close = []
    for a, b in zip(order, order[1:]):
        p = by[(a, b)]
        if p.decision != "faster":
            close.append((p.faster, p.slower, None if p.ratio is None else p.ratio - 1, p.sentence))
    return Noise(cpu=cpu, close_pairs=close, decisive=not close, min_repeats=stats.MIN_REPEATS,
                 min_difference=stats.MIN_DIFFERENCE)


def decision(ranking: Ranking) -> Pair | None:
    """The pair a one-line decision states: the fastest arm against the runner-up (``order[0]``
    and ``order[1]``); None when withheld or fewer than two strategies are ranked."""
    if ranking.status != "ranked" or len(ranking.order) < 2:
        return None
    first, second = ranking.order[:2]
    return next(p for p in ranking.pairs if {p.faster, p.slower} == {first, second})


def comparable_to(run: RunEntry, base: RunEntry) -> bool:
    """True when ``run`` may be compared with the reference ``base``: it is ``base`` itself, or
    its parity passed, it is of the same experiment (``experiment_id``) and every setting in
    ``SETTINGS`` agrees with the reference's (``launch`` is not compared, the reference is not
    launched). Foreign runs (no settings) never are."""
    if run is base:
        return True
    if run.parity.status != "pass" or not run.settings or experiment_id(run) != experiment_id(base):
        return False
    for key in SETTINGS:
        a, b = setting_of(run, key), setting_of(base, key)
        if key == "launch" and (a is None or b is None):
            continue
        if a != b:
            return False
    return True


def speedups(runs: list[RunEntry]) -> list[float | None]:
    """Speedup of each run over the reference strategy's run (``strategies.is_reference``: of
    its experiment and repeat when there is one, else the first), in ``runs`` order: the
    reference's median step time / the run's. None when there is no such run, either time is
    missing, or the run is
    not comparable with it (``comparable_to``: parity not passed, or recorded under different
    settings) -- the report must not show a speedup it says cannot be compared."""
    singles = [r for r in runs if strategies.is_reference(r.strategy)]
    out = []
    for r in runs:  # the single run of the same experiment and repeat, else the first single
        rep = (experiment_id(r), (r.experiment or {}).get("repeat"))
        base = next((s for s in singles if (experiment_id(s), (s.experiment or {}).get("repeat")) == rep),
                    singles[0] if singles else None)
        b = base.step_time_ns.median if base else None
        out.append(b / r.step_time_ns.median if b and r.step_time_ns.median and comparable_to(r, base)
                   else None)
    return out


def prefetch_groups(runs: list[RunEntry]) -> list[list[str]]:
    """Groups (>= 2 runs) of the same FSDP strategy (a row with a shard dimension: FSDP1, and
    FSDP2 flat or on a mesh) whose strategy options differ only in the prefetch settings
    (``backward_prefetch``, ``forward_prefetch``, FSDP2's ``fsdp2_prefetch`` depth): compare
    them side by side."""
    keys = ("backward_prefetch", "forward_prefetch", "fsdp2_prefetch")
    groups: dict[str, list[RunEntry]] = {}
    for r in runs:
        row = strategies.spec(r.strategy)
        if row is None or row.dim_of("shard") is None:
            continue
        opts = {k: v for k, v in r.options.items() if k not in keys}
        settings = {k: setting_of(r, k) for k in SETTINGS}
        groups.setdefault(repr((r.strategy, sorted(opts.items()), settings)), []).append(r)
    return [[r.name for r in group] for group in groups.values()
            if len(group) >= 2 and len({repr({k: r.options.get(k) for k in keys})
                                         for r in group}) > 1]
