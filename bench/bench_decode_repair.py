"""Decode time of valid traces with the quote repair in place, and the repair's time on broken
copies (issue 30 item 2). Prints a table; asserts nothing.

For each corpus trace (``$PARITYTRACE_CORPUS``, every ``*.json`` / ``*.json.gz``) and one
large trace (the largest corpus trace tiled ``--tile`` times with bench/tile.py):
- ``strict ms``: the strict path alone, what ``decode_bytes`` did before the repair existed
  (typed decoders, the lenient one when they refuse a type, then the columns);
- ``with repair ms``: ``decode.decode_bytes``, the repair code in place; ``ratio`` = with
  repair / strict; every time is the fastest of ``--reps`` interleaved runs (the least
  disturbed by other processes). 1.00 is no slowdown: a valid trace never reaches the repair,
  which runs only after the strict decoder refused the JSON;
- a broken copy: the name of every ``--every``-th complete event replaced by
  ``torch/_dynamo/eval_frame.py("foo", "bar")(12): _fn`` written with its quotes unescaped, as
  exporters before kineto #1459 wrote it: ``repair ms`` (``repair_quotes`` alone) and its
  speed in MB of JSON per second, ``decode ms`` (``decode_bytes`` on the broken bytes: the
  failed strict decode, the repair, the strict decode of the repaired JSON) and ``x valid``
  (that time over the valid trace's).

    PARITYTRACE_CORPUS=../shared/corpus python3 bench/bench_decode_repair.py --reps 5 --tile 8
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import time
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from analyzer.ingest import decode  # noqa: E402
from analyzer.ingest.quoterepair import repair_quotes  # noqa: E402
from tile import tile  # noqa: E402

_MARK = "@@Q@@"
BROKEN_NAME = f"torch/_dynamo/eval_frame.py({_MARK}foo{_MARK}, {_MARK}bar{_MARK})(12): _fn"


def strict(data: bytes, path: str) -> decode.Decoded:
    """``decode_bytes`` without the repair plumbing: the strict path as it was."""
    trace = decode._decode_typed(data)
    if trace is None:
        trace = decode._LENIENT.decode(data)
    return decode.columns(decode._parsed(trace, data, path), path)


def broken_copy(data: bytes, every: int) -> tuple[bytes, int]:
    """``data`` with the name of every ``every``-th complete event replaced by
    ``BROKEN_NAME``, its quotes unescaped; and how many names were replaced."""
    from decimal import Decimal

    trace = msgspec.json.Decoder(float_hook=Decimal).decode(data)
    n = 0
    for i, ev in enumerate(e for e in trace["traceEvents"] if e.get("ph") == "X"):
        if i % every == 0:
            ev["name"] = BROKEN_NAME
            n += 1
    raw = msgspec.json.Encoder(decimal_format="number").encode(trace)
    return raw.replace(_MARK.encode(), b'"'), n


def timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def bench_one(name: str, data: bytes, reps: int, every: int) -> str:
    """One table row for trace JSON ``data``."""
    s_times, f_times = [], []
    for _ in range(reps):  # interleaved, so drift of the machine hits both alike
        s_times.append(timed(strict, data, name))
        f_times.append(timed(decode.decode_bytes, data, name))
    s, f = min(s_times), min(f_times)
    bad, n = broken_copy(data, every)
    got = repair_quotes(bad)
    assert got is not None and got[1] == n, (name, n, got and got[1])
    r = min(timed(repair_quotes, bad) for _ in range(reps))
    d = min(timed(decode.decode_bytes, bad, name) for _ in range(reps))
    mb = len(data) / 1e6
    return (f"{name[:38]:38} {mb:8.1f} {s * 1e3:9.1f} {f * 1e3:9.1f} {f / s:6.2f} "
            f"{n:8d} {r * 1e3:9.1f} {len(bad) / 1e6 / r:7.0f} {d * 1e3:9.1f} {d / f:7.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, default=Path(os.environ.get("PARITYTRACE_CORPUS", "")))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--every", type=int, default=100, help="break every N-th event name")
    ap.add_argument("--tile", type=int, default=8, help="copies of the largest trace (0: none)")
    args = ap.parse_args()
    paths = sorted(p for p in args.corpus.rglob("*") if p.name.endswith((".json", ".json.gz")))
    if not paths:
        sys.exit("no traces: set PARITYTRACE_CORPUS or pass --corpus")
    print(f"{'trace':38} {'MB':>8} {'strict ms':>9} {'w/repair':>9} {'ratio':>6} "
          f"{'broken':>8} {'repair ms':>9} {'MB/s':>7} {'decode ms':>9} {'x valid':>7}")
    datas = {}
    for p in paths:
        raw = p.read_bytes()
        datas[p] = gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
        if len(datas[p]) < 64 << 10:  # the tb_plugin toy traces: timer noise only
            continue
        print(bench_one(str(p.relative_to(args.corpus)), datas[p], args.reps, args.every),
              flush=True)
    if args.tile > 1:
        big = max(datas, key=lambda p: len(datas[p]))
        from decimal import Decimal

        trace = msgspec.json.Decoder(float_hook=Decimal).decode(datas[big])
        data = msgspec.json.Encoder(decimal_format="number").encode(tile(trace, args.tile))
        print(bench_one(f"{big.name} x{args.tile}", data, max(2, args.reps // 2), args.every))


if __name__ == "__main__":
    main()
