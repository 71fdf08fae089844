"""Benchmark of the ranking's decision on a noisy machine (issue 20; not a test: prints counts).

Each trial records three arms of one configuration as one experiment, ``--repeat`` times
interleaved, each round rotated (a b c, b c a, c a b ...): ``a`` and ``b`` identical, ``c`` made slower by
``--data-sample-cost-ms`` (a sleep per sample in the DataLoader, calibrated once so that c's
step is about ``--slow-frac`` slower than a's). It then asks the analyzer's pair decision
(``analyzer.compare.ranking.compare_arms``, what ``analyzer report`` puts in
``ranking.pairs``) about a vs b and a vs c, and counts, over ``--trials`` trials, how often
each pair is called "within noise" and how often "slower" (a decided pair). Goal (issue 20):
identical pairs within noise in >= 9 of 10, the slowed one slower in >= 9 of 10.

The arms are recorded with the tracer's own machinery (``record.interleave`` + ``record_local``,
what ``tracer record --repeat N`` runs), called as a library because one command cannot record
the same strategy twice under two names; ``c`` differs from ``a`` in its data settings, so
``analyzer report`` would not rank them as one experiment -- this bench asks the pair decision
directly. Every trial also prints the pairs' ratios and intervals. The machine's load (other
jobs) is part of the noise on purpose; the load average is printed.

Usage: ``PYTHONPATH=. python3 bench/noise_decision.py [--trials 10] [--repeat 5]
[--strategy single] [--active 50] [--slow-frac 0.3] [--out DIR]``. Results on the 2-core
development machine, shared with other jobs: README "Deciding on a noisy machine".
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ["PYTHONPATH"] = str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")

from analyzer.compare import ranking  # noqa: E402
from analyzer.compare.runs import summarize_run  # noqa: E402
from analyzer.contract.report_types import AnalysisOptions  # noqa: E402
from analyzer.ingest import rundirs  # noqa: E402
from tracer.config import RecordConfig  # noqa: E402
from tracer.record import interleave, record_local  # noqa: E402

SHAPE = dict(hidden=128, layers=2, seq=64, batch=4, wait=1, warmup=1)
"""A step of ~10-30 ms on a loaded 2-core machine: long enough that a sleep's wake-up delay is
a small part of the added cost, short enough that a record is its process start-up."""


def _configs(args, cost_ms: float, names=("a", "b", "c")) -> list[RecordConfig]:
    base = dict(SHAPE, strategy=args.strategy, nproc=args.nproc, active=args.active,
                repeat=args.repeat, data="loader", keep_tensors="summaries")
    return [RecordConfig(name=n, data_sample_cost_ms=cost_ms if n == "c" else 0.0, out=str(args.root), **base)
            for n in names]


def _arms(root: Path) -> dict[str, list]:
    found = rundirs.discover(root)
    runs = [summarize_run(r, None, AnalysisOptions()) for r in found.runs]
    arms: dict[str, list] = {}
    for r in runs:
        arms.setdefault(ranking.arm_of(r), []).append(r)
    for rs in arms.values():
        rs.sort(key=lambda r: r.experiment["repeat"])
    return arms


def _ratio(arms: dict[str, list], slow: str = "c", base: str = "a") -> float:
    med = lambda rs: statistics.median(v for r in rs for v in r.step_time_ns.values_ns)
    return med(arms[slow]) / med(arms[base])


def _calibrate(args) -> float:
    """Per-sample sleep (ms) that makes c about ``slow_frac`` slower than a on this machine now:
    a first guess from an unslowed record (median step x slow_frac / samples per rank), then
    ``--calibrate`` rounds of 3 interleaved a/c repeats each (one record pair is too noisy to
    steer by), scaling the sleep by the measured shortfall (a sleep also waits for a core to
    wake on, so the guess overshoots on a loaded machine); the scaling is clipped to 0.5-2x."""
    args.root = args.out / "calibrate0"
    cfg = _configs(args, 0.0, names=("a",))[0]
    record_local(interleave([RecordConfig(**{**cfg.to_dict(), "repeat": 1})]))
    step_ns = statistics.median(v for r in _arms(args.root)["a"] for v in r.step_time_ns.values_ns)
    per_rank = SHAPE["batch"] // (1 if args.strategy == "single" else args.nproc)
    cost = step_ns * args.slow_frac / per_rank / 1e6
    for i in range(1, args.calibrate + 1):
        args.root = args.out / f"calibrate{i}"
        configs = [RecordConfig(**{**c.to_dict(), "repeat": 3}) for c in _configs(args, cost, ("a", "c"))]
        record_local(interleave(configs))
        r = _ratio(_arms(args.root))
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
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING, format="tracer: %(message)s")
    args.out = args.out or Path(tempfile.mkdtemp(prefix="noise-decision-"))
    t0 = time.monotonic()
    cost = _calibrate(args)
    print(f"calibrated --data-sample-cost-ms {cost:.3f} (aim: c {args.slow_frac:.0%} slower); "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs", flush=True)
    counts = {"identical": {"within_noise": 0, "slower": 0}, "slowed": {"within_noise": 0, "slower": 0}}
    achieved = []
    for t in range(1, args.trials + 1):
        args.root = args.out / f"trial{t}"
        record_local(interleave(_configs(args, cost)))
        arms = _arms(args.root)
        for kind, other in (("identical", "b"), ("slowed", "c")):
            p = ranking.compare_arms(("a", arms["a"]), (other, arms[other]))
            called = "slower" if p.decision == "faster" else "within_noise"
            counts[kind][called] += 1
            if kind == "slowed":
                achieved.append(p.ratio if p.slower == "c" else 1 / p.ratio)
            print(f"trial {t} {kind}: {p.sentence} -> {called}", flush=True)
        print(f"  load average {os.getloadavg()[0]:.2f}", flush=True)
    wall = time.monotonic() - t0
    print(f"identical pairs: within noise {counts['identical']['within_noise']}/{args.trials}, "
          f"called different {counts['identical']['slower']}/{args.trials}")
    print(f"slowed pair: slower {counts['slowed']['slower']}/{args.trials}, within noise "
          f"{counts['slowed']['within_noise']}/{args.trials}; median c/a ratio "
          f"{statistics.median(achieved):.2f}")
    print(f"wall {wall:.0f} s for {args.trials} trials x 3 arms x {args.repeat} repeats "
          f"({args.strategy}, {args.active} profiled steps each); records under {args.out}")


if __name__ == "__main__":
    main()
