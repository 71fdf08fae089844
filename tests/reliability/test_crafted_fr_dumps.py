"""Crafted Flight Recorder dumps beside a real job's traces (issue 43 R4): each is one line
naming the file and exit 2, or is set aside and the report written, in a fresh interpreter
under a 1 GiB address-space limit -- never "internal error", never the machine's memory.

Oracles: the traces of a real 2-rank gloo DDP record (``ddp_run``), whose world size (2) they
state; the dumps are written by the test as an attacker would, under the name the tracer gives
its own (``schemas.flightrec_name``) in the run directory (without its manifest: a failed
record) or as torch users name them (``fr_rank<N>.json``) in a folder of traces."""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys

import pytest

from analyzer.contract import schemas
from tests.analyzer.test_flightrec import dump, entry
from tests.inputs import bad_input

pytestmark = pytest.mark.integration


def _capped():
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _ranks_dump(ranks: str) -> dict:
    d = dump([entry(1)])
    d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}}
    return d


def _write(folder, name: str, variant: str) -> None:
    path = folder / name
    if variant == "rank_beyond_world":
        path.write_text(json.dumps(dump([entry(1)])))
    elif variant == "ranks_string_58mb":  # 191 s to 6.5 GB under ast.literal_eval
        path.write_text(json.dumps(_ranks_dump("[" + ", ".join(["1"] * (58_000_000 // 3)) + "]")))
    elif variant == "ranks_literal_memoryerror":
        path.write_text(json.dumps(_ranks_dump("-" * 100_000 + "1")))
    elif variant == "ranks_literal_recursion":
        path.write_text(json.dumps(_ranks_dump("-" * 5_000 + "1")))
    elif variant == "deep_unused_field":
        text = json.dumps(dump([entry(1)]))
        path.write_text(text[:-1] + ', "nccl_comm_state": ' + "[" * 200_000 + "]" * 200_000 + "}")
    elif variant == "sparse_8gb":
        with open(path, "wb") as f:
            f.write(json.dumps(dump([entry(1)])).encode())
            f.truncate(8 << 30)  # sparse: no disk used


def _job(tmp_path, ddp_run, layout: str, variant: str):
    """The job folder and the crafted dump's path: ``layout`` "foreign" (the traces alone and
    fr_rank<N>.json) or "run_dir" (the record without its manifest, rank<N>.flightrec.json)."""
    rank = 999_999_999 if variant == "rank_beyond_world" else 0
    folder = tmp_path / "job"
    if layout == "foreign":
        folder.mkdir()
        for p in sorted(ddp_run.glob("rank*.trace.json.gz")):
            shutil.copy(p, folder / p.name)
        name = f"fr_rank{rank}.json"
    else:
        shutil.copytree(ddp_run, folder, ignore=shutil.ignore_patterns("report", schemas.MANIFEST_NAME))
        name = schemas.flightrec_name(rank)
    _write(folder, name, variant)
    return folder, folder / name


def _report(folder, tmp_path):
    args = ["report", str(folder), "--out", str(tmp_path / "out"), "--format", "json"]
    if not (folder / schemas.MANIFEST_NAME).exists() and any(folder.glob("*.parquet")):
        args.append("--allow-incomplete")
    return subprocess.run([sys.executable, "-m", "analyzer", *args], capture_output=True, text=True,
                          preexec_fn=_capped, timeout=300)


REFUSED = {"rank_beyond_world": ("rank 999999999, but the job's world size is 2", "remove the dump"),
           "deep_unused_field": ("nested too deep", "_dump_fr_trace_json"),
           "sparse_8gb": ("over 256 MiB of JSON", "move it out of the folder")}


@pytest.mark.parametrize("layout", ["foreign", "run_dir"])
@pytest.mark.parametrize("variant", list(REFUSED))
def test_a_crafted_dump_is_one_line_and_exit_2(tmp_path, ddp_run, layout, variant):
    folder, path = _job(tmp_path, ddp_run, layout, variant)
    bad_input(_report(folder, tmp_path), str(path), *REFUSED[variant])


@pytest.mark.parametrize("variant", ["ranks_string_58mb", "ranks_literal_memoryerror",
                                     "ranks_literal_recursion"])
def test_a_ranks_string_no_group_can_spell_is_set_aside(tmp_path, ddp_run, variant):
    """The group's members come from the world instead; the rest of the report is as ever."""
    folder, path = _job(tmp_path, ddp_run, "foreign", variant)
    proc = _report(folder, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    fr = report["runs"][0]["flight_recorder"]
    (g,) = fr["groups"]
    assert (g["ranks"], g["ranks_source"], g["missing_dumps"]) == ([0, 1], "world", [1])
    assert fr["notes"] == [f"{path}: process group 0's pg_config ranks are not a group of a job of 2 "
                           "ranks; set aside"]
