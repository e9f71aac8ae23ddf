"""Members floating over a pool's whole windows: a small event model, for predicting and
estimating floating pools (the default policy's `predict_floating`, benchmarks/floating.py;
the controller packs tails, `pack=True`, where rollouts run as one-GPU replicas).

Each member is a plan of segments (seconds, GPUs needed): 0 for a gap, the window size G
for a whole-set phase, fewer for a rollout's tail. A whole-set phase waits in FIFO order
for a wholly free window, preferring the one it used last, and pays `switch_s(i, j)` where
member j used that window last; consecutive GPU phases keep the GPUs they hold; a gap
gives them back. A tail either keeps its GPUs in its window (`pack=False`, the window
stays blocked) or moves to the fewest GPUs it needs, best fit over the pool's windows,
paying `move_s` plus `switch_s` of those GPUs' last whole-window holder (`pack=True`).
The pool holds min(windows, members still running) windows (it gives spare ones back).

Reported: every member's finish time and, at the first member's end, every member's
slowdown over the work it did by then (the segment in progress counted pro rata).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Plan = Sequence[tuple[float, int]]


@dataclass(frozen=True)
class FloatRun:
    finished: tuple[float, ...]  #: each member's end
    pool_gpu_s: float  #: GPU-seconds the pool held, windows given back as members end
    shared_slowdowns: tuple[float, ...]  #: at the first member's end, over work done


def simulate(plans: Sequence[Plan], g: int, windows: int, pack: bool = False,
             move_s: float = 0.0,
             switch_s: Callable[[int, int], float] = lambda i, j: 0.0) -> FloatRun:
    """Run every member's plan from t = 0 on `windows` windows of `g` GPUs."""
    n = len(plans)
    owner: list[list[int | None]] = [[None] * g for _ in range(windows)]
    nfree = [g] * windows  #: free GPUs of each window (the hot path's question)
    last: list[int | None] = [None] * windows  #: who held the whole window last
    held: list[tuple[int, tuple[int, ...]] | None] = [None] * n
    active = list(range(windows))  #: the windows the pool holds, ascending
    pos, done_s, finished = [0] * n, [0.0] * n, [0.0] * n
    began: list[float | None] = [None] * n  #: when the current segment's work began
    queue: list[int] = []
    events: list[tuple[float, int, int]] = []
    seq = itertools.count()
    alive, used, t_prev = n, 0.0, 0.0
    shared: tuple[float, ...] | None = None

    def free(w: int) -> list[int]:
        return [s for s in range(g) if owner[w][s] is None]

    def take(i: int, w: int, slots: Sequence[int]) -> None:
        got = tuple(slots)
        for s in got:
            owner[w][s] = i
        held[i] = (w, got)
        nfree[w] -= len(got)

    def drop(i: int) -> None:
        h = held[i]
        if h is not None:
            for s in h[1]:
                owner[h[0]][s] = None
            nfree[h[0]] += len(h[1])
            held[i] = None

    def serve(t: float) -> None:
        while queue:
            whole = [w for w in active if nfree[w] == g]
            if not whole:
                return
            i = queue.pop(0)
            w = next((x for x in whole if last[x] == i), whole[0])
            prev = last[w]
            cost = 0.0 if prev is None or prev == i else switch_s(i, prev)
            last[w] = i
            take(i, w, range(g))
            began[i] = t + cost
            heapq.heappush(events, (t + cost + plans[i][pos[i]][0], next(seq), i))
        while len(active) > max(alive, 1):  # spare windows go back to Slurm
            spare = [w for w in active if nfree[w] == g]
            if not spare:
                return
            active.remove(spare[-1])  # the highest wholly free window

    def start(i: int, t: float) -> None:
        seconds, need = plans[i][pos[i]]
        h = held[i]
        moved = 0.0
        if need == 0:
            drop(i)
        elif h is not None and len(h[1]) == need:
            pass  # the next phase on the GPUs it holds
        elif h is not None and not pack:  # a tail keeps `need` GPUs of its window
            drop(i)
            take(i, h[0], h[1][:need])
        else:  # a tail packs onto the fewest GPUs it needs, best fit (its own window on a
            # tie); a whole-set phase, or a part-set one with no room, waits for a window
            drop(i)
            mine = h[0] if h is not None else -1
            fits = [(nfree[w], w != mine, w) for w in active if nfree[w] >= need]
            if need >= g or not fits:
                began[i] = None
                queue.append(i)
                serve(t)
                return
            _, _, w = min(fits)
            if h is not None and w == h[0]:
                take(i, w, h[1][:need])
            else:
                take(i, w, free(w)[:need])
                prev = last[w]
                moved = move_s + (0.0 if prev is None or prev == i else switch_s(i, prev))
        began[i] = t + moved
        heapq.heappush(events, (t + moved + seconds, next(seq), i))
        serve(t)

    def _partial(j: int, ended: int, t: float) -> float:
        """Work member j did by `t` on its segment in progress (none if it waits)."""
        b = began[j]
        if j == ended or b is None:
            return 0.0
        return min(plans[j][pos[j]][0], max(0.0, t - b))

    for i in range(n):
        start(i, 0.0)
    while events:
        t, _, i = heapq.heappop(events)
        used += g * len(active) * (t - t_prev)
        t_prev = t
        done_s[i] += plans[i][pos[i]][0]
        pos[i] += 1
        if pos[i] < len(plans[i]):
            start(i, t)
            continue
        finished[i], alive = t, alive - 1
        if shared is None:
            shared = tuple(t / max(1e-12, done_s[j] + _partial(j, i, t)) for j in range(n))
        drop(i)
        serve(t)
    assert shared is not None
    return FloatRun(tuple(finished), used, shared)
