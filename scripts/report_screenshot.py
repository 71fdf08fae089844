"""Make README's picture of report.html's first screen (docs/report-first-screen.png) from the
committed record of every strategy in small (fixtures/recorded/tiny), so the picture shows what
today's code writes.

    python3 scripts/report_screenshot.py [RUNS] [PNG]

Renders the report of RUNS with today's code, opens it in headless Chromium (/usr/bin/chromium)
at 1400 x 900, and writes the screenshot to PNG with one more PNG text chunk (``tEXt``, PNG
specification 11.3.4.3): ``paritytrace-first-screen`` = the SHA-256 of report.md's first screen
for the same runs (``first_screen_sha256``). tests/reports/test_screenshot.py recomputes it and
fails when the report's first screen changed and the picture was not made again.
"""

from __future__ import annotations

import hashlib
import struct
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RUNS = REPO / "fixtures" / "recorded" / "tiny"
PNG = REPO / "docs" / "report-first-screen.png"
KEY = b"paritytrace-first-screen"
CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--window-size=1400,900"]


def first_screen_sha256(runs: Path) -> str:
    """SHA-256 (hex) of report.md's first screen (reports/markdown.py ``first_screen``) for the
    runs under ``runs``, analysed by today's code."""
    from analyzer.compare.runs import analyse
    from reports import markdown

    return hashlib.sha256("\n".join(markdown.first_screen(analyse(runs))).encode()).hexdigest()


def text_chunks(png: bytes) -> dict[bytes, bytes]:
    """The ``tEXt`` chunks of a PNG file: keyword -> text. Raises ValueError on a file that is
    not a PNG."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG file")
    out, at = {}, 8
    while at + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"tEXt":
            key, _, text = png[at + 8:at + 8 + length].partition(b"\0")
            out[key] = text
        at += 12 + length
    return out


def with_text(png: bytes, key: bytes, text: bytes) -> bytes:
    """``png`` with a ``tEXt`` chunk ``key`` = ``text`` right after its IHDR chunk."""
    body = b"tEXt" + key + b"\0" + text
    chunk = struct.pack(">I", len(body) - 4) + body + struct.pack(">I", zlib.crc32(body))
    ihdr_end = 8 + 12 + struct.unpack(">I", png[8:12])[0]
    return png[:ihdr_end] + chunk + png[ihdr_end:]


def main(runs: Path = RUNS, out: Path = PNG) -> None:
    from reports import html
    from analyzer.compare.runs import analyse

    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(html.render(analyse(runs), out_dir=tmp))
        shot = Path(tmp) / "shot.png"
        subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp}/profile",
                        f"--screenshot={shot}", page.as_uri()], check=True, capture_output=True)
        out.write_bytes(with_text(shot.read_bytes(), KEY, first_screen_sha256(runs).encode()))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:3]))
