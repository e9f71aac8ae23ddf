"""`dedicated`: no sharing — every job gets its own pool (today's Slurm, the baseline)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, Placement, PoolMode


class DedicatedPairing:
    """Each job alone on its own GPUs, in arrival order while GPUs are free."""

    name = "dedicated"
    mode = PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = defaultdict(int, snapshot.free_gpus)
        out = []
        for job in snapshot.waiting:
            g = job.request.gpus
            if free[job.partition] >= g:
                free[job.partition] -= g
                out.append(Placement(job.job_id, Action.DEDICATED, None, g, 1.0, "dedicated"))
            else:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
        return out
