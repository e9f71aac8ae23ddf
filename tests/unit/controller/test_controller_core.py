"""Controller operations users see directly: registration, GPU-seconds in status, a
release that withdraws a request its driver gave up on.

A real Controller on a real Store with the default (attached) pool manager; Slurm is a
fake, time a settable clock.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from _loop import Clock, run

from policies.base import Admission, JobSnapshot, SiteLimits, Verdict
from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.controller.server import Api
from slurmrl.controller.views import job_view
from slurmrl.db import JobRecord, Store
from slurmrl.leases import LeaseError
from slurmrl.model import Identity, JobState, Mux, Phase, RlRequest
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


def _two_jobs_in_a_pool() -> tuple[Store, Controller, Clock]:
    """Jobs 1 and 2 running in one pool of 2 GPUs; a controller on a settable clock."""
    store = Store(":memory:")
    pool = store.add_pool(gpus=2, opened_at=0.0)
    for job_id in (1, 2):
        store.add_job(JobRecord(job_id, "u", 1000 + job_id, RlRequest(gpus=2),
                                JobState.RUNNING, 0.0, pool_id=pool, pool_gpus=(0, 1)))
    clock = Clock()
    c = Controller(Config(), store, None, clock=clock)  # type: ignore[arg-type]
    c.scheduler.restore()
    return store, c, clock


def _job_of(store: Store) -> Callable[[int], JobRecord]:
    def job(job_id: int) -> JobRecord:
        rec = store.job(job_id)
        assert rec is not None
        return rec
    return job


@run
async def test_status_gpu_seconds_of_a_held_lease_that_shrank_or_grew_match_the_ledger(
) -> None:
    store, c, clock = _two_jobs_in_a_pool()
    s = c.scheduler
    job = _job_of(store)

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


@run
async def test_status_slowdown_is_the_time_a_job_waited_for_gpus_its_partner_held() -> None:
    store, c, clock = _two_jobs_in_a_pool()
    store.add_job(JobRecord(3, "u", 1003, RlRequest(gpus=2), JobState.PENDING, 0.0))
    s = c.scheduler
    job = _job_of(store)

    def slowdowns(now: float) -> dict[int, float | None]:
        waits = store.lease_waits([1, 2, 3], now)
        return {j: job_view(job(j), private=True, gpu_s=0.0, now=now,
                            waits=waits.get(j))["slowdown"] for j in (1, 2, 3)}

    clock.now = 100.0
    a = s.request(job(1), Phase.TRAIN)  # job 1 trains on both GPUs from t=100
    clock.now = 110.0
    b = s.request(job(2), Phase.TRAIN)  # job 2 asks at t=110: waits for job 1
    assert b.lease is None
    clock.now = 120.0
    # job 2 has only waited so far (no slowdown to show yet); job 3 has not been placed
    assert slowdowns(clock.now) == {1: pytest.approx(1.0), 2: None, 3: None}
    clock.now = 130.0
    s.release(job(1), a.request_id, {})  # job 2 is granted at t=130, after 20 s
    clock.now = 150.0
    got = slowdowns(clock.now)
    assert got[1] == pytest.approx(1.0)
    assert got[2] == pytest.approx(40.0 / 20.0)  # 40 s since its request, 20 s of it waiting
    s.release(job(2), b.request_id, {})
    clock.now = 190.0  # no more waits: its slowdown so far falls as it runs on
    assert slowdowns(clock.now)[2] == pytest.approx(80.0 / 60.0)


@run
async def test_releasing_a_waiting_request_withdraws_it_and_a_granted_one_is_released(
) -> None:
    store, c, _ = _two_jobs_in_a_pool()
    job, api = _job_of(store), Api(c)
    bob = Identity(1002, 1002, "u")  # job 2's owner
    a = c.scheduler.request(job(1), Phase.TRAIN)
    b = c.scheduler.request(job(2), Phase.ROLLOUT)  # waits: its driver then gives up
    got = api.release_op(bob, 2, b.request_id, {"timing": None})["lease"]
    assert (got["lease_id"], got["state"]) == (b.request_id, "cancelled")
    assert got["reason"] == "withdrawn by the driver"
    with pytest.raises(LeaseError):  # a second try: nothing left to withdraw (409)
        api.release_op(bob, 2, b.request_id, {"timing": None})
    api.release_op(Identity(1001, 1001, "u"), 1, a.request_id, {"timing": None})
    d = c.scheduler.request(job(2), Phase.ROLLOUT)  # granted at once: nothing queued
    assert d.lease is not None
    got = api.release_op(bob, 2, d.request_id, {"timing": {"busy_s": 0.0}})["lease"]
    assert got["state"] == "released"


def test_others_see_only_the_kind_of_a_jobs_reason_not_its_service_log() -> None:
    why = ("refused: service rollout did not start: Traceback ... "
           "OSError: /home/bob/secret-model/config.json not found")
    job = JobRecord(5, "bob", 1005, RlRequest(gpus=2), JobState.FAILED, 0.0, reason=why,
                    ended_at=10.0)
    assert job_view(job, private=True, gpu_s=0.0, now=10.0)["reason"] == why
    public = job_view(job, private=False, gpu_s=None, now=10.0)
    assert public["reason"] == "refused"
    assert "/home/bob" not in str(public)
    pending = replace(job, state=JobState.PENDING, reason="PoolPending: no free GPUs")
    assert job_view(pending, private=False, gpu_s=None, now=1.0)["reason"] == "PoolPending"


class OneJobSlurm:
    """Slurm knows one running job of alice's, submitted to partition `drivers`."""

    def job(self, job_id: int) -> JobInfo:
        return JobInfo(job_id, "grpo", "alice", 1001, SlurmJobState.RUNNING,
                       partition="drivers", nodes=("n1",))


@pytest.mark.parametrize(("allowed", "accepted"), [(["drivers"], True), (["rl"], False)])
@run
async def test_site_limits_partitions_judge_the_partition_the_job_was_submitted_to(
        allowed: list[str], accepted: bool) -> None:
    # the controller's pools all go to `slurm.pool_partition` ("pools"): judged by that,
    # `partitions` would accept every job or none
    from slurmrl.config import load
    from slurmrl.controller.validate import RpcError

    cfg = load(env={}, overrides={"policies.params.site-limits.partitions": allowed})
    store = Store(":memory:")
    c = Controller(cfg, store, OneJobSlurm())  # type: ignore[arg-type]
    await c.start()
    env = {"SLURMRL_GPUS": "1", "SLURMRL_MODEL": "tiny"}
    try:
        if accepted:
            assert (await c.register(ALICE, 7, env)).state is JobState.PENDING
        else:
            with pytest.raises(RpcError) as err:
                await c.register(ALICE, 7, env)
            assert err.value.status == 403
            assert "accepted from partitions rl only; this job is in 'drivers'" in str(
                err.value)
            rec = store.job(7)
            assert rec is not None and rec.state is JobState.FAILED
            assert "'drivers'" in rec.reason
    finally:
        await c.stop()


@run
async def test_a_max_slowdown_over_the_sites_cap_is_accepted_and_the_user_told() -> None:
    store = Store(":memory:")
    c = Controller(Config(), store, OneJobSlurm())  # type: ignore[arg-type]
    await c.start()
    env = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny", "SLURMRL_MAX_SLOWDOWN": "3.0"}
    job = await c.register(ALICE, 100, env)
    assert job.state is JobState.PENDING
    # what `slurmrl status` shows while it waits for a pool
    assert job.reason == "PoolPending (--rl-max-slowdown=3.0 capped at the site's 1.5)"
    await c.stop()


class Judges:
    """A site admission policy that gives the verdict it is given (a slip: a string)."""

    name = "judges"

    def __init__(self, verdict: Any) -> None:
        self.verdict = verdict

    def admit(self, job: JobSnapshot, limits: SiteLimits) -> Admission:
        return Admission(self.verdict, "told so")


@pytest.mark.parametrize(("verdict", "gpus", "why"), [
    ("reject", 1, "told so"),  # it was accepted
    # any other value refuses the job (it was accepted, past the GPU limit too)
    ("maybe", 4, "admission policy 'judges' gave no valid verdict ('maybe')"),
    # a dedicated job is held to the site's GPU limit as an accepted one is
    (Verdict.DEDICATED, 4, "--rl-gpus=4 exceeds this site's limit of 2"),
    ("dedicated", 4, "--rl-gpus=4 exceeds this site's limit of 2"),
])
@run
async def test_an_admission_verdict_is_read_as_a_verdict_and_the_gpu_limit_holds(
        caplog: pytest.LogCaptureFixture, verdict: Any, gpus: int, why: str) -> None:
    from slurmrl.config.schema import LimitsConfig
    from slurmrl.controller.validate import RpcError

    store = Store(":memory:")
    c = Controller(Config(limits=LimitsConfig(max_gpus_per_job=2)), store,
                   OneJobSlurm())  # type: ignore[arg-type]
    c.policies = replace(c.policies, admission=Judges(verdict))
    await c.start()
    try:
        with pytest.raises(RpcError) as err:
            await c.register(ALICE, 7, {"SLURMRL_GPUS": str(gpus), "SLURMRL_MODEL": "tiny"})
        assert (err.value.status, str(err.value)) == (403, f"admission refused: {why}")
        rec = store.job(7)
        assert rec is not None and rec.state is JobState.FAILED
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert errors == ([] if verdict != "maybe" else [
            "admission policy 'judges' gave job 7 the verdict 'maybe', none of accept, "
            "reject, dedicated: refused"])
    finally:
        await c.stop()


@run
async def test_a_dedicated_verdict_given_as_a_string_runs_the_job_dedicated() -> None:
    store = Store(":memory:")
    c = Controller(Config(), store, OneJobSlurm())  # type: ignore[arg-type]
    c.policies = replace(c.policies, admission=Judges("dedicated"))
    await c.start()
    job = await c.register(ALICE, 7, {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"})
    assert job.state is JobState.PENDING and job.request.mux is Mux.OFF  # run dedicated
    assert job.reason == "PoolPending (dedicated: told so)"
    await c.stop()
