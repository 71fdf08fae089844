"""Benchmark of ``tracer project`` against the real runs (issue 44, Deliver 5; not a test: prints
a table, asserts nothing).

On CPU / gloo, for ddp, fsdp2, hsdp 2x2, fsdp2_tp (tp 2) and pp (2 stages) at worlds 2 and 4
where the layout exists (hsdp 2x2 at 4 only):

1. ``tracer linkbench --nproc P`` once for each world P (every group size dividing P, all
   groups at once): the link model of this machine, ``OUT/links-P.json``;
2. ``tracer project`` of each configuration at its world, from one process, ``OUT/proj/``;
3. ``tracer record`` of the real runs, one command per world with every strategy of that world
   and ``--repeat`` (default 5): interleaved round by round, each round's order rotated
   (tracer/record.py ``interleave``), ``OUT/runs-wP/<strategy>.r<k>``;
4. ``analyzer grade PROJ RUN --link-model OUT/links-P.json --format json`` for every repeat,
   each grade's JSON in ``OUT/grades/``.

Per configuration it prints: projected step ms [low, high] (the grade's ``step`` block), the
measured median ms (the median over the repeats of each grade's ``measured_median_ns``), the
error (projected - measured) / measured, whether the measured median is inside [low, high],
whether every exact figure (collective calls and bytes per kind and mesh dimension, parameter /
gradient / optimizer bytes) was equal in every repeat's grade, and memory per rank, projected /
measured: parameters + gradients + optimizer state (an exact figure, the largest rank of the
grade) and the peak (``memory_categories.parquet``'s ``peak``, the largest rank). Then the
median absolute error over the configurations with a projected step and the interval coverage
over all configurations, against issue 44's targets (MAE <= 15 %, >= 80 % inside). A
configuration whose projection fails, or whose grade has no ``step`` block, is a row that says
so and counts as not covered; where a grade has no step block the measured median is the
bench's own (the median over repeats of the median over profiled steps of the slowest rank's
``steps.parquet`` wall_ns), marked ``*``.

Shapes: the recorder's defaults (reference model, hidden 256, 2 layers, batch 8 x seq 128,
5 steps of which 3 profiled): a step of 100-200 ms on 2-4 ranks on 2 cores, so compute
dominates the noise. About 15 minutes on the 2-core machine on a quiet day.

Usage: ``python3 bench/bench_projection.py --out DIR [--repeat 5] [--iters 10] [--worlds 2,4]
[--configs ddp,fsdp2,...]``. Raw results: ``DIR/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

CONFIGS = ("ddp", "fsdp2", "hsdp", "fsdp2_tp", "pp")
LABEL = {"ddp": "ddp", "fsdp2": "fsdp2", "hsdp": "hsdp 2x2", "fsdp2_tp": "fsdp2_tp (tp 2)",
         "pp": "pp (2 stages)"}
SIZES = ",".join(str(4**k) for k in range(4, 13))  # 256 B .. 16 MiB, x4
MAE_TARGET, COVERAGE_TARGET = 0.15, 0.80
EXACT_MEMORY = ("parameters", "gradients", "optimizer_state")


def layout_exists(strategy: str, world: int) -> bool:
    """hsdp 2x2 needs 4 ranks; the others run at 2 and 4 with their default degrees."""
    return world == 4 if strategy == "hsdp" else True


def run(cmd: list[str], log: Path) -> subprocess.CompletedProcess:
    """Run ``cmd`` (a paritytrace CLI, this interpreter), its stdout and stderr kept in ``log``."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", *cmd], capture_output=True, text=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"$ {' '.join(cmd)}\n# rc {proc.returncode}, {time.perf_counter() - t0:.1f} s\n"
                   f"--- stdout\n{proc.stdout}--- stderr\n{proc.stderr}")
    return proc


def last_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stderr or proc.stdout).strip().splitlines() if ln.strip()]
    return lines[-1] if lines else f"exit {proc.returncode}"


def grade(proj: Path, run_dir: Path, links: Path, log: Path) -> tuple[dict | None, str]:
    """``analyzer grade --format json`` of one repeat: (its JSON or None, a note). Exit 3 (a
    figure differs) still prints the JSON. An analyzer without ``--link-model`` grades without
    it (no step block), noted."""
    proc = run(["analyzer", "grade", str(proj), str(run_dir), "--link-model", str(links),
                "--format", "json"], log)
    note = ""
    if proc.returncode == 2 and "No such option: --link-model" in proc.stderr:
        note = "analyzer grade has no --link-model yet"
        proc = run(["analyzer", "grade", str(proj), str(run_dir), "--format", "json"], log)
    if proc.returncode not in (0, 3):
        return None, f"grade failed: {last_line(proc)}"
    return json.loads(proc.stdout), note


def bench_median_ns(run_dir: Path) -> int:
    """The bench's own step time of a run (used only where the grade has no step block): the
    median over profiled steps of the slowest rank's wall_ns."""
    steps = pd.read_parquet(run_dir / "steps.parquet")
    prof = steps[steps["profiled"]]
    return int(prof.groupby("step")["wall_ns"].max().median())


def peak_bytes(run_dir: Path) -> int | None:
    """The largest rank's ``peak`` of ``memory_categories.parquet`` (None without the file)."""
    path = run_dir / "memory_categories.parquet"
    if not path.exists():
        return None
    m = pd.read_parquet(path)
    peak = m.loc[m["category"] == "peak", "bytes"]
    return int(peak.max()) if len(peak) else None


def exact_memory(g: dict) -> tuple[int | None, int | None]:
    """(projected, measured) parameters + gradients + optimizer bytes of the grade's largest
    rank (None where a side did not measure one)."""
    per_rank: dict[int, list] = {}
    for f in g["exact"]:
        if f["figure"] == "bytes" and f["kind"] in EXACT_MEMORY:
            per_rank.setdefault(f["rank"], []).append((f["projected"], f["measured"]))

    def total(side: int) -> int | None:
        sums = [None if any(v[side] is None for v in vals) else sum(v[side] for v in vals)
                for vals in per_rank.values()]
        return None if not sums or None in sums else max(sums)
    return total(0), total(1)


def configuration(strategy: str, world: int, out: Path, repeat: int, proj_proc) -> dict:
    """Grade one configuration against each of its repeats; the row's figures."""
    key = f"{strategy}-w{world}"
    row: dict = {"configuration": LABEL[strategy], "strategy": strategy, "world": world,
                 "notes": []}
    if proj_proc.returncode != 0:
        row["notes"].append(f"projection failed: {last_line(proj_proc)}")
        return row
    proj = out / "proj" / key
    links = out / f"links-{world}.json"
    runs = [out / f"runs-w{world}" / (f"{strategy}.r{k}" if repeat > 1 else strategy)
            for k in range(1, repeat + 1)]
    grades, steps, ok, measured = [], [], [], []
    for k, run_dir in enumerate(runs, 1):
        if not (run_dir / "manifest.json").exists():
            row["notes"].append(f"no run {run_dir.name}")
            continue
        g, note = grade(proj, run_dir, links, out / "logs" / f"grade-{key}.r{k}.log")
        if note and note not in row["notes"]:
            row["notes"].append(note)
        if g is None:
            continue
        (out / "grades").mkdir(exist_ok=True)
        (out / "grades" / f"{key}.r{k}.json").write_text(json.dumps(g, indent=1))
        grades.append(g)
        ok.append(bool(g.get("ok")))
        step = g.get("step")
        if step:
            steps.append(step)
            measured.append(step["measured_median_ns"])
        else:
            measured.append(bench_median_ns(run_dir))
    row["grades"] = len(grades)
    if not grades:
        return row
    row["exact_equal"] = all(ok)
    first_bad = next((g for g in grades if not g.get("ok")), None)
    if first_bad is not None:
        bad = [f for f in first_bad["exact"] if f["status"] != "equal"]
        f = bad[0] if bad else None
        row["exact_note"] = (f"{len(bad)} of {len(first_bad['exact'])} differ or unknown"
                             + (f", first {f['figure']} {f['kind']} {f['mesh_dim']} rank "
                                f"{f['rank']}: {f['projected']} vs {f['measured']}" if f else ""))
    row["measured_median_ns"] = int(statistics.median(measured))
    row["measured_is_bench_own"] = not steps
    if steps and len(steps) == len(grades):
        s = steps[0]  # the projection and the link model are the same in every grade
        row.update(projected_ns=s["projected_ns"], low_ns=s["low_ns"], high_ns=s["high_ns"])
        m = row["measured_median_ns"]
        row["error"] = (s["projected_ns"] - m) / m
        row["inside"] = s["low_ns"] <= m <= s["high_ns"]
    elif not steps:
        row["notes"].append("grade has no step block")
    row["memory_exact_projected_bytes"], row["memory_exact_measured_bytes"] = exact_memory(
        grades[0])
    row["peak_projected_bytes"] = peak_bytes(proj)
    row["peak_measured_bytes"] = max((p for p in map(peak_bytes, runs) if p is not None),
                                     default=None)
    return row


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / 2**20:.2f}"


def table(rows: list[dict]) -> list[str]:
    """The markdown table and the summary lines."""
    out = ["| configuration | world | projected step ms [low, high] | measured median ms | "
           "error | inside? | exact figures equal? | P+G+O MiB/rank proj / meas | peak MiB/rank "
           "proj / meas | notes |",
           "|---|---:|---|---:|---:|---|---|---|---|---|"]
    for r in rows:
        proj = ("-" if "projected_ns" not in r else
                f"{r['projected_ns'] / 1e6:.1f} [{r['low_ns'] / 1e6:.1f}, {r['high_ns'] / 1e6:.1f}]")
        meas = ("-" if "measured_median_ns" not in r else
                f"{r['measured_median_ns'] / 1e6:.1f}" + ("*" if r["measured_is_bench_own"] else ""))
        err = f"{r['error'] * 100:+.1f} %" if "error" in r else "-"
        inside = ("yes" if r.get("inside") else "no") if "inside" in r else "no (not covered)"
        exact = ("-" if "exact_equal" not in r else "yes" if r["exact_equal"] else
                 f"no ({r.get('exact_note', '')})")
        mem = (f"{_mib(r.get('memory_exact_projected_bytes'))} / "
               f"{_mib(r.get('memory_exact_measured_bytes'))}")
        peak = f"{_mib(r.get('peak_projected_bytes'))} / {_mib(r.get('peak_measured_bytes'))}"
        out.append(f"| {r['configuration']} | {r['world']} | {proj} | {meas} | {err} | {inside} "
                   f"| {exact} | {mem} | {peak} | {'; '.join(r['notes']) or ''} |")
    errors = [abs(r["error"]) for r in rows if "error" in r]
    inside = sum(bool(r.get("inside")) for r in rows)
    mae = statistics.median(errors) if errors else None
    out += ["", "median absolute error: "
            + (f"{mae * 100:.1f} % over {len(errors)} configurations with a projected step"
               if mae is not None else "none (no configuration has a projected step)")
            + f" (target <= {MAE_TARGET * 100:.0f} %: "
            + ("met" if mae is not None and mae <= MAE_TARGET else "not met") + ")",
            f"interval coverage: {inside} of {len(rows)} measured medians inside "
            f"({inside / len(rows) * 100:.0f} %; target >= {COVERAGE_TARGET * 100:.0f} %: "
            + ("met" if inside / len(rows) >= COVERAGE_TARGET else "not met") + ")"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of every output (new or empty)")
    ap.add_argument("--repeat", type=int, default=5, help="real runs per configuration (>= 5)")
    ap.add_argument("--iters", type=int, default=10, help="link benchmark calls per size")
    ap.add_argument("--worlds", default="2,4", help="comma-separated worlds")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated strategies")
    opts = ap.parse_args()
    out = opts.out.resolve()
    if out.exists() and any(out.iterdir()):
        raise SystemExit(f"bench: {out} is not empty; pass a new folder")
    out.mkdir(parents=True, exist_ok=True)
    worlds = [int(w) for w in opts.worlds.split(",")]
    chosen = [c for c in opts.configs.split(",") if c]
    if unknown := set(chosen) - set(CONFIGS):
        raise SystemExit(f"bench: --configs {', '.join(sorted(unknown))}: choose among {CONFIGS}")
    env_note = f"load average before: {os.getloadavg()[0]:.2f} (cores: {os.cpu_count()})"
    print(env_note, flush=True)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    for world in worlds:
        proc = run(["tracer", "linkbench", "--nproc", str(world), "--iters", str(opts.iters),
                    "--sizes", SIZES, "--out", str(out / f"links-{world}.json")],
                   out / "logs" / f"linkbench-{world}.log")
        if proc.returncode != 0:
            raise SystemExit(f"bench: tracer linkbench --nproc {world} failed: {last_line(proc)}")
        print(f"  {proc.stdout.strip()}", flush=True)
    timings["linkbench_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    jobs = [(s, w) for w in worlds for s in chosen if layout_exists(s, w)]
    projected = {}
    for s, w in jobs:
        projected[(s, w)] = run(["tracer", "project", "--strategy", s, "--nproc", str(w),
                                 "--out", str(out / "proj"), "--name", f"{s}-w{w}"],
                                out / "logs" / f"project-{s}-w{w}.log")
        print(f"  project {s} at {w}: "
              + ("ok" if projected[(s, w)].returncode == 0 else last_line(projected[(s, w)])),
              flush=True)
    timings["project_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    for w in worlds:
        strategies = [s for s, ww in jobs if ww == w]
        proc = run(["tracer", "record", "--strategy", ",".join(strategies), "--nproc", str(w),
                    "--repeat", str(opts.repeat), "--out", str(out / f"runs-w{w}")],
                   out / "logs" / f"record-w{w}.log")
        print(f"  record {','.join(strategies)} at {w} x {opts.repeat}: "
              + ("ok" if proc.returncode == 0 else last_line(proc)), flush=True)
    timings["record_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rows = [configuration(s, w, out, opts.repeat, projected[(s, w)]) for s, w in jobs]
    timings["grade_s"] = time.perf_counter() - t0
    lines = table(rows)
    after = f"load average after: {os.getloadavg()[0]:.2f}"
    (out / "results.json").write_text(json.dumps(
        {"rows": rows, "timings_s": timings, "load": [env_note, after],
         "repeat": opts.repeat, "iters": opts.iters, "sizes": SIZES}, indent=1) + "\n")
    print("\n".join(lines))
    print(", ".join(f"{k.removesuffix('_s')} {v:.0f} s" for k, v in timings.items())
          + f"; {after}")


if __name__ == "__main__":
    main()
