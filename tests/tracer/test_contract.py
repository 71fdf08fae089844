"""DESIGN.md: the contract is the one thing that crosses from analyzer to tracer. The tracer
imports only the contract's modules (every module of analyzer/contract/), and those import
nothing else of the analyzer. Run-directory files are written through ``atomic_path``."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from analyzer.contract.atomic import atomic_path, write_atomic

REPO = Path(__file__).parents[2]
CONTRACT = {f"analyzer.contract.{p.stem}" for p in (REPO / "analyzer" / "contract").glob("*.py")
            if p.stem != "__init__"}


def _analyzer_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = (REPO / node.module.replace(".", "/")).is_dir()  # from PKG import MODULE
            mods = [f"{node.module}.{a.name}" for a in node.names] if package else [node.module]
        elif isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        else:
            continue
        names |= {m for m in mods if m == "analyzer" or m.startswith("analyzer.")}
    return names


def test_tracer_imports_only_the_contract():
    seen = {}
    for path in sorted((REPO / "tracer").glob("*.py")):
        for mod in _analyzer_imports(path):
            seen.setdefault(mod, []).append(path.name)
    assert set(seen) <= CONTRACT, {m: f for m, f in seen.items() if m not in CONTRACT}
    assert "analyzer.contract.schemas" in seen  # the scan sees the imports


def test_contract_imports_nothing_else_of_the_analyzer():
    for mod in CONTRACT:
        path = REPO / (mod.replace(".", "/") + ".py")
        assert _analyzer_imports(path) <= CONTRACT, path


def test_atomic_path_replaces_on_success_and_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "t.parquet"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            assert tmp.parent.parent == tmp_path and tmp.parent.name.startswith(".tmp-")
            assert tmp.name == "t.parquet"  # suffixes kept, in a hidden owned temp folder
            tmp.write_bytes(b"half")
            raise RuntimeError("writer failed")
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"] and target.read_bytes() == b"old"
    with atomic_path(target) as tmp:
        tmp.write_bytes(b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"] and target.read_bytes() == b"new"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0600
    write_atomic(tmp_path / "sub" / "m.json", "{}")  # missing folders are created
    assert (tmp_path / "sub" / "m.json").read_text() == "{}"
