"""The Slurm pool manager's lifecycle around placements, endings and restarts.

A real Controller, Store, LeaseScheduler and `SlurmPools` run on one event loop; Slurm,
the pool allocator and the service launcher are fakes (no daemons, no processes). A
launch can be held at a gate, so a test decides what happens while a job's services
are still coming up. Pairing is a test policy (join the first open pool, else open
one), so each test says where a job goes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
from _loop import run
from _steps import FakeSteps

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from slurmrl.auth.tokens import mint_secret
from slurmrl.config import Config
from slurmrl.config.schema import LimitsConfig, ServicesConfig
from slurmrl.controller.core import Controller
from slurmrl.controller.pools import (
    PoolLoss,
    PoolPending,
    SlurmPool,
    SlurmPools,
)
from slurmrl.controller.residency import footprints_for_job
from slurmrl.controller.services import ServiceLaunchError, ServiceSpec
from slurmrl.controller.validate import RpcError
from slurmrl.db import JobRecord, Store
from slurmrl.gpu.estimate import GiB
from slurmrl.leases import LeaseError
from slurmrl.model import Identity, JobState, Phase, RlRequest
from slurmrl.slurm import JobInfo, NodeInfo, SlurmError, SlurmJobState
from slurmrl.worker.handle import ServiceUnreachable

ALICE = Identity(1001, 1001, "alice")
BOB = Identity(1002, 1002, "bob")
ENV = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"}
#: unreachable (connection refused at once): a re-attached service's stop fails fast;
#: `host:port/launch`, as a service announces itself
DEAD_ADDRESS = "127.0.0.1:1/0123456789abcdef"


class FakeSlurm:
    """The drivers' Slurm jobs, all running on one node."""

    def __init__(self) -> None:
        self.running: dict[int, JobInfo] = {}

    def add(self, job_id: int, who: Identity) -> None:
        self.running[job_id] = JobInfo(job_id, f"job{job_id}", who.user, who.uid,
                                       SlurmJobState.RUNNING, partition="drivers",
                                       nodes=("n1",))

    def job(self, job_id: int) -> JobInfo | None:
        return self.running.get(job_id)

    def jobs(self, job_ids: list[int] | None = None, user: str | None = None) -> list[JobInfo]:
        return [j for j in self.running.values() if job_ids is None or j.job_id in job_ids]

    def nodes(self) -> list[NodeInfo]:
        return [NodeInfo("n1", "IDLE", 8, 16, 64000, ("pools",))]


class FakeAllocator:
    """Pools open at once as Slurm jobs 101, 102, ...; `closed` lists the scancelled.
    Slurm runs each until its cancel (`tagged`: the controller's own allocations)."""

    def __init__(self, first: int = 101) -> None:
        self.next = first
        self.closed: list[int] = []
        self.running: set[int] = set()
        self.asked: list[tuple[int, str | None]] = []  #: (GPUs, GPU type) of each pool
        self.excluded: list[str | None] = []  #: the node each pool was kept off

    def open(self, gpus: int, label: str = "", gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
        self.asked.append((gpus, gpu_type))
        self.excluded.append(exclude)
        self.next += 1
        self.running.add(self.next - 1)
        return SlurmPool(self.next - 1, "pools", "n1", ("n1",), tuple(range(gpus)))

    def recorded(self, slurm_job_id: int) -> None:
        pass

    def tagged(self) -> list[int]:
        return sorted(self.running)

    def close(self, slurm_job_id: int) -> None:
        self.closed.append(slurm_job_id)
        self.running.discard(slurm_job_id)

    def losses(self, slurm_job_ids: list[int]) -> list[Any]:
        return []

    def ended_at(self, opened: Mapping[int, float]) -> dict[int, float]:
        """Slurm's accounting says nothing (none kept)."""
        return {}


class FakeHandle:
    def __init__(self) -> None:
        self.waits: list[float | None] = []  #: each park's and activation's time limit

    def activate(self, timeout_s: float | None = None) -> dict[str, Any]:
        self.waits.append(timeout_s)
        return {"residency": "active"}

    def park(self, level: int, timeout_s: float | None = None) -> dict[str, Any]:
        self.waits.append(timeout_s)
        return {"residency": "parked" if level == 1 else "dropped"}

    def status(self) -> dict[str, Any]:
        return {}

    def stop(self, timeout_s: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class FakeRunning:
    spec: ServiceSpec
    step_id: str = "0"
    address: str = DEAD_ADDRESS
    handle: FakeHandle = field(default_factory=FakeHandle)
    control_secret: str = "c" * 64


class FakeLauncher(FakeSteps):
    """Services come up at once, unless `gate` is cleared (a launch then waits for it)
    or their role is in `fail_roles`."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.entered: list[tuple[int, str]] = []  #: launches begun: (job id, role)
        self.stopped: list[tuple[int, str]] = []
        self.fail_roles: set[str] = set()

    def launch(self, pool_job_id: int, node: str, spec: ServiceSpec,
               secret: str) -> FakeRunning:
        self.entered.append((spec.job_id, spec.role))
        assert self.gate.wait(10.0), "a test left a launch gated"
        if spec.role in self.fail_roles:
            raise ServiceLaunchError(f"{spec.name} did not start: CUDA OOM at model load")
        assert spec.service_id is not None, "a service's step is named after its record"
        self.steps.setdefault(pool_job_id, set()).add(spec.service_id)
        return FakeRunning(spec)

    def stop(self, svc: FakeRunning) -> None:
        self.stopped.append((svc.spec.job_id, svc.spec.role))
        for ids in self.steps.values():
            ids.discard(svc.spec.service_id or 0)



class JoinFirst:
    """Pairing for these tests: join the first open pool, else open one."""

    name = "join-first"
    mode = PoolMode.LEASE

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        pool = next((p.pool_id for p in snap.pools), None)
        return [Placement(j.job_id, Action.OPEN, -1, j.request.gpus) if pool is None
                else Placement(j.job_id, Action.JOIN, pool) for j in snap.waiting]


async def drain(pools: SlurmPools) -> None:
    """Wait until the pool manager's tasks, and those they start, are done."""
    while pools._tasks:
        await asyncio.gather(*list(pools._tasks), return_exceptions=True)
        # a task just done leaves the set in its done callback, run by the loop after
        # it; on Python 3.12 a gather of done tasks returns without yielding to the
        # loop, so without this the while spun on that task forever (seen on 3.12)
        await asyncio.sleep(0)


@dataclass
class Site:
    c: Controller
    pools: SlurmPools
    slurm: FakeSlurm
    allocator: FakeAllocator
    launcher: FakeLauncher

    async def settle(self) -> None:
        """Wait until the pool manager has nothing left to do (placements included)."""
        await drain(self.pools)

    async def until(self, cond: Callable[[], bool], timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not cond():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.01)

    def job(self, job_id: int) -> JobRecord:
        job = self.c.store.job(job_id)
        assert job is not None
        return job


async def _site(store: Store, cfg: Config | None = None, *, first_pool: int = 101,
                jobs: Mapping[int, Identity] | None = None,
                sweep_interval_s: float = 60.0) -> Site:
    slurm, allocator, launcher = FakeSlurm(), FakeAllocator(first_pool), FakeLauncher()
    for job_id, who in (jobs or {}).items():
        slurm.add(job_id, who)
    pools = SlurmPools(allocator=allocator, launcher=launcher,  # type: ignore[arg-type]
                       sweep_interval_s=sweep_interval_s)
    c = Controller(cfg or Config(), store, slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=JoinFirst())
    await c.start()
    return Site(c, pools, slurm, allocator, launcher)


def _live_roles(store: Store, job_id: int) -> list[str]:
    return [s.role for s in store.services(job_id=job_id) if s.state == "running"]


@run
async def test_a_restart_after_a_crash_mid_placement_places_the_job_anew(
        tmp_path: Path) -> None:
    # what the pool manager had written when the controller died between job 7's two
    # service launches: a pool opened for it, its rollout up, its trainer launching
    store = Store(tmp_path / "c.db")
    store.add_job(JobRecord(7, "alice", 1001, RlRequest(2, "tiny"), JobState.PENDING, 1.0,
                            reason="PoolPending", secret=mint_secret()))
    pool = store.add_pool(gpus=2, opened_at=1.0, slurm_job_id=101, nodes=("n1",),
                          gpu_indices=(0, 1))
    rollout = store.add_service(job_id=7, role="rollout", started_at=1.0, pool_id=pool,
                                backend="tiny", gpus=(0, 1))
    store.update_service(rollout, step_id="0", address=DEAD_ADDRESS, residency="active",
                         state="running")
    store.add_service(job_id=7, role="trainer", started_at=1.0, pool_id=pool,
                      backend="tiny", gpus=(0, 1))

    site = await _site(store, first_pool=201, jobs={7: ALICE})  # start() does not raise
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.RUNNING and job.pool_id not in (None, pool)
    old = [s for s in store.services(job_id=7) if s.pool_id == pool]
    assert [s.state for s in old] == ["stopped", "stopped"]
    assert all(s.ended_at is not None for s in old)
    assert store.pool(pool).state == "closed"  # type: ignore[union-attr]
    assert site.allocator.closed == [101]  # its allocation released
    assert sorted(_live_roles(store, 7)) == ["rollout", "trainer"]  # launched anew
    # each with the controller's own key to it kept, for a restart to re-attach with
    assert {s.control_secret for s in store.services(job_id=7) if s.state == "running"} \
        == {"c" * 64}
    await site.c.stop()


@run
async def test_a_restart_kills_the_steps_of_a_joiner_caught_mid_placement(
        tmp_path: Path) -> None:
    # the controller died while job 7 joined job 8's pool: 7's rollout up, its trainer's
    # step starting (no address recorded). Job 8 keeps the pool open, so its allocation
    # is not cancelled: 7's steps ran on, holding their GPU memory, until the pool's end
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=1.0, slurm_job_id=101, nodes=("n1",),
                          gpu_indices=(0, 1))
    store.add_job(JobRecord(8, BOB.user, BOB.uid, RlRequest(2, "tiny"), JobState.RUNNING,
                            1.0, pool_id=pool, pool_gpus=(0, 1), secret=mint_secret()))
    store.add_job(JobRecord(7, ALICE.user, ALICE.uid, RlRequest(2, "tiny"),
                            JobState.PENDING, 2.0, reason="PoolPending",
                            secret=mint_secret()))
    ids = {}
    for job_id, role, up in ((8, "rollout", True), (8, "trainer", True),
                             (7, "rollout", True), (7, "trainer", False)):
        ids[job_id, role] = store.add_service(job_id=job_id, role=role, started_at=1.0,
                                              pool_id=pool, backend="tiny", gpus=(0, 1))
        if up:
            store.update_service(ids[job_id, role], step_id="0", address=DEAD_ADDRESS,
                                 residency="active", state="running",
                                 control_secret="c" * 64)
    slurm, allocator, launcher = FakeSlurm(), FakeAllocator(201), FakeLauncher()
    slurm.add(7, ALICE)
    slurm.add(8, BOB)
    allocator.running.add(101)
    # what Slurm lists in the pool: all but 7's trainer, whose srun is still starting it
    launcher.steps[101] = {ids[8, "rollout"], ids[8, "trainer"], ids[7, "rollout"]}
    pools = SlurmPools(allocator=allocator, launcher=launcher,  # type: ignore[arg-type]
                       sweep_interval_s=0.0)
    c = Controller(Config(), store, slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=JoinFirst())
    await c.start()
    site = Site(c, pools, slurm, allocator, launcher)
    await site.settle()
    # 7's rollout, which no controller runs any more, is killed; 8's are untouched
    assert launcher.killed == [(101, ids[7, "rollout"])]
    assert {ids[8, "rollout"], ids[8, "trainer"]} <= launcher.steps[101]
    # the trainer's step shows up once its srun gets it going: killed at the next sweep
    launcher.steps[101].add(ids[7, "trainer"])
    await pools.reconcile()
    await site.settle()
    assert launcher.killed == [(101, ids[7, "rollout"]), (101, ids[7, "trainer"])]
    # 7 is placed anew (here in the same pool), its new services' steps left running
    assert site.job(7).state is JobState.RUNNING
    new = {s.service_id for s in store.services(job_id=7, live_only=True)}
    assert len(new) == 2 and new <= launcher.steps[101]
    assert {ids[8, "rollout"], ids[8, "trainer"]} <= launcher.steps[101]
    assert allocator.closed == []
    await c.stop()


@run
async def test_each_sweep_prunes_the_logs_of_allocations_no_open_pool_holds(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE}, sweep_interval_s=0.0)
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    await site.pools.reconcile()
    # at start (nothing held yet), then with job 7's pool held
    assert site.launcher.pruned[0] == ([], 14 * 86400.0)
    assert site.launcher.pruned[-1] == ([101], 14 * 86400.0)
    await site.c.stop()
    # 0 keeps them for ever: never asked
    off = Config(services=ServicesConfig(log_retention_days=0))
    site = await _site(Store(tmp_path / "d.db"), off, jobs={7: ALICE}, sweep_interval_s=0.0)
    await site.pools.reconcile()
    assert site.launcher.pruned == []
    await site.c.stop()


@run
async def test_a_restart_ends_the_job_whose_service_an_older_release_launched(
        tmp_path: Path) -> None:
    # the database of a release before `host:port/launch`: job 7's rollout is recorded
    # at a plain `host:port`, which no handle of this release takes. The restart raised
    # (ValueError) and the controller exited, at every restart
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=1.0, slurm_job_id=101, nodes=("n1",),
                          gpu_indices=(0, 1))
    for job_id, who, rollout in ((7, ALICE, "n1:5000"), (8, BOB, DEAD_ADDRESS)):
        store.add_job(JobRecord(job_id, who.user, who.uid, RlRequest(2, "tiny"),
                                JobState.RUNNING, 1.0, pool_id=pool, pool_gpus=(0, 1),
                                secret=mint_secret()))
        for role, address in (("rollout", rollout), ("trainer", DEAD_ADDRESS)):
            sid = store.add_service(job_id=job_id, role=role, started_at=1.0,
                                    pool_id=pool, backend="tiny", gpus=(0, 1))
            store.update_service(sid, step_id="0", address=address, residency="active",
                                 state="running", control_secret="c" * 64)

    site = await _site(store, jobs={7: ALICE, 8: BOB})  # start() does not raise
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.FAILED
    assert "rollout service" in job.reason and "older slurmrl release" in job.reason
    states = {s.role: (s.state, s.ended_at is not None)
              for s in store.services(job_id=7)}
    assert states == {"rollout": ("failed", True), "trainer": ("stopped", True)}
    # the other member goes on, its services re-attached
    assert site.job(8).state is JobState.RUNNING
    assert sorted(_live_roles(store, 8)) == ["rollout", "trainer"]
    assert sorted(k for k in site.pools._live if k[0] == 8) == [(8, "rollout"),
                                                               (8, "trainer")]
    assert store.pool(pool).state == "open"  # type: ignore[union-attr]
    await site.c.stop()


@run
async def test_a_job_joining_a_pool_whose_last_member_ends_is_placed_there(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={21: ALICE, 22: BOB})
    await site.c.register(ALICE, 21, ENV)
    await site.settle()
    pool = site.job(21).pool_id
    assert pool is not None

    site.launcher.gate.clear()  # job 22's services take a while to come up
    await site.c.register(BOB, 22, ENV)
    await site.until(lambda: (22, "rollout") in site.launcher.entered)
    await site.c.end_job(21, JobState.COMPLETED, "driver done")  # the only member ends
    site.launcher.gate.set()
    await site.settle()

    job = site.job(22)
    assert (job.state, job.pool_id, job.reason) == (JobState.RUNNING, pool, "")
    assert site.c.store.pool(pool).state == "open"  # type: ignore[union-attr]
    assert site.allocator.closed == []
    await site.c.stop()


@run
async def test_a_failed_service_launch_releases_the_pool_opened_for_the_job(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.launcher.fail_roles = {"trainer"}
    await site.c.register(ALICE, 7, ENV)
    await site.settle()

    job = site.job(7)
    assert job.state is JobState.FAILED and "trainer did not start" in job.reason
    assert [p.state for p in site.c.store.pools()] == ["closed"]
    assert site.allocator.closed == [101]
    assert site.launcher.stopped == [(7, "rollout")]  # the one that came up
    assert _live_roles(site.c.store, 7) == []
    await site.c.stop()


@run
async def test_members_left_running_in_a_closed_pool_are_ended_with_its_reason(
        tmp_path: Path) -> None:
    # a crash in the middle of close_pool: the pool is closed, job 21 was ended, job 22
    # not yet
    why = "pool allocation (Slurm job 101) was preempted"
    store = Store(tmp_path / "c.db")
    pool = store.add_pool(gpus=2, opened_at=1.0, slurm_job_id=101, nodes=("n1",))
    store.update_pool(pool, state="closed", reason=why, closed_at=2.0)
    for job_id, state in ((21, JobState.CANCELLED), (22, JobState.RUNNING)):
        store.add_job(JobRecord(job_id, "alice", 1001, RlRequest(2, "tiny"), state, 1.0,
                                pool_id=pool, pool_gpus=(0, 1), secret=mint_secret()))
    site = await _site(store, jobs={21: ALICE, 22: ALICE, 23: ALICE})
    job = site.job(22)
    assert (job.state, job.reason) == (JobState.CANCELLED, why)

    # the same, found by the reconciler while the controller runs
    await site.c.register(ALICE, 23, ENV)
    await site.settle()
    other = site.job(23).pool_id
    assert other is not None
    site.c.scheduler.close_pool(other, "node failure")
    store.update_pool(other, state="closed", reason="node failure", closed_at=3.0)
    await site.c.reconcile()
    job = site.job(23)
    assert (job.state, job.reason) == (JobState.CANCELLED, "node failure")
    with pytest.raises(LeaseError):
        site.c.scheduler.request(job, Phase.ROLLOUT)
    await site.c.stop()


@run
async def test_a_pool_an_admin_closes_gives_back_its_allocation_but_not_an_attached_one(
        tmp_path: Path) -> None:
    root = Identity(0, 0, "root")
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE}, sweep_interval_s=0.0)
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    opened = site.job(7).pool_id
    assert opened is not None and site.allocator.running == {101}
    # an admin's own allocation, attached as a pool: slurmrl did not open it
    site.slurm.running[500] = JobInfo(500, "held", "root", 0, SlurmJobState.RUNNING,
                                      partition="pools", nodes=("n1",),
                                      gpu_indices=(4, 5))
    attached = await site.c.attach_pool(root, 500, False)
    await site.c.close_pool(opened, "closed by admin")
    await site.c.close_pool(attached.pool_id, "closed by admin")
    assert site.job(7).state is JobState.CANCELLED
    await site.c.reconcile()
    await site.settle()
    assert site.allocator.closed == [101]  # slurmrl's; the admin's job 500 runs on
    await site.c.stop()


@run
async def test_a_job_that_ends_while_being_placed_stays_ended(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.launcher.gate.clear()
    await site.c.register(ALICE, 7, ENV)
    await site.until(lambda: (7, "rollout") in site.launcher.entered)  # pool opened
    await site.c.deregister(ALICE, 7, "CA", "scancel by user")
    site.launcher.gate.set()
    await site.settle()

    job = site.job(7)
    assert (job.state, job.reason, job.pool_id) == (JobState.CANCELLED, "scancel by user",
                                                    None)
    assert _live_roles(site.c.store, 7) == []
    assert site.launcher.entered == [(7, "rollout")]  # no launch after it ended
    assert site.launcher.stopped == [(7, "rollout")]
    assert [p.state for p in site.c.store.pools()] == ["closed"]
    assert site.allocator.closed == [101]
    with pytest.raises(LeaseError):  # no lease for an ended job
        site.c.scheduler.request(job, Phase.ROLLOUT)
    await site.c.stop()


@run
async def test_parking_the_other_members_never_pins_host_memory_past_the_budget(
        tmp_path: Path) -> None:
    # two jobs, each service 30 GiB per GPU on both GPUs: 60 GiB of host memory each,
    # pinned while parked and, `tiny` services keeping their buffers, while active too
    budget = 190 * GiB
    cfg = Config(limits=LimitsConfig(parked_host_mem_per_node=budget))
    site = await _site(Store(tmp_path / "c.db"), cfg, jobs={1: ALICE, 2: BOB})
    env = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "custom-model",
           "SLURMRL_MEM": str(30 * GiB)}
    for job_id, who in ((1, ALICE), (2, BOB)):
        await site.c.register(who, job_id, env)
        await site.settle()
    assert site.job(1).pool_id == site.job(2).pool_id is not None
    host = {f.key: f.host_bytes for j in (1, 2)
            for f in footprints_for_job(j, site.job(j).request, (0, 1))}

    def pinned() -> int:
        return sum(host[(s.job_id, s.role)] for s in site.c.store.services(live_only=True)
                   if s.residency in ("parked", "active"))

    for job_id, phase in ((1, Phase.ROLLOUT), (2, Phase.TRAIN)):
        ticket = site.c.scheduler.request(site.job(job_id), phase)
        assert ticket.lease is not None
        await site.pools.before_answer(site.job(job_id), ticket.lease)
        assert pinned() <= budget
        site.c.scheduler.release(site.job(job_id), ticket.request_id, {})
    # job 1 rolled out: job 2's services left the GPUs, its rollout dropped (the four
    # services' 240 GiB would not fit the host). Job 2 trains: job 1's rollout is parked
    # for room, its trainer too (`park_others`: parked, it pins no more than active)
    residency = {(s.job_id, s.role): s.residency
                 for s in site.c.store.services(live_only=True)}
    assert residency == {(1, "rollout"): "parked", (1, "trainer"): "parked",
                         (2, "rollout"): "dropped", (2, "trainer"): "active"}
    await site.c.stop()


@run
async def test_a_join_across_rl_groups_opens_a_pool_of_its_own(tmp_path: Path) -> None:
    # the test policy joins the first open pool whatever it holds: the controller's guard
    # keeps `--rl-group` (`complementarity.compatible`), as every built-in policy does
    site = await _site(Store(tmp_path / "c.db"), jobs={21: ALICE, 22: BOB, 23: BOB})
    await site.c.register(ALICE, 21, {**ENV, "SLURMRL_GROUP": "a"})
    await site.settle()
    await site.c.register(BOB, 22, {**ENV, "SLURMRL_GROUP": "b"})
    await site.settle()
    first, other = site.job(21).pool_id, site.job(22).pool_id
    assert first is not None and other is not None and other != first
    assert site.job(22).state is JobState.RUNNING
    await site.c.register(BOB, 23, {**ENV, "SLURMRL_GROUP": "a"})
    await site.settle()
    assert site.job(23).pool_id == first  # the same group joins as before
    await site.c.stop()


class NegativeOffset:
    """A site policy's slip: opens each job's pool with its GPUs from offset -1."""

    name = "negative-offset"
    mode = PoolMode.LEASE

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, Action.OPEN, -1, j.request.gpus, gpu_offset=-1)
                for j in snap.waiting]


@run
async def test_a_placement_at_a_negative_gpu_offset_runs_the_job_from_gpu_0(
        tmp_path: Path) -> None:
    # it was enacted as given: a pool one GPU short, and the job placed on GPU -1
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.c.policies = replace(site.c.policies, pairing=NegativeOffset())
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.RUNNING and job.pool_gpus == (0, 1)
    pool = site.c.store.pool(job.pool_id)  # type: ignore[arg-type]
    assert pool is not None and pool.gpus == 2
    await site.c.stop()


class Twice:
    """A site policy's slip: every waiting job placed twice (an open, then a join)."""

    name = "twice"
    mode = PoolMode.LEASE

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        out = []
        for j in snap.waiting:
            out += [Placement(j.job_id, Action.OPEN, -1, j.request.gpus),
                    Placement(j.job_id, Action.OPEN, -2, j.request.gpus)]
        return out


@run
async def test_a_job_placed_twice_by_the_policy_is_placed_once(tmp_path: Path) -> None:
    # the second placement was enacted too: a second pool opened and services launched
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.c.policies = replace(site.c.policies, pairing=Twice())
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    assert site.job(7).state is JobState.RUNNING
    assert len(site.c.store.pools()) == 1 and site.allocator.running == {101}
    assert sorted(r for j, r in site.launcher.entered if j == 7) == ["rollout", "trainer"]
    await site.c.stop()


@run
async def test_the_host_budget_is_half_the_nodes_memory_unless_the_site_sets_one(
        tmp_path: Path) -> None:
    # a 7B job on 8 GPUs parks ~112 GB of trainer state: a fixed 64 GiB default refused
    # it outright; by default the budget is half the node's RealMemory as Slurm says
    seven_b = {"SLURMRL_GPUS": "8", "SLURMRL_MODEL": "Qwen2.5-7B"}
    for node_mb, admitted in ((128000, False), (2_000_000, True)):
        site = await _site(Store(tmp_path / f"{node_mb}.db"), jobs={7: ALICE})
        site.slurm.nodes = lambda mb=node_mb: [  # type: ignore[method-assign]
            NodeInfo("n1", "IDLE", 8, 16, mb, ("pools",))]
        await site.c.register(ALICE, 7, seven_b)
        await site.settle()
        job = site.job(7)
        assert (job.state is JobState.RUNNING) is admitted, job.reason
        if not admitted:
            assert job.state is JobState.FAILED and "admission refused" in job.reason
        await site.c.stop()
    # RealMemory=1 (Slurm's placeholder where slurm.conf sets none) is no budget of half
    # a megabyte, which refused every job: unknown, so the 64 GiB fallback
    half_b = {"SLURMRL_GPUS": "1", "SLURMRL_MODEL": "Qwen2.5-0.5B"}
    site = await _site(Store(tmp_path / "placeholder.db"), jobs={7: ALICE})
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "IDLE", 8, 16, 1, ("pools",))]
    await site.c.register(ALICE, 7, half_b)
    await site.settle()
    assert site.job(7).state is JobState.RUNNING, site.job(7).reason
    await site.c.stop()
    # a site's own figure wins over the node's memory
    cfg = Config(limits=LimitsConfig(parked_host_mem_per_node=64 << 30))
    site = await _site(Store(tmp_path / "fixed.db"), cfg, jobs={7: ALICE})
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "IDLE", 8, 16, 2_000_000, ("pools",))]
    await site.c.register(ALICE, 7, seven_b)
    await site.settle()
    assert site.job(7).state is JobState.FAILED
    await site.c.stop()


class Recorder(JoinFirst):
    """JoinFirst, keeping the limits each round's snapshot told it."""

    def __init__(self) -> None:
        self.limits: list[Any] = []
        self.pool_room: list[list[int | None]] = []  #: each open pool's host room

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        self.limits.append(snap.limits)
        self.pool_room.append([p.host_mem_free_bytes for p in snap.pools])
        return super().place(snap)


@run
async def test_the_policy_is_told_the_host_budget_the_join_guard_holds(
        tmp_path: Path) -> None:
    # with the budget from the nodes, the policy's limits said none: it proposed joins
    # the guard then refused (the job opened alone)
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    policy = Recorder()
    site.c.policies = replace(site.c.policies, pairing=policy)
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    assert policy.limits and policy.limits[-1].parked_host_mem_bytes == (64000 << 20) // 2
    await site.c.stop()


@run
async def test_the_policy_is_told_each_open_pools_host_room(tmp_path: Path) -> None:
    # an open pool's room was unknown to the policy (None: not checked) though the join
    # guard holds it to its node's budget: first-fit picked a pool the guard refused
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE, 8: BOB})
    policy = Recorder()
    site.c.policies = replace(site.c.policies, pairing=policy)
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    await site.c.register(BOB, 8, ENV)
    await site.settle()
    from policies.complementarity import host_bytes
    from slurmrl.controller.placement import job_snapshot
    member = host_bytes(job_snapshot(site.job(7), "pools"))
    assert policy.pool_room[-1] == [(64000 << 20) // 2 - member]
    await site.c.stop()


class LateHandle(FakeHandle):
    """A service whose first park times out at the caller and lands afterwards (it was
    queued behind a call in flight); records the calls it gets."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.residency = "active"

    def activate(self, timeout_s: float | None = None) -> dict[str, Any]:
        self.calls.append("activate")
        self.residency = "active"
        return {"residency": "active"}

    def park(self, level: int, timeout_s: float | None = None) -> dict[str, Any]:
        self.calls.append("park")
        self.residency = "parked"  # it lands, but the answer does not come back in time
        if self.calls.count("park") == 1:
            raise ServiceUnreachable("park", None, "no whole answer within 120 s")
        return {"residency": "parked"}


@run
async def test_a_service_whose_park_timed_out_is_activated_again_for_its_next_grant(
        tmp_path: Path) -> None:
    # the park landed after the controller gave up on it, which still took the service
    # as active: the job's next grant sent no activate, and its driver got ServiceParked
    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB})
    late = LateHandle()
    launch = site.launcher.launch

    def launch_late(pool_job_id: int, node: str, spec: ServiceSpec,
                    secret: str) -> FakeRunning:
        running = launch(pool_job_id, node, spec, secret)
        if (spec.job_id, spec.role) == (1, "rollout"):
            running.handle = late
        return running

    site.launcher.launch = launch_late  # type: ignore[method-assign]
    env = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"}
    for job_id, who in ((1, ALICE), (2, BOB)):
        await site.c.register(who, job_id, env)
        await site.settle()
    assert site.job(1).pool_id == site.job(2).pool_id is not None
    for job_id, phase in ((2, Phase.ROLLOUT), (1, Phase.ROLLOUT)):
        ticket = site.c.scheduler.request(site.job(job_id), phase)
        assert ticket.lease is not None
        await site.pools.before_answer(site.job(job_id), ticket.lease)
        site.c.scheduler.release(site.job(job_id), ticket.request_id, {})
    assert late.calls[0] == "park" and "activate" in late.calls[1:]
    assert late.residency == "active"  # what job 1's rollout needs
    await site.c.stop()


@pytest.mark.parametrize(("numbering", "devices"), [("global", (2, 3)), ("local", (0, 1))])
@run
async def test_a_pools_services_name_its_gpus_as_the_nodes_steps_see_them(
        tmp_path: Path, numbering: str, devices: tuple[int, ...]) -> None:
    # a pool on Slurm's GPUs 2 and 3 of its node: where jobs are confined to their
    # devices its steps see them as 0 and 1 (CUDA_VISIBLE_DEVICES=2 named nothing there)
    from slurmrl.config.schema import SlurmConfig

    cfg = Config(slurm=SlurmConfig(device_numbering=numbering))
    site = await _site(Store(tmp_path / "c.db"), cfg, jobs={1: ALICE})
    opened = site.allocator.open

    def on_gpus_2_3(gpus: int, label: str = "", gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
        pool = opened(gpus, label)
        return replace(pool, gpu_indices=tuple(range(2, 2 + gpus)))

    site.allocator.open = on_gpus_2_3  # type: ignore[method-assign]
    launched: list[ServiceSpec] = []
    launch = site.launcher.launch

    def record(pool_job_id: int, node: str, spec: ServiceSpec, secret: str) -> FakeRunning:
        launched.append(spec)
        return launch(pool_job_id, node, spec, secret)

    site.launcher.launch = record  # type: ignore[method-assign]
    await site.c.register(ALICE, 1, {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"})
    await site.settle()
    assert launched and {s.cuda_devices for s in launched} == {devices}
    await site.c.stop()


@run
async def test_roots_rl_job_is_refused_at_registration_before_any_pool(tmp_path: Path) -> None:
    # accepted, it had a pool opened and only then failed at its services' launch
    root = Identity(0, 0, "root")
    site = await _site(Store(tmp_path / "c.db"), jobs={9: root})
    with pytest.raises(RpcError) as err:
        await site.c.register(root, 9, {"SLURMRL_GPUS": "1", "SLURMRL_MODEL": "tiny"})
    assert (err.value.status, err.value.code) == (403, "root-job")
    assert site.allocator.running == set() and site.c.store.job(9) is None
    await site.c.stop()


@run
async def test_a_slow_restart_keeps_the_leases_it_restored(tmp_path: Path) -> None:
    # drivers cannot renew until the controller listens again: a restart whose start-up
    # (Slurm slow to answer after a head-node reboot) outlasts a lease timeout must not
    # revoke what it restored before the first driver could reach it
    cfg = replace(Config(), controller=replace(Config().controller, lease_timeout_s=1.0,
                                               heartbeat_s=0.25))
    site = await _site(Store(tmp_path / "c.db"), cfg, jobs={21: ALICE})
    await site.c.register(ALICE, 21, ENV)
    await site.settle()
    ticket = site.c.scheduler.request(site.job(21), Phase.TRAIN)
    for task in site.c._tasks:  # the controller is killed: nothing more runs or is written
        task.cancel()
    site.c.store.conn.close()

    class SlowSlurm(FakeSlurm):
        def nodes(self) -> list[NodeInfo]:
            time.sleep(1.5)
            return super().nodes()

    slurm = SlowSlurm()
    slurm.add(21, ALICE)
    pools = SlurmPools(allocator=FakeAllocator(201), launcher=FakeLauncher())  # type: ignore[arg-type]
    c = Controller(cfg, Store(tmp_path / "c.db"), slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=JoinFirst())
    started = time.monotonic()
    await c.start()
    assert time.monotonic() - started > cfg.controller.lease_timeout_s
    await asyncio.sleep(0.3)  # the timer has run; no driver has renewed yet
    lease = c.store.lease(ticket.request_id)
    assert lease is not None and lease.state == "held", lease
    await asyncio.sleep(1.2)  # and one lease timeout later, unrenewed, it lapses
    lease = c.store.lease(ticket.request_id)
    assert lease is not None and lease.state == "revoked" and lease.reason == "expired"
    await c.stop()


@run
async def test_a_pool_lost_while_the_controller_was_down_is_closed_at_start(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={21: ALICE})
    await site.c.register(ALICE, 21, ENV)
    await site.settle()
    lost_pool = site.job(21).pool_id
    ticket = site.c.scheduler.request(site.job(21), Phase.TRAIN)
    for task in site.c._tasks:  # the controller is killed
        task.cancel()
    site.c.store.conn.close()
    node_failed_at = time.time()  # Slurm loses the pool's node meanwhile
    await asyncio.sleep(0.5)

    class LostAllocator(FakeAllocator):
        def losses(self, slurm_job_ids: list[int]) -> list[Any]:
            return [PoolLoss(101, "NODE_FAIL", ended_at=node_failed_at)] * (
                101 in slurm_job_ids)

    slurm = FakeSlurm()
    slurm.add(21, ALICE)
    slurm.add(22, BOB)  # started while the controller was down
    allocator = LostAllocator(201)
    pools = SlurmPools(allocator=allocator, launcher=FakeLauncher())  # type: ignore[arg-type]
    c = Controller(Config(), Store(tmp_path / "c.db"), slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=JoinFirst())
    await c.start()
    # closed before anything could be placed in it, not one reconcile later
    pool = c.store.pool(lost_pool)  # type: ignore[arg-type]
    assert pool is not None and pool.state == "closed" and "node failure" in pool.reason
    assert c.store.job(21).state is JobState.CANCELLED  # type: ignore[union-attr]
    # the lease is charged up to the node's failure, not for the GPUs that were gone
    lease = c.store.lease(ticket.request_id)
    assert lease is not None and lease.state == "revoked"
    assert lease.released_at == pytest.approx(node_failed_at)
    assert c.store.gpu_seconds([21])[21] == pytest.approx(
        2 * (node_failed_at - lease.granted_at))  # type: ignore[operator]
    # a job registering now gets a pool that runs
    await c.register(BOB, 22, ENV)
    await drain(pools)
    job = c.store.job(22)
    assert job is not None and job.state is JobState.RUNNING and job.pool_id != lost_pool
    await c.stop()


@run
async def test_a_restart_while_slurm_does_not_answer_still_serves_its_leases(
        tmp_path: Path) -> None:
    # slurmctld comes up after the controller (a head node's reboot): checking the open
    # pools against Slurm failed the start, and the controller exited until it answered
    site = await _site(Store(tmp_path / "c.db"), jobs={21: ALICE})
    await site.c.register(ALICE, 21, ENV)
    await site.settle()
    ticket = site.c.scheduler.request(site.job(21), Phase.TRAIN)
    await site.c.stop()

    class SlurmDown(FakeAllocator):
        def losses(self, slurm_job_ids: list[int]) -> list[Any]:
            raise SlurmError("squeue: error: Unable to contact slurm controller")

    slurm = FakeSlurm()
    slurm.add(21, ALICE)
    pools = SlurmPools(allocator=SlurmDown(201), launcher=FakeLauncher())  # type: ignore[arg-type]
    c = Controller(Config(), Store(tmp_path / "c.db"), slurm, pools=pools)  # type: ignore[arg-type]
    await c.start()
    lease = c.store.lease(ticket.request_id)
    assert lease is not None and lease.state == "held"
    pool = c.store.pool(site.job(21).pool_id)  # type: ignore[arg-type]
    assert pool is not None and pool.state == "open"
    await c.stop()


@run
async def test_a_park_may_take_as_long_as_moving_its_state_does(tmp_path: Path) -> None:
    # every park had the control plane's 120 s: a large trainer's parked state (~100 GB
    # for a 7B model) copied at ~1 GB/s was cut off, and the service left uncertain
    from slurmrl.controller.pools import MOVE_BYTES_PER_S
    from slurmrl.worker.handle import CONTROL_TIMEOUT_S

    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB})
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "IDLE", 8, 16, 2_000_000, ("pools",))]  # room for both states
    big = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "demo-7b"}
    await site.c.register(ALICE, 1, big)
    await site.c.register(BOB, 2, big)
    await site.settle()
    assert site.job(1).pool_id == site.job(2).pool_id
    for job in (1, 2):
        ticket = site.c.scheduler.request(site.job(job), Phase.TRAIN)
        lease = ticket.lease or await site.c.scheduler.wait(ticket.request_id, 5.0)
        assert lease is not None
        await site.pools.before_answer(site.job(job), lease)
        site.c.scheduler.release(site.job(job), lease.lease_id, {})
    trainer = site.pools._live[(1, "trainer")]
    assert trainer.footprint.host_bytes > 90 << 30
    waits = trainer.handle.waits  # type: ignore[attr-defined]
    assert waits and all(w == pytest.approx(
        CONTROL_TIMEOUT_S + trainer.footprint.host_bytes / MOVE_BYTES_PER_S) for w in waits)
    await site.c.stop()


@run
async def test_a_pool_takes_no_more_members_than_the_site_allows(tmp_path: Path) -> None:
    # the pool manager's own guard, whatever the policy proposes (JoinFirst joins the
    # first open pool whatever it holds)
    carol = Identity(1003, 1003, "carol")
    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB, 3: carol})
    assert site.c.config.limits.max_jobs_per_pool == 2
    for who, job in ((ALICE, 1), (BOB, 2), (carol, 3)):
        await site.c.register(who, job, ENV)
        await site.settle()
    pools = [site.job(j).pool_id for j in (1, 2, 3)]
    assert pools[0] == pools[1] and pools[2] not in (None, pools[0])
    await site.c.stop()


class Says:
    """A site policy's slip: every waiting job given `action` as a plain string (a pool
    of its own opened, where it is an OPEN)."""

    name = "says"
    mode = PoolMode.LEASE

    def __init__(self, action: Any) -> None:
        self.action = action

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, self.action, -1, j.request.gpus) for j in snap.waiting]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.parametrize(("action", "placed", "reason"), [
    ("open", True, ""),
    ("wait", False, "PoolPending"),  # it was enacted as an OPEN
    # nor may a value of no Action open a pool: the job waits, told why
    ("bogus", False, "PoolPending: pairing policy 'says' gave no valid action ('bogus')"),
])
@run
async def test_an_action_given_as_a_string_is_its_member_and_any_other_waits(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, action: str, placed: bool,
        reason: str) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.c.policies = replace(site.c.policies, pairing=Says(action))
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    job = site.job(7)
    assert (job.pool_id is not None, job.reason) == (placed, reason)
    assert bool(site.allocator.running) is placed
    bad = [m for m in _errors(caplog) if "'says'" in m]
    assert bad == ([] if action != "bogus" else [
        "pairing policy 'says' gave job 7 the action 'bogus', none of join, open, "
        "dedicated, wait: it waits"])
    await site.c.stop()


def _two_half_taken_nodes(site: Site) -> None:
    """The pool partition: nodes n1 and n2 of 2 GPUs each, another user's job holding
    one GPU of each (2 GPUs free in the partition, at most 1 on one node)."""
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo(n, "MIXED", 2, 16, 64000, ("pools",)) for n in ("n1", "n2")]
    for job_id, node in ((50, "n1"), (51, "n2")):
        site.slurm.running[job_id] = JobInfo(
            job_id, "other", "carol", 1003, SlurmJobState.RUNNING, partition="pools",
            nodes=(node,), gpu_indices=(0,), gpu_indices_by_node=((node, (0,)),))


@run
async def test_a_job_waits_while_no_node_has_its_gpus_free_and_runs_once_one_has(
        tmp_path: Path) -> None:
    # a pool needs all its GPUs on one node: with 2 free in the partition but 1 on
    # each node, Slurm would keep a pool of 2 pending (before, it was cancelled at the
    # start timeout and the job refused); the job waits, told why, and nothing is
    # submitted
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    _two_half_taken_nodes(site)
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    job = site.job(7)
    assert (job.state, job.pool_id) == (JobState.PENDING, None)
    assert job.reason == ("PoolPending: no node of partition 'pools' has 2 GPUs free "
                          "(at most 1 on one)")
    assert site.allocator.running == set()
    await site.pools.reconcile()  # still no room: it still waits, nothing submitted
    await site.settle()
    assert site.job(7).state is JobState.PENDING and site.allocator.running == set()
    # the other user's job on n2 ends: the next round opens the job's pool
    del site.slurm.running[51]
    await site.pools.reconcile()
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.RUNNING and job.pool_id is not None and job.reason == ""
    assert site.allocator.running == {101}
    await site.c.stop()


@run
async def test_a_pool_slurm_keeps_pending_past_the_start_timeout_leaves_its_job_waiting(
        tmp_path: Path) -> None:
    # Slurm said a node had the GPUs, but another job took them before the pool's
    # turn: the allocator cancels it at the start timeout, and the job is not refused
    # but waits to be placed again
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    opened = site.allocator.open
    tries: list[int] = []

    def pending_once(gpus: int, label: str = "", gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
        tries.append(gpus)
        if len(tries) == 1:
            raise PoolPending("pool job 101 not running after 60 s (PENDING, reason "
                              "Resources); cancelled it")
        return opened(gpus, label, gpu_type)

    site.allocator.open = pending_once  # type: ignore[method-assign]
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    job = site.job(7)
    assert (job.state, job.pool_id) == (JobState.PENDING, None)
    assert job.reason == ("PoolPending: Slurm did not start its pool: pool job 101 not "
                          "running after 60 s (PENDING, reason Resources); cancelled it")
    await site.pools.reconcile()
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.RUNNING and job.pool_id is not None and tries == [2, 2]
    await site.c.stop()


@pytest.mark.parametrize("pairing", ["join-first", "complementary"])
@run
async def test_a_job_larger_than_every_node_is_refused_with_the_reason(
        tmp_path: Path, pairing: str) -> None:
    # no node of the partition has 8 GPUs at all: no pool of 8 could ever start (Slurm
    # would refuse it, and a policy that counts each node's free GPUs would leave the
    # job waiting for good): the job is refused, told why, and nothing is submitted
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    if pairing != "join-first":
        site.c.policies = replace(site.c.policies,
                                  pairing=registry.load("pairing", pairing))
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo(n, "IDLE", 4, 16, 64000, ("pools",)) for n in ("n1", "n2")]
    await site.c.register(ALICE, 7, {**ENV, "SLURMRL_GPUS": "8"})
    await site.settle()
    job = site.job(7)
    assert job.state is JobState.FAILED
    assert job.reason == ("refused: --rl-gpus=8 is more than any node of partition "
                          "'pools' has (the largest has 4); a pool's GPUs are one node's")
    assert site.allocator.running == set() and site.allocator.next == 101
    await site.c.stop()


def _typed_nodes(site: Site) -> None:
    """The pool partition: n1 with 4 a100 GPUs, n2 with 8 h100, all free."""
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "IDLE", 4, 16, 64000, ("pools",), gpu_types=(("a100", 4),)),
        NodeInfo("n2", "IDLE", 8, 16, 64000, ("pools",), gpu_types=(("h100", 8),))]


@pytest.mark.parametrize("pairing", ["join-first", "complementary"])
@run
async def test_a_typed_jobs_pool_asks_slurm_for_its_gpu_type(tmp_path: Path,
                                                             pairing: str) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE, 8: BOB})
    if pairing != "join-first":
        site.c.policies = replace(site.c.policies, pairing=registry.load("pairing", pairing))
    _typed_nodes(site)
    await site.c.register(ALICE, 7, {**ENV, "SLURMRL_GPUS": "6", "SLURMRL_GPU_TYPE": "h100",
                                     "SLURMRL_MUX": "off"})
    await site.settle()
    assert site.job(7).state is JobState.RUNNING
    assert site.job(7).request.gpu_type == "h100"  # kept in the DB
    assert site.allocator.asked == [(6, "h100")]
    # no node has 6 a100 GPUs: refused, naming the largest node of that type; no node
    # has any v100: refused, naming the types there are
    await site.c.register(BOB, 8, {**ENV, "SLURMRL_GPUS": "6", "SLURMRL_GPU_TYPE": "a100"})
    await site.settle()
    assert site.job(8).reason == (
        "refused: --rl-gpus=a100:6 is more than any node of partition 'pools' has of "
        "type 'a100' (the largest has 4); a pool's GPUs are one node's")
    site.slurm.add(9, BOB)
    await site.c.register(BOB, 9, {**ENV, "SLURMRL_GPU_TYPE": "v100"})
    await site.settle()
    assert site.job(9).reason == ("refused: no node of partition 'pools' has GPUs of type "
                                  "'v100' (its types: a100, h100)")
    assert site.allocator.asked == [(6, "h100")]
    await site.c.stop()


@run
async def test_a_typed_job_waits_while_the_nodes_of_its_type_are_busy(tmp_path: Path) -> None:
    # a site policy that counts the partition's total alone opens a pool of 4 h100
    # where n2's h100 are all taken: the pool manager submits nothing, the job waits
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    _typed_nodes(site)
    site.slurm.running[50] = JobInfo(
        50, "other", "carol", 1003, SlurmJobState.RUNNING, partition="pools", nodes=("n2",),
        gpu_indices=tuple(range(8)), gpu_indices_by_node=(("n2", tuple(range(8))),))
    await site.c.register(ALICE, 7, {**ENV, "SLURMRL_GPUS": "4", "SLURMRL_GPU_TYPE": "h100"})
    await site.settle()
    job = site.job(7)
    assert (job.state, job.reason) == (JobState.PENDING, (
        "PoolPending: no node of partition 'pools' has 4 GPUs of type 'h100' free (at most "
        "0 on one)"))
    assert site.allocator.asked == []
    del site.slurm.running[50]
    await site.pools.reconcile()
    await site.settle()
    assert site.job(7).state is JobState.RUNNING and site.allocator.asked == [(4, "h100")]
    await site.c.stop()


@run
async def test_a_younger_jobs_pool_is_kept_off_the_node_held_for_an_older_one(
        tmp_path: Path) -> None:
    # n1: 6 of its 8 GPUs free, n2: 4 of 8 (another user's jobs hold the rest). The older
    # job needs 8: it waits, and the round holds n1 for it; the younger job of 4 fits
    # either node, and Slurm picks the node: its pool is submitted with --exclude=n1
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE, 8: BOB})
    site.c.policies = replace(site.c.policies, pairing=registry.load("pairing", "complementary"))
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo(n, "MIXED", 8, 16, 64000, ("pools",), gpu_types=(("", 8),))
        for n in ("n1", "n2")]
    for job_id, node, used in ((50, "n1", (0, 1)), (51, "n2", (0, 1, 2, 3))):
        site.slurm.running[job_id] = JobInfo(
            job_id, "other", "carol", 1003, SlurmJobState.RUNNING, partition="pools",
            nodes=(node,), gpu_indices=used, gpu_indices_by_node=((node, used),))
    await site.c.register(ALICE, 7, {**ENV, "SLURMRL_GPUS": "8", "SLURMRL_MUX": "off"})
    await site.settle()
    await site.c.register(BOB, 8, {**ENV, "SLURMRL_GPUS": "4", "SLURMRL_MUX": "off"})
    await site.settle()
    assert site.job(7).state is JobState.PENDING
    assert site.job(8).state is JobState.RUNNING
    assert (site.allocator.asked, site.allocator.excluded) == ([(4, None)], ["n1"])
    await site.c.stop()


class OddSize:
    """A site policy's slip: job 7's pool size given as a string."""

    name = "odd-size"
    mode = PoolMode.LEASE

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, Action.OPEN, -j.job_id,
                          "2" if j.job_id == 7 else j.request.gpus)  # type: ignore[arg-type]
                for j in snap.waiting]


@run
async def test_a_placement_of_an_odd_size_fails_its_job_and_the_round_goes_on(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # the round's replay for the node it holds (`_held_node`) and the job's own
    # placement both meet the string: job 7 is refused, job 8 is placed
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE, 8: BOB})
    site.c.policies = replace(site.c.policies, pairing=OddSize())
    _two_half_taken_nodes(site)
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo(n, "MIXED", 2, 16, 64000, ("pools",), gpu_types=(("", 2),))
        for n in ("n1", "n2")]
    await site.c.register(ALICE, 7, {**ENV, "SLURMRL_GPUS": "1"})
    await site.c.register(BOB, 8, {**ENV, "SLURMRL_GPUS": "1"})
    await site.settle()
    assert site.job(7).state is JobState.FAILED and site.job(8).state is JobState.RUNNING
    assert any("no node held this round" in r.getMessage() for r in caplog.records)
    await site.c.stop()


class JoinsNowhere:
    """A site policy's slip: every job told to join pool `pool_id`, which is none."""

    name = "joins-nowhere"
    mode = PoolMode.LEASE

    def __init__(self, pool_id: int | None) -> None:
        self.pool_id = pool_id

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, Action.JOIN, self.pool_id) for j in snap.waiting]


@pytest.mark.parametrize(("pool_id", "more"), [
    (4242, ""), (None, ""),
    (-1, " (a provisional id: jobs share a new pool by OPENs of the same id)")])
@run
async def test_a_join_to_no_pool_is_logged_as_the_policys_error_and_opens_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, pool_id: int | None,
        more: str) -> None:
    # it was an INFO line, as for a pool that may no longer take the job
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.c.policies = replace(site.c.policies, pairing=JoinsNowhere(pool_id))
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    assert site.job(7).state is JobState.RUNNING and site.allocator.running == {101}
    assert _errors(caplog) == [f"pairing policy 'joins-nowhere' told job 7 to join pool "
                               f"{pool_id}, which does not exist{more}; it opens its own"]
    await site.c.stop()


class AndAnother(JoinFirst):
    """A site policy's slip: a placement for a job that is not waiting, besides."""

    name = "and-another"

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        return [*super().place(snap), Placement(999, Action.OPEN, -2, 2)]


@run
async def test_a_placement_for_a_job_not_waiting_is_logged_as_the_policys_error(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    site = await _site(Store(tmp_path / "c.db"), jobs={7: ALICE})
    site.c.policies = replace(site.c.policies, pairing=AndAnother())
    await site.c.register(ALICE, 7, ENV)
    await site.settle()
    assert site.job(7).state is JobState.RUNNING and site.allocator.running == {101}
    assert _errors(caplog) == ["pairing policy 'and-another' placed job 999, which is not "
                               "waiting: ignored"]
    await site.c.stop()


class FixedPairs(JoinFirst):
    """Fixed pairs (`fixed_group`): a pool that has had two members takes no third."""

    name = "fixed-pairs"
    fixed_group = 2


@run
async def test_a_pool_whose_fixed_group_was_complete_takes_no_new_member(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # it was marked closed for the policy, and joined anyway (the simulator refuses)
    caplog.set_level("INFO", logger="slurmrl.controller.pools")
    carol = Identity(1003, 1003, "carol")
    site = await _site(Store(tmp_path / "c.db"), jobs={1: ALICE, 2: BOB, 3: carol})
    site.c.policies = replace(site.c.policies, pairing=FixedPairs())
    for who, job_id in ((ALICE, 1), (BOB, 2)):
        await site.c.register(who, job_id, ENV)
        await site.settle()
    pool = site.job(1).pool_id
    assert pool is not None and site.job(2).pool_id == pool
    await site.c.end_job(1, JobState.COMPLETED, "driver done")  # room for one more...
    await site.c.register(carol, 3, ENV)  # ...which the policy asks for
    await site.settle()
    job = site.job(3)
    assert job.state is JobState.RUNNING and job.pool_id not in (None, pool)
    assert (f"job 3 cannot join pool {pool}: its group of 2 is fixed (pairing policy "
            "'fixed-pairs': fixed_group)") in caplog.messages
    await site.c.stop()
