"""One colour per strategy and one shade per category, used by every plot of report.html
(the loss curves, the memory and time-breakdown bars, the per-rank timeline).

A bar, line or swatch that stands for a run takes its strategy's colour (``strategy_color``);
what it shows of that run (compute or communication, transfer or wait, allocated or RSS) is told
by the shade (``SHADES``: fill opacity), never by another hue, so a colour means the same
strategy in every plot; legends show the shades in black (``SHADE_SWATCH``), a colour no
strategy has. A strategy's colour is its row's (contract/strategies.py ``colour``): Tableau 10
(Vega's ``tableau10`` scheme), chosen for telling categories apart (unknown strategies past
Tableau 10's last two take Tableau 20's dark olive, teal and rose); no strategy is grey, so a
light shade never reads as another strategy.
"""

from __future__ import annotations

from analyzer.contract import strategies
from analyzer.contract.report_types import RunEntry

OTHER_COLORS = ("#ff9da7", "#9c755f", "#b6992d", "#499894", "#d37295")
"""Strategies the tracer does not know (foreign traces name their folder), by first use."""
SHADES = {"compute": 1.0, "exposed communication": 0.6, "transfer": 1.0, "wait": 0.35,
          "data wait": 0.4, "other": 0.22, "idle": 0.08, "peak allocated": 1.0, "peak RSS": 0.4,
          "communication": 0.5, "parameters": 1.0, "gradients": 0.7, "optimizer state": 0.45,
          "activations": 0.22, "process peak RSS": 0.4, "overlapped communication": 0.25}
"""Fill opacity of each part of a run's bar or lane: a category (compute, communication -- the
timeline's lane of every collective kind --, idle, a memory category) has the same shade in
every plot."""
SHADE_SWATCH = "#000000"
"""Colour of the shade swatches in legends (no strategy's)."""


def strategy_color(strategy: str, seen: list[str] | None = None) -> str:
    """The colour of ``strategy`` (its row's ``colour``); another one from ``OTHER_COLORS`` by
    its position in ``seen`` (the report's unknown strategies in run order; appended to when
    new), so a report's unknown strategies keep one colour each in every plot."""
    if (row := strategies.spec(strategy)) is not None:
        return row.colour
    seen = [] if seen is None else seen
    if strategy not in seen:
        seen.append(strategy)
    return OTHER_COLORS[seen.index(strategy) % len(OTHER_COLORS)]


def run_colors(runs: list[RunEntry]) -> dict[str, str]:
    """{run name: colour} for ``runs`` (``RunEntry``) in report order: runs of one strategy
    share its colour."""
    seen: list[str] = []
    return {r.name: strategy_color(r.strategy, seen) for r in runs}


def run_label(run: RunEntry) -> str:
    """A run's name in plots and legends; the reference (``RunEntry.is_reference``) marked."""
    return f"{run.name} (reference)" if run.is_reference else run.name


def legend(runs: list[RunEntry], parts: list[str]) -> list[tuple[str, str, float]]:
    """Legend swatches (label, colour, opacity): one per strategy of ``runs`` (``RunEntry``,
    report order, repeats ignored; the reference strategy labelled so) in its colour, then one
    per part in ``parts`` in ``SHADE_SWATCH`` at the part's shade."""
    unknown: list[str] = []
    out = [(f"{s} (reference)" if strategies.is_reference(s) else s, strategy_color(s, unknown),
            1.0) for s in dict.fromkeys(r.strategy for r in runs)]
    return out + [(f"shade: {p}", SHADE_SWATCH, SHADES[p]) for p in parts]
