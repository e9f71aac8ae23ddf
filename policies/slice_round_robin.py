"""Round-robin slicing by member (RollMux-style).

The member that was granted least recently goes first, so a job that asks often cannot
starve its partner; among one member's requests, arrival order.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurmrl.leases.types import PhaseRequest, PoolView


class RoundRobinSlice:
    """Least-recently-granted member first."""

    name = "round-robin"

    def order(self, view: PoolView) -> Sequence[PhaseRequest]:
        def key(r: PhaseRequest) -> tuple[float, float, int]:
            stats = view.stats.get(r.job_id)
            last = stats.last_grant_at if stats and stats.last_grant_at is not None else -1.0
            return (last, r.requested_at, r.request_id)

        return sorted(view.waiting, key=key)
