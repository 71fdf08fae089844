"""`tracer record --repeat N` (issue 20): interleaved repeats, one experiment id, the machine
recorded, oversubscription warned about; the config pieces first (no record), then one tiny
record end to end."""

from __future__ import annotations

import json

import pytest

from analyzer.contract import schemas
from tracer.config import RecordConfig
from tracer.record import chosen_strategies, expand, interleave, oversubscription
from tests.tracer.helpers import TINY, run_tracer


def test_strategy_lists_expand_in_the_given_order():
    assert chosen_strategies("fsdp2,ddp") == ["fsdp2", "ddp"]
    assert chosen_strategies("all") == list(schemas.FLAT_STRATEGIES)
    with pytest.raises(ValueError, match="distinct"):
        chosen_strategies("ddp,ddp")
    configs = expand("fsdp2,ddp", "x", sharding_strategy="shard_grad_op")
    assert [(c.strategy, c.run_name) for c in configs] == [("fsdp2", "x-fsdp2"), ("ddp", "x-ddp")]
    assert configs[0].sharding_strategy == "shard_grad_op"  # ddp does not take it: dropped
    with pytest.raises(ValueError, match="--strategy"):
        expand("ddp,zero", None)


def test_interleave_names_rounds_and_shares_one_experiment():
    configs = interleave(expand("single,ddp", None, repeat=3))
    # each round's order rotated by one: no strategy always first
    assert [c.run_name for c in configs] == ["single.r1", "ddp.r1", "ddp.r2", "single.r2",
                                             "single.r3", "ddp.r3"]
    assert len({c.experiment_id for c in configs}) == 1
    assert [c.experiment_order for c in configs] == ["single,ddp"] * 2 + ["ddp,single"] * 2 + [
        "single,ddp"] * 2
    three = interleave(expand("single,ddp,fsdp", None, repeat=3))
    assert [c.arm for c in three] == ["single", "ddp", "fsdp", "ddp", "fsdp", "single",
                                      "fsdp", "single", "ddp"]
    one = interleave(expand("ddp", None), "my-exp")  # --repeat 1: the plain name
    assert [(c.run_name, c.repeat_index, c.experiment_id) for c in one] == [("ddp", 1, "my-exp")]
    # a worker rebuilds the same run dir from its arguments
    argv = configs[2].to_argv()  # ddp.r2
    assert argv[:4] == ["--strategy", "ddp", "--name", "ddp"]
    assert "--repeat-index" in argv and argv[argv.index("--repeat-index") + 1] == "2"


@pytest.mark.parametrize("kw,why", [({"repeat": 0}, "--repeat 0"), ({"repeat": 101}, "--repeat 101"),
                                    ({"repeat": 2, "repeat_index": 3}, "--repeat-index 3"),
                                    ({"experiment_id": "a b"}, "--experiment-id a b")])
def test_bad_repeat_options_are_refused(kw, why):
    with pytest.raises(ValueError, match=why):
        RecordConfig(strategy="ddp", **kw)


def test_oversubscription_is_named():
    configs = expand("single,ddp", None, nproc=4)
    text = oversubscription(configs, usable_cpus=2)
    assert text is not None and "4 ranks x 1 thread(s) per rank > 2 usable CPU core(s)" in text
    assert oversubscription(configs, usable_cpus=4) is None


@pytest.mark.record
def test_repeat_records_interleaved_complete_runs_of_one_experiment(tmp_path):
    proc, _ = run_tracer(["--strategy", "single,ddp", "--repeat", "2", "--active", "2",
                          "--out", str(tmp_path / "t")] + TINY, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = ["single.r1", "ddp.r1", "ddp.r2", "single.r2"]
    assert [ln.split("/")[-1] for ln in proc.stdout.splitlines()] == names  # interleaved
    ms = {n: json.loads((tmp_path / "t" / n / schemas.MANIFEST_NAME).read_text()) for n in names}
    assert len({m["experiment"]["id"] for m in ms.values()}) == 1
    assert [(m["experiment"]["arm"], m["experiment"]["repeat"]) for m in ms.values()] == [
        ("single", 1), ("ddp", 1), ("ddp", 2), ("single", 2)]
    for m in ms.values():
        assert m["experiment"]["repeats"] == 2
        assert m["experiment"]["order"] == (["single", "ddp"] if m["experiment"]["repeat"] == 1
                                            else ["ddp", "single"])
        mach = m["machine"]
        assert len(mach["load_avg"]) == 3 and mach["threads_per_rank"] == 1
        assert mach["ranks_on_host"] == m["world_size"]
        assert mach["oversubscribed"] == (m["world_size"] > mach["usable_cpus"])
        assert not (tmp_path / "t" / m["run_name"] / schemas.RECORDING_NAME).exists()
    # the created times follow the interleaved order
    created = [ms[n]["created_utc"] for n in names]
    assert created == sorted(created)
