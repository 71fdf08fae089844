"""The settings table's batch shape (reports/markdown.py batch_shape)."""
from reports.markdown import batch_shape


def test_batch_shape_names_the_hidden_size():
    b = {"global_batch": 4, "seq_len": 16, "hidden": 64, "per_rank_batch": 2}
    assert batch_shape(b) == "global 4 x seq 16 x hidden 64 (per rank 2)"


def test_batch_shape_leaves_out_a_zero_hidden_size():
    b = {"global_batch": 4, "seq_len": 16, "hidden": 0, "per_rank_batch": 2}
    assert batch_shape(b) == "global 4 x seq 16 (per rank 2)"
