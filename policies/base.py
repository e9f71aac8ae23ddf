"""Extension points for site policies: one small Protocol each.

Policies are pure functions of a snapshot: no subprocess, no clock reads, no DB, no
network. The controller and the simulator build the same snapshots and call the same
objects, so what the simulator shows is what the controller does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from slurmrl.leases.types import PhaseRequest, PoolView


@runtime_checkable
class SlicePolicy(Protocol):
    """Decides, for one pool, which waiting phase request goes next.

    `order` returns every waiting request of `view` exactly once, most urgent first.
    The lease table grants in that order; a request that does not fit reserves its GPUs
    so that nothing later in the order overtakes it on them (no starvation).
    """

    name: str

    def order(self, view: PoolView) -> Sequence[PhaseRequest]: ...
