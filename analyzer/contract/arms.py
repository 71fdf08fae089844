"""Declared arms in words (issue 29): how an arm of ``tracer record --arm`` / ``--sweep`` is named
where a reader sees it -- the ranking's pair sentences (analyzer/compare/ranking.py), the
decision line (reports/decision.py), the findings (analyzer/analyses/findings.py) -- so that all
of them say it the same way.

An arm's *settings* are the manifest's ``experiment.settings``: its value of every recorder
option on which the experiment's arms differ (``{"reshard_after_forward": False}``). An arm
is named by its strategy and those settings, ``fsdp2 with reshard_after_forward=False``;
its name is added (``(arm noreshard)``) only where the name is not just the settings: a sweep
arm ``reshard-after-forward=false`` says nothing more, a user's ``noreshard`` does. Two arms
compared name only the settings in which they differ, and the strategy once when it is the same:
``fsdp2 with reshard_after_forward=False`` vs ``with reshard_after_forward=True``.

Values are JSON scalars, shown as Python writes them (``True``, ``None``, ``1``, ``0.5``,
``bf16``). Every label is one line with bidirectional controls escaped
(contract/text.py ``one_line``): names come from the command line.
"""

from __future__ import annotations

from typing import Any

from analyzer.contract.text import one_line

STRATEGY = "strategy"
"""The recorder option naming the strategy: shown first, never as ``strategy=...``."""


def settings_text(settings: dict[str, Any], keys: list[str] | None = None) -> str:
    """``reshard_after_forward=False, bucket_cap_mb=1``: ``keys`` (default every key but the
    strategy) in the settings' order, each value as Python writes it (``str``)."""
    keys = [k for k in settings if k != STRATEGY] if keys is None else keys
    return one_line(", ".join(f"{k}={settings.get(k)}" for k in keys))


def _parse(word: str) -> Any:
    low = word.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    try:
        return float(word)
    except ValueError:
        return word


def _norm(v: Any) -> Any:
    """A value as a name can write it: bools and None kept, numbers as float, text as it is."""
    if isinstance(v, bool) or v is None:
        return ("b", v)
    if isinstance(v, (int, float)):
        return ("n", float(v))
    return ("s", str(v).lower())


def same_value(a: Any, b: Any) -> bool:
    """True when two setting values are the same as a name or a manifest can write them:
    numbers compared as floats (``5`` is ``5.0``), bools and None as themselves (``True`` is not
    ``1``), text ignoring case."""
    return _norm(a) == _norm(b)


def name_says_settings(name: str, strategy: str, settings: dict[str, Any]) -> bool:
    """True when the arm's ``name`` says no more than its strategy and settings: its ``+``-joined
    parts are ``key=value`` (``-`` or ``_`` in the key, any case in the value) or the strategy,
    and they are exactly the settings (the strategy part optional)."""
    parsed: dict[str, Any] = {}
    for part in name.split("+"):
        key, eq, val = part.partition("=")
        if not eq:
            if part != strategy:
                return False
            key, val = STRATEGY, part
        # the value as parsed, or as text (``compile=none`` names the mode "none", not None)
        parsed[key.strip().replace("-", "_").lower()] = (_norm(_parse(val.strip())), _norm(val.strip()))
    if _norm(strategy) not in parsed.pop(STRATEGY, (_norm(strategy),)):
        return False
    want = {k.lower(): _norm(v) for k, v in settings.items() if k != STRATEGY}
    return parsed.keys() == want.keys() and all(want[k] in parsed[k] for k in want)


def arm_label(name: str, strategy: str, settings: dict[str, Any] | None,
              keys: list[str] | None = None, *, show_strategy: bool = True,
              show_name: bool = True) -> str:
    """The arm in words: ``fsdp2 with reshard_after_forward=False (arm noreshard)``. ``keys``:
    the settings to show (default all but the strategy); ``show_strategy`` False leaves the
    strategy out (``with reshard_after_forward=True``: said once, on the other arm);
    ``show_name`` False never adds the name. ``settings`` None (not a declared arm): the name."""
    if settings is None:
        return one_line(name)
    said = settings_text(settings, keys)
    text = " ".join(p for p in (strategy if show_strategy else "", f"with {said}" if said else "")
                    if p)
    if show_name and (not text or not name_says_settings(name, strategy, settings)):
        text = f"{text} (arm {one_line(name)})" if text else f"arm {one_line(name)}"
    return text


def pair_labels(a: tuple[str, str, dict[str, Any] | None],
                b: tuple[str, str, dict[str, Any] | None]) -> tuple[str, str]:
    """Two arms ``(name, strategy, settings)`` compared, in words: the names when neither is a
    declared arm; else each with only the settings in which the two differ (the strategy once
    when both have it: ``fsdp2 with reshard_after_forward=False``, ``with
    reshard_after_forward=True``), the name added where it says more than that."""
    (na, sa, da), (nb, sb, db) = a, b
    if da is None and db is None:
        return one_line(na), one_line(nb)
    da, db = da or {}, db or {}
    keys = [k for k in dict.fromkeys([*da, *db]) if k != STRATEGY
            and (k not in da or k not in db or _norm(da[k]) != _norm(db[k]))]
    if sa == sb and keys:
        return (arm_label(na, sa, da, keys), arm_label(nb, sb, db, keys, show_strategy=False))
    return arm_label(na, sa, da, keys), arm_label(nb, sb, db, keys)
