"""An incomplete projection's clean-up hint names tracer project (analyzer/ingest/rundirs.py)."""
from analyzer.contract import schemas
from analyzer.ingest.rundirs import cleanup_hint


def test_interrupted_projection_is_re_run_with_tracer_project(tmp_path):
    run = tmp_path / "fsdp2"
    run.mkdir()
    (run / schemas.RECORDING_NAME).write_text("123\nproject\n")  # tracer/project.py's marker
    assert cleanup_hint([run]) == (f"re-record it (tracer project ... --out {tmp_path} --name "
                                   f"fsdp2) or delete the folder {run}")


def test_interrupted_record_is_re_run_with_tracer_record(tmp_path):
    run = tmp_path / "ddp"
    run.mkdir()
    (run / schemas.RECORDING_NAME).write_text("123\n")
    assert cleanup_hint([run]).startswith(f"re-record it (tracer record ... --out {tmp_path}")
