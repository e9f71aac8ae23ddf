"""The lease table: grants, hand-offs, shrink, grow, expiry, and the no-double-grant
invariant."""

from __future__ import annotations

import pytest

from policies.slice_fifo import FifoSlice
from policies.slice_round_robin import RoundRobinSlice
from slurmrl.leases import Event, Grant, Lease, LeaseError, LeaseTable, Revoke
from slurmrl.leases.invariants import Interval, InvariantViolation, check_history, check_table
from slurmrl.leases.types import Grown, Released, Shrunk
from slurmrl.model import Phase

ALL = (0, 1, 2, 3)


def table(policy: object = None, timeout: float = 10.0) -> LeaseTable:
    return LeaseTable(1, ALL, policy or FifoSlice(), lease_timeout_s=timeout)  # type: ignore[arg-type]


def grants(events: list[Event]) -> list[Lease]:
    return [e.lease for e in events if isinstance(e, Grant)]


def test_free_pool_grants_at_once_and_release_hands_over() -> None:
    t = table()
    req_a, ev = t.request(101, Phase.ROLLOUT, ALL, now=0.0)
    assert [g.job_id for g in grants(ev)] == [101]
    _req_b, ev = t.request(102, Phase.TRAIN, ALL, now=1.0)
    assert grants(ev) == []  # B waits: A holds every GPU
    ev = t.release(req_a.request_id, now=5.0)
    assert isinstance(ev[0], Released)
    (lease_b,) = grants(ev)
    assert lease_b.job_id == 102 and lease_b.gpus == frozenset(ALL)
    assert lease_b.granted_at == 5.0 and lease_b.wait_s == 4.0


def test_disaggregated_sets_are_served_independently() -> None:
    t = table()
    rollout, train = (0, 1), (2, 3)
    a_roll, _ = t.request(1, Phase.ROLLOUT, rollout, now=0.0)
    # B's rollout waits behind A's, but A's partner can train on the trainer set meanwhile
    _, ev = t.request(2, Phase.ROLLOUT, rollout, now=1.0)
    assert grants(ev) == []
    _, ev = t.request(2, Phase.TRAIN, train, now=1.5)
    assert [(g.job_id, g.phase) for g in grants(ev)] == [(2, Phase.TRAIN)]
    ev = t.release(a_roll.request_id, now=3.0)
    assert [(g.job_id, g.phase) for g in grants(ev)] == [(2, Phase.ROLLOUT)]
    check_table(t)


def test_waiting_request_reserves_its_gpus_against_later_ones() -> None:
    t = table()
    a, _ = t.request(1, Phase.TRAIN, (0, 1), now=0.0)
    t.request(2, Phase.TRAIN, ALL, now=1.0)  # needs all four: waits for A
    _, ev = t.request(3, Phase.ROLLOUT, (2, 3), now=2.0)
    # 2 and 3 are free, but job 2 asked first for them: job 3 may not overtake it
    assert grants(ev) == []
    ev = t.release(a.request_id, now=3.0)
    assert [g.job_id for g in grants(ev)] == [2]


def test_shrink_hands_freed_gpus_to_a_waiter_at_once() -> None:
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, ALL, now=0.0)
    _b, ev = t.request(2, Phase.ROLLOUT, ALL, min_gpus=2, now=1.0)
    assert grants(ev) == []
    ev = t.shrink(a.request_id, keep=2, now=2.0)
    shrunk = [e for e in ev if isinstance(e, Shrunk)]
    assert shrunk and shrunk[0].freed == frozenset({2, 3})
    (lease_b,) = grants(ev)
    assert lease_b.gpus == frozenset({2, 3}) and lease_b.job_id == 2
    check_table(t)


def test_shrink_keeps_the_gpus_other_members_cannot_use() -> None:
    # a staggered pool of 4 GPUs: job 1 on GPUs 0-2, job 2 on 1-3. Job 2's shrunk tail
    # keeps GPU 3 (outside job 1's window), so job 1's training, which needs 0-2, runs
    t = table()
    t.set_member(1, gpus=(0, 1, 2))
    t.set_member(2, gpus=(1, 2, 3))
    b, _ = t.request(2, Phase.ROLLOUT, (1, 2, 3), now=0.0)
    _, ev = t.request(1, Phase.TRAIN, (0, 1, 2), now=1.0)
    assert grants(ev) == []
    ev = t.shrink(b.request_id, keep=1, now=2.0)
    assert t.lease(b.request_id).gpus == frozenset({3})  # type: ignore[union-attr]
    assert [(g.job_id, g.gpus) for g in grants(ev)] == [(1, frozenset({0, 1, 2}))]
    check_table(t)


def test_shrink_to_named_gpus_keeps_exactly_those() -> None:
    # a rollout of four replicas whose replicas on GPUs 0 and 2 are done keeps 1 and 3,
    # though the controller's own choice would have been the lowest (0, 1)
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, ALL, now=0.0)
    _, ev = t.request(2, Phase.ROLLOUT, ALL, min_gpus=1, now=1.0)
    ev = t.shrink(a.request_id, keep=None, now=2.0, gpus=(1, 3))
    assert t.lease(a.request_id).gpus == frozenset({1, 3})  # type: ignore[union-attr]
    assert [(g.job_id, g.gpus) for g in grants(ev)] == [(2, frozenset({0, 2}))]
    check_table(t)


@pytest.mark.parametrize("gpus", [(), (0, 4), (5,)])
def test_shrink_to_gpus_outside_the_lease_is_refused_and_changes_nothing(gpus: tuple[int, ...]
                                                                         ) -> None:
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, (0, 1, 2), now=0.0)
    with pytest.raises(LeaseError, match="non-empty subset of the lease's GPUs"):
        t.shrink(a.request_id, keep=1, now=1.0, gpus=gpus)
    assert t.lease(a.request_id).gpus == frozenset({0, 1, 2})  # type: ignore[union-attr]


def test_grow_takes_free_gpus_but_never_ones_a_waiter_asks_for() -> None:
    # job 1's rollout started on GPUs 0-1 (elastic) while job 2 trained on 2-3
    t = table()
    b, _ = t.request(2, Phase.TRAIN, (2, 3), now=0.0)
    a, ev = t.request(1, Phase.ROLLOUT, ALL, min_gpus=1, now=0.5)
    assert t.lease(a.request_id).gpus == frozenset({0, 1})  # type: ignore[union-attr]
    assert t.grow(a.request_id, (2, 3), now=1.0) == []  # held by job 2: nothing to take
    t.release(b.request_id, now=2.0)
    _, ev = t.request(3, Phase.TRAIN, (3,), now=2.5)  # job 3 trains on GPU 3 (free)
    assert [g.gpus for g in grants(ev)] == [frozenset({3})]
    ev = t.grow(a.request_id, (2, 3), now=3.0)
    assert ev == [Grown(t.lease(a.request_id), frozenset({2}))]  # type: ignore[arg-type]
    assert t.lease(a.request_id).gpus == frozenset({0, 1, 2})  # type: ignore[union-attr]
    check_table(t)


def test_grow_leaves_gpus_a_waiter_asks_for_even_when_they_are_free() -> None:
    # job 2 waits for the whole set (rigid); GPU 3 is free but a grow must not take it,
    # or job 2 would wait longer
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, (0, 1, 2), now=0.0)
    _, ev = t.request(2, Phase.TRAIN, ALL, now=1.0)
    assert grants(ev) == []
    assert t.grow(a.request_id, (3,), now=2.0) == []
    assert t.lease(a.request_id).gpus == frozenset({0, 1, 2})  # type: ignore[union-attr]


@pytest.mark.parametrize(("lease_id", "gpus", "says"), [
    (99, (1,), "lease 99 is not held"),
    (None, (7,), r"GPUs \[7\] are not in pool 1"),
])
def test_bad_grows_are_refused_and_change_nothing(lease_id: int | None,
                                                  gpus: tuple[int, ...], says: str) -> None:
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, (0,), now=0.0)
    with pytest.raises(LeaseError, match=says):
        t.grow(lease_id or a.request_id, gpus, now=1.0)
    assert t.lease(a.request_id).gpus == frozenset({0})  # type: ignore[union-attr]


def test_shrink_below_a_rigid_request_grants_nothing() -> None:
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, ALL, now=0.0)
    t.request(2, Phase.TRAIN, ALL, now=1.0)  # needs all four
    assert grants(t.shrink(a.request_id, keep=1, now=2.0)) == []


def test_missed_heartbeats_revoke_and_the_waiter_is_granted() -> None:
    t = table(timeout=10.0)
    a, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    t.request(2, Phase.TRAIN, ALL, now=1.0)
    t.heartbeat(2, now=8.0)  # B is alive, A is not
    assert t.expire(now=9.0) == []
    ev = t.expire(now=10.0)
    revoked = [e for e in ev if isinstance(e, Revoke)]
    assert revoked and revoked[0].lease is not None and revoked[0].lease.job_id == 1
    assert [g.job_id for g in grants(ev)] == [2]
    with pytest.raises(LeaseError, match="not held"):
        t.release(a.request_id, now=11.0)


def test_heartbeat_keeps_a_long_phase() -> None:
    t = table(timeout=10.0)
    a, _ = t.request(1, Phase.ROLLOUT, ALL, now=0.0)
    for now in range(5, 60, 5):
        t.heartbeat(1, now=float(now))
        assert t.expire(now=float(now)) == []
    lease = t.lease(a.request_id)
    assert lease is not None and lease.deadline_at == 65.0


def test_round_robin_serves_the_least_recently_granted_member() -> None:
    t = table(RoundRobinSlice())
    a, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    t.request(2, Phase.TRAIN, ALL, now=1.0)  # B waits
    t.release(a.request_id, now=2.0)  # B granted
    lease_b = next(x for x in t.leases if x.job_id == 2)
    t.request(1, Phase.ROLLOUT, ALL, now=3.0)
    t.request(3, Phase.ROLLOUT, ALL, now=4.0)
    ev = t.release(lease_b.lease_id, now=5.0)
    # job 3 has never been granted: it goes before job 1, although job 1 asked first
    assert [g.job_id for g in grants(ev)] == [3]


def test_fifo_serves_the_oldest_request() -> None:
    t = table(FifoSlice())
    a, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    t.request(2, Phase.ROLLOUT, ALL, now=3.0)
    t.request(3, Phase.ROLLOUT, ALL, now=4.0)
    assert [g.job_id for g in grants(t.release(a.request_id, now=5.0))] == [2]


@pytest.mark.parametrize(
    ("gpus", "min_gpus", "message"),
    [
        ((), None, "at least one GPU"),
        ((0, 7), None, r"GPUs \[7\] are not in pool"),
        ((0, 1), 3, "min_gpus must be between 1 and 2"),
        ((0, 1), 0, "min_gpus must be between 1 and 2"),
    ],
)
def test_bad_requests_are_refused_and_change_nothing(
    gpus: tuple[int, ...], min_gpus: int | None, message: str
) -> None:
    t = table()
    with pytest.raises(LeaseError, match=message):
        t.request(1, Phase.ROLLOUT, gpus, now=0.0, min_gpus=min_gpus)
    assert t.leases == () and t.waiting == ()


def test_a_job_cannot_wait_for_gpus_it_already_holds() -> None:
    t = table()
    t.request(1, Phase.ROLLOUT, ALL, now=0.0)
    with pytest.raises(LeaseError, match="already holds GPUs"):
        t.request(1, Phase.TRAIN, (0,), now=1.0)


def test_remove_job_revokes_everything_it_had() -> None:
    t = table()
    t.request(1, Phase.ROLLOUT, (0, 1), now=0.0)
    t.request(1, Phase.TRAIN, (2, 3), now=0.0)
    t.request(2, Phase.TRAIN, ALL, now=1.0)
    ev = t.remove_job(1, now=2.0, reason="job-ended")
    assert sum(isinstance(e, Revoke) for e in ev) == 2
    assert [g.job_id for g in grants(ev)] == [2]


def test_restore_refuses_a_double_grant() -> None:
    t = table()
    a, _ = t.request(1, Phase.ROLLOUT, (0, 1), now=0.0)
    b, _ = t.request(2, Phase.ROLLOUT, (2, 3), now=0.0)
    la, lb = t.lease(a.request_id), t.lease(b.request_id)
    assert la is not None and lb is not None
    fresh = table()
    fresh.restore([la, lb], [])
    assert {x.lease_id for x in fresh.leases} == {la.lease_id, lb.lease_id}
    from dataclasses import replace

    broken = table()
    with pytest.raises(InvariantViolation, match="held by leases"):
        broken.restore([la, replace(lb, gpus=frozenset({1, 2}))], [])


def test_history_checker_finds_an_overlap_and_allows_touching() -> None:
    ok = [Interval(1, 1, 0, 0.0, 5.0), Interval(2, 1, 0, 5.0, 9.0), Interval(3, 1, 1, 0.0, None)]
    check_history(ok)
    with pytest.raises(InvariantViolation, match="overlap"):
        check_history([*ok, Interval(4, 1, 0, 8.0, 10.0)])
    with pytest.raises(InvariantViolation, match="overlap"):
        check_history([Interval(5, 1, 1, 3.0, 4.0), Interval(3, 1, 1, 0.0, None)])


def test_round_robin_reorders_after_a_grant_and_serves_the_waiter_it_unblocks() -> None:
    # found by the property test: job 3 waits rigidly for {0,1}; job 1's request for {0}
    # queues behind it (both never granted: same rank). Job 3's elastic request then gets
    # GPU 2, which makes job 3 the most recently granted member, so round-robin now puts
    # job 1 first -- and GPU 0 is free: job 1 must be granted in the same call.
    t = table(RoundRobinSlice())
    _, ev = t.request(2, Phase.ROLLOUT, {1}, 0.0)
    assert grants(ev)
    t.request(3, Phase.ROLLOUT, {0, 1}, 0.0)
    t.request(1, Phase.ROLLOUT, {0}, 0.0)
    assert not any(lease.job_id == 1 for lease in t.leases)
    _, ev = t.request(3, Phase.ROLLOUT, {0, 2}, 0.0, 1)
    assert {lease.job_id: set(lease.gpus) for lease in grants(ev)} == {
        3: {2}, 1: {0}}


def test_a_training_job_switches_to_its_sync_ahead_of_its_waiting_partner() -> None:
    # round-robin would hand the pool to B's waiting train once A releases its own; a
    # switch lets A sync its weights first (seconds), then B trains
    t = table(RoundRobinSlice())
    a_train, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    _, ev = t.request(2, Phase.TRAIN, ALL, now=1.0)
    assert grants(ev) == []
    assert t.can_switch(a_train.request_id, ALL, now=10.0)
    sync, ev = t.switch(a_train.request_id, Phase.SYNC, ALL, now=10.0)
    assert isinstance(ev[0], Released) and ev[0].lease.phase is Phase.TRAIN
    assert grants(ev) == [sync]  # B still waits
    assert (sync.job_id, sync.phase, sync.gpus, sync.wait_s) == (1, Phase.SYNC,
                                                                 frozenset(ALL), 0.0)
    assert [r.job_id for r in t.waiting] == [2]
    stats = t.view(10.0).stats[1]
    assert stats.held_s == 10.0 and stats.last_grant_at == 10.0 and stats.grants == 2
    check_table(t)
    (b,) = grants(t.release(sync.lease_id, now=12.0))
    assert (b.job_id, b.granted_at) == (2, 12.0)


def test_a_switched_lease_cannot_switch_again() -> None:
    # so a job with no gap between its phases cannot chain them and starve its partner
    t = table(RoundRobinSlice())
    a, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    t.request(2, Phase.ROLLOUT, ALL, now=1.0)
    sync, _ = t.switch(a.request_id, Phase.SYNC, None, now=5.0)
    assert sync.switched and not t.can_switch(sync.lease_id, ALL, now=5.0)
    with pytest.raises(LeaseError, match="switched to already"):
        t.switch(sync.lease_id, Phase.ROLLOUT, ALL, now=6.0)
    assert t.leases == (sync,) and [r.job_id for r in t.waiting] == [2]  # unchanged
    (b,) = grants(t.release(sync.lease_id, now=7.0))
    assert b.job_id == 2


def test_on_part_of_the_pool_only_the_member_behind_switches() -> None:
    # a disaggregated job's trainer set (GPUs 2-3) is part of the pool: A may switch its
    # train to its sync there only if no member waiting for those GPUs has waited a
    # larger share of its time in the pool
    t = table(RoundRobinSlice())
    a, _ = t.request(1, Phase.TRAIN, (2, 3), now=0.0)
    t.request(2, Phase.TRAIN, (2, 3), now=1.0)
    # at t=5 B has waited 4 s of its 4 s in the pool, A none of its 5 s
    assert (t.waited_share(1, 5.0), t.waited_share(2, 5.0)) == (0.0, 1.0)
    assert not t.can_switch(a.request_id, (2, 3), now=5.0)
    with pytest.raises(LeaseError, match="waited a larger share"):
        t.switch(a.request_id, Phase.SYNC, (2, 3), now=5.0)
    assert [(x.job_id, x.phase) for x in t.leases] == [(1, Phase.TRAIN)]  # unchanged
    assert [r.job_id for r in t.waiting] == [2]
    (b,) = grants(t.release(a.request_id, now=5.0))  # so A releases; B trains
    assert b.job_id == 2
    # A queues its sync behind B's training: when B's train ends, A has waited longer
    t.request(1, Phase.SYNC, (2, 3), now=5.0)
    assert t.waited_share(2, 15.0) == 4 / 14 and t.waited_share(1, 15.0) == 10 / 15
    # ... and with nobody waiting for the set, a switch there delays nobody
    t2 = table()
    c, _ = t2.request(1, Phase.TRAIN, (2, 3), now=0.0)
    t2.request(2, Phase.ROLLOUT, (0, 1), now=1.0)
    sync, ev = t2.switch(c.request_id, Phase.SYNC, None, now=5.0)
    assert sync.gpus == frozenset((2, 3)) and grants(ev) == [sync]


def test_a_switch_keeps_the_leases_own_gpus() -> None:
    t = table()
    held, _ = t.request(1, Phase.TRAIN, ALL, now=0.0)
    assert not t.can_switch(held.request_id, (0, 1), now=1.0)
    with pytest.raises(LeaseError, match="keeps the lease's GPUs"):
        t.switch(held.request_id, Phase.SYNC, (0, 1), now=1.0)
    assert [(x.lease_id, x.phase) for x in t.leases] == [(held.request_id, Phase.TRAIN)]
    with pytest.raises(LeaseError, match="not held"):
        t.switch(999, Phase.SYNC, ALL, now=5.0)
