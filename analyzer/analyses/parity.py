"""The parity gate, recomputed from ``numerics.parquet`` (never from a stored flag).

Rule (docs/method.md "Reading the report"; contract in ``analyzer/contract/schemas.py``):

1. Reduce each tensor's metrics across ranks. A *sharded* tensor (``replicated == 0``: FSDP
   shards, per-rank activation slices) is one tensor split over the ranks: sums are summed
   (``numel``, ``sq_sum``, ``ref_sq_sum``, ``diff_sq_sum``, ``nonfinite``) and maxima maxed
   (``max_abs_diff``, ``max_abs_ref``). A *replicated* tensor (``replicated == 1``: DDP) is held
   whole by every rank; each rank is checked on its own and the tensor is reported with its worst
   rank (the rank with non-finite values, else the one furthest over -- or closest to -- its limit).
2. ``rel_l2 = sqrt(diff_sq_sum) / sqrt(ref_sq_sum)``; 0 when both sums are 0, inf when only the
   reference is 0.
3. A tensor passes iff it has no NaN/inf (``nonfinite == 0`` and every error metric finite) and
   ``max_abs_diff <= tol.limit(max_abs_ref)`` (``atol + rtol * max_abs_ref``). This is the
   max-norm form of ``torch.testing.assert_close``'s elementwise ``|x - r| <= atol + rtol *
   |r|``: whenever every element passes assert_close, ``max |x - r| <= atol + rtol * max |r|``
   holds too, so this rule is never stricter than torch's.
4. Loss at each recorded step k: the distributed loss is the mean over ranks of ``value`` (the
   ranks' slices are equal); it passes iff finite and ``|loss - ref| <= (k + 1) * (atol + rtol *
   |ref|)``, the divergence envelope (``Tolerance.envelope``: each step may add one step's
   rounding). With AdamW the parameters after the first step get ``schemas.adam_first_step_bound``
   on top of their limit.
5. First divergence, in this order: activations by forward order (``seq``), gradients by
   parameter order, parameters after the first optimizer step, then the loss by step.

Tolerances (analyzer/contract/tolerance.py): ``TOLERANCES`` by the manifest's precision
(torch.testing.assert_close defaults), or ``mixed_precision_tolerance`` for a
``--mixed-precision`` record, ``compile_tolerance`` for a ``--compile`` one, overridable by the user; every output states them with their source.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.contract import schemas, strategies
from analyzer.contract.errors import BadInput
from analyzer.analyses.memory import read_parquet
from analyzer.contract.report_types import FailedCheck, FirstDivergence, LossStep, Parity, ToleranceOverride
from analyzer.contract.tolerance import (TOLERANCES, Tolerance, compile_tolerance, float8_tolerance,
                                        mixed_precision_tolerance)

KIND_ORDER = ("activation", "grad", "param")
"""Tensor kinds in first-divergence order (the loss comes after them)."""

_SUM_METRICS = ("numel", "sq_sum", "ref_sq_sum", "diff_sq_sum", "nonfinite")
_MAX_METRICS = ("max_abs_diff", "max_abs_ref")


def tolerance_for(precision: str, *, rtol: float | None = None, atol: float | None = None,
                  mixed_precision: list[str] | None = None, world_size: int = 1,
                  float8: bool = False, compile: str | None = None) -> Tolerance:
    """Tolerance for ``precision`` from ``TOLERANCES`` -- or, for a record with
    ``--mixed-precision`` dtypes ``mixed_precision`` on ``world_size`` ranks,
    ``mixed_precision_tolerance``; for a ``--float8`` record ``float8_tolerance``; else for
    one with ``--compile`` mode ``compile``, ``compile_tolerance`` -- with the user's
    ``--rtol`` / ``--atol`` (None: keep).

    Raises ``ValueError`` for an unknown precision or dtype, or a negative / non-finite override.
    """
    if precision not in schemas.PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected one of {schemas.PRECISIONS}")
    tol = (float8_tolerance() if float8 else
           mixed_precision_tolerance(mixed_precision, world_size) if mixed_precision else
           compile_tolerance(precision, world_size, compile) if compile else TOLERANCES[precision])
    overridden = [n for n, v in (("rtol", rtol), ("atol", atol)) if v is not None]
    if not overridden:
        return tol
    # + 0.0 turns a user's -0.0 into 0.0 (IEEE 754: -0.0 + 0.0 == +0.0), printed "0", not "-0"
    return Tolerance(rtol=tol.rtol if rtol is None else float(rtol) + 0.0,
                     atol=tol.atol if atol is None else float(atol) + 0.0, precision=tol.precision,
                     source=f"{' and '.join(overridden)} set by the user; otherwise {tol.source}")


def read_numerics(path: Path | str) -> pd.DataFrame:
    """Read ``numerics.parquet`` into a DataFrame with plain ``str`` name columns.

    Columns: rank, step, kind, tensor, seq (int64), metric (str), value (float64, NaN when null).
    Raises ``BadInput`` naming the file when it is unreadable, newer than this reader, or lacks a
    column of ``schemas.NUMERICS_SCHEMA``.
    """
    path = Path(path)
    df = read_parquet(path, schemas.NUMERICS_SCHEMA)
    out = df.astype({"rank": "int64", "step": "int64", "kind": str, "tensor": str, "seq": "int64",
                     "metric": str, "value": "float64"})
    bad_kinds = sorted(set(out["kind"]) - set(schemas.NUMERICS_KINDS))
    if bad_kinds:
        raise BadInput(path, "bad_run_file", f"unknown kind(s) {', '.join(bad_kinds)}",
                       "re-record the run with this version of tracer")
    return out


def _wide(numerics: pd.DataFrame, path: str) -> pd.DataFrame:
    """Tensor rows pivoted to one row per (kind, tensor, seq, step, rank) with metric columns."""
    rows = numerics[numerics["kind"].isin(KIND_ORDER)]
    keys = ["kind", "tensor", "seq", "step", "rank"]
    dup = rows.duplicated(keys + ["metric"])
    if dup.any():
        r = rows[dup].iloc[0]
        raise BadInput(path, "bad_run_file",
                       f"metric {r['metric']} of {r['kind']} {r['tensor']} appears twice for "
                       f"rank {r['rank']} step {r['step']}", "re-record the run")
    wide = rows.pivot(index=keys, columns="metric", values="value").reset_index()
    wide.columns.name = None
    missing = [m for m in schemas.TENSOR_METRICS if m not in wide.columns]
    if missing and len(wide):
        raise BadInput(path, "bad_run_file", f"lacks metric(s) {', '.join(missing)}",
                       "re-record the run with this version of tracer")
    for m in schemas.TENSOR_METRICS:
        if m not in wide.columns:
            wide[m] = pd.Series(dtype="float64")
    return wide


def impossible_sums(wide: pd.DataFrame) -> str | None:
    """The first rank's tensor row of ``wide`` (``_wide``: one row per kind, tensor, seq, step,
    rank) whose metrics no tensor can have, in words, None when every row can: numel not a
    whole number >= 0, a sum of squares or a maximum below 0, nonfinite outside [0, numel],
    replicated not 0 or 1, and -- the sums being float64 sums of non-negative terms, each at
    least its largest term (rounding is monotone) and at most numel x it -- ``max_abs_diff^2 >
    diff_sq_sum`` or ``max_abs_ref^2 > ref_sq_sum`` (exact), or a sum above numel x max^2
    (beyond 1e-6 relative rounding). Rows with NaN/inf are left to the gate (they fail it)."""
    if wide.empty:
        return None
    m = {c: wide[c].to_numpy(float) for c in schemas.TENSOR_METRICS}
    fin = np.isfinite(np.column_stack([m[c] for c in schemas.TENSOR_METRICS])).all(axis=1)
    with np.errstate(over="ignore", invalid="ignore"):
        checks = [
            (m["numel"] < 0) | (m["numel"] != np.floor(m["numel"])), "numel is not a count",
            (m["sq_sum"] < 0) | (m["ref_sq_sum"] < 0) | (m["diff_sq_sum"] < 0),
            "a sum of squares is negative",
            (m["max_abs_diff"] < 0) | (m["max_abs_ref"] < 0), "a maximum absolute value is negative",
            (m["nonfinite"] < 0) | (m["nonfinite"] > m["numel"]), "nonfinite is outside [0, numel]",
            ~np.isin(m["replicated"], (0.0, 1.0)), "replicated is neither 0 nor 1",
            m["max_abs_diff"] ** 2 > m["diff_sq_sum"],
            "max_abs_diff is above sqrt(diff_sq_sum) (a sum of squares holds its largest term)",
            m["max_abs_ref"] ** 2 > m["ref_sq_sum"],
            "max_abs_ref is above sqrt(ref_sq_sum) (a sum of squares holds its largest term)",
            (m["diff_sq_sum"] > m["numel"] * m["max_abs_diff"] ** 2 * (1 + 1e-6))
            | (m["ref_sq_sum"] > m["numel"] * m["max_abs_ref"] ** 2 * (1 + 1e-6)),
            "a sum of squares is above numel x its largest term squared",
        ]
    for bad, what in zip(checks[::2], checks[1::2]):
        bad = bad & fin
        if bad.any():
            r = wide[bad].iloc[0]
            return f"{r['kind']} {r['tensor']} on rank {r['rank']} at step {r['step']}: {what}"
    return None


def _rel_l2(diff_sq: pd.Series, ref_sq: pd.Series) -> pd.Series:
    """sqrt(diff_sq) / sqrt(ref_sq); 0 when both are 0, inf when only ref_sq is 0; NaN stays NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.sqrt(diff_sq.to_numpy(float)) / np.sqrt(ref_sq.to_numpy(float))
    both_zero = (diff_sq.to_numpy(float) == 0) & (ref_sq.to_numpy(float) == 0)
    out[both_zero] = 0.0
    return pd.Series(out, index=diff_sq.index)


def check_tensors(numerics: pd.DataFrame, tol: Tolerance, *, path: str = "numerics.parquet",
                  adam: tuple[float, float] | None = None) -> pd.DataFrame:
    """Reduce tensor metrics across ranks and check each tensor against ``tol``.

    ``adam``: (lr, eps) of a record with ``--optimizer adamw``: the limit of each parameter after
    the first step grows by ``schemas.adam_first_step_bound(lr, eps, d)``, d = the same
    tensor's step-0 gradient max_abs_diff (docs/method.md "Reading the report", AdamW).

    ``numerics`` is ``read_numerics`` output. Returns one row per (kind, tensor, step), sorted in
    first-divergence order, with columns: kind, tensor, seq, step, reduction ("sharded" |
    "replicated"), n_ranks, worst_rank (replicated only, else -1), numel, sq_sum, ref_sq_sum,
    diff_sq_sum, max_abs_diff, max_abs_ref, nonfinite, rel_l2, limit (``tol.limit(max_abs_ref)``),
    finite (bool), passed (bool). Raises ``BadInput`` when a tensor is marked replicated on some
    ranks and sharded on others, or a metric is missing.
    """
    wide = _wide(numerics, path)
    cols = ["kind", "tensor", "seq", "step", "reduction", "n_ranks", "worst_rank", *_SUM_METRICS,
            *_MAX_METRICS, "rel_l2", "limit", "finite", "passed"]
    if wide.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    group_keys = ["kind", "tensor", "seq", "step"]
    flags = wide.groupby(group_keys, sort=False)["replicated"].agg(["min", "max"])
    mixed = flags[flags["min"] != flags["max"]]
    if len(mixed):
        kind, tensor, _, step = mixed.index[0]
        raise BadInput(path, "bad_run_file",
                       f"{kind} {tensor} at step {step} is replicated on some ranks and sharded on "
                       "others", "re-record the run")
    wide["_limit"] = tol.limit(wide["max_abs_ref"])
    err = wide[["max_abs_diff", "diff_sq_sum"]].to_numpy(float)
    wide["_bad"] = (wide["nonfinite"].fillna(1) > 0) | ~np.isfinite(err).all(axis=1)
    wide["_excess"] = wide["max_abs_diff"] - wide["_limit"]

    out_rows = []
    for key, g in wide.groupby(group_keys, sort=False):
        replicated = bool(g["replicated"].iloc[0] >= 0.5)
        if replicated:
            # Worst rank: non-finite first, then largest excess over the limit (NaN counts worst).
            order = g.assign(_ex=g["_excess"].fillna(np.inf)).sort_values(
                ["_bad", "_ex", "rank"], ascending=[False, False, True])
            w = order.iloc[0]
            vals = {m: float(w[m]) for m in (*_SUM_METRICS, *_MAX_METRICS)}
            worst_rank = int(w["rank"])
        else:
            vals = {m: float(g[m].sum(skipna=False)) for m in _SUM_METRICS}
            vals.update({m: float(g[m].max(skipna=False)) for m in _MAX_METRICS})
            worst_rank = -1
        out_rows.append({"kind": key[0], "tensor": key[1], "seq": int(key[2]), "step": int(key[3]),
                         "reduction": "replicated" if replicated else "sharded",
                         "n_ranks": int(g["rank"].nunique()), "worst_rank": worst_rank, **vals,
                         "_bad_any": bool(g["_bad"].any())})
    out = pd.DataFrame(out_rows)
    out["rel_l2"] = _rel_l2(out["diff_sq_sum"], out["ref_sq_sum"])
    out["limit"] = tol.limit(out["max_abs_ref"])
    if adam is not None:
        grad_diff = out[(out["kind"] == "grad") & (out["step"] == 0)].set_index("tensor")["max_abs_diff"]
        first = (out["kind"] == "param") & (out["step"] == 0)
        # a parameter without a gradient row: the bound at its worst (2 lr), nothing assumed
        d = out.loc[first, "tensor"].map(grad_diff).fillna(math.inf)
        out.loc[first, "limit"] += [schemas.adam_first_step_bound(adam[0], adam[1], x) for x in d]
    metrics = out[["max_abs_diff", "diff_sq_sum", "max_abs_ref"]].to_numpy(float)
    out["finite"] = ~out["_bad_any"] & np.isfinite(metrics).all(axis=1) & (out["nonfinite"] == 0)
    out["passed"] = out["finite"] & (out["max_abs_diff"] <= out["limit"])
    out["_k"] = out["kind"].map({k: i for i, k in enumerate(KIND_ORDER)})
    out = out.sort_values(["_k", "step", "seq", "tensor"], kind="stable").reset_index(drop=True)
    return out[cols]


def check_loss(numerics: pd.DataFrame, tol: Tolerance, *, path: str = "numerics.parquet") -> pd.DataFrame:
    """Check the distributed loss at each recorded step against the divergence envelope.

    Returns one row per step: step, n_ranks, loss (mean over ranks of ``value``), ref (the
    baseline's ``ref_value``, lowest rank's), abs_diff, rel_diff (``abs_diff / |ref|``; 0 when
    both are 0, inf when only ref is 0), limit (``tol.envelope``: ``(step + 1) * (atol + rtol *
    |ref|)``, growing with the step, docs/method.md "Reading the report"), passed (bool).
    Raises ``BadInput`` when a step lacks ``value`` or ``ref_value``.
    """
    rows = numerics[numerics["kind"] == "loss"]
    cols = ["step", "n_ranks", "loss", "ref", "abs_diff", "rel_diff", "limit", "passed"]
    if rows.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in cols})
    out = []
    for step, g in rows.groupby("step", sort=True):
        values = g[g["metric"] == "value"].sort_values("rank")
        refs = g[g["metric"] == "ref_value"].sort_values("rank")
        if values.empty or refs.empty:
            raise BadInput(path, "bad_run_file", f"loss at step {step} lacks value or ref_value",
                           "re-record the run")
        loss = float(values["value"].mean(skipna=False))
        ref = float(refs["value"].iloc[0])
        diff = abs(loss - ref)
        if diff == 0 and ref == 0:
            rel = 0.0
        else:
            rel = diff / abs(ref) if ref != 0 else math.inf
        limit = tol.envelope(int(step), ref)
        ok = math.isfinite(loss) and math.isfinite(ref) and diff <= limit
        out.append({"step": int(step), "n_ranks": int(values["rank"].nunique()), "loss": loss,
                    "ref": ref, "abs_diff": diff, "rel_diff": rel, "limit": limit, "passed": ok})
    return pd.DataFrame(out, columns=cols)


def _divergence(row: pd.Series, kind: str, tol: Tolerance) -> FirstDivergence:
    loss = kind == "loss"
    return FirstDivergence(
        tensor="loss" if loss else str(row["tensor"]), kind=kind, step=int(row["step"]),
        rel_l2=float(row["rel_diff" if loss else "rel_l2"]),
        max_abs_diff=float(row["abs_diff" if loss else "max_abs_diff"]), limit=float(row["limit"]),
        nonfinite=(0 if math.isfinite(row["loss"]) else 1) if loss else float(row["nonfinite"]),
        tolerance=tol,
        # named once: the loss's kind and tensor are both "loss" ("loss loss" read as a typo)
        subject="the loss" if loss else f"{kind} {row['tensor']}")


def unverified(numerics: pd.DataFrame, world_size: int | None, *,
               path: str = "numerics.parquet",
               baseline: dict[str, set[str]] | None = None) -> str | None:
    """What of the run ``numerics`` (``read_numerics`` output) does not cover, in words, or None.

    Every rank of the tracer writes a row set for every compared tensor (an empty shard gives
    zero sums, tracer/numerics.py ``tensor_metrics``) and the loss of every recorded step, so a
    rank in ``range(world_size)`` (the manifest's; None: the ranks present) with no rows, or a
    (kind, tensor, step) or loss step that lacks a rank, was not checked: a sharded tensor
    summed over fewer ranks, or a replicated one without its worst rank, is not verified.
    ``baseline``: kind -> the tensors the baseline kept (``baseline_tensors``); one of them
    that no rank wrote (removed from every rank) was not checked either.
    """
    for kind, names in sorted((baseline or {}).items()):
        have = set(numerics.loc[numerics["kind"] == kind, "tensor"].astype(str))
        gone = sorted(names - have)
        if gone:
            more = f" and {len(gone) - 1} more" if len(gone) > 1 else ""
            return (f"{path} has no rows of {kind} {gone[0]}{more} on any rank, though the "
                    "baseline has it")
    present = sorted(set(numerics["rank"].tolist()))
    expected = list(range(world_size)) if world_size else present
    gone = [r for r in expected if r not in present]
    if gone:
        return f"{path} has no rows of rank(s) {', '.join(map(str, gone))} (world size {world_size})"
    keys = ["kind", "tensor", "step"]
    have = numerics[keys + ["rank"]].drop_duplicates().groupby(keys, sort=False)["rank"].agg(set)
    lacking = [(k, sorted(set(expected) - v)) for k, v in have.items() if set(expected) - v]
    if not lacking:
        return None
    (kind, tensor, step), ranks = lacking[0]
    what = f"the loss at step {step}" if kind == "loss" else f"{kind} {tensor} (step {step})"
    more = f" and {len(lacking) - 1} more tensor(s) or step(s)" if len(lacking) > 1 else ""
    return f"{path} lacks {what} on rank(s) {', '.join(map(str, ranks))}{more}"


def evaluate(numerics: pd.DataFrame, tol: Tolerance, *, path: str = "numerics.parquet",
             world_size: int | None = None, adam: tuple[float, float] | None = None,
             baseline: dict[str, set[str]] | None = None) -> Parity:
    """Verdict of a distributed run from its numerics (``read_numerics`` output), with its first
    10 failed tensor checks (the whole tables: ``check_tensors``, ``check_loss``).

    Status ``pass`` when every tensor and every loss step passes on every rank of
    ``world_size`` (``unverified``); ``fail`` with the first divergence when a check fails;
    ``not_recorded`` ("not verified") when there are no gradient rows or no loss rows, or when
    a rank or a tensor of a rank is missing, or a tensor of ``baseline`` (``unverified``) is
    missing from every rank (unverified is not verified).
    """
    parity = _evaluate(numerics, tol, path=path, world_size=world_size, adam=adam,
                       baseline=baseline)
    parity.loss_curve = loss_curve(check_loss(numerics, tol, path=path))
    return parity


def loss_curve(loss: pd.DataFrame) -> list[LossStep]:
    """``check_loss`` rows as the report's loss curve (step, loss, ref, limit)."""
    return [LossStep(step=int(r.step), loss=float(r.loss), ref=float(r.ref), limit=float(r.limit))
            for r in loss.itertuples()]


def _evaluate(numerics: pd.DataFrame, tol: Tolerance, *, path: str, world_size: int | None,
              adam: tuple[float, float] | None,
              baseline: dict[str, set[str]] | None = None) -> Parity:
    tensors = check_tensors(numerics, tol, path=path, adam=adam)
    loss = check_loss(numerics, tol, path=path)
    failed = tensors[~tensors["passed"].astype(bool)]
    bad_loss = loss[~loss["passed"].astype(bool)]
    checks = [FailedCheck(kind=r.kind, tensor=r.tensor, step=int(r.step), rel_l2=float(r.rel_l2),
                          max_abs_diff=float(r.max_abs_diff), limit=float(r.limit))
              for r in failed.head(10).itertuples()]
    grads = tensors[tensors["kind"] == "grad"]
    if grads.empty or loss.empty:
        return Parity(status="not_recorded", tolerance=tol, failed_checks=checks,
                      reason=f"{path} holds no {'gradient' if grads.empty else 'loss'} rows")
    gap = unverified(numerics, world_size, path=path, baseline=baseline)
    first = (_divergence(failed.iloc[0], str(failed.iloc[0]["kind"]), tol) if len(failed) else
             _divergence(bad_loss.iloc[0], "loss", tol) if len(bad_loss) else None)
    reason = (f"first divergence: {first.describe()}; "
              f"{len(failed) + len(bad_loss)} check(s) failed" if first else
              f"all {len(tensors)} tensors and the loss at {len(loss)} step(s) within "
              f"{tol.describe()}")
    if gap and not first:
        return Parity(status="not_recorded", tolerance=tol, failed_checks=checks,
                      reason=f"not verified: {gap}")
    if gap:
        reason += f"; not verified: {gap}"
    return Parity(status="fail" if first else "pass", reason=reason, tolerance=tol,
                  first_divergence=first, failed_checks=checks,
                  max_grad_rel_l2=float(grads["rel_l2"].max(skipna=False)),
                  loss_max_rel_diff=float(loss["rel_diff"].max(skipna=False)))


def check_run(run_dir: Path | str, manifest: schemas.Manifest | None,
              override: ToleranceOverride = ToleranceOverride()) -> Parity:
    """Parity verdict of one run directory, with the user's tolerance ``override``.

    ``manifest`` is the run's manifest (None for foreign traces -> ``not_recorded``). The
    ``single`` strategy is the baseline itself -> ``reference`` (its loss rows are still checked
    for NaN/inf: a non-finite baseline fails). Raises ``BadInput`` for a malformed numerics file
    or an unknown precision in the manifest.
    """
    run_dir = Path(run_dir)
    if manifest is None:
        return Parity(status="not_recorded",
                      reason="no manifest: foreign traces carry no numerics to check")
    try:
        training = manifest.training
        tol = tolerance_for(manifest.precision, rtol=override.rtol, atol=override.atol,
                            mixed_precision=training.mixed_precision if training else None,
                            world_size=manifest.world_size,
                            float8=manifest.strategy_options.get("float8") is True,
                            compile=training.compile.mode if training and training.compile else None)
    except ValueError as exc:
        raise BadInput(run_dir / schemas.MANIFEST_NAME, "bad_run_file", str(exc),
                       "re-record the run") from None
    path = run_dir / schemas.NUMERICS_NAME
    if not path.exists():
        return Parity(status="not_recorded", tolerance=tol,
                      reason=f"{schemas.NUMERICS_NAME} is missing from the run directory")
    numerics = read_numerics(path)
    if strategies.is_reference(manifest.strategy):
        loss = check_loss(numerics, tol, path=str(path))
        if len(loss) and not np.isfinite(loss[["loss", "ref"]].to_numpy(float)).all():
            bad = loss[~np.isfinite(loss[["loss", "ref"]].to_numpy(float)).all(axis=1)].iloc[0]
            return Parity(status="fail", tolerance=tol, first_divergence=_divergence(bad, "loss", tol),
                          reason=f"the baseline's loss is NaN/inf at step {int(bad['step'])}")
        return Parity(status="reference", tolerance=tol, loss_curve=loss_curve(loss),
                      reason="single-device baseline: the reference the others are checked against")
    if why := impossible_sums(_wide(numerics, str(path))):  # a record's file, not a model's
        raise BadInput(path, "bad_run_file", f"{why}: not numbers tracer record writes",
                       "re-record the run")
    return evaluate(numerics, tol, path=str(path), world_size=manifest.world_size,
                    adam=adam_settings(manifest), baseline=baseline_tensors(run_dir, manifest))


def baseline_tensors(run_dir: Path, manifest: schemas.Manifest) -> dict[str, set[str]] | None:
    """Kind ("grad", "param") -> the tensors the record's baseline kept (``kept.parquet``:
    ``grad.<fqn>``, ``param.<fqn>``), None when the record lists no kept.parquet (the rundir
    check has hashed it when it does). Raises ``BadInput`` for an unreadable file."""
    path = run_dir / schemas.KEPT_NAME
    if manifest.file(schemas.KEPT_NAME) is None or not path.is_file():
        return None
    kept = read_parquet(path, schemas.KEPT_SCHEMA)
    out: dict[str, set[str]] = {}
    for kind in ("grad", "param"):
        names = kept.loc[kept["group"] == kind, "tensor"].astype(str)
        out[kind] = {n[len(kind) + 1:] for n in names if n.startswith(kind + ".")}
    return out


def adam_settings(manifest: schemas.Manifest) -> tuple[float, float] | None:
    """(lr, eps) of a record with ``--optimizer adamw`` (manifest ``training.optimizer``), else None."""
    opt = manifest.training.optimizer if manifest.training else {}
    if opt.get("name") != "adamw":
        return None
    return float(opt["lr"]), float(opt["eps"])
