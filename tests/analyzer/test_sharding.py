"""What sharding predicts a rank holds of the parameters (analyzer/analyses/sharding.py), for the
mesh strategies and the flat ones, on hand-built manifests. Reference model (tracer/model.py)
per layer: attn [h, h] + [h], mlp.0 [4h, h] + [4h], mlp.2 [h, 4h] + [h], norm [h] + [h]:
9h^2 + 8h elements; h 16: 2,432 a layer."""

from __future__ import annotations

import math

import pytest

from analyzer.analyses import sharding
from analyzer.contract import schemas
from tests.reports.builders import manifest, typed

H16 = 9 * 16 * 16 + 8 * 16  # 2,432


def _m(strategy, world, *, hidden=16, layers=2, num_params=None, spec="reference", mesh=None,
       options=None):
    fields = manifest(run_name=strategy, strategy=strategy, world_size=world, options=options)
    n = num_params if num_params is not None else layers * (9 * hidden * hidden + 8 * hidden)
    model = {"name": "SimpleTransformer", "hidden": hidden, "layers": layers, "num_params": n,
             "spec": spec}
    return typed(fields, model=model, **({"mesh": mesh} if mesh else {}))


def _by_rank(pred):
    return {r["rank"]: r for r in pred["ranks"]}


def test_reference_shapes_add_up_to_the_layer_count():
    shapes = sharding.reference_shapes(16, 2)
    assert len(shapes) == 16 and sum(math.prod(s) for _, s in shapes) == 2 * H16
    assert shapes[2] == ("layers.0.mlp.0.weight", (64, 16))


def test_chunk_rows_follow_torch_chunk():
    """torch.chunk(6 rows, 4) -> 2, 2, 2 and none; (3, 4) -> 1, 1, 1, none."""
    assert [sharding.chunk_rows(6, 4, k) for k in range(4)] == [2, 2, 2, 0]
    assert [sharding.chunk_rows(3, 4, k) for k in range(4)] == [1, 1, 1, 0]
    assert [sharding.chunk_rows(8, 2, k) for k in range(2)] == [4, 4]
    assert sharding.fsdp2_rows(6, 4) == 2 and sharding.fsdp2_rows(3, 4) == 1


def test_hsdp_shares_over_the_shard_dimension_only():
    """Mesh [replicate 2, shard 2]: N / 2 = 2,432 elements a rank; 16 and 64 rows divide by 2,
    so no padding: exact."""
    mesh = {"shape": [2, 2], "dim_names": ["replicate", "shard"]}
    pred = sharding.predict(_m("hsdp", 4, mesh=mesh))
    assert pred["ratio"] == pytest.approx(0.5) and pred["exact"]
    assert pred["formula"].startswith("1/S = 1/2")
    assert {r: (x["expected_elements"], x["padded_elements"]) for r, x in _by_rank(pred).items()} == {
        r: (2432.0, 2432) for r in range(4)}


def test_hsdp_uneven_rows_are_padded_per_parameter():
    """h 6, one layer, shard 4: N = 9*36 + 48 = 372, share 93. Padded rows ceil(d0 / 4):
    attn.weight 2 x 6 = 12, attn.bias 2, mlp.0.weight 6 x 6 = 36, mlp.0.bias 6, mlp.2.weight
    2 x 24 = 48, mlp.2.bias 2, norm 2 + 2: 110 elements on every rank."""
    mesh = {"shape": [1, 4], "dim_names": ["replicate", "shard"]}
    pred = sharding.predict(_m("hsdp", 4, hidden=6, layers=1, mesh=mesh))
    assert pred["ratio"] == pytest.approx(0.25)
    assert {x["padded_elements"] for x in pred["ranks"]} == {110}
    assert {x["expected_elements"] for x in pred["ranks"]} == {93.0}
    assert sharding.check(93 * 4, 110 * 4, 110 * 4) == "exact"
    assert sharding.check(93 * 4, 110 * 4, 93 * 4) == "differs"


def test_fsdp2_tp_shares_tp_then_dp():
    """Mesh [dp 2, tp 2], plan attn / mlp.0 colwise, mlp.2 rowwise: N_tp = 2 x (256 + 16 + 1024 +
    64 + 1024) = 4,768 of N 4,864. Share ((4864 - 4768) + 4768 / 2) / 2 = 1,240. Local shapes
    on a tp rank: attn [8, 16] + [8], mlp.0 [32, 16] + [32], mlp.2 [16, 32] + [16]
    (replicated bias), norm [16] + [16]; FSDP2 over dp 2 halves dim 0: 64 + 4 + 256 + 16 +
    256 + 8 + 8 + 8 = 620 a layer, 1,240: exact."""
    mesh = {"shape": [2, 2], "dim_names": ["dp", "tp"], "tp_sharded_params": 4768,
            "tp_plan": {"attn": "colwise", "mlp.0": "colwise", "mlp.2": "rowwise"}}
    pred = sharding.predict(_m("fsdp2_tp", 4, mesh=mesh))
    assert pred["ratio"] == pytest.approx(1240 / 4864)
    assert {(x["expected_elements"], x["padded_elements"]) for x in pred["ranks"]} == {(1240.0, 1240)}
    assert pred["exact"] and "N_tp 4,768" in pred["formula"]


def test_fsdp2_tp_without_a_plan_is_a_lower_bound():
    mesh = {"shape": [2, 2], "dim_names": ["dp", "tp"], "tp_sharded_params": 4768}
    pred = sharding.predict(_m("fsdp2_tp", 4, mesh=mesh))
    assert not pred["exact"] and {x["padded_elements"] for x in pred["ranks"]} == {None}
    assert sharding.check(1240 * 4, None, 1240 * 4 + 8) == "at_least"
    assert sharding.check(1240 * 4, None, 1240 * 4 - 4) == "below"


def test_pp_shares_the_stage_over_dp_and_names_the_largest():
    """Three layers on [dp 2, pp 2]: stage 0 owns layers 0-1 (4,864), stage 1 layer 2 (2,432).
    Ranks 0, 2 (stage 0): 2,432 each; ranks 1, 3: 1,216. Largest: rank 0, ratio 2432 / 7296."""
    mesh = {"shape": [2, 2], "dim_names": ["dp", "pp"], "pp_schedule": "1f1b", "microbatches": 4,
            "pp_stages": [["layers.0", "layers.1"], ["layers.2"]],
            "stage_params": [2 * H16, H16]}
    pred = sharding.predict(_m("pp", 4, layers=3, mesh=mesh))
    got = {r: (x["stage"], x["expected_elements"], x["padded_elements"])
           for r, x in _by_rank(pred).items()}
    assert got == {0: (0, 2432.0, 2432), 1: (1, 1216.0, 1216), 2: (0, 2432.0, 2432),
                   3: (1, 1216.0, 1216)}
    assert pred["largest_rank"] == 0 and pred["ratio"] == pytest.approx(1 / 3)
    assert "stage_params[0]/dp" in pred["formula"] and "rank 0" in pred["formula"]


def test_another_model_gives_the_share_only():
    """spec not the reference (shapes unknown): fsdp2 on 4 ranks, N 1,000: 250 each, bound."""
    pred = sharding.predict(_m("fsdp2", 4, num_params=1000, spec="mymodel.py:build"))
    assert not pred["exact"] and {x["expected_elements"] for x in pred["ranks"]} == {250.0}
    assert "lower bound" in pred["basis"]


def test_flat_strategies():
    ddp = sharding.predict(_m("ddp", 2))
    assert ddp["ratio"] == 1 and {x["padded_elements"] for x in ddp["ranks"]} == {2 * H16}
    f1 = sharding.predict(_m("fsdp", 2, options={"sharding_strategy": "full_shard"}))
    assert f1["ratio"] == 0.5 and not f1["exact"]
    assert sharding.predict(_m("fsdp", 2, options={"sharding_strategy": "hybrid_shard"})) is None
    assert sharding.predict(_m("hsdp", 4)) is None  # a mesh strategy without its mesh


def test_manifest_mesh_round_trips():
    """The fixtures' manifests are valid contract manifests."""
    m = _m("pp", 4, mesh={"shape": [2, 2], "dim_names": ["dp", "pp"], "stage_params": [1, 2]})
    assert isinstance(m.mesh, schemas.Mesh) and m.mesh.stage_params == [1, 2]


@pytest.mark.parametrize("hidden, shape, measured", [
    (16, [2, 2], [4960] * 4), (6, [1, 4], [880, 880, 880, 768]), (6, [2, 2], [808] * 4)])
def test_fsdp2_tp_matches_what_torch_holds(hidden, shape, measured):
    """Bytes tracer/footprint.py's parameter_bytes measured under torch 2.13 (CPU, gloo, 4 ranks,
    two reference layers, the plan attn / mlp.0 colwise, mlp.2 rowwise, FSDP2 per layer and
    root over dp). [dp 1, tp 4] at h 6 is uneven: torch.chunk(6 rows, 4) gives attn's colwise
    shards 2, 2, 2 and 0 rows, and TP does not pad, so tp rank 3 holds 28 elements less."""
    shapes = sharding.reference_shapes(hidden, 2)
    n = sum(math.prod(s) for _, s in shapes)
    ntp = sum(math.prod(s) for f, s in shapes
              if ".attn." in f or ".mlp.0." in f or f.endswith("mlp.2.weight"))
    mesh = {"shape": shape, "dim_names": ["dp", "tp"], "tp_sharded_params": ntp,
            "tp_plan": {"attn": "colwise", "mlp.0": "colwise", "mlp.2": "rowwise"}}
    pred = sharding.predict(_m("fsdp2_tp", 4, hidden=hidden, layers=2, num_params=n, mesh=mesh))
    assert [x["padded_elements"] * 4 for x in pred["ranks"]] == measured


def test_hsdp_matches_what_torch_holds():
    """torch 2.13, hsdp [1, 4] at h 6, one layer: 440 B on every rank (module docstring)."""
    mesh = {"shape": [1, 4], "dim_names": ["replicate", "shard"]}
    pred = sharding.predict(_m("hsdp", 4, hidden=6, layers=1, mesh=mesh))
    assert [x["padded_elements"] * 4 for x in pred["ranks"]] == [440] * 4


@pytest.mark.parametrize("strategy, mesh, measured", [
    ("fsdp2", None, [1824, 1824, 1824, 736]),
    ("hsdp", {"shape": [2, 2], "dim_names": ["replicate", "shard"]}, [3040] * 4),
    ("fsdp2_tp", {"shape": [2, 2], "dim_names": ["dp", "tp"],
                  "tp_plan": {"attn": "colwise", "mlp.0": "colwise", "mlp.2": "rowwise"}},
     [1680, 1680, 1568, 1568]),
    ("pp", {"shape": [2, 2], "dim_names": ["dp", "pp"], "pp_stages": [["layers.0"], ["layers.1"]],
            "stage_params": [372, 372]}, [1520] * 4)])
def test_adamw_state_follows_the_unpadded_local_views(strategy, mesh, measured):
    """AdamW state bytes tracer/footprint.py measured under torch 2.13 (CPU, gloo, 4 ranks, two
    reference layers at h 6, --optimizer adamw): exp_avg and exp_avg_sq are ``zeros_like`` the
    DTensor's local view -- torch.chunk rows, not FSDP2's padded buffer -- plus a 4-byte step
    per parameter tensor. fsdp2 rank 3 holds chunk 3 of 4 of every 6-row parameter: none of
    them, so 84 elements of each state where its padded parameters hold 220 (880 B)."""
    shapes = sharding.reference_shapes(6, 2)
    n = sum(math.prod(s) for _, s in shapes)
    if strategy == "fsdp2_tp":
        mesh["tp_sharded_params"] = sum(math.prod(s) for f, s in shapes
                                        if ".attn." in f or ".mlp.0." in f
                                        or f.endswith("mlp.2.weight"))
    pred = sharding.predict(_m(strategy, 4, hidden=6, layers=2, num_params=n, mesh=mesh))
    got = [sharding.optimizer_state_elements("adamw", x["unpadded_elements"],
                                             x["expected_elements"], x["tensors"]) for x in pred["ranks"]]
    assert [b for b, exact in got] == measured and all(exact for _, exact in got)
    assert sharding.optimizer_state_elements("sgd", None, 1.0, None) == (0.0, True)
    assert sharding.optimizer_state_elements("lion", 10, 10.0, 2) == (None, False)
