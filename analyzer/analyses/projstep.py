"""The projected step (issue 44, Deliver 3): one training step at world N replayed from a
projection's roles and the link model.

A projection (``tracer project``) runs each distinct role of the job once, on torch's fake
process group, where a collective completes at once. What it measures of a role's step is its
compute at the local shapes and, in order, every collective call: when it is issued and when the
role needs its result. The replay puts each call's time on the link (``linkmodel.lookup``) back
into that sequence:

- each role runs its compute in the order the trace shows; the time of a fake call itself is
  left out (the link time replaces it: a link curve times the whole call);
- a collective starts when every member of its group has issued it (a member rank plays its
  role: ``role_of``), plus the arrival wait where ranks share CPU cores (the group's last rank
  arrives a scheduler slice late: ``wait``, measured by the link benchmark per group size and
  compute segment, tracer/linkbench.py), and the group's previous collective has finished (one
  stream per process group: NCCL runs the collectives of one communicator in issue order, gloo
  one at a time per group), and lasts the link time of its kind, bytes, group size and node
  span;
- a send and its recv (the k-th send a -> b is the k-th recv at b from a) start when both
  sides have issued them and the previous transfer in that direction has finished;
- the role waits for a call where it needs the result (``Call.need_ns``); the step ends when its
  compute is done and every call it issued has finished.

Overlap is what ``need_ns`` allows and nothing else: a call needed where it is issued is fully
exposed (gloo on CPU, as measured: the analyzer finds no overlap in CPU records), one needed
later overlaps the compute in between (FSDP's prefetched all_gather, gradient reductions under
backward on NCCL). Deciding ``need_ns`` is the caller's (analyzer/compare/projection.py).

Times are ns, floats inside the replay (link times are interpolated), ints in the answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from analyzer.contract.errors import BadInput


@dataclass(frozen=True, slots=True)
class Call:
    """One collective call of a role's step. ``issue_ns``: the role's compute time (ns from the
    step's start, calls' own time left out) when it is issued; ``need_ns`` (>= issue_ns) when
    the role needs its result; ``group``: the global ranks of its process group (the peer pair
    for a send / recv); ``peer``: a send / recv's global peer rank (-1 otherwise); ``nbytes``:
    nccl-tests bytes of the call; ``dim``: its mesh dimension ("world" where the group is the
    world)."""

    kind: str
    pg: str
    group: tuple[int, ...]
    nbytes: int
    issue_ns: float
    need_ns: float
    dim: str = "world"
    peer: int = -1
    direction: str = ""
    """A send / recv's side: "send", "recv", "" unknown (paired by order alone)."""


@dataclass(frozen=True, slots=True)
class Role:
    """One role's step: ``rank`` (the global rank the projection ran), its compute ``compute_ns``
    (ns, the step's compute with the calls' own time left out) and its ``calls`` in issue
    order."""

    rank: int
    compute_ns: float
    calls: tuple[Call, ...]


@dataclass(frozen=True, slots=True)
class Replay:
    """The replayed step: ``step_ns`` (the slowest role's), per role ``role_step_ns``; the
    communication ``comm_ns`` (sum of link times of the slowest role's calls) and its part
    under no compute, ``exposed_ns`` (step minus compute), and that part per mesh dimension
    ``exposed_by_dim_ns`` (each exposed stretch charged to the calls that end it);
    ``outside``: link look-ups outside the measured sizes (kind, bytes), flagged."""

    step_ns: float
    role_step_ns: dict[int, float]
    comm_ns: float
    exposed_ns: float
    exposed_by_dim_ns: dict[str, float]
    outside: list[tuple[str, int]] = field(default_factory=list)


LinkTime = Callable[[Call], tuple[float, str]]
"""(time ns, "" or "below" / "above": outside the curve's measured sizes) of one call."""
ArrivalWait = Callable[[Call, float], float]
"""The arrival wait (ns) of a call after a compute segment (ns of the role's compute clock)."""


def replay(roles: list[Role], role_of: Callable[[int], int], link: LinkTime,
           *, compute_scale: float = 1.0, wait: ArrivalWait | None = None) -> Replay:
    """Replay one step of every role (module docstring). ``role_of(global rank)`` -> the rank
    of the role that rank plays (a rank in ``roles``); ``link(call)`` -> its time on the link;
    ``compute_scale`` multiplies every compute stretch (ranks sharing cores: the caller's);
    ``wait(call, segment_ns)`` -> its arrival wait, where ``segment_ns`` is the longest compute
    a member role ran since its previous call (None: no wait). Raises ``BadInput``
    (``not_a_trace``) when the calls cannot be matched across roles (a group's members issue
    different sequences: the projection's roles are not one job), and whatever ``link``
    raises (no curve for a group span)."""
    run = _Run(roles, _matching(roles, role_of), link, compute_scale, wait)
    while not all(run.done(r) for r in run.roles):
        moved = any([run.advance(r) for r in run.roles if not run.done(r)])
        if not run.settle() and not moved:
            raise BadInput("projection", "not_a_trace", "the roles' collective calls do not "
                           "match (a group's members issue different sequences)",
                           "project the roles of one job (tracer project)")
    while run.settle():  # calls the last roles issued at their very end
        pass
    if any(e is None for r in run.roles for e in run.ends[r]):
        raise BadInput("projection", "not_a_trace", "a collective call of the projection's "
                       "roles has no partner in the roles run",
                       "project the roles of one job (tracer project)")
    role_step = {r: run.finish(r) for r in run.roles}
    slow = max(role_step, key=lambda r: role_step[r])
    comm = sum(run.durations[key] for key, members in run.order.items()
               if any(m == slow for m, _ in members))
    compute = run.roles[slow].compute_ns * compute_scale
    return Replay(step_ns=role_step[slow], role_step_ns=role_step, comm_ns=comm,
                  exposed_ns=max(0.0, role_step[slow] - compute),
                  exposed_by_dim_ns=run.exposed[slow], outside=run.outside)


class _Run:
    """The replay's state: per role its clock, its compute clock (``at``: where in its own
    compute it is), the index of its next call, each call's issue and end time (None: not
    yet); per (role, process group) when its stream is free; each instance's link time."""

    def __init__(self, roles: list[Role], order: dict, link: LinkTime, scale: float,
                 wait: ArrivalWait | None = None):
        self.roles = {r.rank: r for r in roles}
        self.order, self.link, self.scale, self.wait = order, link, scale, wait
        self.nxt = {r.rank: 0 for r in roles}
        self.clock = {r.rank: 0.0 for r in roles}
        self.at = {r.rank: 0.0 for r in roles}
        self.ends: dict[int, list[float | None]] = {r.rank: [None] * len(r.calls) for r in roles}
        self.issued: dict[int, list[float | None]] = {r.rank: [None] * len(r.calls)
                                                      for r in roles}
        self.stream_free: dict[tuple, float] = {}
        self.durations: dict[tuple, float] = {}
        self.outside: list[tuple[str, int]] = []
        self.exposed: dict[int, dict[str, float]] = {r.rank: {} for r in roles}

    def done(self, rank: int) -> bool:
        return self.nxt[rank] > len(self.roles[rank].calls)

    def _expose(self, rank: int, dim: str, ns: float) -> None:
        self.exposed[rank][dim] = self.exposed[rank].get(dim, 0.0) + ns

    def advance(self, rank: int) -> bool:
        """Move ``rank`` through the waits due before its next issue (or its compute's end)
        and issue that call; False when a wait's call has not started yet."""
        role, i = self.roles[rank], self.nxt[rank]
        horizon = role.calls[i].issue_ns if i < len(role.calls) else role.compute_ns
        pending = sorted((role.calls[j].need_ns, j) for j in range(i)
                         if self.at[rank] <= role.calls[j].need_ns <= horizon)
        ends = self.ends[rank]
        if any(ends[j] is None for _, j in pending):
            return False
        t, at = self.clock[rank], self.at[rank]
        for need, j in pending:
            t += (need - at) * self.scale
            at = need
            if ends[j] > t:  # waiting for the call: exposed, charged to its dimension
                self._expose(rank, role.calls[j].dim, ends[j] - t)
                t = ends[j]
        t += (horizon - at) * self.scale
        self.clock[rank], self.at[rank] = t, horizon
        if i < len(role.calls):
            self.issued[rank][i] = t
        self.nxt[rank] = i + 1  # past the last call: done
        return True

    def settle(self) -> bool:
        """Start every call whose members have all issued it; True when one started."""
        started = False
        for key, members in self.order.items():
            if key in self.durations:
                continue
            times = [self.issued[m][k] for m, k in members]
            if any(x is None for x in times):
                continue
            call = self.roles[members[0][0]].calls[members[0][1]]
            dur, flag = self.link(call)
            if flag:
                self.outside.append((call.kind, call.nbytes))
            # one stream per process group; a send / recv per direction of its pair (a pipeline
            # sends activations forward while gradients come back)
            lane = key[1] if key[0] == "p2p" else ()
            streams = [(m, self.roles[m].calls[k].pg, lane) for m, k in members]
            arrive = max(times)
            if self.wait is not None:  # the group's last rank, late by a scheduler slice
                calls = [self.roles[m].calls for m, _ in members]
                segment = max(cs[k].issue_ns - (cs[k - 1].issue_ns if k else 0.0)
                              for cs, (_, k) in zip(calls, members))
                arrive += self.wait(call, segment)
            start = max(arrive, *(self.stream_free.get(s, 0.0) for s in streams))
            self.durations[key] = dur
            for (m, k), s in zip(members, streams):
                self.ends[m][k] = self.stream_free[s] = start + dur
            started = True
        return started

    def finish(self, rank: int) -> float:
        """The role's step: its compute's end, or its last call's end when later (that tail
        exposed, charged to the last call's dimension)."""
        ends = self.ends[rank]
        end = max([self.clock[rank], *ends])
        if end > self.clock[rank]:
            last = max(range(len(ends)), key=lambda j: ends[j])
            self._expose(rank, self.roles[rank].calls[last].dim, end - self.clock[rank])
        return end


def _matching(roles: list[Role], role_of: Callable[[int], int]
              ) -> dict[tuple, list[tuple[int, int]]]:
    """Each collective instance -> the (role rank, call index) that take part in it.

    A group's call is matched across the roles its members play by order: the k-th call of
    role a on group G is the k-th call on G of every other role with a member in G. A send
    from a to b is the k-th send a -> b and pairs with the k-th recv at b from a (pipeline
    schedules interleave the two directions: 1F1B); a send / recv of unknown direction pairs
    the k-th call of a to peer p with the k-th call of p's role to a's rank. Raises
    ``BadInput`` when a role's count differs from its partner's."""
    out: dict[tuple, list[tuple[int, int]]] = {}
    counts: dict[tuple, int] = {}
    for role in roles:
        for k, c in enumerate(role.calls):
            if c.kind == "send_recv" and c.peer >= 0:
                if c.direction:  # the k-th send a -> b is the k-th recv at b from a
                    pair = ((role.rank, role_of(c.peer)) if c.direction == "send"
                            else (role_of(c.peer), role.rank))
                    key0 = ("p2p", pair, c.direction)
                else:  # the other side plays role_of(peer); its peer is a rank of this role
                    pair = tuple(sorted((role.rank, role_of(c.peer))))
                    key0 = ("p2p", pair, role.rank)
                n = counts.get(key0, 0)
                counts[key0] = n + 1
                key = ("p2p", pair, n)
            else:
                members = tuple(sorted({role_of(m) for m in c.group})) or (role.rank,)
                key0 = ("coll", members, role.rank)
                n = counts.get(key0, 0)
                counts[key0] = n + 1
                key = ("coll", members, n)
            out.setdefault(key, []).append((role.rank, k))
    for key, members in out.items():
        want = set(key[1]) if key[0] == "p2p" else set(key[1])
        got = {m for m, _ in members}
        if got != want:
            raise BadInput("projection", "not_a_trace", f"collective {key[0]} #{key[2]} of "
                           f"roles {sorted(want)} was issued by roles {sorted(got)} only",
                           "project the roles of one job (tracer project)")
    return out
