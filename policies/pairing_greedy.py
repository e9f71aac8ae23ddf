"""`greedy`: Lucid-style greedy first-fit packing.

A waiting job joins the first open pool of its size whose members' GPU duty cycles plus
its own stay under `max_duty` (Lucid packs by profiled utilisation) and whose parked
state fits host memory; else it opens a pool alone. It looks at mean duty cycles only:
no period matching, no slowdown prediction, no matching across the batch.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolMode
from policies.complementarity import compatible, fits_memory, profile_of, shareable


class GreedyPairing:
    name = "greedy"
    mode = PoolMode.LEASE

    def __init__(self, max_duty: float = 1.0, max_group: int = 2) -> None:
        self.max_duty, self.max_group = max_duty, max_group

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = defaultdict(int, snapshot.free_gpus)
        cap = min(self.max_group, snapshot.limits.max_jobs_per_pool)
        added: dict[int, list[JobSnapshot]] = defaultdict(list)
        out = []
        for job in snapshot.waiting:
            placed = False
            for pool in sorted(snapshot.pools, key=lambda p: p.pool_id):
                members = [*pool.members, *added[pool.pool_id]]
                if (not shareable(job) or pool.dedicated or pool.closed or not members
                        or len(members) >= cap or pool.gpus != job.request.gpus
                        or any(compatible(job, m) for m in members)
                        or fits_memory([*members, job], pool, snapshot.limits)):
                    continue
                if sum(profile_of(m).duty() for m in [*members, job]) <= self.max_duty:
                    added[pool.pool_id].append(job)
                    out.append(Placement(job.job_id, Action.JOIN, pool.pool_id, reason="first fit"))
                    placed = True
                    break
            if placed:
                continue
            g = job.request.gpus
            if free[job.partition] < g:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
                continue
            free[job.partition] -= g
            action = Action.OPEN if shareable(job) else Action.DEDICATED
            out.append(Placement(job.job_id, action, -1 - len(out), g, reason="alone"))
        return out
