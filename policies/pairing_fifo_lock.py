"""`fifo-lock`: llm-d RL time-slicing — fixed pairs, one FIFO lock per pool.

Jobs are paired in arrival order with the next job of the same size (llm-d pairs by
hand; arrival order is the unbiased stand-in), the pair is fixed (the pool closes to new
members once two share it), and each GPU phase locks the whole pool (`PoolMode.LOCK`:
no lease shrink, no per-GPU-set sharing) under FIFO slicing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from policies.complementarity import compatible, shareable


class FifoLockPairing:
    name = "fifo-lock"
    mode = PoolMode.LOCK
    slice_policy = "fifo"

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = defaultdict(int, snapshot.free_gpus)
        taken: set[int] = set()
        out = []
        for job in snapshot.waiting:
            target = None
            if shareable(job):
                for pool in sorted(snapshot.pools, key=lambda p: p.pool_id):
                    if (len(pool.members) == 1 and not pool.closed and not pool.dedicated
                            and pool.pool_id not in taken and pool.gpus == job.request.gpus
                            and compatible(job, pool.members[0]) is None):
                        target = pool.pool_id
                        break
            if target is not None:
                taken.add(target)
                out.append(Placement(job.job_id, Action.JOIN, target, reason="next in FIFO"))
                continue
            g = job.request.gpus
            if free[job.partition] < g:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
                continue
            free[job.partition] -= g
            action = Action.OPEN if shareable(job) else Action.DEDICATED
            out.append(Placement(job.job_id, action, -1 - len(out), g, reason="alone"))
        return out
