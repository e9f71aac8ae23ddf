"""`random`: Gandiva-style random pairing (Gavel's Gandiva baseline), blind to profiles.

Each waiting job joins a uniformly chosen pool of its size with a free slot, open or
opened earlier in the same round (`policies.rounds`), whose members it may share with
(`compatible`) and whose parked state, its own added, fits host memory (`fits_memory`),
or opens a pool alone. Pure: the choice is seeded by `seed` and the job id, so the same
snapshot gives the same placements. Known limit: no un-pairing (a job never migrates).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from policies.complementarity import compatible, fits_memory
from policies.free import FreeGpus
from policies.rounds import RoundPools


class RandomPairing:
    name = "random"
    mode = PoolMode.LEASE

    def __init__(self, seed: int = 0, max_group: int = 2) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be >= 1, got {max_group}")
        self.seed, self.max_group = seed, max_group

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = FreeGpus(snapshot)
        pools = RoundPools(snapshot, min(self.max_group, snapshot.limits.max_jobs_per_pool))
        out = []
        for job in snapshot.waiting:
            rng = random.Random(self.seed * 1_000_003 + job.job_id)
            cands = [c for c in pools.open_to(job)
                     if all(compatible(job, m) is None for m in c.members)
                     and fits_memory([*c.members, job], c.pool, snapshot.limits) is None]
            # Gandiva packs with probability 1/2 when it can, as a coin flip per job
            full = not free.fits(job, job.request.gpus)
            if cands and rng.random() < 0.5 + 0.5 * full:
                out.append(pools.add(rng.choice(cands), job, "random"))
                continue
            g = job.request.gpus
            if not free.take(job, g):
                out.append(Placement(job.job_id, Action.WAIT,
                                     reason=free.wait(job, g)))
                continue
            out.append(pools.open(job, -1 - len(out), "random: alone"))
        return out
