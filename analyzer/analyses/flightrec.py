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

Rules (``RULE``), per process group, over its member ranks that have a dump:

- a rank *entered* collective #S of the group when it enqueued it: its last enqueued sequence
  number (``pg_status.last_enqueued_collective``, else its newest entry) is >= S. Sequence
  numbers count each group's collectives on every rank alike (fr_trace matches entries across
  ranks by (group, ``collective_seq_id``): utils.py ``check_current_entry_match``), so it is
  exact even when the ring buffer has dropped older entries;
- a rank *completed* #S when ``pg_status.last_completed_collective`` >= S (else: its newest
  entry in state ``completed`` or retired). gloo counts a collective that failed (timed out) as
  completed, so "completed" there means "ended";
- the last sequence number every rank completed = the least of the ranks' last completed;
  with a member's dump missing it is only the dumped ranks' figure, and the statement names
  those ranks and the member as "no dump (unknown)", never "every rank" (the missing rank may
  be the one that hung);
- when the ranks' last enqueued numbers differ, the ranks at the lowest, L, *never entered*
  #L+1, and the others entered it and waited in it (a collective cannot end for some members
  while one never entered: fr_trace's "Not all ranks joining collective", utils.py
  ``error_analysis`` case one);
- kind, size and dtype mismatches: for each sequence number that two or more ranks' buffers
  hold, each rank's entry is compared with the lowest such rank's (fr_trace's reference: the
  first rank's entry, ``build_collectives``) by fr_trace's ``Op.match`` (``op_match``: kind,
  sizes and numel x group size, dtypes). Its fourth kind, COLLECTIVE_STATE_MISMATCH, is left
  out: in a hang the states differ because of the hang. As fr_trace stops pairing at a group's
  first mismatch ("the pairing is possibly incorrect" after it), only the first mismatching
  sequence number per group is reported.
  Point-to-point entries (send / recv, ``p2p_seq_id``) are not matched here (counted in a note).
"""

from __future__ import annotations

import math
from collections import defaultdict

import msgspec

from analyzer.contract.report_types import (FlightRecorder, FlightRecorderGroup, FlightRecorderMismatch,
                                            FlightRecorderRank)

RULE = ("per process group, by collective_seq_id as torch's fr_trace matches it: a rank entered #S "
        "when its last enqueued number is S or more, completed it when pg_status last_completed is "
        "(gloo: ended, failures included); the ranks with the lowest last enqueued never entered the next collective, "
        "the others waited in it; kind / size / dtype compared with the lowest rank's entry by "
        "fr_trace's Op.match, first mismatch per group (analyzer/analyses/flightrec.py)")

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


def _completed(d: Dump, pg_id: int | None, entries: dict[int, list[Entry]]) -> int:
    status = d.pg_status.get(str(pg_id)) if pg_id is not None else None
    if status is not None and _int(status.last_completed_collective) >= 0:
        return _int(status.last_completed_collective)
    done = [s for s, es in entries.items() if all(e.state == "completed" or e.retired for e in es)]
    return max(done, default=0)


def _enqueued(d: Dump, pg_id: int | None, entries: dict[int, list[Entry]]) -> int:
    status = d.pg_status.get(str(pg_id)) if pg_id is not None else None
    last = _int(status.last_enqueued_collective) if status is not None else -1
    return max(last, max(entries, default=0))


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def analyse_group(name: str, desc: str, dumps: list[Dump], world_size: int) -> FlightRecorderGroup:
    """One process group's state across the dumps (module docstring)."""
    members, source = _members(name, desc, dumps, world_size)
    by_rank = {d.rank: d for d in dumps if d.rank in members}
    per_seq: dict[int, dict[int, list[Entry]]] = {}
    pg_id = None
    for r, d in by_rank.items():
        seqs: dict[int, list[Entry]] = defaultdict(list)
        for e in d.entries:
            if e.process_group[0] != name or e.is_p2p or e.kind in P2P:
                continue
            seqs[e.collective_seq_id].append(e)
            pg_id = e.pg_id if e.pg_id is not None else pg_id
        per_seq[r] = {s: sorted(es, key=lambda e: e.op_id) for s, es in seqs.items()}
    if pg_id is None and name.isdigit():
        pg_id = int(name)
    ranks = []
    for r in sorted(by_rank):
        seqs = per_seq[r]
        enq, done = _enqueued(by_rank[r], pg_id, seqs), _completed(by_rank[r], pg_id, seqs)
        waiting = None
        if done < enq:
            es = seqs.get(done + 1)
            waiting = f"{es[0].kind if es else 'collective'} #{done + 1}"
        ranks.append(FlightRecorderRank(rank=r, last_enqueued_seq=enq, last_completed_seq=done, waiting_in=waiting))
    group = FlightRecorderGroup(pg=name, desc=desc, ranks=members, ranks_source=source,
                                dumped_ranks=sorted(by_rank), missing_dumps=[r for r in members if r not in by_rank],
                                per_rank=ranks)
    if not ranks:
        group.statement = f"process group {name}: no dump of any of its ranks"
        return group
    group.last_completed_seq = min(x.last_completed_seq for x in ranks)
    lo, hi = min(x.last_enqueued_seq for x in ranks), max(x.last_enqueued_seq for x in ranks)
    group.mismatches = _first_mismatch(per_seq, len(members))
    if lo < hi:
        seq = lo + 1
        group.next_seq = seq
        group.never_entered = [x.rank for x in ranks if x.last_enqueued_seq == lo]
        group.entered = [x.rank for x in ranks if x.last_enqueued_seq > lo]
        kinds = [per_seq[r][seq][0].kind for r in group.entered if seq in per_seq[r]]
        group.next_kind = kinds[0] if kinds else None
        what = f"{group.next_kind or 'collective'} #{seq}"
        group.statement = (f"{_ranks_text(group.never_entered)} never entered {what} of process group "
                           f"{name}; {_ranks_text(group.entered)} waited in it")
    else:
        open_ = [x.rank for x in ranks if x.last_completed_seq < hi]
        es = next((per_seq[r][hi] for r in sorted(per_seq) if hi in per_seq[r]), None)
        what = f"{es[0].kind if es else 'collective'} #{hi}"
        # "every rank" only when every member left a dump: a rank without one may be the hang
        who = _ranks_text(group.dumped_ranks) if group.missing_dumps else "every rank"
        group.statement = (f"process group {name}: {who} completed {what}"
                           f"{'' if group.missing_dumps else ', its last'}" if not open_ else
                           f"process group {name}: {who} entered {what}; not completed on "
                           f"{_ranks_text(open_)}")
        if hi == 0:
            group.statement = (f"process group {name}: no collective recorded"
                               + (f" by {who}" if group.missing_dumps else ""))
    if group.missing_dumps:
        group.statement += f"; {_ranks_text(group.missing_dumps)}: no dump (unknown)"
    for m in group.mismatches:
        group.statement += (f"; {MISMATCH_WORD[m.fr_state]} mismatch at {m.kind} #{m.seq}: rank {m.rank} has "
                            f"{m.detail} (rank {m.reference_rank})")
    return group


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


def analyse(dumps: list[Dump], world_size: int | None = None) -> FlightRecorder:
    """Every process group named in ``dumps`` (one per rank; module docstring), in group-name
    order. ``world_size``: the run's (manifest), else one more than the highest dumped rank."""
    world = max(world_size or 0, max((d.rank for d in dumps), default=-1) + 1)
    groups: dict[str, str] = {}
    p2p = 0
    for d in dumps:
        for e in d.entries:
            groups.setdefault(e.process_group[0], e.process_group[1])
            p2p += e.is_p2p or e.kind in P2P
    notes = []
    if p2p:
        notes.append(f"{p2p} point-to-point entries (send / recv) not matched: fr_trace pairs them by "
                     "peer, which this analysis does not")
    key = (lambda n: (0, int(n)) if n.isdigit() else (1, n))
    return FlightRecorder(dumps=[d.path for d in sorted(dumps, key=lambda d: d.rank)],
                          ranks=sorted(d.rank for d in dumps), rule=RULE,
                          groups=[analyse_group(n, groups[n], dumps, world) for n in sorted(groups, key=key)],
                          notes=notes)

