"""`random`: Gandiva-style random pairing (Gavel's Gandiva baseline), blind to profiles.

Each waiting job joins a uniformly chosen open pool of its size with a free slot whose
members it may share with (`compatible`) and whose parked state, its own added, fits
host memory (`fits_memory`), or opens a pool alone. Pure: the choice is seeded by `seed`
and the job id, so the same snapshot gives the same placements. Known limit: no
un-pairing (a job never migrates).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolMode
from policies.complementarity import compatible, fits_memory, shareable


class RandomPairing:
    name = "random"
    mode = PoolMode.LEASE

    def __init__(self, seed: int = 0, max_group: int = 2) -> None:
        self.seed, self.max_group = seed, max_group

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = defaultdict(int, snapshot.free_gpus)
        cap = min(self.max_group, snapshot.limits.max_jobs_per_pool)
        members: dict[int, list[JobSnapshot]] = {p.pool_id: list(p.members)
                                                  for p in snapshot.pools}
        out = []
        for job in snapshot.waiting:
            rng = random.Random(self.seed * 1_000_003 + job.job_id)
            cands = [p for p in snapshot.pools
                     if shareable(job) and not p.dedicated and not p.closed and p.members
                     and len(members[p.pool_id]) < cap and p.gpus == job.request.gpus
                     and all(compatible(job, m) is None for m in members[p.pool_id])
                     and fits_memory([*members[p.pool_id], job], p, snapshot.limits) is None]
            # Gandiva packs with probability 1/2 when it can, as a coin flip per job
            if cands and rng.random() < 0.5 + 0.5 * (free[job.partition] < job.request.gpus):
                pool = rng.choice(cands)
                members[pool.pool_id].append(job)
                out.append(Placement(job.job_id, Action.JOIN, pool.pool_id, reason="random"))
                continue
            g = job.request.gpus
            if free[job.partition] < g:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
                continue
            free[job.partition] -= g
            action = Action.OPEN if shareable(job) else Action.DEDICATED
            out.append(Placement(job.job_id, action, -1 - len(out), g, reason="random: alone"))
        return out
