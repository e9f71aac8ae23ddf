"""A grant's handoff as the pool manager runs it, with the fakes of test_pool_manager.py:
a plan that cannot be made gives the lease back naming why, a restart asks each service
its residency, and `min_gpus` asks only for leases the job's services can run on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from _loop import run
from test_pool_manager import (
    ALICE,
    BOB,
    FakeAllocator,
    FakeHandle,
    FakeLauncher,
    FakeRunning,
    FakeSlurm,
    JoinFirst,
    _site,
)

from slurmrl.config import Config
from slurmrl.config.schema import ServicesConfig
from slurmrl.controller import pools as pools_module
from slurmrl.controller.core import Controller
from slurmrl.controller.pools import SlurmPools
from slurmrl.controller.services import ServiceSpec
from slurmrl.db import Store
from slurmrl.leases import LeaseError
from slurmrl.model import LeaseState, Phase, Residency
from slurmrl.worker.handle import ServiceUnreachable

ENV = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"}


@run
async def test_a_grant_whose_residency_cannot_be_made_is_given_back_naming_why(
        tmp_path: Path) -> None:
    # the grant went through with the partner's services still on its GPUs, and only
    # the controller's log said why
    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB})
    for job_id, who in ((1, ALICE), (2, BOB)):
        await site.c.register(who, job_id, ENV)
        await site.settle()
    assert site.job(1).pool_id == site.job(2).pool_id is not None
    site.pools._gpu_bytes = 0  # no phase fits a GPU now
    first = site.c.scheduler.request(site.job(1), Phase.ROLLOUT)
    waiting = site.c.scheduler.request(site.job(2), Phase.TRAIN)
    assert first.lease is not None and waiting.lease is None
    with pytest.raises(LeaseError, match=f"lease {first.request_id} .* given back: its "
                       "services cannot be made resident: .* need .* on pool GPU 0"):
        await site.pools.before_answer(site.job(1), first.lease)
    rec = site.c.store.lease(first.request_id)
    assert rec is not None and rec.state is LeaseState.RELEASED
    assert site.job(1).phase == "idle"
    table = site.c.scheduler.tables[site.job(1).pool_id or 0]
    assert table.lease(waiting.request_id) is not None  # its GPUs went to the next waiter
    handles = [lv.handle for lv in site.pools._live.values()]
    assert all(isinstance(h, FakeHandle) and not h.waits for h in handles)  # none moved
    await site.c.stop()


class ActivateTimesOut(FakeHandle):
    def activate(self, timeout_s: float | None = None) -> dict[str, Any]:
        raise ServiceUnreachable("activate", None, "no whole answer within 120 s")


@run
async def test_a_restart_takes_each_services_residency_from_the_service(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # an activation that timed out (the DB still says parked) was forgotten by a
    # restart: the service was taken as parked and certain, wherever it really was
    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB})
    launch = site.launcher.launch

    def launch_slow(pool_job_id: int, node: str, spec: ServiceSpec,
                    secret: str) -> FakeRunning:
        running = launch(pool_job_id, node, spec, secret)
        if (spec.job_id, spec.role) == (2, "trainer"):
            running.handle = ActivateTimesOut()
        return running

    site.launcher.launch = launch_slow  # type: ignore[method-assign]
    for job_id, who in ((1, ALICE), (2, BOB)):
        await site.c.register(who, job_id, ENV)
        await site.settle()
    for job_id in (1, 2):
        ticket = site.c.scheduler.request(site.job(job_id), Phase.TRAIN)
        assert ticket.lease is not None
        await site.pools.before_answer(site.job(job_id), ticket.lease)
        site.c.scheduler.release(site.job(job_id), ticket.request_id, {})
    assert site.pools._live[(2, "trainer")].footprint.uncertain
    recorded = {(s.job_id, s.role): s.residency for s in site.c.store.services()}
    assert recorded[(2, "trainer")] == "parked" and recorded[(2, "rollout")] == "parked"
    await site.c.stop()

    # what each service says after the restart; job 2's rollout does not answer
    says = {(1, "rollout"): "parked", (1, "trainer"): "active", (2, "trainer"): "active"}

    class Handle(FakeHandle):
        def __init__(self, address: str, secret: str, job: str, role: str,
                     **kwargs: Any) -> None:
            super().__init__()
            self.key = (int(job), role)

        def status(self, timeout_s: float | None = None) -> dict[str, Any]:
            if self.key not in says:
                raise ServiceUnreachable("status", None, "connection refused")
            return {"residency": says[self.key]}

    monkeypatch.setattr(pools_module, "ServiceHandle", Handle)
    slurm = FakeSlurm()
    slurm.add(1, ALICE)
    slurm.add(2, BOB)
    pools = SlurmPools(allocator=FakeAllocator(201), launcher=FakeLauncher())  # type: ignore[arg-type]
    c = Controller(Config(), Store(tmp_path / "c.db"), slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=JoinFirst())
    await c.start()
    seen = {k: (lv.footprint.residency, lv.footprint.uncertain)
            for k, lv in pools._live.items()}
    assert seen == {(1, "rollout"): (Residency.PARKED, False),
                    (1, "trainer"): (Residency.ACTIVE, False),
                    (2, "trainer"): (Residency.ACTIVE, False),  # the activation landed
                    (2, "rollout"): (Residency.ACTIVE, True)}  # unknown: as a timed-out park
    recorded = {(s.job_id, s.role): s.residency for s in c.store.services(live_only=True)}
    assert recorded[(2, "trainer")] == "active"
    await c.stop()


@run
async def test_min_gpus_asks_only_for_whole_services(tmp_path: Path) -> None:
    # a train lease on one of the two GPUs of a job's trainer (one engine) was granted,
    # and its handoff activated that trainer over both, one of them another job's
    cfg = Config(services=ServicesConfig(rollout_replica_gpus=1))
    site = await _site(Store(tmp_path / "c.db"), cfg, jobs={1: ALICE})
    await site.c.register(ALICE, 1, ENV)
    await site.settle()
    sch = site.c.scheduler
    with pytest.raises(LeaseError, match="train services span all 2 GPUs of the phase and "
                       "cannot run on part of them"):
        sch.request(site.job(1), Phase.TRAIN, min_gpus=1)
    ticket = sch.request(site.job(1), Phase.ROLLOUT, min_gpus=1)  # one replica of 1 GPU
    assert ticket.lease is not None and len(ticket.lease.gpus) == 2  # both were free
    await site.c.stop()
