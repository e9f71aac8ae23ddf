"""Rows of the colocation DB as frozen dataclasses, and the JSON forms of model values.

These are what `Store` returns; nothing outside `slurmrl/db/` sees a SQL row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from slurmrl.model import JobState, Layout, LeaseState, Mux, Phase, PhasePrior, RlRequest


def request_to_json(req: RlRequest) -> str:
    profile = None
    if req.profile is not None:
        profile = {
            "shares": [[str(p), s] for p, s in req.profile.shares],
            "step_s": req.profile.step_s,
        }
    return json.dumps(
        {
            "gpus": req.gpus,
            "model": req.model,
            "mem_bytes": req.mem_bytes,
            "mux": str(req.mux),
            "group": req.group,
            "max_slowdown": req.max_slowdown,
            "profile": profile,
            "layout": str(req.layout),
            "rollout_gpus": req.rollout_gpus,
            "steps": req.steps,
            "gpu_type": req.gpu_type,
        },
        sort_keys=True,
    )


def request_from_json(text: str) -> RlRequest:
    d = json.loads(text)
    profile = None
    if d.get("profile"):
        p = d["profile"]
        profile = PhasePrior(
            tuple((Phase(k), float(v)) for k, v in p["shares"]), p.get("step_s")
        )
    return RlRequest(
        gpus=int(d["gpus"]),
        model=d.get("model", "tiny"),
        mem_bytes=d.get("mem_bytes"),
        mux=Mux(d.get("mux", "auto")),
        group=d.get("group"),
        max_slowdown=d.get("max_slowdown"),
        profile=profile,
        layout=Layout(d.get("layout", "colocated")),
        rollout_gpus=d.get("rollout_gpus"),
        steps=d.get("steps"),  # absent in records written before --rl-steps
        gpu_type=d.get("gpu_type"),  # absent in records written before GPU types
    )


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in json.loads(text))


@dataclass(frozen=True)
class JobRecord:
    """An RL job the controller knows (one per driver's Slurm job)."""

    job_id: int
    user: str
    uid: int
    request: RlRequest
    state: JobState
    registered_at: float
    name: str = ""
    partition: str = ""
    reason: str = ""
    pool_id: int | None = None
    group_id: int | None = None
    pool_gpus: tuple[int, ...] = ()  #: pool GPU index of each job-local GPU
    phase: str | None = None
    secret: str = ""
    ended_at: float | None = None
    #: Slurm's start time of the run that registered the job (a requeued job's next run
    #: starts at another); None where Slurm did not say
    slurm_started_at: float | None = None

    def pool_gpus_for(self, phase: Phase) -> frozenset[int]:
        """The pool GPUs a phase of this job runs on (empty before placement)."""
        if not self.pool_gpus:
            return frozenset()
        return frozenset(self.pool_gpus[i] for i in self.request.gpus_for(phase))


@dataclass(frozen=True)
class PoolRecord:
    """A pinned Slurm allocation hosting one group's services."""

    pool_id: int
    gpus: int
    state: str  #: pending | open | closed
    opened_at: float
    slurm_job_id: int | None = None
    partition: str = ""
    nodes: tuple[str, ...] = ()
    gpu_indices: tuple[int, ...] = ()
    dedicated: bool = False
    reason: str = ""
    closed_at: float | None = None
    #: a floating pool: whole windows (`WindowRecord`), each its own allocation
    floating: bool = False


@dataclass(frozen=True)
class WindowRecord:
    """One window of a floating pool: a Slurm allocation of G GPUs on one node (the
    pool's, or with `slurm.floating_across_nodes` another), pool GPUs `window * G` ..
    `window * G + G - 1`."""

    window_id: int
    pool_id: int
    window: int
    slurm_job_id: int
    gpu_indices: tuple[int, ...]
    opened_at: float
    closed_at: float | None = None
    node: str | None = None  #: the node it is on; None: the pool's node


@dataclass(frozen=True)
class GroupRecord:
    group_id: int
    pool_id: int
    created_at: float
    dissolved_at: float | None = None


@dataclass(frozen=True)
class ServiceRecord:
    """A resident model worker (a Slurm step in a pool) of one RL job."""

    service_id: int
    job_id: int
    role: str
    started_at: float
    pool_id: int | None = None
    backend: str = ""
    step_id: str | None = None
    gpus: tuple[int, ...] = ()
    address: str = ""
    residency: str = "stopped"
    state: str = "starting"
    ended_at: float | None = None
    #: the controller's key to its park/activate/stop (None: the job's secret opens them)
    control_secret: str | None = field(default=None, repr=False)
    #: a floating member's copy: where it hands the job's state over (None: no hand-off,
    #: or not recorded, started by a controller before schema 8)
    handoff_dir: str | None = None


@dataclass(frozen=True)
class LeaseRecord:
    """A phase request and, once granted, its lease (same id)."""

    lease_id: int
    pool_id: int
    job_id: int
    phase: Phase
    wanted: tuple[int, ...]
    gpus: tuple[int, ...]
    min_gpus: int
    state: LeaseState
    requested_at: float
    deadline_at: float
    granted_at: float | None = None
    released_at: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class ObservationRecord:
    """One phase of one job as it happened (a lease's life, or a reported gap)."""

    observation_id: int
    job_id: int
    phase: Phase
    lease_id: int | None
    requested_at: float | None
    granted_at: float | None
    released_at: float | None
    busy_s: float | None
    gpus: int
    detail: dict[str, Any]
