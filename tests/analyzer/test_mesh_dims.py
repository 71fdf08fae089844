"""Communication per mesh dimension (issue 27): the process group of every collective (from
record_param_comms, or from the tracer's ``paritytrace::pg`` tag on gloo), its mesh dimension
(pg_desc, manifest mesh, ranks), and the per-dimension figures of report.json / report.md /
report.html, on the hand-built 2 x 2 HSDP sets of fixtures/mesh (built by its build.py).

Expected values are worked out by hand below from the events of fixtures/mesh/build.py (whole
microseconds there, so values here are us * 1000 ns). Mesh: replicate groups [0, 2] (pg 1),
[1, 3] (pg 2); shard groups [0, 1] (pg 3), [2, 3] (pg 4). Per rank and step (us from the step):
  K (compute)     [100, 300) + [500, 700)
  shard           all_gather #1 [50, 250) (ranks 1, 3: [60, 250)), all_gather #2 [200, 300),
                  reduce_scatter [400, 600)
  replicate       all_reduce [550, 800)
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

import msgspec
import pytest

from analyzer import api
from analyzer.analyses import meshdims
from analyzer.analyses.breakdown import comm_shares, rank_breakdown
from analyzer.compare import runs
from analyzer.contract import report_types, schemas
from analyzer.ingest import ranktables
from analyzer.ingest.classify import parse_pg_tag
from reports import html, markdown
from tests.reports.builders import manifest, write_manifest, write_run

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "mesh"
GPU_FIX = Path(__file__).resolve().parents[2] / "fixtures" / "gpu_shaped"
US = 1000
STEPS = 2


def _builder():
    spec = importlib.util.spec_from_file_location("mesh_build", FIX / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIX / name, dst)
    return dst


def _dims(root: Path) -> dict[str, report_types.MeshDimComm]:
    rep = runs.analyse(root)
    return {d.name: d for d in rep.runs[0].mesh_dims}


def test_fixtures_are_current(tmp_path):
    _builder().build(tmp_path)
    for name in _builder().SCENARIOS:
        for r in range(4):
            f = f"{name}/rank{r}.trace.json"
            assert (tmp_path / f).read_text() == (FIX / f).read_text(), \
                f"fixtures/mesh/{f} is stale: run python3 fixtures/mesh/build.py"


def test_tag_names_group_and_peer():
    assert parse_pg_tag("paritytrace::pg 3") == ("3", -1)
    assert parse_pg_tag("paritytrace::pg 12 peer 5") == ("12", 5)
    assert parse_pg_tag("paritytrace::pg my group peer 0") == ("my group", 0)
    assert parse_pg_tag("paritytrace::pg ") is None
    assert parse_pg_tag("FSDP::all_gather (0)") is None


# --- per-dimension figures: NCCL-shaped, gloo-shaped (tags), foreign (ranks) ----------------
#
# shard, per step: union r0/r2 [50,300) + [400,600) = 450, r1/r3 [60,300) + [400,600) = 440,
#   mean 445; sum of durations r0/r2 200+100+200 = 500, r1/r3 190+100+200 = 490, mean 495;
#   exposed (union minus K) r0/r2 [50,100) + [400,500) = 150, r1/r3 40 + 100 = 140, mean 145
#   ([200,300) of all_gather #2 lies under K [100,300)).
#   bytes per step: 2 all_gathers + 1 reduce_scatter of 2048 Float total = 3 x 8192 B.
#   busbw: factor (n-1)/n = 1/2 (n = 2): 4 ranks x 2 steps x 3 x 8192 x 1/2 B over
#   2 steps x (500+490+500+490) us = 98304 B / 3,960,000 ns.
# replicate, per step: union = sum = 250, exposed [700,800) = 100; 4096 B; factor 2(n-1)/n = 1:
#   busbw 4096 B / 250,000 ns.
# Transfer / wait: rank 0 is the clock reference; ranks 1 (pg 3) and 2 (pg 1) share a group with
#   it; rank 3 shares none (its groups are 2 and 4) and is measured through them (relays,
#   analyzer/analyses/clock.py), so every instance is matched within its group of 2.
#   shard: all_gather #1 the even rank waits 60 - 50 = 10 us and transfers 190, the odd one
#   transfers 190; #2 100 each; reduce_scatter 200 each: per rank and step transfer 490, wait
#   10 on ranks 0 and 2. Over both steps, mean over 4 ranks: transfer 980, wait 2 x 2 x 10 / 4
#   = 10, not measured 0. replicate: transfer 2 x 250 = 500, wait 0. busbw from transfer, shard:
#   4 ranks x 2 steps x 3 x 8192 x 1/2 B over 4 x 2 x 490 us; replicate 4096 B / 250 us.


def _check_hsdp(d: dict[str, report_types.MeshDimComm], shard: str, replicate: str, source: str):
    s, r = d[shard], d[replicate]
    assert (s.source, r.source) == (source, source)
    assert (s.group_size, r.group_size, s.groups, r.groups) == (2, 2, 2, 2)
    assert (s.pgs, r.pgs) == (["3", "4"], ["1", "2"])
    assert (s.kinds, r.kinds) == (["all_gather", "reduce_scatter"], ["all_reduce"])
    assert (s.n_ranks, r.n_ranks, s.count, r.count) == (4, 4, 3 * STEPS, STEPS)
    assert s.time_ns == STEPS * 495 * US and s.time_ns_per_step == 495 * US
    assert s.union_ns == STEPS * 445 * US and s.union_ns_per_step == 445 * US
    assert s.exposed_ns == STEPS * 145 * US and s.exposed_ns_per_step == 145 * US
    assert r.time_ns == r.union_ns == STEPS * 250 * US
    assert r.exposed_ns == STEPS * 100 * US and r.exposed_ns_per_step == 100 * US
    assert (s.bytes, r.bytes, s.unknown_bytes) == (STEPS * 3 * 8192, STEPS * 4096, 0)
    assert s.busbw_gbps == pytest.approx(98304 / 3_960_000, rel=1e-12)
    assert r.busbw_gbps == pytest.approx(4096 / 250_000, rel=1e-12)
    assert (s.transfer_ns, s.wait_ns, s.not_measured_ns) == (980 * US, 10 * US, 0)
    assert (r.transfer_ns, r.wait_ns, r.not_measured_ns) == (500 * US, 0, 0)
    assert s.transfer_busbw_gbps == pytest.approx(98304 / 3_920_000, rel=1e-12)
    assert r.transfer_busbw_gbps == pytest.approx(4096 / 250_000, rel=1e-12)


def test_nccl_shaped_per_dimension(tmp_path):
    _check_hsdp(_dims(_copy("nccl_hsdp", tmp_path)), "shard", "replicate", "pg_desc")


def test_gloo_shaped_with_tags_gives_the_same_attribution(tmp_path):
    _check_hsdp(_dims(_copy("gloo_hsdp", tmp_path)), "shard", "replicate", "pg_desc")


def test_foreign_traces_infer_the_dimension_from_the_ranks(tmp_path):
    # no Process Group Description, no pg_config, no manifest: shard groups [0, 1], [2, 3] are
    # consecutive ranks, replicate groups [0, 2], [1, 3] ranks 2 apart
    d = _dims(_copy("foreign_hsdp", tmp_path))
    assert list(d) == ["inferred_consecutive_n2", "inferred_stride2_n2"]
    _check_hsdp(d, "inferred_consecutive_n2", "inferred_stride2_n2", "ranks")


def test_manifest_mesh_names_the_dimensions(tmp_path):
    # the foreign traces (no pg_desc) in a recorded run dir whose manifest has the mesh
    run = tmp_path / "hsdp"
    write_run(run, strategy="hsdp", walls={0: (9,) * 4, 1: (9,) * 4, 2: (9,) * 4})
    for r in range(4):
        raw = (FIX / "foreign_hsdp" / f"rank{r}.trace.json").read_bytes()
        (run / schemas.trace_name(r)).write_bytes(gzip.compress(raw, mtime=0))
    write_manifest(run, {**manifest(run_name="hsdp", strategy="hsdp", world_size=4),
                         "mesh": {"shape": [2, 2], "dim_names": ["replicate", "shard"]}})
    rep = runs.analyse(tmp_path)
    entry = next(r for r in rep.runs if r.name == "hsdp")
    d = {x.name: x for x in entry.mesh_dims}
    assert list(d) == ["replicate", "shard"]  # the manifest's order
    _check_hsdp(d, "shard", "replicate", "manifest")
    assert {(g.pg, g.mesh_dim, g.mesh_dim_source) for g in entry.comm_groups} == {
        ("1", "replicate", "manifest"), ("2", "replicate", "manifest"),
        ("3", "shard", "manifest"), ("4", "shard", "manifest")}


def test_groups_and_sizes_on_gloo_come_from_the_tags(tmp_path):
    # gloo: no group on any event; the tag names it, pg_config gives its size (2, not the
    # world's 4), so all_reduce's busbw factor is 2(2-1)/2 = 1, and reduce_scatter (a gloo
    # all_reduce of the whole 2048-element buffer) counts 8192 B
    coll = api.load_tables(_copy("gloo_hsdp", tmp_path)).collectives
    r0 = coll[coll["rank"] == 0].sort_values("start_ns")
    got = list(zip(r0["kind"], r0["pg"], r0["pg_desc"], r0["group_size"], r0["bytes"]))[:4]
    assert got == [("all_gather", "3", "mesh_shard", 2, 8192),
                   ("all_gather", "3", "mesh_shard", 2, 8192),
                   ("reduce_scatter", "3", "mesh_shard", 2, 8192),
                   ("all_reduce", "1", "mesh_replicate", 2, 4096)]
    assert set(r0["peer"]) == {-1}


def _strip_tags(src: Path, dst: Path) -> Path:
    dst.mkdir(parents=True)
    for f in sorted(src.glob("*.json")):
        doc = json.loads(f.read_text())
        doc["traceEvents"] = [e for e in doc["traceEvents"]
                              if not str(e.get("name", "")).startswith(schemas.PG_TAG_PREFIX)]
        (dst / f.name).write_text(json.dumps(doc))
    return dst


def test_tags_count_as_nothing_in_the_breakdown(tmp_path):
    tagged = api.load_tables(_copy("gloo_hsdp", tmp_path))
    bare = api.load_tables(_strip_tags(FIX / "gloo_hsdp", tmp_path / "bare"))
    cols = ["rank", "step", "step_ns", "compute_ns", "comm_ns", "exposed_comm_ns", "other_ns",
            "idle_ns"]
    assert tagged.breakdown[cols].equals(bare.breakdown[cols])
    ev, _ = api.load_events(FIX / "gloo_hsdp" / "rank0.trace.json")
    tags = ev[ev["rule"].astype(str) == "cpu.pg_tag"]
    assert len(tags) == 8 and set(tags["role"].astype(str)) == {"annotation"}
    # per step on rank 0 (by hand, analyzer/analyses/breakdown.py CPU rules): K = [100,300) +
    # [500,700) = 400; C = the gloo ops [50,300) + [400,800) = 650; exposed 650 - 200 - 200 = 250
    bd = tagged.breakdown[tagged.breakdown["rank"] == 0]
    assert list(bd["compute_ns"]) == [400 * US] * 2
    assert list(bd["comm_ns"]) == [650 * US] * 2 and list(bd["exposed_comm_ns"]) == [250 * US] * 2


def test_without_tags_gloo_groups_are_unknown_and_matched_together(tmp_path):
    bare = _strip_tags(FIX / "gloo_hsdp", tmp_path / "bare")
    rep = runs.analyse(bare)
    dims = rep.runs[0].mesh_dims
    assert [(d.name, d.source) for d in dims] == [("unknown", "none")]
    # all_gather / reduce_scatter are sized by their tensors (2), the all_reduce is not (no
    # group named, pg_config has groups smaller than the world): no one size, and busbw over
    # the sized instances only: 4 x 2 x 3 x 8192 x 1/2 B over 2 x (500+490+500+490) us
    assert dims[0].group_size is None
    assert dims[0].busbw_gbps == pytest.approx(98304 / 3_960_000, rel=1e-12)
    assert {g.pg for g in rep.runs[0].comm_groups} == {""}
    # with tags, every instance is matched within its group of 2 ranks; without, across all 4
    tagged = api.load_tables(_copy("gloo_hsdp", tmp_path))
    from analyzer.analyses import crossrank
    inst = crossrank.instances(tagged, crossrank.clock_offsets(tagged))
    assert set(inst.index.get_level_values("pg")) == {"1", "2", "3", "4"}
    plain = api.load_tables(bare)
    inst0 = crossrank.instances(plain, crossrank.clock_offsets(plain))
    assert set(inst0.index.get_level_values("pg")) == {""}


def test_shares_add_up_to_the_breakdown_with_one_group():
    # one process group per rank: a step's union / exposed shares are its comm_ns /
    # exposed_comm_ns (fixtures/gpu_shaped, worked out in tests/gpu/test_gpu_shaped.py)
    for name in ("overlap", "fsdp2"):
        ev, info = ranktables.classified(GPU_FIX / name / "rank0.trace.json")
        args = (ev, info["steps"], info["device_kind"], info["main_tid"])
        union, exposed = comm_shares(*args)
        bd = rank_breakdown(0, *args)
        assert int(union.sum()) == int(bd["comm_ns"].sum())
        assert int(exposed.sum()) == int(bd["exposed_comm_ns"].sum())


def test_shares_split_by_group():
    # rank 0 of the NCCL set, step 1: shard shares sum to 450 / 150 us, replicate 250 / 100 us;
    # together 700 > comm_ns 650 (the two groups overlap in [550, 600))
    ev, info = ranktables.classified(FIX / "nccl_hsdp" / "rank0.trace.json")
    union, exposed = comm_shares(ev, info["steps"], info["device_kind"], info["main_tid"])
    pg = ev["pg"].astype(object).where(ev["pg"].notna(), "")
    step1 = (ev["step"] == 1).to_numpy()
    for g, u, x in (("3", 450, 150), ("1", 250, 100)):
        sel = step1 & (pg == g).to_numpy()
        assert (int(union[sel].sum()), int(exposed[sel].sum())) == (u * US, x * US)


def test_dimension_rules():
    mesh = schemas.Mesh(shape=[2, 4], dim_names=["dp", "tp"])
    assert meshdims.dim_of("3", "mesh_shard", "[0, 1]", 4, mesh) == ("shard", "pg_desc")
    assert meshdims.dim_of("0", "default_pg", "", 4, None) == ("world", "pg_desc")
    assert meshdims.dim_of("5", "", "[4, 5, 6, 7]", 8, mesh) == ("tp", "manifest")
    assert meshdims.dim_of("6", "", "[1, 5]", 8, mesh) == ("dp", "manifest")
    assert meshdims.dim_of("0", "", json.dumps(list(range(8))), 8, None) == ("world", "ranks")
    assert meshdims.dim_of("9", "", "[3, 7, 11]", 16, None) == ("inferred_stride4_n3", "ranks")
    assert meshdims.dim_of("9", "", "[0, 1, 5]", 16, None) == ("inferred_group_9", "ranks")
    assert meshdims.dim_of("9", "", "", 16, None) == ("unknown", "none")
    assert meshdims.dim_of("", "", "", 16, None) == ("unknown", "none")


def _send_recv_trace(gpu: bool) -> dict:
    """A send on rank 0 to global rank 3 inside the tracer's tag; gloo: the gloo op on a
    runloop thread, paired with the c10d op; NCCL: a SendRecv kernel launched inside it."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
           "ts": 0, "dur": 1000, "args": {}},
          {"ph": "X", "cat": "user_annotation", "name": "paritytrace::pg 7 peer 3", "pid": 1,
           "tid": 1, "ts": 10, "dur": 30, "args": {}},
          {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1, "ts": 12,
           "dur": 20, "args": {"Input Dims": [[[256]]], "Input type": ["TensorList"]}}]
    if gpu:
        ev += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                "ts": 20, "dur": 1, "args": {"correlation": 5, "External id": 5}},
               {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgs)",
                "pid": 0, "tid": 20, "ts": 100, "dur": 50,
                "args": {"correlation": 5, "External id": 5, "stream": 20, "device": 0}}]
    else:
        ev += [{"ph": "X", "cat": "user_annotation", "name": "gloo:send", "pid": 1, "tid": 9,
                "ts": 50, "dur": 100, "args": {"Input Dims": [[256]], "Input type": ["float"]}}]
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "nccl" if gpu else "gloo", "rank": 0, "world_size": 4,
                                "pg_config": [{"pg_name": "7", "pg_desc": "mesh_pp",
                                               "pg_size": 2, "ranks": [0, 3]},
                                              {"pg_name": "0", "pg_desc": "default_pg",
                                               "pg_size": 4, "ranks": [0, 1, 2, 3]}]}}


@pytest.mark.parametrize("gpu", [False, True])
def test_send_recv_keeps_its_peer(tmp_path, gpu):
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(_send_recv_trace(gpu)))
    coll = api.load_tables(path).collectives
    assert list(zip(coll["kind"], coll["pg"], coll["pg_desc"], coll["peer"])) == [
        ("send_recv", "7", "mesh_pp", 3)]


def test_report_tables_and_plots_per_dimension(tmp_path):
    rep = runs.analyse(_copy("nccl_hsdp", tmp_path))
    md = markdown.render(rep)
    assert "### Communication per mesh dimension (per rank, all profiled steps)" in md
    assert ("| nccl_hsdp | shard | pg_desc | 2 | 2 | all_gather, reduce_scatter | 6 | "
            "0.99 ms | 0.89 ms | 0.29 ms | 14.5 % | 48.0 KiB | 0.025 | 0.025 | 0.98 ms | 0.01 ms | "
            "0.00 ms |") in md  # exposed share: 0.29 ms over 2 steps of STEP_US = 1 ms
    assert ("| nccl_hsdp | replicate | pg_desc | 2 | 2 | all_reduce | 2 | 0.50 ms | 0.50 ms | "
            "0.20 ms | 10.0 % | 8.0 KiB | 0.016 | 0.016 | 0.50 ms | 0.00 ms | 0.00 ms |") in md
    assert "| 32.0 KiB | 0.028 | shard (pg_desc) |" in md  # the group table's dimension column
    page = html.render(rep)
    assert page.count("<title>Mesh dimension ") == 2
    assert "Mesh dimension shard: communication per profiled step" in page


def test_flat_runs_show_no_dimension_table(tmp_path):
    rep = runs.analyse(GPU_FIX / "overlap" / "rank0.trace.json")
    assert [d.name for d in rep.runs[0].mesh_dims] == ["unknown"]
    assert "per mesh dimension" not in markdown.render(rep)
    assert "Mesh dimension" not in html.render(rep)


def test_trace_text_in_dimension_names_is_escaped(tmp_path):
    src = _copy("nccl_hsdp", tmp_path)
    for f in src.glob("*.json"):
        f.write_text(f.read_text().replace('"mesh_shard"', '"mesh_<b>x|y</b>"'))
    rep = runs.analyse(src)
    assert "<b>x|y</b>" in {d.name for d in rep.runs[0].mesh_dims}
    md, page = markdown.render(rep), html.render(rep)
    assert "<b>" not in md and "&lt;b&gt;x\\|y&lt;/b&gt;" in md
    assert "<b>x" not in page and "&lt;b&gt;x|y&lt;/b&gt;" in page


def test_older_report_json_still_decodes(tmp_path):
    rep = runs.analyse(_copy("nccl_hsdp", tmp_path))
    doc = json.loads(report_types.encode(rep))
    for r in doc["runs"]:
        r.pop("mesh_dims")
        for g in r["comm_groups"]:
            g.pop("mesh_dim"), g.pop("mesh_dim_source")
    old = report_types.decode(json.dumps(doc))
    assert old.runs[0].mesh_dims == [] and old.runs[0].comm_groups[0].mesh_dim == ""
    assert "per mesh dimension" not in markdown.render(old)
    assert msgspec.to_builtins(old.runs[0].comm_groups[0])["mesh_dim_source"] == ""


def test_rank_sharing_no_group_with_the_reference_is_measured_through_relays(tmp_path):
    # 2 x 2 HSDP: rank 3 shares no process group with rank 0; its offset comes from its
    # all_reduces with rank 1 (pg 2) and its shard collectives with rank 2 (pg 4): per step 1
    # + 3, two steps = 8 matched; the streamed estimate (crossrank) equals the in-memory one
    from analyzer.analyses import clock, crossrank
    job = api.load_tables(_copy("nccl_hsdp", tmp_path))
    off = crossrank.clock_offsets(job)
    assert off.equals(clock.clock_offsets(job.collectives))
    got = dict(zip(off["rank"], zip(off["clock"], off["n_matched"])))
    assert got == {0: ("reference", 8), 1: ("measured", 6), 2: ("measured", 2),
                   3: ("measured", 8)}
    # a rank that shares no group with any rank stays unmatched
    coll = job.collectives
    alone = coll.assign(pg=coll["pg"].where(coll["rank"] != 3, "solo"))
    st = clock.clock_offsets(alone).set_index("rank")["clock"]
    assert st[3] == "unmatched"


def test_functional_collective_wait_is_not_compute(tmp_path):
    # TP on gloo as torch 2.13 records it (/tmp/exp FSDP2 + TP traces): _c10d_functional::
    # all_reduce > c10d::allreduce_ enqueues, the gloo work runs on a runloop thread, and the
    # main thread waits in _c10d_functional::wait_tensor (milliseconds there). Step [0, 1000):
    # K = aten::mm [10, 100) + [400, 600) = 290 us (the wait [200, 400) is not computation);
    # C = gloo:all_reduce [130, 400) = 270, none of it under K: exposed 270.
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
           "ts": 0, "dur": 1000, "args": {}}]

    def op(name, ts, end, tid=1, cat="cpu_op", **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts,
                   "dur": end - ts, "args": args})

    op("aten::mm", 10, 100)
    op("paritytrace::pg 3", 100, 130, cat="user_annotation")
    op("_c10d_functional::all_reduce", 102, 128)
    op("c10d::allreduce_", 110, 120, **{"Input Dims": [[[2, 4, 16]]], "Input type": ["TensorList"]})
    op("gloo:all_reduce", 130, 400, tid=11, cat="user_annotation",
       **{"Input Dims": [[2, 4, 16]], "Input type": ["float"]})
    op("_c10d_functional::wait_tensor", 200, 400, **{"Input Dims": [[2, 4, 16]]})
    op("aten::mm", 400, 600)
    doc = {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": {
        "backend": "gloo", "rank": 0, "world_size": 4, "pg_config": [
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]},
            {"pg_name": "3", "pg_desc": "mesh_tp", "pg_size": 2, "ranks": [0, 1]}]}}
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(doc))
    events, _ = api.load_events(path)
    wait = events[events["name"].astype(str) == "_c10d_functional::wait_tensor"]
    assert (str(wait["role"].iat[0]), str(wait["rule"].iat[0])) == \
        ("comm_enqueue", "cpu.c10d_functional")
    t = api.load_tables(path)
    bd = t.breakdown.iloc[0]
    assert (bd["compute_ns"], bd["comm_ns"], bd["exposed_comm_ns"]) == (290 * US, 270 * US,
                                                                        270 * US)
    c = t.collectives.iloc[0]
    assert (c["kind"], c["pg"], c["pg_desc"], c["group_size"], c["bytes"]) == \
        ("all_reduce", "3", "mesh_tp", 2, 2 * 4 * 16 * 4)
    assert (c["union_ns"], c["exposed_ns"]) == (270 * US, 270 * US)


def test_gloo_pairing_keeps_two_groups_apart(tmp_path):
    # one rank, shard work on runloop thread 11, replicate work on thread 21 (gloo: a group's
    # own threads). At 30 the shard reduce_scatter is enqueued, at 40 the replicate all_reduce;
    # the replicate group's gloo:all_reduce starts first (50), the shard's at 55. Pairing by
    # kind and time alone crosses them (30 -> 50, 40 -> 55); the threads' groups (most of
    # their paired enqueues: 11 -> "3", 21 -> "1") pair each group's enqueues with its own.
    ev = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1,
           "ts": 0, "dur": 1000, "args": {}}]

    def enqueue(name, pg, ts, dims):
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"paritytrace::pg {pg}",
                   "pid": 1, "tid": 1, "ts": ts, "dur": 8, "args": {}})
        ev.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts + 1,
                   "dur": 5, "args": {"Input Dims": dims, "Input type": ["float"] * len(dims)}})

    def work(name, tid, ts, end, n):
        ev.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": tid,
                   "ts": ts, "dur": end - ts, "args": {"Input Dims": [[n]],
                                                       "Input type": ["float"]}})

    enqueue("c10d::_allgather_base_", "3", 0, [[64], [32]])
    work("gloo:all_gather", 11, 10, 20, 32)
    enqueue("c10d::_reduce_scatter_base_", "3", 30, [[32], [64]])
    enqueue("c10d::allreduce_", "1", 40, [[[16]]])
    work("gloo:all_reduce", 21, 50, 60, 16)
    work("gloo:all_reduce", 11, 55, 80, 64)
    for k, t in enumerate((100, 200)):
        enqueue("c10d::allreduce_", "1", t, [[[16]]])
        work("gloo:all_reduce", 21, t + 10, t + 20, 16)
    enqueue("c10d::_allgather_base_", "3", 300, [[64], [32]])
    work("gloo:all_gather", 11, 310, 320, 32)
    doc = {"schemaVersion": 1, "traceEvents": ev, "distributedInfo": {
        "backend": "gloo", "rank": 0, "world_size": 4, "pg_config": [
            {"pg_name": "1", "pg_desc": "mesh_replicate", "pg_size": 2, "ranks": [0, 2]},
            {"pg_name": "3", "pg_desc": "mesh_shard", "pg_size": 2, "ranks": [0, 1]}]}}
    path = tmp_path / "rank0.trace.json"
    path.write_text(json.dumps(doc))
    events, _ = api.load_events(path)
    g = events[events["name"].astype(str).str.startswith("gloo:")]
    got = [(int(t), str(k), str(p), int(b)) for t, k, p, b in
           zip(g["ts_ns"] // US, g["coll_kind"], g["pg"], g["bytes"])]
    assert got == [(10, "all_gather", "3", 256), (50, "all_reduce", "1", 64),
                   (55, "reduce_scatter", "3", 256), (110, "all_reduce", "1", 64),
                   (210, "all_reduce", "1", 64), (310, "all_gather", "3", 256)]


def test_decision_lines_say_how_much_of_each_dimension_is_hidden(tmp_path):
    """The hand-built 2x2 HSDP set, per step: shard collectives run 445 us, 145 us of it
    exposed (1 - 145/445 = 67.4 % hidden); the replicate all_reduce 250 us, 100 us exposed
    (60.0 % hidden)."""
    from reports import verdict

    rep = runs.analyse(_copy("nccl_hsdp", tmp_path))
    line = verdict.mesh_hidden_sentence(rep.runs)
    assert line == ("Communication hidden under computation per mesh dimension (1 - exposed / "
                    "the time its collectives ran): nccl_hsdp: replicate 60.0 %, shard 67.4 %.")
    assert line in markdown.render(rep)


def test_a_projection_has_no_hidden_share_and_no_findings(tmp_path):
    """The same set marked as a projection (tracer project): its collectives are the fake
    group's, so nothing hid them: no hidden-share sentence, no finding drawn from its times."""
    from analyzer.analyses.findings import findings
    from reports import verdict

    rep = runs.analyse(_copy("nccl_hsdp", tmp_path))
    assert findings(rep)  # the record has some: a projection of it must have none
    for r in rep.runs:
        r.projection = {"world_size": r.world_size, "roles_run": [0]}
    assert verdict.mesh_hidden_sentence(rep.runs) is None
    assert findings(rep) == []
