"""Hangs and desyncs from PyTorch Flight Recorder dumps: per process group, who entered what.

Input: one JSON dump per rank in the Flight Recorder (FR) schema that torch's own analyser
reads (``torch/distributed/flight_recorder/fr_trace.py``; ``components/builder.py``
``build_collectives`` documents each entry's fields): ``entries`` (``process_group`` = [name,
desc], ``pg_id``, ``collective_seq_id``, ``p2p_seq_id``, ``op_id``, ``profiling_name`` =
"<backend>:<kind>", ``input_sizes`` / ``output_sizes`` / ``input_dtypes`` / ``output_dtypes``,
``state`` scheduled / started / completed, ``retired``), ``pg_config`` ({group name: {name,
desc, ranks}}) and ``pg_status`` ({pg_id: last_enqueued / last_started /
last_completed_collective}). ``Dump`` is that schema as typed structs (the reader:
analyzer/ingest/frdump.py).

Rules (``RULE``), per process group, over its member ranks that have a dump. Collective
verdicts come from the group's *collective* entries (``is_p2p`` false, not send / recv); its
``pg_status`` counters are read only where they provably count collectives alone
(``_status_counts_collectives``): torch's counters also count point-to-point ops (NCCL: the
last work's ``seqP2P_`` or ``seqCollective_``; gloo: ``seq_``, bumped by send / recv), so on a
job whose default group carried send / recv they are not collective numbers:

- a rank *entered* collective #S of the group when its newest collective entry's
  ``collective_seq_id`` is >= S (or its ``pg_status.last_enqueued_collective``, where that
  counts collectives, when the ring buffer dropped older entries). Sequence numbers count each
  group's collectives on every rank alike (fr_trace matches entries across ranks by (group,
  ``collective_seq_id``): utils.py ``check_current_entry_match``);
- a rank *completed* #S when its collective entries of #S completed (state ``completed``;
  NCCL's watchdog retires an entry in another state only when it ended without completing),
  or on gloo, which sets no state, ended (``retired``, or
  ``pg_status.last_completed_collective`` >= S where that counts collectives). gloo retires
  and counts a collective that failed (timed out, a peer gone) as one that completed
  (``_done``): where a dumped member never entered #S, #S cannot have completed anywhere, and
  a rank that ended it *failed* in it (``_failed``: ``failed_seq``, "waited in it until it
  failed"); where a member left no dump, an ended #S is "ended (completed, or failed)";
- a dumped member that entered #S and did not complete it (not ended) while another member
  left no dump: verdict ``collective_hang`` ("rank 0 entered all_reduce #7 ... and did not
  complete it; rank 1 left no dump (its state is unknown)");
- the last sequence number every rank completed = the least of the ranks' last completed;
  with a member's dump missing it is only the dumped ranks' figure, and the statement names
  those ranks and the member as "no dump (unknown)", never "every rank" (the missing rank may
  be the one that hung);
- when the ranks' last entered numbers differ, the ranks at the lowest, L, *never entered*
  #L+1, and the others entered it and waited in it (a collective cannot end for some members
  while one never entered: fr_trace's "Not all ranks joining collective", utils.py
  ``error_analysis`` case one): verdict ``collective_hang``; so is a collective every member
  entered and some did not complete;
- kind, size and dtype mismatches: for each sequence number that two or more ranks' buffers
  hold, each rank's entry is compared with the lowest such rank's (fr_trace's reference: the
  first rank's entry, ``build_collectives``) by fr_trace's ``Op.match`` (``op_match``: kind,
  sizes and numel x group size, dtypes). Its fourth kind, COLLECTIVE_STATE_MISMATCH, is left
  out: in a hang the states differ because of the hang. As fr_trace stops pairing at a group's
  first mismatch ("the pairing is possibly incorrect" after it), only the first mismatching
  sequence number per group is reported: verdict ``mismatch`` when no collective hang;
- a group with no collective entry gets no collective verdict;
- point-to-point (``_p2p_pending``): a send or recv a rank entered and did not complete (its
  entry, or its batch's "coalesced" entry, neither completed nor retired) whose peer left a
  dump holding no pending op of the other kind with that rank *was never matched*: the peer
  never entered its recv / send (sends and recvs between two ranks are matched in the order
  they are posted: fr_trace's ``Op.match`` pairs a send with a recv of the same src, dst and
  sizes; peers named in ``profiling_name`` "send <src>-><dst>" / "recv <dst><-<src>" as group
  ranks, mapped to global ranks as ``Op._init_global_src_dst`` does). ``#N`` is the op's
  ``p2p_seq_id``, the rank's N-th point-to-point op in the group. Verdict ``p2p_pending`` when
  the group has no collective verdict. gloo records no send / recv (ProcessGroupGloo.cpp
  ``enqueue`` is collective-only; checked on torch 2.13): on gloo this verdict never fires.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict

import msgspec

from analyzer.contract.report_types import (FlightRecorder, FlightRecorderGroup, FlightRecorderMismatch,
                                            FlightRecorderP2P, FlightRecorderRank)

RULE = ("per process group, from its collective entries by collective_seq_id as torch's fr_trace "
        "matches them (pg_status only where it counts collectives alone: no send / recv entry and "
        "on gloo op_id = collective_seq_id on every entry): a rank entered #S when its newest collective entry "
        "is #S or later, completed it when that entry completed (gloo, whose entries end failed as they "
        "end completed: ended, and no dumped member never entered it, else it failed there); the ranks "
        "with the lowest last entered never entered the next collective, the others waited in it; kind / "
        "size / dtype compared with the lowest rank's entry by fr_trace's Op.match, first mismatch per "
        "group; a send / recv entered and not completed whose peer holds no pending match was never "
        "matched (analyzer/analyses/flightrec.py)")

P2P = ("send", "recv")


class Entry(msgspec.Struct, kw_only=True):
    """One FR entry (the fields this analysis reads; others are ignored)."""

    process_group: tuple[str, str]
    collective_seq_id: int
    profiling_name: str
    pg_id: int | None = None
    p2p_seq_id: int = 0
    op_id: int = 0
    input_sizes: list[list[int]] = []
    output_sizes: list[list[int]] = []
    input_dtypes: list[str] = []
    output_dtypes: list[str] = []
    state: str = "scheduled"
    retired: bool = False
    is_p2p: bool = False

    @property
    def kind(self) -> str:
        """The collective's kind: ``profiling_name`` without its backend ("gloo:all_reduce" ->
        "all_reduce"; "nccl:send 0->1" -> "send")."""
        return self.profiling_name.split(":", 1)[-1].split(" ", 1)[0]


class PgConfig(msgspec.Struct, kw_only=True):
    """A group's entry of ``pg_config``; ``ranks`` as the dump holds it, then as the reader
    parsed it (analyzer/ingest/frdump.py ``read_dump``): the global ranks, [] when unknown."""

    name: str = ""
    desc: str = ""
    ranks: str | list[int] = "[]"


class PgStatus(msgspec.Struct, kw_only=True):
    last_enqueued_collective: int | str = -1
    last_started_collective: int | str = -1
    last_completed_collective: int | str = -1


class Dump(msgspec.Struct, kw_only=True):
    """One rank's FR JSON dump (``_dump_fr_trace_json``); ``rank`` and ``path`` are set by the
    reader (FR dumps do not hold their rank: fr_trace takes it from the file name too)."""

    version: str | int | float = ""
    entries: list[Entry] = []
    pg_config: dict[str, PgConfig] = {}
    pg_status: dict[str, PgStatus] = {}
    rank: int = -1
    path: str = ""


def _int(v: int | str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return -1


def _members(name: str, desc: str, dumps: list[Dump], world_size: int) -> tuple[list[int], str]:
    """The group's global ranks and where they come from: any dump's ``pg_config`` (torch's,
    or the tracer's supplement for gloo), else the whole world for the default group, else the
    ranks whose dumps name the group."""
    for d in dumps:
        cfg = d.pg_config.get(name)
        if cfg is None:
            continue
        # parsed and bounded by the reader (analyzer/ingest/frdump.py, distinfo.ranks); text
        # is never parsed here: a second parser of ranks would be a second set of rules
        ranks = cfg.ranks if isinstance(cfg.ranks, list) else []
        if ranks:
            return sorted(set(ranks)), "pg_config"
    if desc == "default_pg" or name == "0":
        return list(range(world_size)), "world"
    return sorted(d.rank for d in dumps if any(e.process_group[0] == name for e in d.entries)), "dumps"


def _numel(sizes: list[list[int]]) -> int | None:
    return math.prod(sizes[0]) if sizes and sizes[0] is not None else None


def _dtype_mismatch(a: Entry, b: Entry) -> bool:
    """fr_trace ``Op.dtype_mismatch`` (components/types.py), ``a`` the reference."""
    return bool(
        (a.kind not in ("scatter", "gather", "broadcast") and set(a.input_dtypes) != set(a.output_dtypes)
         and a.input_sizes and a.input_sizes[0] and a.output_sizes and a.output_sizes[0])
        or (a.kind not in ("scatter", "broadcast") and set(a.input_dtypes) != set(b.input_dtypes)
            and a.input_sizes and a.input_sizes[0] and b.input_sizes and b.input_sizes[0])
        or (a.kind != "gather" and set(a.output_dtypes) != set(b.output_dtypes)
            and a.output_sizes and a.output_sizes[0] and b.output_sizes and b.output_sizes[0]))


def op_match(a: Entry, b: Entry, pg_size: int) -> tuple[str, str] | None:
    """fr_trace's ``Op.match`` of a collective (components/types.py) without its state check:
    None when ``b`` matches the reference ``a``, else (MatchState name, detail)."""
    if a.kind != b.kind:
        return "COLLECTIVE_TYPE_MISMATCH", f"kind {b.kind} where the reference has {a.kind}"
    k = a.kind
    if k not in ("all_to_all", "scatter") and a.input_sizes != b.input_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"input sizes {b.input_sizes} where the reference has {a.input_sizes}"
    if k not in ("all_to_all", "gather") and a.output_sizes != b.output_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"output sizes {b.output_sizes} where the reference has {a.output_sizes}"
    if k in ("all_reduce", "allreduce_coalesced") and a.input_sizes != b.output_sizes:
        return "SIZE_OR_SYNTAX_MISMATCH", f"output sizes {b.output_sizes} where the reference's input sizes are {a.input_sizes}"
    if k in ("all_gather", "all_gather_base", "all_gather_into_tensor_coalesced"):
        out, inp = _numel(b.output_sizes), _numel(a.input_sizes)
        if out is not None and inp is not None and out != inp * pg_size:
            return ("SIZE_OR_SYNTAX_MISMATCH",
                    f"output numel {out} where the reference's input numel {inp} x group size {pg_size} = {inp * pg_size}")
    if k in ("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"):
        inp, out = _numel(b.input_sizes), _numel(a.output_sizes)
        if inp is not None and out is not None and inp != out * pg_size:
            return ("SIZE_OR_SYNTAX_MISMATCH",
                    f"input numel {inp} where the reference's output numel {out} x group size {pg_size} = {out * pg_size}")
    if _dtype_mismatch(a, b):
        return ("COLLECTIVE_DTYPE_MISMATCH",
                f"dtypes {sorted(set(b.input_dtypes))} -> {sorted(set(b.output_dtypes))} where the reference has "
                f"{sorted(set(a.input_dtypes))} -> {sorted(set(a.output_dtypes))}")
    return None


MISMATCH_WORD = {"COLLECTIVE_TYPE_MISMATCH": "kind", "SIZE_OR_SYNTAX_MISMATCH": "size",
                 "COLLECTIVE_DTYPE_MISMATCH": "dtype"}


def _seq_match(ref: list[Entry], other: list[Entry], pg_size: int) -> tuple[str, str] | None:
    """Compare two ranks' entries of one sequence number (several when coalesced: in op order,
    fr_trace compares a coalesced group by its kind)."""
    if len(ref) != len(other):
        return ("COLLECTIVE_TYPE_MISMATCH",
                f"{len(other)} op(s) ({', '.join(e.kind for e in other)}) where the reference has "
                f"{len(ref)} ({', '.join(e.kind for e in ref)})")
    for a, b in zip(ref, other):
        got = op_match(a, b, pg_size)
        if got is not None:
            return got
    return None


def _tracks_state(e: Entry) -> bool:
    """Whether the entry's backend sets ``state``: NCCL does (FlightRecorder ``update_state``
    queries its start / end CUDA events), so there ``completed`` alone means completed and an
    entry retired in another state ended without completing. gloo records no events: its
    state stays ``scheduled``."""
    return e.profiling_name.startswith("nccl:")


def _done(e: Entry) -> bool:
    """An entry's op ended: state ``completed`` (NCCL's watchdog saw its end event), or, on a
    backend that sets no state (gloo), ``retired``. gloo retires an entry when its work ends,
    failed or not: ``ProcessGroupGloo::runLoop`` calls ``retire_id`` after
    ``AsyncWork::execute`` whatever its outcome (checked on torch 2.13 CPU: an all_reduce
    whose peer never entered it, timed out, is retired, and ``pg_status`` counts it completed,
    within a second of its error). So on gloo "ended" is not "completed": ``_failed`` tells
    the two apart where the dumps can."""
    return e.state == "completed" or (e.retired and not _tracks_state(e))


def _status(d: Dump, pg_id: int | None) -> PgStatus | None:
    return d.pg_status.get(str(pg_id)) if pg_id is not None else None


def _completed(d: Dump, pg_id: int | None, entries: dict[int, list[Entry]], counts: bool) -> int:
    """The rank's last completed collective: ``pg_status`` when ``counts`` (it counts
    collectives alone: ``_status_counts_collectives``), else its newest collective entry
    that ended."""
    status = _status(d, pg_id)
    if counts and status is not None and _int(status.last_completed_collective) >= 0:
        return _int(status.last_completed_collective)
    # a coalesced collective's ops share its number and only its last entry (the "coalesced"
    # one, highest op_id) holds the work that ends (fr_trace find_coalesced_group_with_non_p2p)
    done = [s for s, es in entries.items() if _done(es[-1])]
    return max(done, default=0)


def _enqueued(d: Dump, pg_id: int | None, entries: dict[int, list[Entry]], counts: bool) -> int:
    """The rank's last entered collective: its newest collective entry, or ``pg_status`` when
    that is higher and ``counts`` (entries dropped from the ring buffer)."""
    status = _status(d, pg_id)
    last = _int(status.last_enqueued_collective) if counts and status is not None else -1
    return max(last, max(entries, default=0))


def _status_counts_collectives(name: str, dumps: dict[int, Dump]) -> tuple[bool, str | None]:
    """Whether the group's ``pg_status`` counters count its collectives alone, and where not,
    the evidence (a line for the notes).

    torch numbers them in another count where point-to-point ops are involved: NCCL sets
    ``lastEnqueuedSeq`` / ``lastCompletedSeq`` to the work's ``seq_``, ``seqP2P_`` for a send /
    recv and ``seqCollective_`` for a collective (ProcessGroupNCCL.cpp ``initWork``,
    ``workEnqueue``), and records every send / recv (``is_p2p``); gloo sets them to the work's
    ``seq_``, which its send / recv bump too though they are never recorded
    (ProcessGroupGloo.cpp ``enqueue``: "p2p does not call enqueue"; checked on torch 2.13 CPU:
    after all_reduce, 10 sends, all_reduce, pg_status says 12 for collective #2). So the
    counters are set aside when a dump holds a point-to-point entry of the group, or a gloo
    entry whose ``op_id`` (gloo's ``seq_``: every op) differs from its ``collective_seq_id``
    (a send or recv came before it). NCCL's ``op_id`` also counts each op of a coalesced
    collective, which its counters count once: no evidence of send / recv there. Where set
    aside, entered / completed come from the collective entries."""
    for r in sorted(dumps):
        for e in dumps[r].entries:
            if e.process_group[0] != name:
                continue
            if _is_p2p(e):
                return False, (f"process group {name}: pg_status set aside (it counts point-to-point "
                               f"ops too: rank {r} holds a {e.kind} entry); entered / completed from "
                               "its collective entries")
            if e.profiling_name.startswith("gloo:") and e.op_id != e.collective_seq_id:
                return False, (f"process group {name}: pg_status set aside (it counts point-to-point "
                               f"ops too: rank {r}'s {e.kind} #{e.collective_seq_id} is gloo's op "
                               f"{e.op_id} of the group); entered / completed from its collective entries")
    return True, None


def _is_p2p(e: Entry) -> bool:
    """A point-to-point entry: ``is_p2p`` (NCCL sets it on send, recv and their coalesced
    batch), or a send / recv by its name."""
    return e.is_p2p or e.kind in P2P


_SEND = re.compile(r"(\d+)->(\d+)$")
_RECV = re.compile(r"(\d+)<-(\d+)$")


def _p2p_peer(e: Entry, members: list[int]) -> tuple[int, int] | None:
    """(global rank of the entry's own end, global rank of its peer) from ``profiling_name``
    "<backend>:send <src>-><dst>" / "<backend>:recv <dst><-<src>" (group ranks, mapped to
    global ranks through the sorted members as fr_trace's ``Op._init_global_src_dst`` does);
    None when it names none or a rank outside the group."""
    meta = e.profiling_name.split(":", 1)[-1].split(" ", 1)
    m = (_SEND if e.kind == "send" else _RECV).match(meta[1]) if len(meta) == 2 else None
    if m is None:
        return None
    own, peer = int(m.group(1)), int(m.group(2))
    if not (own < len(members) and peer < len(members)):
        return None
    return members[own], members[peer]


def _p2p_ops(name: str, d: Dump, members: list[int]) -> list[tuple[str, int, int, bool]]:
    """The rank's sends and recvs in the group as (op, peer, p2p_seq_id, ended), in op order.
    An op of a batch (``batch_isend_irecv``: NCCL records each op, then a "coalesced" entry of
    the same ``p2p_seq_id`` whose state is the batch's; fr_trace ``find_coalesced_group``) ended
    when the batch did."""
    mine = [e for e in d.entries if e.process_group[0] == name and _is_p2p(e)]
    batch_done = {e.p2p_seq_id: _done(e) for e in mine if e.kind not in P2P}
    out = []
    for e in sorted(mine, key=lambda e: (e.p2p_seq_id, e.op_id)):
        ends = _p2p_peer(e, members) if e.kind in P2P else None
        if ends is None or ends[0] != d.rank:
            continue
        out.append((e.kind, ends[1], e.p2p_seq_id, batch_done.get(e.p2p_seq_id, _done(e))))
    return out


def _p2p_pending(name: str, by_rank: dict[int, Dump], members: list[int]) -> list[FlightRecorderP2P]:
    """The sends and recvs a rank entered and did not complete whose peer never entered the
    matching op: the peer has a dump and it holds no pending op of the other kind with that
    rank (sends and recvs between two ranks are matched in the order they are posted; a peer
    that had posted the match would either have ended it -- and the op with it -- or hold it
    pending: both pending is no such verdict). The first per (rank, op, peer)."""
    ops = {r: _p2p_ops(name, d, members) for r, d in by_rank.items()}
    out, seen = [], set()
    for r in sorted(ops):
        for op, peer, seq, ended in ops[r]:
            if ended or peer not in ops or (op, peer) in seen:
                continue
            want = "recv" if op == "send" else "send"
            if any(o == want and p == r and not e for o, p, _, e in ops[peer]):
                continue
            seen.add((op, peer))
            out.append(FlightRecorderP2P(rank=r, op=op, peer=peer, p2p_seq=seq))
    return out


def _p2p_line(x: FlightRecorderP2P, pg: str) -> str:
    want = "recv" if x.op == "send" else "send"
    return (f"rank {x.rank}'s {x.op} #{x.p2p_seq} {'to' if x.op == 'send' else 'from'} rank {x.peer} "
            f"(process group {pg}) was never matched: rank {x.peer} never entered its {want}")


P2P_LINES = 3
"""The most never-matched point-to-point ops a group's statement names (the rest counted)."""


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def analyse_group(name: str, desc: str, dumps: list[Dump], world_size: int,
                  pickled_ranks: list[int] = ()) -> tuple[FlightRecorderGroup, str | None]:
    """One process group's state across the dumps (module docstring), and a note when its
    ``pg_status`` was set aside (None otherwise). ``pickled_ranks``: members whose dump is a
    pickle (not read)."""
    members, source = _members(name, desc, dumps, world_size)
    by_rank = {d.rank: d for d in dumps if d.rank in members}
    counts, note = _status_counts_collectives(name, by_rank)
    per_seq: dict[int, dict[int, list[Entry]]] = {}
    pg_id = None
    for r, d in by_rank.items():
        seqs: dict[int, list[Entry]] = defaultdict(list)
        for e in d.entries:
            if e.process_group[0] != name:
                continue
            pg_id = e.pg_id if e.pg_id is not None else pg_id
            if not _is_p2p(e):
                seqs[e.collective_seq_id].append(e)
        per_seq[r] = {s: sorted(es, key=lambda e: e.op_id) for s, es in seqs.items()}
    if pg_id is None and name.isdigit():
        pg_id = int(name)
    ranks = []
    for r in sorted(by_rank):
        seqs = per_seq[r]
        enq = _enqueued(by_rank[r], pg_id, seqs, counts)
        done = min(_completed(by_rank[r], pg_id, seqs, counts), enq)
        waiting = None
        if done < enq:
            es = seqs.get(done + 1)
            waiting = f"{es[0].kind if es else 'collective'} #{done + 1}"
        ranks.append(FlightRecorderRank(rank=r, last_enqueued_seq=enq, last_completed_seq=done, waiting_in=waiting))
    _failed(ranks, per_seq, by_rank, name)
    group = FlightRecorderGroup(pg=name, desc=desc, ranks=members, ranks_source=source,
                                dumped_ranks=sorted(by_rank), missing_dumps=[r for r in members if r not in by_rank],
                                per_rank=ranks)
    if not ranks:
        group.summary = f"process group {name}: no dump of any of its ranks"
        return group, note
    group.p2p_pending = _p2p_pending(name, by_rank, members)
    _judge(group, per_seq, by_rank, pickled_ranks)
    return group, note


def _missing_text(missing: list[int], pickled_ranks: list[int]) -> str:
    """The members without a dump read, for a group's line: those whose dump is a pickle
    ("rank 1: its dump is a pickle (not read)"), the others "no dump (unknown)"."""
    pick = [r for r in missing if r in pickled_ranks]
    none = [r for r in missing if r not in pickled_ranks]
    return "; ".join([f"{_ranks_text(none)}: no dump (unknown)"] * bool(none)
                     + [f"{_ranks_text(pick)}: {'its dump is a pickle' if len(pick) == 1 else 'their dumps are pickles'}"
                        " (not read)"] * bool(pick))


def _failed(ranks: list[FlightRecorderRank], per_seq: dict[int, dict[int, list[Entry]]], by_rank: dict[int, Dump],
            name: str) -> None:
    """On a backend whose entries end failed as they end completed (gloo: ``_done``), a
    collective a dumped member never entered cannot have completed on any member (a
    collective completes only once every member contributed): a rank that ended it ended it
    in error (a timeout, or a peer that left). Such a rank's ``last_completed_seq`` is
    lowered to the last collective every dumped member entered, its ``failed_seq`` set to
    the one after and ``waiting_in`` names it. NCCL's ``state`` says completed itself."""
    if not ranks or any(_tracks_state(e) for d in by_rank.values() for e in d.entries if e.process_group[0] == name):
        return
    lo = min(x.last_enqueued_seq for x in ranks)
    for x in ranks:
        if x.last_completed_seq > lo:
            es = per_seq[x.rank].get(lo + 1)
            x.last_completed_seq, x.failed_seq = lo, lo + 1
            x.waiting_in = f"{es[0].kind if es else 'collective'} #{lo + 1}"


FAILED = "until it failed (timed out, or a peer left)"
"""How a waiting rank's statement ends when its collective ended in error (``_failed``)."""


def _judge(group: FlightRecorderGroup, per_seq: dict[int, dict[int, list[Entry]]], by_rank: dict[int, Dump],
           pickled_ranks: list[int] = ()) -> None:
    """Set the group's collective figures, ``verdict``, ``statement`` and ``summary`` from its
    ranks' last entered / completed collectives (``per_rank``), mismatches and pending
    point-to-point ops (module docstring: the precedence collective_hang, mismatch,
    p2p_pending)."""
    name, ranks = group.pg, group.per_rank
    group.last_completed_seq = min(x.last_completed_seq for x in ranks)
    lo, hi = min(x.last_enqueued_seq for x in ranks), max(x.last_enqueued_seq for x in ranks)
    group.mismatches = _first_mismatch(per_seq, len(group.ranks))
    open_ = [x.rank for x in ranks if x.last_completed_seq < hi]
    if lo < hi:
        seq = lo + 1
        group.next_seq = seq
        group.never_entered = [x.rank for x in ranks if x.last_enqueued_seq == lo]
        group.entered = [x.rank for x in ranks if x.last_enqueued_seq > lo]
        kinds = [per_seq[r][seq][0].kind for r in group.entered if seq in per_seq[r]]
        group.next_kind = kinds[0] if kinds else None
        what = f"{group.next_kind or 'collective'} #{seq}"
        group.verdict = "collective_hang"
        failed = [x.rank for x in ranks if x.failed_seq == seq]
        line = (f"{_ranks_text(group.never_entered)} never entered {what} of process group "
                f"{name}; {_ranks_text(group.entered)} waited in it")
        if failed:
            line += (f" {FAILED}" if failed == group.entered else f" ({_ranks_text(failed)} {FAILED})")
    else:
        es = next((per_seq[r][hi] for r in sorted(per_seq) if hi in per_seq[r]), None)
        what = f"{es[0].kind if es else 'collective'} #{hi}"
        # "every rank" only when every member left a dump: a rank without one may be the hang
        who = _ranks_text(group.dumped_ranks) if group.missing_dumps else "every rank"
        if hi == 0:
            n_p2p = sum(_is_p2p(e) for d in by_rank.values() for e in d.entries if e.process_group[0] == name)
            line = (f"process group {name}: no collective recorded" + (f" by {who}" if group.missing_dumps else "")
                    + (f" ({n_p2p} point-to-point entries only)" if n_p2p else ""))
        elif open_ and group.missing_dumps:
            # a dumped member entered it and did not complete it (NCCL: not completed; gloo:
            # not ended), the others are unknown: the hang is established, its cause is not
            group.verdict = "collective_hang"
            none = [r for r in group.missing_dumps if r not in pickled_ranks]
            pick = [r for r in group.missing_dumps if r in pickled_ranks]
            its = lambda rs: "its" if len(rs) == 1 else "their"  # noqa: E731
            parts = ([f"{_ranks_text(none)} left no dump ({its(none)} state is unknown)"] if none else []) + (
                [f"{_ranks_text(pick)}: {its(pick)} dump{'s are pickles' if len(pick) > 1 else ' is a pickle'} "
                 f"(not read; {its(pick)} state is unknown)"] if pick else [])
            line = (f"{_ranks_text(open_)} entered {what} of process group {name} and did not complete it; "
                    + "; ".join(parts))
            group.summary = group.statement = line
            return
        elif open_:
            group.verdict = "collective_hang"
            line = f"process group {name}: {who} entered {what}; not completed on {_ranks_text(open_)}"
        elif group.missing_dumps and not any(_tracks_state(e) for es in per_seq.values() for x in es.values()
                                             for e in x):
            # gloo: ended, completed or failed alike (``_done``); only the missing member's
            # dump could tell which
            line = (f"process group {name}: {who} ended {what} (completed, or failed: gloo records "
                    "both alike)")
        else:
            line = f"process group {name}: {who} completed {what}{'' if group.missing_dumps else ', its last'}"
    if group.missing_dumps:
        line += "; " + _missing_text(group.missing_dumps, pickled_ranks)
    for m in group.mismatches:
        line += (f"; {MISMATCH_WORD[m.fr_state]} mismatch at {m.kind} #{m.seq}: rank {m.rank} has "
                 f"{m.detail} (rank {m.reference_rank})")
    if group.mismatches and not group.verdict:
        group.verdict = "mismatch"
    group.summary = line
    if not group.verdict and group.p2p_pending:
        group.verdict = "p2p_pending"
        shown = group.p2p_pending[:P2P_LINES]
        line = "; ".join(_p2p_line(x, name) for x in shown)
        if len(group.p2p_pending) > len(shown):
            line += f"; {len(group.p2p_pending) - len(shown)} more never-matched point-to-point ops"
        group.summary = line
    group.statement = line if group.verdict else ""


def _first_mismatch(per_seq: dict[int, dict[int, list[Entry]]], pg_size: int) -> list[FlightRecorderMismatch]:
    """The first sequence number at which some rank's entries do not match the lowest rank's
    holding it (fr_trace ``Op.match`` without the state check): one row per differing rank."""
    seqs = sorted({s for by in per_seq.values() for s in by})
    for s in seqs:
        holders = [r for r in sorted(per_seq) if s in per_seq[r]]
        if len(holders) < 2:
            continue
        ref = holders[0]
        out = []
        for r in holders[1:]:
            got = _seq_match(per_seq[ref][s], per_seq[r][s], pg_size)
            if got is not None:
                out.append(FlightRecorderMismatch(seq=s, kind=per_seq[ref][s][0].kind, fr_state=got[0],
                                                  mismatch=MISMATCH_WORD[got[0]], rank=r, reference_rank=ref,
                                                  detail=got[1]))
        if out:
            return out
    return []


def analyse(dumps: list[Dump], world_size: int | None = None, pickled_ranks: list[int] = ()) -> FlightRecorder:
    """Every process group named in the dumps' entries (one dump per rank; module docstring),
    in group-name order. ``world_size``: the run's (manifest), else one more than the highest
    dumped (or pickled) rank. ``pickled_ranks``: ranks whose dump is a pickle, never read: a
    member among them is said to have one ("its dump is a pickle (not read)"), not no dump."""
    world = max(world_size or 0, max((d.rank for d in dumps), default=-1) + 1,
                max(pickled_ranks, default=-1) + 1)
    groups: dict[str, str] = {}
    for d in dumps:
        for e in d.entries:
            groups.setdefault(e.process_group[0], e.process_group[1])
    notes = []
    if dumps and not groups:
        notes.append("The dumps hold no entry: no process group recorded an op (torch's gloo records "
                     "collectives only, never a send or recv: ProcessGroupGloo::enqueue)")
    key = (lambda n: (0, int(n)) if n.isdigit() else (1, n))
    out = []
    for n in sorted(groups, key=key):
        group, note = analyse_group(n, groups[n], dumps, world, pickled_ranks)
        out.append(group)
        notes += [note] if note else []
    return FlightRecorder(dumps=[d.path for d in sorted(dumps, key=lambda d: d.rank)],
                          ranks=sorted(d.rank for d in dumps), rule=RULE, groups=out, notes=notes,
                          pickled_ranks=sorted(pickled_ranks))
