"""The mesh strategies (hsdp, fsdp2_tp, pp) in the report (issue 27): memory predicted from the
mesh beside what the ranks hold, the pp run's Pipeline section from its traces, and ranking,
colour and decision across all strategies. Every expected number is worked out from the
fixture in the docstrings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from analyzer.compare.runs import analyse
from analyzer.contract import report_types, schemas, strategies
from reports import html, markdown, palette
from reports import memory as memory_section
from reports import pipeline as pipeline_section
from tests.merge.builders import meta, write, x
from tests.reports.builders import write_run

MS = 1_000_000
H16 = 9 * 16 * 16 + 8 * 16  # the reference model's layer at h 16: 2,432 parameters
N = 2 * H16  # two layers: 4,864
MODEL = {"name": "SimpleTransformer", "hidden": 16, "layers": 2, "num_params": N}
MESHES = {
    "hsdp": {"shape": [2, 2], "dim_names": ["replicate", "shard"]},
    "fsdp2_tp": {"shape": [2, 2], "dim_names": ["dp", "tp"], "tp_sharded_params": 4768,
                 "tp_plan": {"attn": "colwise", "mlp.0": "colwise", "mlp.2": "rowwise"}},
    "pp": {"shape": [2, 2], "dim_names": ["dp", "pp"], "pp_schedule": "gpipe", "microbatches": 4,
           "pp_stages": [["layers.0"], ["layers.1"]], "stage_params": [H16, H16]},
}
PARAM_BYTES = {"ddp": N * 4, "hsdp": N // 2 * 4, "fsdp2_tp": 1240 * 4, "pp": H16 // 2 * 4}
"""What each rank holds: N, N/2 (shard 2), ((N - 4768) + 4768/2)/2 = 1,240 (tests/analyzer/
test_sharding.py), a stage's 2,432 over dp 2."""


def _cats(strategy: str, rank: int) -> dict[str, int]:
    p = PARAM_BYTES[strategy] + (4 if strategy == "fsdp2_tp" and rank == 3 else 0)
    return {"parameters": p, "gradients": p, "optimizer_state": 2 * p, "activations": 1000}


def _root(tmp_path: Path) -> Path:
    """single 20 ms; ddp 7, hsdp 6, pp 8, fsdp2_tp 9 ms (slowest rank, both profiled steps):
    order hsdp, ddp, pp, fsdp2_tp. fsdp2_tp's rank 3 holds 4 bytes more than its share."""
    root = tmp_path / "traces"
    write_run(root / "single", strategy="single", walls={0: (1,), 1: (20 * MS,), 2: (20 * MS,)},
              model=MODEL, categories={0: {**_cats("ddp", 0), "activations": 4000}})
    for name, ms in (("ddp", 7), ("hsdp", 6), ("pp", 8), ("fsdp2_tp", 9)):
        walls = {0: (1,) * 4, 1: (ms * MS,) * 4, 2: (ms * MS - 1,) * 4}
        write_run(root / name, strategy=name, walls=walls, model=MODEL, mesh=MESHES.get(name),
                  categories={r: _cats(name, r) for r in range(4)})
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return analyse(_root(tmp_path_factory.mktemp("mesh")))


def test_report_json_carries_the_sharding_prediction_per_rank(report):
    data = json.loads(report_types.encode(report))
    assert report_types.decode(report_types.encode(report)) == report
    by = {r["name"]: r for r in data["runs"]}
    hsdp = by["hsdp"]["memory"]["sharding"]
    assert hsdp["ratio"] == 0.5 and hsdp["exact"] and hsdp["bytes_per_element"] == 4
    assert [(k["rank"], k["expected_bytes"], k["padded_bytes"], k["measured_bytes"], k["check"])
            for k in hsdp["ranks"]] == [(r, 9728.0, 9728, 9728, "exact") for r in range(4)]
    tp = by["fsdp2_tp"]["memory"]["sharding"]
    assert [k["check"] for k in tp["ranks"]] == ["exact", "exact", "exact", "differs"]
    assert tp["ratio"] == pytest.approx(1240 / N)
    pp = by["pp"]["memory"]["sharding"]
    assert [(k["stage"], k["padded_bytes"]) for k in pp["ranks"]] == [
        (0, 4864), (1, 4864), (0, 4864), (1, 4864)]
    assert pp["ratio"] == 0.25 and pp["largest_rank"] == 0
    assert by["ddp"]["memory"]["sharding"]["ratio"] == 1
    assert by["pp"]["pipeline"]["stages"] == 2  # no traces: the mesh's figures only
    assert by["pp"]["pipeline"]["ideal_bubble_frac"] == pytest.approx(1 / 5)
    assert by["ddp"]["pipeline"] is None and by["hsdp"]["pipeline"] is None


def test_ratio_to_ddp_uses_the_mesh(report):
    """Measured over DDP's 19,456 B: hsdp 9,728 (0.500), fsdp2_tp 4,964 on rank 3 (0.255),
    pp 4,864 (0.250); predicted the same from the mesh; activations 1 for hsdp only."""
    heads, rows = memory_section.ratio_rows(report)
    got = {(r[0], r[1]): (r[4], r[5]) for r in rows}
    assert got[("hsdp", "parameters")] == ("0.500", "1/S = 1/2 (S: the shard dimension) = 0.500")
    assert got[("hsdp", "optimizer state")][1].endswith("= 0.500")
    assert got[("hsdp", "activations")] == ("1.000", "1.000")
    assert got[("fsdp2_tp", "parameters")] == (f"{4964 / 19456:.3f}",
                                               "((N - N_tp) + N_tp/T)/dp / N (N 4,864, N_tp 4,768, "
                                               f"T 2, dp 2) = {1240 / 4864:.3f}")
    assert got[("fsdp2_tp", "activations")][1] == "-"
    assert got[("pp", "gradients")] == ("0.250", "stage_params[0]/dp / N (N 4,864, dp 2; stage 0 "
                                                  "holds the most, its rank 0) = 0.250")


def test_the_memory_section_states_what_sharding_predicts(report):
    heads, rows = memory_section.sharding_rows(report)
    got = {(r[0], r[1]): r[2:7] for r in rows}  # the parameters' columns
    assert got[("pp", 1)] == [1, "1,216", "4.8 KiB", "4.8 KiB", "exact"]
    assert got[("fsdp2_tp", 3)][-1] == "DIFFERS"
    assert got[("single", 0)] == ["-", "4,864", "19.0 KiB", "19.0 KiB", "exact"]
    assert heads[7:] == ["gradients measured", "check", "optimizer state predicts",
                         "optimizer state measured", "check"]
    md = markdown.render(report)
    assert "### Parameters per rank: what sharding predicts" in md
    assert "a rank holds its stage's parameters split over dp" in md  # MESH_NOTE
    page = html.render(report)
    assert "<h3>Parameters per rank: what sharding predicts</h3>" in page


def test_new_strategies_rank_colour_and_decide(report):
    rk = report.ranking
    assert rk.status == "ranked" and rk.order == ["hsdp", "ddp", "pp", "fsdp2_tp"]
    assert rk.reference == "single"
    assert {a.strategy for a in rk.arms} == {"single", "ddp", "hsdp", "pp", "fsdp2_tp"}
    md = markdown.render(report)
    assert md.splitlines()[2].startswith("**Decision:** hsdp")
    page = html.render(report)
    for s in ("hsdp", "fsdp2_tp", "pp"):
        color = palette.strategy_color(s)
        assert color not in palette.OTHER_COLORS
        assert f'fill="{color}"' in page, s
    colors = [*(s.colour for s in strategies.TABLE.values()), *palette.OTHER_COLORS, palette.SHADE_SWATCH]
    assert len(set(colors)) == len(colors)


# --- a pp run with traces: two stages, one rank each ------------------------------------------

def _pp_rank(rank: int) -> dict:
    """One gloo rank of a pp job on mesh [dp 1, pp 2], step 1 = [0, 1000) µs on its main thread.
    Rank 0 (stage 0): mm [10, 410), c10d::send [410, 415) with gloo:send [415, 500), c10d::recv_
    [500, 505) with gloo:recv [505, 900), mm [900, 990): compute 490, exposed 85 + 395 = 480,
    other (enqueues) 10, idle 20: bubble 500 µs of 1000.
    Rank 1 (stage 1): c10d::recv_ [0, 5) with gloo:recv [5, 420), mm [420, 800), c10d::send
    [800, 805) with gloo:send [805, 890): compute 380, exposed 415 + 85 = 500, other 10, idle
    110: bubble 610. Each call inside the tracer's ``paritytrace::pg 0 peer <other>``. As
    torch 2.13 records a pipelining schedule's p2p on gloo (ScheduleGPipe, 2 CPU ranks): the
    gloo:send / gloo:recv work is a user_annotation on the calling thread, from the c10d op's
    end, and no op names its process group or bytes."""
    pid, main = 1000 + rank, 1000 + rank
    peer = 1 - rank
    ev = [meta(pid, 0, "process_name", name="python3"),
          meta(pid, main, "thread_name", name=f"thread {main} (python3)"),
          x("ProfilerStep#1", 0, 1000, pid=pid, tid=main, cat="user_annotation")]

    def call(op, start, gloo_start, gloo_end):
        return [x(f"{schemas.PG_TAG_PREFIX}0 peer {peer}", start, 5, pid=pid, tid=main,
                  cat="user_annotation"),
                x(f"c10d::{op}", start, 5, pid=pid, tid=main),
                x(f"gloo:{op.rstrip('_')}", gloo_start, gloo_end - gloo_start, pid=pid, tid=main,
                  cat="user_annotation")]

    if rank == 0:
        ev += [x("aten::mm", 10, 400, pid=pid, tid=main), *call("send", 410, 415, 500),
               *call("recv_", 500, 505, 900), x("aten::mm", 900, 90, pid=pid, tid=main)]
    else:
        ev += [*call("recv_", 0, 5, 420), x("aten::mm", 420, 380, pid=pid, tid=main),
               *call("send", 800, 805, 890)]
    return {"schemaVersion": 1, "traceEvents": ev,
            "distributedInfo": {"backend": "gloo", "rank": rank, "world_size": 2, "pg_count": 1,
                                "pg_config": [{"pg_name": "0", "pg_desc": "mesh_pp", "pg_size": 2,
                                               "ranks": [0, 1]}]}}


@pytest.fixture(scope="module")
def pp_report(tmp_path_factory):
    root = tmp_path_factory.mktemp("pp") / "traces"
    run = root / "pp"
    for r in (0, 1):
        write(run / schemas.trace_name(r), _pp_rank(r))
    mesh = {"shape": [1, 2], "dim_names": ["dp", "pp"], "pp_schedule": "1f1b", "microbatches": 2,
            "pp_stages": [["layers.0"], ["layers.1"]], "stage_params": [H16, H16]}
    write_run(run, strategy="pp", walls={0: (1, 1), 1: (MS, MS)}, model=MODEL, mesh=mesh)
    return analyse(root)


def test_pp_stage_bubbles_from_the_breakdown(pp_report):
    (run,) = pp_report.runs
    p = run.pipeline
    assert (p.stages, p.microbatches, p.schedule, p.dp) == (2, 2, "1f1b", 1)
    assert p.ideal_bubble_frac == pytest.approx(1 / 3)
    ranks = {r.rank: r for r in run.ranks}
    for r in (0, 1):  # the breakdown the bubble is read from (docstring of _pp_rank)
        assert ranks[r].step_ns == 1_000_000
    assert (ranks[0].compute_ns, ranks[0].exposed_comm_ns, ranks[0].idle_ns) == (490_000, 480_000, 20_000)
    assert (ranks[1].compute_ns, ranks[1].exposed_comm_ns, ranks[1].idle_ns) == (380_000, 500_000, 110_000)
    s0, s1 = p.per_stage
    assert (s0.stage, s0.ranks, s0.rank_steps, s0.bubble_ns) == (0, [0], 1, 500_000)
    assert (s1.stage, s1.ranks, s1.bubble_ns) == (1, [1], 610_000)
    assert s0.bubble_frac == pytest.approx(0.5) and s1.bubble_frac == pytest.approx(0.61)


def test_pp_stage_pairs_from_the_send_recv_calls(pp_report):
    """No peer column on this branch's collectives table: two stages, so the mesh pairs them.
    0 -> 1: rank 0's send (85 µs), rank 1's recv (415 µs); 1 -> 0: rank 1's send (85 µs),
    rank 0's recv (395 µs)."""
    (run,) = pp_report.runs
    got = {(q.src_stage, q.dst_stage): q for q in run.pipeline.pairs}
    assert set(got) == {(0, 1), (1, 0)}
    a, b = got[(0, 1)], got[(1, 0)]
    assert (a.calls, a.sends, a.recvs, a.send_ns, a.recv_ns) == (2, 1, 1, 85_000, 415_000)
    assert (b.calls, b.sends, b.recvs, b.send_ns, b.recv_ns) == (2, 1, 1, 85_000, 395_000)
    assert a.send_bytes is None and a.recv_bytes is None  # gloo traces do not say
    # the pg tag's peer once the collectives table carries it (a ``peer`` column), else the mesh
    assert {a.peer_source, b.peer_source} == {
        "peer" if "peer" in schemas.COLLECTIVES_SCHEMA.names else "mesh"}


def test_pp_section_in_report_md_and_html(pp_report):
    md = markdown.render(pp_report)
    assert "## Pipeline" in md and "ideal bubble 33.3 % ((P - 1) / (M + P - 1)" in md
    heads, rows = pipeline_section.stage_rows(pp_report.runs[0])
    assert heads[:3] == ["pp rank", "stages", "ranks"]
    assert rows == [[0, "0", "0", 1, "1.00 ms", "0.49 ms", "0.50 ms", "50.0 %", "33.3 %"],
                    [1, "1", "1", 1, "1.00 ms", "0.38 ms", "0.61 ms", "61.0 %", "33.3 %"]]
    assert "<h2>Pipeline</h2>" in html.render(pp_report)


def test_drift_names_a_changed_mesh_as_a_sharding_change():
    """Two hsdp records on 4 ranks, meshes [2, 2] and [1, 4]: the sharding setting differs in
    its mesh only; the same mesh: no difference."""
    from analyzer.compare import drift
    from tests.reports.builders import manifest, typed

    base = manifest(run_name="hsdp", strategy="hsdp", world_size=4, model=MODEL)
    a = typed(base, mesh=MESHES["hsdp"])
    b = typed(base, mesh={"shape": [1, 4], "dim_names": ["replicate", "shard"]})
    assert drift.settings_diff(a, b) == [{
        "setting": "sharding",
        "old": {"mesh": {"shape": [2, 2], "dim_names": ["replicate", "shard"]}},
        "new": {"mesh": {"shape": [1, 4], "dim_names": ["replicate", "shard"]}}}]
    assert drift.settings_diff(a, typed(base, mesh=MESHES["hsdp"])) == []
