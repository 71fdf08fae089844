"""The training setup (issue 18 items 3 and 4): --optimizer, --mixed-precision,
--activation-checkpointing, DDP's options, options refused per strategy, and parity beyond step 0.

Oracles: torch's own AdamW for the first-step bound; the unit roundoff of each dtype
(torch.finfo) for the mixed-precision tolerance; hand-written loss rows for the envelope; and
for the records, the parity verdict recomputed by the analyzer from numerics.parquet plus
independent facts (the trace's operator counts, the gradient's measured difference).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter

import pandas as pd
import pytest

from analyzer.analyses import parity
from analyzer.contract import schemas
from analyzer.contract.tolerance import TOLERANCES, mixed_precision_tolerance
from tests.tracer.helpers import TINY, run_tracer


# --- fast: option validation -----------------------------------------------------------------

@pytest.mark.record
def test_ddp_refuses_an_fsdp_option_even_at_its_default(tmp_path):
    """Before: ddp silently accepted --sharding-strategy. Typed on the command line at its
    default value it is still refused: one line, exit 2, nothing recorded."""
    proc, _ = run_tracer(["--strategy", "ddp", "--sharding-strategy", "full_shard", "--out", str(tmp_path)],
                         cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--sharding-strategy" in lines[0] and "fsdp" in lines[0], lines
    assert not (tmp_path / "ddp").exists()


@pytest.mark.parametrize("strategy, option, value", [
    ("fsdp", "bucket_cap_mb", 10.0), ("fsdp2", "static_graph", True),
    ("single", "gradient_as_bucket_view", True), ("single", "forward_prefetch", True),
    ("ddp", "backward_prefetch", "post"), ("ddp", "wrap_min_params", 10)])
def test_a_strategy_refuses_options_it_does_not_take(strategy, option, value):
    from tracer.config import RecordConfig

    with pytest.raises(ValueError, match=f"--{option.replace('_', '-')}.*does not take it"):
        RecordConfig(strategy=strategy, **{option: value})


def test_strategy_all_hands_each_strategy_only_its_own_options():
    from tracer.record import expand

    configs = {c.strategy: c for c in expand("all", None, bucket_cap_mb=10.0, static_graph=True,
                                             sharding_strategy="shard_grad_op")}
    assert configs["ddp"].bucket_cap_mb == 10.0 and configs["ddp"].static_graph
    assert configs["ddp"].sharding_strategy == "full_shard"
    assert configs["fsdp"].sharding_strategy == "shard_grad_op" and configs["fsdp"].bucket_cap_mb is None
    assert configs["single"].bucket_cap_mb is None and not configs["single"].static_graph
    assert configs["ddp"].strategy_options() == {"bucket_cap_mb": 10.0, "gradient_as_bucket_view": False,
                                                 "static_graph": True}


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": "fsdp", "mixed_precision": "bf16,bf16"}, "PARAM,REDUCE,BUFFER"),
    ({"strategy": "fsdp", "mixed_precision": "bf16,int8,bf16"}, "PARAM,REDUCE,BUFFER"),
    ({"strategy": "fsdp", "mixed_precision": "bf16,bf16,bf16", "precision": "bf16"}, "one precision policy"),
    ({"strategy": "ddp", "mixed_precision": "bf16,bf16,bf16"}, "ddp computes in its parameters' dtype"),
    ({"strategy": "ddp", "optimizer": "adam"}, "--optimizer adam"),
    ({"strategy": "ddp", "bucket_cap_mb": 0.0}, "--bucket-cap-mb"),
])
def test_bad_training_options_are_one_line(kwargs, message):
    from tracer.config import RecordConfig

    with pytest.raises(ValueError, match=message):
        RecordConfig(**kwargs)


def test_ddp_takes_a_low_precision_reduction_and_the_lr_defaults_by_optimizer():
    from tracer.config import RecordConfig

    assert RecordConfig(strategy="ddp", mixed_precision="fp32,bf16,fp32").mixed_precision_dtypes == (
        "fp32", "bf16", "fp32")
    assert RecordConfig(strategy="ddp").learning_rate == 0.1
    assert RecordConfig(strategy="ddp", optimizer="adamw").learning_rate == 1e-3


# --- fast: tolerance arithmetic ----------------------------------------------------------------

def test_mixed_precision_tolerance_from_the_unit_roundoff():
    import torch

    u_bf16 = torch.finfo(torch.bfloat16).eps / 2  # 2^-8: 8 significant bits
    u_fp16 = torch.finfo(torch.float16).eps / 2
    # 2 (W - 1) u, or torch's default for the dtype when larger
    tol = mixed_precision_tolerance(["bf16", "bf16", "bf16"], 2)
    assert (tol.rtol, tol.atol) == (1.6e-2, 1e-5)  # 2 u = 7.8e-3 < 1.6e-2
    assert tol.precision == "mixed bf16,bf16,bf16"
    assert mixed_precision_tolerance(["fp32", "bf16", "fp32"], 8).rtol == 14 * u_bf16  # 5.5e-2
    assert mixed_precision_tolerance(["bf16", "fp32", "fp32"], 1).rtol == 1.6e-2
    assert mixed_precision_tolerance(["fp16", "fp16", "fp32"], 2).rtol == 1e-3
    assert mixed_precision_tolerance(["fp16", "fp16", "fp32"], 4).rtol == 6 * u_fp16
    fp32 = mixed_precision_tolerance(["fp32", "fp32", "bf16"], 2)
    assert (fp32.rtol, fp32.atol, fp32.source) == (1.3e-6, 1e-5, TOLERANCES["fp32"].source)


@pytest.mark.parametrize("g, d", [(1e-8, -2e-8), (3e-9, 1e-9), (1e-3, 1e-7), (0.0, 1e-12)])
def test_adam_first_step_bound_holds_for_torch_adamw(g, d):
    """Two one-element parameters, equal start, gradients g and g + d: torch's AdamW moves
    them apart by at most the bound and, for |g| near eps, by far more than SGD would."""
    import torch

    lr, moved = 1e-3, []
    for grad in (g, g + d):
        p = torch.nn.Parameter(torch.tensor([0.5], dtype=torch.float64))
        opt = torch.optim.AdamW([p], lr=lr)
        p.grad = torch.tensor([grad], dtype=torch.float64)
        opt.step()
        moved.append(float(p.detach()))
    diff = abs(moved[0] - moved[1])
    bound = schemas.adam_first_step_bound(lr, 1e-8, abs(d))
    assert diff <= bound * (1 + 1e-9)
    if abs(g) < 1e-7:
        assert diff > 1e6 * lr * abs(d)  # normalisation: SGD would move them apart by lr * |d|


def test_loss_envelope_grows_with_the_step():
    """Baseline loss 2.0 at every step, fp32: step-0 limit 1e-5 + 1.3e-6 * 2 = 1.26e-5; at step 3
    four times that, 5.04e-5; at step 4 five times, 6.3e-5. A difference of 4e-5 fails at step 0
    and passes at step 3; 7e-5 fails at step 4."""
    rows = []
    for step, loss in ((0, 2.0 + 4e-5), (3, 2.0 + 4e-5), (4, 2.0 + 7e-5)):
        for rank in (0, 1):
            rows += [{"rank": rank, "step": step, "kind": "loss", "tensor": "loss", "seq": 0,
                      "metric": "value", "value": loss},
                     {"rank": rank, "step": step, "kind": "loss", "tensor": "loss", "seq": 0,
                      "metric": "ref_value", "value": 2.0}]
    tol = parity.tolerance_for("fp32")
    checked = parity.check_loss(pd.DataFrame(rows), tol).set_index("step")
    assert checked.loc[0, "limit"] == pytest.approx(1.26e-5)
    assert checked.loc[3, "limit"] == pytest.approx(4 * 1.26e-5)
    assert checked["passed"].tolist() == [False, True, False]


# --- slow: records on CPU, 2 ranks, tiny shapes ------------------------------------------------

def _record(out, *args, env_extra=None):
    proc, _ = run_tracer(list(args) + TINY + ["--out", str(out)], cwd=out, env_extra=env_extra)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _verdict(run_dir):
    manifest = schemas.read_manifest(run_dir / schemas.MANIFEST_NAME)
    return manifest, parity.check_run(run_dir, manifest)


def _op_counts(run_dir) -> Counter:
    with gzip.open(run_dir / "rank0.trace.json.gz", "rt") as f:
        events = json.load(f)["traceEvents"]
    return Counter(e.get("name") for e in events if e.get("ph") == "X")


@pytest.fixture(scope="module")
def adamw_all(tmp_path_factory):
    out = tmp_path_factory.mktemp("adamw")
    _record(out, "--strategy", "all", "--optimizer", "adamw")
    return out


@pytest.mark.record
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp2"])
def test_adamw_records_pass_parity(adamw_all, strategy):
    """AdamW (lr 1e-3, eps 1e-8 recorded in the manifest): every tensor, the parameters after
    the first step with the Adam bound, and the loss of every step pass."""
    manifest, verdict = _verdict(adamw_all / strategy)
    assert manifest.training.optimizer["name"] == "adamw"
    assert manifest.training.optimizer["eps"] == 1e-8 and manifest.training.optimizer["lr"] == 1e-3
    assert verdict.status == "pass", verdict.reason
    assert "5 step(s)" in verdict.reason


@pytest.fixture(scope="module")
def mixed_bf16(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    _record(out, "--strategy", "single,fsdp,fsdp2", "--mixed-precision", "bf16,bf16,bf16")
    _record(out, "--strategy", "fsdp2", "--mixed-precision", "bf16,bf16,bf16", "--fault",
            "wrong-grad-scale", "--name", "fsdp2-canary")
    return out


@pytest.mark.record
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_reference_mixed_precision_passes_at_its_tolerance(mixed_bf16, strategy):
    """The reference code's policy, bf16 params / reduction / buffers, passes at its stated
    tolerance (W = 2: torch's bf16 default). The baseline rounds each rank's rows as that rank
    does, so with one addition in the reduction the ranks reproduce it to fp32's tolerance (bitwise
    on this machine) -- and that baseline really is bf16: its gradients differ from an fp32
    baseline of the same settings by more than fp32's tolerance (not a no-op passing trivially)."""
    import torch
    from safetensors.torch import load_file

    from tracer.baseline import compute_baseline
    from tracer.config import RecordConfig

    manifest, verdict = _verdict(mixed_bf16 / strategy)
    assert manifest.training.mixed_precision == ["bf16", "bf16", "bf16"]
    assert verdict.status == "pass", verdict.reason
    assert verdict.tolerance.rtol == 1.6e-2
    numerics = parity.read_numerics(mixed_bf16 / strategy / schemas.NUMERICS_NAME)
    assert parity.check_tensors(numerics, parity.tolerance_for("fp32"))["passed"].all()

    kept = load_file(str(mixed_bf16 / strategy / schemas.KEPT_TENSORS_NAME))
    fp32, _ = compute_baseline(RecordConfig(strategy="fsdp", hidden=32, seq=8, batch=4), "cpu")
    fp32_tol = parity.tolerance_for("fp32")
    assert any((kept[k] - fp32[k]).abs().max() > fp32_tol.limit(fp32[k].abs().max())
               for k in kept if k.startswith("grad."))
    assert torch.equal(kept["batch.x"], fp32["batch.x"])  # same inputs: the difference is bf16's


@pytest.mark.record
def test_single_runs_the_mixed_precision_policy_too(mixed_bf16):
    """``single`` has no FSDP to apply the policy; it runs the baseline's emulation on its whole
    batch, so its timing is of bf16 work: its losses are within bf16's tolerance of the (micro-
    batched) bf16 baseline's but differ from an fp32 run's by more than fp32's."""
    from tracer.baseline import compute_baseline
    from tracer.config import RecordConfig

    numerics = pd.read_parquet(mixed_bf16 / "single" / schemas.NUMERICS_NAME)
    loss = numerics[(numerics["kind"] == "loss") & (numerics["metric"] == "value")]
    loss = loss.sort_values("step")["value"].tolist()
    fp32, _ = compute_baseline(RecordConfig(strategy="single", hidden=32, seq=8, batch=4), "cpu")
    bf16, fp32_tol = TOLERANCES["bf16"], TOLERANCES["fp32"]
    ref = fp32["loss"].tolist()
    assert len(loss) == len(ref)
    assert all(abs(a - r) <= bf16.limit(abs(r)) for a, r in zip(loss, ref))
    assert any(abs(a - r) > fp32_tol.limit(abs(r)) for a, r in zip(loss, ref))


@pytest.mark.record
def test_wrong_grad_scale_fails_the_mixed_precision_gate(mixed_bf16):
    _, verdict = _verdict(mixed_bf16 / "fsdp2-canary")
    assert verdict.status == "fail"
    assert verdict.first_divergence.kind == "grad" and verdict.first_divergence.step == 0
    assert verdict.first_divergence.rel_l2 == pytest.approx(0.5, rel=0.05)  # halved gradient


@pytest.mark.record
def test_activation_checkpointing_passes_and_recomputes(tmp_path, adamw_all):
    """Checkpointed FSDP units: parity passes, and the backward recomputes the forward (more
    aten::linear calls on rank 0 than the same shapes and steps without checkpointing)."""
    _record(tmp_path, "--strategy", "fsdp", "--optimizer", "adamw", "--activation-checkpointing")
    manifest, verdict = _verdict(tmp_path / "fsdp")
    assert manifest.training.activation_checkpointing
    assert verdict.status == "pass", verdict.reason
    assert _op_counts(tmp_path / "fsdp")["aten::linear"] > _op_counts(adamw_all / "fsdp")["aten::linear"]


@pytest.mark.record
def test_a_bug_after_the_first_step_fails_on_the_loss(tmp_path):
    """A forgotten zero_grad after step 1 (test-only injection): step 0's gradients and
    parameters pass; step 2 steps on stale + fresh gradients, so the loss at step 3 leaves its
    envelope and is the first divergence."""
    _record(tmp_path, "--strategy", "ddp", env_extra={"PARITYTRACE_INJECT": "keep-grads@*:1"})
    _, verdict = _verdict(tmp_path / "ddp")
    assert verdict.status == "fail"
    assert verdict.first_divergence.kind == "loss" and verdict.first_divergence.step == 3
    assert all(c.kind == "loss" for c in verdict.failed_checks) or not verdict.failed_checks
