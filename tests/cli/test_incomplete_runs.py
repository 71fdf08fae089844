"""An incomplete run directory (no manifest, or the record marker) is refused by the analyzer in
one line that says exactly how to clean it up: re-record it where it was recorded, or delete
the folder (issue 42); the committed tiny records are the complete runs beside it."""

from __future__ import annotations

import shutil

from analyzer.contract import schemas
from tests.inputs import bad_input, cli
from tests.records import committed


def _root(tmp_path, *incomplete: str):
    root = tmp_path / "traces"
    shutil.copytree(committed("tiny"), root)
    for name in incomplete:
        (root / name / schemas.MANIFEST_NAME).unlink()
    return root


def test_one_incomplete_run_says_how_to_clean_it_up(tmp_path):
    root = _root(tmp_path, "ddp")
    line = bad_input(cli("gate", str(root)))
    assert line == (f"analyzer: {root}/ddp: incomplete run: no manifest.json (the tracer writes it "
                    "last): the record did not complete (failed, interrupted or still running); "
                    f"re-record it (tracer record ... --out {root} --name ddp) or delete the folder "
                    f"{root}/ddp; or pass --allow-incomplete to analyse as found (marked "
                    "incomplete, not ranked, not gated)")


def test_incomplete_runs_each_named_with_their_clean_up(tmp_path):
    root = _root(tmp_path, "ddp", "fsdp")
    line = bad_input(cli("gate", str(root)))
    assert line.endswith(f"re-record them (tracer record ... --out {root} --name ddp, ... --name "
                         f"fsdp) or delete the folders {root}/ddp, {root}/fsdp; or pass "
                         "--allow-incomplete to analyse as found (marked incomplete, not ranked, "
                         "not gated)")
    run = root / "ddp"
    assert bad_input(cli("gate", str(run))).endswith(
        f"re-record it (tracer record ... --out {root} --name ddp) or delete the folder {run}; "
        "or pass --allow-incomplete to analyse what is there")
