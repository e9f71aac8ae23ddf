"""The lease table of one pool: queue, grant, release, shrink, heartbeat, expire.

A pure state machine. Every method takes `now` (epoch seconds) instead of reading a
clock, and returns the events it caused, so the controller (which persists them and
answers waiting drivers) and the simulator (which advances a simulated clock) drive the
very same code. Not thread-safe: one owner calls it (the controller's event loop).

A held lease may shrink (its tail gives GPUs back, which go to the waiters at once) and
grow (it takes free GPUs that no waiter asks for, never making anyone wait).

Scheduling: after every change the slice policy orders the waiting requests; they are
granted in that order while their GPUs are free. A request that does not fit reserves
its GPUs, so nothing later in the order overtakes it there (no starvation), while
requests on other GPUs of the pool still go ahead (a disaggregated job's rollout set and
trainer set are served independently).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from slurmrl.leases.types import (
    Event,
    Grant,
    Grown,
    JobSliceStats,
    Lease,
    Moved,
    PhaseRequest,
    PoolView,
    Released,
    Revoke,
    Shrunk,
)
from slurmrl.model import Phase

if TYPE_CHECKING:
    from policies.base import SlicePolicy


class LeaseError(ValueError):
    """A lease operation that cannot be done (unknown id, bad GPU set...)."""


@dataclass(frozen=True)
class TableState:
    """A `LeaseTable.checkpoint`."""

    gpus: frozenset[int]
    leases: Mapping[int, Lease]
    waiting: Mapping[int, PhaseRequest]
    stats: Mapping[int, JobSliceStats]
    window: Mapping[int, frozenset[int]]


class LeaseTable:
    """Leases and waiting phase requests of one pool's GPUs."""

    def __init__(
        self,
        pool_id: int,
        gpus: Iterable[int],
        policy: SlicePolicy,
        lease_timeout_s: float,
        new_id: Callable[[], int] | None = None,
    ) -> None:
        self.pool_id = pool_id
        self.gpus = frozenset(gpus)
        if not self.gpus:
            raise LeaseError("a pool needs at least one GPU")
        self.policy = policy
        self.lease_timeout_s = lease_timeout_s
        counter = itertools.count(1)
        self._new_id = new_id or (lambda: next(counter))
        self._leases: dict[int, Lease] = {}
        self._waiting: dict[int, PhaseRequest] = {}  # insertion order = arrival order
        self._stats: dict[int, JobSliceStats] = {}  #: with each member's max_slowdown
        self._window: dict[int, frozenset[int]] = {}  #: member -> the GPUs it may ask for
        self._cover: dict[int, int] | None = None  #: GPU -> windows covering it (cache)
        #: member -> the pool's GPUs in the order its shrunk lease keeps them (cache,
        #: cleared with `_cover`)
        self._keep: dict[int, tuple[int, ...]] = {}

    # -- reading -------------------------------------------------------------------
    @property
    def leases(self) -> tuple[Lease, ...]:
        return tuple(self._leases.values())

    @property
    def waiting(self) -> tuple[PhaseRequest, ...]:
        return tuple(self._waiting.values())

    def lease(self, lease_id: int) -> Lease | None:
        return self._leases.get(lease_id)

    def request_of(self, request_id: int) -> PhaseRequest | None:
        return self._waiting.get(request_id)

    def view(self, now: float) -> PoolView:
        return PoolView(self.pool_id, self.gpus, now, self.leases, self.waiting,
                        dict(self._stats))

    def next_deadline(self) -> float | None:
        """The earliest instant at which `expire` would change something."""
        deadlines = [x.deadline_at for x in self._leases.values()]
        deadlines += [x.deadline_at for x in self._waiting.values()]
        return min(deadlines, default=None)

    # -- changing ------------------------------------------------------------------
    def set_member(self, job_id: int, max_slowdown: float | None = None,
                   gpus: Iterable[int] | None = None) -> None:
        """Tell the table (and its slice policy) about a member job, and optionally the
        pool GPUs it was placed on (its window: `shrink` keeps a lease on the GPUs the
        other members' windows cover least)."""
        if gpus is not None:
            self._window[job_id] = frozenset(gpus)
            self._cover = None
        self._keep.clear()
        s = self._stats.get(job_id, JobSliceStats(job_id))
        self._stats[job_id] = replace(s, max_slowdown=max_slowdown)

    def request(
        self,
        job_id: int,
        phase: Phase,
        gpus: Iterable[int],
        now: float,
        min_gpus: int | None = None,
        request_id: int | None = None,
        options: Sequence[Iterable[int]] = (),
    ) -> tuple[PhaseRequest, list[Event]]:
        """Queue a phase request; returns it and the grants it (or others) got at once.
        With `options` (a floating pool's windows, in order of preference) it is granted
        the first of them that is wholly free, and `gpus` must be their union."""
        wanted = frozenset(gpus)
        alts = tuple(frozenset(o) for o in options)
        if not wanted:
            raise LeaseError("a phase request needs at least one GPU")
        if alts:
            if any(not o for o in alts) or frozenset().union(*alts) != wanted:
                raise LeaseError("a request's options must be non-empty GPU sets whose "
                                 "union is the GPUs it asks for")
            if min_gpus is not None:
                raise LeaseError("a request with options is granted one whole option: "
                                 "no min_gpus")
            min_gpus = min(len(o) for o in alts)
        if not wanted <= self.gpus:
            extra = sorted(wanted - self.gpus)
            raise LeaseError(f"GPUs {extra} are not in pool {self.pool_id}")
        need = len(wanted) if min_gpus is None else min_gpus
        if not 1 <= need <= len(wanted):
            raise LeaseError(f"min_gpus must be between 1 and {len(wanted)}, got {need}")
        for lease in self._leases.values():
            if lease.job_id == job_id and lease.gpus & wanted:
                raise LeaseError(
                    f"job {job_id} already holds GPUs {sorted(lease.gpus & wanted)} "
                    f"(lease {lease.lease_id}, {lease.phase}); release it first"
                )
        rid = self._new_id() if request_id is None else request_id
        if rid in self._waiting or rid in self._leases:
            raise LeaseError(f"request id {rid} is already in use")
        req = PhaseRequest(rid, job_id, phase, wanted, need, now, now + self.lease_timeout_s,
                           alts)
        self._waiting[rid] = req
        self._stats.setdefault(job_id, JobSliceStats(job_id))
        return req, self._schedule(now)

    def release(self, lease_id: int, now: float) -> list[Event]:
        """The job is done with the lease: its GPUs go to the next waiters at once."""
        lease = self._leases.pop(lease_id, None)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        self._account(lease, now)
        events: list[Event] = [Released(lease, now)]
        return events + self._schedule(now)

    def can_switch(self, lease_id: int, gpus: Iterable[int], now: float) -> bool:
        """Whether `switch` would take the lease to `gpus` at `now`: a held lease, not
        itself switched to (so a job with no gap between its phases cannot chain them
        and starve its partner), and `gpus` its own GPUs. On the whole pool that is
        all. On part of it (a disaggregated job's trainer set, a staggered pool's
        window) the job must also be the one behind: no member waiting for any of those
        GPUs has spent a larger share of its time in the pool waiting (`waited_share`,
        current waits and holds included). Unconditioned there, switching pairs fell into
        lockstep, one member never waiting while the other took all the contention
        (docs/benchmarks.md)."""
        lease = self._leases.get(lease_id)
        keep = frozenset(gpus)
        if lease is None or lease.switched or keep != lease.gpus:
            return False
        if keep == self.gpus:
            return True
        mine = self.waited_share(lease.job_id, now)
        return all(self.waited_share(r.job_id, now) <= mine for r in self._waiting.values()
                   if r.job_id != lease.job_id and r.gpus & keep)

    def waited_share(self, job_id: int, now: float) -> float:
        """The share of a member's time in the pool it spent waiting for leases, up to
        `now`: wait / (wait + held), its waiting requests and held leases counted so far
        (0 before it waited or held anything)."""
        s = self._stats.get(job_id, JobSliceStats(job_id))
        wait = s.wait_s + sum(max(0.0, now - r.requested_at)
                              for r in self._waiting.values() if r.job_id == job_id)
        held = s.held_s + sum(max(0.0, now - x.granted_at)
                              for x in self._leases.values() if x.job_id == job_id)
        return wait / (wait + held) if wait + held > 0 else 0.0

    def switch(self, lease_id: int, phase: Phase, gpus: Iterable[int] | None,
               now: float, request_id: int | None = None) -> tuple[Lease, list[Event]]:
        """End a held lease and grant its job's next phase on its GPUs (`gpus`, default
        the lease's; `can_switch` says where) at once, without queueing: a train that
        ends in a weight sync keeps its GPUs instead of waiting behind a partner's whole
        phase for them. It gives the job nothing it could not take by
        holding the lease longer (leases are cooperative), and the switch counts as a
        grant for the slice policy (round-robin then serves the partner first next
        time). The new lease's id is `request_id` (default a new one). Once per lease:
        a lease granted by a switch is released, not switched again."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        keep = lease.gpus if gpus is None else frozenset(gpus)
        if lease.switched:
            raise LeaseError(f"lease {lease_id} was switched to already: release it and "
                             "queue for the next phase")
        if keep != lease.gpus:
            raise LeaseError(
                f"lease {lease_id} cannot switch to GPUs {sorted(keep)}: a switch keeps "
                f"the lease's GPUs ({sorted(lease.gpus)}); release it and queue for the "
                "next phase")
        if not self.can_switch(lease_id, keep, now):
            raise LeaseError(
                f"lease {lease_id} cannot switch: it holds part of the pool "
                f"({sorted(lease.gpus)} of {sorted(self.gpus)}) and a member waiting for "
                "those GPUs has waited a larger share of its time; release it and queue "
                "for the next phase")
        rid = self._new_id() if request_id is None else request_id
        if rid in self._waiting or rid in self._leases:
            raise LeaseError(f"request id {rid} is already in use")
        del self._leases[lease_id]
        self._account(lease, now)
        new = Lease(rid, lease.job_id, phase, keep, now, now, now + self.lease_timeout_s,
                    switched=True)
        self._leases[rid] = new
        s = self._stats.get(lease.job_id, JobSliceStats(lease.job_id))
        self._stats[lease.job_id] = s.granted(now)
        return new, [Released(lease, now), Grant(new), *self._schedule(now)]

    def cancel(self, request_id: int, now: float) -> list[Event]:
        """Withdraw a waiting request (the driver gave up or disconnected)."""
        req = self._waiting.pop(request_id, None)
        if req is None:
            raise LeaseError(f"request {request_id} is not waiting")
        return [Revoke(None, req, "cancelled"), *self._schedule(now)]

    def shrink(self, lease_id: int, keep: int | None, now: float,
               gpus: Iterable[int] | None = None) -> list[Event]:
        """Give back all but `keep` GPUs of a held lease: it keeps those the fewest
        other members' windows cover (the GPUs nobody else can use), lowest first; or,
        given `gpus` (a rollout whose other replicas are done), exactly those."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        if gpus is not None:
            kept = frozenset(gpus)
            if not kept or not kept <= lease.gpus:
                raise LeaseError(f"a shrink keeps a non-empty subset of the lease's GPUs "
                                 f"{sorted(lease.gpus)}, got {sorted(kept)}")
            keep = len(kept)
        if keep is None or not 1 <= keep <= len(lease.gpus):
            raise LeaseError(f"keep must be between 1 and {len(lease.gpus)}, got {keep}")
        if keep == len(lease.gpus):
            return []
        if gpus is None:
            held = lease.gpus  # within the pool's GPUs (`check_table`), so all are ordered
            kept = frozenset(itertools.islice(
                (g for g in self._keep_order(lease.job_id) if g in held), keep))
        smaller = lease.with_gpus(kept)
        self._leases[lease_id] = smaller
        return [Shrunk(smaller, lease.gpus - kept), *self._schedule(now)]

    def grow(self, lease_id: int, gpus: Iterable[int], now: float) -> list[Event]:
        """Add to a held lease those of `gpus` that are free and that no waiting request
        asks for, so a grow never delays a waiter (a rollout started on part of its set
        taking back GPUs its partner left); `[]` when none is. Does not block."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        wanted = frozenset(gpus)
        if not wanted <= self.gpus:
            raise LeaseError(f"GPUs {sorted(wanted - self.gpus)} are not in pool {self.pool_id}")
        added = frozenset((wanted & self._free()).difference(
            *(req.gpus for req in self._waiting.values())))
        if not added:
            return []
        bigger = lease.with_gpus(lease.gpus | added)
        self._leases[lease_id] = bigger
        return [Grown(bigger, added)]

    def move(self, lease_id: int, gpus: Iterable[int], now: float) -> list[Event]:
        """Move a held lease onto `gpus`, no more GPUs than it holds, each its own or
        free (a rollout's tail packed beside another's in a floating pool, so that a
        whole window frees); what it leaves goes to the waiters at once."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        new = frozenset(gpus)
        if not new or len(new) > len(lease.gpus):
            raise LeaseError(f"a move takes 1 to {len(lease.gpus)} GPUs, got {sorted(new)}")
        if not new <= lease.gpus | self._free():
            raise LeaseError(f"GPUs {sorted(new - lease.gpus - self._free())} are not free")
        if new == lease.gpus:
            return []
        moved = lease.with_gpus(new)
        self._leases[lease_id] = moved
        return [Moved(moved, lease.gpus - new, new - lease.gpus), *self._schedule(now)]

    def pack_target(self, lease_id: int, keep: int, windows: Sequence[Iterable[int]],
                    unit: int = 1) -> frozenset[int] | None:
        """Where a floating pool's rollout tail of `keep` GPUs goes (`move` it there):
        `keep` GPUs of the window with the fewest GPUs free that has them, in free
        aligned blocks of `unit` GPUs (a rollout replica's), the lowest first, so that
        tails share windows and whole windows free for the other members' phases.
        None: the lease's own window is among the fullest, and the tail stays on it
        (a `shrink`, to the GPUs it chooses). Pure: changes nothing."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        if unit < 1 or keep < 1 or keep % unit or keep > len(lease.gpus):
            raise LeaseError(f"a tail keeps 1 to {len(lease.gpus)} GPUs in blocks of {unit}, "
                             f"got {keep}")
        taken: set[int] = set().union(*(x.gpus for x in self._leases.values()
                                        if x.lease_id != lease_id))
        fits = []
        for w in windows:
            gpus = sorted(w)
            blocks = [gpus[i:i + unit] for i in range(0, len(gpus) - unit + 1, unit)]
            free = [b for b in blocks if not taken.intersection(b)]
            if len(free) * unit >= keep:
                own = bool(lease.gpus.intersection(gpus))
                fits.append((len(free), not own, gpus[0], free))
        if not fits:
            return None
        _, moves, _, free = min(fits)
        return frozenset(g for b in free[:keep // unit] for g in b) if moves else None

    def add_gpus(self, gpus: Iterable[int], now: float, window: bool = False) -> list[Event]:
        """The pool grew (a floating pool took another window from Slurm). `window`: the
        GPUs are one more window, which every waiting request of whole windows of its
        size may now be granted too (a request names every window)."""
        new = frozenset(gpus)
        if not new or new & self.gpus:
            raise LeaseError(f"GPUs to add must be new to pool {self.pool_id}, got "
                             f"{sorted(new)}")
        self.gpus |= new
        self._keep.clear()
        if window:
            for rid, req in list(self._waiting.items()):
                if req.options and all(len(o) == len(new) for o in req.options):
                    self._waiting[rid] = replace(req, gpus=req.gpus | new,
                                                 options=(*req.options, new))
        return self._schedule(now)

    def retire(self, gpus: Iterable[int], now: float) -> list[Event]:
        """The pool gives free GPUs back to Slurm. Waiting requests keep their other
        options; one that would be left with nothing refuses the retirement."""
        gone = frozenset(gpus)
        self._waiting = self._without(gone)
        self.gpus -= gone
        for job_id, window in list(self._window.items()):
            self._window[job_id] = window - gone
        self._cover = None
        self._keep.clear()
        return self._schedule(now)

    def can_retire(self, gpus: Iterable[int]) -> bool:
        """Whether `retire(gpus)` would succeed now (it changes nothing)."""
        try:
            self._without(frozenset(gpus))
        except LeaseError:
            return False
        return True

    def _without(self, gone: frozenset[int]) -> dict[int, PhaseRequest]:
        """The waiting requests as they would be without `gone`; LeaseError when a lease
        holds one of them, one is not in the pool, or a waiter could use only them."""
        if not gone <= self._free():
            raise LeaseError(f"GPUs {sorted(gone - self._free())} are held or not in the pool")
        kept: dict[int, PhaseRequest] = {}
        for rid, req in self._waiting.items():
            if not req.gpus & gone:
                kept[rid] = req
                continue
            alts = tuple(o for o in req.options if not o & gone)
            if not alts:
                raise LeaseError(f"request {rid} waits for GPUs {sorted(req.gpus & gone)}")
            kept[rid] = replace(req, gpus=frozenset().union(*alts), options=alts,
                                min_gpus=min(len(o) for o in alts))
        return kept

    def heartbeat(self, job_id: int, now: float) -> int:
        """Renew every lease and waiting request of `job_id`; returns how many."""
        deadline = now + self.lease_timeout_s
        n = 0
        for lid, lease in list(self._leases.items()):
            if lease.job_id == job_id:
                self._leases[lid] = replace(lease, deadline_at=deadline)
                n += 1
        for rid, req in list(self._waiting.items()):
            if req.job_id == job_id:
                self._waiting[rid] = replace(req, deadline_at=deadline)
                n += 1
        return n

    def expire(self, now: float) -> list[Event]:
        """Revoke leases and drop waiters whose deadline has passed."""
        events: list[Event] = []
        for lid, lease in list(self._leases.items()):
            if lease.deadline_at <= now:
                del self._leases[lid]
                self._account(lease, now)
                events.append(Revoke(lease, None, "expired"))
        for rid, req in list(self._waiting.items()):
            if req.deadline_at <= now:
                del self._waiting[rid]
                events.append(Revoke(None, req, "expired"))
        return events + self._schedule(now) if events else events

    def remove_job(self, job_id: int, now: float, reason: str) -> list[Event]:
        """The job left the pool (ended, cancelled): revoke all it holds or waits for."""
        events: list[Event] = []
        for lid, lease in list(self._leases.items()):
            if lease.job_id == job_id:
                del self._leases[lid]
                self._account(lease, now)
                events.append(Revoke(lease, None, reason))
        for rid, req in list(self._waiting.items()):
            if req.job_id == job_id:
                del self._waiting[rid]
                events.append(Revoke(None, req, reason))
        self._stats.pop(job_id, None)
        self._window.pop(job_id, None)
        self._cover = None
        self._keep.clear()
        return events + self._schedule(now)

    def close(self, now: float, reason: str) -> list[Event]:
        """The pool is gone: revoke every waiting request, then every lease, granting
        nothing (a waiter must not be handed GPUs of a pool being closed)."""
        events: list[Event] = [Revoke(None, req, reason) for req in self._waiting.values()]
        self._waiting.clear()
        for lease in self._leases.values():
            self._account(lease, now)
            events.append(Revoke(lease, None, reason))
        self._leases.clear()
        return events

    def checkpoint(self) -> TableState:
        """The table's state now, for `rollback` (leases, requests and stats are
        immutable: copies of the maps hold it)."""
        return TableState(self.gpus, dict(self._leases), dict(self._waiting),
                          dict(self._stats), dict(self._window))

    def rollback(self, state: TableState) -> None:
        """Back to a `checkpoint`: a change the database did not keep is undone here."""
        self.gpus = state.gpus
        self._leases, self._waiting = dict(state.leases), dict(state.waiting)
        self._stats, self._window = dict(state.stats), dict(state.window)
        self._cover = None
        self._keep.clear()

    def restore(self, leases: Sequence[Lease], waiting: Sequence[PhaseRequest],
                stats: Sequence[JobSliceStats] = ()) -> None:
        """Load state persisted before a restart, with the members' slice history
        (`stats`: what the policy orders by). Refuses anything that double-grants."""
        if self._leases or self._waiting:
            raise LeaseError("restore needs an empty table")
        for st in stats:
            self._stats[st.job_id] = replace(
                st, max_slowdown=self._stats.get(st.job_id, st).max_slowdown)
        for lease in leases:
            self._leases[lease.lease_id] = lease
            self._stats.setdefault(lease.job_id, JobSliceStats(lease.job_id))
        for req in sorted(waiting, key=lambda r: (r.requested_at, r.request_id)):
            self._waiting[req.request_id] = req
            self._stats.setdefault(req.job_id, JobSliceStats(req.job_id))
        from slurmrl.leases.invariants import check_table

        check_table(self)

    # -- internals -----------------------------------------------------------------
    def _account(self, lease: Lease, now: float) -> None:
        s = self._stats.get(lease.job_id, JobSliceStats(lease.job_id))
        self._stats[lease.job_id] = s.held(max(0.0, now - lease.granted_at))

    def _coverage(self) -> dict[int, int]:
        """How many members' windows cover each GPU (cached until a window changes)."""
        if self._cover is None:
            cover: dict[int, int] = {}
            for window in self._window.values():
                for g in window:
                    cover[g] = cover.get(g, 0) + 1
            self._cover = cover
        return self._cover

    def _keep_order(self, job_id: int) -> tuple[int, ...]:
        """The pool's GPUs in the order a shrink keeps the member's: those the fewest
        other members' windows cover first (its own window's count as one fewer), lowest
        first among equals."""
        order = self._keep.get(job_id)
        if order is None:
            cover = self._coverage()
            mine = self._window.get(job_id, frozenset())
            order = self._keep[job_id] = tuple(sorted(
                self.gpus, key=lambda g: (cover.get(g, 0) - (g in mine), g)))
        return order

    def _schedule(self, now: float) -> list[Event]:
        # a grant updates the member's slice stats, and a policy may order by them
        # (round-robin does): a waiter that was behind the granted job's other request
        # can now come first with its GPUs free. Pass again until a pass grants nothing
        # (each grant removes a waiter, so this ends).
        events: list[Event] = []
        while True:
            granted = self._schedule_pass(now)
            if not granted:
                return events
            events.extend(granted)

    def _free(self) -> set[int]:
        """The pool's GPUs that no lease holds."""
        return set(self.gpus).difference(*(lease.gpus for lease in self._leases.values()))

    def _schedule_pass(self, now: float) -> list[Event]:
        if not self._waiting:
            return []
        if len(self._waiting) == 1:  # one waiter is its own order: no policy to ask
            order = list(self._waiting.values())
        else:
            ids = [r.request_id for r in self.policy.order(self.view(now))]
            if len(ids) != len(self._waiting) or self._waiting.keys() != set(ids):
                raise LeaseError(
                    f"slice policy {self.policy.name!r} must order every waiting request "
                    "once")
            # the table's own requests, in that order: a policy orders them, never edits
            order = [self._waiting[i] for i in ids]
        free = self._free()
        reserved: set[int] = set()
        events: list[Event] = []
        for req in order:
            avail = (req.gpus & free) - reserved
            take = frozenset(avail) if len(avail) >= req.min_gpus else frozenset()
            if req.options:
                take = next((o for o in req.options if o <= avail), frozenset())
            if take:
                del self._waiting[req.request_id]
                lease = Lease(
                    req.request_id, req.job_id, req.phase, take, req.requested_at, now,
                    now + self.lease_timeout_s,
                )
                self._leases[lease.lease_id] = lease
                free -= take
                s = self._stats.get(req.job_id, JobSliceStats(req.job_id))
                self._stats[req.job_id] = s.granted(now, lease.wait_s)
                events.append(Grant(lease))
            else:
                reserved |= req.gpus
            if not free - reserved:
                break
        return events
