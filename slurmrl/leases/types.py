"""Value types of the lease scheduler: requests, leases, events and the policy's view."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from slurmrl.model import Phase


@dataclass(frozen=True)
class PhaseRequest:
    """A job asking for GPUs of a pool for one phase; waits in the pool's queue."""

    request_id: int
    job_id: int
    phase: Phase
    gpus: frozenset[int]  #: pool GPU indices wanted
    min_gpus: int  #: smallest grant accepted; == len(gpus) unless the phase is elastic
    requested_at: float
    deadline_at: float  #: the waiter is dropped if its job stops heart-beating
    #: alternative GPU sets (a floating pool's windows, in the job's order of
    #: preference): granted the first one wholly free; `gpus` is their union. Empty: the
    #: request is for `gpus` (at least `min_gpus` of them)
    options: tuple[frozenset[int], ...] = ()

    @property
    def elastic(self) -> bool:
        return not self.options and self.min_gpus < len(self.gpus)


@dataclass(frozen=True)
class Lease:
    """A granted request: these GPUs belong to this job's phase until `deadline_at`."""

    lease_id: int  #: equals the request id it came from
    job_id: int
    phase: Phase
    gpus: frozenset[int]
    requested_at: float
    granted_at: float
    deadline_at: float
    #: granted by `LeaseTable.switch` from the job's previous lease: it cannot be
    #: switched again (one phase at most is chained onto a lease without queueing)
    switched: bool = False

    @property
    def wait_s(self) -> float:
        return self.granted_at - self.requested_at

    def with_gpus(self, gpus: frozenset[int]) -> Lease:
        """The same lease on `gpus` (shrunk, grown or moved); `dataclasses.replace`
        without its per-call field introspection, on the simulator's hottest path."""
        return Lease(self.lease_id, self.job_id, self.phase, gpus, self.requested_at,
                     self.granted_at, self.deadline_at, self.switched)


@dataclass(frozen=True)
class Grant:
    """Event: `lease` was granted (or, after a shrink, now holds fewer GPUs)."""

    lease: Lease


@dataclass(frozen=True)
class Shrunk:
    """Event: `lease` gave `freed` back mid-phase."""

    lease: Lease
    freed: frozenset[int]


@dataclass(frozen=True)
class Grown:
    """Event: `lease` took `added` mid-phase (free GPUs no waiter asked for)."""

    lease: Lease
    added: frozenset[int]


@dataclass(frozen=True)
class Revoke:
    """Event: `lease` (or a waiting request, `lease is None`) was taken away."""

    lease: Lease | None
    request: PhaseRequest | None
    reason: str  #: "expired", "job-ended", "pool-lost", ...


@dataclass(frozen=True)
class Released:
    """Event: the job released `lease` at `at`."""

    lease: Lease
    at: float


@dataclass(frozen=True)
class Moved:
    """Event: `lease` moved mid-phase: it gave `freed` back and took `added` (a rollout's
    tail packed onto other GPUs of a floating pool)."""

    lease: Lease
    freed: frozenset[int]
    added: frozenset[int]


Event = Grant | Shrunk | Grown | Moved | Revoke | Released


@dataclass(frozen=True)
class JobSliceStats:
    """What a slice policy may know of a member's history in this pool."""

    job_id: int
    grants: int = 0
    last_grant_at: float | None = None
    wait_s: float = 0.0  #: total time its requests spent waiting
    held_s: float = 0.0  #: total time it held leases (released ones)
    max_slowdown: float | None = None  #: the member's accepted slowdown, if known

    def granted(self, now: float, waited_s: float = 0.0) -> JobSliceStats:
        """After one more grant at `now`, whose request waited `waited_s`."""
        return JobSliceStats(self.job_id, self.grants + 1, now, self.wait_s + waited_s,
                             self.held_s, self.max_slowdown)

    def held(self, seconds: float) -> JobSliceStats:
        """After a lease held `seconds` ended."""
        return JobSliceStats(self.job_id, self.grants, self.last_grant_at, self.wait_s,
                             self.held_s + seconds, self.max_slowdown)


@dataclass(frozen=True)
class PoolView:
    """A snapshot of one pool's leases, handed to the slice policy."""

    pool_id: int
    gpus: frozenset[int]
    now: float
    leases: tuple[Lease, ...]
    waiting: tuple[PhaseRequest, ...]  #: in arrival order
    stats: Mapping[int, JobSliceStats] = field(default_factory=dict)

    def free(self) -> frozenset[int]:
        held: set[int] = set()
        for lease in self.leases:
            held |= lease.gpus
        return self.gpus - held
