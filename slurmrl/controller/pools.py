"""Pools on Slurm: open a pinned GPU allocation, watch it, close it.

A pool is a batch job (`sleep infinity`) in the site's pool partition that holds G GPUs
on one node for as long as its group has members; the services of its RL jobs run as
steps inside it (see `services.py`). `PoolAllocator` is the Slurm half, blocking (call
it from a thread): `open()` submits and waits until Slurm runs the job and names its GPU
indices; `losses()` says which pools Slurm ended behind our back (scancel, preemption,
time limit, node failure) and why, and `ended_at()` when, from Slurm's accounting, for
one slurmctld forgot already; `close()` scancels.

Who owns a pool: the controller's own account (root on a real site). Slurm 22.05 lets
only a job's owner (not even root) create steps in it, steps run as the owner, and srun
has no `--uid`, so running each service as its RL job's user needs root inside the
step to drop privileges (`setpriv`). A pool owned by the `slurmrl` service account would
run every service as `slurmrl`; checked on the dev cluster (root's
`srun --jobid=<slurmrl's job>` is refused with "Access/permission denied"). Keep users
out of the pool partition with `AllowGroups=root` (site-configs/slurm.conf.fragment).

Known limits: single-node pools (one node's GPUs). A pool is opened only where a node
of the partition has its GPUs free (`SlurmPools._no_room`); one that Slurm still keeps
pending (another job took them first) is cancelled after `start_timeout_s`
(`PoolPending`), and its job waits to be placed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import re
import secrets
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NoReturn

from policies.base import Action, ClusterSnapshot, JobSnapshot, NodeFree, Placement
from policies.complementarity import compatible
from policies.free import FreeGpus
from slurmrl.controller.placement import (
    closed_because,
    controller_snapshot,
    node_free_gpus,
    placement_of,
)
from slurmrl.controller.residency import (
    Footprint,
    GpuCapacity,
    ResidencyError,
    ServiceKey,
    admit,
    footprints_for_job,
    phase_roles,
    plan_floating_grant,
    plan_grant,
)
from slurmrl.controller.services import (
    CONTROL_ANSWER_BYTES,
    RunningService,
    ServiceLauncher,
    ServiceSpec,
)
from slurmrl.controller.views import physical_gpus
from slurmrl.db import JobRecord, PoolRecord, ServiceRecord, WindowRecord
from slurmrl.db.readings import add_lease_reading
from slurmrl.leases import LeaseError
from slurmrl.leases.types import Lease
from slurmrl.model import JobState, Mux, Phase, Residency
from slurmrl.slurm import BatchSpec, JobInfo, NodeInfo, SlurmBackend, SlurmError, SlurmJobState
from slurmrl.slurm.devices import detect, step_devices
from slurmrl.worker.handle import CONTROL_TIMEOUT_S, ServiceError, ServiceHandle

if TYPE_CHECKING:
    from slurmrl.config import Config
    from slurmrl.controller.core import Controller

log = logging.getLogger(__name__)

POOL_NAME = "slurmrl-pool"
POOL_COMMENT = "slurmrl pool"
#: how often `reconcile` looks for allocations of this controller that no pool holds
SWEEP_INTERVAL_S = 60.0
#: the host budget for parked state where the site sets none and Slurm reports no memory
UNKNOWN_HOST_BUDGET = 64 << 30
#: how long a restart waits for a re-attached service to say its residency
REATTACH_STATUS_TIMEOUT_S = 10.0
#: how far Slurm's clock may trail the controller's when an allocation's end (in
#: Slurm's accounting) is matched against when the controller recorded it open
ACCOUNTING_SKEW_S = 60.0


class PoolError(RuntimeError):
    """A pool could not be opened (refused, failed or never started)."""


class PoolPending(PoolError):
    """Slurm kept a pool pending (or did not answer) until the start timeout: it was
    cancelled, and the job it was for waits to be placed again rather than refused
    (another user's job may have taken the GPUs between the check and the submit)."""


@dataclass(frozen=True)
class SlurmPool:
    """An open pool as Slurm runs it."""

    slurm_job_id: int
    partition: str
    node: str  #: where its services run
    nodes: tuple[str, ...]
    gpu_indices: tuple[int, ...]  #: Slurm's GPU indices on `node` (for NVML)

    @property
    def gpus(self) -> int:
        return len(self.gpu_indices)


@dataclass(frozen=True)
class PoolLoss:
    """Slurm ended a pool: which, in what state, and Slurm's reason."""

    slurm_job_id: int
    #: Slurm's state name (for an allocation still completing, the terminal state it
    #: ended in where Slurm says; else "COMPLETING"), or "GONE" when Slurm forgot the job
    state: str
    reason: str = ""
    #: when Slurm ended it (its end time, for an allocation that ended); None: unknown
    ended_at: float | None = None

    @property
    def message(self) -> str:
        why = {
            "CANCELLED": "cancelled (scancel or an administrator)",
            "TIMEOUT": "reached its time limit",
            "PREEMPTED": "was preempted",
            "NODE_FAIL": "lost its node (node failure)",
            "GONE": "is no longer known to Slurm",
            "COMPLETING": "is ending (COMPLETING; Slurm does not say why)",
        }.get(self.state)
        if why is None:
            queued = self.state in SlurmJobState.__members__ and SlurmJobState(
                self.state).queued
            why = (f"went back to the queue ({self.state})" if queued
                   else f"ended ({self.state})")
        extra = f"; Slurm reason: {self.reason}" if self.reason else ""
        return f"pool allocation (Slurm job {self.slurm_job_id}) {why}{extra}"


class PoolAllocator:
    """Submits, watches and cancels pool allocations through a SlurmBackend."""

    def __init__(
        self, slurm: SlurmBackend, partition: str, *, time_limit_min: int | None = None,
        cpus_per_gpu: int = 0, mem_per_gpu_mb: int = 256, start_timeout_s: float = 60.0,
        poll_s: float = 0.1, tag: str = "",
    ) -> None:
        """`tag`: the controller's (`Store.controller_tag`), written into each pool's
        comment so that `tagged` finds its own allocations; "" finds none.
        `cpus_per_gpu` (0: one CPU in all) and `mem_per_gpu_mb` (0: the node's whole
        memory, sbatch --mem=0): what each pool asks, per GPU it holds."""
        if not partition:
            raise ValueError("a pool partition is needed ([slurm] pool_partition)")
        if tag and not tag.isalnum():
            raise ValueError(f"a controller tag is letters and digits, got {tag!r}")
        self.slurm = slurm
        self.partition = partition
        self.time_limit_min = time_limit_min
        self.cpus_per_gpu = cpus_per_gpu
        self.mem_per_gpu_mb = mem_per_gpu_mb
        self.start_timeout_s = start_timeout_s
        self.poll_s = poll_s
        self.tag = tag
        #: allocations submitted whose owner has not recorded them yet (`recorded`):
        #: never listed by `tagged`. The lock makes a submit and its entry here one step for it
        self._unrecorded: set[int] = set()
        self._submitting = threading.Lock()

    def spec(self, gpus: int, label: str = "", node: str | None = None,
             gpu_type: str | None = None, exclude: str | None = None) -> BatchSpec:
        """The batch job a pool of `gpus` GPUs (of `gpu_type`, where given: Slurm's GRES
        type; on `node`, or on any node but `exclude`, where given) is (`open` submits
        it; doctor tests it)."""
        if gpus < 1:
            raise ValueError(f"a pool needs at least one GPU, got {gpus}")
        return BatchSpec(
            command=("sleep", "infinity"), partition=self.partition,
            name=POOL_NAME, gpus=gpus, gpu_type=gpu_type, cpus=max(1, self.cpus_per_gpu * gpus),
            mem_mb=self.mem_per_gpu_mb * gpus,
            time_limit_min=self.time_limit_min,
            comment=" ".join(x for x in (POOL_COMMENT, self.tag, label) if x),
            output="/dev/null",
            # never requeued: a pool that went back to the queue lost its services, and
            # its job id would come back on other GPUs
            extra_args=("--no-requeue",
                        *(() if node is None else (f"--nodelist={node}",)),
                        *(() if exclude is None else (f"--exclude={exclude}",))))

    def open(self, gpus: int, label: str = "", node: str | None = None,
             gpu_type: str | None = None, exclude: str | None = None) -> SlurmPool:
        """Submit a pool of `gpus` GPUs (on `node`, where named: a floating pool's next
        window; of `gpu_type`, where given; not on `exclude`, where named: a node held
        for an older job) and return it once Slurm runs it."""
        spec = self.spec(gpus, label, node, gpu_type, exclude)
        with self._submitting:
            try:
                job_id = self.slurm.submit(spec)
            except SlurmError as exc:
                raise PoolError(f"Slurm refused a pool of {gpus} GPUs in partition "
                                f"{self.partition!r}: {exc}") from exc
            self._unrecorded.add(job_id)
        try:
            info = self._await_running(job_id)
            if len(info.gpu_indices) != gpus or not info.nodes:
                raise PoolError(f"pool job {job_id} runs with GPUs "
                                f"{list(info.gpu_indices)} on {list(info.nodes)}, not the "
                                f"{gpus} GPUs asked for")
        except BaseException:
            with contextlib.suppress(SlurmError):
                self.slurm.cancel(job_id)
            self.recorded(job_id)
            raise
        node = info.batch_host or info.nodes[0]
        log.info("pool job %d running on %s with GPUs %s", job_id, node,
                 list(info.gpu_indices))
        return SlurmPool(job_id, info.partition or self.partition, node, info.nodes,
                         info.gpu_indices)

    def _await_running(self, job_id: int) -> JobInfo:
        """The allocation once Slurm runs it; PoolError if it ends first or is not
        running by the start timeout. A query that fails (slurmctld busy) is asked
        again until then."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            try:
                info = self.slurm.job(job_id)
            except SlurmError as exc:
                last = f"Slurm not answering: {exc}"
            else:
                if (info is not None and info.state is SlurmJobState.RUNNING
                        and info.gpu_indices):
                    return info
                if info is None or info.state.terminal:
                    state = "GONE" if info is None else str(info.state)
                    reason = "" if info is None else info.reason
                    raise PoolError(f"pool job {job_id} ended before it ran: {state} "
                                    f"{reason}")
                last = f"{info.state}, reason {info.reason or 'none'}"
            if time.monotonic() >= deadline:
                raise PoolPending(f"pool job {job_id} not running after "
                                  f"{self.start_timeout_s:g} s ({last}); cancelled it")
            time.sleep(self.poll_s)

    def recorded(self, slurm_job_id: int) -> None:
        """The allocation `open` returned is recorded (or cancelled) by its owner:
        from now on `tagged` lists it (the owner tells its own from strays)."""
        self._unrecorded.discard(slurm_job_id)

    def tagged(self) -> list[int]:
        """This controller's allocations (its tag in their comment, its uid) that Slurm
        still runs or queues, but those being opened or not yet recorded by their owner.
        Empty without a tag: another controller's are never among them."""
        if not self.tag:
            return []
        me = os.geteuid()
        with self._submitting:
            infos = self.slurm.jobs(user=str(me))
            busy = set(self._unrecorded)
        head = f"{POOL_COMMENT} {self.tag}"
        return sorted(
            i.job_id for i in infos
            if i.name == POOL_NAME and i.uid == me
            and (i.comment == head or i.comment.startswith(head + " "))
            and not i.state.terminal and i.state is not SlurmJobState.COMPLETING
            and i.job_id not in busy)

    def close(self, slurm_job_id: int) -> None:
        """scancel the pool (its service steps end with it)."""
        self.slurm.cancel(slurm_job_id)

    def losses(self, slurm_job_ids: Sequence[int]) -> list[PoolLoss]:
        """The pools among `slurm_job_ids` that Slurm no longer runs: ended, ending, or
        back in the queue (requeued by an admin or after a node failure, in spite of
        `--no-requeue`: its services are gone; a pool is recorded only once it runs).
        One still completing is named by the state it ended in where Slurm says (23.02+
        lists it beside the flag; 22.05's bare COMPLETING only through a reason that
        names it, `JobInfo.end_state`), else "COMPLETING": not waited for, as its steps,
        the services, are being killed now."""
        if not slurm_job_ids:
            return []
        infos = {i.job_id: i for i in self.slurm.jobs(list(slurm_job_ids))}
        out = []
        for jid in slurm_job_ids:
            info = infos.get(jid)
            if info is None:
                out.append(PoolLoss(jid, "GONE"))
            elif info.state.queued:
                out.append(PoolLoss(jid, str(info.state), info.reason))
            elif info.state.terminal or info.state is SlurmJobState.COMPLETING:
                # still completing: named by the state it ended in, where Slurm says
                ended = info.end_state or info.state
                out.append(PoolLoss(jid, str(ended), info.reason, info.end_time))
        return out

    def ended_at(self, opened: Mapping[int, float]) -> dict[int, float]:
        """When Slurm ended each allocation of `opened` (Slurm job id -> when it was
        recorded open), as its accounting says (`SlurmBackend.ended_at`): the first end
        since it opened (an earlier one is another job's, of a reset cluster that
        reused the id). Those it cannot say are left out, all of them where accounting
        cannot be asked (none kept, slurmdbd down): a loss then dates from when it
        was seen."""
        if not opened:
            return {}
        try:
            ends = self.slurm.ended_at(sorted(opened))
        except SlurmError as exc:
            log.info("Slurm's accounting does not say when allocation(s) %s ended (%s): "
                     "taken as ended when seen", ", ".join(map(str, sorted(opened))), exc)
            return {}
        out: dict[int, float] = {}
        for jid, since in opened.items():
            after = [t for t in ends.get(jid, ()) if t >= since - ACCOUNTING_SKEW_S]
            if after:
                out[jid] = min(after)
        return out


# --------------------------------------------------------------------------------------
# The controller's pool manager (the `PoolManager` plug-in of controller/manager.py)



#: the slowest a park, an activation or a hand-off is taken to move a service's state
#: (host copies over PCIe, files in node memory, a fetch over the network): 1 GiB/s
MOVE_BYTES_PER_S = 1 << 30


def moving_timeout(control_s: float, state_bytes: int) -> float:
    """How long a control call that moves `state_bytes` may take: the control plane's
    own limit, plus the state at `MOVE_BYTES_PER_S` (a 7B trainer's ~100 GB of parked
    state: ~93 s more), so a large state's park is not cut off and left uncertain."""
    return control_s + state_bytes / MOVE_BYTES_PER_S


def _replica_of(handoff_dir: str) -> int | None:
    """The rollout replica a hand-off directory is for (`-r<i>` at its end), else None."""
    m = re.search(r"-r(\d+)$", handoff_dir)
    return int(m.group(1)) if m else None


def services_dir(cfg: Config, flag: str | None = None) -> str:
    """Where services' work dirs and logs go: `--services-dir`, else `[services]
    run_dir`, else services/ next to the DB."""
    return flag or cfg.services.run_dir or os.path.join(
        os.path.dirname(cfg.controller.db_path), "services")


@dataclass
class _Live:
    """A live service as the manager tracks it (the step handle is lost on restart)."""

    record_id: int
    job_id: int
    role: str
    pool_id: int
    handle: ServiceHandle
    footprint: Footprint
    running: RunningService | None = None


@dataclass(frozen=True)
class HandoffTiming:
    """What the last `before_answer` cost, for benchmarks and logs (seconds)."""

    job_id: int
    lease_id: int
    plan_s: float
    park_s: float
    activate_s: float
    parked: tuple[tuple[int, str], ...]
    activated: tuple[tuple[int, str], ...]


def _held_node(snap: ClusterSnapshot, placements: Sequence[Placement],
               ) -> tuple[int, str] | None:
    """The node a round holds for its oldest job waiting for room, and that job:
    the round's pools replayed oldest first through `FreeGpus` (each new pool's GPUs
    taken as the policy took them), the first waiting job that does not fit then
    waits there (`FreeGpus.wait`). The pools opened for younger jobs in the round
    go elsewhere (`--exclude`), so that Slurm, which picks each pool's node, does
    not fill the node the policy kept for it. None where nothing is held."""
    by_job = {pl.job_id: pl for pl in reversed(placements)}  # a job's first counts
    free = FreeGpus(snap)
    opened: set[int] = set()
    for job in snap.waiting:
        pl = by_job.get(job.job_id)
        action = str(getattr(pl, "action", ""))
        g = job.request.gpus
        if action in (Action.OPEN, Action.DEDICATED) and pl is not None:
            if pl.pool_id is None or pl.pool_id not in opened:
                free.take(job, pl.gpus or g)
                if pl.pool_id is not None:
                    opened.add(pl.pool_id)
        elif action == Action.WAIT and not free.fits(job, g):
            free.wait(job, g)
            return free.held(job.partition)
    return None


class SlurmPools:
    """Opens pools on Slurm, launches services in them, parks/activates at handoffs.

    Placement is the site's pairing policy (`controller.policies.pairing`, the object
    the simulator runs): it sees a `ClusterSnapshot` (placement.py) and says, per waiting
    job, join a pool, open one (OPENs with the same provisional id share it), run
    dedicated, or wait. A join is enacted only if the job may share with every member
    (`complementarity.compatible`: `--rl-group`, GPU count, split) and residency admits
    it (else the job opens its own pool: it never waits for a partner); a job shares the
    pool's GPUs 0..n-1 with the other members, time-sliced by leases. `park_others=True`
    parks every other job's service on a granted lease's GPUs (an RL phase wants nearly
    all of HBM); `False` parks only what the residency plan needs.
    """

    runs_services = True

    def __init__(
        self, *, run_dir: str | None = None, bind_host: str = "0.0.0.0",
        gpu_memory_bytes: int = 80 << 30, park_others: bool = True,
        allocator: PoolAllocator | None = None, launcher: ServiceLauncher | None = None,
        sweep_interval_s: float = SWEEP_INTERVAL_S,
    ) -> None:
        self._run_dir = run_dir
        self._sweep_interval_s = sweep_interval_s
        self._bind_host = bind_host
        self._gpu_bytes = gpu_memory_bytes
        self.park_others = park_others
        self.allocator = allocator
        self.launcher = launcher
        self._c: Controller | None = None
        self._live: dict[tuple[int, str], _Live] = {}
        self._lock = asyncio.Lock()
        self._handoff_locks: dict[int, asyncio.Lock] = {}  #: pool id -> its handoffs' lock
        #: pool id -> the jobs being placed there (services launching): not closed under them
        self._placing: dict[int, set[int]] = {}
        self._closing: set[int] = set()  #: pools being closed: no job joins them
        #: job id -> its states being moved off a window's node (`_move_off`), which its
        #: end's discard waits for: a fetch landing after it would leave the state there
        self._moving: Counter[int] = Counter()
        self._moved = asyncio.Condition()  #: notified as each move ends
        #: pool id -> windows closed in the database whose copies are still stopping
        self._retiring: dict[int, set[int]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._next_sweep = 0.0  #: monotonic time of the next `_sweep_allocations`
        self._device_numbering: str | None = None  #: `_numbering`, once resolved
        #: node -> its memory in bytes, and its partitions, as Slurm last reported them
        self._node_bytes: dict[str, int] = {}
        self._node_parts: dict[str, tuple[str, ...]] = {}
        self.handoffs: list[HandoffTiming] = []  #: the most recent handoffs, newest last

    @property
    def c(self) -> Controller:
        assert self._c is not None, "start() first"
        return self._c

    async def start(self, controller: Controller) -> None:
        self._c = controller
        cfg = controller.config
        if self.allocator is None:
            self.allocator = PoolAllocator(
                controller.slurm, cfg.slurm.pool_partition,
                cpus_per_gpu=cfg.slurm.pool_cpus_per_gpu,
                mem_per_gpu_mb=cfg.slurm.pool_mem_per_gpu >> 20,
                start_timeout_s=cfg.slurm.step_launch_timeout_s,
                tag=controller.store.controller_tag())
        if self.launcher is None:
            run_dir = services_dir(cfg, self._run_dir)
            self.launcher = ServiceLauncher(
                controller.slurm, run_dir, python=cfg.services.python,
                bind_host=self._bind_host, ready_timeout_s=cfg.services.launch_timeout_s,
                step_timeout_s=cfg.slurm.step_launch_timeout_s,
                step_retries=cfg.slurm.step_launch_retries)
        self._numbering()  # resolved (and said in the log) at start, not at a first launch
        await self._refresh_node_memory()
        # pools Slurm ended while the controller was down: before anything is placed in
        # them, and before their services are talked to (theirs are stopped as strays).
        # A slurmctld not answering yet does not stop the start: the reconciler retries
        try:
            await self._close_lost_pools()
        except SlurmError as exc:
            log.warning("pools not checked against Slurm at start: %s", exc)
        await self._reattach()
        await self._sweep_allocations()
        # nothing is being placed at start: an open pool with no active member is empty
        # (one opened for a job that was mid-placement at the crash)
        for pool in controller.store.pools(open_only=True):
            await self._close_if_empty(pool.pool_id)
        self._spawn(self._place_pending())

    async def _reattach(self) -> None:
        """After a restart: talk to the services still listed live (their steps run on).

        Those of a job that has ended, or that was being placed when the controller died
        (not placed in the service's pool), are stopped: such a job waits again and is
        placed anew. One still starting (no address yet) is recorded failed: its launch
        died with the old process. One whose address is not of this release's form
        (`host:port/launch`: an older release launched it) cannot be talked to: recorded
        failed, and its job ends FAILED (its other services stopped), as a job whose
        services were lost. Each re-attached service is asked its residency
        (`_ask_residency`): the DB holds what its last park or activation answered, not
        one that timed out."""
        attached: list[_Live] = []
        unusable: dict[int, str] = {}  #: job id -> why it cannot go on
        for svc in self.c.store.services(live_only=True):
            job = self.c.store.job(svc.job_id)
            if job is None or job.state.terminal or job.pool_id != svc.pool_id:
                await self._stop_stray(svc, job.secret if job is not None else "")
                continue
            if not svc.address:
                log.warning("service %d (%s of job %d) was still starting when the "
                            "controller stopped: recorded failed", svc.service_id, svc.role,
                            svc.job_id)
                self.c.store.update_service(svc.service_id, state="failed",
                                            ended_at=self.c.clock())
                continue
            if svc.pool_id is None:
                continue
            # the service with this role on these GPUs (a replica is known by its GPUs)
            pool = self.c.store.pool(svc.pool_id)
            fps = {(f.role, f.gpus): f for f in (
                self._window_footprints(job, pool) if pool is not None and pool.floating
                else self._footprints(job, job.pool_gpus or ()))}
            fp = fps.get((svc.role, frozenset(svc.gpus)))
            if fp is None and pool is not None and pool.floating:
                # a copy on a window given back while the controller stopped (closed in
                # the database, its copies not yet stopped): nothing uses it any more
                await self._stop_stray(svc, job.secret)
                continue
            if fp is None:
                log.error("service %d of job %d (%s on pool GPUs %s) matches none of the "
                          "job's services now; not re-attached", svc.service_id, job.job_id,
                          svc.role, list(svc.gpus))
                continue
            fp = replace(fp, residency=Residency(svc.residency))
            try:
                handle = ServiceHandle(svc.address, svc.control_secret or job.secret,
                                       str(job.job_id), svc.role,
                                       max_answer_bytes=CONTROL_ANSWER_BYTES)
            except ValueError as exc:
                why = (f"its {svc.role} service (service {svc.service_id}) cannot be "
                       f"re-attached after the controller's restart: {exc} (an older "
                       "slurmrl release launched it); submit the job again")
                log.error("job %d: %s", job.job_id, why)
                self.c.store.update_service(svc.service_id, state="failed",
                                            residency="stopped", ended_at=self.c.clock())
                unusable.setdefault(job.job_id, why)
                continue
            live = _Live(svc.service_id, job.job_id, fp.name, svc.pool_id, handle, fp)
            self._live[fp.key] = live
            attached.append(live)
        await asyncio.gather(*(self._ask_residency(live) for live in attached
                               if live.job_id not in unusable))
        for job_id, why in sorted(unusable.items()):
            await self.c.end_job(job_id, JobState.FAILED, why)

    async def _ask_residency(self, live: _Live) -> None:
        """Take a re-attached service's residency from its status (recorded in the DB where
        that differs). One that cannot say is uncertain, as after a park that timed out:
        taken as active, its host bytes counted, and activated again where a grant of its
        own job needs it."""
        try:
            ans = await asyncio.to_thread(live.handle.status, REATTACH_STATUS_TIMEOUT_S)
            now = Residency(str(ans["residency"]))
        except (ServiceError, OSError, LookupError, TypeError, ValueError) as exc:
            log.warning("service %s of job %d did not say its residency after the restart "
                        "(%s): taken as active, and activated again where needed", live.role,
                        live.job_id, exc)
            live.footprint = replace(live.footprint, residency=Residency.ACTIVE,
                                     uncertain=True)
            return
        if now is not live.footprint.residency:
            self.c.store.update_service(live.record_id, residency=str(now))
        live.footprint = replace(live.footprint, residency=now, uncertain=False)

    async def _sweep_allocations(self) -> None:
        """Cancel each allocation of this controller that no open pool holds:
        - a window an open floating pool gave back (closed in the database) that Slurm
          still runs: the controller stopped between closing and cancelling it
          (`_retire_one`);
        - one carrying this controller's tag (`PoolAllocator.tagged`) that the database
          does not hold: a crash between a submit and its record, the other windows of a
          floating pool closed because Slurm lost one, a pool an admin closed.
        Then kills the service steps no live record owns (`_kill_stray_steps`) and
        removes the logs and work dirs of allocations no open pool holds, after
        `services.log_retention_days` (`ServiceLauncher.prune`).
        At start, and from `reconcile` (every `sweep_interval_s`, and at once after a
        pool was lost)."""
        assert self.allocator is not None
        self._next_sweep = time.monotonic() + self._sweep_interval_s
        try:
            # listed first: an allocation recorded meanwhile is in `_held()` below
            tagged = await asyncio.to_thread(self.allocator.tagged)
            held, closed = self._held()
            closed = {j: p for j, p in closed.items() if j not in held}
            lost = {x.slurm_job_id for x in await asyncio.to_thread(
                self.allocator.losses, sorted(closed))} if closed else set()
        except SlurmError as exc:
            log.warning("allocations not checked against Slurm: %s", exc)
            return
        held, _ = self._held()  # what the database holds now
        gone = {j: f"a window pool {p} gave back" for j, p in closed.items()
                if j not in lost and j not in held}
        gone.update({j: "this controller's, and no open pool holds it" for j in tagged
                     if j not in held})
        for jid in sorted(gone):
            log.warning("Slurm job %d runs on (%s); cancelling it", jid, gone[jid])
            with contextlib.suppress(SlurmError):
                await asyncio.to_thread(self.allocator.close, jid)
        await self._kill_stray_steps(held)
        days = self.c.config.services.log_retention_days
        if days > 0:
            assert self.launcher is not None
            await asyncio.to_thread(self.launcher.prune, held, days * 86400.0)

    async def _kill_stray_steps(self, held: set[int]) -> None:
        """Kill the service steps in the open pools' allocations whose service is no
        longer live in the database: one whose launch was under way when an earlier
        controller stopped (its srun ran on, and may list its step only after the
        restart: hence at every sweep, not at start only), or one its stop did not end.
        `held`: the open pools' allocations. A service recorded after this looks is
        taken as live (ids only grow)."""
        assert self.launcher is not None
        if not held:
            return
        records = [s for p in self.c.store.pools(open_only=True)
                   for s in self.c.store.services(pool_id=p.pool_id)]
        live = {s.service_id for s in records if s.ended_at is None}
        newest = max((s.service_id for s in records), default=0)
        await asyncio.to_thread(self.launcher.kill_strays, sorted(held),
                                lambda sid: sid in live or sid > newest)

    def _held(self) -> tuple[set[int], dict[int, int]]:
        """The allocations open pools hold (their windows being given back included),
        and those of the windows they gave back (Slurm job id -> pool id)."""
        held: set[int] = set()
        closed: dict[int, int] = {}
        for pool in self.c.store.pools(open_only=True):
            if pool.slurm_job_id is not None:
                held.add(pool.slurm_job_id)
            retiring = self._retiring.get(pool.pool_id, set())
            for w in self.c.store.windows(pool.pool_id, open_only=False):
                if w.closed_at is None or w.window in retiring:
                    held.add(w.slurm_job_id)
                elif w.slurm_job_id != pool.slurm_job_id:
                    closed[w.slurm_job_id] = pool.pool_id
        return held, closed

    async def _stop_stray(self, svc: ServiceRecord, secret: str) -> None:
        """Stop a service no job uses (best effort: its step may be gone) and record it.
        A floating member's copy of a job that has ended first removes the job's state
        from its node's hand-off directory (memory-backed: it would stay there)."""
        if svc.address:
            with contextlib.suppress(ServiceError, ValueError, OSError):
                handle = ServiceHandle(svc.address, svc.control_secret or secret,
                                       str(svc.job_id), svc.role,
                                       max_answer_bytes=CONTROL_ANSWER_BYTES)
                if svc.handoff_dir and self._ended(svc.job_id):
                    with contextlib.suppress(ServiceError, OSError):
                        await asyncio.to_thread(handle.discard_handoff, 10.0)
                await asyncio.to_thread(handle.stop, 5.0)
        self.c.store.update_service(svc.service_id, state="stopped", residency="stopped",
                                    ended_at=self.c.clock())
        log.info("service %d (%s of job %d) stopped: its job is not placed with it",
                 svc.service_id, svc.role, svc.job_id)

    def _footprints(self, job: JobRecord, gpus: Sequence[int]) -> list[Footprint]:
        services = self.c.config.services
        return footprints_for_job(job.job_id, job.request, gpus, services.rollout_replica_gpus,
                                  rollout_backend=services.rollout_backend,
                                  trainer_backend=services.trainer_backend)

    def _window_footprints(self, job: JobRecord, pool: PoolRecord,
                           windows: Sequence[WindowRecord] | None = None) -> list[Footprint]:
        """A floating pool member's services: its rollout (one engine, or replicas of
        `services.rollout_replica_gpus`, whose tail can pack beside another's) and its
        trainer, on every window (`windows`, default the pool's open ones)."""
        g, services = job.request.gpus, self.c.config.services
        return [f for w in (self.c.store.windows(pool.pool_id) if windows is None else windows)
                for f in footprints_for_job(job.job_id, job.request,
                                            range(w.window * g, w.window * g + g),
                                            services.rollout_replica_gpus, window=w.window,
                                            rollout_backend=services.rollout_backend,
                                            trainer_backend=services.trainer_backend)]

    def _numbering(self) -> str:
        """How steps name their GPUs (`slurmrl.slurm.devices`): the site's
        `[slurm] device_numbering`, or read from its Slurm config once."""
        if self._device_numbering is None:
            want = self.c.config.slurm.device_numbering
            self._device_numbering = (want if want != "auto"
                                      else detect(slurm_conf=self.c.config.slurm.slurm_conf))
            log.info("service steps name their GPUs by %s indices",
                     "Slurm's node-wide" if self._device_numbering == "global"
                     else "their allocation's (0..n-1)")
        return self._device_numbering

    def _handoff_dir(self, job: JobRecord, pool: PoolRecord, node: str,
                     replica: int | None = None) -> str:
        """Where a floating member's services hand its state over on `node`: a
        directory private to the job (created by its services, mode 0700), named so that
        no other user can guess it and squat it (the worker refuses a directory it does
        not own), under `services.handoff_dir` with `%n` there the node's name (nodes
        that share a machine, as the dev cluster's `spread` nodes do). Rollout replica
        i's copies have one of their own (`-r<i>`): each replica's state moves between
        its copies, whichever window they are on. Each name is its own hash of the
        job's secret, the node, the replica and a fresh random value: one directory seen
        (the root may be world-listable, as /dev/shm is) names no other, nor the one a
        later copy on the node takes once the job's copies there discarded theirs (a
        name seen once could be squatted then)."""
        # a copy of the job already on that node keeps its directory: the state is there
        # (named by an earlier controller, or under an earlier `services.handoff_dir`).
        # Its node is its window's (its address is Slurm's NodeAddr, not the node name)
        # (`pool`: the job's, which it joins only once its services are up)
        where = self._nodes_of(pool) if pool.floating else {}
        for svc in self.c.store.services(job_id=job.job_id, live_only=True):
            if (svc.handoff_dir and svc.gpus and svc.pool_id == pool.pool_id
                    and where.get(min(svc.gpus) // job.request.gpus) == node
                    and _replica_of(svc.handoff_dir) == replica):
                return svc.handoff_dir
        which = "" if replica is None else str(replica)
        salt = secrets.token_hex(16)
        tag = hashlib.sha256(f"slurmrl-handoff:{job.secret}:{node}:{which}:{salt}".encode()
                             ).hexdigest()[:32]
        mine = "" if replica is None else f"-r{replica}"
        return os.path.join(self.c.config.services.handoff_dir.replace("%n", node),
                            f"slurmrl-job{job.job_id}-{tag}{mine}")

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for live in self._live.values():
            live.handle.close()  # services keep running: a restart re-attaches them
        self._c = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def job_registered(self, job: JobRecord) -> None:
        self._spawn(self._place_pending())

    async def pool_opened(self, pool: PoolRecord) -> None:
        self._spawn(self._place_pending())

    # -- placement --------------------------------------------------------------------------
    def _host_budget(self, pool: PoolRecord | None) -> int:
        """Host memory parked services may pin on the pool's node(s) (None: a pool not
        opened yet, on any node of the pool partition): `[limits]
        parked_host_mem_per_node`, or where that is 0, half of the smallest such node's
        memory as Slurm last reported it (`_refresh_node_memory`), 64 GiB where unknown."""
        fixed = self.c.config.limits.parked_host_mem_per_node
        if fixed > 0:
            return fixed
        part = self.c.config.slurm.pool_partition
        if pool is not None and pool.nodes:
            known = [self._node_bytes[n] for n in pool.nodes if n in self._node_bytes]
        else:
            known = [b for n, b in self._node_bytes.items()
                     if part in self._node_parts.get(n, ())]
        return min(known) // 2 if known else UNKNOWN_HOST_BUDGET

    async def _refresh_node_memory(self) -> None:
        """Each node's memory (Slurm's RealMemory) for `_host_budget`; kept as it was
        where Slurm cannot be asked."""
        try:
            nodes = await asyncio.to_thread(self.c.slurm.nodes)
        except SlurmError as exc:
            log.warning("node memory not read from Slurm: %s", exc)
            return
        # a node with no GPU holds no pool; RealMemory under 1 GiB is Slurm's placeholder
        # where slurm.conf sets none (1 MB): unknown, not a budget
        self._node_bytes = {n.name: n.memory_mb << 20 for n in nodes
                            if n.memory_mb >= 1024 and n.gpus > 0}
        self._node_parts = {n.name: n.partitions for n in nodes}

    def _capacity(self, pool: PoolRecord) -> list[GpuCapacity]:
        # Without NVML readings from the pool's node (the controller usually runs
        # elsewhere), each GPU is assumed to have `gpu_memory_bytes`. A floating pool's
        # GPUs are its open windows' (w * G .. w * G + G - 1: a window given back
        # leaves a gap)
        gpus = (range(pool.gpus) if not pool.floating else sorted(
            physical_gpus(pool, self.c.store.windows(pool.pool_id))))
        return [GpuCapacity(i, self._gpu_bytes) for i in gpus]

    def _members_fp(self, pool_id: int) -> list[Footprint]:
        return [lv.footprint for lv in self._live.values() if lv.pool_id == pool_id]

    async def _place_pending(self) -> None:
        async with self._lock:
            c = self.c
            waiting = [j for j in c.store.jobs(active=True)
                       if j.pool_id is None and not j.state.terminal]
            if not waiting:
                return
            waiting = await self._refuse_larger_than_nodes(waiting)
            if not waiting:
                return
            await self._refresh_node_memory()
            # the budgets the join guard holds each pool (and a new one) to, told to the
            # policy too (its own limits say none: the site config's 0 means "from the
            # nodes")
            snap = await controller_snapshot(c, waiting, self._gpu_bytes, self._host_budget)
            try:
                placements = list(c.policies.pairing.place(snap))
            except Exception:  # a site policy's bug: leave the jobs waiting, retry later
                log.exception("pairing policy %r failed", c.policies.pairing.name)
                return
            decided = {pl.job_id for pl in placements}
            for job in waiting:
                if job.job_id not in decided:
                    log.error("pairing policy %r gave job %d no placement: it waits",
                              c.policies.pairing.name, job.job_id)
            by_id = {j.job_id: j for j in waiting}
            new: dict[int, PoolRecord] = {}  # provisional (negative) pool id -> opened pool
            try:
                held = _held_node(snap, placements)
            except Exception:  # a site policy's odd placement: hold nothing this round
                log.exception("pairing policy %r: no node held this round",
                              c.policies.pairing.name)
                held = None
            younger = ({j.job_id for j in snap.waiting[[x.job_id for x in snap.waiting]
                                                       .index(held[0]) + 1:]}
                       if held is not None else set())
            for pl in placements:
                rec = by_id.pop(pl.job_id, None)  # one placement a job: the policy's first
                if rec is None:
                    if any(j.job_id == pl.job_id for j in waiting):
                        log.error("pairing policy %r placed job %d twice: the first "
                                  "placement stands", c.policies.pairing.name, pl.job_id)
                    else:
                        log.error("pairing policy %r placed job %r, which is not waiting: "
                                  "ignored", c.policies.pairing.name, pl.job_id)
                    continue
                try:
                    await self._enact(rec, pl, new, held[1] if held and held[1]
                                      and rec.job_id in younger else None)
                except Exception as exc:  # refuse this job, keep placing others
                    log.exception("placing job %d failed", rec.job_id)
                    await c.end_job(rec.job_id, JobState.FAILED, f"refused: {exc}")

    async def _refuse_larger_than_nodes(self, waiting: list[JobRecord]) -> list[JobRecord]:
        """The waiting jobs some node of the pool partition could hold; the others are
        ended, refused with the reason: a pool's GPUs are one node's (of the job's GPU
        type, where it names one), so no pool of more GPUs than the largest node has of
        them could ever start (Slurm would refuse it, and a policy counting each node's
        free GPUs would leave the job waiting for good). Where Slurm cannot be asked,
        or lists no node of the partition, all of them."""
        part = self.c.config.slurm.pool_partition
        try:  # the nodes' sizes only: no job list is read for this
            room = [n for n in await asyncio.to_thread(self.c.slurm.nodes)
                    if part in n.partitions]
        except SlurmError:
            return waiting
        if not room:
            return waiting
        keep = []
        for job in waiting:
            g, kind = job.request.gpus, job.request.gpu_type
            largest = max(n.gpus_of(kind) for n in room)
            if g <= largest:
                keep.append(job)
                continue
            if kind is not None and largest == 0:
                types = sorted({t for n in room for t, _ in n.gpu_types if t})
                why = (f"no node of partition {part!r} has GPUs of type {kind!r} (its "
                       f"types: {', '.join(types) or 'none named'})")
            else:
                of = "" if kind is None else f" of type {kind!r}"
                why = (f"--rl-gpus={'' if kind is None else kind + ':'}{g} is more than any "
                       f"node of partition {part!r} has{of} (the largest has {largest}); "
                       "a pool's GPUs are one node's")
            await self.c.end_job(job.job_id, JobState.FAILED, f"refused: {why}")
        return keep

    async def _enact(self, job: JobRecord, pl: Placement, new: dict[int, PoolRecord],
                     avoid: str | None = None) -> None:
        """Carry out one placement: join, open (shared or dedicated), or wait. `avoid`:
        a node held for an older job that waits (`_held_node`): a pool opened for this
        one goes elsewhere."""
        assert self.allocator is not None
        c = self.c
        if self._ended(job.job_id):  # since the snapshot the policy placed it from
            return
        pl = placement_of(pl, c.policies.pairing.name)  # a bad action: it waits
        if pl.gpu_offset < 0:  # a site policy's slip: the job's GPUs start at 0
            log.warning("job %d: the pairing policy placed it at GPU offset %d; at 0 "
                        "instead", job.job_id, pl.gpu_offset)
            pl = replace(pl, gpu_offset=0)
        if pl.action is Action.WAIT:
            why = f"PoolPending: {pl.reason}" if pl.reason else "PoolPending"
            if job.reason != why:
                c.store.update_job(job.job_id, reason=why)
            return
        # a join to no pool the store holds: a policy's slip (a provisional id is an
        # OPEN's); the job opens its own, as after any refused join
        unknown = pl.action is Action.JOIN and (pl.pool_id is None
                                                or c.store.pool(pl.pool_id) is None)
        if unknown:
            log.error("pairing policy %r told job %d to join pool %s, which does not "
                      "exist%s; it opens its own", c.policies.pairing.name, job.job_id,
                      pl.pool_id, " (a provisional id: jobs share a new pool by OPENs "
                      "of the same id)" if (pl.pool_id or 0) < 0 else "")
        if self._floats(job, pl):
            await self._enact_floating(job, pl, new, avoid)
            return
        # a staggered pool: the job runs on the pool's GPUs from its placement's offset
        gpus = tuple(range(pl.gpu_offset, pl.gpu_offset + job.request.gpus))
        mine = self._footprints(job, gpus)
        host = self._host_budget(None)  # the alone case: the partition's smallest node
        target: PoolRecord | None = None
        join = self._joins(pl, new)
        # Slurm is asked first: no await between the guard and the job's mark below
        if join is not None and not await self._ends_first(job, join):
            target = self._joinable(job, c.store.pool(join), mine, gpus)
        if target is None and pl.action is Action.JOIN and not unknown:
            # never wait for a partner: open alone instead
            log.info("job %d cannot join pool %s; opens its own", job.job_id, pl.pool_id)
        if target is None:
            caps = [GpuCapacity(i, self._gpu_bytes) for i in gpus]
            reason = admit(mine, [], caps, host)
            if reason is not None:
                await c.end_job(job.job_id, JobState.FAILED, f"admission refused: {reason}")
                return
            dedicated = pl.action is Action.DEDICATED or job.request.mux is Mux.OFF
            size = max(pl.gpus or 0, gpus[-1] + 1)
            target = await self._open_or_wait(job, size, dedicated=dedicated, avoid=avoid)
            if target is None:
                return
            if pl.action is Action.OPEN and pl.pool_id is not None and not dedicated:
                new[pl.pool_id] = target
        self._mark_placing(target.pool_id, job.job_id)
        try:
            await self._launch_services(job, target, mine)
            if self._ended(job.job_id):  # ended (deregistered, scancelled) meanwhile
                await self._stop_job_services(job.job_id)
            else:
                c.place_job(job.job_id, target.pool_id, gpus)
        finally:
            self._unmark_placing(target.pool_id, job.job_id)
            # a pool opened for the job, or whose members ended meanwhile, may be empty
            await self._close_if_empty(target.pool_id)

    async def _open_pool(self, job: JobRecord, gpus: int, *, dedicated: bool = False,
                         floating: bool = False, avoid: str | None = None) -> PoolRecord:
        """A pool of `gpus` GPUs opened for `job` (on any node but `avoid`): allocated,
        then recorded (the allocation is `PoolAllocator.tagged` as a stray only once
        recorded)."""
        assert self.allocator is not None
        opened = await asyncio.to_thread(self.allocator.open, gpus, f"for job {job.job_id}",
                                         gpu_type=job.request.gpu_type, exclude=avoid)
        try:
            return self.c.open_pool(gpus=opened.gpus, slurm_job_id=opened.slurm_job_id,
                                    partition=opened.partition, nodes=opened.nodes,
                                    gpu_indices=opened.gpu_indices, dedicated=dedicated,
                                    floating=floating)
        finally:
            self.allocator.recorded(opened.slurm_job_id)

    def _ended(self, job_id: int) -> bool:
        job = self.c.store.job(job_id)
        return job is None or job.state.terminal

    # -- floating pools -------------------------------------------------------------------------
    def _floats(self, job: JobRecord, pl: Placement) -> bool:
        """Whether a placement goes to a floating pool: the site offers them and the
        policy placed the job in one (a job that shares; not a dedicated placement)."""
        return (self.c.config.slurm.floating_pools and pl.floating
                and pl.action in (Action.JOIN, Action.OPEN) and job.request.mux is not Mux.OFF)

    async def _enact_floating(self, job: JobRecord, pl: Placement,
                              new: dict[int, PoolRecord], avoid: str | None = None) -> None:
        """Join a floating pool (adding windows up to the placement's size), or open one
        of one window; the job's services run on every window, handed off until its
        first grant."""
        assert self.allocator is not None
        c, g = self.c, job.request.gpus
        target: PoolRecord | None = None
        join = self._joins(pl, new)
        if join is not None and not await self._ends_first(job, join):
            target = self._joinable_floating(job, c.store.pool(join))
        if target is not None:
            # marked as being placed in before it grows: no window of it is given back
            # while a new one is added (the new one's number is the newest's plus one)
            self._mark_placing(target.pool_id, job.job_id)
            try:
                wanted = max(1, (pl.gpus or g) // g)
                while len(c.store.windows(target.pool_id)) < wanted:
                    if not await self._grow(target):
                        log.info("job %d: pool %d could not take another window; the job "
                                 "opens its own", job.job_id, target.pool_id)
                        self._unmark_placing(target.pool_id, job.job_id)
                        # a member that ended meanwhile left it to this placement
                        await self._close_if_empty(target.pool_id)
                        target = None
                        break
                    target = c.store.pool(target.pool_id)
                    assert target is not None
            except Exception:
                assert target is not None
                self._unmark_placing(target.pool_id, job.job_id)
                # as above: a member that ended meanwhile left the pool empty
                await self._close_if_empty(target.pool_id)
                raise
            except BaseException:  # cancelled (the controller stops): start() closes it
                assert target is not None
                self._unmark_placing(target.pool_id, job.job_id)
                raise
        if target is None:
            caps = [GpuCapacity(i, self._gpu_bytes) for i in range(g)]
            reason = admit(self._footprints(job, range(g)), [], caps,
                           self._host_budget(None))
            if reason is not None:
                await c.end_job(job.job_id, JobState.FAILED, f"admission refused: {reason}")
                return
            target = await self._open_or_wait(job, g, floating=True, avoid=avoid)
            if target is None:
                return
            if pl.action is Action.OPEN and pl.pool_id is not None:
                new[pl.pool_id] = target
            self._mark_placing(target.pool_id, job.job_id)
        try:
            await self._launch_on_windows(job, target, c.store.windows(target.pool_id))
            if self._ended(job.job_id):
                await self._stop_job_services(job.job_id)
            else:
                c.place_job(job.job_id, target.pool_id, tuple(range(g)))
        finally:
            self._unmark_placing(target.pool_id, job.job_id)
            await self._close_if_empty(target.pool_id)

    @staticmethod
    def _joins(pl: Placement, new: dict[int, PoolRecord]) -> int | None:
        """The pool a placement puts the job in beside others: the one it joins, or the
        one opened this round for an OPEN of the same provisional id; else None."""
        if pl.pool_id is None:
            return None
        if pl.action is Action.JOIN:
            return pl.pool_id
        opened = new.get(pl.pool_id) if pl.action is Action.OPEN else None
        return opened.pool_id if opened is not None else None

    async def _ends_first(self, job: JobRecord, pool_id: int) -> bool:
        """Whether the pool's allocation (a floating pool's first window to end: losing
        one loses the pool) ends before the job's own Slurm job, which would then be
        cancelled with the pool at its time limit: the job opens its own pool instead
        (logged). False for a pool with no time limit, and where Slurm cannot be asked
        or does not say (the join goes on)."""
        pool = self.c.store.pool(pool_id)
        if pool is None or pool.slurm_job_id is None:
            return False
        allocs = sorted({pool.slurm_job_id, *(w.slurm_job_id
                                              for w in self.c.store.windows(pool_id))})
        try:
            infos = {i.job_id: i for i in await asyncio.to_thread(
                self.c.slurm.jobs, [job.job_id, *allocs])}
        except SlurmError as exc:
            log.warning("job %d: pool %d's end not asked of Slurm (judged without it): %s",
                        job.job_id, pool_id, exc)
            return False
        ends = [i.end_time for a in allocs
                if (i := infos.get(a)) is not None and i.end_time is not None]
        mine = infos.get(job.job_id)
        if not ends or mine is None or (mine.end_time is None
                                        and mine.time_limit_min is not None):
            return False  # the pool has no time limit, or an end is not known
        if mine.end_time is not None and mine.end_time <= min(ends):
            return False
        now = time.time()  # Slurm's times are epoch seconds
        own = ("has no time limit" if mine.end_time is None
               else f"ends in {mine.end_time - now:.0f} s")
        log.info("job %d cannot join pool %d: its allocation ends in %.0f s, and the "
                 "job's own Slurm job %s; opens its own", job.job_id, pool_id,
                 min(ends) - now, own)
        return True

    def _mark_placing(self, pool_id: int, job_id: int) -> None:
        """The job is being placed in the pool: it neither closes nor gives a window
        back meanwhile."""
        self._placing.setdefault(pool_id, set()).add(job_id)

    def _unmark_placing(self, pool_id: int, job_id: int) -> None:
        placing = self._placing.get(pool_id, set())
        placing.discard(job_id)
        if not placing:
            self._placing.pop(pool_id, None)

    def _joinable_floating(self, job: JobRecord, pool: PoolRecord | None) -> PoolRecord | None:
        """`pool` if the job may join it as a floating member now, else None: the
        controller's guard, as `_joinable` for fixed pools."""
        if (pool is None or pool.state != "open" or not pool.floating or pool.dedicated
                or pool.slurm_job_id is None or pool.pool_id in self._closing):
            return None
        if (why := closed_because(self.c, pool.pool_id)) is not None:
            log.info("job %d cannot join pool %d: %s", job.job_id, pool.pool_id, why)
            return None
        members = self.c.store.jobs(active=True, pool_id=pool.pool_id)
        wins = self.c.store.windows(pool.pool_id)
        if (len(members) >= self.c.config.limits.max_jobs_per_pool or not wins
                or len(wins[0].gpu_indices) != job.request.gpus):
            return None  # full, or windows of another GPU count
        if self._incompatible(job, members, pool.pool_id):
            return None
        # memory as on one window: each member's state is in one copy at a time
        g = job.request.gpus
        on_one = [f for f in self._members_fp(pool.pool_id) if f.window == wins[0].window]
        reason = admit(self._footprints(job, range(g)), on_one,
                       [GpuCapacity(i, self._gpu_bytes) for i in range(g)],
                       self._host_budget(pool))
        if reason is not None:
            log.info("job %d cannot join pool %d: %s", job.job_id, pool.pool_id, reason)
            return None
        return pool

    async def _grow(self, pool: PoolRecord) -> bool:
        """Add a window to a floating pool: an allocation of its window size on its node,
        every member's services launched there (handed off), then its GPUs scheduled.
        False (and nothing changed) if Slurm gives no such allocation (or cannot be
        asked) or a launch fails."""
        assert self.allocator is not None
        c = self.c
        wins = c.store.windows(pool.pool_id)
        g, node = len(wins[0].gpu_indices), (pool.nodes[0] if pool.nodes else None)
        free = await self._free_by_node()
        if node is not None and free is not None and free.get(node, 0) < g:
            # fail fast: Slurm would keep the window pending until the start timeout,
            # and every placement waits for this one meanwhile. Across nodes: the
            # node with the fewest GPUs free that has them (best fit)
            fits = sorted((f, n) for n, f in free.items()
                          if f >= g and c.config.slurm.floating_across_nodes)
            if not fits:
                log.info("pool %d: node %s has fewer than %d GPUs free for a window",
                         pool.pool_id, node, g)
                return False
            node = fits[0][1]
        try:
            kinds = {m.request.gpu_type for m in c.store.jobs(active=True,
                                                               pool_id=pool.pool_id)}
            opened = await asyncio.to_thread(self.allocator.open, g,
                                             f"window of pool {pool.pool_id}", node,
                                             gpu_type=min(kinds, key=str) if kinds else None)
        except (PoolError, SlurmError) as exc:
            log.warning("pool %d: no window of %d GPUs on %s: %s", pool.pool_id, g, node, exc)
            return False
        home = pool.nodes[0] if pool.nodes else None
        there = opened.nodes[0] if opened.nodes else node
        # the next number, past any window still being given back (`_retire_one`)
        number = max([wins[-1].window, *self._retiring.get(pool.pool_id, ())]) + 1
        win = WindowRecord(-1, pool.pool_id, number, opened.slurm_job_id,
                           opened.gpu_indices, c.clock(),
                           node=None if there == home else there)
        try:
            try:
                for m in c.store.jobs(active=True, pool_id=pool.pool_id):
                    # a failure stops what this window launched (below), not the
                    # members' copies elsewhere, nor their handed-off state
                    await self._launch_on_windows(m, pool, [win], stop_job_on_failure=False)
            except Exception:
                log.exception("pool %d: launching services on a new window failed",
                              pool.pool_id)
                # on a node no other window of the pool is on, the copies that came up
                # handed their state off into its hand-off directory, which no later
                # end of their jobs would clear: they remove it first
                alone = there not in {w.node or home for w in wins}
                for key in [k for k, lv in self._live.items() if lv.pool_id == pool.pool_id
                            and lv.footprint.window == win.window]:
                    if alone:
                        await self._discard(self._live[key])
                    await self._stop_service(key)
                with contextlib.suppress(SlurmError):
                    await asyncio.to_thread(self.allocator.close, opened.slurm_job_id)
                return False
            # allocated since before its services launched (each waits for its model)
            c.add_window(pool.pool_id, opened.slurm_job_id, opened.gpu_indices,
                         node=win.node, window=win.window, opened_at=win.opened_at)
        finally:
            self.allocator.recorded(opened.slurm_job_id)
        return True

    def _nodes_of(self, pool: PoolRecord) -> dict[int, str]:
        """The node each open window of a floating pool is on."""
        home = pool.nodes[0] if pool.nodes else "localhost"
        return {w.window: w.node or home for w in self.c.store.windows(pool.pool_id)}

    async def _sources(self, pool: PoolRecord,
                       keys: Sequence[ServiceKey]) -> dict[ServiceKey, str]:
        """For each copy to activate in a floating pool whose windows are on several
        nodes: the address of the job's copy of that service on another node holding
        the newest state (the highest generation its status reports), where that is
        newer than any on the copy's own node. The copy fetches it from there
        (`activate` with `source`); the worker keeps its own file if that is as new."""
        where = self._nodes_of(pool)
        if len(set(where.values())) < 2:
            return {}
        out: dict[ServiceKey, str] = {}
        for key in keys:
            me = self._live.get(key)
            if me is None or me.footprint.window not in where:
                continue
            base = me.footprint.service
            peers = [lv for lv in self._live.values()  # itself too: its node's file
                     if lv.job_id == me.job_id and lv.pool_id == pool.pool_id
                     and lv.footprint.window in where
                     and lv.footprint.service == base]
            gens = await asyncio.gather(*(self._generation(lv) for lv in peers))
            best: dict[str, tuple[int, str]] = {}  # node -> (generation, address)
            for lv, gen in zip(peers, gens, strict=True):
                node = where[lv.footprint.window]  # type: ignore[index]
                if gen is not None and gen > best.get(node, (-1, ""))[0]:
                    best[node] = (gen, lv.handle.address)
            mine = best.pop(where[me.footprint.window], (-1, ""))[0]
            top = max(best.values(), default=None)
            if top is not None and top[0] > mine:
                out[key] = top[1]
        return out

    async def _stranded(self, pool: PoolRecord, last: int) -> list[ServiceKey]:
        """The copies whose stop would strand a job's newest state if the pool's window
        `last` were given back: the window is on a node none of the pool's other windows
        is on, and the copy is active (retiring would hand its state off there) or
        reports a newer generation than any of the job's copies elsewhere (its state
        was last handed off there), or does not answer (it may: fail closed): with the
        window's copies stopped, no copy could fetch it (`_move_off` moves it first)."""
        where = self._nodes_of(pool)
        if len(where) < 2 or last not in where:
            return []
        if where[last] in {n for w, n in where.items() if w != last}:
            return []
        mine = [(k, lv) for k, lv in self._live.items() if lv.pool_id == pool.pool_id
                and lv.footprint.window in where]
        gens = await asyncio.gather(*(self._generation(lv) for _, lv in mine))
        newest: dict[tuple[int, str], tuple[int, int]] = {}  # (job, service) -> (there, else)
        unknown: set[tuple[int, str]] = set()  # no answer from its copy there
        for (_, lv), gen in zip(mine, gens, strict=True):
            key = (lv.job_id, lv.footprint.service)
            there, other = newest.get(key, (-1, -1))
            g = -1 if gen is None else gen
            if gen is None and lv.footprint.window == last:
                unknown.add(key)
            newest[key] = ((max(there, g), other) if lv.footprint.window == last
                           else (there, max(other, g)))
        # a copy there that does not answer may hold the newest state: moved (or the
        # window kept while the move fails), never taken for "nothing there"
        ahead = unknown | {key for key, (there, other) in newest.items() if there > other}
        return [k for k, lv in mine if lv.footprint.window == last and (
            lv.footprint.residency is Residency.ACTIVE
            or (lv.job_id, lv.footprint.service) in ahead)]

    async def _move_off(self, pool: PoolRecord, last: int,
                        stranded: Sequence[ServiceKey]) -> bool:
        """Move the newest states window `last`'s copies hold (handed off) to a node the
        pool keeps, so that the window can go: the job's copy of that service on another
        node fetches it (`fetch_handoff`) and is left parked. True when every fetch
        succeeded; False (the window stays, the state is where it was) when one failed
        or no copy elsewhere could take it. Run outside the pool's hand-off lock: a copy
        activated meanwhile takes its state over as at any grant."""
        where = self._nodes_of(pool)
        if last not in where:
            return False
        for key in stranded:
            src = self._live.get(key)
            if src is None:
                return False
            base = src.footprint.service
            dest = min((lv for lv in self._live.values()
                        if lv.job_id == src.job_id and lv.pool_id == pool.pool_id
                        and lv.footprint.window in where
                        and where[lv.footprint.window] != where[last]
                        and lv.footprint.service == base),
                       key=lambda lv: lv.footprint.window or 0, default=None)
            if dest is None:
                return False
            try:
                await asyncio.to_thread(
                    dest.handle.fetch_handoff, src.handle.address,
                    moving_timeout(CONTROL_TIMEOUT_S, dest.footprint.host_bytes))
            except (ServiceError, OSError) as exc:
                log.warning("pool %d: job %d %s's state not moved off node %s: %s",
                            pool.pool_id, src.job_id, base, where[last], exc)
                return False
            log.info("pool %d: job %d %s's state moved from node %s to node %s before "
                     "window %d goes", pool.pool_id, src.job_id, base, where[last],
                     where[dest.footprint.window], last)  # type: ignore[index]
        return True

    @staticmethod
    async def _generation(live: _Live) -> int | None:
        """The newest generation the copy could activate: its own state's, or that of
        the state file on its node (`stored_generation`: moved or fetched there)."""
        try:
            ans = await asyncio.to_thread(live.handle.status)
        except (ServiceError, OSError):
            return None
        gens = [g for g in (ans.get("generation"), ans.get("stored_generation"))
                if isinstance(g, int) and not isinstance(g, bool)]
        return max(gens, default=None)

    async def _node_room(self) -> list[tuple[NodeInfo, NodeFree]] | None:
        """Each node of the pool partition, with the GPUs Slurm could still allocate
        there (as the pairing snapshot counts them); None when Slurm is unreachable."""
        c = self.c
        try:
            nodes, running = await asyncio.to_thread(lambda: (c.slurm.nodes(), c.slurm.jobs()))
        except SlurmError:
            return None
        part = c.config.slurm.pool_partition
        free = node_free_gpus(nodes, running, c.store.pools(open_only=True), part)
        return [(n, NodeFree(free[n.name], n.gpu_types)) for n in nodes
                if part in n.partitions]

    async def _free_by_node(self) -> dict[str, int] | None:
        """GPUs Slurm could still allocate on each node of the pool partition (as the
        pairing snapshot counts them); None when Slurm is unreachable."""
        room = await self._node_room()
        return None if room is None else {n.name: f.free for n, f in room}

    async def _no_room(self, gpus: int, gpu_type: str | None = None,
                       avoid: str | None = None) -> str | None:
        """Why a pool of `gpus` GPUs (of `gpu_type`, where given) would not start now: no
        node of the pool partition has that many free, where one has that many in all.
        A pool needs all of its GPUs on one node: on a fragmented partition (4 free on
        each of two nodes, 8 asked) Slurm would keep it pending. The shipped pairing
        policies count each node's free GPUs (`policies.free.FreeGpus`); a site's may
        count the partition's total alone, and Slurm's may have changed since the
        round's snapshot. None where a node has them free, where none has that many at
        all (`_refuse_larger_than_nodes` refuses such jobs first; else Slurm refuses the
        pool, and the job with Slurm's reason), or where Slurm cannot be asked (left to
        Slurm)."""
        room = await self._node_room()
        if not room or not any(n.gpus_of(gpu_type) >= gpus for n, _ in room):
            return None
        most = max((f.free_of(gpu_type) for n, f in room if n.name != avoid), default=0)
        if most >= gpus:
            return None
        of = "" if gpu_type is None else f" of type {gpu_type!r}"
        return (f"no node of partition {self.c.config.slurm.pool_partition!r} has {gpus} "
                f"GPUs{of} free (at most {most} on one)")

    async def _open_or_wait(self, job: JobRecord, gpus: int, *, dedicated: bool = False,
                            floating: bool = False, avoid: str | None = None,
                            ) -> PoolRecord | None:
        """`_open_pool`, or None where the job waits to be placed again instead, its
        reason saying why (`PoolPending: ...`): no node has the GPUs free (`_no_room`),
        or Slurm kept the pool pending until the start timeout (`PoolPending`: another
        job took the GPUs first; the allocation was cancelled). The next round (a job's
        registration or end, every reconcile) places it anew."""
        why = await self._no_room(gpus, job.request.gpu_type, avoid)
        if why is None:
            try:
                return await self._open_pool(job, gpus, dedicated=dedicated, floating=floating,
                                             avoid=avoid)
            except PoolPending as exc:
                why = f"Slurm did not start its pool: {exc}"
        reason = f"PoolPending: {why}"
        now = self.c.store.job(job.job_id)
        if now is not None and not now.state.terminal and now.reason != reason:
            log.info("job %d waits: %s", job.job_id, why)
            self.c.store.update_job(job.job_id, reason=reason)
        return None

    async def _launch_on_windows(self, job: JobRecord, pool: PoolRecord,
                                 windows: Sequence[WindowRecord],
                                 stop_job_on_failure: bool = True) -> None:
        """Launch the job's services on `windows` of a floating pool, each in that
        window's allocation, and hand each off at once: the job's state lives in one
        copy at a time, taken over by the copy its next grant activates. (A copy that
        comes up beside a newer handed-off state writes nothing: the worker keeps the
        newer one.) `stop_job_on_failure`: as `_launch_services`."""
        for w in windows:
            fps = self._window_footprints(job, pool, [w])
            devices = {w.window * job.request.gpus + i: d for i, d in enumerate(w.gpu_indices)}
            await self._launch_services(job, pool, fps, w.slurm_job_id, devices, w.node,
                                        stop_job_on_failure)
            await asyncio.gather(*(self._set(f.key, Residency.PARKED, handoff=True)
                                   for f in fps))

    async def _retire_spare(self, pool_id: int) -> None:
        """Give back a floating pool's windows while it has more windows than members,
        each once no lease holds it (the newest free one first): its services hand off
        what they hold, stop, and its allocation is cancelled. Across nodes, where it is
        its node's only window and a job's newest state is there, the state is first
        moved to another node (`_move_off`: the fetch runs outside the pool's hand-off
        lock, so grants go on meanwhile; whether the state is still stranded is asked
        again after it), and the window's copies then remove the job's files there."""
        assert self.allocator is not None
        moved: set[int] = set()  # windows whose states were moved off once this call
        while True:
            async with self._handoff_locks.setdefault(pool_id, asyncio.Lock()):
                step = await self._retire_one(pool_id, moved)
                if step is None:
                    return
                pool, window, stranded = step
                jobs = {k[0] for k in stranded}
                self._moving.update(jobs)  # before the lock goes: see _stop_job_services
            moved.add(window)
            try:
                done = await self._move_off(pool, window, stranded)
            finally:
                self._moving -= Counter(jobs)
                async with self._moved:
                    self._moved.notify_all()
            if not done:
                return  # the window stays; retried at the next reconcile

    async def _retire_one(self, pool_id: int, moved: set[int]
                          ) -> tuple[PoolRecord, int, list[ServiceKey]] | None:
        """Under the pool's hand-off lock: give back one spare window, or return the
        window and the copies whose newest states must be moved off its node first (its
        active copies already handed off); None when nothing is to be given back now."""
        assert self.allocator is not None
        c = self.c
        pool = c.store.pool(pool_id)
        if (pool is None or not pool.floating or pool.state != "open"
                or self._placing.get(pool_id)):
            return None
        members = c.store.jobs(active=True, pool_id=pool_id)
        if len(c.store.windows(pool_id)) <= max(1, len(members)):
            return None
        spare = c.retirable_window(pool_id)
        if spare is None:
            return None
        stranded = await self._stranded(pool, spare.window)
        if stranded:
            if spare.window in moved:  # moved once, and still not elsewhere
                return None  # retried at the next reconcile
            await asyncio.gather(*(self._set(k, Residency.PARKED, handoff=True)
                                   for k in stranded if k in self._live and
                                   self._live[k].footprint.residency is Residency.ACTIVE))
            return pool, spare.window, stranded
        where = self._nodes_of(pool)
        gone = c.retire_window(pool_id, spare)
        if gone is None:
            return None
        # closed in the database from here on: its number is not given to a window the
        # pool grows meanwhile (its copies' names would be this one's), and its
        # allocation is cancelled whatever fails in between (a restart cancels that of
        # a window closed but still running: `_sweep_allocations`)
        retiring = self._retiring.setdefault(pool_id, set())
        retiring.add(gone.window)
        try:
            alone = where[gone.window] not in {n for w, n in where.items()
                                               if w != gone.window}
            lives = {k: lv for k, lv in self._live.items()
                     if lv.pool_id == pool_id and lv.footprint.window == gone.window}
            active = [k for k, lv in lives.items()
                      if lv.footprint.residency is Residency.ACTIVE]
            await asyncio.gather(*(self._set(k, Residency.PARKED, handoff=True)
                                   for k in active))
            if alone and not active:  # no newest state there: nothing left to serve
                await asyncio.gather(*(self._discard(lv) for lv in lives.values()))
            for k, lv in lives.items():
                if self._live.get(k) is lv:  # not stopped meanwhile (its job ended)
                    del self._live[k]
                    await self._stop_live(lv)
        finally:
            with contextlib.suppress(SlurmError):
                await asyncio.to_thread(self.allocator.close, gone.slurm_job_id)
            # allocated until cancelled, its copies' hand-offs and stops included
            c.store.close_window(gone.window_id, c.clock())
            retiring.discard(gone.window)
            if not retiring:
                self._retiring.pop(pool_id, None)
        return await self._retire_one(pool_id, moved)  # the next spare window, if any

    def _joinable(self, job: JobRecord, pool: PoolRecord | None, mine: list[Footprint],
                  gpus: tuple[int, ...]) -> PoolRecord | None:
        """`pool` if the job may join it now (the controller's own guard), else None."""
        if (pool is None or pool.state != "open" or pool.slurm_job_id is None or pool.dedicated
                or pool.floating or pool.pool_id in self._closing):
            return None  # (a floating pool takes floating members only)
        if (why := closed_because(self.c, pool.pool_id)) is not None:
            log.info("job %d cannot join pool %d: %s", job.job_id, pool.pool_id, why)
            return None
        members = self.c.store.jobs(active=True, pool_id=pool.pool_id)
        alone = job.request.mux is Mux.OFF or any(m.request.mux is Mux.OFF for m in members)
        if (pool.gpus <= max(gpus)
                or len(members) >= (1 if alone else self.c.config.limits.max_jobs_per_pool)):
            return None
        # the pairwise constraints every pairing policy checks (`--rl-group`, GPU count,
        # split): a site's own policy that ignores one gains nothing, as in the simulator
        if self._incompatible(job, members, pool.pool_id):
            return None
        reason = admit(mine, self._members_fp(pool.pool_id), self._capacity(pool),
                       self._host_budget(pool))
        if reason is not None:
            log.info("job %d cannot join pool %d: %s", job.job_id, pool.pool_id, reason)
            return None
        return pool

    def _incompatible(self, job: JobRecord, members: Sequence[JobRecord], pool_id: int) -> bool:
        """Whether a member may not share with the job (`compatible`), logged."""
        me = self._bare(job)
        why = next((w for m in members if (w := compatible(me, self._bare(m)))), None)
        if why is not None:
            log.info("job %d cannot join pool %d: %s", job.job_id, pool_id, why)
        return why is not None

    def _bare(self, job: JobRecord) -> JobSnapshot:
        """The job as `compatible` sees it (no profile: it compares requests only)."""
        return JobSnapshot(job.job_id, job.user, job.request, None, job.registered_at,
                           self.c.config.slurm.pool_partition)

    async def _launch_services(self, job: JobRecord, pool: PoolRecord,
                               fps: list[Footprint], slurm_job_id: int | None = None,
                               devices: dict[int, int] | None = None,
                               node: str | None = None,
                               stop_job_on_failure: bool = True) -> None:
        """Launch `fps` as steps of the pool's allocation (or of `slurm_job_id`, a
        floating pool's window on `node` (default the pool's), whose pool GPUs are
        Slurm's `devices`). A launch that fails stops all the job's services (it cannot
        run without them), unless `stop_job_on_failure` is False: then the caller
        stops what it launched."""
        alloc = pool.slurm_job_id if slurm_job_id is None else slurm_job_id
        assert self.launcher is not None and alloc is not None
        node = node or (pool.nodes[0] if pool.nodes else "localhost")
        backend = {"rollout": self.c.config.services.rollout_backend,
                   "trainer": self.c.config.services.trainer_backend}
        # pool GPU i is Slurm's GPU pool.gpu_indices[i] on the node
        where = devices if devices is not None else dict(enumerate(pool.gpu_indices))
        for fp in fps:
            if self._ended(job.job_id):  # no more launches for a job that ended meanwhile
                return
            spec = ServiceSpec(job.job_id, fp.role, job.user,
                               step_devices([where.get(g, g) for g in sorted(fp.gpus)],
                                            list(where.values()), self._numbering()),
                               backend=backend[fp.role], model=job.request.model,
                               replica=fp.replica, uid=job.uid,
                               mem_bytes=job.request.mem_bytes,
                               handoff_dir=None if fp.window is None
                               else self._handoff_dir(job, pool, node, fp.replica))
            rid = self.c.store.add_service(job_id=job.job_id, role=fp.role,
                                           started_at=self.c.clock(), pool_id=pool.pool_id,
                                           backend=spec.backend, gpus=sorted(fp.gpus),
                                           handoff_dir=spec.handoff_dir)
            spec = replace(spec, service_id=rid)  # names its step after the record
            try:
                svc = await asyncio.to_thread(self.launcher.launch, alloc, node, spec,
                                              job.secret)
            except Exception:
                self.c.store.update_service(rid, state="failed", ended_at=self.c.clock())
                if stop_job_on_failure:
                    await self._stop_job_services(job.job_id)
                raise
            self.c.store.update_service(rid, step_id=svc.step_id, address=svc.address,
                                        residency="active", state="running",
                                        control_secret=svc.control_secret)
            live = _Live(rid, job.job_id, fp.name, pool.pool_id, svc.handle, fp, svc)
            if self._ended(job.job_id):
                # it ended during the launch (a model loads for minutes): its end has
                # stopped its other copies already, and would never stop this one
                if fp.window is not None:
                    await self._discard(live)
                await self._stop_live(live)
                return
            self._live[fp.key] = live

    # -- handoffs -----------------------------------------------------------------------------
    async def before_answer(self, job: JobRecord, lease: Lease) -> None:
        if job.pool_id is None:
            return
        # the handoff runs to its end even if the request that asked for it is cancelled
        # (its driver killed mid-handoff, e.g. by scancel, drops the connection): cut
        # short, a park already done on a service was never recorded, and the next
        # holder's handoff, seeing its own service still marked active, would not wake it
        task = asyncio.create_task(self._serialised_handoff(job, job.pool_id, lease))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        await asyncio.shield(task)

    async def _serialised_handoff(self, job: JobRecord, pool_id: int, lease: Lease) -> None:
        # one handoff at a time per pool, each for a lease still held: a lease revoked
        # during its own handoff (its job cancelled) lets the next grant's handoff start,
        # and the two interleaved would leave the first one's parks last - parking the
        # services of the job that now holds the GPUs
        async with self._handoff_locks.setdefault(pool_id, asyncio.Lock()):
            table = self.c.scheduler.tables.get(pool_id)
            if table is None or table.lease(lease.lease_id) is None:
                log.info("handoff to job %d skipped: lease %d ended before it", job.job_id,
                         lease.lease_id)
                return
            await self._handoff(job, pool_id, lease)

    async def _handoff(self, job: JobRecord, pool_id: int, lease: Lease) -> None:
        t0 = time.perf_counter()
        services = self._members_fp(pool_id)
        phase = Phase(lease.phase)
        pool = self.c.store.pool(pool_id)
        floating = pool is not None and pool.floating
        try:
            if floating:  # parks hand the state over; activations take it over
                plan = plan_floating_grant(services, self._capacity_by_id(pool_id),
                                           job_id=job.job_id, phase=phase, gpus=lease.gpus)
            else:
                plan = plan_grant(services, self._capacity_by_id(pool_id), job_id=job.job_id,
                                  phase=phase,
                                  host_budget_bytes=self._host_budget(self.c.store.pool(pool_id)),
                                  gpus=lease.gpus, park_others=self.park_others)
        except ResidencyError as exc:
            self._give_back(job, pool_id, lease, f"its services cannot be made resident: {exc}")
        park = plan.park
        t1 = time.perf_counter()
        await asyncio.gather(*(self._set(k, Residency.PARKED, handoff=floating) for k in park),
                             *(self._set(k, Residency.DROPPED) for k in plan.drop))
        t2 = time.perf_counter()
        sources = (await self._sources(pool, plan.activate) if floating and pool is not None
                   else dict[ServiceKey, str]())
        await asyncio.gather(*(self._set(k, Residency.ACTIVE, handoff=floating,
                                         source=sources.get(k)) for k in plan.activate))
        t3 = time.perf_counter()
        self.handoffs = [*self.handoffs[-99:], HandoffTiming(
            job.job_id, lease.lease_id, t1 - t0, t2 - t1, t3 - t2,
            park + plan.drop, plan.activate)]
        # off the answer's path: the lease's services read their GPUs on the pool's node
        self._spawn(self._record_readings(job.job_id, lease.lease_id, phase, lease.gpus))
        if park or plan.drop or plan.activate:
            log.info("handoff to job %d (%s): parked %s, dropped %s, activated %s "
                     "(%.1f/%.1f ms)", job.job_id, phase, list(park), list(plan.drop),
                     list(plan.activate), (t2 - t1) * 1e3, (t3 - t2) * 1e3)

    def _give_back(self, job: JobRecord, pool_id: int, lease: Lease, why: str) -> NoReturn:
        """A grant whose handoff cannot be planned (nothing was parked or activated): its
        lease is released, its GPUs going to the next waiter, and its answer is refused
        (`LeaseError`: 409 `lease-conflict`) with `why`, rather than a lease on GPUs that
        other services still occupy."""
        msg = f"lease {lease.lease_id} ({lease.phase}) of job {job.job_id} given back: {why}"
        log.error("%s", msg)
        table = self.c.scheduler.tables.get(pool_id)
        if table is not None and table.lease(lease.lease_id) is not None:
            with self.c.store.transaction():  # as a driver's release: idle if it holds none
                self.c.scheduler.release(job, lease.lease_id, {})
                if not any(x.job_id == job.job_id for x in table.leases):
                    self.c.store.update_job(job.job_id, phase="idle")
        raise LeaseError(msg)

    async def _record_readings(self, job_id: int, lease_id: int, phase: Phase,
                               gpus: frozenset[int]) -> None:
        """Store each of the phase's services' NVML reading (or no-GPU marker) with the
        lease (of a floating member, its copies on the lease's window)."""
        mine = [lv.footprint for lv in self._live.values() if lv.job_id == job_id]
        roles = phase_roles(phase, mine)
        for live in [lv for lv in self._live.values()
                     if lv.job_id == job_id and lv.footprint.role in roles
                     and (lv.footprint.window is None or lv.footprint.gpus <= gpus)]:
            role = live.role
            try:
                ans = await asyncio.to_thread(live.handle.status)
            except (ServiceError, OSError) as exc:
                log.warning("service %s of job %d: no GPU reading for lease %d: %s",
                            role, job_id, lease_id, exc)
                continue
            reading = ans.get("gpus")
            if isinstance(reading, dict):
                add_lease_reading(self.c.store, lease_id=lease_id, job_id=job_id, role=role,
                                  at=self.c.clock(), reading=reading)

    def _capacity_by_id(self, pool_id: int) -> list[GpuCapacity]:
        pool = self.c.store.pool(pool_id)
        return self._capacity(pool) if pool is not None else []

    async def _set(self, key: tuple[int, str], residency: Residency,
                   handoff: bool = False, source: str | None = None) -> None:
        """Park, drop or activate one service; with `handoff` (a floating pool's copy),
        a park hands the job's state over and an activation takes it over (fetched from
        the copy at `source` first, where that is on another node)."""
        live = self._live.get(key)
        if live is None:
            return
        if source is not None:
            log.info("job %d: %s takes over the state fetched from its copy at %s "
                     "(on another node)", key[0], key[1], source)
        wait = moving_timeout(CONTROL_TIMEOUT_S, live.footprint.host_bytes)
        try:
            if residency is Residency.ACTIVE:
                ans = await asyncio.to_thread(
                    lambda: live.handle.activate(wait, handoff=True, source=source)
                    if handoff else live.handle.activate(wait))
            else:
                level = 2 if residency is Residency.DROPPED else 1
                ans = await asyncio.to_thread(
                    lambda: live.handle.park(level, wait, handoff=True) if handoff
                    else live.handle.park(level, wait))
        except ServiceError as exc:
            # it may still land (the service queues it behind a call in flight): taken
            # as active, holding its memory, and activated again where a grant needs it
            log.error("service %s of job %d: %s failed: %s", key[1], key[0], residency, exc)
            live.footprint = replace(live.footprint, residency=Residency.ACTIVE,
                                     uncertain=True)
            return
        try:  # the service's answer is the job user's process's: not trusted
            now = Residency(str(ans.get("residency", residency)))
        except (ValueError, AttributeError):
            log.error("service %s of job %d answered %s with no known residency",
                      key[1], key[0], residency)
            return
        live.footprint = replace(live.footprint, residency=now, uncertain=False)
        self.c.store.update_service(live.record_id, residency=str(now))

    # -- endings ------------------------------------------------------------------------------
    async def job_ended(self, job: JobRecord, reason: str) -> None:
        await self._stop_job_services(job.job_id)
        if job.pool_id is not None:
            await self._close_if_empty(job.pool_id)
            await self._retire_spare(job.pool_id)
        self._spawn(self._place_pending())

    async def _stop_job_services(self, job_id: int) -> None:
        """Stop the job's services; a floating member's copies first remove its state
        from their nodes' hand-off directories (memory-backed: it would stay there).
        That under the pool's hand-off lock, the services taken out of every later
        hand-off's plan at once: a grant's hand-off parking a copy after its discard
        would write the state back (seen: an ended job's directory left on a node). And
        only once no move of its state (`_move_off`, fetched outside that lock) is under
        way: a fetch that lands after the discard would leave the state on its node."""
        floating = sorted({lv.pool_id for k, lv in self._live.items()
                           if k[0] == job_id and lv.footprint.window is not None})
        while True:
            async with contextlib.AsyncExitStack() as locked:
                for pool_id in floating:
                    await locked.enter_async_context(
                        self._handoff_locks.setdefault(pool_id, asyncio.Lock()))
                # a move of its state under way (started under the lock, fetched
                # outside it) would land after the discard: wait for it first
                if self._moving[job_id] <= 0:
                    gone = [self._live.pop(k) for k in [k for k in self._live
                                                        if k[0] == job_id]]
                    await asyncio.gather(*(self._discard(lv) for lv in gone
                                           if lv.footprint.window is not None))
                    break
            async with self._moved:
                await self._moved.wait_for(lambda: self._moving[job_id] <= 0)
        for live in gone:
            await self._stop_live(live)

    @staticmethod
    async def _discard(live: _Live) -> None:
        try:
            await asyncio.to_thread(live.handle.discard_handoff, 10.0)
        except (ServiceError, OSError) as exc:  # best effort: the job has ended anyway
            log.warning("job %d %s: its hand-off state was not removed: %s", live.job_id,
                        live.footprint.name, exc)

    async def _stop_service(self, key: tuple[int, str]) -> None:
        live = self._live.pop(key, None)
        if live is None:  # a concurrent call (the job ended mid-placement) stops it
            return
        await self._stop_live(live)

    async def _stop_live(self, live: _Live) -> None:
        """Stop a service already taken out of `_live`."""
        assert self.launcher is not None
        if live.running is not None:
            await asyncio.to_thread(self.launcher.stop, live.running)
        else:  # re-attached after a restart: no srun of ours to end (best effort; a
            # job without a usable secret cannot sign the call)
            with contextlib.suppress(ServiceError, ValueError):
                await asyncio.to_thread(live.handle.stop, 5.0)
        self.c.store.update_service(live.record_id, state="stopped", residency="stopped",
                                    ended_at=self.c.clock())

    async def _close_if_empty(self, pool_id: int) -> None:
        """Close the pool (scancel it) once no job is placed in it or being placed."""
        assert self.allocator is not None
        pool = self.c.store.pool(pool_id)
        if (pool is None or pool.state == "closed" or pool_id in self._closing
                or self._placing.get(pool_id)
                or self.c.store.jobs(active=True, pool_id=pool_id)):
            return
        self._closing.add(pool_id)
        try:
            allocations = {w.slurm_job_id for w in self.c.store.windows(pool_id)}
            if pool.slurm_job_id is not None:
                allocations.add(pool.slurm_job_id)
            for alloc in sorted(allocations):
                with contextlib.suppress(SlurmError):
                    await asyncio.to_thread(self.allocator.close, alloc)
            await self.c.close_pool(pool_id, "group empty")
        finally:
            self._closing.discard(pool_id)
        self._handoff_locks.pop(pool_id, None)

    async def reconcile(self) -> None:
        await self._close_lost_pools()
        if time.monotonic() >= self._next_sweep:
            await self._sweep_allocations()
        self._spawn(self._place_pending())

    async def _close_lost_pools(self) -> None:
        """Close the pools whose allocation Slurm no longer runs; their leases end when
        Slurm ended the allocation, where it says, not when this notices: squeue's end
        time, or for one slurmctld forgot already (`MinJobAge`) its accounting's
        (`PoolAllocator.ended_at`). A floating pool is all its windows' allocations:
        losing one loses the pool, the leases on that window's GPUs ending with it and
        the others' when this notices (their windows ran on)."""
        assert self.allocator is not None
        pools = [p for p in self.c.store.pools(open_only=True) if p.slurm_job_id is not None]
        windows = {p.pool_id: self.c.store.windows(p.pool_id) for p in pools}
        allocs = {p.pool_id: sorted({p.slurm_job_id or -1, *(
            w.slurm_job_id for w in windows[p.pool_id])}) for p in pools}
        ids = sorted({i for a in allocs.values() for i in a})
        losses = {x.slurm_job_id: x for x in await asyncio.to_thread(self.allocator.losses, ids)}
        losses = await self._dated(losses, pools, windows)
        for pool in pools:
            lost = [losses[i] for i in allocs[pool.pool_id] if i in losses]
            if not lost:
                if pool.floating:
                    await self._retire_spare(pool.pool_id)
                continue
            log.warning("pool %d: %s", pool.pool_id, lost[0].message)
            # its steps died with it; the drivers learn the reason from their revoked
            # leases and from the job's state
            ends = [x.ended_at for x in lost if x.ended_at is not None]
            whole = len(lost) == len(allocs[pool.pool_id]) and len(ends) == len(lost)
            await self.c.close_pool(
                pool.pool_id, lost[0].message, ended_at=max(ends) if whole else None,
                windows_ended={w.window: x.ended_at for w in windows[pool.pool_id]
                               if (x := losses.get(w.slurm_job_id)) is not None
                               and x.ended_at is not None})
            self._next_sweep = 0.0  # a floating pool's other windows go now

    async def _dated(self, losses: dict[int, PoolLoss], pools: Sequence[PoolRecord],
                     windows: Mapping[int, Sequence[WindowRecord]]) -> dict[int, PoolLoss]:
        """`losses` with Slurm's end time, from its accounting, where squeue gave none
        (an allocation it forgot) and accounting says."""
        opened: dict[int, float] = {}
        for pool in pools:
            for jid, at in [(pool.slurm_job_id, pool.opened_at),
                            *((w.slurm_job_id, w.opened_at) for w in windows[pool.pool_id])]:
                loss = losses.get(jid or -1)
                if loss is not None and loss.ended_at is None:
                    opened[loss.slurm_job_id] = max(at, opened.get(loss.slurm_job_id, at))
        if not opened:
            return losses
        assert self.allocator is not None
        ends = await asyncio.to_thread(self.allocator.ended_at, opened)
        return {j: replace(x, ended_at=ends[j]) if j in ends else x for j, x in losses.items()}
