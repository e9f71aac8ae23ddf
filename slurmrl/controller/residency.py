"""Residency planning: which services to park so that a grant's active set fits.

Pure functions over frozen values (no clock, no I/O), so they are unit-tested on small
hand-built cases and could run in the simulator unchanged.

- `footprints_for_job()` turns an RL job's request into per-service `Footprint`s: GPU
  memory per GPU while active and while parked, and the host memory its parked state
  pins on the pool's node. A declared `--rl-mem` (memory per GPU the job's resident
  model set needs) wins over the `slurmrl.gpu` estimate from the model's size. The
  rollout is one engine over its set, or (site config `services.rollout_replica_gpus`)
  data-parallel replicas of that many GPUs each, so a rollout's tail can hand the GPUs
  of its finished replicas to a partner while the others still generate.
- `plan_grant()` is called before a lease is answered: the services the phase needs
  (`phase_roles()`; a disaggregated sync needs only the trainer) whose GPUs the lease
  holds all of (a rollout granted part of its set activates the replicas there, never
  an engine spanning GPUs another job holds) are made active;
  every other service on the lease's GPUs stays active only while the GPU still fits,
  otherwise it is parked — other jobs' services first, then this job's idle ones.
  Parked state goes to host memory while the node's budget (site config
  `limits.parked_host_mem_per_node`) lasts; a rollout can be dropped instead (its
  weights come back with the next weight sync); a trainer cannot. `park_others` also
  parks the other jobs' services on the lease's GPUs that memory does not require
  parking, while the host budget lasts (never by dropping); the rest stay active.
- `admit()` refuses, with a reason the user sees, a job whose services cannot fit on
  the pool even with every other member parked or dropped.

GPU capacity per GPU is what the caller gives. The controller gives every pool GPU the
site's assumed size (`SlurmPools._capacity`: `gpu_memory_bytes`), because it runs away
from the pools' nodes and has no NVML reading of them; `GpuCapacity.from_reading`
(total minus what processes that are not our services use) is for a caller that has
one, and no caller in the controller does today.

A rollout's footprint is also what its engine is launched with: `services.worker_argv`
tells a `vllm` rollout the same per-GPU budget (`estimate.rollout_budget`, by the same
rules; tests/unit/controller/test_services_sizing.py holds the two equal: its KV cache
as `kv_cache_memory_bytes`, its whole footprint as the share of the GPU vLLM may
take), so the engine does not take the ~85% of the GPU vLLM's default would.

Drops: a rollout parked in this plan may be dropped instead (a level-2 park from active
frees its host copy in every backend). One already PARKED is counted as freed by a drop
only where its backend frees its host copy on a level-2 park from parked
(`Footprint.drops_parked`: `tiny`; not `vllm`, whose sleeping engine cannot give up its
CPU copy of the weights without waking first, `worker/protocol.py`).

Host memory: a service pins its `host_bytes` while parked; one whose backend keeps its
host buffers while active too (`KEEPS_HOST_BACKENDS`: `tiny`, `torch`, whose offloader
allocates them at load) pins them in every residency but dropped. A service whose park
or activation timed out (`uncertain`) is counted as pinning them, unless this plan
activates it.

Known limits: memory is planned per GPU, not per allocation block (fragmentation is not
modelled); NVML readings are point-in-time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from slurmrl.gpu.estimate import estimate_model_memory
from slurmrl.model import Phase, Residency, RlRequest

ServiceKey = tuple[int, str]  #: (RL job id, service name: the role, or "rollout:i")

#: which services a phase may need active; `phase_roles()` says which one job needs
PHASE_ROLES: Mapping[Phase, tuple[str, ...]] = {
    Phase.ROLLOUT: ("rollout",),
    Phase.TRAIN: ("trainer",),
    Phase.SYNC: ("trainer", "rollout"),
}


#: rollout backends whose park(level=2) of a PARKED service frees its host copy (the
#: contract in `slurmrl.worker.protocol`); a drop of a parked `vllm` rollout frees nothing
DROPS_PARKED_BACKENDS = frozenset({"tiny"})
#: backends whose services keep their pinned host buffers while active (`tiny`, `torch`:
#: `worker/offload.py` allocates them at load, and an activation copies up and keeps
#: them); only a drop frees them. A `vllm` engine pins host memory only once asleep
KEEPS_HOST_BACKENDS = frozenset({"tiny", "torch"})


class ResidencyError(ValueError):
    """A plan or an admission is impossible; the message says what does not fit."""


@dataclass(frozen=True)
class Footprint:
    """One service's memory: per GPU on its pinned GPUs, and on the node's host."""

    job_id: int
    role: str
    gpus: frozenset[int]  #: pool GPU indices it is pinned to
    active_bytes: int  #: GPU memory per GPU while active
    parked_bytes: int  #: GPU memory per GPU that parking cannot free (contexts)
    host_bytes: int  #: host memory its level-1 parked state pins (whole service)
    residency: Residency = Residency.ACTIVE
    replica: int | None = None  #: a rollout replica's index (None: one engine, its set)
    window: int | None = None  #: a floating pool's window it runs on (None: fixed pool)
    #: a park or an activation of it failed (timed out): the service may still do it
    #: later, so it is taken as active (holding its memory) and, where a grant needs
    #: it, activated again (a no-op where it is)
    uncertain: bool = False
    #: a level-2 park of it while PARKED frees its host copy (its backend does:
    #: `DROPS_PARKED_BACKENDS`); False (unknown, or `vllm`): the planner never counts a
    #: drop of it freed once it is parked, only a drop straight from active
    drops_parked: bool = False
    #: its backend keeps its host buffers while active (`KEEPS_HOST_BACKENDS`): its
    #: `host_bytes` are pinned in every residency but dropped or stopped
    keeps_host: bool = False

    @property
    def service(self) -> str:
        """The job's service this is (a copy of, in a floating pool): `rollout`,
        `trainer`, or `rollout:i` for replica i of a replicated rollout."""
        return self.role if self.replica is None else f"{self.role}:{self.replica}"

    @property
    def name(self) -> str:
        """`service`, and `service@w` for a floating pool's copy on window w."""
        return self.service if self.window is None else f"{self.service}@{self.window}"

    @property
    def key(self) -> ServiceKey:
        return (self.job_id, self.name)

    @property
    def can_drop(self) -> bool:
        """A rollout may drop its weights (the next sync refills them); a trainer not."""
        return self.role == "rollout"

    def device_bytes(self, residency: Residency | None = None) -> int:
        r = self.residency if residency is None else residency
        if r is Residency.ACTIVE:
            return self.active_bytes
        return 0 if r is Residency.STOPPED else self.parked_bytes

    def pinned_host_bytes(self, residency: Residency | None = None) -> int:
        """Host memory it pins as `residency` (default its own): parked, its state; active,
        its buffers where its backend keeps them (`keeps_host`), and where its park or
        activation timed out (`uncertain`), since the park may have landed."""
        r = self.residency if residency is None else residency
        held = r is Residency.PARKED or (
            r is Residency.ACTIVE and (self.uncertain or self.keeps_host))
        return self.host_bytes if held else 0


@dataclass(frozen=True)
class GpuCapacity:
    """GPU memory slurmrl's services may use on one pool GPU."""

    index: int
    usable_bytes: int

    @classmethod
    def from_reading(cls, index: int, total_bytes: int, used_bytes: int,
                     services_bytes: int, reserve_bytes: int = 0) -> GpuCapacity:
        """From NVML: total, used, and the part of `used` our own services hold."""
        foreign = max(0, used_bytes - services_bytes)
        return cls(index, max(0, total_bytes - foreign - reserve_bytes))


@dataclass(frozen=True)
class ResidencyPlan:
    """What to do before answering a grant. Apply parks/drops first, then activations."""

    park: tuple[ServiceKey, ...] = ()  #: to level 1 (weights to pinned host memory)
    drop: tuple[ServiceKey, ...] = ()  #: to level 2 (rollouts only)
    activate: tuple[ServiceKey, ...] = ()
    host_bytes_after: int = 0  #: host memory pinned on the node once applied

    @property
    def empty(self) -> bool:
        return not (self.park or self.drop or self.activate)


def replica_sets(gpus: Sequence[int], replica_gpus: int) -> list[tuple[int, ...]]:
    """A rollout set split into replicas of `replica_gpus` GPUs each; one set (one engine)
    when `replica_gpus` is 0, not smaller than the set, or does not divide it."""
    n = len(gpus)
    if replica_gpus <= 0 or replica_gpus >= n or n % replica_gpus:
        return [tuple(gpus)]
    return [tuple(gpus[i:i + replica_gpus]) for i in range(0, n, replica_gpus)]


def footprints_for_job(job_id: int, request: RlRequest, pool_gpus: Sequence[int],
                       rollout_replica_gpus: int = 0,
                       window: int | None = None,
                       rollout_backend: str | None = None,
                       trainer_backend: str | None = None) -> list[Footprint]:
    """The rollout (one engine, or replicas of `rollout_replica_gpus` GPUs) and trainer
    footprints of one job placed on `pool_gpus` (`window`: a floating pool's copy).
    `rollout_backend` and `trainer_backend` (the site's `services.*_backend`) say whether
    a parked rollout can be dropped (`DROPS_PARKED_BACKENDS`) and whether a service keeps
    its host buffers while active (`KEEPS_HOST_BACKENDS`); None: not counted on."""
    if len(pool_gpus) != request.gpus:
        raise ResidencyError(f"job {job_id} asks for {request.gpus} GPUs but is placed on "
                             f"{len(pool_gpus)}")
    out = []
    rollout = [pool_gpus[i] for i in request.gpus_for(Phase.ROLLOUT)]
    sets = replica_sets(rollout, rollout_replica_gpus)
    services: list[tuple[str, int | None, tuple[int, ...]]] = [
        ("rollout", None if len(sets) == 1 else i, g) for i, g in enumerate(sets)]
    services.append(("trainer", None, tuple(pool_gpus[i]
                                            for i in request.gpus_for(Phase.TRAIN))))
    backend = {"rollout": rollout_backend, "trainer": trainer_backend}
    for role, replica, members in services:
        gpus = frozenset(members)
        try:
            est = estimate_model_memory(request.model, role, gpus=max(1, len(gpus)))
        except ValueError as exc:
            if request.mem_bytes is None:
                raise ResidencyError(f"job {job_id}: {exc}") from None
            est = None
        if request.mem_bytes is not None:
            # --rl-mem is what the resident set needs per GPU while active; parked, the
            # contexts stay (estimate, or none for a model we cannot size) and the rest
            # moves to host memory.
            parked = est.parked_device_bytes() if est is not None else 0
            parked = min(parked, request.mem_bytes)
            active = request.mem_bytes
            host = (request.mem_bytes - parked) * len(gpus)
        else:
            assert est is not None
            active, parked = est.device_bytes, est.parked_device_bytes()
            host = est.parked_host_bytes(1) * len(gpus)
        out.append(Footprint(job_id, role, gpus, active, parked, host, replica=replica,
                             window=window,
                             drops_parked=role == "rollout"
                             and rollout_backend in DROPS_PARKED_BACKENDS,
                             keeps_host=backend[role] in KEEPS_HOST_BACKENDS))
    return out


def phase_roles(phase: Phase, job_services: Iterable[Footprint]) -> tuple[str, ...]:
    """The roles among one job's services (`job_services`) that `phase` needs active.

    A sync needs the trainer (it exports the weights) and, colocated, the rollout too:
    both live on the GPUs the sync lease holds, and the import runs there. Disaggregated
    (the rollout's GPUs are not the trainer's), a sync leases the trainer set only
    (`RlRequest.gpus_for`): the rollout keeps its residency, a parked one stages the
    weights in host memory and loads them when it is next activated, so nothing runs
    on a rollout set a partner may hold.
    """
    roles = PHASE_ROLES.get(phase, ())
    if phase is not Phase.SYNC:
        return roles
    by_role: dict[str, frozenset[int]] = {}
    for f in job_services:  # a replicated rollout: the union of its replicas' GPUs
        by_role[f.role] = by_role.get(f.role, frozenset()) | f.gpus
    trainer, rollout = by_role.get("trainer"), by_role.get("rollout")
    if trainer is not None and rollout is not None and not trainer & rollout:
        return ("trainer",)
    return roles


def _fits(gpus: Iterable[int], state: Mapping[ServiceKey, Residency],
          services: Mapping[ServiceKey, Footprint], capacity: Mapping[int, int]) -> int | None:
    """The first GPU among `gpus` over capacity, or None when all fit."""
    for g in sorted(gpus):
        used = sum(f.device_bytes(state[k]) for k, f in services.items() if g in f.gpus)
        if used > capacity[g]:
            return g
    return None


def plan_grant(
    services: Sequence[Footprint], capacity: Sequence[GpuCapacity], *, job_id: int,
    phase: Phase, host_budget_bytes: int, gpus: Iterable[int] | None = None,
    park_others: bool = False,
) -> ResidencyPlan:
    """Park/drop/activate so that job `job_id`'s `phase` services run on the lease's `gpus`
    (None: wherever they are); raise if impossible. A phase's service is activated only
    where the lease holds all its GPUs: one engine over a set cannot run on part of it.

    With `park_others`, other jobs' services still active on the lease's GPUs are parked
    too (an RL phase wants nearly all of a GPU's memory), but only while the node's host
    budget lasts: a park that memory does not require never drops a rollout nor pins
    host memory past the budget; what does not fit stays active."""
    by_key = {f.key: f for f in services}
    cap = {c.index: c.usable_bytes for c in capacity}
    mine = [f for f in services if f.job_id == job_id]
    roles = phase_roles(phase, mine)
    held = None if gpus is None else frozenset(gpus)
    needed = [f.key for f in mine if f.role in roles and (held is None or f.gpus <= held)]
    if not needed:
        return ResidencyPlan(host_bytes_after=_host(by_key, {k: f.residency
                                                             for k, f in by_key.items()}))
    activate = tuple(k for k in needed if by_key[k].residency is not Residency.ACTIVE
                     or by_key[k].uncertain)
    # once activated, a service whose park timed out is certain again: its host bytes
    # count only where its backend keeps them while active
    by_key.update((k, replace(by_key[k], uncertain=False)) for k in needed)
    touched = frozenset().union(*(by_key[k].gpus for k in needed))
    unknown = touched - cap.keys()
    if unknown:
        raise ResidencyError(f"no capacity known for pool GPU(s) {sorted(unknown)}")
    state = {k: f.residency for k, f in by_key.items()}
    for k in needed:
        state[k] = Residency.ACTIVE
    # park candidates: active services sharing a GPU with the phase; other jobs first,
    # then this job's idle services; larger footprints first (fewer parks)
    cands = sorted(
        (f for f in services if f.key not in needed and f.gpus & touched
         and state[f.key] is Residency.ACTIVE),
        key=lambda f: (f.job_id == job_id, -f.active_bytes, f.key))
    parked = _park_until_fits(touched, state, by_key, cap, cands, needed,
                              f"job {job_id}'s {phase} services")
    park, drop = _fit_host(by_key, state, parked, host_budget_bytes)
    if park_others:
        scope = touched if held is None else held
        others = sorted((f for f in services if f.job_id != job_id and f.gpus & scope),
                        key=lambda f: (-f.active_bytes, f.key))
        for f in others:
            # what parking it adds (nothing where its host bytes count already: its park
            # timed out, or its backend keeps them while active)
            more = f.pinned_host_bytes(Residency.PARKED) - f.pinned_host_bytes(state[f.key])
            if (state[f.key] is Residency.ACTIVE
                    and _host(by_key, state) + more <= host_budget_bytes):
                state[f.key] = Residency.PARKED
                park.append(f.key)
    return ResidencyPlan(tuple(park), tuple(drop), activate, _host(by_key, state))


def plan_floating_grant(services: Sequence[Footprint], capacity: Sequence[GpuCapacity], *,
                        job_id: int, phase: Phase, gpus: Iterable[int]) -> ResidencyPlan:
    """A floating pool's grant of window `gpus` to job `job_id`'s `phase`, or of the GPUs
    its rollout tail packed onto (part of a window): its copies of the phase's services
    there are activated (taking the job's state over from the node's memory; a rollout
    replica's copies share a state of their own). First every other job's active service on
    the window is parked, and so is every active copy of the job's own of those roles on
    another window: parking hands the state over, so one copy of a job's service holds it at
    a time. The job's other services on the window stay active while memory allows, as in a
    pool of fixed windows. Parked copies keep their state in the node's memory, one per job
    and role, which admission counted (`admit` on one window)."""
    held = frozenset(gpus)
    by_key = {f.key: f for f in services}
    mine = [f for f in services if f.job_id == job_id]
    roles = phase_roles(phase, [f for f in mine if f.gpus <= held])
    needed = [f.key for f in mine if f.role in roles and f.gpus <= held]
    if not needed:
        raise ResidencyError(f"job {job_id} has no {phase} service on pool GPUs "
                             f"{sorted(held)}")
    state = {k: f.residency for k, f in by_key.items()}
    park = [f.key for f in services if f.key not in needed and state[f.key] is Residency.ACTIVE
            and ((f.job_id != job_id and f.gpus & held)
                 or (f.job_id == job_id and f.role in roles and not f.gpus & held))]
    for k in (*park, *needed):
        state[k] = Residency.PARKED if k in park else Residency.ACTIVE
    cap = {c.index: c.usable_bytes for c in capacity}
    idle = sorted((f for f in mine if f.key not in needed and f.gpus & held
                   and state[f.key] is Residency.ACTIVE), key=lambda f: -f.active_bytes)
    if held <= cap.keys():
        park += _park_until_fits(held, state, by_key, cap, idle, needed,
                                 f"job {job_id}'s {phase} services")
    activate = [k for k in needed if by_key[k].residency is not Residency.ACTIVE
                or by_key[k].uncertain]
    return ResidencyPlan(park=tuple(park), activate=tuple(activate))


def _park_until_fits(gpus: frozenset[int], state: dict[ServiceKey, Residency],
                     by_key: Mapping[ServiceKey, Footprint], cap: Mapping[int, int],
                     candidates: Sequence[Footprint], needed: Sequence[ServiceKey],
                     what: str) -> list[ServiceKey]:
    """Park `candidates` in order (updating `state`) until every GPU of `gpus` fits;
    returns what it parked, or raises naming the GPU that cannot fit `what`."""
    parked: list[ServiceKey] = []
    while (over := _fits(gpus, state, by_key, cap)) is not None:
        victim = next((f for f in candidates if over in f.gpus
                       and state[f.key] is Residency.ACTIVE), None)
        if victim is None:
            need = sum(by_key[k].device_bytes(Residency.ACTIVE) for k in needed
                       if over in by_key[k].gpus)
            raise ResidencyError(
                f"{what} need {_gib(need)} on pool GPU {over}, which has "
                f"{_gib(cap[over])} usable with everything else parked")
        state[victim.key] = Residency.PARKED
        parked.append(victim.key)
    return parked


def _host(by_key: Mapping[ServiceKey, Footprint], state: Mapping[ServiceKey, Residency]) -> int:
    return sum(f.pinned_host_bytes(state[k]) for k, f in by_key.items())


def _fit_host(by_key: Mapping[ServiceKey, Footprint], state: dict[ServiceKey, Residency],
              parked: list[ServiceKey], budget: int) -> tuple[list[ServiceKey], list[ServiceKey]]:
    """Turn parks into drops (rollouts, largest first) until parked state fits the host.

    A rollout parked by this plan (`parked`: active until now) may be dropped instead; an
    already-parked one only where its backend frees its host copy on a level-2 park from
    parked (`Footprint.drops_parked`), else its drop would free nothing."""
    drop: list[ServiceKey] = []
    fresh = set(parked)
    # already-parked rollouts may be dropped too, to make room for a trainer's state
    droppable = sorted((k for k, f in by_key.items() if f.can_drop
                        and state[k] is Residency.PARKED
                        and (k in fresh or f.drops_parked)),
                       key=lambda k: -by_key[k].host_bytes)
    for k in droppable:
        if _host(by_key, state) <= budget:
            break
        state[k] = Residency.DROPPED
        drop.append(k)
    if _host(by_key, state) > budget:
        raise ResidencyError(
            f"state pinned on the host (parked services, and buffers a backend keeps while "
            f"active) needs {_gib(_host(by_key, state))} of host memory; the node's budget "
            f"for parked state is {_gib(budget)}")
    return [k for k in parked if state[k] is Residency.PARKED], drop


def admit(new: Sequence[Footprint], members: Sequence[Footprint],
          capacity: Sequence[GpuCapacity], host_budget_bytes: int) -> str | None:
    """None if a job with services `new` can share the pool with `members`, else why not.

    Every phase of the new job must fit with all other services parked (or dropped),
    and the other members' phases must still fit with the new job parked. Host memory is
    counted as `plan_grant` counts it: a phase's active services pin theirs too where
    their backend keeps its buffers while active (`Footprint.keeps_host`).
    """
    cap = {c.index: c.usable_bytes for c in capacity}
    for f in new:
        missing = f.gpus - cap.keys()
        if missing:
            return f"the pool has no GPU(s) {sorted(missing)} for the {f.role} service"
    everyone = [*members, *new]
    jobs = {f.job_id for f in everyone}
    for jid in sorted(jobs):
        for phase in PHASE_ROLES:
            # worst case: every other service parked
            start = [replace(f, residency=Residency.PARKED) for f in everyone]
            try:
                plan_grant(start, capacity, job_id=jid, phase=phase,
                           host_budget_bytes=host_budget_bytes)
            except ResidencyError as exc:
                who = "its" if jid in {f.job_id for f in new} else f"member job {jid}'s"
                return f"resident services do not fit: {who} {phase} phase: {exc}"
    return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"
