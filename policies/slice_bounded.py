"""`bounded-slowdown` slicing: the member closest to its slowdown limit goes first.

A member's pressure is the share of its pool time spent waiting for leases,
wait / (wait + held), plus the current request's wait so far, over the waiting share
its limit allows, (max_slowdown - 1) / max_slowdown. The highest pressure goes first;
ties (and members with no limit, which get `default_max_slowdown`) fall back to
round-robin. A member whose limit is 1 (no slowdown at all) is under infinite pressure
once it waited at all. Known limit: it sees only this pool's lease history, not the job's gaps,
so it over-estimates pressure early in a job's life (a conservative error).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from slurmrl.leases.types import PhaseRequest, PoolView


class BoundedSlowdownSlice:
    name = "bounded-slowdown"

    def __init__(self, default_max_slowdown: float = 1.25) -> None:
        if default_max_slowdown <= 1.0:
            raise ValueError(f"default_max_slowdown must be > 1, got {default_max_slowdown}")
        self.default_max_slowdown = default_max_slowdown

    def order(self, view: PoolView) -> Sequence[PhaseRequest]:
        def key(r: PhaseRequest) -> tuple[float, float, float, int]:
            s = view.stats.get(r.job_id)
            limit = (s.max_slowdown if s and s.max_slowdown else None) or self.default_max_slowdown
            allowed = (limit - 1.0) / limit  # 0 for a limit of 1: no wait allowed
            wait = (s.wait_s if s else 0.0) + (view.now - r.requested_at)
            held = s.held_s if s else 0.0
            share = wait / (wait + held) if wait + held > 0 else 0.0
            pressure = share / allowed if allowed > 0 else math.inf if share > 0 else 0.0
            last = s.last_grant_at if s and s.last_grant_at is not None else -1.0
            return (-pressure, last, r.requested_at, r.request_id)

        return sorted(view.waiting, key=key)
