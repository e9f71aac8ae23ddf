"""Elastic rollouts in LEASE pools: start on part of the set, grow, shrink in the tail.

A rollout is granted at least half its set (`SimConfig.elastic_min`). While it holds
less than its still-active sequences need, it asks for the missing GPUs with a second
lease (`min_gpus=1`, queued under the slice policy like any request); each grown GPU
works after the usual handoff cost. At each tail point of the job (`SimJob.tail`: the
fraction of rollout time after which k GPUs suffice) it gives grown leases back first,
then shrinks its first lease to k. Speed = GPUs working / GPUs needed (at most 1), so
progress is tracked as a full-speed fraction and re-timed whenever either changes.

Grow is RLix's "expand rollout one group at a time, sync weights only to the added
workers" (shared/research/prior-art.md). With `SimConfig.grow_free_only` it is the
controller's instead (`Lease.grow`, docs/pools.md): the first lease takes the missing
GPUs that are free and that no waiter asks for (`LeaseTable.grow`), asked again whenever
GPUs of the pool free; it never queues. Known limits: requests move to grown GPUs at
once (no rebalancing cost beyond the handoff; the controller moves them at its next
round). `SimConfig.grow = False` turns growing off.

In a floating pool (`SimConfig.floating`) a rollout holds a whole window and
does not grow; with `SimConfig.pack_tails` a tail point moves it to the fewest GPUs it
needs, best fit over the pool's windows (`pack`), idle while the move lasts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slurmrl.leases.types import Grown
from slurmrl.model import Phase
from slurmrl.sim import costs

if TYPE_CHECKING:
    from slurmrl.sim.engine import JobRun, Pool, Simulation


def start(sim: Simulation, pool: Pool, run: JobRun, t: float, granted: int) -> None:
    """The rollout's first lease was granted (`granted` GPUs); work starts at `t`."""
    run.roll_f, run.roll_t, run.roll_i, run.roll_head_gpu_s = 0.0, t, 0, None
    run.roll_need = len(sim._gpus_for(run, Phase.ROLLOUT))
    run.roll_gpus = granted
    roll_schedule(sim, run)
    want_grow(sim, pool, run)


def roll_speed(sim: Simulation, run: JobRun) -> float:
    need = run.roll_need
    speed = run.roll_gpus / (need if need > 1 else 1)
    return 1.0 if speed > 1.0 else speed


def roll_advance(sim: Simulation, run: JobRun) -> None:
    """Bring the rollout's progress up to now at the speed it had since roll_t."""
    if sim.now > run.roll_t:
        seconds = run.job.steps[run.step][run.seg].seconds
        run.roll_f += (sim.now - run.roll_t) * roll_speed(sim, run) / max(seconds, 1e-12)
        run.roll_t = sim.now


def roll_schedule(sim: Simulation, run: JobRun) -> None:
    """Push the rollout's next checkpoint: its next tail point, or its end."""
    seconds = run.job.steps[run.step][run.seg].seconds
    tail = run.job.tail
    target = tail[run.roll_i][0] if run.roll_i < len(tail) else 1.0
    run.roll_token += 1
    speed = roll_speed(sim, run)
    if speed <= 0:
        return  # its sequences are moving (`pack`): rescheduled once they work again
    left = max(0.0, target - run.roll_f) * seconds / speed
    sim._push(max(sim.now, run.roll_t) + left, "roll",
              (run.job.job_id, run.token, run.roll_token))


def want_grow(sim: Simulation, pool: Pool, run: JobRun) -> None:
    """Ask for the rest of the set while the rollout holds less than it needs."""
    if (not sim.cfg.grow or run.grow_req is not None or run.held_n >= run.roll_need
            or run.lease_id is None or pool.windows is not None):
        return
    held: set[int] = set()
    for le in pool.table.leases:
        if le.job_id == run.job.job_id:
            held |= le.gpus
    rest = [g for g in sim._gpus_for(run, Phase.ROLLOUT) if g not in held]
    if not rest:
        return
    if sim.cfg.grow_free_only:
        grown = pool.table.grow(run.lease_id, rest, sim.now)
        sim._check(pool)
        if grown:
            sim._account(run)
            run.held_n = sim._held(pool, run)
            added = frozenset().union(*(e.added for e in grown if isinstance(e, Grown)))
            _join(sim, pool, run, run.lease_id, added)
        return
    req, events = pool.table.request(run.job.job_id, Phase.ROLLOUT, rest, sim.now,
                                     min_gpus=1)
    run.grow_req = req.request_id
    sim._handle(pool, events)


def grew(sim: Simulation, pool: Pool, run: JobRun, lease_id: int) -> None:
    """A grow lease was granted: its GPUs join the rollout once the job's services
    are active on them (the same handoff cost as any grant)."""
    sim._account(run)
    run.grow_req = None
    run.grow_leases.append(lease_id)
    run.held_n = sim._held(pool, run)
    _join(sim, pool, run, lease_id,
          next(le.gpus for le in pool.table.leases if le.lease_id == lease_id))
    want_grow(sim, pool, run)


def _join(sim: Simulation, pool: Pool, run: JobRun, lease_id: int,
          gpus: frozenset[int]) -> None:
    """Grown `gpus` (of `lease_id`) start working after the handoff from their last
    holder."""
    jid = run.job.job_id
    prev = {pool.last_holder.get(g) for g in gpus} - {None, jid}
    cost = 0.0
    if prev:
        out = sim.runs[max(p for p in prev if p is not None)].job
        cost = costs.switch_s(run.job, out, pool.resident)
        run.handoffs += 1
    for g in gpus:
        pool.last_holder[g] = jid
    sim._push(sim.now + cost, "grown", (jid, run.token, lease_id, len(gpus)))


def on_grown(sim: Simulation, data: tuple[int, int, int, int]) -> None:
    jid, token, lease_id, n = data
    run = sim.runs[jid]
    if token != run.token or (lease_id not in run.grow_leases and lease_id != run.lease_id):
        return
    roll_advance(sim, run)
    run.roll_gpus = min(run.roll_gpus + n, run.held_n)  # a tail point may have come first
    roll_schedule(sim, run)


def stop_growing(sim: Simulation, pool: Pool, run: JobRun) -> None:
    """Withdraw a pending grow request and give back the grown leases."""
    if run.grow_req is not None:
        rid, run.grow_req = run.grow_req, None
        sim._handle(pool, pool.table.cancel(rid, sim.now))
    while run.grow_leases:
        sim._handle(pool, pool.table.release(run.grow_leases.pop(), sim.now))


def on_roll(sim: Simulation, data: tuple[int, int, int]) -> None:
    jid, token, rtoken = data
    run = sim.runs[jid]
    if token != run.token or rtoken != run.roll_token or run.pool is None:
        return
    pool = run.pool
    roll_advance(sim, run)
    tail = run.job.tail
    if run.roll_i >= len(tail):
        stop_growing(sim, pool, run)
        sim._push(sim.now, "seg_end", (jid, run.token))
        return
    run.roll_f = tail[run.roll_i][0]
    keep = tail[run.roll_i][1]
    run.roll_i += 1
    run.roll_need = keep
    if keep < run.held_n:
        # the tail thins: give back grown GPUs first, then shrink the first lease
        if run.roll_head_gpu_s is None:
            run.roll_head_gpu_s = run.seg_gpu_s + (sim.now - run.held_since) * run.held_n
        stop_growing(sim, pool, run)
        if run.lease_id is not None and keep < run.held_n:
            if pool.windows is not None and sim.cfg.pack_tails:
                pack(sim, pool, run, run.lease_id, keep)
            else:
                sim._handle(pool, pool.table.shrink(run.lease_id, keep, sim.now))
        run.roll_gpus = min(run.roll_gpus, run.held_n)
    roll_schedule(sim, run)
    want_grow(sim, pool, run)


def pack(sim: Simulation, pool: Pool, run: JobRun, lease_id: int, keep: int) -> None:
    """A floating pool's tail point: the rollout goes to `keep` GPUs of the window with
    the fewest GPUs free that has `keep` (its own on a tie, where it just shrinks), so
    that tails share windows and whole windows free for the other members' phases. A
    move idles it for `SimConfig.tail_move_s` plus the park and activate of whoever
    held those GPUs last."""
    assert pool.windows is not None
    found = pool.table.pack_target(lease_id, keep, pool.windows)
    if found is None:  # its own window is among the fullest: it just shrinks there
        sim._handle(pool, pool.table.shrink(lease_id, keep, sim.now))
        return
    target = sorted(found)
    jid = run.job.job_id
    prev = {pool.last_holder.get(g) for g in target} - {None, jid}
    cost = sim.cfg.tail_move_s
    if prev:
        cost += costs.switch_s(run.job, sim.runs[max(p for p in prev if p is not None)].job,
                               pool.resident)
        run.handoffs += 1
    sim._handle(pool, pool.table.move(lease_id, target, sim.now))
    for g in target:
        pool.last_holder[g] = jid
    run.roll_gpus = 0  # working again once moved
    sim._push(sim.now + cost, "grown", (jid, run.token, lease_id, keep))
