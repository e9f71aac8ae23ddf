"""The pools a one-at-a-time baseline may place a waiting job in, within one round.

A pairing round places every waiting job at once; a baseline that places jobs one at a
time (`greedy`, `random`) sees, for each job, the open pools and the pools opened
earlier in the same round, with the members placed in them so far, as a scheduler that
handled the arrivals one by one would have. Jobs that arrive together (a burst, or
jobs queued for GPUs) can thus share a new pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolSnapshot
from policies.complementarity import shareable


@dataclass
class Candidate:
    """A pool a job may be placed in: an open one (`pool`) or one opened this round."""

    pool_id: int  #: an open pool's id, or the provisional id of the `OPEN` placement
    gpus: int
    pool: PoolSnapshot | None  #: None: opened this round
    members: list[JobSnapshot] = field(default_factory=list)


class RoundPools:
    """Candidate pools of one round, of at most `cap` members each."""

    def __init__(self, snapshot: ClusterSnapshot, cap: int) -> None:
        self.cap = cap
        self.candidates = [Candidate(p.pool_id, p.gpus, p, list(p.members))
                           for p in sorted(snapshot.pools, key=lambda p: p.pool_id)
                           if not p.dedicated and not p.closed and p.members]

    def open_to(self, job: JobSnapshot) -> list[Candidate]:
        """The pools of the job's size with room, oldest first (none if it may not share)."""
        if not shareable(job):
            return []
        return [c for c in self.candidates
                if len(c.members) < self.cap and c.gpus == job.request.gpus]

    def add(self, c: Candidate, job: JobSnapshot, reason: str) -> Placement:
        """Place `job` in `c`: a join, or a second `OPEN` of a pool opened this round."""
        c.members.append(job)
        if c.pool is None:
            return Placement(job.job_id, Action.OPEN, c.pool_id, c.gpus,
                             reason=f"{reason}: with job {c.members[0].job_id}")
        return Placement(job.job_id, Action.JOIN, c.pool_id, reason=reason)

    def open(self, job: JobSnapshot, pool_id: int, reason: str) -> Placement:
        """A pool of the job's own, provisional id `pool_id`: dedicated where it may not
        share, else open to the jobs placed after it."""
        g = job.request.gpus
        if not shareable(job):
            return Placement(job.job_id, Action.DEDICATED, pool_id, g, reason=reason)
        self.candidates.append(Candidate(pool_id, g, None, [job]))
        return Placement(job.job_id, Action.OPEN, pool_id, g, reason=reason)
