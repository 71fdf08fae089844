"""DDP's bucket setting as torch applies it (issue 42): given no ``--bucket-cap-mb``, torch makes
a 1 MiB first bucket and 25 MiB after it (torch/nn/parallel/distributed.py
``_BucketCapacityConfig.create``, ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``); an explicit
25 makes the first bucket 25 MiB too. The manifest, the declared arms' settings and the
analyzer's comparison keep the two apart; ``default`` is a value the command line takes."""

from __future__ import annotations

import gzip
import json

import pytest

from analyzer.contract.arms import pair_labels, same_value
from analyzer.contract.strategies import DDP_DEFAULT_BUCKET
from tests.tracer.helpers import run_tracer
from tests.tracer.test_arms import _expand, _settings
from tracer.config import RecordConfig, parse_bucket_cap_mb


def test_manifest_records_torch_default_buckets_apart_from_an_explicit_25():
    default = RecordConfig(strategy="ddp", name="a").strategy_options()
    explicit = RecordConfig(strategy="ddp", name="b", bucket_cap_mb=25.0).strategy_options()
    assert default["bucket_cap_mb"] == "default" == DDP_DEFAULT_BUCKET
    assert explicit["bucket_cap_mb"] == 25.0
    assert default != explicit


def test_bucket_cap_mb_takes_default_as_a_value():
    assert parse_bucket_cap_mb("default") is None
    for other_case in ("Default", "DEFAULT"):  # one spelling: it names a --sweep arm's run dir
        with pytest.raises(ValueError, match=f"'{other_case}': write default in lower case, "
                                             "its one spelling"):
            parse_bucket_cap_mb(other_case)
    assert parse_bucket_cap_mb("25") == 25.0
    with pytest.raises(ValueError, match="'big' is not a number of MiB or default"):
        parse_bucket_cap_mb("big")
    assert RecordConfig(strategy="ddp", name="a", bucket_cap_mb="default").bucket_cap_mb is None


@pytest.mark.parametrize("arms, sweeps, says", [
    ([], ["bucket-cap-mb=DEFAULT,25"], "--sweep bucket-cap-mb=DEFAULT: Invalid value for "
     "'--bucket-cap-mb': 'DEFAULT': write default in lower case, its one spelling"),
    (["a=--bucket-cap-mb Default", "b="], [], "--arm a: Invalid value for '--bucket-cap-mb': "
     "'Default': write default in lower case, its one spelling"),
])
def test_other_spellings_of_default_are_refused_in_sweeps_and_arms(arms, sweeps, says):
    """``DEFAULT`` would name a second run dir (``bucket-cap-mb=DEFAULT``) of the setting
    ``default``: two dirs, one label."""
    with pytest.raises(ValueError) as err:
        _expand(arms, sweeps, strategy="ddp")
    assert str(err.value) == says


def test_sweep_names_the_default_bucket_setting():
    configs = _expand(sweeps=["bucket-cap-mb=default,25"], strategy="ddp")
    assert [(c.arm, c.bucket_cap_mb) for c in configs] == [("bucket-cap-mb=default", None),
                                                          ("bucket-cap-mb=25", 25.0)]
    assert _settings(configs) == {"bucket-cap-mb=default": {"bucket_cap_mb": "default"},
                                  "bucket-cap-mb=25": {"bucket_cap_mb": 25.0}}
    arms = _expand(["d=--bucket-cap-mb default", "e=--bucket-cap-mb 25"], strategy="ddp")
    assert _settings(arms) == {"d": {"bucket_cap_mb": "default"}, "e": {"bucket_cap_mb": 25.0}}


def test_analyzer_sees_default_and_25_as_different_settings():
    assert not same_value("default", 25.0)
    assert same_value(25, 25.0)  # an old manifest's 25.0 reads as it did
    a = ("bucket-cap-mb=default", "ddp", {"bucket_cap_mb": "default"})
    b = ("bucket-cap-mb=25", "ddp", {"bucket_cap_mb": 25.0})
    assert pair_labels(a, b) == ("ddp with bucket_cap_mb=default", "with bucket_cap_mb=25.0")


def _all_reduces_per_step(trace) -> list[int]:
    """gloo all_reduce calls (their CPU annotations) inside each ProfilerStep span."""
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#")]
    calls = [e for e in events if e.get("name") == "gloo:all_reduce"]
    return [sum(s["ts"] <= c["ts"] < s["ts"] + s["dur"] for c in calls) for s in steps]


@pytest.mark.record
def test_default_buckets_make_two_all_reduces_per_step_where_25_makes_one(tmp_path):
    # the reference model at its default width (256, 2 layers: about 4.7 MB of fp32 gradients),
    # small batch and sequence: more than the 1 MiB first bucket, less than 25 MiB
    shape = ["--strategy", "ddp", "--seq", "8", "--batch", "4", "--warmup", "0", "--active", "2",
             "--out", str(tmp_path)]
    for name, extra in (("default", []), ("b25", ["--bucket-cap-mb", "25"])):
        proc, _ = run_tracer([*shape, "--name", name, *extra], tmp_path)
        assert proc.returncode == 0, proc.stderr
    for rank in (0, 1):
        assert _all_reduces_per_step(tmp_path / "default" / f"rank{rank}.trace.json.gz") == [2, 2]
        assert _all_reduces_per_step(tmp_path / "b25" / f"rank{rank}.trace.json.gz") == [1, 1]
    options = {n: json.loads((tmp_path / n / "manifest.json").read_text())["strategy_options"]
               for n in ("default", "b25")}
    assert options["default"]["bucket_cap_mb"] == "default"
    assert options["b25"]["bucket_cap_mb"] == 25.0
