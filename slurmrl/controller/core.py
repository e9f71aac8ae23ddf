"""The controller: RL jobs, pools and leases behind the RPC, on one asyncio loop.

`Controller` holds the Store, the lease scheduler, the Slurm backend and the pool
manager, and implements every operation the RPC offers, with its authorization: a
caller acts only on its own jobs; root and `controller.admins` act on all. Slurm calls
run in worker threads (they block); DB writes run on the loop (they are short).

Known limits: the `SLURMRL_*` request a driver presents is re-validated, not read from
Slurm (Slurm cannot return a job's environment cheaply), so a user can only lie about
their own job's request, and admission limits still apply to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from policies import registry
from policies.base import Verdict
from slurmrl.auth.requests import is_admin
from slurmrl.auth.tokens import mint_secret
from slurmrl.config import Config
from slurmrl.controller.manager import AttachedPools, PoolManager
from slurmrl.controller.metrics import Metrics
from slurmrl.controller.placement import (
    JobHistories,
    admission_of,
    job_snapshot,
    load_policies,
    site_limits,
)
from slurmrl.controller.scheduler import LeaseScheduler
from slurmrl.controller.validate import RpcError
from slurmrl.db import JobRecord, PoolRecord, Store, WindowRecord
from slurmrl.directives import DirectiveError, parse_env
from slurmrl.leases import LeaseError
from slurmrl.leases.types import Lease
from slurmrl.model import Identity, JobState, Mux
from slurmrl.slurm import JobInfo, SlurmBackend, SlurmError, SlurmJobState, SlurmParseError

log = logging.getLogger(__name__)

_END_STATES = {"CD": JobState.COMPLETED, "F": JobState.FAILED, "CA": JobState.CANCELLED}


#: how far Slurm's clock may be ahead of the controller's (MUNGE's default credential
#: lifetime: more breaks MUNGE): a job Slurm started later than that after its RL job
#: registered is a later run of it
CLOCK_SKEW_S = 300.0


def _requeued(job: JobRecord, info: JobInfo) -> str | None:
    """Why the Slurm job's run is no longer the one that registered the RL job (back in
    the queue, or running again since), else None."""
    if job.slurm_started_at is not None:  # the registering run's start, as Slurm gave it
        restarted = (info.start_time is not None
                     and abs(info.start_time - job.slurm_started_at) > 1.0)
    else:  # registered before that was kept: a start well after the registration
        restarted = (info.start_time is not None
                     and info.start_time > job.registered_at + CLOCK_SKEW_S)
    if not (info.state.queued or restarted):
        return None
    why = f", reason {info.reason}" if info.reason else ""
    state = info.state if info.state.queued else "running again"
    return (f"Slurm job requeued ({state}{why}); a requeued job is not placed again: "
            "submit it anew")


def _ending(job: JobRecord, info: JobInfo | None) -> tuple[JobState, str] | None:
    """How an RL job ends, and why, for its Slurm job's state (None: it runs on).

    Gone or ended; completing (ended, its processes being killed: it may stay so for
    long, a process stuck in the kernel); requeued (after a node failure or a
    preemption: back in the queue, or running again since, as seen by its start time):
    this run's driver is gone, and the next run keeps the job id, which an ended RL job
    never takes again."""
    if info is None:
        return JobState.COMPLETED, f"Slurm job {SlurmJobState.COMPLETED}"
    requeued = _requeued(job, info)
    if requeued is not None:
        return JobState.CANCELLED, requeued
    ended = info.end_state
    if info.state is SlurmJobState.COMPLETING:
        reason = "its Slurm job is completing" + (f" ({ended})" if ended else "")
    elif info.state.terminal:
        reason = f"Slurm job {info.state}"
    else:
        return None
    # completing for a cause Slurm does not say: taken as cancelled
    ours = {SlurmJobState.COMPLETED: JobState.COMPLETED, SlurmJobState.CANCELLED:
            JobState.CANCELLED, None: JobState.CANCELLED}.get(ended, JobState.FAILED)
    return ours, reason


class Controller:
    """One controller process's state and operations."""

    def __init__(
        self,
        config: Config,
        store: Store,
        slurm: SlurmBackend,
        *,
        pools: PoolManager | None = None,
        clock: Callable[[], float] = time.time,
        check_invariants: bool = False,
    ) -> None:
        self.config = config
        self.store = store
        self.slurm = slurm
        self.pools: PoolManager = pools or AttachedPools()
        self.clock = clock
        self.metrics = Metrics()
        #: each active job's observations folded into its profile, read once each
        self.histories = JobHistories()
        slice_name = config.policies.slice
        registry.load("slice", slice_name, config.policies.params_for(slice_name))  # fail early
        #: the pairing and admission policies the simulator runs too (fail early as well)
        self.policies = load_policies(config)
        self.scheduler = LeaseScheduler(
            store,
            lambda: registry.load("slice", slice_name, config.policies.params_for(slice_name)),
            config.controller.lease_timeout_s,
            metrics=self.metrics, clock=clock, check_invariants=check_invariants,
            slowdown_limit=site_limits(config).limit_for,
        )
        self.scheduler.grant_hooks.append(self._on_grant)
        self.scheduler.revoke_hooks.append(self._on_revoke)
        self._placed: dict[int, asyncio.Event] = {}
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> None:
        restored = self.scheduler.restore()
        log.info("restored %d held leases and waiting requests from %s", restored,
                 self.store.path)
        await self.pools.start(self)
        await self._end_jobs_of_closed_pools()
        self.scheduler.extend_grace()  # a lease timeout from now, not from before start-up
        self._tasks.append(asyncio.create_task(self.scheduler.run_timer()))
        self._tasks.append(asyncio.create_task(self._reconcile_loop()))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self.pools.stop()

    # -- authorization -------------------------------------------------------------------------
    def is_admin(self, who: Identity) -> bool:
        return is_admin(who, self.config.controller.admins)

    def own_job(self, who: Identity, job_id: int) -> JobRecord:
        """The job, if `who` may act on it; 404 if unknown, 403 if someone else's."""
        job = self.store.job(job_id)
        if job is None:
            raise RpcError(404, "no-such-job", f"RL job {job_id} is not registered")
        if job.uid != who.uid and not self.is_admin(who):
            raise RpcError(403, "not-your-job",
                           f"RL job {job_id} belongs to another user; uid {who.uid} may act "
                           "only on its own jobs")
        return job

    def active_job(self, who: Identity, job_id: int) -> JobRecord:
        job = self.own_job(who, job_id)
        if job.state.terminal:
            # the reason (e.g. the pool's loss) is what the driver needs to hear
            raise RpcError(409, "job-ended", f"RL job {job_id} has ended ({job.state})"
                           + (f": {job.reason}" if job.reason else ""))
        return job

    def require_admin(self, who: Identity, what: str) -> None:
        if not self.is_admin(who):
            raise RpcError(403, "admin-only", f"{what} is for root and controller.admins")

    # -- jobs -----------------------------------------------------------------------------------
    def _registered(self, who: Identity, job_id: int) -> JobRecord | None:
        """The job if it is registered already (the idempotent answer), else None."""
        if self.store.job(job_id) is None:
            return None
        return self.active_job(who, job_id)

    async def _still_this_run(self, job: JobRecord) -> JobRecord:
        """A registered job's idempotent answer, unless its Slurm job was requeued since
        (a later run's driver must not take the earlier run's placement before the next
        reconcile ends it): then it ends now, and the register is refused naming why.
        Where Slurm cannot be asked, the job is taken as it is (reconcile decides)."""
        try:
            info = await asyncio.to_thread(self.slurm.job, job.job_id)
        except SlurmError:
            return job
        why = None if info is None else _requeued(job, info)
        if why is None:
            return job
        await self.end_job(job.job_id, JobState.CANCELLED, why)
        raise RpcError(409, "job-ended", f"RL job {job.job_id} has ended "
                       f"({JobState.CANCELLED}): {why}")

    async def register(self, who: Identity, job_id: int, env: Mapping[str, str]) -> JobRecord:
        """Register a running Slurm job as an RL job (idempotent for its owner)."""
        existing = self._registered(who, job_id)
        if existing is not None:
            return await self._still_this_run(existing)
        try:
            request = parse_env(env)
        except DirectiveError as exc:
            raise RpcError(400, "bad-directives", str(exc)) from None
        try:
            info = await asyncio.to_thread(self.slurm.job, job_id)
        except SlurmParseError as exc:  # e.g. a job name that forges "UserId=..."
            raise RpcError(409, "unreadable-slurm-job", f"Slurm's record of job {job_id} "
                           f"cannot be read safely: {exc}") from None
        except SlurmError as exc:
            raise RpcError(503, "slurm-unavailable", f"cannot ask Slurm about job "
                           f"{job_id}: {exc}") from None
        # several driver ranks may connect at once: another call may have registered it
        # while this one asked Slurm
        existing = self._registered(who, job_id)
        if existing is not None:
            return existing
        if info is None:
            raise RpcError(404, "no-such-slurm-job", f"Slurm does not know job {job_id}")
        if info.uid != who.uid:
            # its request (model, GPUs, ...) is the caller's, and its services run as
            # the job's owner: only the owner chooses what runs as the owner, admins too
            raise RpcError(403, "not-your-job",
                           f"Slurm job {job_id} belongs to uid {info.uid}, not to the "
                           "caller: only its owner registers it as an RL job")
        if info.uid == 0 and self.pools.runs_services:
            # refused now, not once a pool was opened for it: no service runs as root
            raise RpcError(403, "root-job", f"Slurm job {job_id} runs as root: slurmrl "
                           "runs no service as root; submit RL jobs as an ordinary user")
        if info.state is not SlurmJobState.RUNNING:
            raise RpcError(409, "job-not-running",
                           f"Slurm job {job_id} is {info.state}, not RUNNING")
        # the account name of the MUNGE-verified uid, not the name Slurm printed: the
        # services run as this user (`ServiceLauncher` checks the name against the uid)
        user = who.user if info.uid == who.uid and who.user else info.user
        job = JobRecord(
            job_id=job_id, user=user, uid=info.uid, request=request,
            state=JobState.PENDING, registered_at=self.clock(), name=info.name,
            partition=info.partition, reason="PoolPending", secret=mint_secret(),
            slurm_started_at=info.start_time,
        )
        verdict = self.policies.admission.admit(
            job_snapshot(job, self.config.slurm.pool_partition), self.policies.limits)
        # a Verdict's plain string is taken as it; any other value refuses the job
        verdict = admission_of(verdict, self.policies.admission.name, job_id)
        limit = self.config.limits.max_gpus_per_job
        if verdict.verdict is not Verdict.REJECT and request.gpus > limit:
            # a site admission policy that ignores the hard limit still cannot pass it,
            # whether it accepts the job or runs it dedicated
            verdict = replace(verdict, verdict=Verdict.REJECT, reason=(
                f"--rl-gpus={request.gpus} exceeds this site's limit of {limit}"))
        if verdict.verdict is Verdict.REJECT:
            # recorded, so that `slurmrl status` shows the reason too
            why = f"admission refused: {verdict.reason}"
            self.store.add_job(replace(job, state=JobState.FAILED, reason=why,
                                       ended_at=self.clock()))
            log.info("refused RL job %d of %s: %s", job_id, info.user, verdict.reason)
            raise RpcError(403, "admission-refused", why)
        if verdict.verdict is Verdict.DEDICATED and request.mux is not Mux.OFF:
            job = replace(job, request=replace(request, mux=Mux.OFF),
                          reason=f"PoolPending (dedicated: {verdict.reason})")
        elif verdict.verdict is Verdict.ACCEPT and verdict.reason:
            job = replace(job, reason=f"PoolPending ({verdict.reason})")  # e.g. a cap
        self.store.add_job(job)
        log.info("registered RL job %d of %s (%d GPUs, %s)", job_id, info.user,
                 request.gpus, request.layout)
        await self.pools.job_registered(job)
        return self.store.job(job_id) or job

    async def end_job(self, job_id: int, state: JobState, reason: str,
                      at: float | None = None) -> None:
        """The job ended (deregistered, or Slurm says so): revoke its leases. `at`: when
        it ended, if before now (its lost pool's end); never before it registered."""
        job = self.store.job(job_id)
        if job is None or job.state.terminal:
            return
        now = self.clock()
        ended_at = now if at is None else max(job.registered_at, min(now, at))
        with self.store.transaction():
            self.scheduler.remove_job(job_id, job.pool_id, "job-ended")
            self.store.update_job(job_id, state=state, reason=reason, ended_at=ended_at,
                                  phase=None)
        ev = self._placed.pop(job_id, None)
        if ev is not None:
            ev.set()
        await self.pools.job_ended(job, reason)

    async def deregister(self, who: Identity, job_id: int, state: str, reason: str) -> None:
        self.active_job(who, job_id)
        await self.end_job(job_id, _END_STATES[state], reason)

    # -- pools (called by the pool manager, or by admins through the RPC) -----------------
    async def attach_pool(self, who: Identity, slurm_job_id: int, dedicated: bool) -> PoolRecord:
        """Make a running Slurm allocation with GPUs a pool."""
        self.require_admin(who, "attaching a pool")
        for pool in self.store.pools(open_only=True):
            if pool.slurm_job_id == slurm_job_id:
                return pool
        try:
            info = await asyncio.to_thread(self.slurm.job, slurm_job_id)
        except SlurmError as exc:
            raise RpcError(503, "slurm-unavailable", str(exc)) from None
        if info is None or info.state is not SlurmJobState.RUNNING:
            state = "unknown to Slurm" if info is None else str(info.state)
            raise RpcError(409, "pool-not-running",
                           f"Slurm job {slurm_job_id} is {state}, not RUNNING")
        if not info.gpu_indices:
            raise RpcError(409, "pool-has-no-gpus", f"Slurm job {slurm_job_id} holds no GPUs")
        return self.open_pool(
            gpus=len(info.gpu_indices), slurm_job_id=slurm_job_id, partition=info.partition,
            nodes=info.nodes, gpu_indices=info.gpu_indices, dedicated=dedicated)

    def open_pool(self, *, gpus: int, slurm_job_id: int | None, partition: str = "",
                  nodes: tuple[str, ...] = (), gpu_indices: tuple[int, ...] = (),
                  dedicated: bool = False, floating: bool = False) -> PoolRecord:
        """Record an open pool and start scheduling its GPUs (pool manager API). A
        floating pool opens with one window: its allocation, of `gpus` GPUs."""
        if floating and slurm_job_id is None:
            raise ValueError("a floating pool's window is a Slurm allocation")
        with self.store.transaction():
            pool_id = self.store.add_pool(
                gpus=gpus, opened_at=self.clock(), slurm_job_id=slurm_job_id,
                partition=partition, nodes=nodes, gpu_indices=gpu_indices,
                dedicated=dedicated, floating=floating)
            if floating:
                assert slurm_job_id is not None
                self.store.add_window(pool_id=pool_id, window=0, slurm_job_id=slurm_job_id,
                                      gpu_indices=gpu_indices, opened_at=self.clock())
        self.scheduler.open_pool(pool_id, gpus, gpus if floating else None)
        pool = self.store.pool(pool_id)
        assert pool is not None
        log.info("pool %d open: Slurm job %s, %d GPUs%s", pool_id, slurm_job_id, gpus,
                 " (floating)" if floating else "")
        return pool

    def add_window(self, pool_id: int, slurm_job_id: int, gpu_indices: tuple[int, ...],
                   node: str | None = None, window: int | None = None,
                   opened_at: float | None = None) -> WindowRecord:
        """A floating pool took another window (an allocation of its window size on its
        node): record it as number `window` (default: the newest open one's plus one;
        the number its services were launched for), allocated since `opened_at`
        (default now; the pool's GPU-seconds count from it), and schedule its GPUs."""
        pool = self.store.pool(pool_id)
        wins = self.store.windows(pool_id)
        if pool is None or not pool.floating or pool.state != "open" or not wins:
            raise ValueError(f"pool {pool_id} is not an open floating pool")
        g = len(wins[0].gpu_indices)
        if len(gpu_indices) != g:
            raise ValueError(f"a window of pool {pool_id} has {g} GPUs, not "
                             f"{len(gpu_indices)}")
        w = wins[-1].window + 1 if window is None else window
        if w < 0 or w in {x.window for x in wins}:
            raise ValueError(f"pool {pool_id} has window {w} open already")
        with self.store.transaction():
            wid = self.store.add_window(
                pool_id=pool_id, window=w, slurm_job_id=slurm_job_id, gpu_indices=gpu_indices,
                opened_at=self.clock() if opened_at is None else opened_at, node=node)
            self.store.update_pool(pool_id, gpus=pool.gpus + g,
                                   gpu_indices=(*pool.gpu_indices, *gpu_indices))
        self.scheduler.add_gpus(pool_id, range(w * g, w * g + g))
        log.info("pool %d: window %d open (Slurm job %d, GPUs %s)", pool_id, w, slurm_job_id,
                 list(gpu_indices))
        return next(x for x in self.store.windows(pool_id) if x.window_id == wid)

    def retirable_window(self, pool_id: int) -> WindowRecord | None:
        """A window of the floating pool that `retire_window` would give back now: no
        lease holds it, no waiter could use only it, and it is not the pool's only one;
        the newest such (as the simulator's pools give back any free window); nothing
        changes."""
        pool = self.store.pool(pool_id)
        wins = self.store.windows(pool_id)
        if pool is None or not pool.floating or len(wins) < 2:
            return None
        g = len(wins[0].gpu_indices)
        return next((w for w in reversed(wins) if self.scheduler.can_retire(
            pool_id, range(w.window * g, w.window * g + g))), None)

    def retire_window(self, pool_id: int,
                      window: WindowRecord | None = None) -> WindowRecord | None:
        """Give back `window` (default `retirable_window`) of a floating pool if no lease
        holds it and no waiter could use only it; returns it (its allocation is the
        caller's to cancel), or None when it must stay for now. Never the pool's only
        window. Pool GPU w * G + i stays window w's GPU i: the others keep their
        numbers (the pool's `gpu_indices` lists its open windows' in window order). The
        pool's first allocation may go too: its oldest open window's then stands for it
        (`slurm_job_id`; its home node, `nodes`, stays what it was)."""
        pool = self.store.pool(pool_id)
        wins = self.store.windows(pool_id)
        window = window or self.retirable_window(pool_id)
        if (pool is None or not pool.floating or len(wins) < 2 or window is None
                or window.window_id not in {w.window_id for w in wins}):
            return None
        g = len(wins[0].gpu_indices)
        try:
            self.scheduler.retire(pool_id, range(window.window * g, window.window * g + g))
        except LeaseError:
            return None
        left = [w for w in wins if w.window_id != window.window_id]
        stands = (pool.slurm_job_id if pool.slurm_job_id != window.slurm_job_id
                  else left[0].slurm_job_id)
        with self.store.transaction():
            self.store.close_window(window.window_id, self.clock())
            self.store.update_pool(pool_id, gpus=pool.gpus - g, slurm_job_id=stands,
                                   gpu_indices=tuple(d for w in left for d in w.gpu_indices))
        log.info("pool %d: window %d given back (Slurm job %d)", pool_id, window.window,
                 window.slurm_job_id)
        return window

    async def close_pool(self, pool_id: int, reason: str, ended_at: float | None = None,
                         windows_ended: Mapping[int, float] | None = None) -> None:
        """Revoke the pool's leases, end its jobs (a job never migrates), close it.
        `ended_at`: when its allocation ended, if before now (Slurm's end time of a
        lost pool): no lease is charged past it. `windows_ended`: window number -> when
        that window's allocation ended, if before `ended_at` (a floating pool's lost
        window, the others running on): it closes then, and a lease on its GPUs ends
        then."""
        at = self.clock() if ended_at is None else min(self.clock(), ended_at)
        lost = windows_ended or {}
        with self.store.transaction():
            wins = self.store.windows(pool_id)
            ends = {w.window: min(at, lost[w.window]) for w in wins if w.window in lost}
            self.scheduler.close_pool(pool_id, reason, at, lost={
                g: ends[w.window] for w in wins if w.window in ends
                for g in range(w.window * len(w.gpu_indices),
                               (w.window + 1) * len(w.gpu_indices))})
            pool = self.store.pool(pool_id)
            self.store.update_pool(pool_id, state="closed", reason=reason, closed_at=max(
                at, pool.opened_at if pool is not None else at))
            for w in wins:
                self.store.close_window(w.window_id, max(ends.get(w.window, at), w.opened_at))
            for g in self.store.groups(pool_id=pool_id):
                if g.dissolved_at is None:
                    self.store.dissolve_group(g.group_id, max(at, g.created_at))
        for job in self.store.jobs(active=True, pool_id=pool_id):
            await self.end_job(job.job_id, JobState.CANCELLED, reason, at)

    def place_job(self, job_id: int, pool_id: int, pool_gpus: tuple[int, ...],
                  group_id: int | None = None) -> None:
        """Put a job into a pool: job-local GPU i runs on pool GPU `pool_gpus[i]`."""
        job = self.store.job(job_id)
        pool = self.store.pool(pool_id)
        if job is None or job.state.terminal or pool is None or pool.state != "open":
            # an ended job stays ended (it may end while the pool manager places it)
            raise ValueError(f"cannot place job {job_id} in pool {pool_id}")
        if len(pool_gpus) != job.request.gpus or not all(0 <= g < pool.gpus for g in pool_gpus):
            raise ValueError(f"pool GPUs {pool_gpus} do not fit job {job_id} in pool {pool_id}")
        with self.store.transaction():
            if group_id is None:
                groups = [g for g in self.store.groups(pool_id=pool_id) if not g.dissolved_at]
                group_id = (groups[0].group_id if groups
                            else self.store.add_group(pool_id, self.clock()))
            self.store.update_job(job_id, pool_id=pool_id, pool_gpus=pool_gpus,
                                  group_id=group_id, state=JobState.RUNNING, reason="")
        # a floating member takes whichever window is free: it has no window of its own
        self.scheduler.add_member(pool_id, job_id, job.request.max_slowdown,
                                  None if pool.floating else pool_gpus)
        self._placed.setdefault(job_id, asyncio.Event()).set()
        log.info("job %d placed in pool %d on GPUs %s", job_id, pool_id, list(pool_gpus))

    async def wait_placed(self, job_id: int, timeout_s: float) -> JobRecord | None:
        job = self.store.job(job_id)
        if job is None or job.pool_id is not None or job.state.terminal or timeout_s <= 0:
            return job
        ev = self._placed.setdefault(job_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ev.wait(), timeout_s)
        return self.store.job(job_id)

    # -- internals ------------------------------------------------------------------------------
    def _on_grant(self, pool_id: int, lease: Lease) -> None:
        self.store.update_job(lease.job_id, phase=str(lease.phase))

    def _on_revoke(self, pool_id: int, lease: Lease) -> None:
        """A job whose lease was revoked (it lapsed, ...) and that holds none now is idle,
        as after a release; an ended job's phase is end_job's (none)."""
        job = self.store.job(lease.job_id)
        if job is None or job.state.terminal:
            return
        table = self.scheduler.tables.get(pool_id)
        if table is None or not any(x.job_id == job.job_id for x in table.leases):
            self.store.update_job(job.job_id, phase="idle")

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.controller.reconcile_interval_s)
            try:
                await self.reconcile()
            except Exception:  # Slurm down: try again next round
                log.exception("reconcile failed")

    async def _end_jobs_of_closed_pools(self) -> None:
        """End the active jobs placed in a closed pool, with the pool's close reason,
        when it closed.

        `close_pool` closes the pool in one transaction, then ends its members one at a
        time: a crash (or an error) in between leaves members running in a closed pool.
        """
        for job in self.store.jobs(active=True):
            pool = None if job.pool_id is None else self.store.pool(job.pool_id)
            if pool is not None and pool.state == "closed":
                await self.end_job(job.job_id, JobState.CANCELLED, pool.reason or "pool closed",
                                   pool.closed_at)

    async def reconcile(self) -> None:
        """End RL jobs whose Slurm job or pool ended; let the pool manager check pools."""
        await self._end_jobs_of_closed_pools()
        active = self.store.jobs(active=True)
        if active:
            infos = await asyncio.to_thread(self.slurm.jobs, [j.job_id for j in active])
            by_id = {i.job_id: i for i in infos}
            for job in active:
                ended = _ending(job, by_id.get(job.job_id))
                if ended is not None:
                    await self.end_job(job.job_id, *ended)
        await self.pools.reconcile()

    def gpu_seconds_now(self, job_ids: list[int]) -> dict[int, float]:
        """GPU-seconds per job: ended leases from the ledger plus what is held now.

        A held lease counts its per-GPU holds so far, as the ledger will charge them
        (a lease that shrank or grew held different GPUs for different times)."""
        out = self.store.gpu_seconds(job_ids)
        wanted = set(job_ids)
        held = {lease.lease_id: lease.job_id for table in self.scheduler.tables.values()
                for lease in table.leases if lease.job_id in wanted}
        for lease_id, gpu_s in self.store.held_gpu_seconds(list(held), self.clock()).items():
            job_id = held[lease_id]
            out[job_id] = out.get(job_id, 0.0) + gpu_s
        return out

    def describe(self) -> dict[str, Any]:
        return {"pools": len(self.scheduler.tables), "db": self.store.path,
                "slice_policy": self.config.policies.slice}
