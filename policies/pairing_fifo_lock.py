"""`fifo-lock`: llm-d RL time-slicing — fixed pairs, one FIFO lock per pool.

Jobs are paired in arrival order with the next job of the same size (llm-d pairs by
hand; arrival order is the unbiased stand-in): a waiting job joins the oldest open pool
whose one member it may share with, else pairs with the first job of the same round
that opened a pool alone and that it may share with (both `OPEN` the same provisional
pool), else opens a pool alone. It may share where `compatible` allows, the parked state
fits host memory (`fits_memory`) and the site allows two jobs per pool. The pair is
fixed (`fixed_group = 2`: the pool closes to new members once two have shared it, even
after one leaves), and each GPU phase locks the whole pool (`PoolMode.LOCK`: no lease
shrink, no per-GPU-set sharing) under FIFO slicing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from policies.base import (
    Action,
    ClusterSnapshot,
    JobSnapshot,
    Placement,
    PoolMode,
    PoolSnapshot,
    SiteLimits,
)
from policies.complementarity import compatible, fits_memory, shareable
from policies.free import FreeGpus

#: a policy's own condition for `job` to share with `mate` (in `pool`; None: a new one)
Fits = Callable[[JobSnapshot, JobSnapshot, PoolSnapshot | None], bool]


def _may_share(job: JobSnapshot, mate: JobSnapshot, pool: PoolSnapshot | None,
               limits: SiteLimits, fits: Fits | None) -> bool:
    return (compatible(job, mate) is None
            and fits_memory([mate, job], pool, limits) is None
            and (fits is None or fits(job, mate, pool)))


def pair_in_arrival_order(snapshot: ClusterSnapshot, fits: Fits | None = None,
                          reason: str = "next in FIFO") -> list[Placement]:
    """Fixed pairs in arrival order (the module's docstring), with `fits` as an extra
    condition on each pair; shared by `fifo-lock` and `gang`."""
    limits = snapshot.limits
    free = FreeGpus(snapshot)
    pairs = limits.max_jobs_per_pool >= 2
    pools = sorted(snapshot.pools, key=lambda p: p.pool_id)
    taken: set[int] = set()
    alone: list[tuple[JobSnapshot, Placement]] = []  #: opened alone this round, oldest first
    out: list[Placement] = []
    for job in snapshot.waiting:
        g = job.request.gpus
        if pairs and shareable(job):
            pool = next((p for p in pools
                         if len(p.members) == 1 and not p.closed and not p.dedicated
                         and p.pool_id not in taken and p.gpus == g
                         and _may_share(job, p.members[0], p, limits, fits)), None)
            if pool is not None:
                taken.add(pool.pool_id)
                out.append(Placement(job.job_id, Action.JOIN, pool.pool_id, reason=reason))
                continue
            mate = next((m for m in alone if _may_share(job, m[0], None, limits, fits)),
                        None)
            if mate is not None:
                alone.remove(mate)
                out.append(Placement(job.job_id, Action.OPEN, mate[1].pool_id, g,
                                     reason=f"{reason}: with job {mate[0].job_id}"))
                continue
        if not free.take(job, g):
            out.append(Placement(job.job_id, Action.WAIT, reason=free.wait(job, g)))
            continue
        if shareable(job):
            pl = Placement(job.job_id, Action.OPEN, -1 - len(out), g, reason="alone")
            alone.append((job, pl))
        else:
            pl = Placement(job.job_id, Action.DEDICATED, -1 - len(out), g, reason="alone")
        out.append(pl)
    return out


class FifoLockPairing:
    name = "fifo-lock"
    mode = PoolMode.LOCK
    slice_policy = "fifo"
    fixed_group = 2

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        return pair_in_arrival_order(snapshot)
