"""The discrete-event simulation: arrivals, Slurm queue, pools, leases, phases.

Events (a heapq on simulated time): a job arrives; a pairing round; a phase segment
ends; a rollout reaches its next tail point (its leases shrink) or gets grown GPUs
active (slurmrl/sim/elastic.py); a gang quantum ends. Every pool's GPUs
are sliced by a real `LeaseTable` with the real slice policy, jobs are placed by the real
pairing policy from a `ClusterSnapshot`, admitted by the real admission policy, and
`check_table` runs on the touched table after every event.

A join (or a second `OPEN` of one provisional pool) is enacted only where the pool still
takes the job, as the controller's guard does (`SlurmPools._joinable`): not dedicated,
not closed, fewer members than the site's `max_jobs_per_pool`, the job's window inside
the pool, members that may share (`complementarity.compatible`: `--rl-group`, GPU count,
layout split, `--rl-mux=off`), the parked state of all its members within
`SimConfig.host_mem_per_pool_bytes`. A refused job
opens a pool of its own (it never waits for a partner) and is listed in
`Simulation.refused`, so a policy that ignores a constraint gains nothing from it.
Pairing policies with fixed groups (`policies.base.fixed_group`) have a pool marked
`PoolSnapshot.closed` once it has had that many members. A policy's output is read as
members of its enums (`PoolMode`, `Action`, `Verdict`: the plain string of one taken as
it, any other value a `SimError` naming the policy), and a `place` or `admit` that
raises is a `SimError` naming the policy (a slice policy's `order`, called by the lease
table, is named by `slurmrl simulate` from the traceback).

Pool modes (`PoolMode`):
LEASE (phase leases; a rollout starts on >= half its set, asks for the rest with a second
lease on the missing GPUs (`min_gpus=1`, queued under the slice policy like any request)
and grows as they free, then gives GPUs back through its tail),
LOCK (each GPU phase locks the whole pool, no shrink), GANG (whole-pool time quanta of
the pairing policy's `quantum_s`, the job frozen outside its quantum, memory held).

A pool may be larger than its members (a staggered pool: the pairing policy gives each
member's first GPU in `Placement.gpu_offset`); a member's leases stay within its window,
checked at every grant, and a shrinking lease keeps the GPUs the other windows cover
least (`LeaseTable.shrink`).

Profiles: each job's `ProfileBuilder` sees its phases as the controller would (a
rollout's busy time weighted by the GPUs its lease kept) and starts from the job's
--rl-profile prior, or the model-size prior; until its own rollouts are observed, the
share of its set a rollout holds is learned from the jobs of the same model and size
observed so far (`SitePriors`, `SimConfig.learn_priors`).

Rollout speed is GPUs working / GPUs its still-active sequences need (capped at 1);
grown GPUs start working after the same handoff cost as any grant (RLix expands a
running rollout by adding workers and syncing weights only to them:
shared/research/prior-art.md).

Nodes: a staggered pool either fits one node or has every window on whole nodes
(`SimConfig.gpus_per_node`, checked at every placement); no window straddles a node.
A floating pool's windows are laid out as the controller allocates them
(`window_layout`): each within one node, a node's GPUs left over where the window size
does not divide it held by none, or a window of whole nodes; a window wider than a node
that is not whole nodes is refused (`SimError`), the one the controller could not run.

Floating pools (`SimConfig.floating`; benchmarks/floating.py), as the controller runs
them (site config `slurm.floating_pools`; with `pack_tails`, as it runs them with
one-GPU rollout replicas, `services.rollout_replica_gpus = 1`): the snapshot offers them to
the pairing policy (`ClusterSnapshot.floating`, `packs_tails`), and a pool floats where
a placement asks (`Placement.floating`). A pool of whole windows of its members' GPU
count G (colocated jobs, one G) lets each GPU phase take whichever window is wholly free
(`LeaseTable.request` options, the window the job used last first); a rollout starts on
a whole window and does not grow; with `SimConfig.pack_tails` a tail point moves its
sequences to the fewest GPUs they need, best fit anywhere in the pool
(`LeaseTable.pack_target`, then `move`: the controller's choice), working again after
`tail_move_s` plus the park and activate of whoever held those GPUs last. A join whose
placement asks for more GPUs than the pool has adds whole windows (Slurm allocations
beside it); windows wholly free while the pool has more windows than members go back
(`LeaseTable.retire`). Pool GPU-seconds are
accounted through the changes of size (`Pool.allocated_gpu_s`).

Known limits: nodes are not placed (a pool is interchangeable GPUs; no fragmentation of
nodes by pools smaller than one); no service start cost (dedicated runs pay it too);
requests are rebalanced onto grown GPUs at once.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from policies.base import (
    Action,
    Admission,
    AdmissionPolicy,
    ClusterSnapshot,
    JobSnapshot,
    NodeFree,
    PairingPolicy,
    Placement,
    PoolMode,
    PoolSnapshot,
    SiteLimits,
    SlicePolicy,
    Verdict,
    fixed_group,
)
from policies.complementarity import compatible
from slurmrl.leases.invariants import check_table
from slurmrl.leases.table import LeaseTable
from slurmrl.leases.types import Event, Grant, Moved, Released, Revoke, Shrunk
from slurmrl.model import Mux, Phase, RlRequest
from slurmrl.profiles import (
    ROLLOUT_PRIOR_GPU_SHARE,
    Profile,
    ProfileBuilder,
    SitePriors,
    prior_for_model,
    profile_from_prior,
)
from slurmrl.sim import costs, elastic
from slurmrl.sim.workload import DEFAULT_GPUS_PER_NODE, SimJob

PARTITION = "pools"


#: events that end or cut a lease (a tuple: a `|` union is built anew at each check)
_RETIRING = (Shrunk, Moved, Released, Revoke)


class SimError(RuntimeError):
    """The simulation reached an impossible state: a bug in a policy or the simulator."""


def _raised(kind: str, policy: Any, exc: Exception) -> SimError:
    """A policy's own exception, as one line naming the policy (raised `from` it)."""
    return SimError(f"{kind} policy {policy.name!r} raised {type(exc).__name__}: {exc}")


@dataclass
class JobRun:
    job: SimJob
    builder: ProfileBuilder
    admitted: bool = True
    reject_reason: str = ""
    dedicated: bool = False
    placed_at: float | None = None
    finished_at: float | None = None
    pool: Pool | None = None
    step: int = 0
    seg: int = 0
    token: int = 0
    lease_id: int | None = None
    #: a lease its next phase takes over at once (`LeaseTable.switch`, as a driver's
    #: `lease.switch(phase)`): its GPU phase ended and the next one runs on those GPUs
    switch_from: int | None = None
    seg_start: float = 0.0
    seg_due: float = 0.0  #: when the segment in progress ends (gaps, non-elastic phases)
    held_n: int = 0
    held_since: float = 0.0
    lease_gpu_s: float = 0.0  #: GPU-seconds of all its leases (the ledger's numerator)
    seg_gpu_s: float = 0.0
    handoffs: int = 0
    progress: float = 0.0  #: gang: solo-seconds done
    #: LEASE-mode rollout in progress: extra leases that grew it, the pending grow request,
    #: full-speed fraction done, when that was, GPUs the rollout needs now, next tail point
    grow_leases: list[int] = field(default_factory=list)
    grow_req: int | None = None
    roll_f: float = 0.0
    roll_t: float = 0.0
    roll_need: int = 0
    roll_i: int = 0
    roll_token: int = 0
    roll_gpus: int = 0  #: GPUs working on it (grown ones count once activated)
    #: GPU-seconds its rollout's lease held before it first gave GPUs back (the tail)
    roll_head_gpu_s: float | None = None
    solo_s: float = 0.0
    window: range | None = None  #: floating pools: the window it held last
    _profile: Profile | None = None

    def profile(self) -> Profile:
        if self._profile is None:
            self._profile = self.builder.build()
        return self._profile


@dataclass
class Pool:
    pool_id: int
    gpus: int
    table: LeaseTable
    mode: PoolMode
    dedicated: bool
    opened_at: float
    members: list[JobRun] = field(default_factory=list)
    history: list[JobRun] = field(default_factory=list)  #: every job that was a member
    last_holder: dict[int, int] = field(default_factory=dict)
    #: member -> its first pool GPU (a staggered pool is larger than its members)
    offset: dict[int, int] = field(default_factory=dict)
    resident: bool = True  #: every member fits GPU memory at once
    closed_at: float | None = None
    #: a floating pool's windows (`SimConfig.floating`), None for any other pool
    windows: list[range] | None = None
    gpu_s: float = 0.0  #: GPU-seconds allocated before its last change of size
    sized_at: float = 0.0  #: when it last changed size (opened, or windows added/retired)
    #: (when, GPUs from then on), from its opening: a floating pool's size changes
    sizes: list[tuple[float, int]] = field(default_factory=list)
    next_gpu: int = 0  #: the id past its newest GPU: an added window's are later ones
    gang_holder: JobRun | None = None
    gang_since: float = 0.0
    node: int | None = None  #: the node it is on (`SimConfig.nodes`), else None
    gang_token: int = 0

    def allocated_gpu_s(self) -> float:
        """GPU-seconds Slurm allocated to the pool, opened to closed (or to its last
        change of size while open)."""
        return self.gpu_s + self.gpus * ((self.closed_at or self.sized_at) - self.sized_at)

    def window_of(self, gpus: frozenset[int]) -> range | None:
        """The floating window holding any of `gpus`."""
        return next((w for w in self.windows or () if gpus & set(w)), None)


@dataclass(frozen=True)
class SimConfig:
    gpus: int
    gpu_mem_bytes: int = 80 * 2**30
    host_mem_per_pool_bytes: int | None = None
    limits: SiteLimits = field(default_factory=SiteLimits)
    elastic_min: float = 0.5  #: a rollout starts on at least this share of its set
    #: a rollout holding less than its set asks for the rest with a second lease
    #: (False: it stays on what it was granted, as the controller's one-engine rollouts)
    grow: bool = True
    #: grow as the controller does (`Lease.grow`): take only free GPUs no waiter asks
    #: for, asked again whenever GPUs of the pool free, instead of a queued request
    grow_free_only: bool = False
    #: jobs' priors: the share of its set a rollout holds (0.55: its tail shrinks; 1.0: it
    #: holds the set, as in the controller today: slurmrl.controller.placement)
    rollout_prior_gpu_share: float = ROLLOUT_PRIOR_GPU_SHARE
    #: learn the rollout share prior from the jobs observed so far, by model and size
    #: (`SitePriors`): every job's until its own rollouts are seen
    learn_priors: bool = True
    #: a what-if (benchmarks/what_if.py), not the designed system: a job with no
    #: --rl-profile takes as its prior the mean phase shares of the jobs of its model and
    #: size that completed a step (`SitePriors.phase_prior`), at the model-size period
    #: ("shares") or at their median period ("profile"); None: the model-size prior
    site_prior: Literal["shares", "profile"] | None = None
    check_invariants: bool = True
    #: GPUs per node: a staggered pool's windows may not straddle a node boundary
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    #: every job declares its step count (`--rl-steps`); False: none does
    declare_steps: bool = True
    #: pools of whole windows of their members' GPU count float (see the module's
    #: docstring); with `pack_tails` rollout tails pack onto the fewest GPUs anywhere in
    #: the pool, `tail_move_s` for the sequences' move
    floating: bool = False
    pack_tails: bool = False
    tail_move_s: float = 1.0
    #: a floating pool's windows may span nodes, as the controller's with
    #: `slurm.floating_across_nodes` (each job's state moving between nodes when its
    #: window changes, priced here as a park and an activate only); False: a floating
    #: pool holds at most one node's GPUs (`gpus_per_node`), the controller's default
    floating_across_nodes: bool = False
    #: every hand-off between two jobs parks one and activates the other, as the
    #: controller's default (`SlurmPools(park_others=True)`: an RL phase wants nearly
    #: all of a GPU's memory); False: where the members' models fit GPU memory together
    #: it costs a context switch (`costs.switch_s`), the designed system's price
    park_always: bool = False
    #: the cluster's GPUs are nodes of `gpus_per_node` (the last one the remainder), and
    #: a pool takes all of its GPUs from one node, best fit, as the controller's pools
    #: (one Slurm allocation on one node each); the policy is told each node's free
    #: GPUs (`ClusterSnapshot.free_node_gpus`), and a job larger than every node is
    #: refused. False: one bag of GPUs (the suite's figures). Not with `floating`
    nodes: bool = False


def window_layout(start: int, count: int, g: int, node: int) -> list[range]:
    """`count` floating windows of `g` GPUs numbered from pool GPU `start` on, laid out
    as the controller's are (each its own Slurm allocation, on the pool's node unless
    windows may span nodes): a window of at most a node's GPUs within one node (pool
    GPUs `k * node` .. `k * node + node - 1` are node k's), so that where `node % g` is
    not 0 the node's last `node % g` GPUs hold no window and the next window starts on
    the next node; a wider one on whole nodes (`g % node == 0`, checked by the caller)."""
    out: list[range] = []
    for _ in range(count):
        if g <= node and start % node + g > node:
            start += node - start % node  # the node's leftover GPUs: no window's
        out.append(range(start, start + g))
        start += g
    return out


class Simulation:
    """One run. `run()` returns the JobRuns and pools; see `slurmrl.sim.metrics`."""

    def __init__(self, jobs: list[SimJob], config: SimConfig, pairing: PairingPolicy,
                 slice_factory: Callable[[], SlicePolicy], admission: AdmissionPolicy,
                 progress: Callable[[float], None] | None = None) -> None:
        self.cfg, self.pairing, self.admission = config, pairing, admission
        self.slice_factory = slice_factory
        try:  # a member, compared by identity below ("lease" may come as the string)
            self.mode = PoolMode(pairing.mode)
        except ValueError:
            raise SimError(f"pairing policy {pairing.name!r} has mode {pairing.mode!r}; "
                           f"valid: {', '.join(PoolMode)}") from None
        #: members after which a pool takes no new one (the policy's fixed groups)
        self.group = fixed_group(pairing)
        self.quantum_s = 0.0
        if self.mode is PoolMode.GANG:
            q = getattr(pairing, "quantum_s", None)
            if isinstance(q, bool) or not isinstance(q, int | float) or not q > 0:
                raise SimError(f"pairing policy {pairing.name!r} forms gang pools but has "
                               f"no quantum_s > 0 (got {q!r})")
            self.quantum_s = float(q)
        self.runs = {j.job_id: JobRun(j, ProfileBuilder(
            prior=j.prior, rollout_gpu_share=config.rollout_prior_gpu_share), solo_s=j.solo_s())
                     for j in jobs}
        self.site = SitePriors(default_share=config.rollout_prior_gpu_share)
        if config.site_prior not in (None, "shares", "profile"):
            raise SimError(f"site_prior must be None, 'shares' or 'profile', got "
                           f"{config.site_prior!r}")
        self.free = config.gpus
        if config.nodes and config.floating:
            raise SimError("SimConfig.nodes and floating pools do not go together (a "
                           "floating pool's windows are laid out on nodes of their own)")
        #: each node's free GPUs (`SimConfig.nodes`), else None
        self.node_free: list[int] | None = None
        if config.nodes:
            whole, rest = divmod(config.gpus, config.gpus_per_node)
            self.node_free = [config.gpus_per_node] * whole + ([rest] if rest else [])
        self.node_size = list(self.node_free or ())
        self.pools: dict[int, Pool] = {}
        self.closed: list[Pool] = []
        self.waiting: list[JobRun] = []
        #: joins the pool refused (job id, pool id, why): the job opened its own
        self.refused: list[tuple[int, int, str]] = []
        self.heap: list[tuple[float, int, str, Any]] = []
        self._seq = itertools.count()
        self._pool_ids = itertools.count(1)
        self._pair_pending = False
        self.now = 0.0
        self.events = 0
        self.progress = progress
        self._left = len(jobs)
        for j in jobs:
            self._push(j.submit_s, "arrive", j.job_id)

    def _push(self, t: float, kind: str, data: Any) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), kind, data))

    # -- main loop -----------------------------------------------------------------
    def run(self, until: Callable[[Simulation], bool] | None = None) -> Simulation:
        """Run to the end; with `until`, stop after the first event at which it holds
        (jobs may then be unfinished: `work_done` says how far each got)."""
        total = len(self.runs)
        handlers: dict[str, Callable[[Any], None]] = {}
        while self.heap:
            t, _, kind, data = heapq.heappop(self.heap)
            self.now = t
            self.events += 1
            handler = handlers.get(kind)
            if handler is None:
                handler = handlers[kind] = getattr(self, f"_on_{kind}")
            handler(data)
            if self.progress is not None and self.events % 20000 == 0:
                self.progress(1.0 - self._left / total)
            if until is not None and until(self):
                return self
        unfinished = [r.job.job_id for r in self.runs.values()
                      if r.admitted and r.finished_at is None]
        if unfinished:
            raise SimError(f"jobs never finished: {unfinished[:10]}")
        return self

    def work_done(self, run: JobRun) -> float:
        """Solo seconds of the job's work done by now: its finished segments, plus the
        part of the one in progress done (a rollout: its full-speed fraction; a gap or
        a granted phase: the time since it began, after any handoff; a gang member: its
        quanta)."""
        j = run.job
        if run.finished_at is not None:
            return run.solo_s
        pool = run.pool
        if pool is None:
            return 0.0
        if pool.mode is PoolMode.GANG:
            held = self.now - pool.gang_since if pool.gang_holder is run else 0.0
            return min(run.solo_s, run.progress + held)
        done = sum(seg.seconds for step in j.steps[:run.step] for seg in step)
        done += sum(seg.seconds for seg in j.steps[run.step][:run.seg])
        phase, seconds = self._segment(run)
        if phase.needs_gpu and run.lease_id is None:
            return done  # waiting for its lease
        if phase is Phase.ROLLOUT and pool.mode is PoolMode.LEASE:
            speed = elastic.roll_speed(self, run)
            f = run.roll_f + max(0.0, self.now - run.roll_t) * speed / max(seconds, 1e-12)
            return done + min(1.0, f) * seconds
        return done + min(seconds, max(0.0, seconds - (run.seg_due - self.now)))

    def _check(self, pool: Pool) -> None:
        if self.cfg.check_invariants:
            check_table(pool.table)

    # -- arrivals and placement ----------------------------------------------------
    def _snapshot(self, run: JobRun) -> JobSnapshot:
        j = run.job
        mux = Mux.OFF if (j.mux_off or run.dedicated) else Mux.AUTO
        req = RlRequest(j.gpus, j.model, None, mux, j.group, j.max_slowdown, j.prior, j.layout,
                        j.rollout_gpus if j.rollout_gpus != j.gpus else None,
                        (j.declared_steps or len(j.steps)) if self.cfg.declare_steps
                        else None)
        share = self.cfg.rollout_prior_gpu_share
        if self.cfg.learn_priors and run.builder.observed_share(Phase.ROLLOUT) is None:
            share = self.site.rollout_share(j.model, j.rollout_gpus)
            if share != run.builder.rollout_gpu_share:
                run.builder.rollout_gpu_share, run._profile = share, None
        if j.prior is not None or run.builder.observations:
            prof = run.profile()
        else:  # what the policy would assume (complementarity.profile_of), at our share
            prior = prior_for_model(j.model, j.gpus)
            if self.cfg.site_prior is not None:
                step = prior.step_s if self.cfg.site_prior == "shares" else None
                prior = self.site.phase_prior(j.model, j.gpus, step) or prior
            prof = profile_from_prior(prior, rollout_gpu_share=share)
        running = 0.0 if run.placed_at is None else self.now - run.placed_at
        return JobSnapshot(j.job_id, j.user, req, prof, j.submit_s, PARTITION,
                           host_mem_bytes=costs.host_bytes(j), running_s=running)

    def _on_arrive(self, job_id: int) -> None:
        run = self.runs[job_id]
        try:
            verdict = self.admission.admit(self._snapshot(run), self.cfg.limits)
        except Exception as exc:
            raise _raised("admission", self.admission, exc) from exc
        if not isinstance(verdict.verdict, Verdict):
            verdict = self._verdict(job_id, verdict)
        if verdict.verdict is Verdict.REJECT:
            run.admitted, run.reject_reason = False, verdict.reason
            self._left -= 1
            return
        if run.job.gpus > self.cfg.gpus:  # admitted, but no pool could ever hold it
            raise SimError(f"job {job_id} needs {run.job.gpus} GPUs, the cluster has "
                           f"{self.cfg.gpus}")
        if self.node_size and run.job.gpus > max(self.node_size):
            # a pool is one node's GPUs: refused, as the controller refuses it
            run.admitted, run.reject_reason = False, (
                f"--rl-gpus={run.job.gpus} is more than any node has (the largest has "
                f"{max(self.node_size)}); a pool's GPUs are one node's")
            self._left -= 1
            return
        run.dedicated = verdict.verdict is Verdict.DEDICATED
        self.waiting.append(run)
        self._want_pairing()

    def _want_pairing(self) -> None:
        if self.waiting and not self._pair_pending:
            self._pair_pending = True
            self._push(self.now, "pair", None)  # after every event at this instant

    def _on_pair(self, _: None) -> None:
        self._pair_pending = False
        pools = tuple(
            PoolSnapshot(p.pool_id, p.gpus, tuple(self._snapshot(m) for m in p.members),
                         PARTITION, None, self.cfg.gpu_mem_bytes,
                         self._host_free(p), p.dedicated, self._closed(p),
                         offsets=tuple(p.offset[m.job.job_id] for m in p.members),
                         floating=p.windows is not None)
            for p in self.pools.values()
        )
        snap = ClusterSnapshot(self.now, pools, tuple(self._snapshot(r) for r in self.waiting),
                               {PARTITION: self.free}, self.cfg.limits,
                               {PARTITION: self.cfg.gpus_per_node},
                               {PARTITION: self.cfg.gpu_mem_bytes},
                               {PARTITION: self.cfg.floating},
                               {PARTITION: self.cfg.pack_tails},
                               {} if self.cfg.floating_across_nodes
                               else {PARTITION: self.cfg.gpus_per_node},
                               {} if self.node_free is None else {PARTITION: tuple(
                                   NodeFree(f, (("", n),), f"n{i}") for i, (f, n)
                                   in enumerate(zip(self.node_free, self.node_size,
                                                    strict=True)))})
        jobs = {j.job_id: j for j in itertools.chain(snap.waiting, *(p.members for p in pools))}
        try:  # a list: a generator would be spent by the check below
            placements = list(self.pairing.place(snap))
        except Exception as exc:
            raise _raised("pairing", self.pairing, exc) from exc
        placements = [pl if isinstance(pl.action, Action) else self._action(pl)
                      for pl in placements]
        if sorted(p.job_id for p in placements) != sorted(r.job.job_id for r in self.waiting):
            raise SimError(f"pairing policy {self.pairing.name!r} must place every waiting job")
        new: dict[int, Pool] = {}
        touched: dict[int, Pool] = {}
        still: list[JobRun] = []
        for pl in placements:
            run = self.runs[pl.job_id]
            if pl.action is Action.WAIT:
                still.append(run)
                continue
            pool: Pool | None = None
            if pl.action is Action.JOIN:
                pool = self.pools.get(pl.pool_id if pl.pool_id is not None else 0)
                if pool is None:
                    raise SimError(
                        f"pairing policy {self.pairing.name!r} told job {pl.job_id} to join "
                        f"unknown pool {pl.pool_id}" + (" (a provisional id: jobs share a "
                        "new pool by OPENs of the same id)" if (pl.pool_id or 0) < 0 else ""))
            elif pl.action is Action.OPEN and pl.pool_id in new:
                pool = new[pl.pool_id]
            if pool is not None:
                why = self._refusal(pool, run, pl.gpu_offset, jobs)
                if why is not None:  # never wait for a partner: open alone instead
                    self.refused.append((run.job.job_id, pool.pool_id, why))
                    pool = None
            if (pool is not None and pool.windows is not None and (pl.gpus or 0) > pool.gpus
                    and not self._grow_pool(pool, (pl.gpus or 0) - pool.gpus)):
                still.append(run)  # Slurm would queue the extra windows
                continue
            if pool is None:
                size = max(pl.gpus or 0, pl.gpu_offset + run.job.gpus)
                if self.free < size or self._node_for(size) is None:
                    still.append(run)  # the policy over-allocated: Slurm would queue it
                    continue
                pool = self._open(size, pl.action is Action.DEDICATED or run.dedicated, run,
                                  pl.floating)
                if pl.action is Action.OPEN and pl.pool_id is not None:
                    new[pl.pool_id] = pool
            if not 0 <= pl.gpu_offset <= pool.gpus - run.job.gpus:
                raise SimError(f"job {pl.job_id} ({run.job.gpus} GPUs from GPU "
                               f"{pl.gpu_offset}) does not fit pool {pool.pool_id} "
                               f"of {pool.gpus} GPUs")
            node = self.cfg.gpus_per_node
            if pool.windows is not None:
                pass  # whole windows, aligned (checked when the pool opened)
            elif pool.gpus > run.job.gpus and pool.gpus > node and (
                    pool.gpus % node or pl.gpu_offset % node or run.job.gpus % node):
                raise SimError(f"job {pl.job_id} ({run.job.gpus} GPUs from GPU "
                               f"{pl.gpu_offset}) in pool {pool.pool_id} of {pool.gpus} "
                               f"GPUs would straddle nodes of {node} GPUs")
            self._add(pool, run, pl.gpu_offset)
            touched[pool.pool_id] = pool
        self.waiting = still
        for pool in touched.values():  # windows more than members go back at once
            self._retire_spare(pool)

    def _action(self, pl: Placement) -> Placement:
        """`pl` with its action a member (a policy may give the plain string)."""
        try:
            return replace(pl, action=Action(pl.action))
        except ValueError:
            raise SimError(f"pairing policy {self.pairing.name!r} gave job {pl.job_id} "
                           f"action {pl.action!r}; valid: {', '.join(Action)}") from None

    def _verdict(self, job_id: int, adm: Admission) -> Admission:
        """`adm` with its verdict a member (a policy may give the plain string)."""
        try:
            return replace(adm, verdict=Verdict(adm.verdict))
        except ValueError:
            raise SimError(f"admission policy {self.admission.name!r} gave job {job_id} "
                           f"verdict {adm.verdict!r}; valid: {', '.join(Verdict)}") from None

    def _closed(self, pool: Pool) -> bool:
        """Whether the pool takes no new member: its fixed group was complete."""
        return self.group is not None and len(pool.history) >= self.group

    def _refusal(self, pool: Pool, run: JobRun, offset: int,
                 jobs: dict[int, JobSnapshot]) -> str | None:
        """Why `run` may not join `pool` from GPU `offset` now (see the module's
        docstring), or None; `jobs`: this round's snapshots by job id."""
        members = pool.members
        if pool.dedicated:
            return "the pool is dedicated"
        if self._closed(pool):
            return f"its group of {self.group} is fixed"
        if len(members) >= self.cfg.limits.max_jobs_per_pool:
            return f"it has {len(members)} members, the site's most (max_jobs_per_pool)"
        if not 0 <= offset <= pool.gpus - run.job.gpus:
            return (f"{run.job.gpus} GPUs from GPU {offset} do not fit its {pool.gpus} "
                    "GPUs")
        if pool.windows is not None and (run.job.gpus != len(pool.windows[0])
                                         or run.job.rollout_gpus != run.job.gpus):
            return f"its windows are {len(pool.windows[0])} GPUs for colocated jobs"
        me = jobs[run.job.job_id]
        why = next((w for m in members if (w := compatible(me, jobs[m.job.job_id]))), None)
        if why is not None:
            return why
        cap = self.cfg.host_mem_per_pool_bytes
        need = sum(costs.host_bytes(m.job) for m in (*members, run))
        if cap is not None and need > cap:
            return (f"parked state needs {need / 2**30:.0f} GiB host memory, "
                    f"{cap / 2**30:.0f} per pool")
        return None

    def _host_free(self, pool: Pool) -> int | None:
        cap = self.cfg.host_mem_per_pool_bytes
        return None if cap is None else cap - sum(costs.host_bytes(m.job) for m in pool.members)

    def _open(self, gpus: int, dedicated: bool, run: JobRun | None = None,
              floating: bool = False) -> Pool:
        """A new pool of `gpus` GPUs; a floating one (whole windows of the job's GPU
        count, laid out on nodes by `window_layout`) where the placement asks for one
        (`Placement.floating`) and the run lets pools float (`SimConfig.floating`)."""
        pid = next(self._pool_ids)
        g = run.job.gpus if run is not None else 0
        windows: list[range] | None = None
        if (self.cfg.floating and floating and self.mode is PoolMode.LEASE and not dedicated
                and run is not None and run.job.rollout_gpus == g and gpus % g == 0):
            node = self.cfg.gpus_per_node
            if g > node and g % node:
                raise SimError(f"a floating window of {g} GPUs would straddle nodes of "
                               f"{node} GPUs (each window is one Slurm allocation: "
                               "within one node, or of whole nodes)")
            if not self.cfg.floating_across_nodes and gpus > node:
                raise SimError(f"a floating pool of {gpus} GPUs would span nodes of {node} "
                               "GPUs (its windows share one node; "
                               "SimConfig.floating_across_nodes lifts that)")
            windows = window_layout(0, gpus // g, g, node)
        held = range(gpus) if windows is None else sorted(set().union(*windows))
        table = LeaseTable(pid, held, self.slice_factory(), lease_timeout_s=1e15)
        pool = Pool(pid, gpus, table, self.mode, dedicated, self.now, sized_at=self.now,
                    next_gpu=gpus if windows is None else windows[-1].stop,
                    sizes=[(self.now, gpus)], windows=windows)
        self.pools[pid] = pool
        self.free -= gpus
        if self.node_free is not None:
            on = self._node_for(gpus)
            if on is None:
                raise SimError(f"no node has {gpus} GPUs free for pool {pid}")
            pool.node = on
            self.node_free[on] -= gpus
        return pool

    def _node_for(self, gpus: int) -> int | None:
        """The node a new pool of `gpus` GPUs goes to: the one with the fewest free that
        has them (best fit, as `policies.free.FreeGpus` counts them); None where none
        has (without `SimConfig.nodes`: 0, one bag of GPUs)."""
        if self.node_free is None:
            return 0
        fit = [i for i, f in enumerate(self.node_free) if f >= gpus]
        return min(fit, key=self.node_free.__getitem__) if fit else None

    def _resize(self, pool: Pool, gpus: int) -> None:
        pool.gpu_s += pool.gpus * (self.now - pool.sized_at)
        pool.sized_at = self.now
        self.free += pool.gpus - gpus
        pool.gpus = gpus
        pool.sizes.append((self.now, gpus))

    def _grow_pool(self, pool: Pool, gpus: int) -> bool:
        """Add whole windows to a floating pool (False: not that many GPUs free)."""
        assert pool.windows is not None
        g = len(pool.windows[0])
        if gpus % g:
            raise SimError(f"pool {pool.pool_id} grows by whole windows of {g} GPUs, "
                           f"asked {gpus}")
        if not self.cfg.floating_across_nodes and pool.gpus + gpus > self.cfg.gpus_per_node:
            raise SimError(f"floating pool {pool.pool_id} would hold {pool.gpus + gpus} GPUs, "
                           f"more than a node's {self.cfg.gpus_per_node} (its windows share "
                           "one node; SimConfig.floating_across_nodes lifts that)")
        if self.free < gpus:
            return False
        new = window_layout(pool.next_gpu, gpus // g, g, self.cfg.gpus_per_node)
        pool.next_gpu = new[-1].stop
        self._resize(pool, pool.gpus + gpus)
        pool.windows.extend(new)
        self._handle(pool, pool.table.add_gpus(set().union(*new), self.now))
        return True

    def _retire_spare(self, pool: Pool) -> None:
        """Give back wholly free windows while a floating pool has more than members."""
        if pool.windows is None or pool.closed_at is not None:
            return
        held: set[int] = set().union(*(le.gpus for le in pool.table.leases))
        while len(pool.windows) > max(1, len(pool.members)):
            spare = [w for w in pool.windows if not held & set(w)]
            if not spare:
                return
            w = spare[-1]
            pool.windows.remove(w)
            self._resize(pool, pool.gpus - len(w))
            self._handle(pool, pool.table.retire(w, self.now))

    def _add(self, pool: Pool, run: JobRun, offset: int = 0) -> None:
        run.pool, run.placed_at = pool, self.now
        pool.members.append(run)
        pool.history.append(run)
        pool.offset[run.job.job_id] = offset
        pool.resident = not self.cfg.park_always and costs.fits_together(
            [m.job for m in pool.members], self.cfg.gpu_mem_bytes)
        # the slice policy sees the limit admission and pairing take (the site's cap)
        pool.table.set_member(run.job.job_id, self.cfg.limits.limit_for(run.job.max_slowdown),
                              range(offset, offset + run.job.gpus) if pool.windows is None
                              else None)
        if pool.mode is PoolMode.GANG:
            if pool.gang_holder is None:
                self._gang_next(pool)
        else:
            self._start_segment(run)

    # -- phases --------------------------------------------------------------------
    def _segment(self, run: JobRun) -> tuple[Phase, float]:
        s = run.job.steps[run.step][run.seg]
        return s.phase, s.seconds

    def _switches(self, pool: Pool, run: JobRun, lease_id: int) -> bool:
        """Whether the driver switches the ending lease to the job's next segment
        (`LeaseTable.switch`: train -> sync on the GPUs it holds) instead of releasing
        it and queueing behind a partner's phase for GPUs it had: the next segment is a
        GPU phase and the table allows the switch (`LeaseTable.can_switch`)."""
        step, seg = run.step, run.seg + 1
        if seg == len(run.job.steps[step]):
            step, seg = step + 1, 0
        if step == len(run.job.steps) or pool.mode is not PoolMode.LEASE:
            return False
        nxt = run.job.steps[step][seg].phase
        return nxt.needs_gpu and pool.table.can_switch(lease_id, self._gpus_for(run, nxt),
                                                       self.now)

    def _start_segment(self, run: JobRun) -> None:
        pool = run.pool
        assert pool is not None
        phase, seconds = self._segment(run)
        run.token += 1
        run.seg_start = self.now
        if run.switch_from is not None:
            lid, run.switch_from = run.switch_from, None
            _, events = pool.table.switch(lid, phase, self._gpus_for(run, phase), self.now)
            self._handle(pool, events)
            return
        if not phase.needs_gpu:
            run.seg_due = self.now + seconds
            self._push(run.seg_due, "seg_end", (run.job.job_id, run.token))
            return
        if pool.windows is not None:  # any whole window, the one it used last first
            order = sorted(pool.windows, key=lambda w: w != run.window)
            _, events = pool.table.request(run.job.job_id, phase,
                                           frozenset().union(*map(frozenset, order)),
                                           self.now, options=order)
            self._handle(pool, events)
            return
        gpus = self._gpus_for(run, phase)
        need = len(gpus)
        if phase is Phase.ROLLOUT and pool.mode is PoolMode.LEASE:
            need = max(1, int(len(gpus) * self.cfg.elastic_min))
        _, events = pool.table.request(run.job.job_id, phase, gpus, self.now, min_gpus=need)
        self._handle(pool, events)

    def _gpus_for(self, run: JobRun, phase: Phase) -> range:
        j = run.job
        if run.pool is not None and run.pool.mode is not PoolMode.LEASE:
            return range(run.pool.gpus)
        if run.pool is not None and run.pool.windows is not None:
            return run.window or run.pool.windows[0]  # its window (a floating pool's)
        o = run.pool.offset.get(j.job_id, 0) if run.pool is not None else 0
        if phase is Phase.ROLLOUT:
            return range(o, o + j.rollout_gpus)
        if phase in (Phase.TRAIN, Phase.SYNC) and j.trainer_gpus != j.gpus:
            # a disaggregated job's sync needs its trainer set only: the new weights are
            # staged, and its rollout engine loads them when it is next activated
            # (vLLM wake_up(tags=["weights"]) -> load weights -> wake the KV cache;
            # shared/research/resident-models.md), not while a partner holds that set
            return range(o + j.rollout_gpus, o + j.gpus)
        return range(o, o + j.gpus)

    def _handle(self, pool: Pool, events: list[Event]) -> None:
        freed = retired = False  # GPUs freed; by a shrink, move or release
        for ev in events:
            if isinstance(ev, Grant):
                self._granted(pool, self.runs[ev.lease.job_id], ev)
                continue
            if isinstance(ev, _RETIRING):
                freed = freed or not isinstance(ev, Moved)
                retired = retired or not isinstance(ev, Revoke)
                if ev.lease is not None:
                    run = self.runs[ev.lease.job_id]
                    self._account(run)
                    run.held_n = self._held(pool, run)
        self._check(pool)
        if pool.windows is not None and retired:
            self._retire_spare(pool)
        if self.cfg.grow_free_only and freed:
            # GPUs freed: rollouts short of GPUs ask again once this instant's requests
            # are queued (the releasing job's next phase first, as in the controller,
            # where a rollout asks only at its next round)
            self._push(self.now, "regrow", pool.pool_id)

    @staticmethod
    def _held(pool: Pool, run: JobRun) -> int:
        """GPUs the job holds in the pool now, over all its leases."""
        jid = run.job.job_id
        return sum(len(le.gpus) for le in pool.table.leases if le.job_id == jid)

    def _account(self, run: JobRun) -> None:
        d = (self.now - run.held_since) * run.held_n
        run.lease_gpu_s += d
        run.seg_gpu_s += d
        run.held_since = self.now

    def _granted(self, pool: Pool, run: JobRun, ev: Grant) -> None:
        lease = ev.lease
        jid = run.job.job_id
        o = pool.offset.get(jid, 0)
        if pool.windows is not None:
            run.window = pool.window_of(lease.gpus)
            if run.window is None or not lease.gpus <= set(run.window):
                raise SimError(f"job {jid} was granted GPUs {sorted(lease.gpus)} that are "
                               f"not one window of floating pool {pool.pool_id}")
        elif pool.mode is PoolMode.LEASE and not lease.gpus <= set(range(o, o + run.job.gpus)):
            raise SimError(f"job {jid} was granted GPUs {sorted(lease.gpus)} outside its "
                           f"window {o}..{o + run.job.gpus - 1} of pool {pool.pool_id}")
        if lease.lease_id == run.grow_req:
            elastic.grew(self, pool, run, lease.lease_id)
            return
        run.lease_id, run.held_n, run.held_since, run.seg_gpu_s = lease.lease_id, len(
            lease.gpus), self.now, 0.0
        run.seg_start = self.now
        prev = {pool.last_holder.get(g) for g in lease.gpus} - {None, jid}
        cost = 0.0
        if prev:
            out = self.runs[max(p for p in prev if p is not None)].job
            cost = costs.switch_s(run.job, out, pool.resident)
            run.handoffs += 1
        for g in lease.gpus:
            pool.last_holder[g] = jid
        phase, seconds = self._segment(run)
        t = self.now + cost
        if pool.mode is PoolMode.GANG:
            return
        if phase is Phase.ROLLOUT and pool.mode is PoolMode.LEASE:
            elastic.start(self, pool, run, t, len(lease.gpus))
            return
        run.seg_due = t + seconds
        self._push(run.seg_due, "seg_end", (jid, run.token))

    def _on_roll(self, data: tuple[int, int, int]) -> None:
        elastic.on_roll(self, data)

    def _on_regrow(self, pool_id: int) -> None:
        pool = self.pools.get(pool_id)
        if pool is None:
            return
        for jid in sorted({le.job_id for le in pool.table.leases}):
            run = self.runs[jid]
            if run.lease_id is not None and self._segment(run)[0] is Phase.ROLLOUT:
                elastic.want_grow(self, pool, run)

    def _on_grown(self, data: tuple[int, int, int, int]) -> None:
        elastic.on_grown(self, data)

    def _on_seg_end(self, data: tuple[int, int]) -> None:
        jid, token = data
        run = self.runs[jid]
        if token != run.token:
            return
        pool = run.pool
        assert pool is not None
        phase, _ = self._segment(run)
        if phase.needs_gpu:
            if run.lease_id is None:
                raise SimError(f"job {jid} ended {phase} without a lease")
            elastic.stop_growing(self, pool, run)
            lid, run.lease_id = run.lease_id, None
            if self._switches(pool, run, lid):
                self._account(run)  # the lease ends at the switch: count its GPU-s now
                run.switch_from = lid
            else:
                self._handle(pool, pool.table.release(lid, self.now))
            set_gpu_s = max(1e-12, (self.now - run.seg_start) * len(self._gpus_for(run, phase)))
            share = min(1.0, max(1e-6, run.seg_gpu_s / set_gpu_s))
            head = None
            if phase is Phase.ROLLOUT:  # set-equivalent share held before the tail
                head = (share if run.roll_head_gpu_s is None else
                        min(share, max(0.0, run.roll_head_gpu_s / set_gpu_s)))
                run.roll_head_gpu_s = None
            run.builder.observe(phase, run.seg_start, self.now, share, head)
            learned = run.builder.observed_share(phase)
            if phase is Phase.ROLLOUT and learned is not None and self.cfg.learn_priors:
                self.site.record_share(jid, run.job.model, run.job.rollout_gpus, learned)
        else:
            run.builder.observe(phase, run.seg_start, self.now)
        run._profile = None
        run.seg += 1
        if run.seg == len(run.job.steps[run.step]):
            run.seg, run.step = 0, run.step + 1
            if self.cfg.site_prior is not None:
                self.site.record_step(jid, run.job.model, run.job.gpus, run.profile())
        if run.step == len(run.job.steps):
            self._finish(run)
        else:
            self._start_segment(run)

    def _finish(self, run: JobRun) -> None:
        pool = run.pool
        assert pool is not None
        run.finished_at = self.now
        self._left -= 1
        run.grow_req, run.grow_leases = None, []
        self._handle(pool, pool.table.remove_job(run.job.job_id, self.now, "job-ended"))
        pool.members.remove(run)
        pool.offset.pop(run.job.job_id, None)
        pool.resident = not self.cfg.park_always and costs.fits_together(
            [m.job for m in pool.members], self.cfg.gpu_mem_bytes)
        self._retire_spare(pool)
        if not pool.members:
            pool.closed_at = self.now
            del self.pools[pool.pool_id]
            self.closed.append(pool)
            self.free += pool.gpus
            if self.node_free is not None and pool.node is not None:
                self.node_free[pool.node] += pool.gpus
        self._want_pairing()

    # -- gang ----------------------------------------------------------------------
    def _gang_next(self, pool: Pool) -> None:
        """Give the whole pool to the next member for one quantum."""
        cur = pool.gang_holder
        members = pool.members
        if not members:
            pool.gang_holder = None
            return
        nxt = members[0] if cur is None or cur not in members else \
            members[(members.index(cur) + 1) % len(members)]
        pool.gang_holder, pool.gang_since = nxt, self.now
        _, events = pool.table.request(nxt.job.job_id, Phase.TRAIN, range(pool.gpus), self.now)
        self._handle(pool, events)
        if nxt.lease_id is None:
            raise SimError(f"gang pool {pool.pool_id} could not grant job {nxt.job.job_id}")
        left = nxt.solo_s - nxt.progress
        pool.gang_token += 1
        self._push(self.now + min(self.quantum_s, left), "gang",
                   (pool.pool_id, pool.gang_token))

    def _on_gang(self, data: tuple[int, int]) -> None:
        pid, token = data
        pool = self.pools.get(pid)
        if pool is None or token != pool.gang_token or pool.gang_holder is None:
            return
        run = pool.gang_holder
        run.progress += self.now - pool.gang_since
        assert run.lease_id is not None
        lid, run.lease_id = run.lease_id, None
        self._handle(pool, pool.table.release(lid, self.now))
        if run.progress >= run.solo_s - 1e-9:
            self._finish(run)
            if pool.pool_id not in self.pools:
                return
        self._gang_next(pool)
