"""Baseline drift between two runs (issue 9): their kept tensors and numerics, without torch.

Which difference is acceptable depends on what changed between the records:

* same versions (python, torch, CUDA, cuDNN, NCCL, paritytrace), device (type and name) and
  precision policy: the baseline is one process on one thread running the same code on the same
  inputs, so it must repeat **bitwise**; any difference is named as non-determinism;
* a different torch (or other version), device or precision policy: the **precision tolerance**
  of the looser precision of the two (analyzer/contract/tolerance.py ``TOLERANCES``,
  torch.testing.assert_close defaults: bf16 if either run is bf16), applied like the parity gate:
  a tensor is within tolerance iff it is finite and ``max |new - old| <= limit(max |old|)``.

Sharding and world size do not enter the baseline (one process, the whole global batch); they are
listed among the differing settings because the runs' distributed numerics differ with them.

When either run kept summaries only (``--keep-tensors summaries``), tensors whose sha256 differ
are compared through their summaries, which give lower bounds: ``max |new - old| >=
max(|max_new - max_old|, |min_new - min_old|)`` (max and min are 1-Lipschitz in the max norm) and
``||new - old||_2 >= | ||new||_2 - ||old||_2 |`` (triangle inequality).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from analyzer.analyses import parity
from analyzer.compare import ranking
from analyzer.contract import schemas, strategies
from analyzer.contract.errors import BadInput
from analyzer.compare.kept import KeptRun, open_kept
from analyzer.contract.text import one_line
from analyzer.contract.report_types import BaselineDrift, DriftComparison, RunEntry, ToleranceOverride
from analyzer.contract.tolerance import Tolerance

DRIFT_SETTINGS = ("versions", "device", "precision", "training", "sharding", "world_size", "model",
                  "batch", "seed")
"""Recorded settings compared between the two runs (all listed when they differ)."""
EXPECTATION_SETTINGS = ("versions", "device", "precision")
"""Settings that decide bitwise vs precision tolerance."""


def settings_of(m: schemas.Manifest) -> dict[str, Any]:
    """The DRIFT_SETTINGS values of a manifest (sharding = strategy + its options, FSDP units
    left out, + the mesh of a mesh strategy: shape, dim names, pp schedule and microbatches;
    device = type and name; model / batch = their shape fields)."""
    opts = {k: v for k, v in m.strategy_options.items() if k != "fsdp_units"}
    if m.mesh is not None:
        opts["mesh"] = {"shape": m.mesh.shape, "dim_names": m.mesh.dim_names,
                        **({"pp_schedule": m.mesh.pp_schedule, "microbatches": m.mesh.microbatches}
                           if m.mesh.pp_schedule else {})}
    return {"versions": msgspec.to_builtins(m.versions), "device": {"type": m.device.type, "name": m.device.name},
            "precision": m.precision, "training": msgspec.to_builtins(m.training),
            "sharding": {"strategy": m.strategy, **opts},
            "world_size": m.world_size, "model": {"hidden": m.model.hidden, "layers": m.model.layers},
            "batch": {"global_batch": m.batch.global_batch, "seq_len": m.batch.seq_len}, "seed": m.seed}


def settings_diff(old: schemas.Manifest, new: schemas.Manifest) -> list[dict[str, Any]]:
    """``[{setting, old, new}]`` for every DRIFT_SETTINGS entry on which the manifests differ
    (dict settings reduced to the keys that differ)."""
    a, b = settings_of(old), settings_of(new)
    out = []
    for key in DRIFT_SETTINGS:
        if a[key] == b[key]:
            continue
        if isinstance(a[key], dict) and isinstance(b[key], dict):
            keys = [k for k in sorted(set(a[key]) | set(b[key])) if a[key].get(k) != b[key].get(k)]
            out.append({"setting": key, "old": {k: a[key].get(k) for k in keys},
                        "new": {k: b[key].get(k) for k in keys}})
        else:
            out.append({"setting": key, "old": a[key], "new": b[key]})
    return out


def expectation(old: schemas.Manifest, new: schemas.Manifest, diffs: list[dict[str, Any]],
                override: ToleranceOverride = ToleranceOverride()) -> dict[str, Any]:
    """``{mode: "bitwise" | "tolerance", tolerance: Tolerance's fields | None, why}`` (module
    docstring). ``override`` replaces the tolerance's numbers."""
    changed = [d["setting"] for d in diffs if d["setting"] in EXPECTATION_SETTINGS]
    if not changed:
        return {"mode": "bitwise", "tolerance": None,
                "why": "same versions, device and precision policy: the baseline (one process, one "
                       "thread, same inputs) must repeat bitwise; any difference is non-determinism"}
    precision = "bf16" if "bf16" in (old.precision, new.precision) else "fp32"
    tol = parity.tolerance_for(precision, rtol=override.rtol, atol=override.atol)
    return {"mode": "tolerance",
            "tolerance": msgspec.to_builtins(tol),
            "why": f"{', '.join(changed)} {'differs' if len(changed) == 1 else 'differ'}: the {precision} precision tolerance applies "
                   f"({tol.describe()}), max |new - old| <= atol + rtol * max |old|"}


def _tolerance(exp: dict[str, Any]) -> Tolerance:
    """The tolerance of ``expectation``'s result; bitwise: rtol = atol = 0."""
    return Tolerance(**(exp["tolerance"] or {"rtol": 0.0, "atol": 0.0, "source": "bitwise"}))


def _status(exp: dict[str, Any], max_abs_diff: float, limit: float, finite: bool, bound: bool) -> tuple[str, bool]:
    if exp["mode"] == "bitwise":
        return "non-determinism", False
    if not finite or not max_abs_diff <= limit:
        return "exceeds tolerance", False
    return ("within tolerance (summary bound)" if bound else "within tolerance"), True


def compare_tensors(old: KeptRun, new: KeptRun, exp: dict[str, Any]) -> pd.DataFrame:
    """One row per kept tensor name of either run: group, tensor, shape, basis ("sha256",
    "tensors" or "summaries"), bitwise_equal, max_abs_diff, rel_l2 (``||new - old|| / ||old||``),
    max_abs_ref (``max |old|``), limit, status, ok. With basis "summaries" the differences are
    lower bounds (module docstring)."""
    a, b = old.kept.set_index("tensor"), new.kept.set_index("tensor")
    tol = _tolerance(exp)
    order = {g: i for i, g in enumerate(schemas.KEPT_GROUPS)}
    names = sorted(set(a.index) | set(b.index), key=lambda n: (order.get(n.split(".", 1)[0], 99), n))
    rows = []
    for name in names:
        row = {"group": name.split(".", 1)[0], "tensor": name, "shape": None, "basis": "sha256",
               "bitwise_equal": False, "max_abs_diff": math.nan, "rel_l2": math.nan,
               "max_abs_ref": math.nan, "limit": math.nan}
        if name not in a.index or name not in b.index:
            row.update(status=f"only in {'NEW' if name not in a.index else 'OLD'}", ok=False)
            rows.append(row)
            continue
        ra, rb = a.loc[name], b.loc[name]
        row["shape"] = list(rb["shape"])
        if tuple(ra["shape"]) != tuple(rb["shape"]):
            row.update(status=f"shape differs ({list(ra['shape'])} vs {list(rb['shape'])})", ok=False)
        elif ra["sha256"] == rb["sha256"]:
            row.update(bitwise_equal=True, max_abs_diff=0.0, rel_l2=0.0,
                       max_abs_ref=float(ra["max_abs"] or 0.0), status="identical", ok=True)
            row["limit"] = tol.limit(row["max_abs_ref"])
        elif old.tensors is not None and new.tensors is not None:
            x, r = new.tensors[name].reshape(-1), old.tensors[name].reshape(-1)
            d = x - r
            ref_norm = float(np.sqrt((r * r).sum()))
            diff_norm = float(np.sqrt((d * d).sum()))
            mad = float(np.abs(d).max()) if d.size else 0.0
            mar = float(np.abs(r).max()) if r.size else 0.0
            finite = bool(np.isfinite(x).all() and np.isfinite(r).all())
            limit = tol.limit(mar)
            status, ok = _status(exp, mad, limit, finite, bound=False)
            row.update(basis="tensors", max_abs_diff=mad, max_abs_ref=mar, limit=limit, status=status, ok=ok,
                       rel_l2=(diff_norm / ref_norm) if ref_norm else (0.0 if diff_norm == 0 else math.inf))
        else:
            mad = max(abs(rb["max"] - ra["max"]), abs(rb["min"] - ra["min"]))
            ref_norm = math.sqrt(ra["sq_sum"])
            l2 = abs(math.sqrt(rb["sq_sum"]) - ref_norm)
            mar = float(ra["max_abs"])
            finite = ra["nonfinite"] == 0 and rb["nonfinite"] == 0
            limit = tol.limit(mar)
            status, ok = _status(exp, mad, limit, finite, bound=True)
            row.update(basis="summaries", max_abs_diff=float(mad), max_abs_ref=mar, limit=limit,
                       rel_l2=(l2 / ref_norm) if ref_norm else math.nan, status=status, ok=ok)
        rows.append(row)
    return pd.DataFrame(rows)


def _loss_by_step(run: Path) -> dict[int, float]:
    path = run / schemas.NUMERICS_NAME
    if not path.exists():
        return {}
    n = parity.read_numerics(path)
    v = n[(n["kind"] == "loss") & (n["metric"] == "value")]
    return {int(s): float(g["value"].mean()) for s, g in v.groupby("step")}


def compare_numerics(old: KeptRun, new: KeptRun) -> dict[str, Any]:
    """The distributed runs' numerics side by side: loss per step (mean over ranks) of each run,
    and each run's parity verdict against its own baseline."""
    lo, ln = _loss_by_step(old.path), _loss_by_step(new.path)
    loss = [{"step": s, "old": lo[s], "new": ln[s], "abs_diff": abs(ln[s] - lo[s])}
            for s in sorted(set(lo) & set(ln))]
    out = {"loss": loss}
    for side, run in (("old", old), ("new", new)):
        res = parity.check_run(run.path, run.manifest)
        out[f"{side}_parity"] = {"status": res.status, "max_grad_rel_l2": res.max_grad_rel_l2,
                                 "reason": res.reason}
    return out


def _as_base_metrics(numerics: pd.DataFrame) -> pd.DataFrame:
    """grad / param rows with the golden_* metrics renamed to the base metric names (the golden
    tensor as reference), so parity.check_tensors reduces and checks them."""
    rows = numerics[numerics["kind"].isin(("grad", "param"))]
    base = rows[rows["metric"].isin(("numel", "sq_sum", "nonfinite", "replicated"))]
    gold = rows[rows["metric"].isin(schemas.GOLDEN_METRICS)].copy()
    gold["metric"] = gold["metric"].str.removeprefix("golden_")
    return pd.concat([base, gold], ignore_index=True)


def golden_link(old: KeptRun, new: KeptRun, exp: dict[str, Any]) -> dict[str, Any] | None:
    """When NEW was recorded with ``--golden OLD``: whether it reused OLD's batch and initial
    state (sha256 equal), and NEW's distributed step-0 tensors against OLD's kept tensors (from
    numerics.parquet's golden_* metrics, reduced and checked like parity): the failing ones."""
    g = new.manifest.golden
    if g is None or g.run_id != old.manifest.run_id:
        return None
    out = {"batch_sha256_equal": g.batch_sha256_equal, "init_sha256_equal": g.init_sha256_equal,
           "distributed": None}
    path = new.path / schemas.NUMERICS_NAME
    if not strategies.is_reference(new.manifest.strategy) and path.exists():
        n = parity.read_numerics(path)
        if n["metric"].isin(schemas.GOLDEN_METRICS).any():
            checked = parity.check_tensors(_as_base_metrics(n), _tolerance(exp), path=str(path))
            out["distributed"] = {
                "tensors": int(len(checked)), "max_rel_l2": float(checked["rel_l2"].max()) if len(checked) else None,
                "max_abs_diff": float(checked["max_abs_diff"].max()) if len(checked) else None,
                "beyond": [f"{r.kind} {r.tensor}" for r in checked[~checked["passed"].astype(bool)].itertuples()]}
    return out


def drift(old_dir: Path | str, new_dir: Path | str,
          override: ToleranceOverride = ToleranceOverride()) -> dict[str, Any]:
    """Compare two run directories' kept tensors and numerics. Returns a JSON-ready dict:
    old / new (path, run_name, run_id, keep_tensors), settings_differ, expectation, tensors
    (``compare_tensors`` rows), numerics, golden (``golden_link``), ok (bool), verdict (one line).
    Raises ``BadInput`` for a run without kept tensors or with a tampered one (analyzer/compare/kept.py).
    ``override``: the user's tolerance, replacing the precision's when the tolerance applies."""
    old, new = open_kept(old_dir), open_kept(new_dir)
    diffs = settings_diff(old.manifest, new.manifest)
    exp = expectation(old.manifest, new.manifest, diffs, override)
    t = compare_tensors(old, new, exp)
    bad = t[~t["ok"].astype(bool)]
    n = len(t)
    if bad.empty and exp["mode"] == "bitwise":
        verdict = f"bitwise identical: all {n} kept tensors have equal sha256 (the baseline is deterministic)"
    elif bad.empty:
        verdict = f"all {n} kept tensors within the {exp['tolerance']['precision']} tolerance " \
                  f"({int(t['bitwise_equal'].sum())} bitwise identical)"
    else:
        first = bad.iloc[0]
        what = "non-determinism" if exp["mode"] == "bitwise" else "beyond tolerance"
        verdict = (f"{what}: {len(bad)} of {n} kept tensors differ (first {first['tensor']}: "
                   f"{first['status']}, max |diff| {first['max_abs_diff']:.3g}, limit {first['limit']:.3g})")

    def side(run: KeptRun) -> dict[str, Any]:
        return {"path": str(run.path), "run_name": run.manifest.run_name, "run_id": run.manifest.run_id,
                "keep_tensors": "full" if run.tensors is not None else "summaries"}

    def clean(v: Any) -> Any:
        return None if isinstance(v, float) and not math.isfinite(v) else v

    return {"old": side(old), "new": side(new), "settings_differ": diffs, "expectation": exp,
            "tensors": [{k: clean(v) for k, v in r.items()} for r in t.to_dict("records")],
            "numerics": compare_numerics(old, new), "golden": golden_link(old, new, exp),
            "ok": bool(bad.empty), "verdict": verdict}


def report_section(runs: list[RunEntry]) -> BaselineDrift | None:
    """The report's baseline-drift section, or None when every recorded run shares versions,
    device and precision policy (then nothing can have drifted).

    Runs are grouped by those settings; the first run of the first group is the reference and
    the first run of every other group is compared with it (``drift``): which settings differ,
    the expectation, ok, the verdict and the first 10 tensors beyond it; or why not (``error``).
    A group of declared arms whose difference their declared options explain (``_own_baseline``)
    is not compared: the note says it was checked against its own baseline.
    """
    groups: dict[str, list[RunEntry]] = {}
    for r in runs:
        if r.settings:
            dev = r.settings.get("device") or {}
            key = (r.settings.get("versions"), dev.get("type"), dev.get("name"),
                   r.settings.get("precision"))
            groups.setdefault(repr(key), []).append(r)
    if len(groups) < 2:
        return None
    ref_group, *other_groups = groups.values()
    ref = ref_group[0]
    own, compared = [], []
    for group in other_groups:
        why = _own_baseline(ref_group, group, runs)
        if why is None:
            compared.append(group[0])
        else:
            own.append(why)
    comparisons = []
    for other in compared:
        try:
            d = drift(ref.path, other.path)
        except BadInput as exc:
            comparisons.append(DriftComparison(old=ref.name, new=other.name, error=str(exc)))
            continue
        comparisons.append(DriftComparison(
            old=ref.name, new=other.name, settings_differ=d["settings_differ"],
            expectation=d["expectation"], ok=d["ok"], verdict=d["verdict"],
            beyond=[t["tensor"] for t in d["tensors"] if not t["ok"]][:10]))
    notes = (["runs were recorded with different versions, device or precision policy: their "
              "baselines are compared here (analyzer drift) and the runs are not ranked against "
              "each other as one experiment"] if comparisons else [])
    if own:
        notes.append("; ".join(own) + ": the declared arms are ranked together, each "
                     "checked against its own baseline")
    return BaselineDrift(reference=ref.name, comparisons=comparisons, note="; ".join(notes))


def _own_baseline(ref_group: list[RunEntry], group: list[RunEntry],
                  runs: list[RunEntry]) -> str | None:
    """Why ``group``'s runs were checked against their own baseline, not ``ref_group``'s:
    ``arm precision=bf16 was checked against its own baseline (its experiment.baseline differs
    from arm precision=fp32's) because it changes the numerics (precision bf16, not fp32)``.
    Only for declared arms of the ranked experiment whose every difference from the reference
    group (versions, device, precision) its declared options explain -- the ranking's rule,
    ``ranking.explained_settings``, and whose ``experiment.baseline`` differs from the
    reference's; None otherwise (the baselines are then compared)."""
    chosen = ranking.ranked_experiment([r for r in runs if not r.incomplete])[0]
    explained = ranking.explained_settings(chosen)
    ids = {id(r) for r in chosen}
    if not explained or not all(id(r) in ids for r in ref_group + group):
        return None
    a, b = ref_group[0], group[0]
    differ = [k for k in ("versions", "device", "precision")
              if ranking.setting_of(a, k) != ranking.setting_of(b, k)]
    base = lambda r: (r.experiment or {}).get("baseline")
    if not set(differ) <= explained or base(a) is None or base(a) == base(b):
        return None
    values = ", ".join(f"{k} {ranking.show_setting(ranking.setting_of(b, k))}, not "
                       f"{ranking.show_setting(ranking.setting_of(a, k))}" for k in differ)
    arms = list(dict.fromkeys(r.arm for r in group))
    return (f"arm{'s' if len(arms) > 1 else ''} {', '.join(one_line(x) for x in arms)} "
            f"{'were' if len(arms) > 1 else 'was'} checked against "
            f"{'their' if len(arms) > 1 else 'its'} own baseline (experiment.baseline "
            f"{one_line(str(base(b)))}, not {one_line(str(base(a)))} of arm "
            f"{one_line(a.arm)}) because {'they change' if len(arms) > 1 else 'it changes'} "
            f"the numerics ({one_line(values)})")
