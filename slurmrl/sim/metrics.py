"""The figures a simulation reports, and their exact definitions.

- **dedicated GPU-s**: each finished job alone on its own GPUs for its solo duration
  (every phase and gap back to back, no waiting): sum of gpus x solo_s.
- **used GPU-s**: what the cluster allocated to pools: sum over pools of
  gpus x (closed_at - opened_at), through each change of size where a pool has some
  (a floating pool's windows, `Pool.allocated_gpu_s`). Idle pool GPUs count. The
  **ledger** charges it to members by the lease GPU-seconds each used in that pool, so
  the charges add up to it.
- **savings** = 1 - used / dedicated.
- **lower bound GPU-s** (what no phase-level slicer can remove): per job, its GPU phases
  at the GPU count of their set with the rollout tail consolidated (G/2, G/4 ... 1 GPUs
  as active sequences thin), plus per step the cheapest handoff it could have
  (`costs.min_switch_s`, capped by that step's gap time) times its GPUs, every job's
  alike (a bound of the jobs, whatever a policy does with them: shared or not).
  **ideal savings** = 1 - lower bound / dedicated; **captured** = savings / ideal
  savings.
- **slowdown** of a job = (finished - placed) / solo duration; **JCT** = finished -
  submitted; **queueing delay** = placed - submitted.
- **utilisation** = lease GPU-s / used GPU-s; **makespan** = last finish - first submit.
- **shared fraction** = the share of used GPU-s during which a pool held two or more jobs
  (the rest: pools with one member, which only a partner's arrival could have shared).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from slurmrl.model import Phase
from slurmrl.sim import costs
from slurmrl.sim.engine import JobRun, Pool, Simulation


class ConservationError(AssertionError):
    """GPU-seconds do not add up: a simulator bug."""


def _q(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    pos = p * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def lower_bound_gpu_s(run: JobRun, gpu_mem_bytes: int) -> float:
    j = run.job
    switch = costs.min_switch_s(j, gpu_mem_bytes)
    total = j.busy_gpu_s()
    for step in j.steps:
        gap = sum(s.seconds for s in step if not s.phase.needs_gpu)
        total += min(switch, gap) * j.gpus
    return total


@dataclass(frozen=True)
class Metrics:
    jobs: int
    rejected: int
    dedicated_gpu_h: float
    used_gpu_h: float
    lower_bound_gpu_h: float
    savings: float
    ideal_savings: float
    captured: float
    slowdown_p50: float
    slowdown_p95: float
    slowdown_max: float
    jct_mean_h: float
    jct_p95_h: float
    queue_mean_h: float
    queue_p95_h: float
    utilisation: float
    makespan_h: float
    shared_fraction: float  #: share of used GPU-s in pools while they held 2+ jobs
    pools: int
    shared_pools: int
    staggered_pools: int  #: pools larger than each of their members (shifted windows)
    handoffs: int
    events: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def ledger(pools: list[Pool]) -> dict[int, float]:
    """GPU-seconds charged to each job: its pool's allocation, split by lease use."""
    charge: dict[int, float] = {}
    for pool in pools:
        assert pool.closed_at is not None
        alloc = pool.allocated_gpu_s()
        members = {r.job.job_id: r for r in _all_members(pool)}
        leased = sum(r.lease_gpu_s for r in members.values())
        for jid, r in members.items():
            share = r.lease_gpu_s / leased if leased > 0 else 1.0 / len(members)
            charge[jid] = charge.get(jid, 0.0) + alloc * share
    return charge


def _all_members(pool: Pool) -> list[JobRun]:
    return pool.history


def shared_gpu_s(pool: Pool) -> float:
    """GPU-seconds of the pool's life during which two or more jobs were its members, at
    the size it had then (a floating pool is largest while it is shared)."""
    runs = _all_members(pool)
    edges = sorted([(r.placed_at or 0.0, 1) for r in runs]
                   + [(r.finished_at or 0.0, -1) for r in runs])
    members, since, total = 0, pool.opened_at, 0.0
    for t, step in edges:  # at one instant a leave sorts before a join
        if members >= 2:
            total += _gpu_s_between(pool, since, t)
        members, since = members + step, t
    return total


def _gpu_s_between(pool: Pool, a: float, b: float) -> float:
    """GPU-seconds the pool held from `a` to `b`, through its changes of size."""
    sizes = pool.sizes or [(pool.opened_at, pool.gpus)]
    out = 0.0
    for k, (t, g) in enumerate(sizes):
        end = sizes[k + 1][0] if k + 1 < len(sizes) else max(b, t)
        out += g * max(0.0, min(b, end) - max(a, t))
    return out


def compute(sim: Simulation) -> Metrics:
    runs = [r for r in sim.runs.values() if r.admitted]
    if sim.pools:
        raise ConservationError(f"{len(sim.pools)} pools still open at the end")
    used = sum(p.allocated_gpu_s() for p in sim.closed)
    leased = sum(r.lease_gpu_s for r in runs)
    if leased > used * (1 + 1e-9) + 1e-6:
        raise ConservationError(f"leases hold {leased:.1f} GPU-s of {used:.1f} allocated")
    dedicated = sum(r.job.gpus * r.solo_s for r in runs)
    lb = sum(lower_bound_gpu_s(r, sim.cfg.gpu_mem_bytes) for r in runs)
    slow = [((r.finished_at or 0.0) - (r.placed_at or 0.0)) / r.solo_s for r in runs]
    jct = [((r.finished_at or 0.0) - r.job.submit_s) / 3600 for r in runs]
    queue = [((r.placed_at or 0.0) - r.job.submit_s) / 3600 for r in runs]
    savings = 1 - used / dedicated if dedicated else 0.0
    ideal = 1 - lb / dedicated if dedicated else 0.0
    first = min((r.job.submit_s for r in runs), default=0.0)
    last = max((r.finished_at or 0.0 for r in runs), default=0.0)
    shared = sum(1 for p in sim.closed if len(_all_members(p)) > 1)
    staggered = sum(1 for p in sim.closed if p.gpus > max(r.job.gpus for r in p.history))
    return Metrics(
        len(runs), len(sim.runs) - len(runs), dedicated / 3600, used / 3600, lb / 3600,
        savings, ideal, savings / ideal if ideal > 0 else 0.0,
        _q(slow, 0.5), _q(slow, 0.95), max(slow, default=0.0),
        sum(jct) / len(jct) if jct else 0.0, _q(jct, 0.95),
        sum(queue) / len(queue) if queue else 0.0, _q(queue, 0.95),
        leased / used if used else 0.0, (last - first) / 3600,
        sum(shared_gpu_s(p) for p in sim.closed) / used if used else 0.0,
        len(sim.closed), shared, staggered, sum(r.handoffs for r in runs), sim.events,
    )


def slowdowns(sim: Simulation) -> list[float]:
    return sorted(((r.finished_at or 0.0) - (r.placed_at or 0.0)) / r.solo_s
                  for r in sim.runs.values() if r.admitted)


def phase_share(sim: Simulation, phase: Phase) -> float:
    """Share of solo time spent in `phase` over all jobs (for reports)."""
    tot = sum(r.solo_s for r in sim.runs.values())
    part = sum(s.seconds for r in sim.runs.values() for st in r.job.steps for s in st
               if s.phase is phase)
    return part / tot if tot else 0.0
