"""Controller operations users see directly: registration and GPU-seconds in status.

A real Controller on a real Store with the default (attached) pool manager; Slurm is a
fake, time a settable clock.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
from _loop import Clock, run

from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.db import JobRecord, Store
from slurmrl.model import Identity, JobState, Phase, RlRequest
from slurmrl.slurm import JobInfo, SlurmJobState

ALICE = Identity(1001, 1001, "alice")


class TwoAtOnceSlurm:
    """Answers `job()` only once two callers ask at the same time (two driver ranks)."""

    def __init__(self) -> None:
        self.both = threading.Barrier(2, timeout=10.0)

    def job(self, job_id: int) -> JobInfo:
        self.both.wait()
        return JobInfo(job_id, "grpo", "alice", 1001, SlurmJobState.RUNNING,
                       partition="drivers", nodes=("n1",))


@run
async def test_two_ranks_registering_the_same_job_at_once_both_get_it() -> None:
    store = Store(":memory:")
    c = Controller(Config(), store, TwoAtOnceSlurm())  # type: ignore[arg-type]
    await c.start()
    env = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"}
    first, second = await asyncio.gather(c.register(ALICE, 100, env),
                                         c.register(ALICE, 100, env))
    assert first.job_id == second.job_id == 100
    assert first.secret == second.secret  # one registration, answered twice
    assert [j.job_id for j in store.jobs()] == [100]
    await c.stop()


@run
async def test_status_gpu_seconds_of_a_held_lease_that_shrank_or_grew_match_the_ledger(
) -> None:
    store = Store(":memory:")
    pool = store.add_pool(gpus=2, opened_at=0.0)
    for job_id in (1, 2):
        store.add_job(JobRecord(job_id, "u", 1000 + job_id, RlRequest(gpus=2),
                                JobState.RUNNING, 0.0, pool_id=pool, pool_gpus=(0, 1)))
    clock = Clock()
    c = Controller(Config(), store, None, clock=clock)  # type: ignore[arg-type]
    c.scheduler.restore()
    s = c.scheduler

    def job(job_id: int) -> JobRecord:
        rec = store.job(job_id)
        assert rec is not None
        return rec

    # job 1's rollout: both GPUs for 10 s, then one for 10 s
    a = s.request(job(1), Phase.ROLLOUT)
    clock.now += 10
    s.shrink(job(1), a.request_id, keep=1)
    clock.now += 10
    assert c.gpu_seconds_now([1]) == {1: pytest.approx(30.0)}
    s.release(job(1), a.request_id, {})
    assert store.gpu_seconds([1]) == {1: pytest.approx(30.0)}

    # job 2's elastic rollout: GPU 0 while job 1 holds GPU 1, both once job 1 is done
    b = s.request(job(1), Phase.ROLLOUT)
    s.shrink(job(1), b.request_id, local_gpus=[1])
    d = s.request(job(2), Phase.ROLLOUT, min_gpus=1)
    assert d.lease is not None and d.lease.gpus == {0}
    s.release(job(1), b.request_id, {})
    clock.now += 10
    s.grow(job(2), d.request_id, [0, 1])
    clock.now += 10
    assert c.gpu_seconds_now([1, 2])[2] == pytest.approx(30.0)
    s.release(job(2), d.request_id, {})
    assert store.gpu_seconds([2]) == {2: pytest.approx(30.0)}
