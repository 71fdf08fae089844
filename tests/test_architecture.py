"""The architecture holds: no import cycle in the product code, the tracer sees only the
contract, and the layers import downwards (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analyzer", "reports", "tracer")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Product modules ``name`` imports anywhere in its body (function-level imports too: a
    cycle through a lazy import is still a cycle)."""
    out: set[str] = set()
    is_pkg = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + (1 if is_pkg else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name and t not in PACKAGES:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(m, p, set(mods)) for m, p in mods.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_in_the_product_code():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# Each stage imports only the stages below it (ARCHITECTURE.md). ingest runs the per-rank
# analyses inside its workers, so ingest stands above analyses.
ALLOWED = {
    "contract": set(),
    "tracer": {"contract"},
    "analyses": {"contract"},
    "ingest": {"contract", "analyses"},
    "compare": {"contract", "analyses", "ingest"},
    "timeline": {"contract", "analyses", "ingest"},
    "reports": {"contract", "ingest"},
    "api": {"contract", "analyses", "ingest"},
    "cli": {"contract", "analyses", "ingest", "compare", "timeline", "reports"},
    "__main__": {"cli"},
}


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "analyzer" or len(parts) == 1 else parts[1]


def test_each_stage_imports_only_the_stages_below_it():
    wrong = sorted(f"{m} -> {d}" for m, deps in _graph().items() for d in deps
                   if _stage(d) != _stage(m) and _stage(d) not in ALLOWED[_stage(m)])
    assert not wrong, wrong


def test_every_product_module_belongs_to_a_stage():
    assert {_stage(m) for m in _modules()} - {"analyzer"} <= set(ALLOWED)
