"""Simulating a group of jobs' steps under round-robin slicing: the pairing predictor's
fallback where the formula does not hold.

A member is a `SimKey`: (rollout set size, or 0 when colocated; pool GPUs; one step as
(phase value, seconds) segments). Each member repeats its step for about `steps`
periods of the longest member. The simulation stops when the first member is done, and
every member's slowdown is that time over the solo time of the work it did by then
(the segment in progress counted pro rata; the first step, where everyone starts at
once, included: conservative). Measuring over this common horizon matters: measured at
each member's own end, the member slowed most would finish its last steps alone, and
its slowdown would be diluted (a 16-GPU pair predicted at 1.80 ran at 2.47).

Two implementations with the same semantics:

- `simulate_group_table` drives the real `LeaseTable` with the real `RoundRobinSlice`
  (the reference: what the controller would do);
- `simulate_group` is a direct re-implementation of exactly that schedule on GPU-set
  bitmasks (least recently granted member first, then request time, then request id; a
  request that does not fit reserves its GPUs so nothing later overtakes it on them).
  It is ~20x faster, which pairing a batch of 1,000 jobs needs; a hypothesis test
  checks that both give identical slowdowns.

As in the simulator: a rollout starts on at least half its set (`ELASTIC_MIN`) and runs
slower by set/granted, and takes the rest of its set as it frees where no waiter asks
for it (`LeaseTable.grow`, as the controller's `Lease.grow`; the simulator's designed
grow queues a second lease instead), re-timed at its new speed; `tail` segments after it
shrink its lease in stages (`tail_stage`: to k GPUs, the rest going to whoever waits;
`tail` alone is one GPU), as a rollout's lease halves through its tail
(`complementarity.tail_stages` pictures them from the job's profile); a disaggregated
member's sync holds its trainer set only (its rollout engine loads the new weights when
next activated); a member whose next phase runs on exactly the GPUs it holds (train ->
sync) switches its lease to it (`LeaseTable.switch`, once per lease) instead of queueing
again: on the whole pool always, on part of it where no member waiting for those GPUs
has waited a larger share of its time (`LeaseTable.can_switch`).

A staggered pool (`offsets`, `pool_gpus`): each member's masks are shifted to its
window, and a shrinking tail keeps the GPU the other windows cover least, as
`LeaseTable.shrink` does with the members' windows.

Known limits: one pending request per member; a rollout grows only onto GPUs free and
asked for by no waiter (the simulator's designed grow queues for them: this is
pessimistic where a partner waits); every member starts its step at once, and which
cycle round-robin then settles into depends on that start (two trainings that queue
behind each other stay so; members offset by a reward gap may each train beside the
other's tail), so a pair that starts otherwise may run better than predicted.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from slurmrl.model import Phase

SimKey = tuple[int, int, tuple[tuple[str, float], ...]]

#: pseudo-phase of a key: the rollout's tail, on one GPU of the set it was granted (the
#: lease shrinks to its lowest GPU; the rest go to whoever waits); `tail_stage(k)` is a
#: stage of it on k GPUs
TAIL = "tail"
#: a rollout starts on at least this share of its set (as the simulator's default)
ELASTIC_MIN = 0.5
#: at most this many steps of one member per simulation
MAX_REPS = 200
#: the slowdown of a member that did no work before the first member was done
STARVED = 1e6

#: whether a key's phase (or the tail pseudo-phase) holds GPUs
NEEDS_GPU = {p.value: p.needs_gpu for p in Phase}
NEEDS_GPU[TAIL] = True


def tail_stage(k: int) -> str:
    """The pseudo-phase of a rollout's tail on k >= 1 GPUs of its set (`TAIL` for one)."""
    if k < 1:
        raise ValueError(f"a tail stage keeps at least one GPU, got {k}")
    return TAIL if k == 1 else f"{TAIL}:{k}"


def tail_gpus(ph: str) -> int | None:
    """The GPUs a tail stage keeps (`tail_stage`), or None for any other phase."""
    if ph == TAIL:
        return 1
    if ph.startswith(TAIL + ":"):
        return int(ph[len(TAIL) + 1:])
    return None


def needs_gpu(ph: str) -> bool:
    """Whether a key's phase (a tail stage included) holds GPUs."""
    return tail_gpus(ph) is not None or NEEDS_GPU[ph]

GAP, REQUEST, SHRINK = 0, 1, 2
#: how far over `bound` a member's sure lower bound must be before a run stops early
CUT_MARGIN = 1e-9


def _plan(members: Sequence[SimKey], steps: int, offsets: Sequence[int],
          ) -> tuple[list[list[tuple[int, int, int, float]]], list[int]]:
    """Per member: segments as (kind, GPU mask, min GPUs, seconds); total segments to
    run. A member's masks are shifted to its window (`offsets`: its first pool GPU)."""
    segs: list[list[tuple[int, int, int, float]]] = []
    for (rg, g, step), off in zip(members, offsets, strict=True):
        full = ((1 << g) - 1) << off
        roll = full if rg == 0 else ((1 << rg) - 1) << off
        train = full if rg == 0 else full & ~roll
        out: list[tuple[int, int, int, float]] = []
        for ph, d in step:
            k = tail_gpus(ph)
            if k is not None:
                if out and out[-1][1] and out[-1][0] in (REQUEST, SHRINK):
                    out.append((SHRINK, out[-1][1], k, d))
                else:  # no rollout before it: a gap
                    out.append((GAP, 0, 0, d))
            elif not NEEDS_GPU[ph]:
                out.append((GAP, 0, 0, d))
            elif ph == Phase.ROLLOUT.value:
                n = roll.bit_count()
                out.append((REQUEST, roll, max(1, int(n * ELASTIC_MIN)), d))
            else:
                m = train
                out.append((REQUEST, m, m.bit_count(), d))
        segs.append(out)
    period = [max(sum(x[3] for x in s), 1e-9) for s in segs]
    # a member whose step is tiny next to the longest one would repeat it millions of
    # times: cap the repetitions (its slowdown is then measured over fewer periods)
    reps = [min(MAX_REPS, max(1, round(steps * max(period) / p))) for p in period]
    return segs, [r * len(s) for r, s in zip(reps, segs, strict=True)]


def _windows(members: Sequence[SimKey], offsets: Sequence[int] | None,
             pool_gpus: int | None) -> tuple[list[int], int, list[tuple[int, ...]]]:
    """Offsets, pool size and, per member, its GPUs in the order a shrunk tail keeps
    them (as `LeaseTable.shrink`: those the fewest other windows cover, lowest first)."""
    offs = list(offsets) if offsets is not None else [0] * len(members)
    size = pool_gpus if pool_gpus is not None else max(
        g + o for (_, g, _), o in zip(members, offs, strict=True))
    wins = [range(o, o + g) for (_, g, _), o in zip(members, offs, strict=True)]
    if all(w == wins[0] for w in wins):  # one window for all: lowest first
        return offs, size, [tuple(w) for w in wins]
    keep = []
    for j, w in enumerate(wins):
        others = [v for i, v in enumerate(wins) if i != j]
        keep.append(tuple(sorted(w, key=lambda x: (sum(x in v for v in others), x))))
    return offs, size, keep


def _horizon(segs: Sequence[Sequence[tuple[int, int, int, float]]], pos: Sequence[int],
             running: Sequence[tuple[float, float] | None], now: float) -> tuple[float, ...]:
    """Slowdowns at `now`: now over each member's solo time of the work it has done (its
    finished segments, plus the elapsed share of the one running, given as (start,
    length)). A member that did no work at all by `now` gets `STARVED`."""
    out = []
    for sk, p, run in zip(segs, pos, running, strict=True):
        work = sum(sk[i % len(sk)][3] for i in range(p))
        if run is not None and run[1] > 0:
            work += sk[p % len(sk)][3] * min(1.0, (now - run[0]) / run[1])
        out.append(1.0 if now <= 0 else STARVED if work <= 0 else max(1.0, now / work))
    return tuple(out)


def _run_time(mask: int, got: int, d: float) -> float:
    """A rollout granted `got` of its set's GPUs runs slower by set/got."""
    return d * mask.bit_count() / max(1, got.bit_count())


def simulate_group(members: Sequence[SimKey], steps: int = 6,
                   offsets: Sequence[int] | None = None,
                   pool_gpus: int | None = None) -> tuple[float, ...]:
    """Slowdown of each member sharing one pool under round-robin slicing (fast path).

    By default every member's window is the pool's GPUs 0..G-1; a staggered pool gives
    each member's first GPU in `offsets` and the pool's size in `pool_gpus`."""
    return simulate_group_within(members, None, steps, offsets, pool_gpus)[0]


def per_member(bound: float | Sequence[float] | None, n: int) -> list[float] | None:
    """`bound` as one bound per member of `n` (one number: the same for all)."""
    if bound is None:
        return None
    if isinstance(bound, (int, float)):
        return [float(bound)] * n
    if len(bound) != n:
        raise ValueError(f"{len(bound)} bounds for {n} members")
    return [float(b) for b in bound]


def simulate_group_within(members: Sequence[SimKey], bound: float | Sequence[float] | None,
                          steps: int = 6,
                          offsets: Sequence[int] | None = None,
                          pool_gpus: int | None = None,
                          ) -> tuple[tuple[float, ...], bool]:
    """`simulate_group`, stopping as soon as some member's slowdown is sure to exceed
    `bound` (None: never; one number for every member, or one per member: each is held
    to its own); and whether it ran to the end. Stopped, it gives for that
    member a value above `bound` that its slowdown is at least, and 1.0 for the others:
    enough to refuse the group, not a prediction. Why it is sure: a member's work grows
    at most as fast as the clock, so its lag (time minus solo work done) never shrinks,
    and its work at the end is at most its whole plan's; so its slowdown at the end is
    at least 1 + lag now / whole plan. A group within `bound` runs to the end, with the
    same result as without one (a pairing batch refuses most candidate groups: their
    runs stop about half way)."""
    n = len(members)
    offs, size, keep_order = _windows(members, offsets, pool_gpus)
    full = (1 << size) - 1
    segs, total = _plan(members, steps, offs)
    lens = [len(s) for s in segs]
    # with a bound, per member: its whole plan's solo work, the lag beyond which it is
    # sure to end above the bound (a hair over it: rounding must never refuse a group
    # the full run would accept), and the solo work of its finished segments
    whole = ([total[j] // lens[j] * sum(x[3] for x in segs[j]) for j in range(n)]
             if bound is not None else [])
    bounds = per_member(bound, n)
    cut_lag = ([(b * (1 + CUT_MARGIN) - 1.0) * w if w > 0 else math.inf
                for b, w in zip(bounds, whole, strict=True)]  # (no work: not bounded)
               if bounds is not None else None)
    done_w = [0.0] * n
    # a tail keeps the lowest GPU it holds where its keep order is ascending (always,
    # unless the pool is staggered): the mask's lowest bit, without the search
    lowest = [list(k) == sorted(k) for k in keep_order]
    pos = [0] * n
    held = [0] * n  # GPU mask each member holds now
    last_grant = [-1.0] * n
    switched = [False] * n  # its lease came from a switch (not switched again)
    wait_s = [0.0] * n  # as the table's slice stats: waits of granted requests,
    held_s = [0.0] * n  # ... holds of ended leases,
    granted_at = [0.0] * n  # ... and when the lease held now was granted
    waiting: dict[int, tuple[float, float, int, int, int]] = {}  # j -> order key, mask, min
    timers: list[tuple[float, int, int]] = []
    # (start, length) of a member's running segment: the share of it done at t is
    # (t - start) / length (a rollout that grew is re-timed: its start moved back)
    running: list[tuple[float, float] | None] = [None] * n
    tok = [0] * n  # the seq of each member's live timer (a grown rollout's old one is stale)
    partial: set[int] = set()  # members running a rollout on part of its set
    push, pop = heapq.heappush, heapq.heappop
    seq = 0
    rid = 0

    def schedule(now: float) -> None:
        nonlocal seq
        used = 0
        for m in held:
            used |= m
        free = full & ~used
        reserved = 0
        for j in sorted(waiting, key=waiting.__getitem__) if len(waiting) > 1 else list(waiting):
            _, _, _, mask, need = waiting[j]
            avail = mask & free & ~reserved
            got = avail.bit_count()
            if got >= need:
                wait_s[j] += now - waiting.pop(j)[1]
                granted_at[j] = last_grant[j] = now
                held[j], switched[j] = avail, False
                free &= ~avail
                seq += 1
                # a rollout granted part of its set runs slower by set/granted
                d = segs[j][pos[j] % lens[j]][3] * mask.bit_count() / max(1, got)
                running[j], tok[j] = (now, d), seq
                if avail != mask:
                    partial.add(j)
                push(timers, (now + d, seq, j))
            else:
                reserved |= mask
            if not free & ~reserved:
                break

    def start(j: int, now: float) -> None:
        nonlocal seq, rid
        kind, mask, need, d = segs[j][pos[j] % lens[j]]
        if kind == REQUEST:
            running[j] = None
            rid += 1
            waiting[j] = (last_grant[j], now, rid, mask, need)
            schedule(now)
            return
        if kind == SHRINK and held[j]:
            shrink(j, need, now)
        seq += 1
        running[j], tok[j] = (now, d), seq
        push(timers, (now + d, seq, j))

    def shrink(j: int, need: int, now: float) -> None:
        """The member's lease keeps `need` of its GPUs (`LeaseTable.shrink`)."""
        h = held[j]
        if need == 1 and lowest[j]:
            kept = h & -h
        elif need >= h.bit_count():
            kept = h
        else:  # its first `need` GPUs in keep order
            kept = 0
            for g in keep_order[j]:
                if h >> g & 1:
                    kept |= 1 << g
                    need -= 1
                    if not need:
                        break
        held[j] = kept
        if h != kept and waiting:  # the freed GPUs go to waiters first, as
            schedule(now)  # LeaseTable.shrink does

    def grow(now: float) -> None:
        """Rollouts granted part of their set take the rest of it where free and asked
        for by no waiter (`LeaseTable.grow`), member by member, and run faster."""
        nonlocal seq
        free = full
        for m in held:
            free &= ~m
        for w in waiting.values():
            free &= ~w[3]
        if not free:
            return
        for j in sorted(partial) if len(partial) > 1 else list(partial):
            _, mask, _, d = segs[j][pos[j] % lens[j]]
            run = running[j]
            add = mask & free & ~held[j]
            if run is None or not add:
                continue
            done = (now - run[0]) / run[1] if run[1] > 0 else 1.0
            held[j] |= add
            free &= ~add
            if held[j] == mask:
                partial.discard(j)
            length = d * mask.bit_count() / held[j].bit_count()
            seq += 1
            running[j], tok[j] = (now - done * length, length), seq
            push(timers, (now + (1.0 - done) * length, seq, j))
            if not free:
                return

    def waited(k: int, now: float) -> float:  # LeaseTable.waited_share
        w = wait_s[k] + (now - waiting[k][1] if k in waiting else 0.0)
        h = held_s[k] + (now - granted_at[k] if held[k] else 0.0)
        return w / (w + h) if w + h > 0 else 0.0

    def may_switch(j: int, mask: int, now: float) -> bool:  # LeaseTable.can_switch
        if switched[j] or not held[j] or held[j] != mask:
            return False
        return mask == full or all(waited(k, now) <= waited(j, now) for k in waiting
                                   if k != j and waiting[k][3] & mask)

    for j in range(n):
        start(j, 0.0)
    if partial:
        grow(0.0)
    while timers:
        now, s, j = pop(timers)
        if s != tok[j]:
            continue  # a grown rollout's first timer
        partial.discard(j)
        p = pos[j] = pos[j] + 1
        running[j] = None
        if p >= total[j]:
            return _horizon(segs, pos, running, now), True
        if cut_lag is not None:
            done_w[j] += segs[j][(p - 1) % lens[j]][3]
            if now - done_w[j] > cut_lag[j]:
                return tuple(1.0 + (now - done_w[j]) / whole[j] if i == j else 1.0
                             for i in range(n)), False
        nxt, nmask, nneed, nd = segs[j][p % lens[j]]
        if nxt == REQUEST and held[j] == nmask and may_switch(j, nmask, now):
            # its next phase runs on the GPUs it holds: LeaseTable.switch
            held_s[j] += now - granted_at[j]
            granted_at[j] = last_grant[j] = now
            switched[j] = True
            seq += 1
            running[j], tok[j] = (now, nd), seq
            push(timers, (now + nd, seq, j))
            if partial:
                grow(now)
            continue
        if held[j] and nxt != SHRINK:
            held_s[j] += now - granted_at[j]
            held[j] = 0
            if waiting:
                schedule(now)
        if nxt == REQUEST:
            start(j, now)
        else:  # a gap or a tail stage (`start`, inline: most segments are)
            if nxt == SHRINK and held[j]:
                shrink(j, nneed, now)
            seq += 1
            running[j], tok[j] = (now, nd), seq
            push(timers, (now + nd, seq, j))
        if partial:
            grow(now)
    return (1.0,) * n, True


def simulate_group_table(members: Sequence[SimKey], steps: int = 6,
                         offsets: Sequence[int] | None = None,
                         pool_gpus: int | None = None) -> tuple[float, ...]:
    """The same as `simulate_group`, through the real LeaseTable and RoundRobinSlice."""
    from policies.slice_round_robin import RoundRobinSlice
    from slurmrl.leases.table import LeaseTable
    from slurmrl.leases.types import Grant

    offs, gpus, _ = _windows(members, offsets, pool_gpus)
    table = LeaseTable(0, range(gpus), RoundRobinSlice(), lease_timeout_s=1e12)
    n = len(members)
    for j in range(n):
        table.set_member(j, None, range(offs[j], offs[j] + members[j][1]))
    segs, total = _plan(members, steps, offs)
    pos = [0] * n
    running: list[tuple[float, float] | None] = [None] * n
    timers: list[tuple[float, int, int]] = []
    seq = 0
    tok = [0] * n
    lease_of: dict[int, int] = {}

    def on_events(events: Sequence[object], now: float) -> None:
        nonlocal seq
        for ev in events:
            if isinstance(ev, Grant):
                j = ev.lease.job_id
                lease_of[j] = ev.lease.lease_id
                mask = sum(1 << g for g in ev.lease.gpus)
                _, want, _, d = segs[j][pos[j] % len(segs[j])]
                seq += 1
                running[j], tok[j] = (now, _run_time(want, mask, d)), seq
                heapq.heappush(timers, (now + _run_time(want, mask, d), seq, j))

    def grow(now: float) -> None:
        nonlocal seq
        for j in range(n):
            kind, want, _, d = segs[j][pos[j] % len(segs[j])]
            run = running[j]
            if kind != REQUEST or run is None or j not in lease_of:
                continue
            events = table.grow(lease_of[j], [g for g in range(gpus) if want >> g & 1], now)
            if not events:
                continue
            lease = table.lease(lease_of[j])
            assert lease is not None
            done = (now - run[0]) / run[1] if run[1] > 0 else 1.0
            length = _run_time(want, sum(1 << g for g in lease.gpus), d)
            seq += 1
            running[j], tok[j] = (now - done * length, length), seq
            heapq.heappush(timers, (now + (1.0 - done) * length, seq, j))

    def start(j: int, now: float) -> None:
        nonlocal seq
        running[j] = None
        kind, mask, need, d = segs[j][pos[j] % len(segs[j])]
        if kind == REQUEST:
            wanted = [g for g in range(gpus) if mask >> g & 1]
            _, events = table.request(j, Phase.ROLLOUT, wanted, now, min_gpus=need)
            on_events(events, now)
        elif kind == SHRINK and j in lease_of:
            lease = table.lease(lease_of[j])
            size = len(lease.gpus) if lease is not None else need
            on_events(table.shrink(lease_of[j], min(need, size), now), now)
            seq += 1
            running[j], tok[j] = (now, d), seq
            heapq.heappush(timers, (now + d, seq, j))
        else:
            seq += 1
            running[j], tok[j] = (now, d), seq
            heapq.heappush(timers, (now + d, seq, j))

    for j in range(n):
        start(j, 0.0)
    grow(0.0)
    while timers:
        now, s, j = heapq.heappop(timers)
        if s != tok[j]:
            continue
        pos[j] += 1
        running[j] = None
        if pos[j] >= total[j]:
            return _horizon(segs, pos, running, now)
        nxt, nmask, _, _ = segs[j][pos[j] % len(segs[j])]
        if j in lease_of and nxt == REQUEST:
            wanted = [g for g in range(gpus) if nmask >> g & 1]
            if table.can_switch(lease_of[j], wanted, now):
                _, events = table.switch(lease_of.pop(j), Phase.ROLLOUT, wanted, now)
                on_events(events, now)
                grow(now)
                continue
        if j in lease_of and nxt != SHRINK:
            on_events(table.release(lease_of.pop(j), now), now)
        start(j, now)
        grow(now)
    return (1.0,) * n
