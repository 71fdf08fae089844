"""Names a file system cannot hold as they are (issue 33 item 15, and item 14's non-UTF-8
folder name): a run name of 28 CJK characters still gets its ``--tables-out`` partition and
its report; a folder whose name is not UTF-8 is one line, exit 2, or analysed.

Oracles: a real record (``ddp_run``, copied) renamed by the test; the dataset read back with
pyarrow.dataset and the marker's run -> partition map."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.dataset as pads

from analyzer.contract import schemas
from analyzer.ingest import dataset
from tests.inputs import bad_input, cli, copy_run
from tests.merge.builders import gloo_rank, write

CJK = "并行训练对比实验记录分布式数据并行与完全分片数据并行的比较研究"[:28]


def test_a_run_name_of_28_cjk_characters_keeps_tables_out_and_the_report(tmp_path, ddp_run):
    assert len(CJK) == 28 and len(f"run={CJK}".encode()) < 255  # fits raw, not encoded
    run = copy_run(ddp_run, tmp_path / "ddp")
    m = json.loads((run / schemas.MANIFEST_NAME).read_text())
    m["run_name"] = CJK
    (run / schemas.MANIFEST_NAME).write_text(json.dumps(m, ensure_ascii=False))
    out, tables = tmp_path / "out", tmp_path / "tables"
    proc = cli("report", str(run), "--out", str(out), "--tables-out", str(tables))
    assert proc.returncode == 0, proc.stderr
    assert (out / "report.md").is_file()
    part = dataset.partition_name(CJK)
    assert len(part.encode()) <= 255 and (tables / "breakdown" / part).is_dir()
    marker = json.loads((tables / "paritytrace-tables.json").read_text())
    assert [(r["run"], r["partition"]) for r in marker["runs"]] == [(CJK, part)]
    got = pads.dataset(tables / "breakdown", partitioning="hive").to_table()
    assert got.num_rows > 0


def test_long_partition_names_stay_distinct():
    a, b = dataset.partition_name(CJK + "甲"), dataset.partition_name(CJK + "乙")
    assert a != b and max(len(a.encode()), len(b.encode())) <= 255
    assert dataset.partition_name("ddp") == "run=ddp"


def test_a_folder_name_that_is_not_utf8_is_one_line_or_analysed(tmp_path, ddp_run):
    parent = os.fsencode(tmp_path) + b"/caf\xe9"
    os.mkdir(parent)
    run = copy_run(ddp_run, tmp_path / "x")
    os.rename(run, parent + b"/ddp")
    where = os.fsdecode(parent + b"/ddp")
    for args in (("gate", where), ("summary", where),
                 ("report", where, "--out", str(tmp_path / "o"), "--tables-out",
                  str(tmp_path / "t")), ("report", where, "--out", str(tmp_path / "o2"))):
        proc = cli(*args)
        assert proc.returncode in (0, 2), (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
        if proc.returncode == 2:
            line = bad_input(proc, "caf\\xe9", "folder name is not valid UTF-8",
                             "rename the folder")
            assert "ddp:" not in line  # the folder that is not UTF-8 is named, not the file


def test_a_folder_of_traces_whose_name_is_not_utf8_names_the_folder(tmp_path):
    folder = os.fsencode(tmp_path) + b"/caf\xe9"
    for r in (0, 1):
        t = gloo_rank(r, 2, offset_us=0.0, ends_us=[600.0, 1600.0])
        t["distributedInfo"] = {"rank": r, "world_size": 2, "backend": "gloo"}
        write(Path(os.fsdecode(folder + f"/rank{r}.json".encode())), t)
    where = os.fsdecode(folder)
    for args in (("summary", where), ("report", where, "--out", str(tmp_path / "o")),
                 ("merge", where, "-o", str(tmp_path / "m.json"))):
        bad_input(cli(*args), "caf\\xe9", "folder name is not valid UTF-8", "rename the folder")
