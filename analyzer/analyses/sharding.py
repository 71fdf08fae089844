"""What a strategy's sharding predicts each rank holds of the parameters (issue 27): the ratio
to DDP of the parameters, gradients and optimizer state, and per rank the parameter bytes,
beside what the tracer measured (memory_categories.parquet). Pure functions of the manifest.

Per rank, in elements, N = manifest ``model.num_params`` (``share``):
  single, ddp                 N (every rank the whole model)
  fsdp, fsdp2 (sharded)       N / W over the W ranks (FSDP1 ``no_shard``: N)
  hsdp                        N / S, S = the mesh's "shard" dimension (the replicate
                              dimension copies, it does not split)
  fsdp2_tp                    ((N - N_tp) + N_tp / T) / dp, N_tp = mesh ``tp_sharded_params``
                              (TP splits them over T; FSDP2 then splits every local tensor
                              over dp)
  pp                          stage_params[stage] / dp (the rank's stage only, FSDP2 over dp)
Gradients and optimizer state (AdamW: exp_avg and exp_avg_sq, the shape of the parameter,
plus a 4-byte step per tensor) follow the parameters, so their ratio to DDP is the same
(``ratio``: the run's largest rank over N; pp: the stage with the most parameters).

Bytes: elements x 4 -- the tracer keeps parameters in fp32 (mixed precision computes on cast
copies; FSDP2's MixedPrecisionPolicy keeps the fp32 shard).

Padding (why the check is exact or a bound). FSDP2 shards each parameter on dim 0 with
``torch.chunk`` over the group's W ranks: chunks of ceil(d0 / W) rows, the last shorter (or
none, when d0 < W), and pads every rank's shard to ceil(d0 / W) rows in a buffer of its own; the
tracer counts that padded buffer (tracer/footprint.py: a DTensor's local storage). So a rank
holds sum over parameters of ceil(d0 / W) x (the other dims) elements: exactly N / W when every
d0 divides by W, more otherwise (under one row per parameter: < sum of the other dims). TP
(DTensor ``Shard``) uses ``torch.chunk`` too but does not pad: uneven tp ranks hold different
amounts. With the parameters' shapes known -- the reference model (tracer/model.py: per layer
attn Linear(h, h), mlp Linear(h, 4h) and Linear(4h, h), LayerNorm(h); ``reference_shapes``) --
the padded figure is computed exactly (``padded_elements``) and the check is exact; for another
model only N's share is known, a lower bound of what the rank holds (``exact`` False). FSDP1's
flat parameter is padded per wrap unit, which the manifest does not describe: a bound.

Checked against torch 2.13 (CPU, gloo, 4 ranks, tracer/footprint.py ``parameter_bytes``): hsdp
[1, 4] at h 6, one layer, 440 B on every rank (110 padded elements; the DTensor's local view
on rank 3 holds 42); fsdp2_tp with the reference plan, two layers: [dp 2, tp 2] at h 16 4,960 B
a rank, [dp 1, tp 4] at h 6 880, 880, 880, 768 B (uneven TP), [dp 2, tp 2] at h 6 808 B -- each
the ``padded_elements`` x 4 computed here (tests/analyzer/test_sharding.py).
"""

from __future__ import annotations

import math

from analyzer.contract import schemas, strategies

BYTES_PER_ELEMENT = 4
"""fp32 parameters (module docstring)."""


def reference_shapes(hidden: int, layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(FQN, shape) of every parameter of the reference model (tracer/model.py), in order."""
    h = hidden
    out = []
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + "attn.weight", (h, h)), (p + "attn.bias", (h,)),
                (p + "mlp.0.weight", (4 * h, h)), (p + "mlp.0.bias", (4 * h,)),
                (p + "mlp.2.weight", (h, 4 * h)), (p + "mlp.2.bias", (h,)),
                (p + "norm.weight", (h,)), (p + "norm.bias", (h,))]
    return out


def chunk_rows(d0: int, n: int, k: int) -> int:
    """Rows of chunk ``k`` of ``torch.chunk`` of ``d0`` rows into ``n``: chunks of
    ceil(d0 / n) rows, the last shorter, none past the end (0)."""
    c = -(-d0 // n) if d0 else 0
    return max(0, min(c, d0 - k * c)) if c else 0


def fsdp2_rows(d0: int, w: int) -> int:
    """Rows FSDP2 holds of a parameter of ``d0`` rows on each of ``w`` ranks: its padded
    Shard(0) chunk, ceil(d0 / w) (module docstring)."""
    return -(-d0 // w)


def _padded(shapes: list[tuple[int, ...]], w: int) -> int:
    """Elements a rank holds of ``shapes`` under FSDP2 over ``w`` ranks (padded chunks)."""
    return sum(fsdp2_rows(s[0], w) * math.prod(s[1:]) for s in shapes if s)


def _unpadded(shapes: list[tuple[int, ...]], w: int, k: int) -> int:
    """Elements of ``shapes`` in chunk ``k`` of ``w`` (``torch.chunk`` sizes, no padding): what
    a DTensor's local view holds, and so what ``zeros_like`` of it (AdamW's state) allocates."""
    return sum(chunk_rows(s[0], w, k) * math.prod(s[1:]) for s in shapes if s)


def _tp_style(fqn: str, plan: dict[str, str]) -> str | None:
    """The TP style of the module owning parameter ``fqn``: the plan's entry for the module's
    FQN, or for a key the module FQN ends with (``attn`` for ``layers.0.attn``)."""
    module = fqn.rsplit(".", 1)[0]
    if module in plan:
        return plan[module]
    return next((v for k, v in plan.items() if module.endswith("." + k)), None)


def tp_local_shape(fqn: str, shape: tuple[int, ...], plan: dict[str, str], t: int, tp: int
                   ) -> tuple[int, ...]:
    """The shape tp rank ``t`` of ``tp`` holds of parameter ``fqn``: ColwiseParallel shards
    weight and bias on dim 0, RowwiseParallel the weight on dim 1 (bias replicated)
    (torch.distributed.tensor.parallel), ``torch.chunk`` sizes; other parameters whole."""
    style = _tp_style(fqn, plan)
    bias = fqn.endswith(".bias")
    if style == "colwise":
        return (chunk_rows(shape[0], tp, t), *shape[1:])
    if style == "rowwise" and not bias and len(shape) >= 2:
        return (shape[0], chunk_rows(shape[1], tp, t), *shape[2:])
    return shape


def _dim(mesh: schemas.Mesh, name: str) -> int:
    return mesh.shape[mesh.dim_names.index(name)] if name in mesh.dim_names else 1


def _coord(mesh: schemas.Mesh, rank: int, name: str) -> int:
    """``rank``'s coordinate on dimension ``name`` (row-major, ``schemas.Mesh``)."""
    d = mesh.dim_names.index(name)
    stride = math.prod(mesh.shape[d + 1:])
    return (rank // stride) % mesh.shape[d]


def _stage_shapes(m: schemas.Manifest, shapes, stage: int) -> list[tuple[int, ...]] | None:
    """Shapes of the parameters stage ``stage`` owns (mesh ``pp_stages``: module FQNs), None
    when the manifest does not list them."""
    owned = m.mesh.pp_stages[stage] if stage < len(m.mesh.pp_stages) else None
    if not owned:
        return None
    return [s for fqn, s in shapes if any(fqn == o or fqn.startswith(o + ".") for o in owned)]


def _stage_share(m: schemas.Manifest, shapes, rank: int, shard: str,
                 stage_dim: str) -> tuple[float, int | None, int | None, int]:
    """(share, padded, unpadded, stage) of ``rank`` in a pipeline run (``predict``'s row):
    its stage's parameters over the shard dimension; share NaN when the mesh does not count
    the stage's parameters, padded / unpadded None when its shapes are unknown."""
    dp, st = _dim(m.mesh, shard), _coord(m.mesh, rank, stage_dim)
    own = _stage_shapes(m, shapes, st) if shapes else None
    share = m.mesh.stage_params[st] / dp if st < len(m.mesh.stage_params) else math.nan
    if own is None:
        return share, None, None, st
    return share, _padded(own, dp), _unpadded(own, dp, _coord(m.mesh, rank, shard)), st


def _tensor_padding(mesh: schemas.Mesh, shapes, rank: int, shard: str,
                    tensor: str) -> tuple[int | None, int | None]:
    """(padded, unpadded) of ``rank`` in a tensor-parallel run (``predict``'s row): the local
    views of its tensor coordinate over the shard dimension; None when the shapes or the
    tp plan are unknown."""
    if not (shapes and mesh.tp_plan):
        return None, None
    tp, dp = _dim(mesh, tensor), _dim(mesh, shard)
    local = [tp_local_shape(f, s, mesh.tp_plan, _coord(mesh, rank, tensor), tp) for f, s in shapes]
    return _padded(local, dp), _unpadded(local, dp, _coord(mesh, rank, shard))


def predict(m: schemas.Manifest) -> dict | None:
    """What the sharding predicts for the run of manifest ``m`` (module docstring): None when
    there is no prediction (an unknown strategy or FSDP1 sharding, a mesh strategy without
    its mesh). Else {formula (text), ratio (largest rank's share / N), largest_rank, exact
    (per-rank padded figures known), basis (why exact or a bound), ranks: [{rank, stage
    (-1 but for pp), expected_elements (float: N's share), padded_elements (int, the padded
    figure; None when the shapes are unknown), unpadded_elements (the same without FSDP2's
    padding: the local views, what AdamW's state follows), tensors (the parameter tensors the
    rank holds; None when the shapes are unknown)}]}."""
    if (spec := strategies.spec(m.strategy)) is None:
        return None
    n = m.model.num_params
    w = 1 if spec.is_reference else m.world_size
    shapes = None
    if m.model.spec == "reference" and m.model.hidden > 0:
        ref = reference_shapes(m.model.hidden, m.model.layers)
        if sum(math.prod(s) for _, s in ref) == n:
            shapes = ref
    mesh = m.mesh
    shard, tensor, stage_dim = spec.dim_of("shard"), spec.dim_of("tensor"), spec.dim_of("stage")
    ranks: list[dict] = []

    def row(rank: int, share: float, padded: int | None, unpadded: int | None = None,
            stage: int = -1) -> None:
        tensors = None
        if shapes is not None:  # the parameter tensors the rank's optimizer steps (pp: its stage's)
            own = _stage_shapes(m, shapes, stage) if stage_dim else shapes
            tensors = None if own is None else len(own)
        ranks.append(dict(rank=rank, stage=stage, expected_elements=float(share),
                          padded_elements=padded, unpadded_elements=unpadded, tensors=tensors))

    if not spec.shards_parameters(m.strategy_options):
        formula = "N (unsharded)"
        for r in range(w):
            row(r, n, n, unpadded=n)  # whole tensors: no padding whatever the shapes
    elif spec.is_flat and spec.wrapper == "fsdp2":
        formula = f"1/W = 1/{w}"
        for r in range(w):
            row(r, n / w, _padded([s for _, s in shapes], w) if shapes else None,
                unpadded=_unpadded([s for _, s in shapes], w, r) if shapes else None)
    elif spec.is_flat and m.strategy_options.get("sharding_strategy") in ("full_shard",
                                                                          "shard_grad_op"):
        formula = f"1/W = 1/{w}"  # FSDP1
        for r in range(w):
            row(r, n / w, None)  # the flat parameter's padding depends on the wrap units
    elif spec.is_flat or mesh is None or (stage_dim and not mesh.stage_params) \
            or any(d not in mesh.dim_names for d in (shard, tensor, stage_dim) if d):
        return None
    elif stage_dim:
        formula = ("stage_params[{stage}]/dp / N (N {n:,}, dp {dp}; stage {stage} holds the most, "
                   "its rank {rank})")
        for r in range(w):
            row(r, *_stage_share(m, shapes, r, shard, stage_dim))
    elif tensor:
        tp, dp, ntp = _dim(mesh, tensor), _dim(mesh, shard), mesh.tp_sharded_params
        formula = f"((N - N_tp) + N_tp/T)/dp / N (N {n:,}, N_tp {ntp:,}, T {tp}, dp {dp})"
        for r in range(w):
            row(r, ((n - ntp) + ntp / tp) / dp, *_tensor_padding(mesh, shapes, r, shard, tensor))
    else:  # shard over one dimension, replicate over the other (hsdp)
        s = _dim(mesh, shard)
        formula = f"1/S = 1/{s} (S: the shard dimension)"
        for r in range(w):
            row(r, n / s, _padded([x for _, x in shapes], s) if shapes else None,
                unpadded=(_unpadded([x for _, x in shapes], s, _coord(mesh, r, shard))
                          if shapes else None))
    if not ranks or not n:
        return None
    top = max(ranks, key=lambda x: (x["expected_elements"], -x["rank"]))
    if stage_dim:
        formula = formula.format(stage=top["stage"], n=n, dp=_dim(mesh, shard), rank=top["rank"])
    exact = all(x["padded_elements"] is not None for x in ranks)
    basis = ("exact: the reference model's parameter shapes give each rank's padded FSDP2 "
             "shards (ceil(d0 / group) rows per parameter)" if exact else
             "a lower bound: the parameters' shapes are not in the manifest, so FSDP's padding "
             "(under one row per parameter and rank for FSDP2; per wrap unit for FSDP1) is not "
             "known; a rank holds at least its share")
    return dict(formula=formula, ratio=top["expected_elements"] / n, largest_rank=top["rank"],
                exact=exact, basis=basis, ranks=ranks)


ADAM_STEP_BYTES = 4
"""AdamW's per-parameter ``step``: a 0-dim fp32 tensor (torch 2.13, ``capturable`` off)."""


def optimizer_state_elements(optimizer: str, unpadded_elements: int | None, share: float,
                             tensors: int | None) -> tuple[float | None, bool]:
    """What the optimizer holds beside a rank's parameters, in bytes, and whether it is exact:
    SGD (no momentum, this tool's) nothing; AdamW exp_avg and exp_avg_sq, each ``zeros_like``
    the parameter -- for a DTensor its local view, torch.chunk's rows without FSDP2's padding
    (measured: FSDP2 over 4 ranks at h 6, rank 3 holds 84 elements of state per tensor kind
    where its padded parameter buffer holds 220) -- so 2 x those elements x 4 bytes, and one
    ``step`` per parameter tensor. Exact when the local views and the tensor count are known,
    else a lower bound from the share (step tensors left out). (None, False) for an optimizer
    this does not know."""
    if optimizer == "sgd":
        return 0.0, True
    if optimizer != "adamw":
        return None, False
    if unpadded_elements is not None and tensors is not None:
        return float(2 * unpadded_elements * BYTES_PER_ELEMENT + tensors * ADAM_STEP_BYTES), True
    return 2 * share * BYTES_PER_ELEMENT, False


def check(expected_bytes: float, padded_bytes: int | None, measured_bytes: int | None) -> str:
    """A rank's parameter bytes against the prediction: ``exact`` (measured == the padded
    figure), ``differs`` (padded figure known, measured another), ``at_least`` (no padded
    figure; measured >= the share's bytes), ``below`` (measured under the share: the rank holds
    less than the sharding gives it), ``not_measured``."""
    if measured_bytes is None:
        return "not_measured"
    if padded_bytes is not None:
        return "exact" if measured_bytes == padded_bytes else "differs"
    return "at_least" if measured_bytes >= math.floor(expected_bytes) else "below"
