"""The line a failing rank reports (tracer/worker.py ``write_error``)."""

import json

from tracer import worker


def _env(tmp_path):
    return worker.RankEnv(rank=1, world_size=2, local_rank=1, local_world_size=2, launch="spawn",
                          ctrl_dir=tmp_path)


def test_a_wrapped_error_names_its_root_cause(tmp_path):
    # torch.distributed.pipelining's stage wraps the model's error: its first line says nothing
    try:
        try:
            raise ValueError("the real reason\nmore")
        except ValueError as inner:
            raise RuntimeError("\n    [Stage 0] failed to run forward:\n    args: (...)") from inner
    except RuntimeError as exc:
        line = worker.write_error(_env(tmp_path), 0, exc)
    assert line == ("RuntimeError: [Stage 0] failed to run forward: "
                    "(caused by ValueError: the real reason)")
    assert json.loads((tmp_path / "rank1.error.json").read_text())["error"] == line


def test_an_error_without_a_cause_is_its_first_line_and_a_cycle_ends(tmp_path):
    assert worker.write_error(_env(tmp_path), 0, KeyError("k")) == "KeyError: 'k'"
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert worker.write_error(_env(tmp_path), 0, a) == "RuntimeError: a (caused by RuntimeError: b)"
