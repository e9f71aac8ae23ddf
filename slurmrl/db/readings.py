"""NVML readings recorded with each lease (table `lease_readings`, migration 2).

The controller runs on a head node without the pool's GPUs, so readings are taken by
the lease's services on the pool's node (`GET /v1/status` answers one, see
`slurmrl.gpu.nvml.reading_json`) and stored here against the lease: per-GPU utilisation
and memory and per-process memory, or an explicit no-GPU marker — never made-up numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from slurmrl.db.store import Store


@dataclass(frozen=True)
class LeaseReading:
    """One service's reading of its GPUs while a lease was held."""

    reading_id: int
    lease_id: int
    job_id: int
    role: str
    at: float
    reading: dict[str, Any]


def add_lease_reading(store: Store, *, lease_id: int, job_id: int, role: str, at: float,
                      reading: dict[str, Any]) -> int:
    return store._x(
        "INSERT INTO lease_readings (lease_id, job_id, role, at, reading) VALUES (?,?,?,?,?)",
        (lease_id, job_id, role, at, json.dumps(reading, sort_keys=True)),
    )


def lease_readings(store: Store, lease_id: int | None = None) -> list[LeaseReading]:
    sql, params = "SELECT * FROM lease_readings", list[Any]()
    if lease_id is not None:
        sql, params = sql + " WHERE lease_id = ?", [lease_id]
    return [LeaseReading(r["reading_id"], r["lease_id"], r["job_id"], r["role"], r["at"],
                         json.loads(r["reading"]))
            for r in store._q(sql + " ORDER BY reading_id", params)]
