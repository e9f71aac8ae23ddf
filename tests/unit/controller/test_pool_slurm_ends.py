"""What Slurm's end of a job or an allocation does to RL jobs and pools: a member's own
Slurm job requeued or completing, a window Slurm does not answer for, and a join into a
pool whose allocation ends before the joining job's own.

The controller and the pool manager are real; Slurm, the allocators and the launchers
are the fakes of test_pool_manager.py (fixed pools) and test_pool_manager_floating.py
(floating pools).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import test_pool_manager as fixed
import test_pool_manager_floating as floating
from _loop import run

from slurmrl.controller.pools import SlurmPool
from slurmrl.controller.validate import RpcError
from slurmrl.db import Store
from slurmrl.model import JobState
from slurmrl.slurm import JobInfo, SlurmError, SlurmJobState, SlurmTimeout

S = SlurmJobState
DAY_S = 86400.0


# -- a member's own Slurm job -------------------------------------------------------------
@run
async def test_a_member_whose_slurm_job_is_requeued_ends_and_is_not_placed_again(
        tmp_path: Path) -> None:
    # requeued after a node failure, job 21 stayed placed: its services and its pool's
    # allocation kept, and its next run's register got the old placement back
    site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE})
    await site.c.register(fixed.ALICE, 21, fixed.ENV)
    await site.settle()
    pool = site.job(21).pool_id
    site.slurm.running[21] = replace(site.slurm.running[21], state=S.PENDING, nodes=(),
                                     reason="BeginTime")
    await site.c.reconcile()
    await site.settle()

    job = site.job(21)
    assert job.state is JobState.CANCELLED
    assert job.reason.startswith("Slurm job requeued (PENDING, reason BeginTime)")
    assert fixed._live_roles(site.c.store, 21) == []
    assert site.c.store.pool(pool).state == "closed"  # type: ignore[arg-type, union-attr]
    assert site.allocator.closed == [101]

    # its next run (the same job id) is told why, not handed the last run's services
    site.slurm.running[21] = replace(site.slurm.running[21], state=S.RUNNING)
    with pytest.raises(RpcError, match="requeued") as err:
        await site.c.register(fixed.ALICE, 21, fixed.ENV)
    assert err.value.status == 409
    await site.c.stop()


@run
async def test_a_member_whose_slurm_job_ran_again_while_unseen_ends(tmp_path: Path) -> None:
    # requeued and running again before a reconcile saw it queued (the controller was
    # down meanwhile): its start time is after its registration
    site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE})
    await site.c.register(fixed.ALICE, 21, fixed.ENV)
    await site.settle()
    registered = site.job(21).registered_at
    for skew in (-5.0, 60.0):  # started before it registered (60 s: Slurm's clock ahead)
        site.slurm.running[21] = replace(site.slurm.running[21],
                                         start_time=registered + skew)
        await site.c.reconcile()
        assert site.job(21).state is JobState.RUNNING
    site.slurm.running[21] = replace(site.slurm.running[21],
                                     start_time=registered + 3600.0)
    await site.c.reconcile()
    await site.settle()

    job = site.job(21)
    assert job.state is JobState.CANCELLED
    assert job.reason.startswith("Slurm job requeued (running again)")
    assert site.allocator.closed == [101]
    await site.c.stop()


@run
async def test_the_next_run_of_a_requeued_job_is_refused_before_any_reconcile(
        tmp_path: Path) -> None:
    # requeued and started again within seconds (a node failure, an admin's requeue):
    # its next run's driver registered before a reconcile saw it, and was handed the
    # last run's placement and services
    site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE})
    site.slurm.running[21] = replace(site.slurm.running[21], start_time=time.time() - 30)
    first = await site.c.register(fixed.ALICE, 21, fixed.ENV)
    await site.settle()
    # another rank of the same run: the same job, nothing ended
    assert (await site.c.register(fixed.ALICE, 21, fixed.ENV)).job_id == first.job_id
    assert site.job(21).state is not JobState.CANCELLED
    pool = site.job(21).pool_id

    # the next run started 60 s after the first: within the clock skew a start time
    # after the registration is allowed, but it is not the start of the run registered
    site.slurm.running[21] = replace(site.slurm.running[21],
                                     start_time=site.slurm.running[21].start_time + 60)
    with pytest.raises(RpcError, match=r"requeued \(running again\)") as err:
        await site.c.register(fixed.ALICE, 21, fixed.ENV)
    assert err.value.status == 409
    await site.settle()
    assert site.job(21).state is JobState.CANCELLED
    assert fixed._live_roles(site.c.store, 21) == []
    assert site.c.store.pool(pool).state == "closed"  # type: ignore[arg-type, union-attr]
    await site.c.stop()


@run
async def test_a_rerun_within_the_clock_skew_is_seen_by_reconcile(tmp_path: Path) -> None:
    site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE})
    started = time.time() - 30
    site.slurm.running[21] = replace(site.slurm.running[21], start_time=started)
    await site.c.register(fixed.ALICE, 21, fixed.ENV)
    await site.settle()
    await site.c.reconcile()
    assert site.job(21).state is not JobState.CANCELLED  # the run that registered
    site.slurm.running[21] = replace(site.slurm.running[21], start_time=started + 90)
    await site.c.reconcile()
    await site.settle()
    assert site.job(21).state is JobState.CANCELLED
    assert site.job(21).reason.startswith("Slurm job requeued (running again)")
    await site.c.stop()


@pytest.mark.parametrize(("state", "reason", "ended_as", "ours", "why"), [
    (S.COMPLETING, "", S.CANCELLED, JobState.CANCELLED,
     "its Slurm job is completing (CANCELLED)"),
    (S.COMPLETING, "TimeLimit", None, JobState.FAILED,  # 22.05: a bare COMPLETING
     "its Slurm job is completing (TIMEOUT)"),
    (S.COMPLETING, "", None, JobState.CANCELLED, "its Slurm job is completing"),
    (S.REQUEUE_HOLD, "JobHeldAdmin", None, JobState.CANCELLED,
     "Slurm job requeued (REQUEUE_HOLD, reason JobHeldAdmin)"),
])
def test_a_member_whose_slurm_job_is_completing_or_held_ends_with_its_cause(
        tmp_path: Path, state: S, reason: str, ended_as: S | None, ours: JobState,
        why: str) -> None:
    # a scancelled job whose driver is stuck in the kernel stays COMPLETING: it kept its
    # placement, its services and the pool allocation for as long
    async def scenario() -> None:
        site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE})
        await site.c.register(fixed.ALICE, 21, fixed.ENV)
        await site.settle()
        site.slurm.running[21] = replace(site.slurm.running[21], state=state,
                                         reason=reason, ended_as=ended_as)
        await site.c.reconcile()
        await site.settle()
        job = site.job(21)
        assert job.state is ours and job.reason.startswith(why)
        assert fixed._live_roles(site.c.store, 21) == []
        assert site.allocator.closed == [101]
        await site.c.stop()

    asyncio.run(scenario())


# -- a floating pool's window Slurm does not answer for -----------------------------------
async def _join_while_the_only_member_ends(site: floating.Site, error: Exception) -> int:
    """Job 8 joins job 7's floating pool; job 7 ends while the window is being opened,
    and the open fails with `error`. The pool's id."""
    await site.register(floating.ALICE, 7)
    pool = site.job(7).pool_id
    assert pool is not None
    entered, go = threading.Event(), threading.Event()
    real = site.allocator.open

    def window_fails(gpus: int, label: str = "", node: str | None = None,
                     gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
        if node is None:  # a pool of its own
            return real(gpus, label, node)
        entered.set()
        go.wait(5.0)
        raise error

    site.allocator.open = window_fails  # type: ignore[method-assign]
    site.slurm.add(8, floating.BOB)
    await site.c.register(floating.BOB, 8, floating.ENV)
    while not entered.is_set():
        await asyncio.sleep(0.01)
    await site.c.end_job(7, JobState.COMPLETED, "driver done")
    go.set()
    await site.settle()
    return pool


@run
async def test_a_window_slurm_does_not_answer_for_sends_the_job_to_a_pool_of_its_own(
        tmp_path: Path) -> None:
    # a timed-out scontrol while the window started refused job 8 outright, and left
    # the pool its only member had left allocated for good
    site = await floating._site(Store(tmp_path / "c.db"))
    pool = await _join_while_the_only_member_ends(
        site, SlurmTimeout("no answer within 30 s", argv=["scontrol", "show", "job"]))

    job = site.job(8)
    assert job.state is JobState.RUNNING and job.pool_id not in (None, pool)
    assert site.c.store.pool(pool).state == "closed"  # type: ignore[union-attr]
    assert 101 in site.allocator.closed
    await site.c.stop()


@run
async def test_a_join_that_fails_otherwise_still_closes_the_pool_it_left_empty(
        tmp_path: Path) -> None:
    site = await floating._site(Store(tmp_path / "c.db"))
    pool = await _join_while_the_only_member_ends(site, RuntimeError("a bug"))

    job = site.job(8)
    assert job.state is JobState.FAILED and "a bug" in job.reason  # as before
    assert site.c.store.pool(pool).state == "closed"  # type: ignore[union-attr]
    assert 101 in site.allocator.closed
    await site.c.stop()


# -- a pool whose allocation ends before the joining job -------------------------------------
def _ends(slurm: fixed.FakeSlurm, job_id: int, in_s: float | None) -> None:
    """Slurm runs `job_id` (a driver's job or a pool's allocation) until `in_s` from
    now; None: with no time limit."""
    info = slurm.running.get(job_id) or JobInfo(job_id, "slurmrl-pool", "root", 0, S.RUNNING)
    slurm.running[job_id] = replace(
        info, end_time=None if in_s is None else time.time() + in_s,
        time_limit_min=None if in_s is None else max(1, int(in_s // 60)))


@pytest.mark.parametrize(("pool_left_s", "own_left_s", "joins"), [
    (60.0, 3 * DAY_S, False),  # would be cancelled with the pool in a minute
    (60.0, None, False),  # no time limit of its own
    (3 * DAY_S, 60.0, True),
    (None, 3 * DAY_S, True),  # a pool with no time limit takes anyone
])
def test_a_job_joins_no_pool_whose_allocation_ends_before_its_own_job(
        tmp_path: Path, pool_left_s: float | None, own_left_s: float | None,
        joins: bool) -> None:
    async def scenario() -> None:
        site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE,
                                                                 22: fixed.BOB})
        await site.c.register(fixed.ALICE, 21, fixed.ENV)
        await site.settle()
        _ends(site.slurm, 101, pool_left_s)
        _ends(site.slurm, 22, own_left_s)
        await site.c.register(fixed.BOB, 22, fixed.ENV)
        await site.settle()
        job = site.job(22)
        assert job.state is JobState.RUNNING
        assert (job.pool_id == site.job(21).pool_id) is joins
        await site.c.stop()

    asyncio.run(scenario())


class DownSlurm(fixed.FakeSlurm):
    """Answers about one job (registration), not about several (squeue)."""

    def jobs(self, job_ids: list[int] | None = None, user: str | None = None
             ) -> list[JobInfo]:
        raise SlurmError("squeue timed out")


@run
async def test_a_join_goes_on_as_before_where_slurm_cannot_be_asked(tmp_path: Path) -> None:
    site = await fixed._site(Store(tmp_path / "c.db"), jobs={21: fixed.ALICE, 22: fixed.BOB})
    await site.c.register(fixed.ALICE, 21, fixed.ENV)
    await site.settle()
    down = DownSlurm()
    down.running = site.slurm.running
    site.c.slurm = down  # type: ignore[assignment]
    _ends(down, 101, 60.0)
    await site.c.register(fixed.BOB, 22, fixed.ENV)
    await site.settle()
    assert site.job(22).pool_id == site.job(21).pool_id
    await site.c.stop()


@run
async def test_a_floating_join_skips_a_pool_whose_window_ends_before_the_job(
        tmp_path: Path) -> None:
    site = await floating._site(Store(tmp_path / "c.db"))
    await site.register(floating.ALICE, 7)
    _ends(site.slurm, 101, 60.0)  # its first window, the pool's allocation
    site.slurm.add(8, floating.BOB)
    _ends(site.slurm, 8, 3 * DAY_S)
    await site.c.register(floating.BOB, 8, floating.ENV)
    await site.settle()

    job = site.job(8)
    assert job.state is JobState.RUNNING and job.pool_id not in (None, site.job(7).pool_id)
    assert [(j, node) for j, _, node in site.allocator.opened] == [(101, None), (102, None)]
    await site.c.stop()
