"""`summary FILE --crosscheck hta` gives HTA only that file (oracle: HTA run by hand on a folder
holding a copy of it), in a temporary folder removed afterwards."""

from __future__ import annotations

import json
import math
import shutil
import tempfile

import pytest

from tests.inputs import CORPUS, cli, need

A100 = CORPUS / "single" / "a100_ddp_rank0_nccl_args.json.gz"


def test_crosscheck_hta_on_one_file_reads_only_that_file(tmp_path, monkeypatch):
    pytest.importorskip("hta.trace_analysis")
    from analyzer.compare.crosscheck_hta import run_hta_overlap

    src = need(A100)
    # oracle: HTA run by hand on a folder holding a copy of that one file
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(src, alone / src.name)
    expected = run_hta_overlap(alone)
    assert list(expected["rank"]) == [0] and not math.isnan(expected["hta_overlap_pct"].iat[0])

    tmp_root = tmp_path / "tmp"
    tmp_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_root))
    out = tmp_path / "s.json"
    proc = cli("summary", str(src), "--crosscheck", "hta", "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "same rank" not in proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["crosscheck_hta"]
    assert [r["rank"] for r in rows] == [0]
    assert rows[0]["hta_overlap_pct"] == pytest.approx(float(expected["hta_overlap_pct"].iat[0]))
    assert "no figure" not in rows[0]["explanation"]
    assert list(tmp_root.iterdir()) == []  # the temporary folder is removed afterwards
