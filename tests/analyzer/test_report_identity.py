"""report.json byte-identical on every corpus job: its SHA-256, normalised as
scripts/report_digests.py says (the input's copy folder only), equals the snapshot in
tests/analyzer/report_digests.json (issue 34: a change meant to keep the report, such as the
ingest's speed work, keeps it to the byte)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.corpus import CORPUS, corpus, needs_corpus, skip_reason

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))

import report_digests  # noqa: E402

pytestmark = pytest.mark.integration

STORED = report_digests.load_snapshot()


def _files(job: str) -> list[Path]:
    """The trace files of ``job`` in the corpus; skips the test with the corpus' reason when
    they are absent (the corpus unset, or without this job)."""
    corpus(job.split("/")[0])  # skips when the job's corpus folder is absent
    files = report_digests.corpus_jobs(CORPUS).get(job)
    if not files:
        pytest.skip(skip_reason(job))
    return files


@pytest.mark.parametrize("job", sorted(STORED))
def test_report_json_equals_snapshot(job, tmp_path):
    text = report_digests.report_json(job, _files(job), tmp_path)
    got = report_digests.digest(text)
    if got != STORED[job]:
        kept = tmp_path / "report.normalised.json"
        kept.write_bytes(text)
        pytest.fail(
            f"{job}: report.json changed (sha256 {got}, stored {STORED[job]}). This run's "
            f"normalised report.json: {kept}. To see what changed, run on this tree and on the "
            "commit that wrote the snapshot (git log -1 -- tests/analyzer/report_digests.json) "
            "`PYTHONPATH=. python3 scripts/report_digests.py --save-reports DIR` and `diff -r` "
            "the two DIRs. A change meant to keep the report must not change it; a legitimate "
            f"change of the report's content: `{report_digests.REGENERATE}`, then `git diff "
            "tests/analyzer/report_digests.json` names the jobs, committed with the change and "
            "the reason in the commit body.", pytrace=False)


@needs_corpus
def test_snapshot_covers_every_corpus_job():
    """A job added to (or gone from) the corpus is named, not silently left unchecked."""
    jobs = set(report_digests.corpus_jobs(CORPUS))
    assert jobs == set(STORED), (
        f"corpus jobs without a stored digest: {sorted(jobs - set(STORED))}; stored digests "
        f"without a corpus job: {sorted(set(STORED) - jobs)}; regenerate: "
        f"{report_digests.REGENERATE}")
