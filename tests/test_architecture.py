"""The architecture holds (ARCHITECTURE.md): the layers import downwards only (the tracer and
the reports see only the contract, the reports the cache key too), no import cycle, no function
over ``MAX_FUNCTION_LINES`` lines, and the product code within ``LINE_BUDGET`` lines."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analyzer", "reports", "tracer")


def _product_files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _product_files()}


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
            # a name is a submodule, or an attribute of ``base``: the walk up below finds which
            targets = [f"{base}.{a.name}" for a in node.names]
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


def test_imports_inside_functions_and_type_checks_count(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("if TYPE_CHECKING:\n    import reports.html\n"
                    "def f():\n    from reports import fmt\n    from . import verdict\n")
    known = {"reports.fmt", "reports.html", "reports.m", "reports.verdict"}
    assert _imports("reports.m", path, known) == {"reports.fmt", "reports.html", "reports.verdict"}


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# Each stage imports only the stages below it (ARCHITECTURE.md "Layers"), or the single modules
# named. ingest runs the per-rank analyses inside its workers, so ingest stands above analyses;
# compare renders the report it builds (compare/reportfiles.py), so reports stands below it.
ALLOWED = {
    "contract": set(),
    "tracer": {"contract"},
    "analyses": {"contract"},
    "ingest": {"contract", "analyses"},
    "compare": {"contract", "analyses", "ingest", "reports"},
    "timeline": {"contract", "analyses", "ingest"},
    "reports": {"contract", "analyzer.ingest.cachekey"},
    "api": {"contract", "analyses", "ingest"},
    "cli": {"contract", "analyses", "ingest", "compare", "timeline", "reports"},
    "__main__": {"cli"},
}


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] != "analyzer" or len(parts) == 1 else parts[1]


def _wrong_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{m} -> {d}" for m, deps in graph.items() for d in deps
                  if _stage(d) != _stage(m) and _stage(d) not in ALLOWED[_stage(m)]
                  and d not in ALLOWED[_stage(m)])


def test_each_stage_imports_only_the_stages_below_it():
    wrong = _wrong_imports(_graph())
    assert not wrong, wrong


def test_reports_importing_the_ingest_beyond_the_cache_key_is_wrong():
    graph = {"reports.cache": {"analyzer.ingest.cachekey"}, "reports.html": {"analyzer.ingest.rundirs"},
             "tracer.cli": {"analyzer.contract.text", "analyzer.analyses.clock"}}
    assert _wrong_imports(graph) == ["reports.html -> analyzer.ingest.rundirs",
                                     "tracer.cli -> analyzer.analyses.clock"]


def test_every_product_module_belongs_to_a_stage():
    assert {_stage(m) for m in _modules()} - {"analyzer"} <= set(ALLOWED)


MAX_FUNCTION_LINES = 100
"""A function longer than this does more than one thing: split it (STYLE.md)."""


def _long_functions(source: str, where: str) -> list[str]:
    """``where:line name (n lines)`` of each function or method of ``source`` (nested ones
    too) longer than ``MAX_FUNCTION_LINES``, from its ``def`` line to its last line."""
    return [f"{where}:{node.lineno} {node.name} ({n} lines)"
            for node in ast.walk(ast.parse(source, where))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and (n := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES]


def test_no_product_function_is_over_100_lines():
    long = [f for p in _product_files() for f in _long_functions(p.read_text(), str(p.relative_to(REPO)))]
    assert not long, "split these functions: " + "; ".join(long)


def test_long_function_finder_counts_from_def_to_last_line():
    body = "    x = 1\n" * (MAX_FUNCTION_LINES - 1)
    assert _long_functions(f"def f():\n{body}", "m.py") == []
    assert _long_functions(f"class C:\n  def g(self):\n{body}    x = 2\n", "m.py") == [
        f"m.py:2 g ({MAX_FUNCTION_LINES + 1} lines)"]


LINE_BUDGET = 28097
"""Physical lines of every *.py under tracer/, analyzer/ and reports/: issue 31's fixes are made
without growing the product code. Measured 2026-12-03: 27933 at f347ad4 (before issue 31's work),
27912 once it was done; raised by 49 to 27961 for ``tracer/stopping.py`` (a stop signal deferred
while the record lock and the baseline staging folder are made: a SIGTERM there left either
behind) and for a SIGTERM that typer turned into a silent exit 130 (``tracer/cli.py``); by 15
for issue 34: the decode tells whether a trace has ``[memory]`` events (instant events keep
their name), so that no rank's JSON is scanned twice more for a substring; by 1 for the
events' phases read in one pass; by 6 for the cycle collector paused while a rank is parsed
(``ranktables.tables_worker``); by 2 for a rank's failure line written in one write
(``tracer/worker.py``: another process's line landed inside it); by 35 for the profiler stop
that waits for the other threads to settle (``tracer/profiling.py``: torch 2.13 corrupts the
heap when a stop races a gloo thread finishing a collective); by 47 for bounded caches: the
per-rank tables caches only in the user cache, each cache folder trimmed to
``PARITYTRACE_CACHE_MAX_BYTES``, least recently used first (``cachekey.trim``, its setting and
its callers: caches beside traces grew without bound, and a test run left 19 in a writable
public corpus); by 30 for a second stop signal of a burst going to a no-op handler, not SIG_IGN
(CPython raised "Signal 15 ignored due to race condition" mid clean-up), a rank's bad-option
line in one write, and cache files read only when regular and within the cap
(``cachekey.read_regular``: a /dev/zero link filled the memory, a FIFO hung the command) with
the records of written report files never trimmed (an edited report.md was replaced).
Measure with ``python -c "from tests.test_architecture import product_lines;
print(product_lines())"``. Lower it when the code shrinks; raise it only in a commit that says
why the code must grow."""


def product_lines() -> int:
    """Physical lines of the product code (``LINE_BUDGET``'s measure)."""
    return sum(len(p.read_bytes().splitlines()) for p in _product_files())


def test_product_code_stays_within_its_line_budget():
    lines = product_lines()
    assert lines <= LINE_BUDGET, (f"the product code has {lines} lines, over its budget of "
                                  f"{LINE_BUDGET}: shrink it, or raise LINE_BUDGET saying why")
