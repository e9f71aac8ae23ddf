"""Complementarity of jobs sharing a pool: predicted slowdowns and utilisation.

Pure helpers shared by the pairing policies.

The formula (design doc, Muri): a job with busy time a and gap b per step (period
P = a + b); jobs sharing a pool under work-conserving alternation complete a round of one
step each in T = max(max_i P_i, sum_i a_i); job i's slowdown is T / P_i and the pool's
utilisation sum_i a_i / T. With a disaggregated layout each GPU set is a resource:
T = max(max_i P_i, load on the rollout set, load on the trainer set). Busy time is taken
at a high quantile and periods at the median, so long tails and drift are priced in.

Where the formula does not hold — several GPU phases per step (agentic rollout turns
between tool stalls) or groups of more than two — `simulate_group` runs the real
`LeaseTable` with a slice policy on the members' profile steps and measures the
slowdowns; the prediction is the worse of the two.

Known limits: the formula assumes the members settle into alternation (true for equal
periods; pessimistic for unequal ones, whose lock-step T is the longer period); the
simulation uses the profiles' quantiles, not their full distributions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

from policies.base import JobSnapshot, PoolSnapshot, SiteLimits
from policies.slice_round_robin import RoundRobinSlice
from slurmrl.leases.table import LeaseTable
from slurmrl.leases.types import Grant, Shrunk
from slurmrl.model import Layout, Mux, Phase
from slurmrl.profiles import Profile, prior_for_model, profile_from_prior

#: quantiles used to score: busy at p90 (the tail), periods at the median
Q_BUSY = 0.9
Q_PERIOD = 0.5


@dataclass(frozen=True)
class GroupPrediction:
    """Predicted behaviour of jobs sharing one pool."""

    slowdowns: tuple[float, ...]  #: per member, in the order given
    utilisation: float  #: busy GPU time / pool time, in [0, 1]
    round_s: float  #: T, seconds for one step of each member

    @property
    def max_slowdown(self) -> float:
        return max(self.slowdowns)

    def gain(self) -> float:
        """GPU fraction saved vs each alone: sum_i P_i/T - 1 (normalised packed throughput)."""
        return sum(1.0 / s for s in self.slowdowns) - 1.0


def profile_of(job: JobSnapshot) -> Profile:
    """The job's profile, its --rl-profile prior, or a prior by model size."""
    if job.profile is not None:
        return job.profile
    prior = job.request.profile
    if prior is None or prior.step_s is None:
        base = prior_for_model(job.request.model, job.request.gpus)
        prior = base if prior is None else type(prior)(prior.shares, base.step_s)
    return profile_from_prior(prior)


def limit_of(job: JobSnapshot, limits: SiteLimits) -> float:
    """The slowdown this job accepts: its own --rl-max-slowdown, capped by the site."""
    own = job.request.max_slowdown
    return min(limits.max_slowdown, own if own is not None else limits.default_max_slowdown)


def shareable(job: JobSnapshot) -> bool:
    return job.request.mux is not Mux.OFF


def _sets(job: JobSnapshot) -> tuple[int, int]:
    """(rollout set size, trainer set size); a colocated job uses one set for both."""
    r = job.request
    if r.layout is Layout.COLOCATED:
        return (r.gpus, r.gpus)
    rg = r.rollout_gpus or max(1, r.gpus // 2)
    return (rg, r.gpus - rg)


def host_bytes(job: JobSnapshot) -> int:
    """Host memory the job's parked services take (given, or estimated from the model)."""
    if job.host_mem_bytes is not None:
        return job.host_mem_bytes
    from slurmrl.gpu.estimate import estimate_model_memory

    try:
        g = job.request.gpus
        roll = estimate_model_memory(job.request.model, "rollout", gpus=g).parked_host_bytes()
        train = estimate_model_memory(job.request.model, "trainer", gpus=g).parked_host_bytes()
    except ValueError:
        return 0
    return (roll + train) * g


def compatible(a: JobSnapshot, b: JobSnapshot) -> str | None:
    """None if `a` and `b` can share a pool, else why not."""
    if not (shareable(a) and shareable(b)):
        return "--rl-mux=off"
    if a.partition != b.partition:
        return "different partitions"
    if a.gpu_type != b.gpu_type:
        return "different GPU types"
    if a.request.gpus != b.request.gpus:
        return "different GPU counts"
    la, lb = a.request.layout, b.request.layout
    if la is Layout.DISAGGREGATED and lb is Layout.DISAGGREGATED and _sets(a) != _sets(b):
        return "different rollout/trainer splits"
    return None


def fits_memory(members: Sequence[JobSnapshot], pool: PoolSnapshot | None,
                limits: SiteLimits) -> str | None:
    """None if every member can be parked in host memory while another runs."""
    budget = pool.host_mem_free_bytes if pool is not None else limits.parked_host_mem_bytes
    if pool is not None and pool.host_mem_free_bytes is not None:
        need = sum(host_bytes(m) for m in members if m not in pool.members)
    else:
        need = sum(host_bytes(m) for m in members)
    if budget is not None and need > budget:
        return f"parked state needs {need / 2**30:.0f} GiB host memory, {budget / 2**30:.0f} free"
    for m in members:
        mem = m.request.mem_bytes
        if pool is not None and pool.gpu_mem_bytes is not None and mem and mem > pool.gpu_mem_bytes:
            return f"job {m.job_id} needs {mem / 2**30:.0f} GiB per GPU"
    return None


def _loads(p: Profile, job: JobSnapshot, q: float) -> tuple[float, float]:
    """Busy seconds per step on (rollout set, trainer set)."""
    roll = p.load(Phase.ROLLOUT, q)
    train = p.load(Phase.TRAIN, q)
    sync = p.load(Phase.SYNC, q)
    if job.request.layout is Layout.COLOCATED:
        return roll + train + sync, roll + train + sync
    return roll + sync, train + sync


def formula(members: Sequence[JobSnapshot]) -> GroupPrediction:
    profs = [profile_of(m) for m in members]
    periods = [max(p.period(Q_PERIOD), 1e-9) for p in profs]
    loads = [_loads(p, m, Q_BUSY) for p, m in zip(profs, members, strict=True)]
    load_r = sum(x[0] for x in loads)
    load_t = sum(x[1] for x in loads)
    t = max(max(periods), load_r, load_t)
    busy = sum(p.busy(Q_PERIOD) for p in profs)
    util = min(1.0, busy / t) if t > 0 else 0.0
    return GroupPrediction(tuple(t / p for p in periods), util, t)


def predict(members: Sequence[JobSnapshot], steps: int = 6,
            bound: float | None = None) -> GroupPrediction:
    """Formula where it holds, else a simulation of the slice policy on the profiles.

    The formula holds for one rollout and one gap per step and equal periods (within
    5%); otherwise (unequal periods, several GPU phases per step, groups above two) the
    members' steps run through a real LeaseTable (`simulate_group`). With `bound`, a
    group whose load alone exceeds it (sum a_i / P_i > bound: no slicer can serve it)
    is not simulated.
    """
    f = formula(members)
    profs = [profile_of(m) for m in members]
    periods = [p.period(Q_PERIOD) for p in profs]
    equal = max(periods) <= 1.05 * min(periods)
    if len(members) <= 2 and equal and not any(p.multi_phase() for p in profs):
        return f
    load = sum(p.busy(Q_BUSY) / max(p.period(Q_PERIOD), 1e-9) for p in profs)
    if bound is not None and load > bound:
        return GroupPrediction(tuple(max(s, load) for s in f.slowdowns), f.utilisation,
                               f.round_s)
    key = tuple(_sim_key(m, p) for m, p in zip(members, profs, strict=True))
    return GroupPrediction(_simulate_cached(key, steps), f.utilisation, f.round_s)


SimKey = tuple[int, int, tuple[tuple[str, float], ...]]


def _sim_key(job: JobSnapshot, p: Profile) -> SimKey:
    # rounding to 2 significant digits lets similar jobs share a cached simulation. A
    # rollout holds its set for its GPU share of the time and runs on without it after
    # (the shrunk tail, approximated as needing no GPU a partner could use)
    segs: list[tuple[str, float]] = []
    for ph, d in p.segments(Q_BUSY, Q_PERIOD):
        share = p.phases[ph].gpu_share if ph in p.phases else 1.0
        if ph is Phase.ROLLOUT and share < 1.0:
            segs.append((ph.value, float(f"{d * share:.2g}")))
            segs.append((Phase.IDLE.value, float(f"{d * (1 - share):.2g}")))
        else:
            segs.append((ph.value, float(f"{d:.2g}")))
    rg, _tg = _sets(job)
    return (rg if job.request.layout is Layout.DISAGGREGATED else 0, job.request.gpus,
            tuple(segs))


@functools.lru_cache(maxsize=65536)
def _simulate_cached(key: tuple[SimKey, ...], steps: int) -> tuple[float, ...]:
    return simulate_group(key, steps)


def simulate_group(members: Sequence[SimKey], steps: int = 6) -> tuple[float, ...]:
    """Run the members' steps through a real LeaseTable; slowdown of each vs alone.

    Each member repeats its step for `steps` periods of the longest member; its
    slowdown is its time to finish them shared over alone (the first step, where
    everyone starts at once, included: conservative).
    """
    gpus = members[0][1]
    table = LeaseTable(0, range(gpus), RoundRobinSlice(), lease_timeout_s=1e12)
    segs = [[(Phase(ph), d) for ph, d in m[2]] for m in members]
    period = [max(sum(d for _, d in s), 1e-9) for s in segs]
    reps = [max(1, round(steps * max(period) / p)) for p in period]
    solo = [r * p for r, p in zip(reps, period, strict=True)]
    pos = [0] * len(members)  # index into the flattened steps
    total = [r * len(s) for r, s in zip(reps, segs, strict=True)]
    done_at = [0.0] * len(members)
    # (time, seq, job) timers; pending lease per job
    import heapq

    timers: list[tuple[float, int, int]] = []
    seq = 0
    lease_of: dict[int, int] = {}

    def gpus_for(j: int, phase: Phase) -> range:
        rg = members[j][0]
        if rg == 0 or phase is Phase.SYNC:
            return range(gpus)
        return range(rg) if phase is Phase.ROLLOUT else range(rg, gpus)

    def start(j: int, now: float) -> None:
        nonlocal seq
        if pos[j] >= total[j]:
            done_at[j] = now
            return
        phase, d = segs[j][pos[j] % len(segs[j])]
        if phase.needs_gpu:
            _, events = table.request(j, phase, gpus_for(j, phase), now)
            for ev in events:
                on_grant(ev, now)
        else:
            seq += 1
            heapq.heappush(timers, (now + d, seq, j))

    def on_grant(ev: object, now: float) -> None:
        nonlocal seq
        if isinstance(ev, Grant):
            j = ev.lease.job_id
            lease_of[j] = ev.lease.lease_id
            d = segs[j][pos[j] % len(segs[j])][1]
            seq += 1
            heapq.heappush(timers, (now + d, seq, j))

    for j in range(len(members)):
        start(j, 0.0)
    while timers:
        now, _, j = heapq.heappop(timers)
        lid = lease_of.pop(j, None)
        pos[j] += 1
        if lid is not None:
            for ev in table.release(lid, now):
                if not isinstance(ev, Shrunk):
                    on_grant(ev, now)
        start(j, now)
    return tuple(max(1.0, d / s) if s > 0 else 1.0 for d, s in zip(done_at, solo, strict=True))
