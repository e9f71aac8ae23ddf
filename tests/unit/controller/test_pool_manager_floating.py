"""Floating pools in the controller: windows as allocations, services on every window,
leases on whichever window is free, the job's state handed between windows.

A real Controller, Store, LeaseScheduler and `SlurmPools` run on one event loop; Slurm,
the pool allocator and the service launcher are fakes (no daemons, no processes: the
dev-cluster test in tests/integration/test_floating.py runs the real ones). Pairing is a
test policy that says where each job goes: the first opens a floating pool, each later
one joins it adding a window.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _loop import run
from _steps import FakeSteps
from test_pool_manager import FakeSlurm
from test_pool_manager import Site as BaseSite

from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from slurmrl.config import Config, ConfigError, load
from slurmrl.config.schema import LimitsConfig, SlurmConfig
from slurmrl.controller.core import Controller
from slurmrl.controller.pools import PoolError, PoolLoss, SlurmPool, SlurmPools
from slurmrl.controller.scheduler import LeaseScheduler
from slurmrl.controller.server import Api
from slurmrl.controller.services import ServiceLaunchError, ServiceSpec
from slurmrl.controller.views import physical_gpus, pool_view
from slurmrl.db import Store
from slurmrl.leases import LeaseError
from slurmrl.model import Identity, JobState, Phase, Residency
from slurmrl.slurm import NodeInfo
from slurmrl.worker.handle import ServiceError

ALICE = Identity(1001, 1001, "alice")
BOB = Identity(1002, 1002, "bob")
CAROL = Identity(1003, 1003, "carol")
DAVE = Identity(1004, 1004, "dave")
ENV = {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "tiny"}
FLOATING = Config(slurm=SlurmConfig(floating_pools=True),
                  limits=LimitsConfig(max_jobs_per_pool=4))


class FakeAllocator:
    """Allocations 101, 102, ... on node n1, each on the next free GPUs;
    `refuse_on_node` makes a request for a named node fail as a full node would.
    Slurm runs each until its cancel, or until a test puts it in `lost`."""

    def __init__(self) -> None:
        self.next, self.next_gpu = 101, 0
        self.opened: list[tuple[int, int, str | None]] = []  #: (job id, GPUs, node asked)
        self.closed: list[int] = []
        self.lost: set[int] = set()
        self.refuse_on_node = False

    def open(self, gpus: int, label: str = "", node: str | None = None,
             gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
        if self.refuse_on_node and node is not None:
            raise PoolError("pool job 999 not running after 60 s (PENDING, Resources)")
        self.next += 1
        self.next_gpu += gpus
        self.opened.append((self.next - 1, gpus, node))
        where = node or "n1"
        return SlurmPool(self.next - 1, "pools", where, (where,),
                         tuple(range(self.next_gpu - gpus, self.next_gpu)))

    def recorded(self, slurm_job_id: int) -> None:
        pass

    def tagged(self) -> list[int]:
        return sorted({i for i, _, _ in self.opened} - set(self.closed) - self.lost)

    def close(self, slurm_job_id: int) -> None:
        self.closed.append(slurm_job_id)

    def losses(self, slurm_job_ids: list[int]) -> list[Any]:
        """Slurm runs every allocation not closed nor lost."""
        return [PoolLoss(i, "CANCELLED") for i in slurm_job_ids if i in self.closed] + [
            PoolLoss(i, "NODE_FAIL") for i in slurm_job_ids if i in self.lost]

    def ended_at(self, opened: Mapping[int, float]) -> dict[int, float]:
        """Slurm's accounting says nothing (none kept)."""
        return {}


@dataclass
class FakeHandle:
    """A service's control plane: records what the controller asked of it."""

    spec: ServiceSpec
    calls: list[tuple[str, bool]] = field(default_factory=list)  #: (park|activate, handoff)
    sources: list[str | None] = field(default_factory=list)  #: each activation's source
    address: str = "127.0.0.1:1"
    generation: int = 0  #: as a worker counts its hand-offs (`status`)
    stored: int | None = None  #: the generation of its node's file it fetched
    fetched: list[str] = field(default_factory=list)  #: each fetch_handoff's source
    fail_fetch: bool = False  #: the source cannot be reached
    fail_status: bool = False  #: its status call fails (the copy does not answer)
    registry: dict[str, FakeHandle] = field(default_factory=dict)  #: every copy by address
    hold: threading.Event | None = None  #: a park waits for it

    def activate(self, timeout_s: float | None = None, *,
                 handoff: bool = False, source: str | None = None) -> dict[str, Any]:
        self.calls.append(("activate", handoff))
        self.sources.append(source)
        if handoff:  # takes over the job's newest state (as if fetched where needed)
            self.generation = max(h.generation for h in self.registry.values()
                                  if (h.spec.job_id, h.spec.role) == (self.spec.job_id,
                                                                      self.spec.role))
        return {"residency": "active"}

    def park(self, level: int = 1, timeout_s: float | None = None, *,
             handoff: bool = False) -> dict[str, Any]:
        if self.hold is not None:  # a slow hand-off: done (recorded) once let go
            self.hold.wait(10)
        self.calls.append(("park", handoff))
        self.generation += handoff
        return {"residency": "parked"}

    def status(self) -> dict[str, Any]:
        if self.fail_status:
            raise ServiceError("status", 503, "timed out")
        return {"generation": self.generation, "stored_generation": self.stored}

    def fetch_handoff(self, source: str, timeout_s: float | None = None) -> dict[str, Any]:
        if self.hold is not None:  # a slow fetch (a large state over a network)
            self.hold.wait(10)
        self.fetched.append(source)
        if self.fail_fetch:
            raise ServiceError("fetch_handoff", 400, f"cannot fetch the handoff state "
                               f"from {source}")
        self.stored = max(self.stored or 0, self.registry[source].generation)
        return {"residency": "parked", "stored_generation": self.stored}

    def discard_handoff(self, timeout_s: float | None = None) -> bool:
        self.calls.append(("discard", True))
        return True

    def stop(self, timeout_s: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class FakeRunning:
    spec: ServiceSpec
    pool_job_id: int
    handle: FakeHandle
    step_id: str = "0"
    address: str = "127.0.0.1:1"
    control_secret: str = "c" * 64


class FakeLauncher(FakeSteps):
    def __init__(self) -> None:
        super().__init__()
        self.launched: list[FakeRunning] = []
        self.stopped: list[FakeRunning] = []
        self.nodes: list[str] = []  #: the node each launch was on
        self.by_address: dict[str, FakeHandle] = {}

    def launch(self, pool_job_id: int, node: str, spec: ServiceSpec,
               secret: str) -> FakeRunning:
        n = len(self.launched)
        address = f"{node}:{5000 + n}/{n:016x}"  # host:port/launch, as a worker announces
        svc = FakeRunning(spec, pool_job_id, FakeHandle(spec, address=address,
                                                        registry=self.by_address),
                          address=address)
        self.by_address[address] = svc.handle
        self.launched.append(svc)
        self.nodes.append(node)
        return svc

    def stop(self, svc: FakeRunning) -> None:
        self.stopped.append(svc)


    def of(self, job_id: int, role: str, alloc: int) -> FakeRunning:
        """The live service of `job_id`'s `role` in allocation `alloc`."""
        (svc,) = [s for s in self.launched if s.spec.job_id == job_id
                  and s.spec.role == role and s.pool_job_id == alloc and s not in self.stopped]
        return svc


class FloatFirst:
    """The first job opens a floating pool; each later one joins it with a window more,
    up to three windows."""

    name = "float-first"
    mode = PoolMode.LEASE
    seen: ClusterSnapshot | None = None  #: the last snapshot it was given

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        self.seen = snap
        out = []
        pool = next((p for p in snap.pools if p.floating), None)
        for j in snap.waiting:
            g = j.request.gpus
            if pool is None:
                out.append(Placement(j.job_id, Action.OPEN, -1, g, floating=True))
            else:
                out.append(Placement(j.job_id, Action.JOIN, pool.pool_id,
                                     min(pool.gpus + g, 3 * g), floating=True))
        return out


@dataclass
class Site(BaseSite):
    """The fixed-pool tests' site, with this file's allocator and launcher."""

    allocator: FakeAllocator  # type: ignore[assignment]
    launcher: FakeLauncher  # type: ignore[assignment]

    async def register(self, who: Identity, job_id: int) -> None:
        self.slurm.add(job_id, who)
        await self.c.register(who, job_id, ENV)
        await self.settle()

    async def grant(self, job_id: int, phase: Phase) -> frozenset[int]:
        """Request `phase` for the job; wait for the grant and its handoff; its GPUs."""
        ticket = self.c.scheduler.request(self.job(job_id), phase)
        lease = ticket.lease or await self.c.scheduler.wait(ticket.request_id, 5.0)
        assert lease is not None, f"job {job_id}'s {phase} was not granted"
        await self.pools.before_answer(self.job(job_id), lease)
        return lease.gpus

    def release(self, job_id: int, gpus: frozenset[int]) -> None:
        table = self.c.scheduler.tables[self.job(job_id).pool_id]  # type: ignore[index]
        (lease,) = [x for x in table.leases if x.job_id == job_id and x.gpus == gpus]
        self.c.scheduler.release(self.job(job_id), lease.lease_id, {})


async def _site(store: Store, cfg: Config = FLOATING,
                allocator: FakeAllocator | None = None) -> Site:
    """`allocator`: the one a controller before this one used (Slurm still runs what
    it opened and did not cancel)."""
    slurm, launcher = FakeSlurm(), FakeLauncher()
    allocator = allocator or FakeAllocator()
    pools = SlurmPools(allocator=allocator, launcher=launcher)  # type: ignore[arg-type]
    c = Controller(cfg, store, slurm, pools=pools)  # type: ignore[arg-type]
    c.policies = replace(c.policies, pairing=FloatFirst())
    await c.start()
    return Site(c, pools, slurm, allocator, launcher)


@run
async def test_a_join_adds_a_window_with_every_members_services_on_it(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)

    a, b = site.job(7), site.job(8)
    assert a.pool_id == b.pool_id is not None
    pool = site.c.store.pool(a.pool_id)
    assert pool is not None and pool.floating and pool.gpus == 4
    # two allocations of 2 GPUs; the second on the first's node
    assert site.allocator.opened == [(101, 2, None), (102, 2, "n1")]
    assert [(w.window, w.slurm_job_id) for w in site.c.store.windows(pool.pool_id)] == \
        [(0, 101), (1, 102)]
    assert site.c.scheduler.tables[pool.pool_id].gpus == frozenset(range(4))
    for job in (7, 8):  # a rollout and a trainer on each window, in its allocation
        for role in ("rollout", "trainer"):
            for alloc, devices in ((101, (0, 1)), (102, (2, 3))):
                svc = site.launcher.of(job, role, alloc)
                assert svc.spec.cuda_devices == devices
                assert svc.spec.handoff_dir is not None
                # handed off at once: no copy holds the job's state until a grant
                assert svc.handle.calls == [("park", True)]
    # one private directory per job, the same on every window
    dirs = {s.spec.job_id: s.spec.handoff_dir for s in site.launcher.launched}
    assert dirs[7] != dirs[8] and all(d and d.startswith("/dev/shm/") for d in dirs.values())
    await site.c.stop()


@run
async def test_a_phase_takes_the_free_window_and_the_jobs_state_follows(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    for s in site.launcher.launched:
        s.handle.calls.clear()
    roll7_0, roll7_1 = (site.launcher.of(7, "rollout", a) for a in (101, 102))
    roll8_0 = site.launcher.of(8, "rollout", 101)

    first = await site.grant(7, Phase.ROLLOUT)
    assert first == {0, 1}
    assert roll7_0.handle.calls == [("activate", True)]  # takes the state over
    site.release(7, first)
    # job 8 has no window of its own: it takes the free window 0, parking job 7's copy
    assert await site.grant(8, Phase.ROLLOUT) == {0, 1}
    assert roll7_0.handle.calls[-1] == ("park", True)  # hands job 7's state over
    assert roll8_0.handle.calls == [("activate", True)]
    # job 7's next phase runs on window 1, where its copy takes its state over
    assert await site.grant(7, Phase.ROLLOUT) == {2, 3}
    assert roll7_1.handle.calls == [("activate", True)]
    lease = next(x for x in site.c.scheduler.tables[site.job(7).pool_id].leases  # type: ignore[index]
             if x.job_id == 7)
    assert lease.gpus == {2, 3}
    await site.c.stop()


@run
async def test_a_job_moving_windows_parks_its_copy_on_the_old_one_first(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    await site.register(CAROL, 9)
    t7 = {a: site.launcher.of(7, "trainer", a) for a in (101, 102, 103)}
    for s in site.launcher.launched:
        s.handle.calls.clear()

    w = await site.grant(7, Phase.TRAIN)
    site.release(7, w)
    # the others take windows 0 and 1; job 7's copy on window 0 stays active until then
    held8 = await site.grant(8, Phase.TRAIN)
    held9 = await site.grant(9, Phase.TRAIN)
    assert {min(held8), min(held9)} == {0, 2}
    assert t7[101].handle.calls == [("activate", True), ("park", True)]
    assert await site.grant(7, Phase.TRAIN) == {4, 5}
    assert t7[103].handle.calls == [("activate", True)]
    await site.c.stop()


@run
async def test_a_window_more_than_the_members_is_given_back_once_free(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    held = await site.grant(8, Phase.TRAIN)
    held = await site.grant(7, Phase.TRAIN)
    assert held == {2, 3}  # job 7 holds the last window

    await site.c.end_job(8, JobState.COMPLETED, "done")
    await site.settle()
    # job 8 ended: each of its copies removed its state from its node's hand-off
    # directory, then stopped
    mine = [s for s in site.launcher.launched if s.spec.job_id == 8]
    assert len(mine) == 4 and all(s in site.launcher.stopped for s in mine)
    assert all(s.handle.calls[-1] == ("discard", True) for s in mine)
    # one member on two windows: the free one goes at once, though it is the pool's
    # first allocation (the one left then stands for the pool) and not the newest
    wins = site.c.store.windows(pool_id, open_only=False)
    assert [w.window for w in site.c.store.windows(pool_id)] == [1]
    assert site.allocator.closed == [wins[0].slurm_job_id]
    assert site.c.scheduler.tables[pool_id].gpus == {2, 3}
    pool = site.c.store.pool(pool_id)
    assert pool is not None and pool.slurm_job_id == wins[1].slurm_job_id
    assert (pool.gpus, pool.gpu_indices) == (2, wins[1].gpu_indices)
    # job 7's copies on it had handed its state off (it trains on window 1): they stop,
    # and keep the node's copy of its state (the job goes on, and window 1's copies
    # share that node's directory)
    gone = [s for s in site.launcher.stopped
            if s.pool_job_id == wins[0].slurm_job_id and s.spec.job_id == 7]
    assert sorted(s.spec.role for s in gone) == ["rollout", "trainer"]
    assert all(("discard", True) not in s.handle.calls for s in gone)
    # Slurm no longer runs that allocation: the pool is not lost for it
    site.release(7, held)
    await site.pools.reconcile()
    await site.settle()
    assert site.c.store.pool(pool_id).state == "open"  # type: ignore[union-attr]
    assert [w.window for w in site.c.store.windows(pool_id)] == [1]  # never the only one
    assert await site.grant(7, Phase.TRAIN) == {2, 3}
    t7 = site.launcher.of(7, "trainer", wins[1].slurm_job_id)
    assert t7.handle.calls[-1] == ("activate", True)
    # the pool's last member ends: every allocation goes
    await site.c.end_job(7, JobState.COMPLETED, "done")
    await site.settle()
    assert site.allocator.closed == [wins[0].slurm_job_id, wins[1].slurm_job_id]
    await site.c.stop()


@run
async def test_a_free_window_goes_back_though_a_newer_one_is_held(tmp_path: Path) -> None:
    # three members on three windows; the one in the middle ends while the newest
    # window is held: the free one goes at once (not only the newest, as the simulator
    # does), the others keep their pool GPU numbers, leases name the right node GPUs,
    # and a restarted controller schedules the same GPUs, gap and all
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    api = Api(site.c)  # what a lease's view says of its node GPUs (`physical_gpus`)
    assert api._physical(pool_id) == {0: 0, 1: 1}
    for who, job in ((BOB, 8), (CAROL, 9)):
        await site.register(who, job)
    wins = site.c.store.windows(pool_id)
    assert [w.window for w in wins] == [0, 1, 2]
    assert api._physical(pool_id) == {  # read as the windows are now, never cached
        w.window * 2 + i: d for w in wins for i, d in enumerate(w.gpu_indices)}
    assert await site.grant(7, Phase.TRAIN) == {0, 1}
    assert await site.grant(8, Phase.TRAIN) == {2, 3}
    assert await site.grant(9, Phase.TRAIN) == {4, 5}
    site.release(8, {2, 3})
    await site.c.end_job(8, JobState.COMPLETED, "done")
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0, 2]
    assert site.allocator.closed == [wins[1].slurm_job_id]
    assert site.c.scheduler.tables[pool_id].gpus == {0, 1, 4, 5}
    assert site.c.scheduler.windows(pool_id) == [frozenset({0, 1}), frozenset({4, 5})]
    pool = site.c.store.pool(pool_id)
    assert pool is not None and pool.gpus == 4
    assert pool.gpu_indices == (*wins[0].gpu_indices, *wins[2].gpu_indices)
    assert physical_gpus(pool, site.c.store.windows(pool_id)) == api._physical(pool_id) == {
        **dict(zip((0, 1), wins[0].gpu_indices, strict=True)),
        **dict(zip((4, 5), wins[2].gpu_indices, strict=True))}
    # job 7 and job 9 go on, each on a window left; while 9 holds its own, 7's next
    # phase takes the other, its services there taking its state over
    site.release(7, {0, 1})
    assert await site.grant(7, Phase.ROLLOUT) == {0, 1}
    assert site.launcher.of(7, "rollout", wins[0].slurm_job_id).handle.calls[-1] == \
        ("activate", True)
    again = LeaseScheduler(site.c.store, site.c.scheduler._policy,
                           site.c.config.controller.lease_timeout_s)
    again.restore()
    assert again.tables[pool_id].gpus == {0, 1, 4, 5}
    assert again.windows(pool_id) == [frozenset({0, 1}), frozenset({4, 5})]
    # job 9 ends: of the two free windows the newest goes
    site.release(7, {0, 1})
    site.release(9, {4, 5})
    await site.c.end_job(9, JobState.COMPLETED, "done")
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0]
    assert site.allocator.closed == [wins[1].slurm_job_id, wins[2].slurm_job_id]
    await site.c.end_job(7, JobState.COMPLETED, "done")
    await site.settle()
    assert site.allocator.closed == [w.slurm_job_id for w in (wins[1], wins[2], wins[0])]
    await site.c.stop()


@run
async def test_an_ended_jobs_state_is_not_written_back_after_its_discard(
        tmp_path: Path) -> None:
    # job 8 ends while a grant's hand-off is parking its copy on that window (writing
    # its state there): the discard waits for that hand-off, so the state file is gone
    # at the end, not written back after it
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    assert await site.grant(8, Phase.TRAIN) == {0, 1}
    t8 = site.launcher.of(8, "trainer", 101)
    site.release(8, {0, 1})
    t8.handle.hold = threading.Event()
    granted = asyncio.create_task(site.grant(7, Phase.TRAIN))  # takes window 0
    await asyncio.sleep(0.2)  # its hand-off is parking job 8's trainer there
    ended = asyncio.create_task(site.c.end_job(8, JobState.COMPLETED, "done"))
    await asyncio.sleep(0.2)
    t8.handle.hold.set()
    assert await granted == {0, 1}
    await ended
    await site.settle()
    assert t8.handle.calls[-2:] == [("park", True), ("discard", True)]
    assert t8 in site.launcher.stopped
    await site.c.stop()


@run
async def test_a_join_whose_window_slurm_refuses_opens_its_own_pool(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    site.allocator.refuse_on_node = True  # the pool's node is full; others are not
    await site.register(BOB, 8)
    a, b = site.job(7), site.job(8)
    assert b.state is JobState.RUNNING and b.pool_id not in (None, a.pool_id)
    assert a.pool_id is not None and len(site.c.store.windows(a.pool_id)) == 1
    pool = site.c.store.pool(b.pool_id)  # type: ignore[arg-type]
    assert pool is not None and pool.floating and pool.gpus == 2
    # nothing of job 8's was left on the refused window, nor of job 7's
    assert {s.pool_job_id for s in site.launcher.launched} == {101, 102}
    await site.c.stop()


@run
async def test_leases_in_a_floating_pool_are_whole_windows(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    with pytest.raises(LeaseError, match="whole windows"):
        site.c.scheduler.request(site.job(7), Phase.ROLLOUT, min_gpus=1)
    w = await site.grant(7, Phase.ROLLOUT)
    (lease,) = site.c.scheduler.tables[site.job(7).pool_id].leases  # type: ignore[index]
    with pytest.raises(LeaseError, match="whole windows"):
        site.c.scheduler.shrink(site.job(7), lease.lease_id, keep=1)
    with pytest.raises(LeaseError, match="whole windows"):
        site.c.scheduler.grow(site.job(7), lease.lease_id, [0])
    assert lease.gpus == w
    await site.c.stop()


@run
async def test_without_the_site_setting_pools_do_not_float(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), Config())
    await site.register(ALICE, 7)
    pool = site.c.store.pool(site.job(7).pool_id)  # type: ignore[arg-type]
    assert pool is not None and not pool.floating
    assert site.c.store.windows(pool.pool_id) == []
    await site.c.stop()


@run
async def test_a_restart_keeps_a_floating_pools_windows_and_waiters(tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    site = await _site(store)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    await site.register(CAROL, 9)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    await site.register(DAVE, 10)  # a fourth member on the three windows
    assert len(site.c.store.windows(pool_id)) == 3
    for job in (7, 8, 9):
        await site.grant(job, Phase.TRAIN)
    waiting = site.c.scheduler.request(site.job(10), Phase.ROLLOUT)  # all three held
    assert waiting.lease is None
    await site.c.stop()

    slurm = site.slurm
    site2 = await _site(store)
    site2.slurm.running.update(slurm.running)
    table = site2.c.scheduler.tables[pool_id]
    assert table.gpus == frozenset(range(6))
    (req,) = table.waiting
    assert req.job_id == 10 and len(req.options) == 3
    # it is granted whichever window frees first
    (held,) = [x for x in table.leases if x.job_id == 8]
    site2.c.scheduler.release(site2.job(8), held.lease_id, {})
    (got,) = [x for x in table.leases if x.job_id == 10]
    assert got.gpus == held.gpus
    await site2.c.stop()


def test_the_site_config_refuses_floating_pools_with_vllm_or_two_jobs_a_pool(
        tmp_path: Path) -> None:
    cfg = tmp_path / "slurmrl.toml"
    cfg.write_text('[slurm]\nfloating_pools = true\n[services]\nrollout_backend = "vllm"\n'
                   '[limits]\nmax_jobs_per_pool = 5\n')
    with pytest.raises(ConfigError, match=r"floating_pools.*vllm"):
        load(cfg, env={})
    cfg.write_text('[slurm]\nfloating_pools = true\n')  # max_jobs_per_pool: 2
    with pytest.raises(ConfigError, match=r"max_jobs_per_pool >= 3 \(got 2\)"):
        load(cfg, env={})
    cfg.write_text('[slurm]\nfloating_pools = true\n[limits]\nmax_jobs_per_pool = 12\n')
    assert load(cfg, env={}).slurm.floating_pools


class JoinAnyhow:
    """A site policy that joins the open pool without asking for a floating member."""

    name = "join-anyhow"
    mode = PoolMode.LEASE

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        pool = next((p.pool_id for p in snap.pools), None)
        return [Placement(j.job_id, Action.JOIN, pool) if pool is not None
                else Placement(j.job_id, Action.OPEN, -1, j.request.gpus, floating=True)
                for j in snap.waiting]


@run
async def test_a_floating_pool_takes_no_fixed_member(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    site.c.policies = replace(site.c.policies, pairing=JoinAnyhow())
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    a, b = site.job(7), site.job(8)
    assert b.state is JobState.RUNNING and b.pool_id not in (None, a.pool_id)
    pool = site.c.store.pool(b.pool_id)  # type: ignore[arg-type]
    assert pool is not None and not pool.floating
    await site.c.stop()


@run
async def test_a_node_without_room_for_a_window_is_not_asked_for_one(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"))
    # the pool's node has 2 GPUs in all, held by the pool's first window: Slurm would
    # keep a second window pending until the start timeout, so none is asked for; nor
    # a pool of bob's own, which no node has room for either: bob waits, told why
    nodes = [NodeInfo("n1", "MIXED", 2, 8, 64000, ("pools",))]
    site.slurm.nodes = lambda: list(nodes)  # type: ignore[method-assign]
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    a, b = site.job(7), site.job(8)
    assert a.state is JobState.RUNNING
    assert b.state is JobState.PENDING and b.pool_id is None
    assert b.reason == ("PoolPending: no node of partition 'pools' has 2 GPUs free "
                        "(at most 0 on one)")
    assert [node for _, _, node in site.allocator.opened] == [None]
    # a node with room comes up: the next round places bob in a pool of his own
    nodes.append(NodeInfo("n2", "IDLE", 2, 8, 64000, ("pools",)))
    await site.pools.reconcile()
    await site.settle()
    b = site.job(8)
    assert b.state is JobState.RUNNING and b.pool_id not in (None, a.pool_id)
    assert [node for _, _, node in site.allocator.opened] == [None, None]
    await site.c.stop()


PACKING = replace(FLOATING, services=replace(FLOATING.services, rollout_replica_gpus=1))


@run
async def test_a_rollout_tail_packs_beside_anothers_and_its_replica_there_takes_over(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), PACKING)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)

    def replica(job: int, gpu: int) -> FakeRunning:
        (svc,) = [s for s in site.launcher.launched if s.spec.job_id == job
                  and s.spec.role == "rollout" and s.spec.cuda_devices == (gpu,)]
        return svc

    # every job runs a one-GPU replica on each GPU of each window; replica i's copies
    # share a hand-off directory of their own, whichever window they are on
    for job in (7, 8):
        dirs = [replica(job, g).spec.handoff_dir for g in range(4)]
        assert dirs[0] == dirs[2] != dirs[1] == dirs[3]
        assert dirs[0].endswith("-r0") and dirs[1].endswith("-r1")  # type: ignore[union-attr]
        # replica 1's name does not follow from replica 0's (the root is world-listable:
        # another user who saw one squatted the next, and that copy could not start)
        assert dirs[0][:-3] != dirs[1][:-3]  # type: ignore[index]
    assert await site.grant(7, Phase.ROLLOUT) == {0, 1}
    assert await site.grant(8, Phase.ROLLOUT) == {2, 3}
    for s in site.launcher.launched:
        s.handle.calls.clear()
    table = site.c.scheduler.tables[site.job(7).pool_id]  # type: ignore[index]
    lease7, lease8 = (next(x for x in table.leases if x.job_id == j) for j in (7, 8))
    # job 8's tail first: the other window is full, so it stays on its own, on GPU 2
    kept = site.c.scheduler.pack(site.job(8), lease8.lease_id, [0])
    assert kept.gpus == {2}
    # job 7's tail then packs beside it, on GPU 3: window 0 is wholly free
    moved = site.c.scheduler.pack(site.job(7), lease7.lease_id, [0])
    assert moved.gpus == {3}
    await site.pools.before_answer(site.job(7), moved)
    # its replicas on window 0 hand the state off, its replica on GPU 3 takes it over,
    # after job 8's finished replica there has handed off job 8's
    assert replica(7, 0).handle.calls == [("park", True)]
    assert replica(7, 1).handle.calls == [("park", True)]
    assert replica(7, 3).handle.calls == [("activate", True)]
    assert replica(8, 3).handle.calls == [("park", True)]
    assert replica(8, 2).handle.calls == []  # job 8's tail runs on
    assert table.gpus - {g for x in table.leases for g in x.gpus} == {0, 1}
    # the ledger holds job 7's holds of GPUs 0 and 1, then of GPU 3
    holds = sorted((iv.gpu, iv.end is None) for iv in site.c.store.intervals()
                   if iv.lease_id == lease7.lease_id)
    assert holds == [(0, False), (1, False), (3, True)]
    # a packed tail's lease holds part of a window: its next phase is acquired anew
    with pytest.raises(LeaseError, match="part of a window"):
        site.c.scheduler.switch(site.job(7), lease7.lease_id, Phase.TRAIN, {})
    await site.c.stop()


@run
async def test_only_a_floating_pools_rollout_leases_pack(tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), PACKING)
    await site.register(ALICE, 7)
    w = await site.grant(7, Phase.TRAIN)
    (lease,) = site.c.scheduler.tables[site.job(7).pool_id].leases  # type: ignore[index]
    with pytest.raises(LeaseError, match="only a rollout"):
        site.c.scheduler.pack(site.job(7), lease.lease_id, [0])
    site.release(7, w)
    await site.grant(7, Phase.ROLLOUT)
    (lease,) = site.c.scheduler.tables[site.job(7).pool_id].leases  # type: ignore[index]
    with pytest.raises(LeaseError, match="non-empty subset"):
        site.c.scheduler.pack(site.job(7), lease.lease_id, [2])
    assert lease.gpus == {0, 1}
    await site.c.stop()
    fixed = await _site(Store(tmp_path / "d.db"), replace(PACKING, slurm=SlurmConfig()))
    await fixed.register(ALICE, 7)
    await fixed.grant(7, Phase.ROLLOUT)
    (lease,) = fixed.c.scheduler.tables[fixed.job(7).pool_id].leases  # type: ignore[index]
    with pytest.raises(LeaseError, match="not in a floating pool"):
        fixed.c.scheduler.pack(fixed.job(7), lease.lease_id, [0])
    await fixed.c.stop()


@run
async def test_a_pack_resent_after_its_answer_was_lost_changes_nothing(
        tmp_path: Path) -> None:
    # the client's pack timed out (hand-offs queued) after the controller had moved the
    # lease; its resend names the GPUs it saw the lease hold: answered as it is now,
    # where it was refused (409) and failed the rollout
    site = await _site(Store(tmp_path / "c.db"), PACKING)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    assert await site.grant(7, Phase.ROLLOUT) == {0, 1}
    assert await site.grant(8, Phase.ROLLOUT) == {2, 3}
    table = site.c.scheduler.tables[site.job(7).pool_id]  # type: ignore[index]
    lease7, lease8 = (next(x for x in table.leases if x.job_id == j) for j in (7, 8))
    assert site.c.scheduler.pack(site.job(8), lease8.lease_id, [0], held=[2, 3]).gpus == {2}
    moved = site.c.scheduler.pack(site.job(7), lease7.lease_id, [0], held=[0, 1])
    assert moved.gpus == {3}
    again = site.c.scheduler.pack(site.job(7), lease7.lease_id, [0], held=[0, 1])
    assert again.gpus == {3} and again.lease_id == lease7.lease_id
    holds = sorted((iv.gpu, iv.end is None) for iv in site.c.store.intervals()
                   if iv.lease_id == lease7.lease_id)
    assert holds == [(0, False), (1, False), (3, True)]  # nothing changed by the resend
    # without `held` (or with the GPUs it holds) it is a pack like any other, checked
    with pytest.raises(LeaseError, match="non-empty subset"):
        site.c.scheduler.pack(site.job(7), lease7.lease_id, [0])
    await site.c.stop()


@run
async def test_a_pack_keeps_whole_replicas_or_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # replicas of 2 GPUs on windows of 4: keeping GPUs 1 and 2 would keep half of each
    # of two replicas (whose copies the client then finds none of)
    monkeypatch.setitem(ENV, "SLURMRL_GPUS", "4")
    cfg = replace(FLOATING, services=replace(FLOATING.services, rollout_replica_gpus=2))
    site = await _site(Store(tmp_path / "c.db"), cfg)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    assert await site.grant(7, Phase.ROLLOUT) == {0, 1, 2, 3}
    table = site.c.scheduler.tables[site.job(7).pool_id]  # type: ignore[index]
    (lease,) = [x for x in table.leases if x.job_id == 7]
    with pytest.raises(LeaseError, match=r"whole replicas of 2 GPUs \(job-local 0-1, 2-3\), "
                                         r"got \[1, 2\]"):
        site.c.scheduler.pack(site.job(7), lease.lease_id, [1, 2], unit=2)
    assert lease.gpus == {0, 1, 2, 3}
    assert site.c.scheduler.pack(site.job(7), lease.lease_id, [2, 3], unit=2).gpus == {2, 3}
    await site.c.stop()


@run
async def test_the_policy_is_told_tails_pack_and_a_floating_pool_fits_one_node(
        tmp_path: Path) -> None:
    for cfg, packs in ((FLOATING, {}), (PACKING, {"pools": True})):
        site = await _site(Store(tmp_path / f"{bool(packs)}.db"), cfg)
        await site.register(ALICE, 7)
        seen = site.c.policies.pairing.seen  # type: ignore[attr-defined]
        assert seen is not None and seen.floating == {"pools": True}
        assert seen.packs_tails == packs  # one-GPU rollout replicas: tails pack
        assert seen.floating_max_gpus == {"pools": 8}  # the node's GPUs (FakeSlurm's n1)
        await site.c.stop()


ACROSS = replace(FLOATING, slurm=replace(FLOATING.slurm, floating_across_nodes=True),
                 services=replace(FLOATING.services, handoff_dir="/dev/shm/rl-%n"))


@run
async def test_across_nodes_a_full_node_sends_a_window_elsewhere_and_the_state_follows(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), ACROSS)
    # Slurm's view: n1 has 2 GPUs, all the pool's first window's; n2 has 4 free, n3 8
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "MIXED", 2, 8, 64000, ("pools",)),
        NodeInfo("n3", "IDLE", 8, 8, 64000, ("pools",)),
        NodeInfo("n2", "IDLE", 4, 8, 64000, ("pools",)),
        NodeInfo("d1", "IDLE", 2, 8, 64000, ("drivers",))]
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None and site.job(8).pool_id == pool_id
    assert site.allocator.opened[-1][2] == "n2"  # best fit: on n2, not on n3
    wins = site.c.store.windows(pool_id)
    assert [(w.window, w.node) for w in wins] == [(0, None), (1, "n2")]
    # every member's services on window 1 run on n2
    on = {(s.spec.job_id, s.pool_job_id): n for s, n in zip(site.launcher.launched,
                                                           site.launcher.nodes, strict=True)}
    assert {n for (j, alloc), n in on.items() if alloc == wins[1].slurm_job_id} == {"n2"}
    assert {n for (j, alloc), n in on.items() if alloc == wins[0].slurm_job_id} == {"n1"}
    # each node's copies hand off under that node's directory (`%n` in handoff_dir)
    for svc, node in zip(site.launcher.launched, site.launcher.nodes, strict=True):
        assert svc.spec.handoff_dir is not None
        assert svc.spec.handoff_dir.startswith(f"/dev/shm/rl-{node}/slurmrl-job"), svc.spec
    # job 7 trains on window 0 (n1), then job 8 takes it; job 7's next train is on
    # window 1 (n2), whose copy fetches job 7's state from the copy on n1
    t7 = {a: site.launcher.of(7, "trainer", a) for a in (101, 102)}
    w = await site.grant(7, Phase.TRAIN)
    assert w == {0, 1}
    site.release(7, w)
    assert await site.grant(8, Phase.TRAIN) == {0, 1}
    assert await site.grant(7, Phase.TRAIN) == {2, 3}
    assert t7[102].handle.calls[-1] == ("activate", True)
    assert t7[102].handle.sources[-1] == t7[101].address
    # within one node nothing is fetched: job 8's copy on window 0 took its state there
    t8 = site.launcher.of(8, "trainer", 101)
    assert t8.handle.sources == [None]
    # `slurmrl status --pools` lists the nodes its windows are on
    pool = site.c.store.pool(pool_id)
    assert pool is not None
    view = pool_view(pool, [7, 8], admin=True, windows=site.c.store.windows(pool_id))
    assert view["nodes"] == ["n1", "n2"] and view["windows"] == 2
    # the policy is told floating pools are not bounded by a node
    seen = site.c.policies.pairing.seen  # type: ignore[attr-defined]
    assert seen is not None and seen.floating_max_gpus == {}
    # job 8 ends: one member on two windows, but job 7's state is active on n2's
    # window, the only one on n2: giving it back as it is would strand the state there
    # (its copies stopped, none could fetch it). It is moved to job 7's copy on n1
    # first; while that copy cannot fetch it, the window stays
    site.release(7, {2, 3})
    t7[101].handle.fail_fetch = True
    await site.c.end_job(8, JobState.COMPLETED, "done")
    await site.settle()
    await site.pools.reconcile()
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0, 1]
    assert site.allocator.closed == []
    assert t7[102].handle.calls[-1] == ("park", True)  # handed off on n2, kept there
    assert t7[101].handle.fetched[-1] == t7[102].address
    t7[101].handle.fail_fetch = False
    await site.pools.reconcile()
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0]
    assert site.allocator.closed == [wins[1].slurm_job_id]
    assert pool_view(pool, [7], admin=True,
                     windows=site.c.store.windows(pool_id))["nodes"] == ["n1"]
    assert t7[101].handle.stored == t7[102].handle.generation  # the newest, on n1 now
    assert t7[101].handle.calls[-1] == ("park", True)  # fetched, nothing woken
    # its next train takes that state over on n1, nothing fetched from anywhere
    assert await site.grant(7, Phase.TRAIN) == {0, 1}
    assert t7[101].handle.calls[-1] == ("activate", True)
    assert t7[101].handle.sources[-1] is None
    # job 7 ends: its copies on both nodes remove its state there, then both go
    await site.c.end_job(7, JobState.COMPLETED, "done")
    await site.settle()
    assert all(s.handle.calls[-1] == ("discard", True) for s in site.launcher.launched
               if s.spec.job_id == 7)
    await site.c.stop()


@run
async def test_a_state_moved_off_a_node_does_not_hold_the_pools_grants(
        tmp_path: Path) -> None:
    # the move's fetch (seconds for a large state over a network) runs outside the
    # pool's hand-off lock: a grant in the pool is answered meanwhile; the window goes
    # only once the state is no longer newest there
    site, pool_id, wins = await _across_two_nodes(tmp_path)  # job 7's state on n2
    t7 = {a: site.launcher.of(7, "trainer", a) for a in (wins[0].slurm_job_id,
                                                         wins[1].slurm_job_id)}
    held = threading.Event()
    t7[wins[0].slurm_job_id].handle.hold = held
    ended = asyncio.create_task(site.c.end_job(8, JobState.COMPLETED, "done"))
    await site.until(lambda: t7[wins[1].slurm_job_id].handle.calls[-1] == ("park", True))
    # the fetch onto n1 is under way; job 7's next phase is granted at once
    assert await asyncio.wait_for(site.grant(7, Phase.ROLLOUT), 2.0) == {2, 3}
    held.set()
    await ended
    await site.settle()
    # asked again once the fetch is done: job 7 holds n2's window now, and n1's is
    # free with nothing there newer than elsewhere: that one goes (its copies remove
    # job 7's files on n1, the only window there)
    assert [w.window for w in site.c.store.windows(pool_id)] == [1]
    assert site.allocator.closed == [wins[0].slurm_job_id]
    assert t7[wins[0].slurm_job_id].handle.calls[-1] == ("discard", True)
    assert t7[wins[1].slurm_job_id].handle.calls[-1] == ("park", True)  # its trainer
    await site.c.stop()


async def _across_two_nodes(tmp_path: Path) -> tuple[Site, int, list[Any]]:
    """Jobs 7 and 8 in one floating pool, window 0 on n1, window 1 on n2; job 8 trained
    on window 0, then job 7 on window 1 (n2): job 7's newest state is on n2. Both
    released."""
    site = await _site(Store(tmp_path / "c.db"), ACROSS)
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "MIXED", 2, 8, 64000, ("pools",)),
        NodeInfo("n2", "IDLE", 4, 8, 64000, ("pools",))]
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    wins = site.c.store.windows(pool_id)
    assert [w.node for w in wins] == [None, "n2"]
    assert await site.grant(8, Phase.TRAIN) == {0, 1}
    assert await site.grant(7, Phase.TRAIN) == {2, 3}
    site.release(7, {2, 3})
    site.release(8, {0, 1})
    return site, pool_id, wins


@run
async def test_a_jobs_end_waits_for_a_move_of_its_state_under_way(tmp_path: Path) -> None:
    # job 8 ends: n2's window is to go, and job 7's state is moved off n2 first. Job 7
    # ends while that fetch is under way: its copies remove its files only once the
    # fetch is done (a fetch landing after the discard left the state on n1)
    site, pool_id, wins = await _across_two_nodes(tmp_path)
    t7 = {w.window: site.launcher.of(7, "trainer", w.slurm_job_id) for w in wins}
    held = threading.Event()
    t7[0].handle.hold = held
    ended8 = asyncio.create_task(site.c.end_job(8, JobState.COMPLETED, "done"))
    await site.until(lambda: t7[1].handle.calls[-1] == ("park", True))
    ended7 = asyncio.create_task(site.c.end_job(7, JobState.COMPLETED, "done"))
    await asyncio.sleep(0.3)
    assert ("discard", True) not in t7[0].handle.calls  # waits for the fetch
    assert t7[0].handle.fetched == []
    held.set()
    await ended8
    await ended7
    await site.settle()
    assert t7[0].handle.fetched == [t7[1].address]
    for copy in t7.values():  # after the fetch: nothing of job 7's left on either node
        assert copy.handle.calls[-1] == ("discard", True)
        assert copy in site.launcher.stopped
    pool = site.c.store.pool(pool_id)
    assert pool is not None and pool.state == "closed"
    await site.c.stop()


@run
async def test_a_copy_that_does_not_answer_keeps_its_window_until_its_state_is_moved(
        tmp_path: Path) -> None:
    # job 7's newest state was handed off on n2, where its copy stops answering its
    # status: the window is not taken for holding nothing (it is job 7's newest). The
    # state is moved off n2 first; while that fails, the window stays
    site, pool_id, wins = await _across_two_nodes(tmp_path)
    t7 = {w.window: site.launcher.of(7, "trainer", w.slurm_job_id) for w in wins}
    (key,) = [k for k, lv in site.pools._live.items() if lv.handle is t7[1].handle]
    await site.pools._set(key, Residency.PARKED, handoff=True)  # as a grant's hand-off
    t7[1].handle.fail_status = True
    t7[0].handle.fail_fetch = True
    await site.c.end_job(8, JobState.COMPLETED, "done")
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0, 1]
    assert site.allocator.closed == []
    assert t7[0].handle.fetched == [t7[1].address]
    # the fetch succeeds, but whether n2 held anything newer is still unknown while
    # its copy does not answer: the window stays until it does
    t7[0].handle.fail_fetch = False
    await site.pools.reconcile()
    await site.settle()
    assert t7[0].handle.fetched == [t7[1].address] * 2
    assert t7[0].handle.stored == t7[1].handle.generation  # the newest, on n1 now
    assert [w.window for w in site.c.store.windows(pool_id)] == [0, 1]
    t7[1].handle.fail_status = False
    await site.pools.reconcile()
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0]
    assert site.allocator.closed == [wins[1].slurm_job_id]
    assert len(t7[0].handle.fetched) == 2  # nothing newer there: not fetched again
    await site.c.stop()


@run
async def test_a_window_added_while_another_is_given_back_takes_a_new_number(
        tmp_path: Path) -> None:
    # job 9 ends; the newest window (2) is given back while job 7's copy there is
    # still handing its state off. Meanwhile job 10 joins and the pool grows: the new
    # window is number 3, not 2 again (whose copies, named for window 2, are stopping),
    # and every copy on it runs
    site = await _site(Store(tmp_path / "c.db"))
    for who, job in ((ALICE, 7), (BOB, 8), (CAROL, 9)):
        await site.register(who, job)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    wins = site.c.store.windows(pool_id)
    assert await site.grant(8, Phase.TRAIN) == {0, 1}
    assert await site.grant(9, Phase.TRAIN) == {2, 3}
    assert await site.grant(7, Phase.TRAIN) == {4, 5}
    for job, gpus in ((7, {4, 5}), (8, {0, 1}), (9, {2, 3})):
        site.release(job, frozenset(gpus))
    t7 = site.launcher.of(7, "trainer", wins[2].slurm_job_id)
    held = threading.Event()
    t7.handle.hold = held
    ended = asyncio.create_task(site.c.end_job(9, JobState.COMPLETED, "done"))
    await site.until(lambda: [w.window for w in site.c.store.windows(pool_id)] == [0, 1])
    joined = asyncio.create_task(site.register(DAVE, 10))
    await site.until(lambda: len(site.c.store.windows(pool_id)) == 3)
    held.set()
    await ended
    await joined
    await site.settle()
    assert [w.window for w in site.c.store.windows(pool_id)] == [0, 1, 3]
    new = site.c.store.windows(pool_id)[-1]
    assert site.c.scheduler.windows(pool_id)[-1] == frozenset({6, 7})
    old = [s for s in site.launcher.launched if s.pool_job_id == wins[2].slurm_job_id]
    assert old and all(s in site.launcher.stopped for s in old)
    on_new = [s for s in site.launcher.launched if s.pool_job_id == new.slurm_job_id]
    assert {s.spec.job_id for s in on_new} == {7, 8, 10}
    assert not any(s in site.launcher.stopped for s in on_new)
    live = [id(lv.handle) for lv in site.pools._live.values() if lv.footprint.window == 3]
    assert sorted(live) == sorted(id(s.handle) for s in on_new)
    await site.c.stop()


@run
async def test_a_restart_cancels_a_window_given_back_but_still_allocated(
        tmp_path: Path) -> None:
    # the controller stopped between closing a window in its database and cancelling
    # its allocation: at start it cancels it and stops the copies still running there
    store = Store(tmp_path / "c.db")
    site = await _site(store)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    wins = site.c.store.windows(pool_id)
    assert await site.grant(7, Phase.TRAIN) == {0, 1}
    assert await site.grant(8, Phase.TRAIN) == {2, 3}
    site.release(8, {2, 3})
    assert site.c.retire_window(pool_id, wins[1]) is not None  # ... and it stopped here
    await site.c.stop()

    site2 = await _site(store)
    site2.slurm.running.update(site.slurm.running)
    assert site2.allocator.closed == [wins[1].slurm_job_id]
    stopped = {s.service_id for s in store.services() if s.state == "stopped"}
    on_window_1 = [s for s in store.services() if s.pool_id == pool_id
                   and min(s.gpus) >= 2]
    assert on_window_1 and {s.service_id for s in on_window_1} <= stopped
    assert [w.window for w in store.windows(pool_id)] == [0]
    await site2.c.stop()


@run
async def test_a_floating_pool_that_loses_a_window_gives_back_its_others(
        tmp_path: Path) -> None:
    # Slurm ends one window's allocation (a node failure): the pool is lost with its
    # jobs, and its other window's allocation is cancelled, not left holding GPUs
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    first, second = site.c.store.windows(pool_id)
    site.allocator.lost.add(second.slurm_job_id)
    await site.pools.reconcile()
    await site.settle()
    pool = site.c.store.pool(pool_id)
    assert pool is not None and pool.state == "closed" and "node failure" in pool.reason
    assert site.job(7).state is JobState.CANCELLED
    assert site.allocator.closed == [first.slurm_job_id]
    await site.c.stop()


@run
async def test_a_restart_cancels_a_window_allocated_but_never_recorded(
        tmp_path: Path) -> None:
    # the controller stopped while a window's services launched: Slurm runs the
    # allocation, the database knows nothing of it. The next start finds it by the
    # controller's tag and cancels it; the pool's own windows stay
    store = Store(tmp_path / "c.db")
    site = await _site(store)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    leaked = site.allocator.open(2, "window of pool 1", "n1")
    await site.c.stop()

    site2 = await _site(store, allocator=site.allocator)
    site2.slurm.running.update(site.slurm.running)
    assert site2.allocator.closed == [leaked.slurm_job_id]
    assert [w.window for w in store.windows(pool_id)] == [0, 1]
    assert store.pool(pool_id).state == "open"  # type: ignore[union-attr]
    await site2.c.stop()


@run
async def test_a_restart_ends_a_copy_still_launching_at_the_crash(tmp_path: Path) -> None:
    # the controller stopped while a new window's copies launched: job 7's rollout
    # copy there recorded, with no address yet. It was never re-attached nor ended
    # (not even at its job's end), and `job.service("rollout")`, which waits for every
    # copy's address, timed out
    store = Store(tmp_path / "c.db")
    site = await _site(store)
    await site.register(ALICE, 7)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    site.allocator.open(2, f"window of pool {pool_id}", "n1")
    starting = store.add_service(job_id=7, role="rollout", started_at=1.0, pool_id=pool_id,
                                 backend="tiny", gpus=(2, 3), handoff_dir="/dev/shm/x")
    await site.c.stop()

    site2 = await _site(store, allocator=site.allocator)
    site2.slurm.running.update(site.slurm.running)
    await site2.settle()
    (svc,) = [s for s in store.services(job_id=7) if s.service_id == starting]
    assert svc.state == "failed" and svc.ended_at is not None
    live = store.services(job_id=7, live_only=True)
    assert sorted(s.role for s in live) == ["rollout", "trainer"]
    assert all(s.address for s in live)
    await site2.c.end_job(7, JobState.COMPLETED, "done")
    await site2.settle()
    assert store.services(job_id=7, live_only=True) == []
    await site2.c.stop()


@run
async def test_a_pools_gpu_seconds_count_each_window_from_its_allocation_to_its_cancel(
        tmp_path: Path) -> None:
    # a window is allocated (Slurm runs it) before every member's services launch on
    # it (each waits for its model: 30 s here), and stays allocated until cancelled,
    # after its copies stop (10 s each here): the pool's GPU-seconds count all of it
    clock = [1000.0]
    running: dict[int, float] = {}
    cancelled: dict[int, float] = {}

    class Timed(FakeAllocator):
        def open(self, gpus: int, label: str = "", node: str | None = None,
                 gpu_type: str | None = None,
             exclude: str | None = None) -> SlurmPool:
            got = super().open(gpus, label, node)
            running[got.slurm_job_id] = clock[0]
            return got

        def close(self, slurm_job_id: int) -> None:
            super().close(slurm_job_id)
            cancelled[slurm_job_id] = clock[0]

    class Slow(FakeLauncher):
        def launch(self, pool_job_id: int, node: str, spec: ServiceSpec,
                   secret: str) -> FakeRunning:
            clock[0] += 30.0
            return super().launch(pool_job_id, node, spec, secret)

        def stop(self, svc: FakeRunning) -> None:
            clock[0] += 10.0
            super().stop(svc)

    store = Store(tmp_path / "c.db")
    slurm, allocator, launcher = FakeSlurm(), Timed(), Slow()
    pools = SlurmPools(allocator=allocator, launcher=launcher)  # type: ignore[arg-type]
    c = Controller(FLOATING, store, slurm, pools=pools,  # type: ignore[arg-type]
                   clock=lambda: clock[0])
    c.policies = replace(c.policies, pairing=FloatFirst())
    await c.start()
    site = Site(c, pools, slurm, allocator, launcher)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    wins = store.windows(pool_id)
    assert [w.opened_at for w in wins] == [running[w.slurm_job_id] for w in wins]
    # job 7's two services launched there after it, then job 8's on both windows
    assert clock[0] - wins[1].opened_at == 6 * 30.0
    clock[0] += 100.0
    await c.end_job(8, JobState.COMPLETED, "done")
    await site.settle()
    (gone,) = [w for w in store.windows(pool_id, open_only=False) if w.closed_at is not None]
    assert gone.closed_at == cancelled[gone.slurm_job_id]
    pool = store.pool(pool_id)
    assert pool is not None
    assert store.pool_gpu_seconds(pool, clock[0]) == pytest.approx(sum(
        2 * (cancelled.get(j, clock[0]) - t) for j, t in running.items()))
    await c.stop()


def test_the_site_config_refuses_floating_across_nodes_without_floating_pools(
        tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text('[slurm]\nfloating_across_nodes = true\n')
    with pytest.raises(ConfigError, match=r"floating_across_nodes.*floating_pools = true"):
        load(cfg, env={})


@run
async def test_a_failed_launch_on_a_new_window_leaves_the_members_other_copies(
        tmp_path: Path) -> None:
    # job 7's copy on the window bob's arrival added fails to start (a slow model load):
    # only that window's services stop; job 7's copies and its handed-off state on its
    # first window stayed, where all of them used to be stopped and the state discarded
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    first = [s for s in site.launcher.launched if s.spec.job_id == 7]
    assert {s.pool_job_id for s in first} == {101}
    launch = site.launcher.launch

    def fails_on_102(pool_job_id: int, node: str, spec: ServiceSpec,
                     secret: str) -> FakeRunning:
        if spec.job_id == 7 and pool_job_id == 102:
            raise ServiceLaunchError("service not listening within 120 s")
        return launch(pool_job_id, node, spec, secret)

    site.launcher.launch = fails_on_102  # type: ignore[method-assign]
    await site.register(BOB, 8)
    assert site.job(7).state is JobState.RUNNING
    assert not [s for s in site.launcher.stopped if s in first]
    assert all(("discard", True) not in s.handle.calls for s in first)
    kept = [lv for k, lv in site.pools._live.items() if k[0] == 7]
    assert len(kept) == len(first) and {lv.footprint.window for lv in kept} == {0}
    await site.c.stop()


class _Windows:
    """Pairing: job 7 opens a floating pool of one window; each later job joins it,
    asking the pool to have `windows[job]` windows."""

    name, mode = "script", PoolMode.LEASE
    windows: ClassVar[dict[int, int]] = {7: 1, 8: 1, 9: 2}

    def place(self, snap: ClusterSnapshot) -> list[Placement]:
        pool = next((p for p in snap.pools if p.floating), None)
        return [Placement(j.job_id, Action.OPEN, -1, 2, floating=True) if pool is None
                else Placement(j.job_id, Action.JOIN, pool.pool_id, 2 * self.windows[j.job_id],
                               floating=True) for j in snap.waiting]


@run
async def test_a_window_added_while_a_member_waits_is_granted_to_it(tmp_path: Path) -> None:
    # a waiting request named the windows at its making: the new one sat free beside it
    s = await _site(Store(tmp_path / "c.db"))
    s.c.policies = replace(s.c.policies, pairing=_Windows())
    await s.register(ALICE, 7)
    await s.register(BOB, 8)
    pool = s.job(7).pool_id
    assert pool is not None
    await s.grant(7, Phase.TRAIN)
    ticket = s.c.scheduler.request(s.job(8), Phase.TRAIN)
    assert ticket.lease is None  # the pool's one window is held
    await s.register(CAROL, 9)  # a second window comes
    assert [w.window for w in s.c.store.windows(pool)] == [0, 1]
    held = [sorted(x.gpus) for x in s.c.scheduler.tables[pool].leases if x.job_id == 8]
    assert held == [[2, 3]]
    await s.c.stop()


@run
async def test_a_member_ending_while_its_copy_on_a_new_window_launches_leaves_none_running(
        tmp_path: Path) -> None:
    # the copy came up after the job's end had stopped its others and cleared its state:
    # nothing stopped it, and it held the ended job's model on the window's GPUs
    site = await _site(Store(tmp_path / "c.db"))
    await site.register(ALICE, 7)
    await site.register(BOB, 8)  # windows 0 and 1
    gate, started = threading.Event(), threading.Event()
    launch = site.launcher.launch

    def slow(pool_job_id: int, node: str, spec: ServiceSpec, secret: str) -> FakeRunning:
        if spec.job_id == 7 and pool_job_id == 103 and spec.role == "rollout":
            started.set()  # its model loads
            gate.wait(10)
        return launch(pool_job_id, node, spec, secret)

    site.launcher.launch = slow  # type: ignore[method-assign]
    site.slurm.add(9, CAROL)
    joining = asyncio.create_task(site.c.register(CAROL, 9, ENV))  # a third window
    while not started.is_set():
        await asyncio.sleep(0.01)
    await site.c.end_job(7, JobState.CANCELLED, "scancel")
    gate.set()
    await joining
    await site.settle()
    assert [r for r in site.c.store.services(job_id=7) if r.state == "running"] == []
    assert not [k for k in site.pools._live if k[0] == 7]
    (late,) = [s for s in site.launcher.launched if s.spec.job_id == 7
               and s.pool_job_id == 103 and s.spec.role == "rollout"]
    assert late in site.launcher.stopped
    assert ("discard", True) in late.handle.calls  # its state file removed from the node
    assert site.job(9).state is JobState.RUNNING
    await site.c.stop()


@run
async def test_a_window_that_fails_on_another_node_leaves_no_state_there(
        tmp_path: Path) -> None:
    site = await _site(Store(tmp_path / "c.db"), ACROSS)
    free = {"n1": 4, "n2": 4}
    site.slurm.nodes = lambda: [  # type: ignore[method-assign]
        NodeInfo("n1", "MIXED", free["n1"], 8, 64000, ("pools",)),
        NodeInfo("n2", "IDLE", free["n2"], 8, 64000, ("pools",))]
    await site.register(ALICE, 7)
    await site.register(BOB, 8)  # windows 0 and 1 on n1
    free["n1"] = 0  # the next window goes to n2
    launch = site.launcher.launch

    def fails(pool_job_id: int, node: str, spec: ServiceSpec, secret: str) -> FakeRunning:
        if spec.job_id == 8 and node == "n2":
            raise ServiceLaunchError("service not listening within 120 s")
        return launch(pool_job_id, node, spec, secret)

    site.launcher.launch = fails  # type: ignore[method-assign]
    await site.register(CAROL, 9)
    assert [w.node for w in site.c.store.windows(site.job(7).pool_id)] == [None, None]
    # job 7's copies came up on n2 and handed their state off there: they remove it
    on_n2 = [s for s, n in zip(site.launcher.launched, site.launcher.nodes, strict=True)
             if n == "n2"]
    assert on_n2 and all(s in site.launcher.stopped for s in on_n2)
    assert all(("discard", True) in s.handle.calls for s in on_n2)
    # the next window on n2 names its directories afresh: the discarded names were seen
    # in a world-listable root, and another user may have made them meanwhile
    site.launcher.launch = launch  # type: ignore[method-assign]
    gone = {s.spec.handoff_dir for s in on_n2}
    n = len(site.launcher.launched)
    await site.register(DAVE, 10)
    again = [s for s, node in zip(site.launcher.launched[n:], site.launcher.nodes[n:],
                                  strict=True) if node == "n2" and s.spec.job_id == 7]
    assert again and not gone & {s.spec.handoff_dir for s in again}
    await site.c.stop()


@run
async def test_a_new_copy_takes_the_directory_its_jobs_copies_on_the_node_hand_off_in(
        tmp_path: Path) -> None:
    # a controller restarted with another `services.handoff_dir` (or a version naming
    # the directories otherwise) started the job's next copy on that node in a new
    # directory: it took over no state, and the job trained on from fresh weights
    site = await _site(Store(tmp_path / "c.db"))
    launch = site.launcher.launch

    def at_node_addr(pool_job_id: int, node: str, spec: ServiceSpec,
                     secret: str) -> FakeRunning:
        # as ServiceLauncher: a service's address is Slurm's NodeAddr of its node (the
        # dev cluster's every node: 127.0.0.1), not the node's name
        svc = launch(pool_job_id, node, spec, secret)
        n = len(site.launcher.launched)
        svc.address = svc.handle.address = f"127.0.0.1:{5000 + n}/{n:016x}"
        return svc

    site.launcher.launch = at_node_addr  # type: ignore[method-assign]
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    before = {s.spec.handoff_dir for s in site.launcher.launched if s.spec.job_id == 7}
    assert len(before) == 1 and None not in before
    site.c.config = replace(site.c.config, services=replace(
        site.c.config.services, handoff_dir="/dev/shm/elsewhere"))
    await site.register(CAROL, 9)  # a third window, on the same node
    (third,) = [w for w in site.c.store.windows(site.job(7).pool_id) if w.window == 2]
    copies = [s for s in site.launcher.launched
              if s.spec.job_id == 7 and s.pool_job_id == third.slurm_job_id]
    assert copies and {s.spec.handoff_dir for s in copies} == before
    # job 9, new to the node, gets the directory the site names now
    assert all(s.spec.handoff_dir.startswith("/dev/shm/elsewhere/")  # type: ignore[union-attr]
               for s in site.launcher.launched if s.spec.job_id == 9)
    await site.c.stop()


@run
async def test_one_lost_window_charges_the_others_leases_to_their_end_not_its(
        tmp_path: Path) -> None:
    store = Store(tmp_path / "c.db")
    site = await _site(store)
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    pool_id = site.job(7).pool_id
    assert pool_id is not None
    first = await site.grant(7, Phase.TRAIN)
    second = await site.grant(8, Phase.TRAIN)
    assert first != second
    _, w1 = store.windows(pool_id)
    lost_at = time.time()
    await asyncio.sleep(0.3)  # window 1's node fails; window 0 runs on until noticed

    class LosesWindowOne(FakeAllocator):
        def losses(self, slurm_job_ids: list[int]) -> list[Any]:
            return [PoolLoss(w1.slurm_job_id, "NODE_FAIL", ended_at=lost_at)]

    site.pools.allocator = LosesWindowOne()
    await site.pools.reconcile()
    await site.settle()
    pool = store.pool(pool_id)
    assert pool is not None and pool.state == "closed"
    leases = {x.job_id: x for x in store.leases(pool_id=pool_id)}
    # job 7's window ran until the pool was closed, not until window 1's failure
    assert leases[7].released_at is not None and leases[7].released_at > lost_at + 0.25
    # job 8's lease, on window 1's GPUs, and window 1 itself ended with its allocation
    assert second == {w1.window * 2, w1.window * 2 + 1}
    assert leases[8].released_at == pytest.approx(lost_at)
    closed = {w.window: w.closed_at for w in store.windows(pool_id, open_only=False)}
    assert closed[w1.window] == pytest.approx(lost_at)
    assert pool.closed_at is not None and pool.closed_at > lost_at + 0.25
    assert closed[0] == pytest.approx(pool.closed_at)
    granted = leases[8].granted_at
    assert granted is not None
    assert store.gpu_seconds([8])[8] == pytest.approx(2 * (lost_at - granted))
    await site.c.stop()


def test_a_pool_lost_while_the_controller_was_down_leaves_no_state_on_its_nodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # closed at start, before its copies were re-attached: the jobs' ends found none to
    # discard their state, and the strays were stopped without
    asked: list[tuple[str, str]] = []

    class Handle:  # what the restarted controller's calls to a stray copy do
        def __init__(self, address: str, *args: Any, **kwargs: Any) -> None:
            self.address = address

        def discard_handoff(self, timeout_s: float | None = None) -> bool:
            asked.append(("discard", self.address))
            return True

        def stop(self, timeout_s: float | None = None) -> None:
            asked.append(("stop", self.address))

    async def main() -> None:
        store = Store(tmp_path / "c.db")
        site = await _site(store)
        await site.register(ALICE, 7)
        await site.register(BOB, 8)
        pool_id = site.job(7).pool_id
        assert pool_id is not None
        _, w1 = store.windows(pool_id)
        await site.c.stop()
        site.allocator.lost.add(w1.slurm_job_id)  # while the controller is down
        monkeypatch.setattr("slurmrl.controller.pools.ServiceHandle", Handle)
        site2 = await _site(store, allocator=site.allocator)
        await site2.settle()
        pool = store.pool(pool_id)
        assert pool is not None and pool.state == "closed"
        copies = {s.address for s in store.services(pool_id=pool_id)}
        assert {a for k, a in asked if k == "discard"} == copies
        assert {a for k, a in asked if k == "stop"} == copies
        await site2.c.stop()

    asyncio.run(main())


class FloatPairs(FloatFirst):
    """Fixed pairs (`fixed_group`) in floating pools: a pool that has had two members
    takes no third, though the site allows four."""

    name = "float-pairs"
    fixed_group = 2


@run
async def test_a_floating_pool_whose_fixed_group_was_complete_takes_no_new_member(
        tmp_path: Path) -> None:
    # it was marked closed for the policy, and joined anyway (the simulator refuses)
    site = await _site(Store(tmp_path / "c.db"))
    site.c.policies = replace(site.c.policies, pairing=FloatPairs())
    await site.register(ALICE, 7)
    await site.register(BOB, 8)
    await site.register(CAROL, 9)
    a, b, c = site.job(7), site.job(8), site.job(9)
    assert a.pool_id is not None and b.pool_id == a.pool_id
    assert c.state is JobState.RUNNING and c.pool_id not in (None, a.pool_id)
    assert len(site.c.store.windows(a.pool_id)) == 2  # no window added for job 9
    await site.c.stop()
