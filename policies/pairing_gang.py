"""`gang`: Slurm `PreemptMode=SUSPEND,GANG`-style time slicing, memory held.

Pairs jobs first-fit like `fifo-lock` (fixed pairs), but the pool is sliced in fixed time
quanta (`quantum_s`, Slurm's SchedulerTimeSlice defaults to 30 s) whatever the phases:
a member is suspended (SIGSTOP: GPU and CPU work alike) outside its quantum, and both
members' memory stays on the GPUs, so they must fit it together.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolMode
from policies.complementarity import compatible, shareable


def device_bytes(job: JobSnapshot) -> int:
    """GPU memory per GPU of the job's resident services (given, or estimated)."""
    if job.request.mem_bytes is not None:
        return job.request.mem_bytes
    from slurmrl.gpu.estimate import estimate_model_memory

    try:
        g = job.request.gpus
        return (estimate_model_memory(job.request.model, "rollout", gpus=g).device_bytes
                + estimate_model_memory(job.request.model, "trainer", gpus=g).device_bytes)
    except ValueError:
        return 0


class GangPairing:
    name = "gang"
    mode = PoolMode.GANG
    slice_policy = "round-robin"

    def __init__(self, quantum_s: float = 30.0, gpu_mem_bytes: int = 80 * 2**30) -> None:
        if quantum_s <= 0:
            raise ValueError(f"quantum_s must be > 0, got {quantum_s}")
        self.quantum_s, self.gpu_mem_bytes = quantum_s, gpu_mem_bytes

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = defaultdict(int, snapshot.free_gpus)
        taken: set[int] = set()
        out = []
        for job in snapshot.waiting:
            target = None
            for pool in sorted(snapshot.pools, key=lambda p: p.pool_id):
                mem = pool.gpu_mem_bytes or self.gpu_mem_bytes
                if (shareable(job) and len(pool.members) == 1 and not pool.closed
                        and not pool.dedicated and pool.pool_id not in taken
                        and pool.gpus == job.request.gpus
                        and compatible(job, pool.members[0]) is None
                        and device_bytes(job) + device_bytes(pool.members[0]) <= mem):
                    target = pool.pool_id
                    break
            if target is not None:
                taken.add(target)
                out.append(Placement(job.job_id, Action.JOIN, target, reason="gang pair"))
                continue
            g = job.request.gpus
            if free[job.partition] < g:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
                continue
            free[job.partition] -= g
            action = Action.OPEN if shareable(job) else Action.DEDICATED
            out.append(Placement(job.job_id, action, -1 - len(out), g, reason="alone"))
        return out
