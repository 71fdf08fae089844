"""The cross-rank key of a collective: which instance on one rank is the same collective on
another (clock offsets, wait / transfer, skew and stragglers, ``analyzer merge``'s alignment).

Rule, per rank and process group (pg), over its collectives of the kinds that finish together
(``clock.MATCHABLE_KINDS``):
1. ``Seq``: when every such row carries the per process group sequence number c10d gives each
   collective (record_param_comms' ``Seq``; on the kernel itself since kineto #1296, on the
   CPU op before, analyzer/ingest/classify.py) and no two rows share one, the key is the Seq:
   the same number on every rank of the group, whatever collective each rank's profiler window
   begins with;
2. ``Comms Id``: else, when every such row carries record_param_comms' ``Comms Id`` (kineto
   #1300: a hash of the pg, the Seq and the group's topology, the same on every rank of the
   group; torch/csrc/profiler/util.cpp) and none repeats, the key is that id (as an integer
   below 2^62: the number itself, or a BLAKE2b hash of a non-numeric id);
3. order: else the key is the row's order among the rank's collectives of the pg (and kind,
   where the matching says so): TraceLens' (pg, index in group). Order pairs the wrong
   instances when the ranks' windows begin at different collectives: the report says so
   (``clock.match_rule``).
Rows of other kinds (send / recv, unknown) in a pg keyed by 1. or 2. take negative keys, -1 -
their order among those rows, so that they never meet a sequence number (c10d numbers p2p
apart from collectives). A CUDA graph replay's Seq is no key (analyzer/ingest/graphs.py): its
pg falls back to order. ``source``: "Seq", "Comms Id" or "order" per row.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

SOURCES = ("Seq", "Comms Id", "order")
"""``source`` values (module docstring), in the order the rule tries them."""
_KEY_MOD = 1 << 62


def id_key(text: str) -> int:
    """A ``Comms Id`` as a non-negative int64 key (< 2^62): the number when ``text`` is one,
    else the first 8 bytes of its BLAKE2b hash."""
    t = text.strip()
    if t.isascii() and t.isdigit():
        return int(t) % _KEY_MOD
    return int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big") % _KEY_MOD


def _unique_known(keys: np.ndarray) -> bool:
    return bool(len(keys)) and bool((keys >= 0).all()) and len(np.unique(keys)) == len(keys)


def rank_keys(pg: np.ndarray, matchable: np.ndarray, order: np.ndarray, pg_seq: np.ndarray,
              comms_id: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(key int64, source object) per row of one rank's collectives (module docstring).

    ``pg``: str per row; ``matchable``: bool per row (kind in ``clock.MATCHABLE_KINDS``);
    ``order``: int64 per row, the order key the rule falls back to (the row's index within
    its pg by start); ``pg_seq``: int64 Seq per row (-1 unknown); ``comms_id``: object per row
    (str, None / "" unknown)."""
    n = len(pg)
    key = np.asarray(order, np.int64).copy()
    source = np.full(n, "order", object)
    cid = np.array([id_key(c) if isinstance(c, str) and c else -1 for c in comms_id], np.int64)
    seq = np.asarray(pg_seq, np.int64)
    for g in pd.unique(pg):
        rows = np.flatnonzero(pg == g)
        m = rows[matchable[rows]]
        if _unique_known(seq[m]):
            src, vals = "Seq", seq[m]
        elif _unique_known(cid[m]):
            src, vals = "Comms Id", cid[m]
        else:
            continue
        key[m], source[rows] = vals, src
        rest = rows[~matchable[rows]]
        key[rest] = -1 - np.arange(len(rest))  # rows are in start order within the pg
    return key, source


def order_or_key(coll: pd.DataFrame, order: np.ndarray) -> np.ndarray:
    """``order`` (int64 per row of ``coll``: the caller's own order key) where the row's key is
    its order, else the table's ``seq`` (its Seq / Comms Id key: ``rank_keys``). A table
    without a ``seq_source`` column (built before the rule) is keyed by order."""
    order = np.asarray(order, np.int64)
    if "seq_source" not in coll.columns or not len(coll):
        return order
    keyed = coll["seq_source"].astype(str).to_numpy() != "order"
    return np.where(keyed, coll["seq"].to_numpy(dtype=np.int64), order)
