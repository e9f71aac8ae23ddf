"""Leases: time-bounded grants of a set of a pool's GPUs to one job's phase.

The :class:`~slurmrl.leases.table.LeaseTable` is a pure state machine (time is an
argument, never read) used by both the controller and the simulator.
"""

from slurmrl.leases.table import LeaseError, LeaseTable
from slurmrl.leases.types import Event, Grant, JobSliceStats, Lease, PhaseRequest, PoolView, Revoke

__all__ = [
    "Event",
    "Grant",
    "JobSliceStats",
    "Lease",
    "LeaseError",
    "LeaseTable",
    "PhaseRequest",
    "PoolView",
    "Revoke",
]
