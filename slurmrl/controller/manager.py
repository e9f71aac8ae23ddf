"""Where the pool manager plugs into the controller: the `PoolManager` protocol.

The controller owns jobs, leases and the RPC; a pool manager owns pools, groups,
services and residency. The controller calls it at these points:

- `start(controller)` once the DB is restored, `stop()` at shutdown;
- `job_registered(job)` after a job registered (pairing: place it now or later with
  `controller.place_job`); `pool_opened(pool)` after an admin attached a pool;
- `before_answer(job, lease)` after a grant is committed and before the driver hears of
  it (residency: park the partner, activate this job's services);
- `job_ended(job, reason)` after a job ended (stop its services, free its slot);
- `reconcile()` every `reconcile_interval_s` (compare pools with Slurm's view).

`AttachedPools`, the default until pools are opened automatically, hosts jobs only in
pools an admin attached (`POST /v1/pools` with a running Slurm allocation's id) and places
each new job first-fit into an attached pool with room. It starts no services.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from slurmrl.db import JobRecord, PoolRecord
from slurmrl.leases.types import Lease
from slurmrl.model import Mux

if TYPE_CHECKING:
    from slurmrl.controller.core import Controller

log = logging.getLogger(__name__)


@runtime_checkable
class PoolManager(Protocol):
    #: it launches each job's services, as the job's user (so root's jobs are refused)
    runs_services: bool

    async def start(self, controller: Controller) -> None: ...

    async def stop(self) -> None: ...

    async def job_registered(self, job: JobRecord) -> None: ...

    async def pool_opened(self, pool: PoolRecord) -> None: ...

    async def before_answer(self, job: JobRecord, lease: Lease) -> None: ...

    async def job_ended(self, job: JobRecord, reason: str) -> None: ...

    async def reconcile(self) -> None: ...


class AttachedPools:
    """First-fit placement into admin-attached pools; closes pools Slurm ended."""

    runs_services = False

    def __init__(self) -> None:
        self._controller: Controller | None = None

    @property
    def controller(self) -> Controller:
        assert self._controller is not None, "start() first"
        return self._controller

    async def start(self, controller: Controller) -> None:
        self._controller = controller
        await self.place_pending()

    async def stop(self) -> None:
        self._controller = None

    async def job_registered(self, job: JobRecord) -> None:
        await self.place_pending()

    async def pool_opened(self, pool: PoolRecord) -> None:
        await self.place_pending()

    async def before_answer(self, job: JobRecord, lease: Lease) -> None:
        return None

    async def job_ended(self, job: JobRecord, reason: str) -> None:
        await self.place_pending()

    async def reconcile(self) -> None:
        c = self.controller
        pools = [p for p in c.store.pools(open_only=True) if p.slurm_job_id is not None]
        if not pools:
            return
        ids = [p.slurm_job_id for p in pools if p.slurm_job_id is not None]
        infos = await asyncio.to_thread(c.slurm.jobs, ids)
        alive = {i.job_id for i in infos if not i.state.terminal}
        for pool in pools:
            if pool.slurm_job_id not in alive:
                log.warning("pool %d: Slurm job %s ended; closing", pool.pool_id,
                            pool.slurm_job_id)
                await c.close_pool(pool.pool_id, "pool-lost")
        await self.place_pending()

    async def place_pending(self) -> None:
        """Place every pending job, oldest first, into the first attached pool with room."""
        c = self.controller
        limit = c.config.limits.max_jobs_per_pool
        for job in c.store.jobs(active=True):
            if job.pool_id is not None:
                continue
            for pool in c.store.pools(open_only=True):
                members = c.store.jobs(active=True, pool_id=pool.pool_id)
                alone = job.request.mux is Mux.OFF or any(
                    m.request.mux is Mux.OFF for m in members)
                if pool.state != "open" or pool.gpus < job.request.gpus:
                    continue
                if len(members) >= (1 if alone or pool.dedicated else limit):
                    continue
                c.place_job(job.job_id, pool.pool_id, tuple(range(job.request.gpus)))
                break
