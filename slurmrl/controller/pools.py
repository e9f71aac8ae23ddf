"""Pools on Slurm: open a pinned GPU allocation, watch it, close it.

A pool is a batch job (`sleep infinity`) in the site's pool partition that holds G GPUs
on one node for as long as its group has members; the services of its RL jobs run as
steps inside it (see `services.py`). `PoolAllocator` is the Slurm half, blocking (call
it from a thread): `open()` submits and waits until Slurm runs the job and names its GPU
indices; `losses()` says which pools Slurm ended behind our back (scancel, preemption,
time limit, node failure) and why; `close()` scancels.

Who owns a pool: the controller's own account (root on a real site). Slurm 22.05 lets
only a job's owner (not even root) create steps in it, steps run as the owner, and srun
has no `--uid`, so running each service as its RL job's user needs root inside the
step to drop privileges (`setpriv`). A pool owned by the `slurmrl` service account would
run every service as `slurmrl`; checked on the dev cluster (root's
`srun --jobid=<slurmrl's job>` is refused with "Access/permission denied"). Keep users
out of the pool partition with `AllowGroups=root` (site-configs/slurm.conf.fragment).

Known limits: single-node pools (one node's GPUs); a pool that Slurm keeps pending
(partition full) is cancelled after `start_timeout_s` rather than queued.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from slurmrl.slurm import BatchSpec, JobInfo, SlurmBackend, SlurmError, SlurmJobState

log = logging.getLogger(__name__)

POOL_NAME = "slurmrl-pool"
POOL_COMMENT = "slurmrl pool"


class PoolError(RuntimeError):
    """A pool could not be opened (refused, failed or never started)."""


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
    state: str  #: Slurm's state name, or "GONE" when Slurm forgot the job
    reason: str = ""

    @property
    def message(self) -> str:
        why = {
            "CANCELLED": "cancelled (scancel or an administrator)",
            "TIMEOUT": "reached its time limit",
            "PREEMPTED": "was preempted",
            "NODE_FAIL": "lost its node (node failure)",
            "GONE": "is no longer known to Slurm",
        }.get(self.state, f"ended ({self.state})")
        extra = f"; Slurm reason: {self.reason}" if self.reason else ""
        return f"pool allocation (Slurm job {self.slurm_job_id}) {why}{extra}"


class PoolAllocator:
    """Submits, watches and cancels pool allocations through a SlurmBackend."""

    def __init__(
        self, slurm: SlurmBackend, partition: str, *, time_limit_min: int | None = None,
        cpus: int = 1, mem_mb: int | None = 256, start_timeout_s: float = 60.0,
        poll_s: float = 0.1,
    ) -> None:
        if not partition:
            raise ValueError("a pool partition is needed ([slurm] pool_partition)")
        self.slurm = slurm
        self.partition = partition
        self.time_limit_min = time_limit_min
        self.cpus = cpus
        self.mem_mb = mem_mb
        self.start_timeout_s = start_timeout_s
        self.poll_s = poll_s

    def open(self, gpus: int, label: str = "") -> SlurmPool:
        """Submit a pool of `gpus` GPUs and return it once Slurm runs it."""
        if gpus < 1:
            raise ValueError(f"a pool needs at least one GPU, got {gpus}")
        spec = BatchSpec(
            command=("sleep", "infinity"), partition=self.partition,
            name=POOL_NAME, gpus=gpus, cpus=self.cpus, mem_mb=self.mem_mb,
            time_limit_min=self.time_limit_min,
            comment=f"{POOL_COMMENT} {label}".strip(), output="/dev/null")
        try:
            job_id = self.slurm.submit(spec)
        except SlurmError as exc:
            raise PoolError(f"Slurm refused a pool of {gpus} GPUs in partition "
                            f"{self.partition!r}: {exc}") from exc
        try:
            info = self._await_running(job_id)
        except BaseException:
            with contextlib.suppress(SlurmError):
                self.slurm.cancel(job_id)
            raise
        if len(info.gpu_indices) != gpus or not info.nodes:
            with contextlib.suppress(SlurmError):
                self.slurm.cancel(job_id)
            raise PoolError(f"pool job {job_id} runs with GPUs {list(info.gpu_indices)} on "
                            f"{list(info.nodes)}, not the {gpus} GPUs asked for")
        node = info.batch_host or info.nodes[0]
        log.info("pool job %d running on %s with GPUs %s", job_id, node,
                 list(info.gpu_indices))
        return SlurmPool(job_id, info.partition or self.partition, node, info.nodes,
                         info.gpu_indices)

    def _await_running(self, job_id: int) -> JobInfo:
        deadline = time.monotonic() + self.start_timeout_s
        info: JobInfo | None = None
        while True:
            info = self.slurm.job(job_id)
            if info is not None and info.state is SlurmJobState.RUNNING and info.gpu_indices:
                return info
            if info is None or info.state.terminal:
                state = "GONE" if info is None else str(info.state)
                reason = "" if info is None else info.reason
                raise PoolError(f"pool job {job_id} ended before it ran: {state} {reason}")
            if time.monotonic() >= deadline:
                raise PoolError(f"pool job {job_id} not running after "
                                f"{self.start_timeout_s:g} s ({info.state}, reason "
                                f"{info.reason or 'none'}); cancelled it")
            time.sleep(self.poll_s)

    def close(self, slurm_job_id: int) -> None:
        """scancel the pool (its service steps end with it)."""
        self.slurm.cancel(slurm_job_id)

    def losses(self, slurm_job_ids: Sequence[int]) -> list[PoolLoss]:
        """The pools among `slurm_job_ids` that Slurm no longer runs."""
        if not slurm_job_ids:
            return []
        infos = {i.job_id: i for i in self.slurm.jobs(list(slurm_job_ids))}
        out = []
        for jid in slurm_job_ids:
            info = infos.get(jid)
            if info is None:
                out.append(PoolLoss(jid, "GONE"))
            elif info.state.terminal or info.state is SlurmJobState.COMPLETING:
                out.append(PoolLoss(jid, str(info.state), info.reason))
        return out
