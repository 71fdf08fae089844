"""Where the tests find the public trace corpus: ``$PARITYTRACE_CORPUS`` and nowhere else.

``.ci/run`` sets it to ``../shared/corpus``. Unset, or pointing at a folder that does not exist
(a user's fresh clone), every test that needs a corpus file is skipped with a reason that says
so; the rest of the suite runs. Never guessed from the checkout's location.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV = "PARITYTRACE_CORPUS"


def corpus_root() -> Path | None:
    """The corpus folder named by ``$PARITYTRACE_CORPUS``, or None when unset or not a folder."""
    value = os.environ.get(ENV, "")
    if not value:
        return None
    root = Path(value).expanduser().resolve()
    return root if root.is_dir() else None


CORPUS = corpus_root() or Path("/nonexistent") / f"{ENV}-is-unset"
"""The corpus root; a path that does not exist when the corpus is absent, so ``(CORPUS /
rel).exists()`` is False and the callers below skip."""


def skip_reason(rel: str = "") -> str:
    """Why a test that needs ``rel`` is skipped (one line, names the variable)."""
    if corpus_root() is None:
        return f"public trace corpus not available: set {ENV} to the corpus folder (.ci/run does)"
    return f"corpus file {rel} not present in {CORPUS}"


def corpus(rel: str) -> Path:
    """``$PARITYTRACE_CORPUS/rel``; skips the calling test when it is absent."""
    p = CORPUS / rel
    if not p.exists():
        pytest.skip(skip_reason(rel))
    return p


def need(path: Path) -> Path:
    """``path`` (a path under CORPUS); skips the calling test when it is absent."""
    if not path.exists():
        pytest.skip(skip_reason(str(path)))
    return path


needs_corpus = pytest.mark.skipif(corpus_root() is None, reason=skip_reason())
"""Mark for tests or modules that read the corpus at collection or set-up time."""


def params(items: list, names: int = 1) -> list:
    """``items`` for ``pytest.mark.parametrize``; without the corpus, one case skipped with
    ``skip_reason()`` (pytest's own "got empty parameter set" would not say why)."""
    if items:
        return items
    return [pytest.param(*([None] * names), marks=pytest.mark.skip(reason=skip_reason()),
                         id="no-corpus")]
