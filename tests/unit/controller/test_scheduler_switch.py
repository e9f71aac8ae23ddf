"""The scheduler's lease switch: a job's held lease becomes its next phase's at once.

A colocated job that ends its training with a weight sync keeps its GPUs for the sync
instead of queueing behind its partner's whole phase; its partner gets them when the
sync is released. The switched lease is recorded as released (observation, ledger), a
lease switches once, on part of the pool only for the member behind, and every refused
switch changes nothing, even after a restart.
Real in-memory Store, the real FIFO slice policy, a settable clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from _loop import run
from test_scheduler import _job, _sched, _setup

from slurmrl.controller.scheduler import LeaseScheduler
from slurmrl.db import Store
from slurmrl.leases import LeaseError
from slurmrl.leases.invariants import check_history
from slurmrl.model import Layout, LeaseState, Phase


def _state(store: Store, s: LeaseScheduler, pool: int) -> tuple[Any, ...]:
    """Everything a refused switch must leave as it was."""
    table = s.tables[pool]
    return (store.leases(), store.observations(), store.gpu_seconds(), table.leases,
            table.waiting, [store.job(j) for j in (1, 2)])


@run
async def test_a_switch_keeps_the_gpus_and_the_partner_gets_them_after_the_sync() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    train = s.request(_job(store, 1), Phase.TRAIN)
    partner = s.request(_job(store, 2), Phase.ROLLOUT)  # waits for both GPUs
    assert train.lease is not None and partner.lease is None
    waiter = asyncio.create_task(s.wait(partner.request_id, 5.0))
    await asyncio.sleep(0)
    clock.now += 3
    sync = s.switch(_job(store, 1), train.request_id, Phase.SYNC, {"busy_s": 2.5})
    # granted at once on the train lease's GPUs, although the partner queued first
    assert sync.phase is Phase.SYNC and sync.gpus == {0, 1} and sync.switched
    assert sync.granted_at == sync.requested_at == clock.now
    await asyncio.sleep(0)
    assert not waiter.done()
    rec = store.lease(sync.lease_id)
    assert rec is not None and rec.state is LeaseState.HELD and rec.phase is Phase.SYNC
    # the train lease ended as released, with its timing and its GPU-seconds
    old = store.lease(train.request_id)
    assert old is not None and old.state is LeaseState.RELEASED
    assert old.released_at == clock.now and old.reason == f"switched to lease {sync.lease_id}"
    (obs,) = store.observations(1)
    assert obs.phase is Phase.TRAIN and obs.busy_s == 2.5 and obs.released_at == clock.now
    assert store.gpu_seconds([1]) == {1: pytest.approx(2 * 3.0)}
    # the sync released, the partner has the GPUs
    clock.now += 1
    s.release(_job(store, 1), sync.lease_id, {"busy_s": 0.9})
    granted = await waiter
    assert granted is not None and granted.gpus == {0, 1} and granted.granted_at == clock.now
    assert store.gpu_seconds([1]) == {1: pytest.approx(2 * 3.0 + 2 * 1.0)}
    assert [o.phase for o in store.observations(1)] == [Phase.TRAIN, Phase.SYNC]
    check_history(store.intervals(pool))


@run
async def test_a_switched_lease_cannot_switch_again_and_nothing_changes() -> None:
    store, pool, clock = _setup()
    s = _sched(store, clock)
    train = s.request(_job(store, 1), Phase.TRAIN)
    s.request(_job(store, 2), Phase.ROLLOUT)
    sync = s.switch(_job(store, 1), train.request_id, Phase.SYNC, {})
    before = _state(store, s, pool)
    clock.now += 1
    with pytest.raises(LeaseError, match=f"lease {sync.lease_id} was granted by a switch: "
                       "a lease switches once; release it and acquire rollout"):
        s.switch(_job(store, 1), sync.lease_id, Phase.ROLLOUT, {})
    assert _state(store, s, pool) == before
    # the old lease is gone: switching it again is refused as not held
    with pytest.raises(LeaseError, match=f"lease {train.request_id} is not held by job 1"):
        s.switch(_job(store, 1), train.request_id, Phase.SYNC, {})
    # a restart keeps the lease a switched one (the DB row of the old lease names it)
    s2 = _sched(store, clock)
    restored = _state(store, s2, pool)  # (deadlines a lease timeout from the restart)
    with pytest.raises(LeaseError, match="a lease switches once"):
        s2.switch(_job(store, 1), sync.lease_id, Phase.ROLLOUT, {})
    assert _state(store, s2, pool) == restored
    check_history(store.intervals(pool))


@run
async def test_a_switch_to_gpus_outside_the_lease_is_refused_and_changes_nothing() -> None:
    store, pool, clock = _setup(Layout.DISAGGREGATED)  # rollout on GPU 0, trainer on 1
    s = _sched(store, clock)
    rollout = s.request(_job(store, 1), Phase.ROLLOUT)
    s.request(_job(store, 2), Phase.ROLLOUT)  # waits for GPU 0
    before = _state(store, s, pool)
    with pytest.raises(LeaseError, match=r"job 1's sync phase runs on pool GPUs \[1\], and "
                       rf"lease {rollout.request_id} \(rollout\) holds \[0\]"):
        s.switch(_job(store, 1), rollout.request_id, Phase.SYNC, {})
    with pytest.raises(LeaseError, match="reward needs no GPU"):
        s.switch(_job(store, 1), rollout.request_id, Phase.REWARD, {})
    with pytest.raises(LeaseError, match="is a rollout lease already"):
        s.switch(_job(store, 1), rollout.request_id, Phase.ROLLOUT, {})
    with pytest.raises(LeaseError, match="not held by job 2"):  # someone else's lease
        s.switch(_job(store, 2), rollout.request_id, Phase.ROLLOUT, {})
    assert _state(store, s, pool) == before
    check_history(store.intervals(pool))


@run
async def test_on_part_of_the_pool_only_the_member_behind_switches() -> None:
    # a disaggregated job's train and sync share its trainer set (GPU 1), part of the
    # pool: job 1 may switch there only if no member waiting for that GPU has waited a
    # larger share of its time; unconditioned, such switches locked pairs' phases
    store, pool, clock = _setup(Layout.DISAGGREGATED)
    s = _sched(store, clock)
    train = s.request(_job(store, 1), Phase.TRAIN)  # GPU 1
    clock.now += 1.0
    s.request(_job(store, 2), Phase.TRAIN)  # waits for GPU 1
    clock.now += 4.0
    before = _state(store, s, pool)
    with pytest.raises(LeaseError, match=rf"lease {train.request_id} holds part of the pool "
                       r"\(\[1\] of \[0, 1\]\), and a member waiting for those GPUs has "
                       r"waited a larger share of its time than job 1: it goes first; "
                       r"release the lease and acquire sync"):
        s.switch(_job(store, 1), train.request_id, Phase.SYNC, {})
    assert _state(store, s, pool) == before
    # with nobody waiting for GPU 1 (job 2 rolls out on GPU 0), job 1 switches there
    store2, _, clock2 = _setup(Layout.DISAGGREGATED)
    s2 = _sched(store2, clock2)
    train2 = s2.request(_job(store2, 1), Phase.TRAIN)
    s2.request(_job(store2, 2), Phase.ROLLOUT)
    clock2.now += 5.0
    sync = s2.switch(_job(store2, 1), train2.request_id, Phase.SYNC, {})
    assert (sync.phase, sync.gpus) == (Phase.SYNC, frozenset({1}))
