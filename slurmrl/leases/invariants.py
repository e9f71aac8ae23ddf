"""The lease invariants, checked after every event by tests and the simulator.

Invariant 1 of the design: at most one lease holds a pool GPU at any instant.
`check_table` checks a live table; `check_history` checks recorded lease intervals
(from the DB, or the simulator's log), where a grant and a release at the same
instant on one GPU touch but do not overlap.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurmrl.leases.table import LeaseTable


class InvariantViolation(AssertionError):
    """A lease invariant does not hold: a bug in slurmrl, never a user error."""


def check_table(table: LeaseTable) -> None:
    owner: dict[int, int] = {}
    for lease in table.leases:
        if not lease.gpus:
            raise InvariantViolation(f"lease {lease.lease_id} holds no GPU")
        if not lease.gpus <= table.gpus:
            raise InvariantViolation(f"lease {lease.lease_id} holds GPUs outside the pool")
        if lease.granted_at < lease.requested_at:
            raise InvariantViolation(f"lease {lease.lease_id} granted before it was asked")
        for gpu in lease.gpus:
            if gpu in owner:
                raise InvariantViolation(
                    f"GPU {gpu} of pool {table.pool_id} held by leases "
                    f"{owner[gpu]} and {lease.lease_id} at once"
                )
            owner[gpu] = lease.lease_id
    ids = {lease.lease_id for lease in table.leases}
    for req in table.waiting:
        if req.request_id in ids:
            raise InvariantViolation(f"request {req.request_id} is both waiting and held")


@dataclass(frozen=True)
class Interval:
    """One lease's hold of one GPU: [start, end) in epoch seconds; end None = still held."""

    lease_id: int
    pool_id: int
    gpu: int
    start: float
    end: float | None


def check_history(intervals: Iterable[Interval]) -> None:
    """No two lease intervals on one pool GPU overlap."""
    by_gpu: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for iv in intervals:
        if iv.end is not None and iv.end < iv.start:
            raise InvariantViolation(f"lease {iv.lease_id} ends before it starts")
        by_gpu[(iv.pool_id, iv.gpu)].append(iv)
    for (pool, gpu), ivs in by_gpu.items():
        # zero-length holds at one instant sort before the hold that follows them
        ivs.sort(key=lambda iv: (iv.start, float("inf") if iv.end is None else iv.end))
        for a, b in itertools.pairwise(ivs):
            a_end = float("inf") if a.end is None else a.end
            if b.start < a_end:
                raise InvariantViolation(
                    f"pool {pool} GPU {gpu}: leases {a.lease_id} and {b.lease_id} overlap "
                    f"({a.start:.6f}-{a_end:.6f} and {b.start:.6f}-)"
                )
