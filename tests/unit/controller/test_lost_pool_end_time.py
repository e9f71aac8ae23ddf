"""A job whose pool was lost ends when the pool's allocation ended, not when the
controller noticed: after a restart that gap is the whole downtime, and the report's
WALL, DEDIC-S and SAVED would count it.

A real Controller on a real Store, time a settable clock; Slurm and the pool allocator
are fakes.
"""

from __future__ import annotations

from typing import Any

import pytest
from _loop import Clock, run
from _steps import FakeSteps

from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.controller.pools import PoolLoss, SlurmPools
from slurmrl.db import JobRecord, Store
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, Phase, RlRequest
from slurmrl.report.compute import JobReport, compute
from slurmrl.report.sources import from_store
from slurmrl.slurm import NodeInfo

LOST_AT = 1100.0  #: when Slurm lost the pool's allocation (Slurm job 9)
SEEN_AT = 4700.0  #: when the controller noticed: an hour later


def _job_held_both_gpus(store: Store) -> int:
    """Job 1, registered at 1000, held both GPUs of pool (Slurm job 9) from 1000 on."""
    pool = store.add_pool(gpus=2, opened_at=1000.0, slurm_job_id=9, nodes=("n1",),
                          gpu_indices=(0, 1))
    store.add_job(JobRecord(1, "u", 1001, RlRequest(gpus=2), JobState.RUNNING, 1000.0,
                            name="a", pool_id=pool, pool_gpus=(0, 1)))
    lid = store.add_request(pool_id=pool, job_id=1, phase=Phase.TRAIN, wanted=(0, 1),
                            min_gpus=2, requested_at=1000.0, deadline_at=1060.0)
    store.lease_granted(pool, Lease(lid, 1, Phase.TRAIN, frozenset({0, 1}), 1000.0,
                                    1000.0, 1060.0))
    return pool


def _row(store: Store) -> JobReport:
    return compute(from_store(store, None, SEEN_AT + 300)).jobs[0]


@run
async def test_a_pool_closed_as_lost_ends_its_jobs_when_it_ended() -> None:
    store, clock = Store(":memory:"), Clock()
    pool = _job_held_both_gpus(store)
    c = Controller(Config(), store, None, clock=clock)  # type: ignore[arg-type]
    await c.start()
    clock.now = 1200.0  # job 2 joined after the loss, before the controller noticed it
    store.add_job(JobRecord(2, "u", 1002, RlRequest(gpus=2), JobState.PENDING, clock.now))
    c.place_job(2, pool, (0, 1))
    clock.now = SEEN_AT
    await c.close_pool(pool, "pool lost", ended_at=LOST_AT)
    one, two = store.job(1), store.job(2)
    assert one is not None and one.state is JobState.CANCELLED
    assert one.ended_at == LOST_AT  # not SEEN_AT
    assert two is not None and two.ended_at == 1200.0  # never before it registered
    row = _row(store)
    # 2 GPUs x 100 s, held all along: it saved nothing (not 97.3% of 7400)
    assert (row.wall_s, row.granted_gpu_s, row.dedicated_gpu_s, row.saved) == (
        100.0, 200.0, 200.0, 0.0)
    await c.stop()


@run
async def test_members_left_in_a_closed_pool_at_a_restart_end_when_it_closed() -> None:
    # a crash in the middle of close_pool: the pool closed at the loss, job 1 still runs
    store, clock = Store(":memory:"), Clock()
    pool = _job_held_both_gpus(store)
    store.update_pool(pool, state="closed", reason="pool lost", closed_at=LOST_AT)
    clock.now = SEEN_AT
    c = Controller(Config(), store, None, clock=clock)  # type: ignore[arg-type]
    await c.start()
    job = store.job(1)
    assert job is not None and (job.state, job.reason) == (JobState.CANCELLED, "pool lost")
    assert job.ended_at == LOST_AT
    await c.stop()


class _Slurm:
    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo("n1", "IDLE", 8, 16, 64000, ("pools",))]


class _LostAllocator:
    """Slurm ended job 9 (the pool's allocation) at LOST_AT, with a node."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    def losses(self, slurm_job_ids: list[int]) -> list[PoolLoss]:
        return [PoolLoss(9, "NODE_FAIL", "node failure", ended_at=LOST_AT)] * (
            9 in slurm_job_ids)

    def tagged(self) -> list[int]:
        return []

    def close(self, slurm_job_id: int) -> None:
        self.closed.append(slurm_job_id)

    def recorded(self, slurm_job_id: int) -> None:
        pass

    def open(self, gpus: int, label: str = "", gpu_type: str | None = None,
             exclude: str | None = None) -> Any:
        raise AssertionError("nothing to place")


@run
async def test_a_pool_lost_while_the_controller_was_down_ends_its_job_at_the_loss() -> None:
    store, clock = Store(":memory:"), Clock()
    _job_held_both_gpus(store)
    clock.now = SEEN_AT  # the controller comes back an hour after the node failed
    pools = SlurmPools(allocator=_LostAllocator(), launcher=FakeSteps())  # type: ignore[arg-type]
    c = Controller(Config(), store, _Slurm(), pools=pools, clock=clock)  # type: ignore[arg-type]
    await c.start()
    job = store.job(1)
    assert job is not None and job.state is JobState.CANCELLED
    assert job.ended_at == pytest.approx(LOST_AT)
    row = _row(store)
    assert (row.dedicated_gpu_s, row.saved) == (200.0, 0.0)  # was 7400.0 and 97.3%
    await c.stop()


class _ForgottenAllocator(_LostAllocator):
    """Slurm forgot job 9 (MinJobAge passed while the controller was down): squeue no
    longer lists it; its accounting says it ended at LOST_AT, where it is kept."""

    def __init__(self, accounting: bool) -> None:
        super().__init__()
        self.accounting = accounting
        self.asked: list[dict[int, float]] = []

    def losses(self, slurm_job_ids: list[int]) -> list[PoolLoss]:
        return [PoolLoss(9, "GONE")] * (9 in slurm_job_ids)

    def ended_at(self, opened: dict[int, float]) -> dict[int, float]:
        self.asked.append(dict(opened))
        return {9: LOST_AT} if self.accounting else {}


@run
async def test_a_pool_slurm_forgot_while_the_controller_was_down_ends_at_its_accounted_end(
        ) -> None:
    for accounting, ended in ((True, LOST_AT), (False, SEEN_AT)):
        store, clock = Store(":memory:"), Clock()
        _job_held_both_gpus(store)
        clock.now = SEEN_AT
        allocator = _ForgottenAllocator(accounting)
        pools = SlurmPools(allocator=allocator, launcher=FakeSteps())  # type: ignore[arg-type]
        c = Controller(Config(), store, _Slurm(), pools=pools,  # type: ignore[arg-type]
                       clock=clock)
        await c.start()
        assert allocator.asked == [{9: 1000.0}]  # job 9, recorded open at 1000
        job = store.job(1)
        assert job is not None and job.state is JobState.CANCELLED
        # charged until Slurm's accounted end (2 GPUs x 100 s, was 7400); without
        # accounting, until it was seen gone (the limit docs/pools.md states)
        assert job.ended_at == pytest.approx(ended)
        assert store.gpu_seconds([1]) == {1: pytest.approx(2 * (ended - 1000.0))}
        await c.stop()
