"""What reading one trace costs before its decode: the gunzip and the tables cache's key
(issue 46 items 3 and 4). Prints two tables; asserts nothing.

Builds one large rank (the first DLRM corpus rank tiled ``--k`` times, bench/tile.py, about
40 MB of JSON at the default) as ``.json`` and ``.json.gz`` (gzip level 6, as tracer/profiling.py
writes it) in ``--dir`` (reused when there), then, interleaved ``--reps`` times, the fastest
CPU time of each:

- gunzip, at this machine's default cap: ``decode.decompress`` as shipped (``decode.INFLATE``:
  ISA-L where installed), the same on zlib (the fallback: the chunked loop that shipped before
  issue 46), ``zlib.decompress`` and
  libdeflate's one-shot ``deflate.gzip_decompress`` when installed (not used: the issue's
  docs say why); ratios against the zlib loop;
- key: what a cold parse and a cache hit spend on recognising the trace: SHA-256 of the plain
  JSON, of the gzip bytes (what a cold ``.json.gz`` parse hashes, analyzer/ingest/ranktables.py),
  and ``tablecache.stat_sig`` (stat + the 64 KiB probe of each end: a hit's whole key); ratios
  against SHA-256 of the plain JSON.

    PARITYTRACE_CORPUS=../shared/corpus python3 bench/bench_ingest_read.py --reps 9
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import sys
import time
import zlib
from pathlib import Path

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from analyzer.ingest import decode, tablecache  # noqa: E402
from bench.bench_scale import kineto_bytes  # noqa: E402
from bench.tile import read_trace, tile  # noqa: E402


def build(folder: Path, k: int) -> tuple[Path, Path]:
    """(rank0.json, rank0.json.gz) in ``folder``: the first DLRM rank tiled ``k`` times."""
    plain, gz = folder / f"rank0.k{k}.json", folder / f"rank0.k{k}.json.gz"
    if not (plain.exists() and gz.exists()):
        corpus = Path(os.environ.get("PARITYTRACE_CORPUS", "../shared/corpus"))
        src = corpus / "dlrm_ddp_8rank_v100" / "worker0.pt.trace.json.gz"
        data = kineto_bytes(tile(read_trace(src), k), msgspec.json.Encoder(decimal_format="number"))
        folder.mkdir(parents=True, exist_ok=True)
        plain.write_bytes(data)
        gz.write_bytes(gzip.compress(data, compresslevel=6))
    return plain, gz


def fastest(cases: dict[str, object], reps: int) -> dict[str, float]:
    """The least CPU seconds of each callable over ``reps`` interleaved rounds."""
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(reps):
        for name, fn in cases.items():
            t = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - t)
    return best


def table(title: str, best: dict[str, float], ref: str) -> None:
    print(f"\n| {title} | CPU ms | vs {ref} |")
    print("|---|---:|---:|")
    for name, sec in best.items():
        print(f"| {name} | {1e3 * sec:.1f} | {sec / best[ref]:.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--k", type=int, default=50, help="copies of the rank's window (default 50)")
    ap.add_argument("--reps", type=int, default=9, help="interleaved rounds (default 9)")
    ap.add_argument("--dir", type=Path, default=Path("/tmp/bench-ingest-read"))
    args = ap.parse_args()
    plain, gz = build(args.dir, args.k)
    data, raw = plain.read_bytes(), gz.read_bytes()
    print(f"trace: {len(data) / 1e6:.1f} MB of JSON, {len(raw) / 1e6:.2f} MB gzipped; "
          f"decode.INFLATE = {decode.INFLATE.__name__}; load average {os.getloadavg()[0]:.2f}")
    zloop = "decompress on zlib (the fallback; as before issue 46)"
    cap = decode.max_trace_bytes()
    gunzip = {f"decompress as shipped ({decode.INFLATE.__name__})":
              lambda: decode.decompress(raw, gz, cap),
              zloop: lambda: decode._gunzip(raw, gz, cap, zlib),
              "zlib.decompress, one shot": lambda: zlib.decompress(raw, 31)}
    try:
        import deflate

        gunzip["libdeflate gzip_decompress, one shot (first member only)"] = \
            lambda: deflate.gzip_decompress(raw)
    except ImportError:
        pass
    table(f"gunzip, {len(data) / 1e6:.0f} MB", fastest(gunzip, args.reps), zloop)
    sha_json = "SHA-256 of the plain JSON"
    key = {sha_json: lambda: hashlib.sha256(data).hexdigest(),
           "SHA-256 of the gzip bytes (cold .json.gz)": lambda: hashlib.sha256(raw).hexdigest(),
           "stat_sig of the .json.gz (a hit's key)": lambda: tablecache.stat_sig(gz),
           "stat_sig of the .json (a hit's key)": lambda: tablecache.stat_sig(plain),
           "os.stat alone (a hit's key before issue 46)": lambda: os.stat(gz)}
    table("cache key", fastest(key, args.reps), sha_json)


if __name__ == "__main__":
    main()
