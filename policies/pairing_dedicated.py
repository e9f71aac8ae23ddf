"""`dedicated`: no sharing — every job gets its own pool (today's Slurm, the baseline)."""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from policies.free import FreeGpus


class DedicatedPairing:
    """Each job alone on its own GPUs, in arrival order while GPUs are free."""

    name = "dedicated"
    mode = PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = FreeGpus(snapshot)
        out = []
        for job in snapshot.waiting:
            g = job.request.gpus
            if free.take(job, g):
                out.append(Placement(job.job_id, Action.DEDICATED, None, g, 1.0, "dedicated"))
            else:
                out.append(Placement(job.job_id, Action.WAIT,
                                     reason=free.wait(job, g)))
        return out
