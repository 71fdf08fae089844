"""Issue 5, security: never unpickle; trace-derived strings escaped in HTML and Markdown tables;
folder walks never follow symlinks out of the input or into a loop."""

from __future__ import annotations

import pytest

import html
import os
import re
import shutil
from pathlib import Path

from analyzer.api import load_tables
from analyzer.ingest.fswalk import entries
from reports import markdown
from tests.inputs import TBPLUGIN, cli, copy_run, load, need, save

REPO = Path(__file__).parents[2]
EVIL = '<img src=x onerror=alert(1)> | "q" \\ </td>'


UNPICKLE = re.compile(r"import\s+(pickle|dill|joblib|cloudpickle|_pickle)\b|from\s+(pickle|dill|joblib)\b"
                      r"|pickle\.(loads?|Unpickler)|torch\.load|read_pickle|allow_pickle\s*=\s*True")


def unpickle_uses(text: str) -> list[str]:
    """Lines of Python source that load pickles (comments dropped; prose never matches: the
    pattern needs an import or a call)."""
    return [ln.strip() for ln in text.splitlines() if UNPICKLE.search(ln.split("#", 1)[0])]


GUARD = "analyzer/ingest/daskwire.py"
"""The one module that names pickle: it replaces ``pickle.loads`` on the Dask client's thread
with a refusal (and reads a refused pickle's class with pickletools, which runs nothing)."""


def test_analyzer_and_reports_never_unpickle():
    hits = {str(f.relative_to(REPO)): unpickle_uses(f.read_text())
            for pkg in ("analyzer", "reports") for f in sorted((REPO / pkg).rglob("*.py"))}
    assert len(hits) > 20  # the walk saw the packages
    assert {f: h for f, h in hits.items() if h and f != GUARD} == {}
    guard = (REPO / GUARD).read_text()
    assert "pickle.loads = _pickle_loads" in guard and "raise PickleRefused" in guard


def test_the_unpickle_grep_can_fail():
    planted = "import pickle\nx = pickle.loads(b'')\ny = torch.load(p)\nz = pd.read_pickle(p)\n"
    assert len(unpickle_uses(planted)) == 4
    assert unpickle_uses('"""the analyzer never unpickles; CUDA snapshot pickles are converted"""') == []


def test_trace_strings_are_escaped_in_html_and_markdown(tmp_path, ddp_run):
    job = copy_run(ddp_run, tmp_path / "ddp")
    m = load(job / "manifest.json")
    m["run_name"] = EVIL  # manifest strings are untrusted too
    (job / "manifest.json").write_text(__import__("json").dumps(m))
    t = load(job / "rank0.trace.json.gz")
    for e in t["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:"):
            e["name"] = EVIL
    save(job / "rank0.trace.json.gz", t)
    proc = cli("report", str(job), "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "o" / "report.html").read_text()
    assert "<img" not in page and "</td>\"" not in page
    assert html.escape(EVIL, quote=True) in page
    md = (tmp_path / "o" / "report.md").read_text()
    rows = [ln for ln in md.splitlines() if ln.startswith("| ") and "onerror" in ln]
    assert rows
    for ln in rows:  # the trace's pipe is escaped, so the row keeps its columns
        assert '\\| "q"' in ln and ' | "q"' not in ln
    # Markdown table helper on its own: column count is kept whatever the cell holds
    tab = markdown.table(["a", "b"], [[EVIL, "x|y"]])
    body = tab.splitlines()[2]
    assert len(re.split(r"(?<!\\)\|", body)) == len(re.split(r"(?<!\\)\|", tab.splitlines()[0]))


@pytest.mark.integration
def test_symlink_loop_and_symlink_out_of_the_input_are_not_followed(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "rank7.json"
    shutil.copyfile(need(TBPLUGIN / "nccl__worker1.json"), secret)  # a valid trace, outside
    job = tmp_path / "job"
    job.mkdir()
    shutil.copyfile(TBPLUGIN / "nccl__worker0.json", job / "nccl__worker0.json")
    shutil.copyfile(TBPLUGIN / "nccl__worker1.json", job / "nccl__worker1.json")
    os.symlink(secret, job / "rank7.json")  # file link out of the input
    os.symlink(job, job / "loop")  # folder link into a loop
    os.symlink(outside, job / "elsewhere")  # folder link out of the input
    os.symlink(job / "nccl__worker0.json", job / "inside_link.json.bak")  # inside: allowed
    kept, skipped = entries(job)
    assert {p.name for p in kept} == {"nccl__worker0.json", "nccl__worker1.json", "inside_link.json.bak"}
    assert len(skipped) == 3 and any("loops back" in s for s in skipped)
    ts = load_tables(job)
    assert [r.path.name for r in ts.ranks] == ["nccl__worker0.json", "nccl__worker1.json"]
    assert any("rank7.json" in w and "outside" in w for w in ts.warnings)
    for cmd, extra in (("summary", []), ("report", ["--out", str(tmp_path / "o")]),
                       ("merge", ["-o", str(tmp_path / "m.json.gz")])):
        proc = cli(cmd, str(job), *extra)
        assert proc.returncode == 0, (cmd, proc.stderr)
    assert "rank7.json: symlink to" in (tmp_path / "o" / "report.md").read_text()
    # a traces root: a run-dir-looking link out of it and a looping link are not walked
    root = tmp_path / "root"
    root.mkdir()
    os.symlink(job, root / "job_link")  # out of root
    os.symlink(root, root / "again")
    proc = cli("report", str(root), "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2 and "holds no run directory" in proc.stderr
