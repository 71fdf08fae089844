"""`tracer record --arm NAME="OPTIONS"` and `--sweep KEY=V1,V2` (issue 29): named arms and
grids expand into one config per arm, parsed by the command's own parser, with the settings on
which the arms differ; bad arms and grids are refused in one line before anything runs. The
config pieces first (no record), then records end to end."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from analyzer.contract import schemas
from tracer.arms import MAX_ARMS, expand_arms, settings_of
from tracer.cli import arm_parser
from tracer.config import RecordConfig, _DEFAULTS
from tracer.record import interleave
from tests.tracer.helpers import REPO, TINY, run_tracer


def _expand(arms=(), sweeps=(), strategy=None, **given):
    parse, kinds = arm_parser()
    common = {k: v for k, v in _DEFAULTS.items() if k not in ("strategy", "name")}
    common.update(given)
    return expand_arms(list(arms), list(sweeps), strategy=strategy, common=common,
                       given=list(given), parse=parse, option_kinds=kinds)


def _settings(configs):
    return {c.arm: json.loads(c.arm_settings) for c in configs}


def test_named_arms_take_their_options_over_the_common_ones():
    configs = _expand(["base=--strategy fsdp2",
                       "noreshard=--strategy fsdp2 --no-reshard-after-forward"], hidden=64)
    assert [(c.arm, c.strategy, c.hidden, c.reshard_after_forward) for c in configs] == [
        ("base", "fsdp2", 64, None), ("noreshard", "fsdp2", 64, False)]
    # resolved as the record applies it: full_shard implies True
    assert _settings(configs) == {"base": {"reshard_after_forward": True},
                                  "noreshard": {"reshard_after_forward": False}}


def test_identical_arms_record_no_settings_and_a_strategy_option_counts_only_where_taken():
    same = _expand(["a=", "b="], strategy="ddp")
    assert _settings(same) == {"a": {}, "b": {}}
    mixed = _expand(["d=--strategy ddp --bucket-cap-mb 5", "f=--strategy fsdp2"])
    # bucket_cap_mb: only ddp takes it, so the arms do not differ in it
    assert _settings(mixed) == {"d": {"strategy": "ddp"}, "f": {"strategy": "fsdp2"}}


def test_a_sweep_names_arms_after_values_and_two_sweeps_make_a_grid():
    one = _expand(sweeps=["--reshard-after-forward=true,false"], strategy="fsdp2")
    assert [c.arm for c in one] == ["reshard-after-forward=true", "reshard-after-forward=false"]
    assert [c.reshard_after_forward for c in one] == [True, False]
    grid = _expand(["a=", "b=--static-graph"], ["bucket_cap_mb=1,25"], strategy="ddp")
    assert [c.arm for c in grid] == ["a+bucket-cap-mb=1", "a+bucket-cap-mb=25",
                                     "b+bucket-cap-mb=1", "b+bucket-cap-mb=25"]
    assert _settings(grid)["b+bucket-cap-mb=1"] == {"bucket_cap_mb": 1.0, "static_graph": True}
    # values that hold commas are separated by ';'
    mp = _expand(sweeps=["mixed-precision=bf16,bf16,bf16;fp32,fp32,fp32"], strategy="fsdp2")
    assert [c.mixed_precision for c in mp] == ["bf16,bf16,bf16", "fp32,fp32,fp32"]
    assert mp[0].arm == "mixed-precision=bf16_bf16_bf16"


def test_arms_interleave_rotated_as_one_experiment():
    configs = _expand(["a=", "b=", "c=--data-sample-cost-ms 20"], strategy="single", data="loader")
    runs = interleave([RecordConfig(**{**c.to_dict(), "repeat": 3}) for c in configs], "x")
    assert [c.run_name for c in runs] == ["a.r1", "b.r1", "c.r1", "b.r2", "c.r2", "a.r2",
                                          "c.r3", "a.r3", "b.r3"]
    assert {c.experiment_id for c in runs} == {"x"}
    assert _settings(configs)["c"] == {"data_sample_cost_ms": 20.0}
    # a worker rebuilds the same settings from its arguments
    argv = runs[0].to_argv()
    assert json.loads(argv[argv.index("--arm-settings") + 1]) == {"data_sample_cost_ms": 0.0}


def test_settings_are_resolved_per_strategy():
    cfgs = [RecordConfig(strategy="ddp", name="a"), RecordConfig(strategy="ddp", name="b", bucket_cap_mb=25.0)]
    # None is torch's default buckets (1 MiB first, then 25 MiB): not an explicit 25
    assert settings_of(cfgs) == [{"bucket_cap_mb": "default"}, {"bucket_cap_mb": 25.0}]
    lr = [RecordConfig(strategy="ddp", name="a"), RecordConfig(strategy="ddp", name="b", lr=0.1)]
    assert settings_of(lr) == [{}, {}]  # sgd's default lr is 0.1


@pytest.mark.parametrize("arms,sweeps,kw,says", [
    (["a="], [], {"strategy": "ddp"}, "at least two arms"),
    (["a=", "a="], [], {"strategy": "ddp"}, "names must differ"),
    (["a b=", "c="], [], {"strategy": "ddp"}, "arm name 'a b'"),
    (["a.r2=", "c="], [], {"strategy": "ddp"}, "repeat suffix"),
    (["a=", "b="], [], {}, "each arm records one strategy"),
    (["a=--strategy ddp,fsdp2", "b="], [], {"strategy": "ddp"}, "each arm records one strategy"),
    (["a=--out x", "b="], [], {"strategy": "ddp"}, "--out applies to the whole command"),
    (["a=--repeat 3", "b="], [], {"strategy": "ddp"}, "--repeat applies to the whole command"),
    (["a=--bogus", "b="], [], {"strategy": "ddp"}, "--arm a: No such option: --bogus"),
    (["a=--precision \"bf16", "b="], [], {"strategy": "ddp"}, "cannot split"),
    (["a=--bucket-cap-mb 1", "b="], [], {"strategy": "fsdp2"}, "--strategy fsdp2 does not take it"),
    (["a=--sweep x=1,2", "b="], [], {"strategy": "ddp"}, "--sweep inside an arm"),
    ([], ["nope=1,2"], {"strategy": "ddp"}, "nope is not a recorder option"),
    ([], ["out=a,b"], {"strategy": "ddp"}, "out is not a recorder option"),
    ([], ["bucket-cap-mb=1"], {"strategy": "ddp"}, "at least two non-empty values"),
    ([], ["bucket-cap-mb=1,1"], {"strategy": "ddp"}, "a value is repeated"),
    ([], ["static-graph=maybe,false"], {"strategy": "ddp"}, "maybe is not true or false"),
    ([], ["bucket-cap-mb=1,2", "bucket-cap-mb=3,4"], {"strategy": "ddp"}, "swept twice"),
    ([], ["seed=1,2", "lr=1,2", "batch=2,4"], {"strategy": "ddp"}, "at most 2 options"),
    (["a=", "b="], ["bucket-cap-mb=1,2,3,4,5", "static-graph=true,false"], {"strategy": "ddp"},
     f"20 arms (2 x 5 x 2) exceed the limit of {MAX_ARMS}"),
    ([], ["batch=8,7"], {"strategy": "ddp"}, "--batch 7: global batch must divide"),
    (["a=--bucket-cap-mb 1", "b="], ["bucket-cap-mb=2,3"], {"strategy": "ddp"}, "is swept"),
    ([], ["bucket-cap-mb=1,abc"], {"strategy": "ddp"}, "--sweep bucket-cap-mb=abc: Invalid value"),
    (["x=", "y="], ["bucket-cap-mb=1.0,1"], {"strategy": "ddp"},
     "arms x+bucket-cap-mb=1.0 and x+bucket-cap-mb=1 record the same configuration"),
    (["z=", "a=--help"], [], {"strategy": "ddp"}, "--arm a: --help inside an arm"),
    (["a=", "b="], [], {"strategy": "ddp", "repeat": 0}, "--repeat 0: must be"),
])
def test_bad_arms_and_sweeps_are_refused_in_one_line(arms, sweeps, kw, says):
    strategy = kw.pop("strategy", None)
    with pytest.raises(ValueError) as err:
        _expand(arms, sweeps, strategy, **kw)
    assert says in str(err.value) and "\n" not in str(err.value)
    if "repeat" in kw:  # the command's own option: not blamed on an arm
        assert str(err.value).startswith("--repeat 0")


def test_identical_named_arms_stay_allowed_and_sweep_names_are_run_dir_names():
    grid = _expand(["x=", "y="], ["static-graph=yes,no"], "ddp")
    assert [c.arm for c in grid] == ["x+static-graph=true", "x+static-graph=false",
                                     "y+static-graph=true", "y+static-graph=false"]
    hsdp = _expand([], ["mesh=2,3;3,2"], "hsdp", nproc=6, batch=12)
    assert [c.arm for c in hsdp] == ["mesh=2_3", "mesh=3_2"]  # "," cannot name a run dir


def test_a_common_strategy_option_no_arm_takes_is_refused():
    with pytest.raises(ValueError, match="--bucket-cap-mb: no arm's strategy takes it"):
        _expand(["a=--strategy fsdp2", "b=--strategy fsdp"], bucket_cap_mb=5.0)
    # one arm that takes it is enough; the other records without it
    ok = _expand(["a=--strategy ddp", "b=--strategy fsdp2"], bucket_cap_mb=5.0)
    assert [c.bucket_cap_mb for c in ok] == [5.0, None]


@pytest.mark.record
def test_the_command_refuses_arms_before_anything_is_written(tmp_path):
    """Through the CLI: one line on stderr, exit 2, no folder made."""
    proc, _ = run_tracer(["--strategy", "ddp", "--sweep", "bucket-cap-mb=1", "--out",
                          str(tmp_path / "t")], cwd=tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "t").exists()
    assert proc.stderr.strip().splitlines() == [
        "tracer: --sweep bucket-cap-mb=1: give at least two non-empty values, comma-separated "
        "(';'-separated for values that hold commas)"]
    proc, _ = run_tracer(["--strategy", "ddp", "--sweep", "bucket-cap-mb=1,2", "--name", "x",
                          "--out", str(tmp_path / "t")], cwd=tmp_path)
    assert proc.returncode == 2 and "--name x: with --arm / --sweep" in proc.stderr


@pytest.mark.record
def test_arms_that_change_the_numerics_get_their_own_baseline(tmp_path):
    """A precision arm is checked against a bf16 baseline, the fp32 arms share another; every
    manifest names its arm's settings and baseline, and every arm passes the gate."""
    out = tmp_path / "t"
    proc, _ = run_tracer(["--strategy", "ddp", "--arm", "fp32=", "--arm", "bf16=--precision bf16",
                          "--arm", "f2=--strategy fsdp2", "--active", "1", "--out", str(out)] + TINY,
                         cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ms = {n: json.loads((out / n / schemas.MANIFEST_NAME).read_text()) for n in ("fp32", "bf16", "f2")}
    exp = {n: m["experiment"] for n, m in ms.items()}
    assert exp["fp32"]["settings"] == {"precision": "fp32", "strategy": "ddp"}
    assert exp["bf16"]["settings"] == {"precision": "bf16", "strategy": "ddp"}
    assert exp["f2"]["settings"] == {"precision": "fp32", "strategy": "fsdp2"}
    assert exp["fp32"]["baseline"] == exp["f2"]["baseline"] != exp["bf16"]["baseline"]
    assert len({e["id"] for e in exp.values()}) == 1
    # the baselines differ in content too: the bf16 arm's was computed under autocast
    assert ((out / "fp32" / "baseline.safetensors").read_bytes()
            != (out / "bf16" / "baseline.safetensors").read_bytes())
    assert ((out / "fp32" / "baseline.safetensors").stat().st_ino
            == (out / "f2" / "baseline.safetensors").stat().st_ino)  # one file, linked
    gate = subprocess.run([sys.executable, "-m", "analyzer", "gate", str(out)], cwd=REPO,
                          capture_output=True, text=True)
    assert gate.returncode == 0, gate.stdout + gate.stderr


@pytest.mark.record
def test_a_sweep_with_a_canary_arm_ranks_the_passing_arms(tmp_path):
    """End to end: `--sweep bucket-cap-mb=1,25` x arms ok / canary (--fault wrong-grad-scale);
    the report ranks the two passing arms by their settings and leaves both canary arms out,
    each named with its first diverging tensor."""
    out = tmp_path / "t"
    proc, _ = run_tracer(["--strategy", "ddp", "--sweep", "bucket-cap-mb=1,25", "--arm", "ok=",
                          "--arm", "canary=--fault wrong-grad-scale", "--active", "2",
                          "--out", str(out)] + TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    arms = ["ok+bucket-cap-mb=1", "ok+bucket-cap-mb=25", "canary+bucket-cap-mb=1",
            "canary+bucket-cap-mb=25"]
    assert [ln.split("/")[-1] for ln in proc.stdout.splitlines()] == arms
    report = subprocess.run([sys.executable, "-m", "analyzer", "report", str(out)], cwd=REPO,
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr[-3000:]
    rk = json.loads((out / "report" / "report.json").read_text())["ranking"]
    assert rk["status"] == "ranked" and rk["declared"] is True
    assert sorted(rk["order"]) == arms[:2]
    assert {a["name"]: a["settings"] for a in rk["arms"]} == {
        "ok+bucket-cap-mb=1": {"bucket_cap_mb": 1.0, "fault": None},
        "ok+bucket-cap-mb=25": {"bucket_cap_mb": 25.0, "fault": None}}
    assert sorted(rk["left_out"]) == [
        f"arm {a} failed the parity gate (first divergence in grad layers.0.attn.weight)"
        for a in sorted(arms[2:])]
    (pair,) = rk["pairs"]
    assert pair["undecided"] == "one_run" and "steps of one run only" in pair["sentence"]
    decision = report.stdout.splitlines()[2]
    assert decision.startswith("**Decision:** ddp with bucket_cap_mb=")
    assert "canary+bucket-cap-mb=1 failed the parity gate" in decision


@pytest.mark.parametrize("arms, sweeps, strategy, kw, says", [
    ([], ["bucket-cap-mb=default,25"], "ddp", {"bucket_cap_mb": 5.0},
     "--bucket-cap-mb 5.0 and --sweep bucket-cap-mb=default,25 both set --bucket-cap-mb: give it "
     "in one place"),
    ([], ["static-graph=true,false"], "ddp", {"static_graph": False},
     "--no-static-graph and --sweep static-graph=true,false both set --static-graph: give it in "
     "one place"),
    ([], ["seed=1,2"], "ddp", {"seed": 3},
     "--seed 3 and --sweep seed=1,2 both set --seed: give it in one place"),
    ([], ["strategy=ddp,fsdp2"], "ddp", {},
     "--strategy ddp and --sweep strategy=ddp,fsdp2 both set --strategy: give it in one place"),
    (["a=--bucket-cap-mb default", "b=--bucket-cap-mb 1"], [], "ddp", {"bucket_cap_mb": 5.0},
     "--bucket-cap-mb 5.0 and every --arm (a: --bucket-cap-mb default, b: --bucket-cap-mb 1.0) "
     "both set --bucket-cap-mb: give it in one place"),
    (["a=--strategy fsdp2", "b=--strategy fsdp"], [], "ddp", {},
     "--strategy ddp and every --arm (a: --strategy fsdp2, b: --strategy fsdp) both set "
     "--strategy: give it in one place"),
])
def test_an_option_given_fixed_and_in_the_arms_is_refused(arms, sweeps, strategy, kw, says):
    """The arms' value used to replace the fixed one without a word (with --sweep in every arm:
    ``--bucket-cap-mb 5`` was never recorded)."""
    with pytest.raises(ValueError) as err:
        _expand(arms, sweeps, strategy, **kw)
    assert str(err.value) == says


def test_an_option_some_arms_set_is_their_value_over_the_common_one():
    configs = _expand(["a=--static-graph", "b=--bucket-cap-mb 1"], ["seed=1,2"], "ddp",
                      bucket_cap_mb=5.0)
    assert [c.bucket_cap_mb for c in configs] == [5.0, 5.0, 1.0, 1.0]
    mixed = _expand(["d=", "f=--strategy fsdp2"], [], "ddp")
    assert [c.strategy for c in mixed] == ["ddp", "fsdp2"]
