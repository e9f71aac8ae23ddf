"""`complementary`: slurmrl's default pairing policy.

Scores every candidate group with `policies.complementarity.predict` (the design's
T = max(P1, P2, a1 + a2) formula on profile quantiles, refined by simulating the slice
policy on the profiles where a formula does not hold) and places jobs:

- `--rl-mux=off` jobs run dedicated;
- a single waiting job joins the first existing pool that accepts it (first-fit), or
  the best one with `single="best-fit"`;
- a batch is placed by maximum-weight matching (`networkx.max_weight_matching`, integer
  weights = GPU-seconds saved per second x 1000) over waiting-waiting edges (a new
  shared pool) and waiting-pool edges (join an open pool, which makes groups of three
  and more where `max_group` and the site allow and they pay);
- a job with no partner opens a pool alone at once (it never waits for a partner); it
  waits only when Slurm has no GPUs for it, and later arrivals may join its pool.

A group is accepted only if every member's predicted slowdown stays under its limit
(its --rl-max-slowdown, capped by the site's) divided by `margin`, the parked state fits
host memory, and partition, GPU type, GPU count and GPU-set split agree.

Known limits: large batches are pruned to the `neighbours` nearest jobs by period
before matching (matching is O(n^3)); a job is matched once per round.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import networkx as nx

from policies.base import (
    Action,
    ClusterSnapshot,
    JobSnapshot,
    Placement,
    PoolMode,
    PoolSnapshot,
    SiteLimits,
)
from policies.complementarity import (
    GroupPrediction,
    compatible,
    fits_memory,
    limit_of,
    period_of,
    predict,
    shareable,
)

#: graph node kinds: (JOB, job id), (POOL, pool id). Integers, not strings: a string's
#: hash changes with the process's hash seed, and networkx iterates sets of nodes, so
#: string-labelled nodes made tied placements differ from one run to the next
JOB, POOL = 0, 1


class ComplementaryPairing:
    """Pairs jobs whose idle phases complement each other, within every slowdown limit."""

    name = "complementary"
    mode = PoolMode.LEASE

    def __init__(self, margin: float = 1.0, min_gain: float = 0.05, max_group: int = 3,
                 single: str = "first-fit", neighbours: int = 8) -> None:
        if margin < 1.0:
            raise ValueError(f"margin must be >= 1, got {margin}")
        if single not in ("first-fit", "best-fit"):
            raise ValueError(f"single must be 'first-fit' or 'best-fit', got {single!r}")
        if max_group < 1:
            raise ValueError(f"max_group must be >= 1, got {max_group}")
        self.margin, self.min_gain, self.max_group = margin, min_gain, max_group
        self.single, self.neighbours = single, neighbours

    # -- scoring -------------------------------------------------------------------
    def accepts(self, members: Sequence[JobSnapshot], limits: SiteLimits,
                pool: PoolSnapshot | None = None) -> GroupPrediction | None:
        """The prediction if `members` may share one pool, else None."""
        if len(members) > min(self.max_group, limits.max_jobs_per_pool):
            return None
        first = members[0]
        if any(compatible(first, m) for m in members[1:]) or not all(map(shareable, members)):
            return None
        if fits_memory(members, pool, limits) is not None:
            return None
        bound = min(limit_of(m, limits) for m in members) / self.margin
        pred = predict(members, bound=bound)
        for m, s in zip(members, pred.slowdowns, strict=True):
            if s > limit_of(m, limits) / self.margin:
                return None
        return pred if pred.gain() >= self.min_gain * (len(members) - 1) else None

    def _join_weight(self, job: JobSnapshot, pool: PoolSnapshot,
                     limits: SiteLimits) -> tuple[int, GroupPrediction] | None:
        if pool.dedicated or pool.closed or not pool.members:
            return None
        if pool.partition != job.partition or pool.gpus != job.request.gpus:
            return None
        pred = self.accepts((*pool.members, job), limits, pool)
        if pred is None:
            return None
        before = predict(pool.members).gain() if len(pool.members) > 1 else 0.0
        return int(1000 * (pred.gain() - before) * pool.gpus) + 1, pred

    # -- placing -------------------------------------------------------------------
    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        limits = snapshot.limits
        free = defaultdict(int, snapshot.free_gpus)
        out: dict[int, Placement] = {}
        shared = [j for j in snapshot.waiting if shareable(j)]
        joins: dict[int, tuple[int, GroupPrediction]] = {}
        pairs: list[tuple[JobSnapshot, JobSnapshot, GroupPrediction]] = []
        if len(shared) == 1 and self.single == "first-fit":
            job = shared[0]
            for pool in sorted(snapshot.pools, key=lambda p: p.pool_id):
                w = self._join_weight(job, pool, limits)
                if w is not None:
                    joins[job.job_id] = (pool.pool_id, w[1])
                    break
        elif shared:
            joins, pairs = self._match(shared, snapshot.pools, limits)
        next_pool = -1
        placed: set[int] = set()
        for a, b, pred in pairs:
            g = a.request.gpus
            if free[a.partition] >= g:
                free[a.partition] -= g
                for j, s in zip((a, b), pred.slowdowns, strict=True):
                    out[j.job_id] = Placement(j.job_id, Action.OPEN, next_pool, g, s,
                                              f"paired (pool utilisation {pred.utilisation:.0%})")
                    placed.add(j.job_id)
                next_pool -= 1
        for job in snapshot.waiting:
            if job.job_id in placed:
                continue
            if job.job_id in joins:
                pool_id, pred = joins[job.job_id]
                out[job.job_id] = Placement(job.job_id, Action.JOIN, pool_id, None,
                                            pred.slowdowns[-1], "joins a complementary pool")
                continue
            g = job.request.gpus
            if free[job.partition] < g:
                out[job.job_id] = Placement(job.job_id, Action.WAIT, reason="no free GPUs")
                continue
            free[job.partition] -= g
            if shareable(job):
                out[job.job_id] = Placement(job.job_id, Action.OPEN, next_pool, g, 1.0,
                                            "no complementary partner yet: opens a pool alone")
                next_pool -= 1
            else:
                out[job.job_id] = Placement(job.job_id, Action.DEDICATED, None, g, 1.0,
                                            "--rl-mux=off")
        return [out[j.job_id] for j in snapshot.waiting]

    def _match(self, jobs: list[JobSnapshot], pools: Sequence[PoolSnapshot], limits: SiteLimits,
               ) -> tuple[dict[int, tuple[int, GroupPrediction]],
                          list[tuple[JobSnapshot, JobSnapshot, GroupPrediction]]]:
        graph = nx.Graph()
        preds: dict[tuple[int, int, int, int], GroupPrediction] = {}
        by_bucket: dict[tuple[object, ...], list[JobSnapshot]] = defaultdict(list)
        for j in jobs:
            r = j.request
            by_bucket[(j.partition, j.gpu_type, r.gpus, r.layout, r.rollout_gpus)].append(j)
            for pool in pools:
                w = self._join_weight(j, pool, limits)
                if w is not None:
                    graph.add_edge((JOB, j.job_id), (POOL, pool.pool_id), weight=w[0])
                    preds[(JOB, j.job_id, POOL, pool.pool_id)] = w[1]
        for bucket in by_bucket.values():
            bucket.sort(key=period_of)
            for i, a in enumerate(bucket):
                for b in bucket[i + 1:i + 1 + self.neighbours]:
                    pred = self.accepts((a, b), limits)
                    if pred is not None:
                        weight = int(1000 * pred.gain() * a.request.gpus) + 1
                        graph.add_edge((JOB, a.job_id), (JOB, b.job_id), weight=weight)
                        preds[(JOB, a.job_id, JOB, b.job_id)] = pred
        # matching is superlinear in the graph's size: match each connected component
        # (a bucket, with the pools its jobs may join) on its own; same result
        matching: set[tuple[tuple[int, int], tuple[int, int]]] = set()
        for comp in nx.connected_components(graph):
            # a copy: the view's filtered lookups cost ~3x in the matching's inner loop
            matching |= nx.max_weight_matching(graph.subgraph(comp).copy())
        by_id = {j.job_id: j for j in jobs}
        joins: dict[int, tuple[int, GroupPrediction]] = {}
        pairs = []
        for u, v in sorted(matching):
            if u[0] == POOL:
                u, v = v, u
            if v[0] == POOL:
                joins[u[1]] = (v[1], preds[(JOB, u[1], POOL, v[1])])
            else:
                key = (JOB, u[1], JOB, v[1])
                x, y = (u, v) if key in preds else (v, u)
                pairs.append((by_id[x[1]], by_id[y[1]], preds[(JOB, x[1], JOB, y[1])]))
        pairs.sort(key=lambda t: (min(t[0].submitted_at, t[1].submitted_at),
                                  min(t[0].job_id, t[1].job_id)))
        return joins, pairs
