"""Named arms and sweeps (issue 29): one ``tracer record`` command, several configurations.

``--arm NAME="OPTIONS"`` names an arm: OPTIONS are ``tracer record`` options (parsed by the same
command line parser, so an arm accepts exactly what the command accepts), applied over the
options given outside the arms. ``--sweep KEY=V1,V2`` expands into one arm per value (two
``--sweep`` keys: their grid), named after the values (``bucket-cap-mb=1``); with ``--arm`` too,
every arm gets every grid point (``base+bucket-cap-mb=1``). Every arm records one strategy.

Each arm's manifest records ``experiment.settings`` (``settings_of``): its value of every option
on which the arms differ, as resolved for its strategy (``reshard_after_forward`` True when
full_shard leaves it implied), so the analyzer can tell a declared difference from an accident.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import fields, replace
from typing import Any, Callable

from analyzer.contract.strategies import STRATEGY_OPTIONS, is_reference
from tracer.config import RecordConfig, bucket_setting, takers_of, takes

MAX_ARMS = 16
"""Most arms one command records (``--arm`` x ``--sweep`` grid): each is a full record per
repeat, so 16 arms x 5 repeats is already 80 records."""
MAX_SWEEP_KEYS = 2
"""``--sweep`` over one or two options: a third dimension is a grid no repeat count can cover."""
COMMAND_ONLY = ("out", "name", "repeat", "experiment_id", "golden", "repeat_index",
                "experiment_order", "arm_settings", "baseline_id")
"""Options of the whole command, never of one arm: one output root, the arm is the name, one
repeat count and experiment, one golden run (its batch and weights are every arm's)."""
_NOT_SETTINGS = ("keep_tensors", "timeout_s")
"""Options an arm may set that are not what it compares (what is kept on disk, how long a hang
is waited for): never recorded as its settings, never swept."""
_ARM_NAME = re.compile(r"[A-Za-z0-9_=+-][A-Za-z0-9._=+-]{0,63}")
_REPEAT_SUFFIX = re.compile(r"\.r\d+$")
_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")

Parse = Callable[[list[str]], dict[str, Any]]
"""Options given in an argv (``--strategy fsdp2 --no-reshard-after-forward``) -> {field: value},
only those given; raises ``ValueError`` with the parser's one line."""


def parse_arm(text: str) -> tuple[str, str]:
    """``NAME=OPTIONS`` -> (NAME, OPTIONS). Raises ``ValueError`` for a missing ``=`` or a name
    that is not a plain run-directory name (letters, digits, ``. _ = + -``; no ``.r<k>``
    suffix, which names repeats)."""
    name, sep, options = text.partition("=")
    name = name.strip()
    if not sep:
        raise ValueError(f"--arm {text}: expected NAME=\"OPTIONS\" (e.g. noreshard=\"--strategy "
                         "fsdp2 --no-reshard-after-forward\"; OPTIONS may be empty)")
    check_arm_name(name, f"--arm {text}")
    return name, options


def check_arm_name(name: str, where: str) -> None:
    """Refuse ``name`` as an arm (and run-directory) name; ``where`` starts the one line."""
    if not _ARM_NAME.fullmatch(name) or _REPEAT_SUFFIX.search(name):
        raise ValueError(f"{where}: arm name {name!r} must be 1-64 letters, digits, '.', '_', "
                         "'=', '+' or '-', not starting with '.' and not ending in .r<digits> "
                         "(the repeat suffix)")


def parse_sweep(text: str, option_kinds: dict[str, bool]) -> tuple[str, list[str]]:
    """``KEY=V1,V2[,...]`` -> (field name, values as typed). KEY is an option's name with or
    without ``--``, with ``-`` or ``_``; values are split on ``;`` when there is one (for options
    whose values hold commas: ``--sweep mesh=2,4;4,2``), else on ``,``. ``option_kinds``: each
    recorder option's field name -> whether it is an on/off flag. Raises ``ValueError`` for an
    unknown or command-only key, fewer than two values, or a repeated value."""
    key, sep, values = text.partition("=")
    field = key.strip().lstrip("-").replace("-", "_")
    if not sep or not field:
        raise ValueError(f"--sweep {text}: expected KEY=V1,V2 (e.g. bucket-cap-mb=1,25)")
    if field not in option_kinds or field in COMMAND_ONLY + _NOT_SETTINGS:
        known = sorted(k.replace("_", "-") for k in option_kinds if k not in COMMAND_ONLY + _NOT_SETTINGS)
        raise ValueError(f"--sweep {text}: {key.strip()} is not a recorder option that can vary "
                         f"between arms (one of {', '.join(known)})")
    parts = [v.strip() for v in values.split(";" if ";" in values else ",")]
    if len(parts) < 2 or "" in parts:
        raise ValueError(f"--sweep {text}: give at least two non-empty values, comma-separated "
                         "(';'-separated for values that hold commas)")
    if option_kinds[field]:
        bad = [v for v in parts if v.lower() not in _TRUE + _FALSE]
        if bad:
            raise ValueError(f"--sweep {text}: {bad[0]} is not true or false")
    if len({v.lower() for v in parts}) != len(parts):
        raise ValueError(f"--sweep {text}: a value is repeated")
    return field, parts


def _sweep_argv(field: str, value: str, is_flag: bool) -> list[str]:
    option = "--" + field.replace("_", "-")
    if is_flag:
        return [option if value.lower() in _TRUE else "--no-" + option[2:]]
    return [option, value]


def _sweep_name(field: str, value: str, is_flag: bool) -> str:
    shown = ("true" if value.lower() in _TRUE else "false") if is_flag else value
    # a run-dir name holds letters, digits and . _ = + - only: mesh=2,4 -> mesh=2_4,
    # model=path/m.py:build -> model=path_m.py_build
    return f"{field.replace('_', '-')}={re.sub(r'[^A-Za-z0-9._=+-]', '_', shown)}"


def expand_arms(arms: list[str], sweeps: list[str], *, strategy: str | None,
                common: dict[str, Any], given: list[str], parse: Parse,
                option_kinds: dict[str, bool]) -> list[RecordConfig]:
    """One ``RecordConfig`` per arm, in the order given (arms, then each arm's grid points).

    ``strategy``: ``--strategy`` when given outside the arms (one name), else None; ``common``:
    every recorder option's value outside the arms (defaults included), ``given``: those typed.
    Each arm: ``common``, then its own options over them; a strategy option given outside the
    arms goes to the arms whose strategy takes it (refused when none does), one given inside an
    arm must be taken by its strategy. Each config carries ``arm_settings`` (``settings_of``).
    Raises ``ValueError`` with one line naming the arm, option or limit.
    """
    named = [parse_arm(a) for a in arms] or [("", "")]
    if len({n for n, _ in named}) != len(named):
        raise ValueError(f"--arm: arm names must differ ({', '.join(n for n, _ in named)})")
    swept = [parse_sweep(s, option_kinds) for s in sweeps]
    if len(swept) > MAX_SWEEP_KEYS:
        raise ValueError(f"--sweep: at most {MAX_SWEEP_KEYS} options per experiment "
                         f"({', '.join(s for s in sweeps)})")
    if len({f for f, _ in swept}) != len(swept):
        raise ValueError("--sweep: an option is swept twice; give its values in one --sweep")
    points = list(itertools.product(*[[(f, v) for v in vs] for f, vs in swept]))
    total = len(named) * len(points)
    if total > MAX_ARMS:
        shape = " x ".join(str(n) for n in [len(named)] * bool(arms) + [len(vs) for _, vs in swept])
        raise ValueError(f"--arm/--sweep: {total} arms ({shape}) exceed the limit of {MAX_ARMS} "
                         "per experiment; record fewer values or arms")
    if total < 2:
        raise ValueError("--arm: give at least two arms (or --sweep two values) to compare")
    configs, arm_options = [], {}
    for (arm, text), point in itertools.product(named, points):
        where = f"--arm {arm}" if arm else "--sweep"
        try:
            own = parse(_split(text, where)) if text.strip() else {}
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        for field in own:
            if field in COMMAND_ONLY or field in ("arm", "sweep"):
                raise ValueError(f"{where}: --{field.replace('_', '-')} applies to the whole "
                                 "command, not to one arm; give it once outside the arms")
        if point == points[0]:
            arm_options[arm] = dict(own)  # the arm's own options, before the swept ones
        for field, value in point:
            if field in own:
                raise ValueError(f"{where}: --{field.replace('_', '-')} is swept; drop it from "
                                 "the arm")
            if arm == named[0][0]:  # once per swept option
                sweep = next(s for s in sweeps if parse_sweep(s, option_kinds)[0] == field)
                _check_not_fixed(field, f"--sweep {sweep}", strategy, common, given,
                                 option_kinds)
            try:
                own.update(parse(_sweep_argv(field, value, option_kinds[field])))
            except ValueError as exc:
                raise ValueError(f"--sweep {field.replace('_', '-')}={value}: {exc}") from None
        name = "+".join(([arm] if arm else []) + [_sweep_name(f, v, option_kinds[f]) for f, v in point])
        check_arm_name(name, where)
        configs.append(_arm_config(name, where, own, strategy, common, given))
    if len({c.arm for c in configs}) != len(configs):
        raise ValueError("--arm/--sweep: two arms get one name ("
                         + ", ".join(c.arm for c in configs) + "); name the arms apart")
    if arms:
        _check_reaches_an_arm(arm_options, strategy, common, given, option_kinds)
    _check_common_taken(configs, common, given)
    for i in range(0, len(configs), len(points)):  # each named arm's grid points
        _check_distinct(configs[i:i + len(points)])
    return with_settings(configs)


def _fixed(field: str, value: Any, option_kinds: dict[str, bool]) -> str:
    """Option ``field`` set to ``value`` as typed on a command line (``--bucket-cap-mb 5``,
    ``--no-static-graph``)."""
    option = "--" + field.replace("_", "-")
    if option_kinds.get(field) and isinstance(value, bool):
        return option if value else "--no-" + option[2:]
    shown = bucket_setting(value) if field == "bucket_cap_mb" else value
    return f"{option} {shown}"


def _check_reaches_an_arm(arm_options: dict[str, dict[str, Any]], strategy: str | None,
                          common: dict[str, Any], given: list[str],
                          option_kinds: dict[str, bool]) -> None:
    """Refuse an option given outside the arms that every named arm sets itself
    (``arm_options``: arm name -> its own options): it would reach no arm, dropped without a
    word. One some arms set is their value over the common one (the help's "options over the
    ones given outside the arms": ``--strategy ddp --arm a= --arm f="--strategy fsdp2"``).
    Raises ``ValueError`` naming both."""
    for field in ["strategy", *given]:
        if all(field in own for own in arm_options.values()):
            set_by = ", ".join(f"{arm}: {_fixed(field, own[field], option_kinds)}"
                               for arm, own in arm_options.items())
            _check_not_fixed(field, f"every --arm ({set_by})", strategy, common, given,
                             option_kinds)


def _check_not_fixed(field: str, varied: str, strategy: str | None, common: dict[str, Any],
                     given: list[str], option_kinds: dict[str, bool]) -> None:
    """Refuse option ``field`` that ``varied`` (an arm's options or a ``--sweep``) sets when the
    command also gives it outside the arms: the arm's value would replace it without a word
    (a ``--sweep`` replaces it in every arm: ``--bucket-cap-mb 5`` was never recorded). Raises
    ``ValueError`` naming both."""
    if field == "strategy":
        if strategy is None:
            return
        fixed = f"--strategy {strategy}"
    elif field in given:
        fixed = _fixed(field, common.get(field), option_kinds)
    else:
        return
    raise ValueError(f"{fixed} and {varied} both set --{field.replace('_', '-')}: give it in "
                     "one place")


def _check_distinct(points: list[RecordConfig]) -> None:
    """Refuse two grid points of one arm that record the same configuration (``--sweep
    bucket-cap-mb=1.0,1``: spelled apart, applied alike). Named arms may be identical on
    purpose (the noise check: ``--arm a= --arm b=``), so only one arm's points are compared."""
    seen: dict[str, str] = {}
    for c in points if len(points) > 1 else []:
        key = json.dumps({k: v for k, v in c.to_dict().items()
                          if k not in ("name", "arm_settings")}, sort_keys=True, default=str)
        if key in seen:
            raise ValueError(f"--sweep: arms {seen[key]} and {c.arm} record the same "
                             "configuration (the values are one setting spelled two ways); "
                             "sweep distinct values")
        seen[key] = c.arm


def _split(text: str, where: str) -> list[str]:
    import shlex

    try:
        return shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"cannot split its options ({exc}); quote the arm as NAME=\"OPTIONS\"") from None


def _arm_config(name: str, where: str, own: dict[str, Any], strategy: str | None,
                common: dict[str, Any], given: list[str]) -> RecordConfig:
    arm_strategy = own.pop("strategy", strategy)
    if arm_strategy is None or arm_strategy == "all" or "," in arm_strategy:
        raise ValueError(f"{where}: each arm records one strategy; give --strategy NAME in the "
                         "arm or once outside the arms (not all or a list)")
    opts = dict(common)
    for option in STRATEGY_OPTIONS:  # outside the arms: only for the strategies that take it
        if not takes(arm_strategy, option) and option not in own:
            opts.pop(option, None)
    opts.update(own)
    if is_reference(arm_strategy) and "fault" not in own:
        opts["fault"] = None
    try:
        return RecordConfig(strategy=arm_strategy, name=name, **opts)
    except ValueError as exc:
        said = re.match(r"--([a-z-]+)", str(exc))
        if said and said.group(1).replace("-", "_") in set(common) - set(own) - {"strategy"} \
                and said.group(1).replace("-", "_") not in STRATEGY_OPTIONS:
            raise  # an option given outside the arms: the command's mistake, not the arm's
        raise ValueError(f"{where if where.endswith(name) else f'{where} ({name})'}: {exc}") from None


def _check_common_taken(configs: list[RecordConfig], common: dict[str, Any], given: list[str]) -> None:
    for option in STRATEGY_OPTIONS:
        if option in given and not any(takes(c.strategy, option) for c in configs):
            takers = takers_of(option)
            raise ValueError(f"--{option.replace('_', '-')}: no arm's strategy takes it (only "
                             f"{', '.join(takers)}); drop it or give it inside an arm")


def setting_value(cfg: RecordConfig, field: str) -> Any:
    """``cfg``'s value of option ``field`` as its record applies it: defaults resolved
    (``reshard_after_forward`` from the sharding strategy, ``lr`` from the optimizer, DDP's
    ``"default"`` buckets when no size was given -- torch's 1 MiB first bucket, not 25 MiB --,
    the mesh degrees), None for a strategy option its strategy does not take."""
    if field in STRATEGY_OPTIONS and not takes(cfg.strategy, field):
        return None
    resolved = {"reshard_after_forward": lambda: cfg.resolved_reshard_after_forward,
                "lr": lambda: cfg.learning_rate,
                "bucket_cap_mb": lambda: bucket_setting(cfg.bucket_cap_mb),
                "wrap_min_params": lambda: cfg.auto_wrap_min_params,
                "mesh": lambda: cfg.mesh_text,
                "tp": lambda: cfg.tp_degree, "pp": lambda: cfg.pp_degree,
                "microbatches": lambda: cfg.pp_microbatches,
                "pp_schedule": lambda: cfg.resolved_pp_schedule,
                "pp_virtual": lambda: cfg.pp_virtual_stages,
                "nproc": lambda: cfg.world_size}
    return resolved[field]() if field in resolved else getattr(cfg, field)




def settings_of(configs: list[RecordConfig]) -> list[dict[str, Any]]:
    """Per config, its ``setting_value`` of every option on which ``configs`` differ: a
    strategy option counts only among the configs whose strategy takes it (a ddp and an fsdp2
    arm do not differ in ``bucket_cap_mb``). ``[{}, ...]`` when they differ in none."""
    out: list[dict[str, Any]] = [{} for _ in configs]
    for f in fields(RecordConfig):
        if f.name in COMMAND_ONLY + _NOT_SETTINGS:
            continue
        values = [setting_value(c, f.name) for c in configs]
        taking = [v for c, v in zip(configs, values)
                  if f.name not in STRATEGY_OPTIONS or takes(c.strategy, f.name)]
        if len({json.dumps(v) for v in taking}) < 2:
            continue
        for d, c, v in zip(out, configs, values):
            if f.name not in STRATEGY_OPTIONS or takes(c.strategy, f.name):
                d[f.name] = v
    return out


def with_settings(configs: list[RecordConfig]) -> list[RecordConfig]:
    """``configs`` with ``arm_settings`` (JSON of ``settings_of``) set: they are declared arms."""
    return [replace(c, arm_settings=json.dumps(s, sort_keys=True))
            for c, s in zip(configs, settings_of(configs))]

