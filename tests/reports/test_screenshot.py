"""README's picture of report.html's first screen shows today's output: the picture carries the
SHA-256 of report.md's first screen it was made from (scripts/report_screenshot.py), and the
same runs analysed by today's code give the same first screen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import report_screenshot as shot  # noqa: E402


def test_the_readme_screenshot_shows_todays_first_screen():
    assert "docs/report-first-screen.png" in (REPO / "README.md").read_text()
    made_from = shot.text_chunks(shot.PNG.read_bytes()).get(shot.KEY)
    assert made_from is not None, "make it with: python3 scripts/report_screenshot.py"
    assert made_from.decode() == shot.first_screen_sha256(shot.RUNS), (
        "report.md's first screen changed: python3 scripts/report_screenshot.py")


def test_a_text_chunk_reads_back_and_a_non_png_is_refused():
    png = b"\x89PNG\r\n\x1a\n" + b"\0\0\0\x0dIHDR" + bytes(13) + b"\0\0\0\0"
    assert shot.text_chunks(shot.with_text(png, b"k", b"v")) == {b"k": b"v"}
    with pytest.raises(ValueError, match="not a PNG"):
        shot.text_chunks(b"GIF89a")
