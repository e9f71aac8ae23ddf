"""Simulating a group of jobs' steps under round-robin slicing: the pairing predictor's
fallback where the formula does not hold.

A member is a `SimKey`: (rollout set size, or 0 when colocated; pool GPUs; one step as
(phase value, seconds) segments). Each member repeats its step for `steps` periods of
the longest member; its slowdown is its time to finish them shared over alone (the first
step, where everyone starts at once, included: conservative).

Two implementations with the same semantics:

- `simulate_group_table` drives the real `LeaseTable` with the real `RoundRobinSlice`
  (the reference: what the controller would do);
- `simulate_group` is a direct re-implementation of exactly that schedule on GPU-set
  bitmasks (least recently granted member first, then request time, then request id; a
  request that does not fit reserves its GPUs so nothing later overtakes it on them).
  It is ~20x faster, which pairing a batch of 1,000 jobs needs; a hypothesis test
  checks that both give identical slowdowns.

A disaggregated member's sync holds its trainer set only (its rollout engine loads the
new weights when next activated), as in the simulator.

Known limits: requests always need their whole set (no elastic start, no tail shrink:
the key approximates a shrunk tail as a gap); one pending request per member.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from slurmrl.model import Phase

SimKey = tuple[int, int, tuple[tuple[str, float], ...]]

#: at most this many steps of one member per simulation
MAX_REPS = 200

_NEEDS_GPU = {p.value: p.needs_gpu for p in Phase}


def _plan(members: Sequence[SimKey], steps: int
          ) -> tuple[list[list[tuple[int, float]]], list[float], list[int]]:
    """Per member: segments as (GPU mask or 0 for a gap, seconds); solo time; total
    segments to run."""
    gpus = members[0][1]
    full = (1 << gpus) - 1
    segs: list[list[tuple[int, float]]] = []
    for rg, _g, step in members:
        roll = full if rg == 0 else (1 << rg) - 1
        train = full if rg == 0 else full & ~roll
        out = []
        for ph, d in step:
            if not _NEEDS_GPU[ph]:
                out.append((0, d))
            elif ph == Phase.ROLLOUT.value:
                out.append((roll, d))
            else:
                out.append((train, d))
        segs.append(out)
    period = [max(sum(d for _, d in s), 1e-9) for s in segs]
    # a member whose step is tiny next to the longest one would repeat it millions of
    # times: cap the repetitions (its slowdown is then measured over fewer periods)
    reps = [min(MAX_REPS, max(1, round(steps * max(period) / p))) for p in period]
    solo = [r * p for r, p in zip(reps, period, strict=True)]
    total = [r * len(s) for r, s in zip(reps, segs, strict=True)]
    return segs, solo, total


def simulate_group(members: Sequence[SimKey], steps: int = 6) -> tuple[float, ...]:
    """Slowdown of each member sharing one pool under round-robin slicing (fast path)."""
    n = len(members)
    full = (1 << members[0][1]) - 1
    segs, solo, total = _plan(members, steps)
    pos = [0] * n
    done_at = [0.0] * n
    held = [0] * n  # GPU mask each member holds now
    last_grant = [-1.0] * n
    waiting: dict[int, tuple[float, float, int, int]] = {}  # j -> order key + mask
    timers: list[tuple[float, int, int]] = []
    seq = 0
    rid = 0

    def schedule(now: float) -> None:
        nonlocal seq
        if not waiting:
            return
        used = 0
        for m in held:
            used |= m
        free = full & ~used
        reserved = 0
        for j in sorted(waiting, key=waiting.__getitem__):
            mask = waiting[j][3]
            if mask & free & ~reserved == mask:
                del waiting[j]
                held[j] = mask
                free &= ~mask
                last_grant[j] = now
                seq += 1
                heapq.heappush(timers, (now + segs[j][pos[j] % len(segs[j])][1], seq, j))
            else:
                reserved |= mask
            if not free & ~reserved:
                break

    def start(j: int, now: float) -> None:
        nonlocal seq, rid
        if pos[j] >= total[j]:
            done_at[j] = now
            return
        mask, d = segs[j][pos[j] % len(segs[j])]
        if mask:
            rid += 1
            waiting[j] = (last_grant[j], now, rid, mask)
            schedule(now)
        else:
            seq += 1
            heapq.heappush(timers, (now + d, seq, j))

    for j in range(n):
        start(j, 0.0)
    while timers:
        now, _, j = heapq.heappop(timers)
        pos[j] += 1
        if held[j]:
            held[j] = 0
            schedule(now)
        start(j, now)
    return tuple(max(1.0, d / s) if s > 0 else 1.0 for d, s in zip(done_at, solo, strict=True))


def simulate_group_table(members: Sequence[SimKey], steps: int = 6) -> tuple[float, ...]:
    """The same as `simulate_group`, through the real LeaseTable and RoundRobinSlice."""
    from policies.slice_round_robin import RoundRobinSlice
    from slurmrl.leases.table import LeaseTable
    from slurmrl.leases.types import Grant, Shrunk

    gpus = members[0][1]
    table = LeaseTable(0, range(gpus), RoundRobinSlice(), lease_timeout_s=1e12)
    segs = [[(Phase(ph), d) for ph, d in m[2]] for m in members]
    _, solo, total = _plan(members, steps)
    pos = [0] * len(members)
    done_at = [0.0] * len(members)
    timers: list[tuple[float, int, int]] = []
    seq = 0
    lease_of: dict[int, int] = {}

    def gpus_for(j: int, phase: Phase) -> range:
        rg = members[j][0]
        if rg == 0:
            return range(gpus)
        return range(rg) if phase is Phase.ROLLOUT else range(rg, gpus)

    def on_grant(ev: object, now: float) -> None:
        nonlocal seq
        if isinstance(ev, Grant):
            j = ev.lease.job_id
            lease_of[j] = ev.lease.lease_id
            seq += 1
            heapq.heappush(timers, (now + segs[j][pos[j] % len(segs[j])][1], seq, j))

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
