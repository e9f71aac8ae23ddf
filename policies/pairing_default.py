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
  waits only when Slurm has no GPUs for it, and later arrivals may join its pool; a
  pair the matching chose that finds no free GPUs is not formed (a staggered one that
  finds its members' G GPUs free shares one window of G, where that is accepted too),
  and each of its jobs joins the best open pool it may join that no other job joins
  this round;
- jobs take free GPUs oldest first (submitted_at, job_id), a pair at its older
  member's turn: a younger pair or floating job never takes the GPUs an older job fits
  in, which would leave it waiting (the controller submits no pool for it to Slurm);
- a job the predictor cannot score (`complementarity.unusable`: a GPU count under one,
  a profile's duration that is not finite, ...) waits, its placement's reason saying
  why, and nobody joins a pool holding one: the others are placed as usual;
- a group is accepted only where every two of its members may share (`compatible` is
  not transitive: a colocated job shares with disaggregated jobs of two splits that do
  not share with each other);
- two colocated jobs of G GPUs may share a *staggered* pool of G + s GPUs, one on GPUs
  0..G-1, the other on s..G+s-1, where that saves more: a shrunk rollout tail keeps the
  GPUs outside the other's window (`LeaseTable.shrink`), so each can train while the
  other's tail runs. On one window a tail blocks the partner's training, which caps
  colocated pairs far above 1.15 (docs/benchmarks.md). The pool must fit one node
  (`ClusterSnapshot.node_gpus`; none where the node size is unknown): a window across
  two nodes would run its tensor-parallel groups and training collectives over the
  network. (Jobs of whole nodes shifted by a node, in a pool of G + node GPUs, were
  measured and lost GPU-hours: docs/benchmarks.md.)

- where the cluster offers floating pools (`ClusterSnapshot.floating`: the controller
  where the site sets `slurm.floating_pools`, the simulator's `SimConfig.floating`), a
  colocated job that may share goes to one instead (`_floating_round`): it joins the
  pool where every member is predicted within its limit (`predict_floating`, tails held
  on their window unless `ClusterSnapshot.packs_tails`; whole-run credit from
  `floating_lifetime`) without adding a window, the fullest first; else one where it
  adds a window (never more windows than members); else it opens one of one window,
  except where tails are held and three jobs like it would not share two windows
  within its limit (`_floating_pays`): such a floating pool would only ever grow a
  window per member, so the job is placed as with fixed windows instead. At most
  `floating_members` jobs a pool, capped by the site's `max_jobs_per_pool`. A job whose
  floating pool is not predicted within its limit but whose staggered fixed pool fits
  the node and is (`_prefers_staggered`) is placed as with fixed windows too: per job,
  the kind of pool that suits its phases (gaps: floating; a long tail: staggered).

A group is accepted only if every member's slowdown stays under its limit (its
--rl-max-slowdown, capped by the site's) divided by `margin`, the parked state fits host
memory, and `--rl-group`, partition, GPU type, GPU count and GPU-set split agree
(`complementarity.compatible`); with `max_load`, also only if its members' GPU duty
cycles on the busier set sum to at most that (`complementarity.group_load`): a site's
cap on groups that share only by slowing their members (off by default;
docs/benchmarks.md measures both). With `max_load_when = "light-present"` the cap binds
only in a round whose snapshot holds a shareable job of at most half that load (one a
job like itself could join within the cap); where every job is heavy, heavy groups form
as without it. The slowdown judged is the member's whole run's
(`complementarity.lifetime`) where its `--rl-steps` and observed steps say how much work
it has left: a job that ran alone for most of its run may take a partner that slows it
more than its limit for the rest, as long as its run as a whole stays within it, and a
newcomer that declared its steps may join it beyond its own limit for the time they
share. A job that ran so slowly that its run exceeds its
limit even alone from now is held to that instead (`complementarity.whole_run_limits`):
it takes a partner that does not make its run worse. A newcomer that gave no
--rl-profile is predicted with the profile of a group member of its model and GPU
count (observed, else that member's --rl-profile: `complementarity.peer_of`), scaled
to the short and the long end of its own prior's period, widened to the shortest and
longest periods of the running jobs of its model and GPU count (`seen_periods`, this
round's: jobs of one model differ 2x in step length), each member's worse
slowdown of the two taken (`newcomer_views`, `worst`); the model-size prior only where no
member is such a peer. A newcomer that gave a --rl-profile is predicted on it at the
short and the long end of its period likewise (the period is the user's estimate), two
such newcomers at opposite ends.
Elsewhere (no `--rl-steps`, a job started with no complete
step seen, groups of three) it is the predicted slowdown while sharing.

Known limits: large batches are pruned to the `neighbours` nearest jobs by period
before matching (matching is O(n^3)), the nearest half for staggered pools (always
simulated), among the jobs it may share with (of its partition, GPU type, GPU count
and group; colocated, or disaggregated of its split: a colocated job's include every
split); a job is matched once per round; a staggered pool takes two members. The
floating path simulates every candidate pool for every job, uncached (a batch of 1,000
waiting jobs: about 2 s, docs/benchmarks.md).
"""

from __future__ import annotations

import bisect
import copy
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

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
    SeenPeriods,
    allowance,
    compatible,
    fits_memory,
    floating_lifetime,
    group_load,
    has_tail,
    lifetime,
    limit_of,
    newcomer_views,
    peer_of,
    period_of,
    predict,
    predict_floating,
    seen_periods,
    share_key,
    shareable,
    split_of,
    unusable,
    whole_run_limits,
    worst,
)
from policies.free import FreeGpus
from slurmrl.model import Layout

#: graph node kinds: (JOB, job id), (POOL, pool id). Integers, not strings: a string's
#: hash changes with the process's hash seed, and networkx iterates sets of nodes, so
#: string-labelled nodes made tied placements differ from one run to the next
JOB, POOL = 0, 1


def _age(job: JobSnapshot) -> tuple[float, int]:
    """What orders jobs oldest first: (submitted_at, job_id)."""
    return job.submitted_at, job.job_id


def _as_peer(job: JobSnapshot, members: Sequence[JobSnapshot]) -> JobSnapshot:
    """The job as the floating predictor sees it: a newcomer that gave no --rl-profile
    and has completed no step takes the observed profile of the pool member of its
    model and GPU count that has completed the most steps, where there is one (a job of
    the same model beside it says more of it than the model-size prior does); any other
    job as it is. Its whole-run slowdown is still judged on its own progress (none)."""
    peer = peer_of(job, members, declared=False)
    return job if peer is None else replace(job, profile=peer)


class ComplementaryPairing:
    """Pairs jobs whose idle phases complement each other, within every slowdown limit."""

    name = "complementary"
    mode = PoolMode.LEASE

    def __init__(self, margin: float = 1.0, min_gain: float = 0.05, max_group: int = 3,
                 single: str = "first-fit", neighbours: int = 8, stagger: int = 1,
                 open_staggered: bool = True, max_load: float | None = None,
                 max_load_when: str = "always", floating: bool = True,
                 floating_members: int = 5) -> None:
        if margin < 1.0:
            raise ValueError(f"margin must be >= 1, got {margin}")
        if single not in ("first-fit", "best-fit"):
            raise ValueError(f"single must be 'first-fit' or 'best-fit', got {single!r}")
        if max_group < 1:
            raise ValueError(f"max_group must be >= 1, got {max_group}")
        if stagger < 0:
            raise ValueError(f"stagger must be >= 0 GPUs, got {stagger}")
        if neighbours < 1:
            raise ValueError(f"neighbours must be >= 1, got {neighbours}")
        self.margin, self.min_gain, self.max_group = margin, min_gain, max_group
        self.single, self.neighbours, self.stagger = single, neighbours, stagger
        self.open_staggered = open_staggered
        if max_load is not None and max_load <= 0:
            raise ValueError(f"max_load must be > 0, got {max_load}")
        if max_load_when not in ("always", "light-present"):
            raise ValueError("max_load_when must be 'always' or 'light-present', "
                             f"got {max_load_when!r}")
        self.max_load, self.max_load_when = max_load, max_load_when
        if floating_members < 1:
            raise ValueError(f"floating_members must be >= 1, got {floating_members}")
        self.floating, self.floating_members = floating, floating_members
        #: the periods of running jobs by model and GPU count, this round's
        #: (`complementarity.seen_periods`): the ends a borrowing newcomer is judged at
        self.periods: SeenPeriods = {}

    # -- scoring -------------------------------------------------------------------
    def accepts(self, members: Sequence[JobSnapshot], limits: SiteLimits,
                pool: PoolSnapshot | None = None, offsets: Sequence[int] | None = None,
                pool_gpus: int | None = None, limit: float | None = None,
                ) -> GroupPrediction | None:
        """The prediction if `members` may share one pool (a staggered one: `pool_gpus`
        GPUs, member i from GPU offsets[i]), else None. `limit` replaces every member's
        own slowdown limit (a what-if; placements always use their own)."""
        if len(members) > min(self.max_group, limits.max_jobs_per_pool):
            return None
        # every two of them (`compatible` is not transitive: a colocated job may share
        # with disaggregated jobs of two splits that may not share with each other)
        if any(compatible(a, b) for a, b in itertools.combinations(members, 2)) or \
                not all(map(shareable, members)):
            return None
        if fits_memory(members, pool, limits) is not None:
            return None
        if self.max_load is not None and group_load(members) > self.max_load:
            return None
        lims = whole_run_limits(members, [(limit if limit is not None else limit_of(m, limits))
                                          / self.margin for m in members])
        bound = allowance(members, lims)

        def passes(p: GroupPrediction) -> bool:
            return all(s <= lim for lim, s in zip(lims, lifetime(members, p.slowdowns),
                                                  strict=True))

        pred: GroupPrediction | None = None
        # each view must pass, and then the worst of them (each member's worse slowdown,
        # which may come from different views: a newcomer's whole run rises with its
        # partner's slowdown too): a group the first view refuses is not simulated in
        # the second
        for view in newcomer_views(members, self.periods):
            got = predict(view, bound=bound, offsets=offsets, pool_gpus=pool_gpus)
            if not passes(got):
                return None
            pred = got if pred is None else worst([pred, got])
            if pred is not got and not passes(pred):
                return None
        assert pred is not None  # newcomer_views gives one view at least
        return pred if pred.gain() >= self.min_gain * (len(members) - 1) else None

    def staggerable(self, a: JobSnapshot, b: JobSnapshot) -> bool:
        """Whether `a` and `b` may share a staggered pool: colocated, same size, and
        both rollouts shrink through a tail (without one the extra GPU buys nothing)."""
        return (self.stagger > 0 and a.request.gpus > 1 and a.request.gpus == b.request.gpus
                and a.request.layout is Layout.COLOCATED
                and b.request.layout is Layout.COLOCATED and has_tail(a) and has_tail(b))

    def shift(self, gpus: int, node: int | None) -> int:
        """How far the second window of a staggered pool for jobs of `gpus` GPUs starts
        on nodes of `node` GPUs: `stagger` where the pool fits one node, else 0 (no
        staggered pool)."""
        ok = self.stagger > 0 and node is not None and 2 <= gpus <= node - self.stagger
        return self.stagger if ok else 0

    def pair(self, a: JobSnapshot, b: JobSnapshot, limits: SiteLimits, stagger: bool = True,
             limit: float | None = None, node: int | None = None,
             ) -> tuple[GroupPrediction, int] | None:
        """The better accepted pool for `a` and `b` (prediction, pool GPUs), if any;
        a staggered one only with `stagger` and where nodes of `node` GPUs allow one;
        `limit` as in `accepts`."""
        g = a.request.gpus
        best: tuple[GroupPrediction, int] | None = None
        same = self.accepts((a, b), limits, limit=limit)
        if same is not None:
            best = (same, g)
        s = self.shift(g, node) if stagger and self.staggerable(a, b) else 0
        if s:
            st = self.accepts((a, b), limits, offsets=(0, s), pool_gpus=g + s, limit=limit)
            if st is not None and (best is None or st.gain() > best[0].gain()):
                best = (st, g + s)
        return best

    def _alone_size(self, job: JobSnapshot, limits: SiteLimits, node: int | None) -> int:
        """GPUs of the pool a job opens alone: a staggered one (`open_staggered`) when a
        partner like itself would pay there within the site's cap on slowdown, so that a
        later arrival can join it. The cap, not the job's own limit: a partner joins
        only when both are predicted within their own limits, then, with the job's
        observed profile; on its prior alone the job would seldom qualify, and opening
        costs only the extra GPU while it waits (docs/benchmarks.md measures both). Where
        only G GPUs are free the job opens a pool of G (`_place_one`), not wait for G + s."""
        g = job.request.gpus
        # no staggered pool fits the node: nothing to predict (a pair with itself on one
        # window was simulated for each such job, a third of a batch's simulations)
        if (self.open_staggered and self.shift(g, node) and shareable(job)
                and self.staggerable(job, job)):
            got = self.pair(job, job, limits, limit=limits.max_slowdown, node=node)
            if got is not None and got[1] > g:
                return got[1]
        return g

    def _join_weight(self, job: JobSnapshot, pool: PoolSnapshot,
                     limits: SiteLimits) -> tuple[int, GroupPrediction, int] | None:
        """(matching weight, prediction, the job's first GPU) if it may join `pool`."""
        if pool.dedicated or pool.closed or not pool.members or pool.floating:
            return None
        g = job.request.gpus
        if pool.partition != job.partition or pool.gpus < g:
            return None
        offsets = pool.offsets or (0,) * len(pool.members)
        if pool.gpus == g and not any(offsets):
            pred = self.accepts((*pool.members, job), limits, pool)
            off = 0
        else:  # a staggered pool: one member left; the job takes the other window
            if len(pool.members) != 1 or not self.staggerable(pool.members[0], job):
                return None
            member, top = pool.members[0], pool.gpus - g
            if offsets[0] not in (0, top):
                return None
            off = top if offsets[0] == 0 else 0
            pred = self.accepts((member, job), limits, pool, offsets=(offsets[0], off),
                                pool_gpus=pool.gpus)
        if pred is None:
            return None
        before = predict(pool.members).gain() if len(pool.members) > 1 else 0.0
        return int(1000 * (pred.gain() - before) * g) + 1, pred, off

    # -- placing -------------------------------------------------------------------
    def light_present(self, snapshot: ClusterSnapshot) -> bool:
        """Whether the snapshot holds a shareable job, waiting or in a pool, whose own
        load is at most half of `max_load`: one that a job like itself could join within
        the cap, so a group above the cap would spend sharing on heavier jobs."""
        if self.max_load is None:
            return False
        jobs = itertools.chain(snapshot.waiting, *(p.members for p in snapshot.pools))
        return any(shareable(j) and group_load([j]) <= self.max_load / 2 for j in jobs)

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        # a job the predictor cannot score waits, and nobody joins a pool holding one:
        # the others are placed as usual, not the round failed for all
        bad = {j.job_id: why for j in snapshot.waiting if (why := unusable(j)) is not None}
        if bad or any(unusable(m) for p in snapshot.pools for m in p.members):
            ok = replace(snapshot, waiting=tuple(j for j in snapshot.waiting
                                                 if j.job_id not in bad),
                         pools=tuple(p for p in snapshot.pools
                                     if not any(unusable(m) for m in p.members)))
            placed = {p.job_id: p for p in self.place(ok)}
            placed.update((i, Placement(i, Action.WAIT, reason=f"job {i} cannot be scored: {why}"))
                          for i, why in bad.items())
            return [placed[j.job_id] for j in snapshot.waiting]
        this = copy.copy(self)  # this round's: the policy object is unchanged
        this.periods = seen_periods(snapshot.pools)
        if (self.max_load is not None and self.max_load_when == "light-present"
                and not self.light_present(snapshot)):
            this.max_load = None
        return this._place(snapshot)

    def floats(self, job: JobSnapshot, snapshot: ClusterSnapshot) -> bool:
        """Whether the job goes to a floating pool: a colocated job that may share, in a
        partition whose pools may float, with `floating` on, where a pool may hold three
        jobs or more (with two, it holds them on one window, as a fixed pool would, or
        on two, sharing nothing), and where two of its windows fit the most GPUs a
        floating pool may hold (`ClusterSnapshot.floating_max_gpus`: one node's, in the
        controller)."""
        bound = snapshot.floating_max_gpus.get(job.partition)
        return (self.floating and snapshot.floating.get(job.partition, False)
                and min(self.floating_members, snapshot.limits.max_jobs_per_pool) >= 3
                and (bound is None or 2 * job.request.gpus <= bound)
                and shareable(job) and job.request.layout is Layout.COLOCATED
                and not self._prefers_staggered(job, snapshot))

    def _prefers_staggered(self, job: JobSnapshot, snapshot: ClusterSnapshot) -> bool:
        """Whether the job should take a staggered fixed pool rather than float: where
        three jobs like it are not predicted within its own limit on two floating
        windows, but two like it are within the site's cap in a staggered pool that fits
        the node (`shift`). A job like it: its own profile, else that of a running job
        of its model (`_as_peer`), else the model-size prior. The cap for the staggered
        pair, as in `_alone_size`: a partner joins later only where both are predicted
        within their own limits, on profiles observed by then."""
        node = snapshot.node_gpus.get(job.partition)
        g = job.request.gpus
        s = self.shift(g, node)
        if not (self.staggerable(job, job) and s):
            return False
        job = _as_peer(job, [m for p in snapshot.pools for m in p.members])
        pred = predict_floating([job, job, job], 2,
                                pack_tails=snapshot.packs_tails.get(job.partition, False))
        if pred.max_slowdown <= limit_of(job, snapshot.limits) / self.margin:
            return False
        return self.accepts((job, job), snapshot.limits, offsets=(0, s), pool_gpus=g + s,
                            limit=snapshot.limits.max_slowdown) is not None

    def _floating_pays(self, job: JobSnapshot, limits: SiteLimits) -> bool:
        """Whether three jobs like this one, out of phase, would share two windows within
        its limit with their tails held (`predict_floating`): a floating pool of its
        kind could then ever hold more jobs than windows."""
        pred = predict_floating([job, job, job], 2, pack_tails=False, in_step=False)
        return max(pred.slowdowns) <= limit_of(job, limits) / self.margin

    def _floating_round(self, snapshot: ClusterSnapshot, free: FreeGpus,
                        ids: Iterator[int], memo: dict[tuple[object, ...], GroupPrediction],
                        ) -> Callable[[JobSnapshot], Placement | None]:
        """Places one job at a time in floating pools, those of `snapshot` and those it
        opens (ids from `ids`, GPUs from `free`): the job joins the floating pool where
        it is predicted to keep every member within its limit (`predict_floating`)
        without adding a window, the fullest first; else where it adds one window, the
        emptiest first (a pool never holds more windows than members, so that costs
        nothing against running alone and lets later joins share, and fuller pools keep
        their room for joins that add none); else it opens a pool of one window. None:
        place it as with fixed windows. `memo` keeps predictions for another round of
        the same snapshot."""
        limits = snapshot.limits
        cap = min(self.floating_members, limits.max_jobs_per_pool)
        #: pool id -> [GPUs, members, an open pool's snapshot (None: opened this round)]
        pools: dict[int, tuple[list[int], list[JobSnapshot], PoolSnapshot | None]] = {
            p.pool_id: ([p.gpus], list(p.members), p) for p in snapshot.pools
            if p.floating and not p.dedicated and not p.closed and p.members}

        def place(job: JobSnapshot) -> Placement | None:
            g, part = job.request.gpus, job.partition
            bound = snapshot.floating_max_gpus.get(part)
            best: tuple[tuple[int, int], int, int, GroupPrediction] | None = None
            for pid, (size, members, snap) in pools.items():
                if (len(members) >= cap or members[0].request.gpus != g
                        or members[0].partition != part
                        or any(compatible(job, m) for m in members)
                        or fits_memory([*members, job], snap, limits) is not None):
                    continue
                group = [*members, job]
                lims = whole_run_limits(group, [limit_of(m, limits) / self.margin
                                                for m in group], floating=True)
                windows = size[0] // g
                for w in (windows, windows + 1):
                    if (w > len(group) or (w > windows and not free.fits(job, g))
                            or (bound is not None and w * g > bound)):
                        break
                    key = (*(m.job_id for m in group), w)
                    if key not in memo:
                        memo[key] = predict_floating(
                            [*members, _as_peer(job, members)], w,
                            pack_tails=snapshot.packs_tails.get(part, False))
                    pred = memo[key]
                    whole = floating_lifetime(group, pred.slowdowns)
                    if all(x <= lim for x, lim in zip(whole, lims, strict=True)):
                        # no window added: the fullest pool; one added: the emptiest,
                        # keeping fuller pools' room for joins that add none
                        order = (w - windows, len(members) if w > windows else -len(members))
                        if best is None or order < best[0]:
                            best = (order, pid, w, pred)
                        break
            if best is not None:
                (added, _), pid, w, pred = best
                size, members, snap = pools[pid]
                if added:
                    free.take(job, g)
                size[0] = w * g
                members.append(job)
                return Placement(
                    job.job_id, Action.JOIN if snap is not None else Action.OPEN, pid, w * g,
                    pred.slowdowns[-1], f"joins a floating pool: {len(members)} jobs on "
                    f"{w} window{'s' if w > 1 else ''} of {g} GPUs", floating=True)
            if not snapshot.packs_tails.get(part, False) and not self._floating_pays(job,
                                                                                   limits):
                return None  # placed as with fixed windows
            if not free.take(job, g):
                return Placement(job.job_id, Action.WAIT, reason=free.wait(job, g))
            pid = next(ids)
            pools[pid] = ([g], [job], None)
            return Placement(job.job_id, Action.OPEN, pid, g, 1.0,
                             "opens a floating pool of one window", floating=True)

        return place

    def _place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        limits = snapshot.limits
        free = FreeGpus(snapshot)
        first_id = min([-1, *(p.pool_id - 1 for p in snapshot.pools)])
        ids = itertools.count(first_id, -1)  #: provisional ids of the pools opened
        memo: dict[tuple[object, ...], GroupPrediction] = {}
        # which jobs float: those a round of floating jobs alone would place (the rest
        # are placed as with fixed windows, and matched with the jobs that do not float)
        trial = self._floating_round(snapshot, FreeGpus(snapshot),
                                     itertools.count(first_id, -1), memo)
        floats = {j.job_id for j in snapshot.waiting
                  if self.floats(j, snapshot) and trial(j) is not None}
        place_floating = self._floating_round(snapshot, free, ids, memo)
        shared = [j for j in snapshot.waiting if shareable(j) and j.job_id not in floats]
        joins: dict[int, tuple[int, GroupPrediction, int]] = {}
        pairs: list[tuple[JobSnapshot, JobSnapshot, GroupPrediction, int]] = []
        #: job -> the pools it may join, best first: a job whose pair finds no free GPUs
        #: joins one of them instead of waiting
        others: dict[int, list[tuple[int, GroupPrediction, int]]] = {}
        if len(shared) == 1 and self.single == "first-fit":
            job = shared[0]
            for pool in sorted(snapshot.pools, key=lambda p: p.pool_id):
                w = self._join_weight(job, pool, limits)
                if w is not None:
                    joins[job.job_id] = (pool.pool_id, w[1], w[2])
                    break
        elif shared:
            joins, pairs, others = self._match(shared, snapshot.pools, limits,
                                               snapshot.node_gpus)
        joined = {pool_id for pool_id, _, _ in joins.values()}  #: one joiner a pool a round
        pair_of = {j.job_id: pair for pair in pairs for j in pair[:2]}
        out: dict[int, Placement] = {}
        # one pass, oldest first (a pair at its older member's turn): a job that fits
        # the free GPUs never waits while a younger one takes them
        for job in sorted(snapshot.waiting, key=_age):
            if job.job_id in out:
                continue  # opened with its older partner
            if job.job_id in floats:
                got = place_floating(job)
                if got is not None:
                    out[job.job_id] = got
                    continue
            pair = pair_of.get(job.job_id)
            if pair is not None:
                opened = self._open_pair(*pair, limits, free, ids)
                if opened:
                    out.update((p.job_id, p) for p in opened)
                    continue
                for j in pair[:2]:  # no GPUs for the pair: each may still join an open pool
                    del pair_of[j.job_id]
                    x = next((x for x in others.get(j.job_id, ()) if x[0] not in joined), None)
                    if x is not None:
                        joins[j.job_id] = x
                        joined.add(x[0])
            out[job.job_id] = self._place_one(job, joins.get(job.job_id), snapshot, free, ids)
        return [out[j.job_id] for j in snapshot.waiting]

    def _open_pair(self, a: JobSnapshot, b: JobSnapshot, pred: GroupPrediction, size: int,
                   limits: SiteLimits, free: FreeGpus, ids: Iterator[int],
                   ) -> tuple[Placement, ...]:
        """The placements of a matched pair in a new pool of `size` GPUs, if they are free
        (none else); where a staggered pool's are not but its members' G are, and the
        pair is accepted on one window of G, that pool."""
        g = a.request.gpus
        if free.fits(a, g) and not free.fits(a, size):
            same = self.accepts((a, b), limits)
            if same is not None:
                pred, size = same, g
        if not free.take(a, size):
            return ()
        pool_id = next(ids)
        how = "paired" if size == g else f"paired in a staggered pool of {size} GPUs"
        return tuple(Placement(j.job_id, Action.OPEN, pool_id, size, s,
                               f"{how} (pool utilisation {pred.utilisation:.0%})",
                               gpu_offset=off)
                     for j, s, off in zip((a, b), pred.slowdowns, (0, size - g), strict=True))

    def _place_one(self, job: JobSnapshot, join: tuple[int, GroupPrediction, int] | None,
                   snapshot: ClusterSnapshot, free: FreeGpus,
                   ids: Iterator[int]) -> Placement:
        """A job not paired this round: it joins the pool it was matched to (`join`),
        else opens one alone (runs dedicated with `--rl-mux=off`), else waits."""
        if join is not None:
            pool_id, pred, off = join
            return Placement(job.job_id, Action.JOIN, pool_id, None, pred.slowdowns[-1],
                             "joins a complementary pool", gpu_offset=off)
        g = job.request.gpus
        size = self._alone_size(job, snapshot.limits, snapshot.node_gpus.get(job.partition))
        if free.fits(job, g) and not free.fits(job, size):
            size = g  # no room for a staggered pool: one of its own size, not a wait
        if not free.take(job, size):
            return Placement(job.job_id, Action.WAIT, reason=free.wait(job, g))
        if shareable(job):
            return Placement(job.job_id, Action.OPEN, next(ids), size, 1.0,
                             "no complementary partner yet: opens a pool alone")
        return Placement(job.job_id, Action.DEDICATED, None, g, 1.0, "--rl-mux=off")

    def _match(self, jobs: list[JobSnapshot], pools: Sequence[PoolSnapshot], limits: SiteLimits,
               node_gpus: Mapping[str, int]) -> tuple[
                   dict[int, tuple[int, GroupPrediction, int]],
                   list[tuple[JobSnapshot, JobSnapshot, GroupPrediction, int]],
                   dict[int, list[tuple[int, GroupPrediction, int]]]]:
        """The matched joins (job -> pool, prediction, first GPU) and pairs, and every
        pool each job may join, best first."""
        graph = nx.Graph()
        weighed: dict[int, list[tuple[int, int, GroupPrediction, int]]] = defaultdict(list)
        #: edge -> (prediction, pool GPUs for a pair | the joiner's first GPU for a join)
        preds: dict[tuple[int, int, int, int], tuple[GroupPrediction, int]] = {}
        by_key: dict[tuple[object, ...], list[JobSnapshot]] = defaultdict(list)
        for j in jobs:
            # jobs of different keys never share (`compatible`): a key's own list keeps
            # a job's `neighbours` to jobs it may share with
            by_key[share_key(j)].append(j)
            for pool in pools:
                w = self._join_weight(j, pool, limits)
                if w is not None:
                    graph.add_edge((JOB, j.job_id), (POOL, pool.pool_id), weight=w[0])
                    preds[(JOB, j.job_id, POOL, pool.pool_id)] = (w[1], w[2])
                    weighed[j.job_id].append((-w[0], pool.pool_id, w[1], w[2]))
        for group in by_key.values():
            group.sort(key=period_of)
            # each job's `neighbours` next by period among those it may share with: a
            # colocated job shares with every job of its key, a disaggregated one with
            # colocated jobs and those of its own split (positions in `group`, sorted)
            split = [split_of(j) for j in group]
            mates: dict[tuple[int, int] | None, list[int]] = {None: list(range(len(group)))}
            for sp in dict.fromkeys(split):
                if sp is not None:
                    mates[sp] = [i for i, x in enumerate(split) if x is None or x == sp]
            for i, a in enumerate(group):
                after = mates[split[i]]
                k = bisect.bisect_right(after, i)
                for n, t in enumerate(after[k:k + self.neighbours]):
                    b = group[t]
                    # a staggered pool is simulated (no formula): the nearest half only
                    got = self.pair(a, b, limits, stagger=n < max(1, self.neighbours // 2),
                                    node=node_gpus.get(a.partition))
                    if got is not None:
                        weight = int(1000 * got[0].gain() * a.request.gpus) + 1
                        graph.add_edge((JOB, a.job_id), (JOB, b.job_id), weight=weight)
                        preds[(JOB, a.job_id, JOB, b.job_id)] = got
        # matching is superlinear in the graph's size: match each connected component
        # (a key's jobs, with the pools they may join) on its own; same result
        matching: set[tuple[tuple[int, int], tuple[int, int]]] = set()
        for comp in nx.connected_components(graph):
            # a copy: the view's filtered lookups cost ~3x in the matching's inner loop
            matching |= nx.max_weight_matching(graph.subgraph(comp).copy())
        by_id = {j.job_id: j for j in jobs}
        joins: dict[int, tuple[int, GroupPrediction, int]] = {}
        pairs = []
        for u, v in sorted(matching):
            if u[0] == POOL:
                u, v = v, u
            if v[0] == POOL:
                jp, off = preds[(JOB, u[1], POOL, v[1])]
                joins[u[1]] = (v[1], jp, off)
            else:
                key = (JOB, u[1], JOB, v[1])
                x, y = (u, v) if key in preds else (v, u)
                pp, size = preds[(JOB, x[1], JOB, y[1])]
                pairs.append((by_id[x[1]], by_id[y[1]], pp, size))
        pairs.sort(key=lambda t: min(_age(t[0]), _age(t[1])))
        others = {j: [(pid, p, off) for _, pid, p, off in sorted(ws, key=lambda x: x[:2])]
                  for j, ws in weighed.items()}
        return joins, pairs, others
