"""The persisted lease scheduler: grants, waiting drivers, expiry, shrink, grow, restart.

Runs on a real in-memory Store and the real FIFO slice policy; time is a settable
clock (the scheduler takes the clock as an argument, as the lease table does).
"""

from __future__ import annotations

import asyncio

import pytest
from _loop import Clock, run

from policies.registry import load
from slurmrl.controller.scheduler import CutsAService, LeaseScheduler, RequestEnded
from slurmrl.db import JobRecord, Store
from slurmrl.leases import LeaseError
from slurmrl.leases.invariants import check_history
from slurmrl.model import JobState, Layout, LeaseState, Phase, RlRequest

TIMEOUT_S = 10.0


def _setup(layout: Layout = Layout.COLOCATED) -> tuple[Store, int, Clock]:
    store = Store(":memory:")
    pool = store.add_pool(gpus=2, opened_at=0.0)
    for job_id in (1, 2):
        req = RlRequest(gpus=2, layout=layout, rollout_gpus=1 if layout is
                        Layout.DISAGGREGATED else None)
        store.add_job(JobRecord(job_id, "u", 1000 + job_id, req, JobState.RUNNING, 0.0,
                                pool_id=pool, pool_gpus=(0, 1)))
    return store, pool, Clock()


def _sched(store: Store, clock: Clock) -> LeaseScheduler:
    s = LeaseScheduler(store, lambda: load("slice", "fifo"), TIMEOUT_S, clock=clock,
                       check_invariants=True)
    s.restore()
    return s


def _job(store: Store, job_id: int) -> JobRecord:
    job = store.job(job_id)
    assert job is not None
    return job


@run
async def test_release_grants_the_waiter_at_once() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    assert a.lease is not None and b.lease is None
    waiter = asyncio.create_task(s.wait(b.request_id, 5.0))
    await asyncio.sleep(0)
    clock.now += 3
    s.release(_job(store, 1), a.request_id, {"busy_s": 2.5})
    lease = await waiter
    assert lease is not None and lease.granted_at == clock.now and lease.gpus == {0, 1}
    obs = store.observations(1)
    assert obs[0].busy_s == 2.5 and obs[0].released_at == clock.now
    assert store.gpu_seconds([1]) == {1: pytest.approx(6.0)}
    check_history(store.intervals(pool))


@run
async def test_disaggregated_jobs_share_the_pool_by_sets() -> None:
    store, _, clock = _setup(Layout.DISAGGREGATED)
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)  # GPU 0
    b = s.request(_job(store, 2), Phase.TRAIN)  # GPU 1
    assert a.lease is not None and b.lease is not None
    assert a.lease.gpus == {0} and b.lease.gpus == {1}
    with pytest.raises(LeaseError, match="already holds"):
        s.request(_job(store, 2), Phase.SYNC)  # its sync is on the trainer set it holds


@run
async def test_disaggregated_sync_holds_the_trainer_set_only() -> None:
    store, _, clock = _setup(Layout.DISAGGREGATED)
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)  # job 1 rolls out on GPU 0
    b = s.request(_job(store, 2), Phase.SYNC)  # job 2's sync: GPU 1, not GPU 0 too
    assert a.lease is not None and b.lease is not None  # granted at once, no wait
    assert a.lease.gpus == {0} and b.lease.gpus == {1}
    colocated, _, clock2 = _setup(Layout.COLOCATED)
    c = _sched(colocated, clock2).request(_job(colocated, 1), Phase.SYNC)
    assert c.lease is not None and c.lease.gpus == {0, 1}  # colocated: every GPU


@run
async def test_a_lease_not_renewed_expires_and_the_waiter_gets_it() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    clock.now += TIMEOUT_S / 2
    s.heartbeat(_job(store, 2))  # only the waiter heartbeats
    clock.now += TIMEOUT_S / 2
    s.expire()
    assert store.lease(a.request_id).state is LeaseState.REVOKED  # type: ignore[union-attr]
    assert store.lease(a.request_id).reason == "expired"  # type: ignore[union-attr]
    assert store.lease(b.request_id).state is LeaseState.HELD  # type: ignore[union-attr]


@run
async def test_heartbeats_keep_a_lease() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    for _ in range(5):
        clock.now += TIMEOUT_S * 0.8
        assert [x.lease_id for x in s.heartbeat(_job(store, 1))] == [a.request_id]
        s.expire()
    assert store.lease(a.request_id).state is LeaseState.HELD  # type: ignore[union-attr]


@run
async def test_a_disconnected_waiter_is_withdrawn_unless_shutting_down() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    task = asyncio.create_task(s.wait(b.request_id, 5.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.lease(b.request_id).state is LeaseState.CANCELLED  # type: ignore[union-attr]

    c = s.request(_job(store, 2), Phase.TRAIN)
    s.stopping = True
    task = asyncio.create_task(s.wait(c.request_id, 5.0))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert store.lease(c.request_id).state is LeaseState.WAITING  # type: ignore[union-attr]


@run
async def test_a_request_its_driver_gave_up_is_withdrawn_and_granted_to_nobody() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.TRAIN)  # job 1 holds the pool
    b = s.request(_job(store, 2), Phase.ROLLOUT)  # job 2 waits, then gives up
    assert not s.withdraw(_job(store, 1), b.request_id)  # not job 1's request
    assert not s.withdraw(_job(store, 1), a.request_id)  # held, not waiting
    assert s.withdraw(_job(store, 2), b.request_id)
    rec = store.lease(b.request_id)
    assert rec is not None and rec.state is LeaseState.CANCELLED
    assert rec.reason == "withdrawn by the driver"
    clock.now += TIMEOUT_S / 2
    s.heartbeat(_job(store, 2))  # its heartbeats no longer keep anything queued
    s.release(_job(store, 1), a.request_id, {})
    assert s.heartbeat(_job(store, 2)) == []  # granted to nobody
    c = s.request(_job(store, 2), Phase.TRAIN)  # and its next phase is no conflict
    assert c.lease is not None


@run
async def test_a_revoked_request_wakes_its_waiter_with_the_reason() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    task = asyncio.create_task(s.wait(b.request_id, 5.0))
    await asyncio.sleep(0)
    s.remove_job(2, _job(store, 2).pool_id, "job-ended")
    with pytest.raises(RequestEnded, match="job-ended"):
        await task


@run
async def test_restart_restores_holders_and_waiters_in_order() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    # "kill -9": drop the scheduler, build a new one from the same DB
    s2 = _sched(store, clock)
    assert [x.lease_id for x in s2.tables[pool].leases] == [a.request_id]
    assert [x.request_id for x in s2.tables[pool].waiting] == [b.request_id]
    s2.release(_job(store, 1), a.request_id, {})
    assert store.lease(b.request_id).state is LeaseState.HELD  # type: ignore[union-attr]
    check_history(store.intervals(pool))


@run
async def test_a_restart_counts_the_waiters_it_restored_in_the_waiting_gauge() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    s.request(_job(store, 1), Phase.ROLLOUT)
    s.request(_job(store, 2), Phase.TRAIN)  # waits behind it
    s2 = _sched(store, clock)  # a new process: its gauge read 0 until the next change
    assert s2.metrics.registry.get_sample_value("slurmrl_lease_requests_waiting") == 1.0


@run
async def test_after_a_long_restart_a_lease_lapses_only_if_not_renewed_within_a_timeout(
        ) -> None:
    # the controller was down longer than the lease timeout: its drivers could not
    # heartbeat meanwhile, so their leases are not revoked at once (every running phase
    # of the site would fail); a lease renewed within one timeout of the restart stays,
    # one that is not lapses then
    store, _, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)  # waits behind it
    clock.now += 5 * TIMEOUT_S
    s2 = _sched(store, clock)
    s2.expire()
    assert store.lease(a.request_id).state is LeaseState.HELD  # type: ignore[union-attr]
    assert store.lease(b.request_id).state is LeaseState.WAITING  # type: ignore[union-attr]
    clock.now += TIMEOUT_S - 1
    s2.heartbeat(_job(store, 2))  # job 2's driver is back; job 1's is gone
    clock.now += 2
    s2.expire()
    lease = store.lease(a.request_id)
    assert lease is not None and lease.state is LeaseState.REVOKED
    assert store.lease(b.request_id).state is LeaseState.HELD  # type: ignore[union-attr]


@run
async def test_shrink_hands_freed_gpus_to_an_elastic_waiter() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.ROLLOUT, min_gpus=1)
    assert b.lease is None
    clock.now += 1
    kept = s.shrink(_job(store, 1), a.request_id, 1)
    assert kept.gpus == {0}
    rec = store.lease(b.request_id)
    assert rec is not None and rec.state is LeaseState.HELD and rec.gpus == (1,)
    check_history(store.intervals(pool))


@run
async def test_shrink_to_job_local_gpus_keeps_those_pool_gpus() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.ROLLOUT, min_gpus=1)
    clock.now += 1
    kept = s.shrink(_job(store, 1), a.request_id, local_gpus=[1])
    assert kept.gpus == {1}
    rec = store.lease(b.request_id)
    assert rec is not None and rec.state is LeaseState.HELD and rec.gpus == (0,)
    with pytest.raises(LeaseError, match=r"has no GPU\(s\) \[7\]"):
        s.shrink(_job(store, 1), a.request_id, local_gpus=[7])
    check_history(store.intervals(pool))


def _with_services(rollouts: list[tuple[int, ...]],
                   partner: tuple[int, ...] = (0, 1, 2, 3)) -> tuple[Store, int, Clock]:
    """Job 1 on 4 GPUs, its rollout on `rollouts` (one engine, or replicas) and a trainer
    over all 4, as the controller launched them; job 2 on pool GPUs `partner`, running
    none (its driver's own processes)."""
    store = Store(":memory:")
    pool = store.add_pool(gpus=4, opened_at=0.0)
    for job_id, gpus in ((1, (0, 1, 2, 3)), (2, partner)):
        store.add_job(JobRecord(job_id, "u", 1000 + job_id, RlRequest(gpus=len(gpus)),
                                JobState.RUNNING, 0.0, pool_id=pool, pool_gpus=gpus))
    for role, gpus in [*(("rollout", g) for g in rollouts), ("trainer", (0, 1, 2, 3))]:
        store.add_service(job_id=1, role=role, started_at=0.0, pool_id=pool, gpus=gpus)
    return store, pool, Clock()


@run
async def test_a_shrink_never_gives_back_part_of_one_service() -> None:
    # job 1's rollout, one engine over 4 GPUs, shrank to 2: the 2 it gave back went to
    # job 2's rollout beside the engine still resident there, whose handoff refused it
    store, pool, clock = _with_services([(0, 1, 2, 3)])
    s = _sched(store, clock)
    for phase in (Phase.TRAIN, Phase.ROLLOUT):
        a = s.request(_job(store, 1), phase)
        b = s.request(_job(store, 2), Phase.ROLLOUT, min_gpus=2)
        assert a.lease is not None and b.lease is None
        for keep, gpus in ((2, None), (None, [2, 3])):
            with pytest.raises(CutsAService, match=rf"job 1's {phase} services span all of "
                               rf"its job-local GPUs \[0, 1, 2, 3\] in lease {a.request_id}"):
                s.shrink(_job(store, 1), a.request_id, keep, gpus)
        assert store.lease(a.request_id).gpus == (0, 1, 2, 3)  # type: ignore[union-attr]
        assert store.lease(b.request_id).state is LeaseState.WAITING  # type: ignore[union-attr]
        assert s.withdraw(_job(store, 2), b.request_id)
        s.release(_job(store, 1), a.request_id, {})
    # job 2 runs no service of the controller's: its leases shrink to any part
    c = s.request(_job(store, 2), Phase.ROLLOUT)
    assert s.shrink(_job(store, 2), c.request_id, 1).gpus == {0}
    check_history(store.intervals(pool))


@run
async def test_a_shrink_of_rollout_replicas_keeps_whole_replicas() -> None:
    # job 1's rollout runs as replicas of 2 GPUs; job 2 is on pool GPUs 0 and 1 only
    store, pool, clock = _with_services([(0, 1), (2, 3)], partner=(0, 1))
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.ROLLOUT)
    with pytest.raises(CutsAService, match=r"job 1's rollout runs as services of 2 GPUs "
                       r"\(job-local \[0, 1\], \[2, 3\]\) in lease \d+; got keep=3"):
        s.shrink(_job(store, 1), a.request_id, 3)
    with pytest.raises(CutsAService, match=r"; got gpus \[1, 2, 3\]"):
        s.shrink(_job(store, 1), a.request_id, local_gpus=[1, 2, 3])
    assert store.lease(a.request_id).gpus == (0, 1, 2, 3)  # type: ignore[union-attr]
    # keep=2: the replica job 2 cannot use stays, job 2 gets the other at once
    assert s.shrink(_job(store, 1), a.request_id, 2).gpus == {2, 3}
    rec = store.lease(b.request_id)
    assert rec is not None and rec.state is LeaseState.HELD and rec.gpus == (0, 1)
    check_history(store.intervals(pool))


@run
async def test_a_grown_lease_is_persisted_and_charged_for_each_hold() -> None:
    # job 2's rollout tail holds GPU 1; job 1's rollout starts elastic on GPU 0, grows
    # onto GPU 1 when job 2 is done, shrinks off it and takes it back: each hold is a
    # row of its own, and each is charged
    store, pool, clock = _setup()
    s = _sched(store, clock)
    b = s.request(_job(store, 2), Phase.ROLLOUT, min_gpus=1)
    s.shrink(_job(store, 2), b.request_id, local_gpus=[1])
    a = s.request(_job(store, 1), Phase.ROLLOUT, min_gpus=1)
    assert a.lease is not None and a.lease.gpus == {0}
    lease, added = s.grow(_job(store, 1), a.request_id, [1])
    assert added == frozenset() and lease.gpus == {0}  # job 2 holds it
    clock.now += 2
    s.release(_job(store, 2), b.request_id, {})
    lease, added = s.grow(_job(store, 1), a.request_id, [1])
    assert added == {1} and lease.gpus == {0, 1}
    rec = store.lease(a.request_id)
    assert rec is not None and rec.gpus == (0, 1)
    clock.now += 3
    s.shrink(_job(store, 1), a.request_id, local_gpus=[0])
    clock.now += 1
    assert s.grow(_job(store, 1), a.request_id, [1])[1] == {1}  # the same GPU again
    clock.now += 4
    s.release(_job(store, 1), a.request_id, {})
    check_history(store.intervals(pool))
    # GPU 0 for 10 s, GPU 1 for 3 s and then 4 s
    assert store.gpu_seconds([1])[1] == pytest.approx(10 + 3 + 4)


@run
async def test_a_grow_outside_the_phases_gpus_is_refused_and_changes_nothing() -> None:
    store, pool, clock = _setup(Layout.DISAGGREGATED)  # rollout on GPU 0, trainer on 1
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    with pytest.raises(LeaseError, match=r"rollout phase does not run on its GPU\(s\) \[1\]"):
        s.grow(_job(store, 1), a.request_id, [1])
    with pytest.raises(LeaseError, match=r"has no GPU\(s\) \[5\]"):
        s.grow(_job(store, 1), a.request_id, [5])
    with pytest.raises(LeaseError, match="not held by job 2"):
        s.grow(_job(store, 2), a.request_id, [0])
    rec = store.lease(a.request_id)
    assert rec is not None and rec.gpus == (0,)
    check_history(store.intervals(pool))


@run
async def test_a_job_cannot_release_another_jobs_lease() -> None:
    store, _, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    with pytest.raises(LeaseError, match="not held by job 2"):
        s.release(_job(store, 2), a.request_id, {})


@run
async def test_a_change_the_db_does_not_keep_is_undone_in_memory_too() -> None:
    # the table fails in the middle of a release (after it let the lease go, in its
    # scheduling pass: a slice policy that raises, say): the DB rolls back, so the table
    # must too. Before, the table had let it go and the DB had not: the next acquire was
    # granted GPUs the DB showed held by the first lease (a double grant that a restart
    # refused to load)
    store, pool, clock = _setup()
    s = _sched(store, clock)
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    assert a.lease is not None and b.lease is None
    waiter = asyncio.create_task(s.wait(b.request_id, 5.0))
    await asyncio.sleep(0)
    table = s.tables[pool]

    def broken(now: float) -> list[object]:
        # (a slice policy that raised did this; with one waiter none is asked now)
        raise ZeroDivisionError("float division by zero")

    table._schedule = broken  # type: ignore[method-assign]
    clock.now += 1
    with pytest.raises(ZeroDivisionError):
        s.release(_job(store, 1), a.request_id, {})
    assert [x.lease_id for x in table.leases] == [a.request_id]  # as the DB has it
    assert [x.request_id for x in table.waiting] == [b.request_id]
    assert not waiter.done()  # told nothing: nothing happened
    del table._schedule  # the table's own again
    s.release(_job(store, 1), a.request_id, {})
    lease = await waiter
    assert lease is not None and lease.job_id == 2
    check_history(store.intervals(pool))
    s2 = _sched(store, clock)  # the DB loads: no GPU held twice
    assert [x.lease_id for x in s2.tables[pool].leases] == [b.request_id]


@run
async def test_closing_a_pool_grants_its_waiter_nothing() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    granted: list[int] = []
    s.grant_hooks.append(lambda _pool, lease: granted.append(lease.lease_id))
    a = s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    granted.clear()
    waiter = asyncio.create_task(s.wait(b.request_id, 5.0))
    await asyncio.sleep(0)
    s.close_pool(pool, "pool-lost")
    with pytest.raises(RequestEnded, match="pool-lost"):
        await waiter
    assert granted == []  # before, the holder's revoke granted the waiter first
    rec = store.lease(b.request_id)
    assert rec is not None and rec.granted_at is None and rec.state is LeaseState.REVOKED
    assert a.lease is not None and store.lease(a.request_id).state is LeaseState.REVOKED  # type: ignore[union-attr]


@run
async def test_a_restart_keeps_the_members_slice_history() -> None:
    # round-robin serves the member granted least recently first: job 2 was granted
    # before, job 1 never. A restart that forgot it granted job 2 (the older request)
    store, pool, clock = _setup()
    store.add_job(JobRecord(3, "u", 1003, RlRequest(gpus=2), JobState.RUNNING, 0.0,
                            pool_id=pool, pool_gpus=(0, 1)))

    def rr() -> LeaseScheduler:
        s = LeaseScheduler(store, lambda: load("slice", "round-robin"), TIMEOUT_S,
                           clock=clock, check_invariants=True)
        s.restore()
        return s

    s = rr()
    first = s.request(_job(store, 2), Phase.TRAIN)
    assert first.lease is not None
    clock.now += 1
    s.release(_job(store, 2), first.request_id, {})
    held = s.request(_job(store, 3), Phase.TRAIN)  # a third holds the pool
    assert held.lease is not None
    clock.now += 1
    older = s.request(_job(store, 2), Phase.TRAIN)
    clock.now += 1
    newer = s.request(_job(store, 1), Phase.TRAIN)
    s2 = rr()  # the controller restarts here
    clock.now += 1
    s2.release(_job(store, 3), held.request_id, {})
    granted = [x.lease_id for x in s2.tables[pool].leases]
    assert granted == [newer.request_id]  # job 1, never granted, goes first
    assert older.request_id in {x.request_id for x in s2.tables[pool].waiting}


def test_a_pool_whose_expiry_fails_does_not_stop_the_other_pools_expiry() -> None:
    # one pool's expiry raising (a slice policy's error, a DB error) ended the loop over
    # pools: every pool after it kept its lapsed leases, and the timer spun at 10 Hz
    store = Store(":memory:")
    clock = Clock()
    pools = [store.add_pool(gpus=1, opened_at=0.0) for _ in range(2)]
    for job_id, pool in zip((1, 2), pools, strict=True):
        store.add_job(JobRecord(job_id, "u", 1000 + job_id, RlRequest(gpus=1),
                                JobState.RUNNING, 0.0, pool_id=pool, pool_gpus=(0,)))
    s = _sched(store, clock)
    held = {job_id: s.request(_job(store, job_id), Phase.TRAIN) for job_id in (1, 2)}

    def broken(now: float) -> list[object]:
        raise RuntimeError("the slice policy raised")

    s.tables[pools[0]].expire = broken  # type: ignore[method-assign]
    clock.now += TIMEOUT_S + 1
    s.expire()
    lapsed = store.lease(held[2].request_id)
    assert lapsed is not None and lapsed.state is LeaseState.REVOKED
    first = store.lease(held[1].request_id)
    assert first is not None and first.state is LeaseState.HELD  # tried again later


@run
async def test_a_reader_waiting_on_a_request_does_not_keep_it_queued_for_a_gone_driver(
) -> None:
    # a GET long poll (a reader) counted as a waiter: the acquirer's disconnect then
    # left the request queued, to be granted to nobody, until the read ended
    store, _pool, clock = _setup()
    s = _sched(store, clock)
    s.request(_job(store, 1), Phase.ROLLOUT)
    b = s.request(_job(store, 2), Phase.TRAIN)
    reader = asyncio.create_task(s.wait(b.request_id, 30.0, withdraw_on_cancel=False))
    acquirer = asyncio.create_task(s.wait(b.request_id, 30.0))
    await asyncio.sleep(0)
    acquirer.cancel()  # its driver disconnected
    with pytest.raises(asyncio.CancelledError):
        await acquirer
    rec = store.lease(b.request_id)
    assert rec is not None and rec.state is LeaseState.CANCELLED
    with pytest.raises(RequestEnded):
        await reader


@run
async def test_a_rollout_that_shrank_is_profiled_with_how_long_it_held_its_set_first(
        ) -> None:
    # each rollout holds both GPUs for 10 s, then its tail keeps one for 20 s: it held
    # two thirds of its set on average, one third before it first gave a GPU back. The
    # profile says both, and so the pairing pictures its tail in steps
    # (`complementarity.tail_stages`), not as the whole set then one GPU
    from slurmrl.controller.placement import job_snapshot

    store, _, clock = _setup()
    s = _sched(store, clock)
    for _ in range(4):
        a = s.request(_job(store, 1), Phase.ROLLOUT)
        clock.now += 10
        s.shrink(_job(store, 1), a.request_id, 1)
        clock.now += 20
        s.release(_job(store, 1), a.request_id, {})
        t = s.request(_job(store, 1), Phase.TRAIN)
        clock.now += 5
        s.release(_job(store, 1), t.request_id, {})
    rollouts = [o for o in store.observations(1) if o.phase is Phase.ROLLOUT]
    assert [o.detail["head_gpu_s"] for o in rollouts] == [20.0] * 4
    assert [o.detail["gpu_s"] for o in rollouts] == [40.0] * 4
    trains = [o for o in store.observations(1) if o.phase is Phase.TRAIN]
    assert all("head_gpu_s" not in o.detail for o in trains)  # never shrank
    prof = job_snapshot(_job(store, 1), "pools", store.observations(1)).profile
    assert prof is not None and prof.source != "prior"
    roll = prof.phases[Phase.ROLLOUT]
    assert roll.gpu_share == pytest.approx(2 / 3) and roll.head_share == pytest.approx(1 / 3)
    assert prof.phases[Phase.TRAIN].head_share == pytest.approx(1.0)
