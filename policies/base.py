"""Extension points for site policies: one small Protocol each.

Policies are pure functions of a snapshot: no subprocess, no clock reads, no DB, no
network. The controller and the simulator build the same snapshots and call the same
objects, so what the simulator shows is what the controller does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from slurmrl.leases.types import PhaseRequest, PoolView
from slurmrl.model import RlRequest

if TYPE_CHECKING:
    from slurmrl.profiles import Profile


@runtime_checkable
class SlicePolicy(Protocol):
    """Decides, for one pool, which waiting phase request goes next.

    `order` returns every waiting request of `view` exactly once, most urgent first.
    The lease table grants in that order; a request that does not fit reserves its GPUs
    so that nothing later in the order overtakes it on them (no starvation). It is asked
    only where two or more requests wait (one is its own order).
    """

    name: str

    def order(self, view: PoolView) -> Sequence[PhaseRequest]: ...


# -- pairing and admission --------------------------------------------------------------
# The snapshot types below are built by the controller (from its DB and Slurm) and by the
# simulator (from its simulated cluster). `slurmrl.profiles.Profile` is the per-job phase
# statistics type (quantiles of busy and gap durations), owned by slurmrl/profiles.py.


@dataclass(frozen=True)
class JobSnapshot:
    """One RL job as a pairing or admission policy sees it."""

    job_id: int
    user: str
    request: RlRequest
    profile: Profile | None  #: None before any observation and with no prior
    submitted_at: float
    partition: str = "pools"
    gpu_type: str | None = None
    #: host memory its parked services take (weights + optimizer state), None = estimate
    host_mem_bytes: int | None = None
    #: seconds since it began running in its pool (0 while waiting): with the steps its
    #: profile has seen and its `--rl-steps`, what its slowdown so far is measured on
    running_s: float = 0.0
    #: the Slurm partition the job itself was submitted to (its driver's allocation;
    #: `partition` is where its pool goes); None where there is none (the simulator)
    submit_partition: str | None = None


class PoolMode(StrEnum):
    """How a pool's GPUs are sliced between members (the pairing policy says which)."""

    LEASE = "lease"  #: phase leases on GPU sets, shrinkable (slurmrl)
    LOCK = "lock"  #: one lock on the whole pool per GPU phase, no shrink (llm-d style)
    #: fixed time quanta regardless of phases, memory held (Slurm GANG); the quantum is
    #: the pairing policy's `quantum_s` attribute (seconds)
    GANG = "gang"


@dataclass(frozen=True)
class PoolSnapshot:
    """One open pool: its size and current members."""

    pool_id: int
    gpus: int
    members: tuple[JobSnapshot, ...]
    partition: str = "pools"
    gpu_type: str | None = None
    gpu_mem_bytes: int | None = None  #: per GPU, None when unknown
    host_mem_free_bytes: int | None = None  #: budget left for parked state on its nodes
    dedicated: bool = False  #: opened for a `--rl-mux=off` (or forced-dedicated) job
    #: takes no new member: its group is fixed and was complete (`fixed_group`)
    closed: bool = False
    #: per member (same order), the first pool GPU of its window (its GPUs are
    #: offset .. offset + its GPU count - 1); empty: every member from GPU 0
    offsets: tuple[int, ...] = ()
    #: a floating pool: whole windows of its members' GPU count, each GPU phase on
    #: whichever is free (`ClusterSnapshot.floating`); `gpus` / that count windows
    floating: bool = False


@dataclass(frozen=True)
class SiteLimits:
    """The site's limits a policy must respect.

    The controller builds them from its config's `[limits]` (`placement.site_limits`),
    the simulator from a workload's `limits` over those keys' config defaults
    (`slurmrl.sim.workload.DEFAULT_LIMITS`); the defaults here are a bare object's (a
    test's), more lenient than a site's: no GPU bound to speak of, 1.25."""

    max_slowdown: float = 1.5  #: site cap on any member's predicted slowdown
    default_max_slowdown: float = 1.25  #: used when the user gave no --rl-max-slowdown
    max_gpus_per_job: int = 1024
    max_jobs_per_pool: int = 2
    #: host memory per pool for parked services; None = unknown (not checked)
    parked_host_mem_bytes: int | None = None

    def limit_for(self, own: float | None) -> float:
        """The slowdown a job accepts: its own --rl-max-slowdown (None: not given, the
        site's default), capped by the site."""
        return min(self.max_slowdown, own if own is not None else self.default_max_slowdown)


@dataclass(frozen=True)
class NodeFree:
    """One node's GPUs Slurm could still allocate: `free` of them, and the node's GPUs by
    GRES type (`types`: (type, count) pairs, "" for GPUs of no type)."""

    free: int
    types: tuple[tuple[str, int], ...] = ()
    name: str = ""  #: the node's Slurm name ("" where not known)

    def free_of(self, gpu_type: str | None) -> int:
        """Free GPUs of `gpu_type` (None: of any): the free ones, but no more than it has
        of that type (on a node of several types, which ones are free is not known)."""
        if gpu_type is None:
            return self.free
        return min(self.free, sum(n for t, n in self.types if t == gpu_type))


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything pairing needs, at one instant."""

    now: float
    pools: tuple[PoolSnapshot, ...]
    waiting: tuple[JobSnapshot, ...]  #: admitted jobs not yet placed, oldest first
    free_gpus: Mapping[str, int]  #: partition -> GPUs Slurm could still allocate
    limits: SiteLimits = field(default_factory=SiteLimits)
    #: partition -> GPUs of its largest node (absent: unknown). A pool larger than a
    #: node spans nodes, so a window shifted by less than a node would straddle two
    node_gpus: Mapping[str, int] = field(default_factory=dict)
    #: partition -> GPU memory per GPU of its nodes, in bytes (absent: unknown): what a
    #: group opened this round must fit, where it has no pool to read it from yet
    gpu_mem_bytes: Mapping[str, int] = field(default_factory=dict)
    #: partition -> whether its pools may float: members of one GPU count take whichever
    #: whole window is free, and a join may add a window (Placement.gpus). Offered by the
    #: simulator (`SimConfig.floating`) and by the controller where the site turns it on
    #: (`slurm.floating_pools`)
    floating: Mapping[str, bool] = field(default_factory=dict)
    #: partition -> whether a floating pool's rollout tails pack onto the fewest GPUs
    #: anywhere in the pool (the simulator's `SimConfig.pack_tails`; the controller's
    #: with one-GPU rollout replicas, `services.rollout_replica_gpus = 1`); absent or
    #: False: a rollout keeps its whole window through its tail
    packs_tails: Mapping[str, bool] = field(default_factory=dict)
    #: partition -> the most GPUs one floating pool may hold: the controller keeps a
    #: floating pool's windows on one node (a job's state moves between its copies
    #: through that node's memory), so its node's GPUs; absent: no bound (windows may
    #: span nodes: the controller's `slurm.floating_across_nodes`, the simulator's
    #: `SimConfig.floating_across_nodes`)
    floating_max_gpus: Mapping[str, int] = field(default_factory=dict)
    #: partition -> the GPUs Slurm could still allocate on each of its nodes (absent:
    #: not known, the partition's `free_gpus` alone count). A pool takes all of its
    #: GPUs from one node (of the job's `gpu_type`, where it names one), so with 4 free
    #: on each of two nodes no pool of 8 opens. The controller reads them from Slurm;
    #: the simulator has no nodes beyond a pool's bound and tells none. Policies count
    #: them through `policies.free.FreeGpus`
    free_node_gpus: Mapping[str, tuple[NodeFree, ...]] = field(default_factory=dict)


class Action(StrEnum):
    JOIN = "join"  #: join pool `pool_id`
    OPEN = "open"  #: open a new shared pool of `gpus` GPUs (later arrivals may join)
    DEDICATED = "dedicated"  #: open a pool for this job alone; nobody joins it
    WAIT = "wait"  #: not now (no GPUs free); reconsidered at the next round


@dataclass(frozen=True)
class Placement:
    """A pairing decision for one waiting job. `action` an `Action` (its plain string is
    taken as it; any other value is an error naming the policy: the simulator stops,
    the controller logs it and the job waits)."""

    job_id: int
    action: Action
    pool_id: int | None = None  #: JOIN: the pool; OPEN: a new id chosen by the caller
    gpus: int | None = None  #: OPEN/DEDICATED: pool size
    predicted_slowdown: float | None = None
    reason: str = ""
    #: the job's first pool GPU: it runs on GPUs gpu_offset .. gpu_offset + its count - 1
    #: (a staggered pool is larger than its members, each on a shifted window)
    gpu_offset: int = 0
    #: a floating pool (`ClusterSnapshot.floating`): OPEN opens one of whole windows of
    #: the job's GPU count; JOIN's `gpus` is the pool's size with the job (a window more
    #: where it adds one)
    floating: bool = False


@runtime_checkable
class PairingPolicy(Protocol):
    """Places waiting jobs: join an existing pool, open a new one, or run dedicated.

    Called with every waiting job at once (a batch), so a policy may match them among
    themselves. Returns one placement per waiting job (a list, or any iterable: it is
    read once). `OPEN` placements that should share with each other use the same
    (negative, provisional) `pool_id`; a `JOIN` names an open pool of the snapshot.
    `mode` is required (`PoolMode.LEASE` for a policy the controller runs; the registry
    takes the plain string of a member as that member, and refuses any other value).

    Optional attributes, read where present: `fixed_group` (an int, see `fixed_group`),
    `slice_policy` (the name of the slice policy its pools run in the simulator, which
    refuses another; the controller slices by the site's), `quantum_s` (a
    `PoolMode.GANG` policy's time quantum, seconds).

    A join (or a second `OPEN` of the same provisional pool) is a request: the caller
    enacts it only where the pool still takes the job (the controller's guard,
    `SlurmPools._joinable`, and the simulator's, `Simulation._refusal`: not dedicated,
    not `closed`, fewer members than `max_jobs_per_pool`, the job's window inside the
    pool, members that may share (`complementarity.compatible`), memory), else the job
    opens a pool of its own: it never waits for a partner.
    """

    name: str
    mode: PoolMode  #: how pools it forms are sliced; the controller supports LEASE

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]: ...


def fixed_group(policy: object) -> int | None:
    """How many members a group of `policy` has for good (its optional `fixed_group`
    attribute), or None where its groups are not fixed. A pool that has had that many
    members takes no new one, even after a member leaves: the caller (the simulator,
    the controller) marks it `PoolSnapshot.closed`, and its join guard refuses a join
    to it (the job opens a pool of its own)."""
    n = getattr(policy, "fixed_group", None)
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None


class Verdict(StrEnum):
    ACCEPT = "accept"
    REJECT = "reject"  #: with a reason the user sees in `slurmrl status`
    DEDICATED = "dedicated"  #: accepted, but never shared


@dataclass(frozen=True)
class Admission:
    """An admission decision. `verdict` a `Verdict` (its plain string is taken as it; any
    other value is an error naming the policy: the simulator stops, the controller logs
    it and refuses the job)."""

    verdict: Verdict
    reason: str = ""


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides at registration whether a job may enter, and how."""

    name: str

    def admit(self, job: JobSnapshot, limits: SiteLimits) -> Admission: ...
