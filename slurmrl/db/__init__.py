"""The colocation database: SQLite (WAL) through one `Store`; the only SQL in slurmrl."""

from slurmrl.db.records import (
    GroupRecord,
    JobRecord,
    LeaseRecord,
    ObservationRecord,
    PoolRecord,
    ServiceRecord,
    WindowRecord,
)
from slurmrl.db.store import Store, StoreError

__all__ = [
    "GroupRecord",
    "JobRecord",
    "LeaseRecord",
    "ObservationRecord",
    "PoolRecord",
    "ServiceRecord",
    "Store",
    "StoreError",
    "WindowRecord",
]
