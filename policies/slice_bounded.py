"""`bounded-slowdown` slicing: the member closest to its slowdown limit goes first.

A member's pressure is its excess slowdown so far, the time it waited for leases (the
current request's wait included) over the time it held them, wait / held, over the
excess its limit allows, max_slowdown - 1. The highest pressure goes first; ties (and
members with no limit, which get `default_max_slowdown`) fall back to round-robin. A
member that has held nothing yet, or whose limit is 1 (no slowdown at all), is under
infinite pressure once it waited at all. The pressure of a member passed over grows
without bound while it waits, so every member is served in the end: measured as the
share of its time spent waiting, wait / (wait + held), it could not pass 1, and two
members with tight limits took turns ahead of a third with a looser one for good. Among
members of one limit the order is the same either way. Known limit: it sees only this
pool's lease history, not the job's gaps, so it over-estimates pressure early in a
job's life (a conservative error).
"""

from __future__ import annotations

from collections.abc import Sequence

from slurmrl.leases.types import PhaseRequest, PoolView


class BoundedSlowdownSlice:
    name = "bounded-slowdown"

    def __init__(self, default_max_slowdown: float = 1.25) -> None:
        if default_max_slowdown <= 1.0:
            raise ValueError(f"default_max_slowdown must be > 1, got {default_max_slowdown}")
        self.default_max_slowdown = default_max_slowdown

    def order(self, view: PoolView) -> Sequence[PhaseRequest]:
        def key(r: PhaseRequest) -> tuple[int, float, float, float, int]:
            s = view.stats.get(r.job_id)
            limit = (s.max_slowdown if s and s.max_slowdown else None) or self.default_max_slowdown
            wait = (s.wait_s if s else 0.0) + (view.now - r.requested_at)
            held = s.held_s if s else 0.0
            allowed = limit - 1.0  # 0 for a limit of 1: no wait allowed
            # (tier, pressure): infinite pressure, tier 1 (a member that held nothing
            # yet: the tighter its limit the sooner) or 2 (a limit of 1), comes first
            if wait <= 0:
                tier, pressure = 0, 0.0
            elif allowed <= 0:
                tier, pressure = 2, 0.0
            elif held <= 0:
                tier, pressure = 1, 1.0 / allowed
            else:
                tier, pressure = 0, wait / held / allowed
            last = s.last_grant_at if s and s.last_grant_at is not None else -1.0
            return (-tier, -pressure, last, r.requested_at, r.request_id)

        return sorted(view.waiting, key=key)
