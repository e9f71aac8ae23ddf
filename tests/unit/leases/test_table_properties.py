"""Hypothesis drives random sequences of lease operations; the invariant holds after each."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from policies.slice_fifo import FifoSlice
from policies.slice_round_robin import RoundRobinSlice
from slurmrl.leases import Event, Grant, LeaseError, LeaseTable
from slurmrl.leases.invariants import Interval, check_history, check_table
from slurmrl.leases.types import Grown, Released, Revoke, Shrunk
from slurmrl.model import Phase

GPUS = (0, 1, 2, 3)


class LeaseMachine(RuleBasedStateMachine):
    policy: type[FifoSlice] | type[RoundRobinSlice] = FifoSlice

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.table = LeaseTable(7, GPUS, self.policy(), lease_timeout_s=5.0)
        self.open: dict[tuple[int, int], float] = {}  # (lease, gpu) -> start
        self.history: list[Interval] = []

    def _record(self, events: list[Event]) -> None:
        for e in events:
            if isinstance(e, Grant):
                for g in e.lease.gpus:
                    self.open[(e.lease.lease_id, g)] = self.now
            elif isinstance(e, Shrunk):
                self._close(e.lease.lease_id, e.freed)
            elif isinstance(e, Grown):
                for g in e.added:
                    self.open[(e.lease.lease_id, g)] = self.now
            elif isinstance(e, Released | Revoke) and e.lease is not None:
                self._close(e.lease.lease_id, e.lease.gpus)

    def _close(self, lease_id: int, gpus: frozenset[int]) -> None:
        for g in gpus:
            start = self.open.pop((lease_id, g))
            self.history.append(Interval(lease_id, 7, g, start, self.now))

    @rule(dt=st.floats(0.0, 3.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        self._record(self.table.expire(self.now))

    @rule(
        job=st.integers(1, 4),
        phase=st.sampled_from([Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC]),
        gpus=st.sets(st.sampled_from(GPUS), min_size=1),
        elastic=st.booleans(),
    )
    def request(self, job: int, phase: Phase, gpus: set[int], elastic: bool) -> None:
        # the GPUs are the pool's, min_gpus is in range and ids are fresh, so the one
        # refusal possible is a job asking for GPUs it already holds (under a lease)
        refused = any(x.job_id == job and x.gpus & gpus for x in self.table.leases)
        before = (self.table.leases, self.table.waiting)
        if refused:
            with pytest.raises(LeaseError, match=f"job {job} already holds GPUs"):
                self.table.request(job, phase, gpus, self.now, 1 if elastic else None)
            assert (self.table.leases, self.table.waiting) == before  # nothing changed
            return
        req, events = self.table.request(job, phase, gpus, self.now,
                                         1 if elastic else None)
        granted = [e.lease.lease_id for e in events if isinstance(e, Grant)]
        assert req.request_id in granted or req in self.table.waiting
        self._record(events)

    @precondition(lambda self: bool(self.table.leases))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.table.leases))
        self._record(self.table.release(lease.lease_id, self.now))

    @precondition(lambda self: bool(self.table.leases))
    @rule(data=st.data())
    def shrink(self, data: st.DataObject) -> None:
        lease = data.draw(st.sampled_from(self.table.leases))
        keep = data.draw(st.integers(1, len(lease.gpus)))
        named = data.draw(st.booleans())  # or exactly which GPUs (a replica finished)
        gpus = data.draw(st.permutations(sorted(lease.gpus)))[:keep] if named else None
        self._record(self.table.shrink(lease.lease_id, keep, self.now, gpus=gpus))

    @precondition(lambda self: bool(self.table.leases))
    @rule(data=st.data(), gpus=st.sets(st.sampled_from(GPUS), min_size=1))
    def grow(self, data: st.DataObject, gpus: set[int]) -> None:
        lease = data.draw(st.sampled_from(self.table.leases))
        asked = set().union(*(r.gpus for r in self.table.waiting))
        events = self.table.grow(lease.lease_id, gpus, self.now)
        for e in events:  # it took only GPUs no waiter asks for
            assert isinstance(e, Grown) and not e.added & asked and e.added <= gpus
        self._record(events)

    @rule(job=st.integers(1, 4))
    def heartbeat(self, job: int) -> None:
        self.table.heartbeat(job, self.now)

    @rule(job=st.integers(1, 4))
    def job_ends(self, job: int) -> None:
        self._record(self.table.remove_job(job, self.now, "job-ended"))

    @invariant()
    def never_two_leases_on_one_gpu(self) -> None:
        check_table(self.table)
        open_ivs = [Interval(lid, 7, g, s, None) for (lid, g), s in self.open.items()]
        check_history(self.history + open_ivs)

    @invariant()
    def no_waiter_is_left_while_its_gpus_are_free(self) -> None:
        # work conservation: walking the policy's order, every waiter either lacks free
        # GPUs or is queued behind an earlier waiter that wants them
        view = self.table.view(self.now)
        free, reserved = set(view.free()), set[int]()
        for req in self.table.policy.order(view):
            assert len((req.gpus & free) - reserved) < req.min_gpus
            reserved |= req.gpus


class RoundRobinMachine(LeaseMachine):
    policy = RoundRobinSlice


TestFifoLeases = LeaseMachine.TestCase
TestFifoLeases.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestRoundRobinLeases = RoundRobinMachine.TestCase
TestRoundRobinLeases.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
