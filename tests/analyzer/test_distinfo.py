"""The reader of a trace's distributedInfo (analyzer/ingest/distinfo.py) on hand-built values."""

from __future__ import annotations

import pytest

from analyzer.ingest.distinfo import DistInfo, ProcessGroup, read

# torch >= 2.3 (torch/profiler/profiler.py _get_distributed_info): an HSDP rank 1 of 4
TORCH_23 = {"backend": "nccl", "rank": 1, "world_size": 4, "pg_count": 5, "nccl_version": "2.21.5",
            "pg_config": [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl",
                           "pg_size": 4, "ranks": [0, 1, 2, 3]},
                          {"pg_name": "2", "pg_desc": "mesh_replicate", "backend_config": "cuda:nccl",
                           "pg_size": 2, "ranks": [1, 3]}]}


def test_torch_profiler_form_read_whole():
    assert read(TORCH_23) == DistInfo(rank=1, world_size=4, backend="nccl", groups={
        "0": ProcessGroup(desc="default_pg", ranks=(0, 1, 2, 3), size=4),
        "2": ProcessGroup(desc="mesh_replicate", ranks=(1, 3), size=2)})


def test_maps_handed_to_classify():
    d = read(TORCH_23)
    assert d.sizes() == {"0": 4, "2": 2}
    assert d.descs() == {"0": "default_pg", "2": "mesh_replicate"}
    assert d.ranks_text() == {"0": "[0, 1, 2, 3]", "2": "[1, 3]"}  # record_param_comms' spelling


def test_torch_22_uid_instead_of_desc():
    d = read({"backend": "nccl", "rank": 0, "world_size": 1,
              "pg_config": [{"pg_name": "0", "uid": 0, "pg_size": 1, "ranks": [0]}]})
    assert d.groups == {"0": ProcessGroup(desc=None, ranks=(0,), size=1)}
    assert d.descs() == {} and d.ranks_text() == {"0": "[0]"}


def test_old_profiler_without_pg_config():
    assert read({"backend": "gloo", "rank": 34, "world_size": 300}) == \
        DistInfo(rank=34, world_size=300, backend="gloo")


@pytest.mark.parametrize("info", [None, [], "nccl", 3, {}])
def test_absent_or_not_an_object_is_all_unknown(info):
    assert read(info) == DistInfo()


def test_pg_config_as_dict_keyed_by_name():
    d = read({"world_size": 2, "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"},
                                             "1": "not an entry"}})
    assert d.groups == {"0": ProcessGroup(desc="default_pg", ranks=(0, 1))}


@pytest.mark.parametrize(("ranks", "world", "want"), [
    ("all", 3, (0, 1, 2)), (" all ", 2, (0, 1)), ("all", None, None), ("[2, 5]", 8, (2, 5)),
    ("0, 1", 2, None), ("[0, true]", 2, None), ([0, 1.0], 2, None), ([0, True], 2, None),
    ([], 2, ()), (None, 2, None), ({"0": 1}, 2, None), ("[[[[", 2, None),
])
def test_ranks_forms(ranks, world, want):
    d = read({"world_size": world, "pg_config": [{"pg_name": "7", "ranks": ranks}]})
    assert d.groups["7"].ranks == want
    assert d.ranks_text() == {"7": "" if want is None else str(list(want))}


def test_malformed_fields_are_unknown_not_errors():
    d = read({"backend": 1, "rank": True, "world_size": 0, "pg_config": [
        "junk", {"pg_desc": "no name"}, {"pg_name": None, "pg_size": 2},
        {"pg_name": 3, "pg_desc": 5, "pg_size": "2", "ranks": "x"},
        {"pg_name": "4", "pg_size": True}, {"pg_name": "5", "pg_size": 0}]})
    assert d == DistInfo(groups={"3": ProcessGroup(), "4": ProcessGroup(), "5": ProcessGroup()})
    assert d.sizes() == {} and d.descs() == {} and d.ranks_text() == {"3": "", "4": "", "5": ""}


@pytest.mark.parametrize(("field", "value", "want"), [
    ("rank", 0, 0), ("rank", -1, None), ("rank", 2.0, None), ("rank", "1", None),
    ("world_size", 1, 1), ("world_size", -4, None), ("world_size", False, None),
])
def test_rank_and_world_size_rules(field, value, want):
    assert getattr(read({field: value}), field) == want


def test_pg_config_of_another_type_is_no_group():
    assert read({"rank": 0, "pg_config": "0"}).groups == {}


def test_last_entry_of_a_repeated_name_wins():
    d = read({"pg_config": [{"pg_name": "0", "pg_size": 2}, {"pg_name": "0", "pg_size": 4}]})
    assert d.sizes() == {"0": 4}
