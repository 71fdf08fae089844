"""SHA-256 of ``analyzer report``'s report.json on every job of the public trace corpus: the
snapshot that holds the report byte-identical through changes that must not change it (issue 34,
the ingest's speed work). tests/analyzer/test_report_identity.py compares with the same
functions, one test per job.

A job is what the analyzer takes as one input (the corpus README names the files):
``dlrm_ddp_8rank_v100`` (its folder, 8 ranks), ``single/<file>`` (each single-rank trace file
by itself) and ``tbplugin_2rank/<prefix>`` (that folder holds two 2-rank jobs whose files share
the ranks 0 and 1, which the analyzer refuses as one folder: each job's ``<prefix>__worker*``
files get a folder of their own). Each job is copied into a fresh folder and analysed there by
the command-line entry point (``analyzer report INPUT --out OUT --format json``), in this
process, with ``XDG_CACHE_HOME`` in that folder too: no tables or report cache of an earlier
analysis can answer (both caches live there, never beside a trace), and nothing is written into
the corpus.

Normalisation, the only edit before hashing: report.json names its input by absolute path
(``root``, ``runs[].path``, ``runs[].traces[]``), so every occurrence of the copy folder's
absolute path, as JSON spells it, becomes ``$CORPUS_COPY``. That prefix is the only difference
between two analyses of the same job from two different folders (checked: temp folders of other
names and depths, other ``--out`` folders, ``PYTHONHASHSEED`` 1 and 2); the job's own folder
and file names under it are the corpus' and stay. Every other byte is hashed as written.

Usage (from the repository root; ``PARITYTRACE_CORPUS`` names the corpus folder)::

    PYTHONPATH=. python3 scripts/report_digests.py           # print, compare with the snapshot
    PYTHONPATH=. python3 scripts/report_digests.py --write tests/analyzer/report_digests.json
    PYTHONPATH=. python3 scripts/report_digests.py --save-reports DIR   # also keep the texts

Exit status: 0 when every digest equals the snapshot's, 1 when a job differs, is new or is gone
(each named on stderr), 2 when the corpus is not available or a report fails.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from tests.inputs import cli  # noqa: E402 - the analyzer's CLI in this process, as tests run it

SNAPSHOT = REPO / "tests" / "analyzer" / "report_digests.json"
CORPUS_ENV = "PARITYTRACE_CORPUS"
PLACEHOLDER = "$CORPUS_COPY"
"""What the copy folder's absolute path becomes in the normalised report.json."""
COMMENT_KEY = "_comment"
REGENERATE = f"PYTHONPATH=. {CORPUS_ENV}=<corpus> python3 scripts/report_digests.py --write " \
             "tests/analyzer/report_digests.json"
COMMENT = (f"SHA-256 of each corpus job's report.json, normalised as scripts/report_digests.py "
           f"says (the input's copy folder -> {PLACEHOLDER}). Regenerate: {REGENERATE}. A "
           "legitimate change of the report's content regenerates this file in the same commit, "
           "with the reason in the commit body; a change meant to keep the report (a speed-up) "
           "leaves it as it is.")
TBPLUGIN = "tbplugin_2rank"


class ReportFailed(RuntimeError):
    """``analyzer report`` exited non-zero on a corpus job (the message holds its stderr)."""


def corpus_root() -> Path | None:
    """The corpus folder named by ``$PARITYTRACE_CORPUS`` (resolved), None when unset or not a
    folder (the rule of tests/corpus.py)."""
    value = os.environ.get(CORPUS_ENV, "")
    if not value:
        return None
    root = Path(value).expanduser().resolve()
    return root if root.is_dir() else None


def corpus_jobs(root: Path) -> dict[str, list[Path]]:
    """Job name -> its trace files under ``root`` (module docstring), in name order. A folder of
    the corpus other than ``single`` and ``tbplugin_2rank`` is one job of all its files."""
    jobs: dict[str, list[Path]] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        files = sorted(p for p in folder.iterdir() if p.is_file())
        if folder.name == "single":
            jobs.update({f"single/{f.name}": [f] for f in files})
        elif folder.name == TBPLUGIN:
            for prefix in sorted({f.name.split("__")[0] for f in files}):
                jobs[f"{TBPLUGIN}/{prefix}"] = [f for f in files
                                                if f.name.startswith(f"{prefix}__")]
        else:
            jobs[folder.name] = files
    return jobs


def stage(job: str, files: list[Path], copy_root: Path) -> Path:
    """Copy ``files`` to ``copy_root/<job>/`` and return what ``analyzer report`` is given: the
    file itself for a ``single/`` job, else the folder. Copies, not symlinks: a folder walk never
    follows a symlink out of the folder it is given (analyzer/ingest/fswalk.py)."""
    dst = copy_root / job
    if job.startswith("single/"):
        dst = copy_root / "single"
    dst.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copyfile(f, dst / f.name)
    return dst / files[0].name if job.startswith("single/") else dst


@contextlib.contextmanager
def _cache_home(folder: Path):
    """``XDG_CACHE_HOME`` set to ``folder`` for the block, as it was afterwards: the analyzer
    reads it at each use (analyzer/contract/settings.py), so a fresh folder means no cache."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(folder)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = old


def normalise(report_json: bytes, copy_root: Path) -> bytes:
    """``report_json`` with every occurrence of ``copy_root``'s path, as JSON spells it inside a
    string, replaced by ``PLACEHOLDER`` (module docstring); nothing else changes."""
    spelled = json.dumps(str(copy_root))[1:-1].encode()
    return report_json.replace(spelled, PLACEHOLDER.encode())


def report_json(job: str, files: list[Path], work: Path) -> bytes:
    """The normalised report.json of ``job`` (``files``), analysed in ``work`` (a new, empty
    folder: the copy, the report and the caches go there). Raises ``ReportFailed`` when the
    report exits non-zero, ``OSError`` when the copy cannot be made."""
    copy_root = (work / "corpus").resolve()
    target = stage(job, files, copy_root)
    out = work / "report"
    with _cache_home(work / "xdg-cache"):
        proc = cli("report", str(target), "--out", str(out), "--format", "json")
    if proc.returncode != 0:
        raise ReportFailed(f"analyzer report {target} exited {proc.returncode}: "
                           f"{proc.stderr.strip()[-2000:]}")
    return normalise((out / "report.json").read_bytes(), copy_root)


def digest(text: bytes) -> str:
    """SHA-256 of ``text``, hex."""
    return hashlib.sha256(text).hexdigest()


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, str]:
    """Job -> digest stored in ``path`` (its comment left out). Raises ``OSError``,
    ``ValueError`` (not JSON)."""
    return {k: v for k, v in json.loads(path.read_text()).items() if k != COMMENT_KEY}


def write_snapshot(path: Path, digests: dict[str, str]) -> None:
    """Write ``digests`` to ``path`` with ``COMMENT`` first, jobs in name order."""
    doc = {COMMENT_KEY: COMMENT, **dict(sorted(digests.items()))}
    path.write_text(json.dumps(doc, indent=2) + "\n")


def differences(got: dict[str, str], stored: dict[str, str]) -> list[str]:
    """One line per job whose digest differs from ``stored``, or that only one side has."""
    lines = []
    for job in sorted(set(got) | set(stored)):
        if job not in stored:
            lines.append(f"{job}: new corpus job, no stored digest")
        elif job not in got:
            lines.append(f"{job}: stored, but not in the corpus")
        elif got[job] != stored[job]:
            lines.append(f"{job}: {got[job]} != stored {stored[job]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    """The command (module docstring); returns its exit status."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", type=Path, metavar="FILE", help="write the snapshot to FILE")
    ap.add_argument("--stored", type=Path, default=SNAPSHOT, metavar="FILE",
                    help="snapshot to compare with (default: %(default)s)")
    ap.add_argument("--save-reports", type=Path, metavar="DIR",
                    help="also write each job's normalised report.json under DIR/<job>/ "
                         "(to diff two trees' reports with diff -r)")
    args = ap.parse_args(argv)
    root = corpus_root()
    if root is None:
        print(f"report_digests: set {CORPUS_ENV} to the corpus folder", file=sys.stderr)
        return 2
    got = {}
    with tempfile.TemporaryDirectory(prefix="report-digests-") as tmp:
        for n, (job, files) in enumerate(corpus_jobs(root).items()):
            try:
                text = report_json(job, files, Path(tmp) / str(n))
            except ReportFailed as exc:
                print(f"report_digests: {job}: {exc}", file=sys.stderr)
                return 2
            got[job] = digest(text)
            print(f"{got[job]}  {job}")
            if args.save_reports:
                (args.save_reports / job).mkdir(parents=True, exist_ok=True)
                (args.save_reports / job / "report.json").write_bytes(text)
    if args.write:
        write_snapshot(args.write, got)
        print(f"report_digests: wrote {len(got)} digests to {args.write}", file=sys.stderr)
        return 0
    diff = differences(got, load_snapshot(args.stored))
    for line in diff:
        print(f"report_digests: {line}", file=sys.stderr)
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
