"""The lease scheduler: one `LeaseTable` per pool, persisted, with waiting drivers.

Every change goes table -> events -> one DB transaction -> futures of waiting drivers,
all inside one synchronous call on the event loop, so no other request interleaves and
a grant is durable before any driver hears of it. A change is all or nothing
(`_change`): should its transaction roll back (the slice policy raised, a DB error),
the pool's table goes back to its state before it, and no driver, grant hook or metric
hears of it. A timer task expires lapsed leases.
With `check_invariants` (tests, `--debug-invariants`) every table is checked after
every event (`slurmrl.leases.invariants.check_table`).

Restart: `restore()` loads held leases and waiting requests of every open pool from the
DB, and each member's slice history from its leases there (grants, the last one, time
waited and held: a slice policy orders by it) and, in a floating pool, the window of its
newest lease (its requests' first choice). Held leases and waiting requests keep their
deadline, or one lease timeout from the restart where that is later: drivers retry
their heartbeats while the controller is away (`retry_for_s`), so a lease that lapsed
only because nobody could renew it is not revoked at once; one whose driver does not
heartbeat the new process within that lapses then (and is charged until then); waiting
requests keep their arrival order.
`LeaseTable.restore` refuses a state that double-grants. A held lease granted by a
switch stays one (it is not switched again): the lease the switch ended names it in its
reason (`SWITCHED_TO`).

Known limits: a lease lives in one pool (a job never migrates); one process owns the DB.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from policies.base import SlicePolicy
from slurmrl.controller.metrics import Metrics
from slurmrl.db import JobRecord, Store
from slurmrl.leases import LeaseError, LeaseTable
from slurmrl.leases.invariants import check_table
from slurmrl.leases.types import (
    Event,
    Grant,
    Grown,
    JobSliceStats,
    Lease,
    Moved,
    Released,
    Revoke,
    Shrunk,
)
from slurmrl.model import LeaseState, Phase

log = logging.getLogger(__name__)


class RequestEnded(Exception):
    """A waiting request was cancelled or revoked before it was granted."""

    def __init__(self, request_id: int, state: LeaseState, reason: str) -> None:
        super().__init__(f"request {request_id} {state}: {reason}")
        self.request_id, self.state, self.reason = request_id, state, reason


class CutsAService(LeaseError):
    """A shrink that would keep part of one of the job's services (the caller's mistake:
    the GPUs given back would still hold it); nothing changed."""


@dataclass(frozen=True)
class Ticket:
    """The answer to `request`: granted at once (`lease`) or queued (`lease is None`)."""

    request_id: int
    lease: Lease | None


GrantHook = Callable[[int, Lease], None]
#: the reason recorded with a lease ended by a switch, naming the lease it became; a
#: restart reads it back to know which held leases came from a switch (`restore`)
SWITCHED_TO = "switched to lease {}"
#: seconds before a pool whose lease expiry failed is tried again
EXPIRY_RETRY_S = 1.0
_SWITCHED_TO = re.compile(r"switched to lease (\d+)")


class LeaseScheduler:
    """Leases of every open pool. Call from the event loop only."""

    def __init__(
        self,
        store: Store,
        policy: Callable[[], SlicePolicy],
        lease_timeout_s: float,
        *,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        check_invariants: bool = False,
        slowdown_limit: Callable[[float | None], float | None] = lambda own: own,
    ) -> None:
        """`slowdown_limit`: the limit the slice policy is told for a job's own
        `--rl-max-slowdown` (None where it set none): the site's cap and default, as
        admission and pairing take it."""
        self.store = store
        self.slowdown_limit = slowdown_limit
        self._policy = policy
        self.lease_timeout_s = lease_timeout_s
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.check_invariants = check_invariants
        self.tables: dict[int, LeaseTable] = {}
        self._pool_of_request: dict[int, int] = {}
        self._futures: dict[int, asyncio.Future[Lease]] = {}
        self._waiters: dict[int, int] = {}  # request id -> drivers long-polling on it
        self._wake = asyncio.Event()
        #: pool -> when its failed expiry is tried again (`expire`)
        self._expiry_failed: dict[int, float] = {}
        #: leases granted by this process and never shrunk: their GPU-seconds are
        #: GPUs x held time, no need to sum their lease_gpus rows at the end
        self._whole: set[int] = set()
        #: called after every grant is committed (pool manager: make residency fit)
        self.grant_hooks: list[GrantHook] = []
        #: called after every revoke of a held lease is committed (expiry, the job's end,
        #: its pool's close): the lease as it was held
        self.revoke_hooks: list[GrantHook] = []
        #: set at shutdown: cancelled long polls then keep their requests for the restart
        self.stopping = False
        #: floating pool id -> its window size G (its members' GPU count)
        self._window_size: dict[int, int] = {}
        #: (pool id, job id) -> the first GPU of the window the job's last lease held
        self._last_window: dict[tuple[int, int], int] = {}

    # -- pools -----------------------------------------------------------------------------
    def open_pool(self, pool_id: int, gpus: int | Iterable[int],
                  window: int | None = None) -> None:
        """Start scheduling a pool's GPUs 0..gpus-1, or those listed (idempotent).
        `window`: a floating pool's window size G (its windows are GPUs w*G .. w*G+G-1;
        a window given back leaves a gap)."""
        if pool_id not in self.tables:
            self.tables[pool_id] = LeaseTable(
                pool_id, range(gpus) if isinstance(gpus, int) else gpus, self._policy(),
                self.lease_timeout_s)
        if window is not None:
            self._window_size[pool_id] = window

    def windows(self, pool_id: int) -> list[frozenset[int]]:
        """A floating pool's windows now (empty for a pool of fixed windows)."""
        g = self._window_size.get(pool_id)
        table = self.tables.get(pool_id)
        if g is None or table is None:
            return []
        return [frozenset(range(w, w + g)) for w in sorted(table.gpus) if w % g == 0]

    def add_gpus(self, pool_id: int, gpus: Iterable[int]) -> None:
        """A floating pool took another window: schedule its GPUs too."""
        now = self.clock()
        with self._change(pool_id):
            self._apply(pool_id, self.tables[pool_id].add_gpus(
                gpus, now, window=pool_id in self._window_size), now)
        self._wake.set()

    def retire(self, pool_id: int, gpus: Iterable[int]) -> None:
        """A floating pool gives a free window back (`LeaseTable.retire`: a `LeaseError`,
        and nothing changes, while a lease holds it or a waiter could use only it)."""
        now = self.clock()
        with self._change(pool_id):
            self._apply(pool_id, self.tables[pool_id].retire(gpus, now), now)

    def can_retire(self, pool_id: int, gpus: Iterable[int]) -> bool:
        """Whether `retire` would give those GPUs back now (nothing changes)."""
        table = self.tables.get(pool_id)
        return table is not None and table.can_retire(gpus)

    def close_pool(self, pool_id: int, reason: str = "pool-lost",
                   at: float | None = None, lost: Mapping[int, float] | None = None) -> None:
        """Revoke everything in the pool and stop scheduling it; its leases end `at`
        (a lost allocation's end; default now), none before it was granted. `lost`:
        pool GPU -> when its allocation ended, if before (a floating pool's lost
        window): a lease holding any of them ends at the first of those."""
        table = self.tables.get(pool_id)
        if table is None:
            return
        now = self.clock() if at is None else min(at, self.clock())
        ends = lost or {}

        def end(ev: Event) -> float:
            gpus = ev.lease.gpus if isinstance(ev, Revoke) and ev.lease is not None else ()
            return min([now, *(ends[g] for g in gpus if g in ends)])

        with self._change(pool_id):
            # waiters first: none is granted GPUs of the pool being closed
            for when, events in itertools.groupby(table.close(now, reason), key=end):
                self._apply(pool_id, events, when)
        del self.tables[pool_id]
        self._window_size.pop(pool_id, None)

    def add_member(self, pool_id: int, job_id: int, max_slowdown: float | None,
                   gpus: Sequence[int] | None = None) -> None:
        """A job joined the pool, on pool GPUs `gpus` (its window; None: not given);
        `max_slowdown`: its own `--rl-max-slowdown`."""
        self.tables[pool_id].set_member(job_id, self.slowdown_limit(max_slowdown), gpus)

    def restore(self) -> int:
        """Load every open pool's leases and waiters from the DB; returns how many."""
        n = 0
        grace = self.clock() + self.lease_timeout_s  # drivers could not renew meanwhile
        for pool in self.store.pools(open_only=True):
            if pool.state != "open":
                continue
            members = self.store.jobs(active=True, pool_id=pool.pool_id)
            recorded = self.store.windows(pool.pool_id) if pool.floating else []
            size = len(recorded[0].gpu_indices) if recorded else None  # its window size
            self.open_pool(pool.pool_id, pool.gpus if size is None else [
                w.window * size + i for w in recorded for i in range(size)], size)
            held, waiting = self.store.open_state(pool.pool_id)
            held = [replace(x, deadline_at=max(x.deadline_at, grace)) for x in held]
            waiting = [replace(r, deadline_at=max(r.deadline_at, grace)) for r in waiting]
            if size is not None:  # a request's options are not stored: every window now,
                # those it named first (a window added after it was made is one too)
                wins = self.windows(pool.pool_id)
                waiting = [replace(r, gpus=frozenset().union(*alts), options=alts,
                                   min_gpus=size)
                           for r in waiting if any(w & r.gpus for w in wins)
                           for alts in [_named_first(wins, r.gpus)]]
            switched = self._switched_to(pool.pool_id) if held else set()
            held = [replace(x, switched=x.lease_id in switched) for x in held]
            table = self.tables[pool.pool_id]
            table.restore(held, waiting, self._history(pool.pool_id, members, size))
            for job in members:
                table.set_member(job.job_id, self.slowdown_limit(job.request.max_slowdown),
                                 None if size is not None else job.pool_gpus or None)
            for req in waiting:
                self._pool_of_request[req.request_id] = pool.pool_id
            for lease in held:
                self._pool_of_request[lease.lease_id] = pool.pool_id
            n += len(held) + len(waiting)
        self._count_waiting()
        self._wake.set()
        return n

    def _history(self, pool_id: int, members: Sequence[JobRecord],
                 window: int | None) -> list[JobSliceStats]:
        """Each member's slice history in the pool as its leases in the DB tell it (what
        the table kept before the restart: grants, the last one, time waited for them
        and time held; a slice policy orders by it), and, in a floating pool, the window
        its newest lease held (its request's first choice: its services there are the
        ones active)."""
        ids = {j.job_id for j in members}
        out: dict[int, JobSliceStats] = {}
        newest: dict[int, tuple[float, int]] = {}
        for r in self.store.leases(pool_id=pool_id):
            if r.job_id not in ids or r.granted_at is None:
                continue
            s = out.get(r.job_id, JobSliceStats(r.job_id))
            ended = r.released_at is not None and r.state is not LeaseState.HELD
            out[r.job_id] = replace(
                s, grants=s.grants + 1,
                last_grant_at=max(s.last_grant_at or r.granted_at, r.granted_at),
                wait_s=s.wait_s + max(0.0, r.granted_at - r.requested_at),
                held_s=s.held_s + (max(0.0, r.released_at - r.granted_at)
                                   if ended and r.released_at is not None else 0.0))
            if window is not None and r.gpus and r.granted_at >= newest.get(
                    r.job_id, (-1.0, 0))[0]:
                newest[r.job_id] = (r.granted_at, min(r.gpus) // window * window)
        for job_id, (_, first) in newest.items():
            self._last_window[(pool_id, job_id)] = first
        return list(out.values())

    def _switched_to(self, pool_id: int) -> set[int]:
        """Ids of the pool's leases granted by a switch (their `Lease.switched` is not a
        column: the lease a switch ended names them in its reason)."""
        return {int(m.group(1)) for x in self.store.leases(pool_id=pool_id)
                if x.state is LeaseState.RELEASED and (m := _SWITCHED_TO.fullmatch(x.reason))}

    # -- driver operations ----------------------------------------------------------------
    def request(self, job: JobRecord, phase: Phase, min_gpus: int | None = None) -> Ticket:
        """Queue a phase request of a placed job; grants it at once if its GPUs are free."""
        if job.pool_id is None or job.pool_id not in self.tables:
            raise LeaseError(f"job {job.job_id} is not placed in an open pool yet")
        if job.state.terminal:  # the caller's record, read fresh (Api.acquire_op)
            raise LeaseError(f"job {job.job_id} has ended ({job.state}): no new request")
        if not phase.needs_gpu:
            raise LeaseError(f"phase {phase} needs no GPU; report it as an observation")
        table = self.tables[job.pool_id]
        refused = self.min_gpus_refusal(job, phase, min_gpus)
        if refused:
            raise LeaseError(refused)
        options = self._options(job)
        wanted = frozenset().union(*options) if options else job.pool_gpus_for(phase)
        need = len(wanted) if min_gpus is None else min_gpus
        now = self.clock()
        with self._change(job.pool_id):
            rid = self.store.add_request(
                pool_id=job.pool_id, job_id=job.job_id, phase=phase, wanted=wanted,
                min_gpus=job.request.gpus if options else need, requested_at=now,
                deadline_at=now + self.lease_timeout_s)
            _, events = table.request(job.job_id, phase, wanted, now,
                                      None if options else need, request_id=rid,
                                      options=options)
            self._pool_of_request[rid] = job.pool_id
            self._apply(job.pool_id, events, now)
        self._wake.set()
        return Ticket(rid, table.lease(rid))

    def min_gpus_refusal(self, job: JobRecord, phase: Phase, min_gpus: int | None) -> str:
        """Why a `phase` request of `job` cannot have `min_gpus` ("" if it can): it is 1 to
        the phase's GPUs, and in a floating pool a whole window (the job's GPUs) or None.
        Before placement the pool is not known: at most the job's GPUs, as in any pool.
        Where the job's services run (the DB lists them), a phase runs only on all of a
        service's GPUs: its whole set, or whole replicas for a rollout run as replicas
        (`services.rollout_replica_gpus`: one rollout service per replica)."""
        if min_gpus is None:
            return ""
        g = job.request.gpus
        if job.pool_id is not None and self.windows(job.pool_id):
            return "" if min_gpus == g else (
                f"min_gpus: job {job.job_id} is in a floating pool, whose leases are whole "
                f"windows of {g} GPUs: no min_gpus (null or {g}), got {min_gpus}")
        most = g if job.pool_id is None else len(job.request.gpus_for(phase))
        if not 1 <= min_gpus <= most:
            return f"min_gpus must be between 1 and {most}, got {min_gpus}"
        if job.pool_id is None or min_gpus == most:
            return ""
        sets = self._service_sets(job, phase)
        if not sets:  # none run (an admin-attached pool's job): any part of the set
            return ""
        if len(sets) == 1:
            why = " (a rollout does only as replicas: services.rollout_replica_gpus)" if (
                phase is Phase.ROLLOUT) else ""
            return (f"min_gpus: job {job.job_id}'s {phase} services span all {most} GPUs of "
                    f"the phase and cannot run on part of them{why}: no min_gpus (null or "
                    f"{most}), got {min_gpus}")
        unit = len(sets[0])
        return "" if min_gpus % unit == 0 else (
            f"min_gpus: job {job.job_id}'s rollout runs as replicas of {unit} GPUs "
            f"(services.rollout_replica_gpus), so a lease holds whole replicas: a multiple "
            f"of {unit}, got {min_gpus}")

    def _service_sets(self, job: JobRecord, phase: Phase) -> list[frozenset[int]]:
        """The pool GPU sets a `phase` lease of `job` holds all or none of: where the job's
        services run (the DB lists them), each replica's of a rollout run as replicas
        (`services.rollout_replica_gpus`: one rollout service per replica), else the
        phase's whole set (one engine, a trainer: a service cannot run on part of its
        GPUs); none where none runs (an admin-attached pool's job: any part will do)."""
        services = [s for s in self.store.services(job_id=job.job_id, live_only=True)
                    if s.pool_id == job.pool_id]
        if not services:
            return []
        replicas = [frozenset(s.gpus) for s in services if s.role == "rollout"]
        if phase is Phase.ROLLOUT and len(replicas) >= 2:
            return replicas
        return [job.pool_gpus_for(phase)]

    async def wait(self, request_id: int, timeout_s: float,
                   withdraw_on_cancel: bool | Callable[[], bool] = True) -> Lease | None:
        """Wait up to `timeout_s` for a grant; None if still waiting then.

        Raises `RequestEnded` if the request was cancelled or revoked meanwhile. If the
        caller is cancelled (its driver disconnected) and nobody else waits on the
        request, the request is withdrawn, unless `withdraw_on_cancel` is (or, called
        then, answers) False: a read that long-polls (`GET .../leases/{id}?wait_s=`
        changes nothing), a stream the controller closed (its driver reopens it).
        """
        pool_id = self._pool_of_request.get(request_id)
        table = self.tables.get(pool_id) if pool_id is not None else None
        if table is None:
            raise LeaseError(f"request {request_id} is not open")
        held = table.lease(request_id)
        if held is not None:
            return held
        if table.request_of(request_id) is None:
            raise LeaseError(f"request {request_id} is not open")
        fut = self._futures.get(request_id)
        if fut is None or fut.done():
            fut = asyncio.get_running_loop().create_future()
            self._futures[request_id] = fut
        # a reader (withdraw_on_cancel False) is no waiter whose presence keeps the
        # request queued when its acquirer goes
        counted = withdraw_on_cancel is not False
        if counted:
            self._waiters[request_id] = self._waiters.get(request_id, 0) + 1
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            return None
        except asyncio.CancelledError:
            alone = self._waiters.get(request_id, 0) <= 1
            withdraw = (withdraw_on_cancel() if callable(withdraw_on_cancel)
                        else withdraw_on_cancel)
            if (withdraw and alone and not self.stopping
                    and table.request_of(request_id)):
                self.cancel(request_id, "driver disconnected")
            raise
        finally:
            if counted:
                left = self._waiters.get(request_id, 1) - 1
                if left:
                    self._waiters[request_id] = left
                else:
                    self._waiters.pop(request_id, None)

    def cancel(self, request_id: int, reason: str = "cancelled") -> None:
        pool_id = self._pool_of_request[request_id]
        now = self.clock()
        with self._change(pool_id):
            events = self.tables[pool_id].cancel(request_id, now)
            self._apply(pool_id, events, now, cancel_reason=reason)

    def withdraw(self, job: JobRecord, request_id: int) -> bool:
        """Cancel the job's request if it is still waiting (its driver gave up on it);
        False if it is not a waiting request of the job."""
        pool_id = self._pool_of_request.get(request_id)
        table = self.tables.get(pool_id) if pool_id is not None else None
        req = table.request_of(request_id) if table is not None else None
        if req is None or req.job_id != job.job_id:
            return False
        self.cancel(request_id, "withdrawn by the driver")
        return True

    def release(self, job: JobRecord, lease_id: int, timing: dict[str, Any],
                now: float | None = None) -> Lease:
        """End a held lease (at `now`, default the clock); its GPUs go to the next
        waiters at once. Returns the lease as it was held."""
        table = self._table_of(job, lease_id)
        lease = table.lease(lease_id)
        if lease is None:
            raise LeaseError(f"lease {lease_id} is not held")
        now = self.clock() if now is None else now
        with self._change(table.pool_id):
            self._apply(table.pool_id, table.release(lease_id, now), now, timing=timing)
        return lease

    def switch(self, job: JobRecord, lease_id: int, phase: Phase, timing: dict[str, Any],
               now: float | None = None) -> Lease:
        """End the job's held lease (at `now`, default the clock) and grant its next
        `phase` at once on the GPUs that phase runs on (`LeaseTable.switch`): a
        train that ends in a weight sync keeps its GPUs instead of queueing behind its
        partner for them. The next phase runs on exactly the lease's GPUs; on part of
        the pool the job must be the member behind (`LeaseTable.can_switch`); and once:
        a lease granted by a switch is released, not switched. Any other case is a
        `LeaseError` saying why, and nothing changes. Returns the new lease."""
        table = self._table_of(job, lease_id)
        lease = table.lease(lease_id)
        assert lease is not None
        if not phase.needs_gpu:
            raise LeaseError(f"phase {phase} needs no GPU; release lease {lease_id} and "
                             "report it as an observation")
        if phase is lease.phase:
            raise LeaseError(f"lease {lease_id} is a {phase} lease already")
        # a floating member's next phase runs on the window its lease holds
        options = self._options(job)
        if options and lease.gpus not in options:
            raise LeaseError(f"lease {lease_id} holds part of a window ({sorted(lease.gpus)}: "
                             f"a packed rollout tail); release it and acquire {phase}")
        wanted = lease.gpus if options else job.pool_gpus_for(phase)
        if wanted != lease.gpus:
            raise LeaseError(
                f"job {job.job_id}'s {phase} phase runs on pool GPUs {sorted(wanted)}, and "
                f"lease {lease_id} ({lease.phase}) holds {sorted(lease.gpus)}: a switch "
                f"keeps the lease's GPUs; release it and acquire {phase}")
        if lease.switched:
            raise LeaseError(f"lease {lease_id} was granted by a switch: a lease switches "
                             f"once; release it and acquire {phase}")
        for req in table.waiting:
            if req.job_id == job.job_id and req.phase is phase:
                raise LeaseError(f"job {job.job_id} has a {phase} request waiting "
                                 f"({req.request_id}); release that first")
        now = self.clock() if now is None else now
        if not table.can_switch(lease_id, wanted, now):
            raise LeaseError(
                f"lease {lease_id} holds part of the pool ({sorted(lease.gpus)} of "
                f"{sorted(table.gpus)}), and a member waiting for those GPUs has waited a "
                f"larger share of its time than job {job.job_id}: it goes first; release "
                f"the lease and acquire {phase}")
        with self._change(table.pool_id):
            rid = self.store.add_request(
                pool_id=table.pool_id, job_id=job.job_id, phase=phase, wanted=wanted,
                min_gpus=len(wanted), requested_at=now, deadline_at=now + self.lease_timeout_s)
            new, events = table.switch(lease_id, phase, wanted, now, request_id=rid)
            self._pool_of_request[rid] = table.pool_id
            self._apply(table.pool_id, events, now, timing=timing,
                        release_reason=SWITCHED_TO.format(rid))
        self._wake.set()
        return new

    def shrink(self, job: JobRecord, lease_id: int, keep: int | None = None,
               local_gpus: Sequence[int] | None = None) -> Lease:
        """Keep `keep` GPUs of the lease (the table picks which), or exactly the job-local
        `local_gpus` (a rollout keeping the GPUs of its replicas still generating). Where
        the job's services run, a shrink keeps whole services (`_service_sets`), `keep`
        picking them as the table would; one that cannot is `CutsAService`, and nothing
        changes: the GPUs it freed would still hold a service of the job."""
        table = self._table_of(job, lease_id)
        self._whole_windows(table.pool_id, "shrink")
        now = self.clock()
        gpus: Collection[int] | None = (None if local_gpus is None
                                        else _pool_gpus(job, local_gpus))
        held = table.lease(lease_id)
        assert held is not None
        if gpus is not None and not (gpus and set(gpus) <= held.gpus):
            # said in the caller's job-local numbers, not the pool's
            raise LeaseError(f"a shrink keeps a non-empty subset of the lease's GPUs "
                             f"{_local(job, held.gpus)} (job-local), got "
                             f"{sorted(set(local_gpus or ()))}")
        sets = self._service_sets(job, held.phase)
        n = keep if gpus is None else len(set(gpus))
        if sets and n is not None and 1 <= n < len(held.gpus):  # it gives GPUs back
            gpus = self._whole_services(job, held, sets, n, gpus)
        with self._change(table.pool_id):
            self._apply(table.pool_id, table.shrink(lease_id, keep, now, gpus=gpus), now)
        lease = table.lease(lease_id)
        assert lease is not None
        return lease

    def _whole_services(self, job: JobRecord, held: Lease, sets: Sequence[frozenset[int]],
                        keep: int, gpus: Collection[int] | None) -> frozenset[int]:
        """The pool GPUs a shrink of `held` to `gpus` (or to `keep` GPUs) keeps: all or
        none of each of `sets`, `keep` taking those the other members' GPUs cover least
        (as `LeaseTable.shrink` does). `CutsAService`, naming the sets, where it cannot."""
        mine = [s for s in sets if s & held.gpus]
        said = ", ".join(str(_local(job, s)) for s in mine)
        what = (f"job {job.job_id}'s {held.phase} services span all of its job-local GPUs "
                f"{said} in lease {held.lease_id}" if len(mine) == 1 else
                f"job {job.job_id}'s {held.phase} runs as services of {len(mine[0])} GPUs "
                f"(job-local {said}) in lease {held.lease_id}")
        if gpus is not None:
            if all(s <= set(gpus) for s in mine if s & set(gpus)):
                return frozenset(gpus)
            raise CutsAService(f"a shrink keeps whole services: {what}; got gpus "
                               f"{_local(job, gpus)}")
        cover = Counter(g for m in self.store.jobs(active=True, pool_id=job.pool_id)
                        if m.job_id != job.job_id for g in m.pool_gpus or ())
        kept: frozenset[int] = frozenset()
        for s in sorted((s for s in mine if s <= held.gpus),
                        key=lambda s: (sum(cover[g] for g in s), min(s))):
            if len(kept | s) <= keep:
                kept |= s
        if len(kept) != keep:
            raise CutsAService(f"a shrink keeps whole services: {what}; got keep={keep}")
        return kept

    def pack(self, job: JobRecord, lease_id: int, local_gpus: Sequence[int],
             unit: int = 1, held: Sequence[int] | None = None) -> Lease:
        """A floating member's rollout tail, down to the replicas on its window's
        job-local `local_gpus` (whole replicas: aligned blocks of `unit` GPUs), packs: it
        moves to that many GPUs of the fullest window that has them free in blocks of
        `unit` (a replica's GPUs; `LeaseTable.pack_target`), so that a whole window
        frees for a waiting phase; where its own window is among the fullest it shrinks
        to exactly those GPUs. Returns the lease (its new GPUs).

        `held`: the pool GPUs the caller saw the lease hold. Where the lease holds
        others now, already as many as the pack keeps, this pack is a repeat of one that
        ran (a client's resend after its answer was lost): the lease is returned as it
        is."""
        table = self._table_of(job, lease_id)
        g = self._window_size.get(table.pool_id)
        if g is None:
            raise LeaseError(f"job {job.job_id} is not in a floating pool: only a floating "
                             "pool's rollout tails pack (shrink instead)")
        lease = table.lease(lease_id)
        assert lease is not None
        if lease.phase is not Phase.ROLLOUT:
            raise LeaseError(f"lease {lease_id} is a {lease.phase} lease: only a rollout's "
                             "tail packs")
        if (held is not None and frozenset(held) != lease.gpus
                and len(lease.gpus) == len(set(local_gpus))):
            return lease  # packed already by this very request's first attempt
        base = min(lease.gpus) // g * g  # its window's first GPU
        bad = sorted(i for i in local_gpus if not 0 <= i < g)
        if len(set(local_gpus)) != unit * len({i // unit for i in local_gpus}):
            whole = ", ".join(f"{b}-{b + unit - 1}" for b in range(0, g, unit))
            raise LeaseError(f"a pack keeps whole replicas of {unit} GPUs (job-local "
                             f"{whole}), got {sorted(local_gpus)}")
        kept = frozenset(base + i for i in local_gpus)
        if bad or not kept or not kept <= lease.gpus:
            raise LeaseError(f"a pack keeps a non-empty subset of the lease's GPUs "
                             f"{sorted(i - base for i in lease.gpus)} (job-local), got "
                             f"{sorted(local_gpus)}")
        target = table.pack_target(lease_id, len(kept), self.windows(table.pool_id), unit)
        now = self.clock()
        with self._change(table.pool_id):
            events = (table.shrink(lease_id, None, now, gpus=kept) if target is None
                      else table.move(lease_id, target, now))
            self._apply(table.pool_id, events, now)
        moved = table.lease(lease_id)
        assert moved is not None
        return moved

    def grow(self, job: JobRecord, lease_id: int,
             local_gpus: Sequence[int]) -> tuple[Lease, frozenset[int]]:
        """Add to the lease those of the job-local `local_gpus` that are free and that no
        waiter asks for (`LeaseTable.grow`); they must be GPUs of the lease's phase.
        Returns the lease and the pool GPUs it took."""
        table = self._table_of(job, lease_id)
        self._whole_windows(table.pool_id, "grow")
        lease = table.lease(lease_id)
        assert lease is not None
        gpus = set(_pool_gpus(job, local_gpus))
        allowed = set(job.pool_gpus_for(lease.phase))
        if not gpus <= allowed:
            outside = sorted(g for g in local_gpus if (job.pool_gpus or ())[g] not in allowed)
            raise LeaseError(f"job {job.job_id}'s {lease.phase} phase does not run on its "
                             f"GPU(s) {outside}")
        now = self.clock()
        with self._change(table.pool_id):
            self._apply(table.pool_id, table.grow(lease_id, gpus, now), now)
        grown = table.lease(lease_id)
        assert grown is not None
        return grown, grown.gpus - lease.gpus

    def heartbeat(self, job: JobRecord) -> list[Lease]:
        """Renew the job's leases and requests; returns the leases it holds now."""
        if job.pool_id is None or job.pool_id not in self.tables:
            return []
        table = self.tables[job.pool_id]
        now = self.clock()
        if not any(x.job_id == job.job_id for x in table.leases) and not any(
                r.job_id == job.job_id for r in table.waiting):
            return []  # nothing to renew: no transaction
        with self._change(job.pool_id):
            if table.heartbeat(job.job_id, now):
                ids = [x.lease_id for x in table.leases if x.job_id == job.job_id]
                ids += [x.request_id for x in table.waiting if x.job_id == job.job_id]
                self.store.renew(ids, now + self.lease_timeout_s)
        return [x for x in table.leases if x.job_id == job.job_id]

    def extend_grace(self) -> int:
        """Renew every lease and waiting request for one lease timeout from now; returns
        how many. For a restart: `restore` counted its grace from before the pools'
        start-up (Slurm commands, stopping stray services), which may outlast a lease
        timeout, and no driver can renew until the controller listens again."""
        now, n = self.clock(), 0
        for pool_id, table in self.tables.items():
            jobs = {x.job_id for x in table.leases} | {r.job_id for r in table.waiting}
            if not jobs:
                continue
            with self._change(pool_id):
                n += sum(table.heartbeat(job_id, now) for job_id in jobs)
                ids = [x.lease_id for x in table.leases]
                ids += [x.request_id for x in table.waiting]
                self.store.renew(ids, now + self.lease_timeout_s)
        return n

    def remove_job(self, job_id: int, pool_id: int | None, reason: str) -> None:
        """The job ended: revoke all it holds or waits for."""
        if pool_id is None or pool_id not in self.tables:
            return
        now = self.clock()
        with self._change(pool_id):
            self._last_window.pop((pool_id, job_id), None)
            self._apply(pool_id, self.tables[pool_id].remove_job(job_id, now, reason), now)

    def expire(self) -> None:
        """Expire each pool's lapsed leases and requests. A pool whose expiry fails (a
        slice policy's error, a DB error; its change rolled back) is logged and tried
        again a second later, alone: the other pools' expiry goes on."""
        now = self.clock()
        for pool_id, table in list(self.tables.items()):
            if self._expiry_failed.get(pool_id, now) > now:
                continue
            try:
                with self._change(pool_id):
                    self._apply(pool_id, table.expire(now), now)
            except Exception:
                log.exception("lease expiry in pool %d failed; tried again in %g s",
                              pool_id, EXPIRY_RETRY_S)
                self._expiry_failed[pool_id] = now + EXPIRY_RETRY_S
            else:
                self._expiry_failed.pop(pool_id, None)

    async def run_timer(self) -> None:
        """Expire lapsed leases at their deadline; runs until cancelled."""
        while True:
            # a pool whose expiry failed waits for its retry, not its past deadline
            deadlines = [max(d, self._expiry_failed.get(pid, d))
                         for pid, t in self.tables.items() if (d := t.next_deadline())]
            delay = min(deadlines, default=self.clock() + 1.0) - self.clock()
            self._wake.clear()
            if delay > 0:
                # asyncio.wait, not wait_for: on Python 3.11 a wait_for cancelled while
                # a request waits never returned, and the controller's stop hung on it
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait([woken], timeout=min(delay, 1.0))
                finally:
                    woken.cancel()
                continue
            try:
                self.expire()
            except Exception:  # a DB error must not stop expiry for good
                log.exception("lease expiry failed")
                await asyncio.sleep(0.1)

    # -- internals -------------------------------------------------------------------------
    def _options(self, job: JobRecord) -> tuple[frozenset[int], ...]:
        """A floating member's request options: every window of its pool, the one its
        last lease held first (its services there are the ones active); () otherwise."""
        assert job.pool_id is not None
        wins = self.windows(job.pool_id)
        last = self._last_window.get((job.pool_id, job.job_id))
        return tuple(sorted(wins, key=lambda w: (min(w) != last, min(w))))

    def _whole_windows(self, pool_id: int, what: str) -> None:
        if pool_id in self._window_size:
            raise LeaseError(f"a floating pool's leases hold whole windows: no {what}")

    def _table_of(self, job: JobRecord, lease_id: int) -> LeaseTable:
        pool_id = self._pool_of_request.get(lease_id)
        table = self.tables.get(pool_id) if pool_id is not None else None
        lease = table.lease(lease_id) if table else None
        if table is None or lease is None or lease.job_id != job.job_id:
            raise LeaseError(f"lease {lease_id} is not held by job {job.job_id}")
        return table

    @contextmanager
    def _change(self, pool_id: int) -> Iterator[None]:
        """One all-or-nothing change of a pool's leases: a DB transaction (or part of
        the caller's), and, should it roll back, the pool's table and this scheduler's
        maps put back as they were. A table left changed would disagree with the DB: a
        later grant could hand out GPUs the DB still shows held. `_apply` tells drivers,
        grant hooks and metrics only once it is committed."""
        with self.store.transaction():
            table = self.tables.get(pool_id)
            state = table.checkpoint() if table is not None else None
            maps = (dict(self._pool_of_request), set(self._whole), dict(self._last_window),
                    dict(self._window_size))

            def undo() -> None:
                if table is not None and state is not None:
                    table.rollback(state)
                    self.tables.setdefault(pool_id, table)  # a close_pool's del, undone
                self._pool_of_request, self._whole = dict(maps[0]), set(maps[1])
                self._last_window, self._window_size = dict(maps[2]), dict(maps[3])

            self.store.on_rollback(undo)
            yield

    def _apply(
        self, pool_id: int, events: Iterable[Event], now: float,
        timing: dict[str, Any] | None = None, cancel_reason: str = "",
        release_reason: str = "",
    ) -> None:
        """Persist events (inside `_change`); waiting drivers, grant hooks and metrics
        hear of them once the transaction commits."""
        after: list[Callable[[], None]] = []
        for ev in events:
            if isinstance(ev, Grant):
                self.store.lease_granted(pool_id, ev.lease)
                if pool_id in self._window_size:
                    self._last_window[(pool_id, ev.lease.job_id)] = min(ev.lease.gpus)
                self._whole.add(ev.lease.lease_id)
                after.append(functools.partial(self._granted, pool_id, ev.lease))
            elif isinstance(ev, Shrunk):
                self.store.lease_shrunk(ev.lease, ev.freed, now)
                self._whole.discard(ev.lease.lease_id)
            elif isinstance(ev, Grown):
                self.store.lease_grown(pool_id, ev.lease, ev.added, now)
                self._whole.discard(ev.lease.lease_id)
            elif isinstance(ev, Moved):  # a floating pool's tail packed onto another window
                self.store.lease_shrunk(ev.lease, ev.freed, now)
                self.store.lease_grown(pool_id, ev.lease, ev.added, now)
                self._whole.discard(ev.lease.lease_id)
                self._last_window[(pool_id, ev.lease.job_id)] = min(ev.lease.gpus)
            elif isinstance(ev, Released):
                after.append(self._ended(pool_id, ev.lease, LeaseState.RELEASED,
                                         release_reason, ev.at, timing))
            elif isinstance(ev, Revoke):
                if ev.lease is not None:
                    after.append(self._ended(pool_id, ev.lease, LeaseState.REVOKED, ev.reason,
                                             now, None))
                    after.extend(functools.partial(hook, pool_id, ev.lease)
                                 for hook in self.revoke_hooks)
                elif ev.request is not None:
                    rid = ev.request.request_id
                    state = (LeaseState.CANCELLED if ev.reason == "cancelled"
                             else LeaseState.REVOKED)
                    why = cancel_reason or ev.reason
                    self.store.lease_ended(rid, state, max(now, ev.request.requested_at), why)
                    self._pool_of_request.pop(rid, None)
                    after.append(functools.partial(self._request_ended, pool_id, rid, state,
                                                   why))
        if self.check_invariants and pool_id in self.tables:
            check_table(self.tables[pool_id])
        after.append(self._count_waiting)
        for fn in after:
            self.store.after_commit(fn)

    def _count_waiting(self) -> None:
        """The queued-requests gauge: every pool's waiters now."""
        self.metrics.waiting.set(sum(len(t.waiting) for t in self.tables.values()))

    def _granted(self, pool_id: int, lease: Lease) -> None:
        """A committed grant: metrics, its waiting driver, the grant hooks."""
        pool = str(pool_id)
        self.metrics.leases_granted.labels(pool).inc()
        self.metrics.wait_s.labels(pool).observe(lease.wait_s)
        fut = self._futures.pop(lease.lease_id, None)
        if fut is not None and not fut.done():
            fut.set_result(lease)
        for hook in self.grant_hooks:
            hook(pool_id, lease)

    def _request_ended(self, pool_id: int, rid: int, state: LeaseState, why: str) -> None:
        """A committed end of a waiting request: metrics, and its waiting driver."""
        self.metrics.leases_ended.labels(str(pool_id), str(state)).inc()
        fut = self._futures.pop(rid, None)
        if fut is not None and not fut.done():
            fut.set_exception(RequestEnded(rid, state, why))
            fut.exception()  # retrieved: no "never retrieved" warning

    def _ended(
        self, pool_id: int, lease: Lease, state: LeaseState, reason: str, at: float,
        timing: dict[str, Any] | None,
    ) -> Callable[[], None]:
        """Record a lease's end; returns what to count once that is committed."""
        at = max(at, lease.granted_at)  # a lost pool's end may precede a late grant
        known = None
        if lease.lease_id in self._whole:
            self._whole.discard(lease.lease_id)
            known = len(lease.gpus) * (at - lease.granted_at)
        gpu_s = self.store.lease_ended(lease.lease_id, state, at, reason, gpu_s=known)
        head = None if known is not None else self.store.head_gpu_seconds(lease.lease_id)
        self.store.add_ledger(job_id=lease.job_id, lease_id=lease.lease_id, pool_id=pool_id,
                              gpu_seconds=gpu_s, at=at)
        busy = timing.get("busy_s") if timing else None
        self.store.add_observation(
            job_id=lease.job_id, phase=lease.phase, lease_id=lease.lease_id,
            requested_at=lease.requested_at, granted_at=lease.granted_at, released_at=at,
            busy_s=float(busy) if isinstance(busy, int | float) else None,
            gpus=len(lease.gpus), detail={"state": str(state), "reason": reason,
                                          **(timing or {}), "gpu_s": gpu_s,
                                          **({} if head is None else {"head_gpu_s": head})})
        self._pool_of_request.pop(lease.lease_id, None)

        def counted() -> None:
            self.metrics.leases_ended.labels(str(pool_id), str(state)).inc()
            self.metrics.gpu_seconds.labels(str(pool_id)).inc(gpu_s)

        return counted


def _named_first(windows: Sequence[frozenset[int]],
                 named: frozenset[int]) -> tuple[frozenset[int], ...]:
    """Every window, those among `named` first (a restored request's options)."""
    return tuple(sorted(windows, key=lambda w: (not w & named, min(w))))


def _local(job: JobRecord, pool_gpus: Iterable[int]) -> list[int]:
    """The job-local numbers of the job's `pool_gpus` (what its caller says)."""
    mine = list(job.pool_gpus or ())
    return sorted(mine.index(g) for g in pool_gpus if g in mine)


def _pool_gpus(job: JobRecord, local_gpus: Sequence[int]) -> list[int]:
    """The pool GPUs of the job-local `local_gpus`; a GPU the job does not have is an
    error naming it."""
    pool_gpus = job.pool_gpus or ()
    bad = sorted(g for g in local_gpus if not 0 <= g < len(pool_gpus))
    if bad:
        raise LeaseError(f"job {job.job_id} has no GPU(s) {bad}: its GPUs are "
                         f"0..{len(pool_gpus) - 1}")
    return [pool_gpus[g] for g in local_gpus]
