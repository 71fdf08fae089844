"""The read-only refusal of ``outpaths.check_out`` reads right for a plural output name."""

from pathlib import Path

import pytest

from analyzer.contract import outpaths
from analyzer.contract.errors import BadInput


def test_read_only_folder_refusal_agrees_with_a_plural_output(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(BadInput) as err:
            outpaths.check_out(folder / "links.json", option="--out", what="the link curves",
                               example="links.json")
    finally:
        folder.chmod(0o755)
    assert "is marked read-only; the link curves cannot be written there" in str(err.value)
