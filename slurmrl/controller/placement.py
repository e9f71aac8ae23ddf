"""The controller's side of the site policies: load them, build their snapshots.

The pairing and admission policies (`policies/`) are pure: they see a `JobSnapshot` or a
`ClusterSnapshot` and decide. The simulator (slurmrl/sim/engine.py) builds those
snapshots from its simulated cluster; this module builds them from the controller's DB
and Slurm, so both call the same objects with the same kind of input:

- a job's profile comes from its phase observations in the DB (leases the scheduler
  recorded, gaps the driver reported, a gap only where the controller saw the job off
  its GPUs, once its next lease is asked for: `JobHistory`), with its `--rl-profile`
  as the prior; with neither, the prior by its model's size, its rollout holding its
  whole set (`ROLLOUT_HELD_SHARE`); each job's observations are read once each, kept
  from round to round (`JobHistories`);
- every job is placed in the site's pool partition (the driver's own partition is
  where the driver runs, not where its GPUs come from);
- free GPUs per partition are the GPUs of the partition's usable nodes minus what is
  allocated on them: the GPUs Slurm lists for running jobs (any partition: nodes are
  shared), plus the controller's own open pools Slurm listed without GPUs;
- and per node too (`node_free_gpus`, `ClusterSnapshot.free_node_gpus`): a pool takes
  all of its GPUs from one node, so the policies open none that no node has room for
  (`policies.free.FreeGpus`), and the pool manager checks again before it submits one
  (`SlurmPools._no_room`: a site policy may not count nodes);
- a pool is `closed` where the pairing policy's groups are fixed
  (`policies.base.fixed_group`) and it has had that many members, ended ones included,
  as the simulator marks it (`closed_because`); the pool manager's join guard refuses
  it a new member, as the simulator's does;
- a policy's answer is read through `placement_of` and `admission_of`: the plain
  string of an `Action` or `Verdict` is taken as that member, any other value is logged
  at ERROR naming the policy and taken as the safe outcome (the job waits; the job is
  refused), with a reason naming the value.

Known limits: per-GPU memory is the pool manager's assumed `gpu_memory_bytes`, not an
NVML reading.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from policies import registry
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
    Verdict,
    fixed_group,
)
from policies.complementarity import host_bytes
from slurmrl.config import Config, ConfigError
from slurmrl.db import JobRecord, ObservationRecord, PoolRecord, Store
from slurmrl.model import PhasePrior
from slurmrl.profiles import Profile, ProfileBuilder, prior_for_model, profile_from_prior
from slurmrl.slurm import JobInfo, NodeInfo, SlurmError, SlurmJobState

if TYPE_CHECKING:
    from slurmrl.controller.core import Controller

log = logging.getLogger(__name__)

#: states of a job that holds no allocation yet (or again): queued, or back in the queue
_QUEUED = frozenset({SlurmJobState.PENDING, SlurmJobState.REQUEUED,
                     SlurmJobState.SPECIAL_EXIT, SlurmJobState.REQUEUE_HOLD,
                     SlurmJobState.REQUEUE_FED, SlurmJobState.RESV_DEL_HOLD})
#: node state flags under which Slurm allocates nothing new
_UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "MAINT", "RESERVED", "FUTURE")


@dataclass(frozen=True)
class SitePolicies:
    """The site's pairing and admission policies, loaded once at controller start."""

    pairing: PairingPolicy
    admission: AdmissionPolicy
    limits: SiteLimits


def site_limits(cfg: Config) -> SiteLimits:
    lim = cfg.limits
    return SiteLimits(
        max_slowdown=lim.max_slowdown, default_max_slowdown=lim.default_max_slowdown,
        max_gpus_per_job=lim.max_gpus_per_job, max_jobs_per_pool=lim.max_jobs_per_pool,
        parked_host_mem_bytes=lim.parked_host_mem_per_node or None)


def check_policies(cfg: Config) -> None:
    """Build the configured policies as the Controller will, so that an unknown name or
    a bad `[policies.params.<name>]` table fails before anything is written; a table for
    a built-in policy that is not the configured one is built too (the config loader
    refuses a table naming no policy). The one check of the site's policies: `slurmrl
    controller` runs it at start, `slurmrl doctor` for its config check. Raises
    `ConfigError` naming the key."""
    p = cfg.policies
    for kind in ("slice", "pairing", "admission"):
        configured = getattr(p, kind)
        tabled = sorted(n for n in p.params if n in registry.REGISTRY[kind] and n != configured)
        for name in (configured, *tabled):
            params = p.params_for(name)
            try:
                registry.load(kind, name, params)
            except registry.UnknownPolicy as exc:
                # the parameters table where they are at fault, else the policy's name
                bad_params = str(exc).startswith(f"{kind} policy {name!r}: bad parameters")
                key = f"policies.params.{name}" if params and bad_params else f"policies.{kind}"
                raise ConfigError(cfg.source_of(key), key, str(exc)) from None
    try:
        load_policies(cfg)  # the checks the controller adds (e.g. a lease-mode pairing)
    except registry.UnknownPolicy as exc:
        raise ConfigError(cfg.source_of("policies.pairing"), "policies.pairing", str(exc)
                          ) from None


def load_policies(cfg: Config) -> SitePolicies:
    """Build the configured pairing and admission policies; a bad name fails here.

    Raises `registry.UnknownPolicy` naming the valid policies (`registry.load` also
    checks that each has its protocol), or for a pairing policy whose pools the
    controller cannot slice (it enacts phase leases only).
    """
    p = cfg.policies
    pairing: Any = registry.load("pairing", p.pairing, p.params_for(p.pairing))
    admission: Any = registry.load("admission", p.admission, p.params_for(p.admission))
    if pairing.mode is not PoolMode.LEASE:
        usable = [n for n in registry.names("pairing")
                  if getattr(registry.REGISTRY["pairing"][n], "mode", None) is PoolMode.LEASE]
        raise registry.UnknownPolicy(
            f"pairing policy {p.pairing!r} forms {pairing.mode} pools, which only the "
            f"simulator runs; the controller slices by leases: {', '.join(usable)}")
    return SitePolicies(pairing, admission, site_limits(cfg))


def placement_of(pl: Placement, policy: str) -> Placement:
    """`pl` with its action an `Action` (the plain string of one is taken as it). Any
    other value is logged at ERROR naming the `policy` and the job waits (a WAIT, its
    reason naming the value): the safe outcome, which opens and joins nothing on a guess
    and places the job once the policy says what it means."""
    if isinstance(pl.action, Action):
        return pl
    try:
        return replace(pl, action=Action(pl.action))
    except ValueError:
        log.error("pairing policy %r gave job %d the action %r, none of %s: it waits",
                  policy, pl.job_id, pl.action, ", ".join(Action))
        return replace(pl, action=Action.WAIT,
                       reason=f"pairing policy {policy!r} gave no valid action "
                              f"({pl.action!r})")


def admission_of(adm: Admission, policy: str, job_id: int) -> Admission:
    """`adm` with its verdict a `Verdict` (the plain string of one is taken as it). Any
    other value is logged at ERROR naming the `policy` and taken as a REJECT whose
    reason names the value: the safe outcome, for an admission policy's slip must let
    no job past it."""
    if isinstance(adm.verdict, Verdict):
        return adm
    try:
        return replace(adm, verdict=Verdict(adm.verdict))
    except ValueError:
        log.error("admission policy %r gave job %d the verdict %r, none of %s: refused",
                  policy, job_id, adm.verdict, ", ".join(Verdict))
        return Admission(Verdict.REJECT, f"admission policy {policy!r} gave no valid "
                                         f"verdict ({adm.verdict!r})")


def closed_because(c: Controller, pool_id: int) -> str | None:
    """Why the pool takes no new member, or None: the pairing policy's groups are fixed
    (`fixed_group`) and the pool has had that many members, ended ones included."""
    group = fixed_group(c.policies.pairing)
    if group is None or len(c.store.jobs(pool_id=pool_id)) < group:
        return None
    return (f"its group of {group} is fixed (pairing policy "
            f"{c.policies.pairing.name!r}: fixed_group)")


#: the share of its set a rollout lease holds here before any observation: the whole
#: set. A lease shrinks through the tail only where rollouts run as replicas (site config
#: `services.rollout_replica_gpus`) and the driver lets them give GPUs back; what a job's
#: leases held is then learned from its own observations (`profile_of`). A prior that
#: assumed the designed shrink (slurmrl.profiles.ROLLOUT_PRIOR_GPU_SHARE) placed jobs
#: more optimistically than they then ran (benchmarks/controller_gap.py).
ROLLOUT_HELD_SHARE = 1.0


class JobHistory:
    """A job's observations folded into its profile, each once, in the order they were
    recorded (a lease's at its end, a gap at its report): `feed` takes the new ones.

    A gap the driver reported (reward, idle) counts only where its job was off its GPUs
    as the controller saw it: from its latest lease's release, after the gap counted
    before it, to its next lease's request (so it is counted once that comes), and
    never before the job's first phase (its start-up). So a driver's numbers cannot make
    its steps longer than they ran, nor its GPU duty lower: a partner placed on that
    would be slowed past its limit."""

    def __init__(self, job: JobRecord) -> None:
        self.job = job
        by_size = prior_for_model(job.request.model, job.request.gpus)
        prior = job.request.profile or by_size  # blended phase by phase as observed
        if not prior.step_s:  # `--rl-profile` shares without `step=`: the size's period
            prior = PhasePrior(prior.shares, by_size.step_s)
        self._by_size = by_size
        self.builder = ProfileBuilder(prior=prior, rollout_gpu_share=ROLLOUT_HELD_SHARE)
        self.last_id = 0  #: the last observation fed
        #: its first GPU phase's request (the controller's clock), None before any
        self.begun: float | None = None
        self._off_from: float | None = None  #: a gap counts from here on
        self._gaps: list[ObservationRecord] = []  #: reported since its latest lease

    def feed(self, observations: Iterable[ObservationRecord]) -> JobHistory:
        b = self.builder
        for o in observations:
            self.last_id = max(self.last_id, o.observation_id)
            if o.granted_at is None or o.released_at is None or o.released_at < o.granted_at:
                continue  # never granted (ended while waiting): no phase ran
            if o.phase.needs_gpu:
                start = o.requested_at if o.requested_at is not None else o.granted_at
                self._count_gaps(until=start)
                self.begun = start if self.begun is None else min(self.begun, start)
                share = _held_share(self.job, o)
                b.observe_lease(o.phase, start, o.granted_at, o.released_at, share,
                                _head_share(self.job, o, share))
                self._off_from = max(self._off_from or o.released_at, o.released_at)
            elif self._off_from is not None:  # (none before its first phase)
                self._gaps.append(o)
        return self

    def _count_gaps(self, until: float) -> None:
        """The gaps reported since the latest lease, within the time off GPU it ended."""
        for o in self._gaps:
            assert self._off_from is not None and o.granted_at is not None
            start, end = max(o.granted_at, self._off_from), min(o.released_at or 0.0, until)
            if end > start:
                self.builder.observe(o.phase, start, end)
                self._off_from = end
        self._gaps = []

    def profile(self) -> Profile:
        if self.builder.observations == 0 and self.job.request.profile is None:
            return profile_from_prior(self._by_size, rollout_gpu_share=ROLLOUT_HELD_SHARE)
        return self.builder.build()


class JobHistories:
    """The active jobs' `JobHistory`, kept between placement rounds: each round reads
    only the observations recorded since (a long job's history is not re-read)."""

    def __init__(self) -> None:
        self._of: dict[int, JobHistory] = {}

    def of(self, job: JobRecord, store: Store) -> JobHistory:
        h = self._of.get(job.job_id)
        if h is None:
            h = self._of[job.job_id] = JobHistory(job)
        h.job = job
        return h.feed(store.observations(job.job_id, after=h.last_id))

    def keep(self, job_ids: Iterable[int]) -> None:
        """Forget all but these jobs' (the ended ones')."""
        keep = set(job_ids)
        for jid in [j for j in self._of if j not in keep]:
            del self._of[jid]


def profile_of(job: JobRecord, observations: Iterable[ObservationRecord]) -> Profile:
    """The job's profile from its observations (`JobHistory`), its --rl-profile prior,
    or (neither) the prior by model size."""
    return JobHistory(job).feed(observations).profile()


def _set_gpu_s(job: JobRecord, o: ObservationRecord) -> float:
    """GPU-seconds the lease's phase set offers over the lease's life."""
    assert o.granted_at is not None and o.released_at is not None
    return (o.released_at - o.granted_at) * len(job.request.gpus_for(o.phase))


def _held_share(job: JobRecord, o: ObservationRecord) -> float:
    """The mean share of its phase's GPU set a lease held (below 1 when it shrank: the
    GPU-seconds the ledger charged it over its set's for the lease's life)."""
    gpu_s, full = o.detail.get("gpu_s"), _set_gpu_s(job, o)
    if not isinstance(gpu_s, int | float) or full <= 0:
        return 1.0
    return min(1.0, max(1e-6, gpu_s / full))


def _head_share(job: JobRecord, o: ObservationRecord, share: float) -> float:
    """The part of `share` (`_held_share`) the lease held before it first gave GPUs
    back (a rollout before its tail; all of it where it never did)."""
    head_s, full = o.detail.get("head_gpu_s"), _set_gpu_s(job, o)
    if not isinstance(head_s, int | float) or full <= 0:
        return share
    return min(share, max(0.0, head_s / full))


def job_snapshot(job: JobRecord, partition: str,
                 observations: Iterable[ObservationRecord] = (),
                 now: float | None = None, history: JobHistory | None = None) -> JobSnapshot:
    """`now`: the controller's clock, for how long a running job has run (since its
    first phase began: its services' start-up before it is not counted). `history`:
    its observations folded already (`JobHistories`), instead of `observations`."""
    h = history if history is not None else JobHistory(job).feed(observations)
    # its leases' stamps only: they are the controller's clock, a driver's reported gaps
    # are the driver's (a `time.monotonic()` stamp there made a job decades old)
    running = 0.0 if now is None or h.begun is None else max(0.0, now - h.begun)
    return JobSnapshot(job.job_id, job.user, job.request, h.profile(),
                       job.registered_at, partition, gpu_type=job.request.gpu_type,
                       running_s=running, submit_partition=job.partition or None)


def pool_snapshot(pool: PoolRecord, members: Sequence[JobSnapshot], partition: str,
                  gpu_mem_bytes: int | None, limits: SiteLimits,
                  offsets: Sequence[int] = (), closed: bool = False,
                  host_budget: int | None = None) -> PoolSnapshot:
    """`offsets`: each member's first pool GPU, in `members`' order (empty: all 0);
    `closed`: it takes no new member (a fixed group was complete); `host_budget`: the
    host memory its parked services may pin (None: the limits' figure)."""
    budget = limits.parked_host_mem_bytes if host_budget is None else host_budget
    free = None if budget is None else budget - sum(host_bytes(m) for m in members)
    return PoolSnapshot(pool.pool_id, pool.gpus, tuple(members), pool.partition or partition,
                        None, gpu_mem_bytes, free, pool.dedicated, closed,
                        offsets=tuple(offsets), floating=pool.floating)


def _used_gpus(nodes: Sequence[NodeInfo], running: Sequence[JobInfo],
               own_pools: Sequence[PoolRecord], partition: str,
               ) -> tuple[dict[str, int], int]:
    """GPUs allocated on each node of `partition` (the GPUs Slurm lists for running jobs,
    any partition's: nodes are shared; our open pools Slurm listed without GPUs, an
    older squeue, at their size on their node), and those of our pools with no node
    known, which count against the partition but no node."""
    used = {n.name: 0 for n in nodes if partition in n.partitions}
    seen = set()
    for j in running:
        if j.state.terminal or j.state in _QUEUED:  # else its GPUs are allocated still
            continue
        by_node = dict(j.gpu_indices_by_node) or (
            {j.nodes[0]: j.gpu_indices} if j.nodes and j.gpu_indices else {})
        if by_node:
            seen.add(j.job_id)
        for n, g in by_node.items():
            if n in used:
                used[n] += len(g)
    nowhere = 0
    for pool in own_pools:
        if pool.state != "open" or pool.slurm_job_id in seen:
            continue
        if not pool.nodes:
            nowhere += pool.gpus
        elif pool.nodes[0] in used:
            used[pool.nodes[0]] += pool.gpus
    return used, nowhere


def _usable(node: NodeInfo) -> bool:
    return not any(flag in node.state.upper() for flag in _UNUSABLE)


def free_gpus(nodes: Sequence[NodeInfo], running: Sequence[JobInfo],
              own_pools: Sequence[PoolRecord], partition: str) -> dict[str, int]:
    """GPUs Slurm could still allocate in `partition` (conservative, see module doc)."""
    used, nowhere = _used_gpus(nodes, running, own_pools, partition)
    usable = [n for n in nodes if partition in n.partitions and _usable(n)]
    return {partition: max(0, sum(n.gpus - used[n.name] for n in usable) - nowhere)}


def node_free_gpus(nodes: Sequence[NodeInfo], running: Sequence[JobInfo],
                   own_pools: Sequence[PoolRecord], partition: str) -> dict[str, int]:
    """GPUs Slurm could still allocate on each node of `partition`, counted as
    `free_gpus` counts them (0 on a node it cannot use). An own pool with no node known
    counts on none (the partition's total still counts it: `policies.free.FreeGpus`
    holds a pool to both)."""
    used, _ = _used_gpus(nodes, running, own_pools, partition)
    return {n.name: max(0, n.gpus - used[n.name]) if _usable(n) else 0
            for n in nodes if partition in n.partitions}


def node_gpus(nodes: Sequence[NodeInfo], partition: str) -> dict[str, int]:
    """{partition: GPUs of its largest node}; empty if it has none."""
    most = max((n.gpus for n in nodes if partition in n.partitions), default=0)
    return {partition: most} if most else {}


def cluster_snapshot(now: float, pools: Sequence[PoolSnapshot],
                     waiting: Sequence[JobSnapshot], free: dict[str, int],
                     limits: SiteLimits, nodes: dict[str, int] | None = None,
                     gpu_mem: dict[str, int] | None = None,
                     floating: dict[str, bool] | None = None,
                     packs_tails: dict[str, bool] | None = None,
                     floating_max_gpus: dict[str, int] | None = None,
                     free_nodes: dict[str, tuple[NodeFree, ...]] | None = None,
                     ) -> ClusterSnapshot:
    """`waiting` oldest first, as the policies expect; `nodes`: GPUs per node;
    `gpu_mem`: memory per GPU, in bytes; `floating`: whether pools may float;
    `packs_tails`: whether floating pools pack rollout tails; `floating_max_gpus`: the
    most GPUs a floating pool may hold; `free_nodes`: each node's free GPUs (all by
    partition)."""
    order = sorted(waiting, key=lambda j: (j.submitted_at, j.job_id))
    return ClusterSnapshot(now, tuple(pools), tuple(order), dict(free), limits, nodes or {},
                           gpu_mem or {}, floating=floating or {},
                           packs_tails=packs_tails or {},
                           floating_max_gpus=floating_max_gpus or {},
                           free_node_gpus=free_nodes or {})


async def controller_snapshot(
        c: Controller, waiting: Sequence[JobRecord], gpu_mem_bytes: int | None,
        host_budget: Callable[[PoolRecord | None], int] | None = None) -> ClusterSnapshot:
    """What the pairing policy sees now: open pools, `waiting` jobs, free GPUs.
    `host_budget`: the pool manager's budget for parked state on a pool's node (None:
    a pool not opened yet), where the site config leaves it to the nodes' memory (its
    `parked_host_mem_per_node` = 0): the policy is held to the budget the join guard is."""
    part = c.config.slurm.pool_partition
    limits = c.policies.limits
    budget_of = host_budget if host_budget is not None and (
        limits.parked_host_mem_bytes is None) else None
    if budget_of is not None:
        limits = replace(limits, parked_host_mem_bytes=budget_of(None))
    now = c.clock()

    seen: list[int] = []

    def snap(job: JobRecord) -> JobSnapshot:
        seen.append(job.job_id)
        return job_snapshot(job, part, now=now, history=c.histories.of(job, c.store))

    open_pools = c.store.pools(open_only=True)
    pools = []
    for p in open_pools:
        if p.slurm_job_id is None:
            continue
        members = c.store.jobs(active=True, pool_id=p.pool_id)
        closed = closed_because(c, p.pool_id) is not None
        pools.append(pool_snapshot(p, [snap(m) for m in members], part, gpu_mem_bytes, limits,
                                   [min(m.pool_gpus, default=0) for m in members], closed,
                                   None if budget_of is None else budget_of(p)))
    try:
        nodes, running = await asyncio.to_thread(lambda: (c.slurm.nodes(), c.slurm.jobs()))
        free = free_gpus(nodes, running, open_pools, part)
        per_node = node_gpus(nodes, part)
        by_name = {n.name: n for n in nodes}
        free_nodes = {part: tuple(
            NodeFree(f, by_name[name].gpu_types, name)
            for name, f in node_free_gpus(nodes, running, open_pools, part).items())}
    except SlurmError as exc:
        # Slurm unreachable: assume room for everyone; opening the pool then fails with
        # Slurm's own error, as it did before pairing asked
        log.warning("cannot read free GPUs from Slurm (%s); assuming enough", exc)
        free = {part: sum(j.request.gpus for j in waiting)}
        per_node, free_nodes = {}, {}
    waiting_snaps = [snap(j) for j in waiting]
    c.histories.keep(seen)  # an ended job's history goes
    return cluster_snapshot(now, pools, waiting_snaps, free, limits, per_node,
                            None if gpu_mem_bytes is None else {part: gpu_mem_bytes},
                            {part: True} if c.config.slurm.floating_pools else None,
                            {part: True} if packs_tails(c.config) else None,
                            # a floating pool's windows share one node (`_grow`),
                            # unless they may span nodes
                            per_node if c.config.slurm.floating_pools
                            and not c.config.slurm.floating_across_nodes else None,
                            free_nodes)


def packs_tails(config: Config) -> bool:
    """Whether the controller packs floating pools' rollout tails at the one-GPU grain
    the predictor models (`predict_floating(pack_tails=)`): pools float and rollouts
    run as one-GPU replicas. Replicas of more GPUs pack too, a replica at a time, and
    the policy is then told tails are held (it predicts less sharing than happens)."""
    return config.slurm.floating_pools and config.services.rollout_replica_gpus == 1
