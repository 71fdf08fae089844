"""Benchmark of the ranking's decision on a noisy machine (issues 20, 29; not a test: prints counts).

Each trial is one public command, as a user would type it::

    tracer record --strategy single --data loader [shape] --repeat 5 \\
        --arm a= --arm b= --arm c="--data-sample-cost-ms X"
    analyzer report TRIAL

``a`` and ``b`` are identical, ``c`` is made slower by ``--data-sample-cost-ms`` (a sleep per
sample in the DataLoader, calibrated once so that c's step is about ``--slow-frac`` slower than
a's). The three arms are one experiment, recorded interleaved with each round rotated (a b c, b c
a, c a b ...). The bench reads the pairs a vs b and a vs c from the report's ``ranking.pairs``
(report.json, what ``analyzer report`` decides and prints) and counts, over ``--trials`` trials,
how often each pair is called "within noise" and how often "slower" (a decided pair). Goal:
identical pairs within noise in >= 9 of 10, the slowed one slower in >= 9 of 10. Every trial
also prints the pairs' sentences. The machine's load (other jobs) is part of the noise on
purpose; the load average is printed.

Usage: ``python3 bench/noise_decision.py [--trials 10] [--repeat 5] [--strategy single]
[--active 50] [--slow-frac 0.3] [--out DIR]`` (``tracer`` and ``analyzer`` on the PATH: the
README's install). Results: bench/RESULTS.md "Deciding on a noisy machine".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

SHAPE = ["--hidden", "128", "--layers", "2", "--seq", "64", "--batch", "4", "--wait", "1",
         "--warmup", "1"]
"""A step of ~10-30 ms on a loaded 2-core machine: long enough that a sleep's wake-up delay is
a small part of the added cost, short enough that a record is its process start-up."""


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"noise_decision: {name} is not on the PATH; install the project first "
                         "(README quickstart)")
    return path


def _record_and_report(args, root: Path, arms: dict[str, float], repeat: int) -> dict:
    """Record ``arms`` (name -> --data-sample-cost-ms) with one ``tracer record`` command, report
    them with ``analyzer report``; return report.json's ``ranking``."""
    cmd = [_tool("tracer"), "record", "--strategy", args.strategy, "--nproc", str(args.nproc),
           "--data", "loader", "--keep-tensors", "summaries", "--active", str(args.active),
           "--repeat", str(repeat), "--out", str(root), *SHAPE]
    for name, cost in arms.items():
        cmd += ["--arm", f"{name}=--data-sample-cost-ms {cost:.4f}" if cost else f"{name}="]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    subprocess.run([_tool("analyzer"), "report", str(root)], check=True, stdout=subprocess.DEVNULL)
    ranking = json.loads((root / "report" / "report.json").read_text())["ranking"]
    if ranking["status"] != "ranked":
        raise SystemExit(f"noise_decision: {root}: ranking withheld: {ranking['reason']}")
    return ranking


def _pair(ranking: dict, x: str, y: str) -> dict:
    return next(p for p in ranking["pairs"] if {p["faster"], p["slower"]} == {x, y})


def _ratio(ranking: dict, slow: str = "c", base: str = "a") -> float:
    med = {a["name"]: a["median_ns"] for a in ranking["arms"]}
    return med[slow] / med[base]


def _calibrate(args) -> float:
    """Per-sample sleep (ms) that makes c about ``slow_frac`` slower than a on this machine now:
    a first guess from an unslowed pair of records (median step x slow_frac / samples per rank),
    then ``--calibrate`` rounds of 3 interleaved a/c repeats each (one record pair is too noisy
    to steer by), scaling the sleep by the measured shortfall (a sleep also waits for a core to
    wake on, so the guess overshoots on a loaded machine); the scaling is clipped to 0.5-2x."""
    ranking = _record_and_report(args, args.out / "calibrate0", {"a": 0.0, "a2": 0.0}, 1)
    step_ns = next(a["median_ns"] for a in ranking["arms"] if a["name"] == "a")
    per_rank = 4 // (1 if args.strategy == "single" else args.nproc)
    cost = step_ns * args.slow_frac / per_rank / 1e6
    for i in range(1, args.calibrate + 1):
        r = _ratio(_record_and_report(args, args.out / f"calibrate{i}", {"a": 0.0, "c": cost}, 3))
        print(f"calibration {i}: --data-sample-cost-ms {cost:.3f} made c {r:.2f}x a", flush=True)
        cost *= min(2.0, max(0.5, args.slow_frac / (r - 1))) if r > 1 else 2.0
    return cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--strategy", default="single")
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--active", type=int, default=50,
                    help="profiled steps per run (50: ~0.5 s, so a burst of other load is a "
                         "part of a run, not all of it)")
    ap.add_argument("--slow-frac", type=float, default=0.3)
    ap.add_argument("--calibrate", type=int, default=2, help="calibration rounds")
    ap.add_argument("--cost-ms", type=float, default=None,
                    help="skip the calibration: c's --data-sample-cost-ms")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.out = args.out or Path(tempfile.mkdtemp(prefix="noise-decision-"))
    t0 = time.monotonic()
    cost = args.cost_ms if args.cost_ms is not None else _calibrate(args)
    print(f"--data-sample-cost-ms {cost:.3f} for c (aim: {args.slow_frac:.0%} slower); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    counts = {"identical": {"within_noise": 0, "slower": 0}, "slowed": {"within_noise": 0, "slower": 0}}
    achieved = []
    for t in range(1, args.trials + 1):
        ranking = _record_and_report(args, args.out / f"trial{t}", {"a": 0.0, "b": 0.0, "c": cost},
                                     args.repeat)
        for kind, other in (("identical", "b"), ("slowed", "c")):
            p = _pair(ranking, "a", other)
            called = "slower" if p["decision"] == "faster" else "within_noise"
            counts[kind][called] += 1
            print(f"trial {t} {kind}: {p['sentence']} -> {called}", flush=True)
        achieved.append(_ratio(ranking))
        print(f"  load average {os.getloadavg()[0]:.2f}", flush=True)
    wall = time.monotonic() - t0
    achieved.sort()
    print(f"identical pairs: within noise {counts['identical']['within_noise']}/{args.trials}, "
          f"called different {counts['identical']['slower']}/{args.trials}")
    print(f"slowed pair: slower {counts['slowed']['slower']}/{args.trials}, within noise "
          f"{counts['slowed']['within_noise']}/{args.trials}; median c/a ratio "
          f"{achieved[len(achieved) // 2]:.2f}")
    print(f"wall {wall:.0f} s for {args.trials} trials x 3 arms x {args.repeat} repeats "
          f"({args.strategy}, {args.active} profiled steps each); records under {args.out}")


if __name__ == "__main__":
    main()
