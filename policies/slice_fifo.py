"""FIFO slicing: requests are served in arrival order (llm-d's strict FIFO lock)."""

from __future__ import annotations

from collections.abc import Sequence

from slurmrl.leases.types import PhaseRequest, PoolView


class FifoSlice:
    """Oldest request first; ties broken by request id."""

    name = "fifo"

    def order(self, view: PoolView) -> Sequence[PhaseRequest]:
        return sorted(view.waiting, key=lambda r: (r.requested_at, r.request_id))
