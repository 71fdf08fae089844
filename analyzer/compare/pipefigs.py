"""A ``pp`` run's ``pipeline`` entry of the report (``report_types.Pipeline``): the mesh's
stages, the schedule's ideal bubble, each stage's measured bubble and the send / recv traffic
between stages (analyzer/analyses/pipeline.py has the rules)."""

from __future__ import annotations

import math

import pandas as pd

from analyzer.analyses import pipeline
from analyzer.contract import schemas, strategies
from analyzer.contract.report_types import Pipeline, PipelinePair, PipelineStage

_COLL = ["rank", "kind", "bytes", "dur_ns", "step", "name"]


def _send_recv(tables) -> pd.DataFrame:
    """Every rank's send_recv rows (``_COLL`` columns, and ``peer`` when the collectives table
    carries it, else -1: not known), one batch of ranks at a time."""
    has_peer = "peer" in schemas.COLLECTIVES_SCHEMA.names
    cols = _COLL + (["peer"] if has_peer else [])
    frames = [df[df["kind"].astype(str) == "send_recv"] for _, df in tables.batches("collectives", cols)]
    out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    if not has_peer:
        out["peer"] = -1
    return out


def _pair(r: dict) -> PipelinePair:
    """A ``p2p_pairs`` row as a ``PipelinePair`` of plain Python numbers (NaN: None)."""
    num = {k: None if pd.isna(v) else float(v) for k, v in r.items()
           if k not in ("src_stage", "dst_stage", "peer_source")}
    return PipelinePair(src_stage=int(r["src_stage"]), dst_stage=int(r["dst_stage"]),
                        peer_source=str(r["peer_source"]), **num)


def run_pipeline(tables, manifest: schemas.Manifest | None) -> Pipeline | None:
    """The pipeline entry of a run whose strategy stages its layers (``pp``) with a mesh that has
    the stage dimension; None for any other run. ``tables``: its traces' per-rank tables
    (``ingest.load_run``; None without traces: the stages and the ideal bubble only).
    Per-stage figures are over the profiled steps with device work (as every mean of the
    report, analyzer/compare/runs.py)."""
    row = strategies.spec(manifest.strategy if manifest is not None else None)
    if row is None or manifest.mesh is None or row.dim_of("stage") not in manifest.mesh.dim_names:
        return None
    mesh = manifest.mesh
    p = mesh.shape[pipeline.pp_dim(mesh)]
    v = mesh.pp_virtual_stages
    out = Pipeline(stages=p, microbatches=mesh.microbatches, schedule=mesh.pp_schedule,
                   dp=math.prod(mesh.shape) // p,
                   ideal_bubble_frac=pipeline.ideal_bubble_frac(p, mesh.microbatches, mesh.pp_schedule, v),
                   ideal_source=pipeline.ideal_source(mesh.pp_schedule), bubble_rule=pipeline.BUBBLE_RULE,
                   virtual_stages=v, schedule_class=mesh.pp_schedule_class,
                   stage_ids=[list(ids) for ids in mesh.pp_stage_ids])
    groups = pipeline.stage_ranks(mesh)
    stages = pipeline.stage_of(mesh)
    measured: dict[int, dict] = {}
    if tables is not None and len(tables.breakdown):
        bd = tables.breakdown
        bd = bd[(bd["step"] >= 0) & bd["device_work"].astype(bool)]
        measured = {int(r["stage"]): r for r in pipeline.stage_bubbles(bd, stages).to_dict("records")}
        steps = int(bd.groupby("rank")["step"].nunique().max()) if len(bd) else 0
        out.pairs = [_pair(r) for r in pipeline.p2p_pairs(
            _send_recv(tables), stages, p, steps).to_dict("records")]
    for s, ranks in enumerate(groups):
        r = measured.get(s)
        out.per_stage.append(PipelineStage(
            stage=s, ranks=[int(x) for x in (r["ranks"] if r else ranks)],
            rank_steps=int(r["rank_steps"]) if r else 0,
            **{k: (float(r[k]) if r else None) for k in ("step_ns", "compute_ns", "bubble_ns",
                                                          "bubble_frac")}))
    return out
