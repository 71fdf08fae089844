"""Data supply of a run (issue 10): how much of each rank's step time waited for input.

Input: the breakdown table (``JobTables.breakdown``, analyzer/ingest/pipeline.py; per rank and step,
``data_wait_ns`` as analyzer/analyses/breakdown.py defines it). Shares are time-weighted: a rank's
``data_wait_frac`` is its data wait summed over its steps divided by its step time summed over
the same steps (so a long step weighs more than a short one, as in the wall-clock total).

A run is input-bound when its most-waiting rank's share is at least
``breakdown.INPUT_BOUND_FRAC``: in data-parallel training every rank waits for the slowest at
the next collective, so one starved rank slows them all.
"""

from __future__ import annotations

import msgspec
import pandas as pd

from analyzer.analyses.breakdown import INPUT_BOUND_FRAC
from analyzer.contract.report_types import DataSupply
from analyzer.contract.schemas import Manifest

RANK_COLUMNS = ["rank", "steps", "step_ns", "data_wait_ns", "exposed_comm_ns", "data_wait_frac",
                "exposed_comm_frac", "input_bound_steps"]


def rank_data(bd: pd.DataFrame) -> pd.DataFrame:
    """Per rank (RANK_COLUMNS): steps, summed step / data wait / exposed communication ns, their
    shares of step time (NaN when the summed step time is 0), and how many steps were
    input-bound. Rows with step < 0 are ignored; None or a table without ``data_wait_ns`` gives
    no rows. Sorted by rank."""
    if bd is None or "data_wait_ns" not in bd.columns:
        return pd.DataFrame(columns=RANK_COLUMNS)
    bd = bd[bd["step"] >= 0]
    if bd.empty:
        return pd.DataFrame(columns=RANK_COLUMNS)
    g = bd.groupby("rank", sort=True)
    out = pd.DataFrame({"steps": g.size(), "step_ns": g["step_ns"].sum(),
                        "data_wait_ns": g["data_wait_ns"].sum(),
                        "exposed_comm_ns": g["exposed_comm_ns"].sum(),
                        "input_bound_steps": g["input_bound"].sum().astype("int64")})
    denom = out["step_ns"].where(out["step_ns"] > 0)
    out["data_wait_frac"] = out["data_wait_ns"] / denom
    out["exposed_comm_frac"] = out["exposed_comm_ns"] / denom
    return out.reset_index()[RANK_COLUMNS]


def data_summary(bd: pd.DataFrame | None, manifest: Manifest | None) -> DataSupply:
    """The run's data supply: ``source`` and how it was set up (the manifest's ``data`` entry:
    memory / loader, with workers, pin_memory, sample_cost_ms, sampler; source None for foreign
    traces or older records), ``data_wait_frac`` (all ranks and steps), ``worst_rank`` /
    ``worst_rank_frac`` / ``worst_rank_exposed_comm_frac`` (the rank with the largest share),
    ``input_bound`` (module docstring), ``input_bound_steps`` and ``steps`` (rank-steps).
    Figures are None when there is no step."""
    info = manifest.data if manifest is not None else None
    out = DataSupply(threshold_frac=INPUT_BOUND_FRAC, **(msgspec.structs.asdict(info) if info else {"source": None}))
    per = rank_data(bd)
    per = per[per["data_wait_frac"].notna()].reset_index(drop=True)
    if per.empty:
        return out
    worst = per.loc[per["data_wait_frac"].idxmax()]
    out.data_wait_frac = float(per["data_wait_ns"].sum() / per["step_ns"].sum())
    out.worst_rank, out.worst_rank_frac = int(worst["rank"]), float(worst["data_wait_frac"])
    out.worst_rank_exposed_comm_frac = float(worst["exposed_comm_frac"])
    out.input_bound = bool(worst["data_wait_frac"] >= INPUT_BOUND_FRAC)
    out.input_bound_steps, out.steps = int(per["input_bound_steps"].sum()), int(per["steps"].sum())
    return out
