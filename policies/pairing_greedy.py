"""`greedy`: Lucid-style greedy first-fit packing.

A waiting job joins the first pool of its size, open or opened earlier in the same
round (a job placed before it, as a one-at-a-time scheduler would have done), whose
members' GPU duty cycles plus its own stay under `max_duty` (Lucid packs by profiled
utilisation), with whose members it may share (`compatible`) and whose parked state fits
host memory; else it opens a pool alone. It looks at mean duty cycles only: no period
matching, no slowdown prediction, no matching across the batch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from policies.complementarity import compatible, fits_memory, profile_of
from policies.free import FreeGpus
from policies.rounds import RoundPools


class GreedyPairing:
    name = "greedy"
    mode = PoolMode.LEASE

    def __init__(self, max_duty: float = 1.0, max_group: int = 2) -> None:
        if max_group < 1:
            raise ValueError(f"max_group must be >= 1, got {max_group}")
        if not (max_duty > 0 and math.isfinite(max_duty)):
            raise ValueError(f"max_duty must be a finite number > 0, got {max_duty}")
        self.max_duty, self.max_group = max_duty, max_group

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        free = FreeGpus(snapshot)
        pools = RoundPools(snapshot, min(self.max_group, snapshot.limits.max_jobs_per_pool))
        out = []
        for job in snapshot.waiting:
            fit = next((c for c in pools.open_to(job)
                        if all(compatible(job, m) is None for m in c.members)
                        and fits_memory([*c.members, job], c.pool, snapshot.limits) is None
                        and sum(profile_of(m).duty() for m in [*c.members, job])
                        <= self.max_duty), None)
            if fit is not None:
                out.append(pools.add(fit, job, "first fit"))
                continue
            g = job.request.gpus
            if not free.take(job, g):
                out.append(Placement(job.job_id, Action.WAIT,
                                     reason=free.wait(job, g)))
                continue
            out.append(pools.open(job, -1 - len(out), "alone"))
        return out
