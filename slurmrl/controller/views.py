"""JSON shapes of the RPC answers (documented field by field in docs/rpc.md).

Visibility: a job's owner, root and admins see everything but the secret (which only the
`register` answer carries, to the owner); other users see a job's public fields only:
id, user, state, pool, GPU count, layout, phase, reason, times. Private: name, request
details (model, profile...), pool GPU mapping, leases' GPU sets, ledger, observations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from slurmrl.db import JobRecord, LeaseRecord, PoolRecord, ServiceRecord, WindowRecord
from slurmrl.leases.types import Lease
from slurmrl.model import LeaseState, dedicated_gpu_s


def wait_slowdown(waits: tuple[float, float] | None, end: float) -> float | None:
    """The slowdown its waits for GPUs have cost a job so far: the time since its first
    phase request over that time less the time its requests waited (`Store.lease_waits`).
    A lower bound on its slowdown against a dedicated run: handoffs (parking a partner,
    activating its own services) and a rollout started on part of its set are not
    waits. None before any request, and while all its time so far was waiting: then it
    is unbounded, which JSON cannot say (`lease_wait_seconds` > 0 tells the two apart;
    `slurmrl status` shows `inf`)."""
    if waits is None:
        return None
    first, waited = waits
    span = end - first
    return span / (span - waited) if span > 0 and span - waited > 0 else None


def job_view(job: JobRecord, *, private: bool, gpu_s: float | None, now: float,
             secret: bool = False, services: Sequence[ServiceRecord] = (),
             hide_user: bool = False, waits: tuple[float, float] | None = None,
             floating: bool = False, dedicated_pool: bool = False) -> dict[str, Any]:
    """A job as the caller may see it: `private` (its owner or an admin) or public;
    a public view's `user` and `uid` are null when the site hides other users
    (`controller.hide_other_users`). `waits`: its `Store.lease_waits` entry;
    `floating`: its pool floats (its services have a copy on every window);
    `dedicated_pool`: its pool is its own for good (`--rl-mux=off`, or placed so by
    the pairing policy): what it leaves idle nobody else can use."""
    end = job.ended_at if job.ended_at is not None else now
    out: dict[str, Any] = {
        "job_id": job.job_id,
        "user": None if hide_user and not private else job.user,
        # beside the name, as squeue shows both to everyone: `status -u UID` matches
        # jobs by either, and the CLI tells an unmatched entry by them
        "uid": None if hide_user and not private else job.uid,
        "state": str(job.state),
        # others see the reason's kind only ("PoolPending", "admission refused"): its
        # detail may quote the job's service log (model paths, tracebacks)
        "reason": job.reason if private else job.reason.split(":", 1)[0],
        "pool_id": job.pool_id,
        "group_id": job.group_id,
        "gpus": job.request.gpus,
        "gpu_type": job.request.gpu_type,  # --rl-gpus=TYPE:N's (null: any), as squeue's gres
        "layout": str(job.request.layout),
        "phase": job.phase,
        "registered_at": job.registered_at,
        "ended_at": job.ended_at,
        "private": private,
        "dedicated_pool": dedicated_pool,
    }
    if private:
        r = job.request
        dedicated = dedicated_gpu_s(r.gpus, job.registered_at,
                                    None if waits is None else waits[0], end)
        out.update({
            "name": job.name,
            "partition": job.partition,
            "request": {
                "gpus": r.gpus, "model": r.model, "mem_bytes": r.mem_bytes, "mux": str(r.mux),
                "group": r.group, "max_slowdown": r.max_slowdown, "layout": str(r.layout),
                "rollout_gpus": r.rollout_gpus, "steps": r.steps, "gpu_type": r.gpu_type,
                "profile": None if r.profile is None else {
                    "shares": {str(p): s for p, s in r.profile.shares},
                    "step_s": r.profile.step_s},
            },
            "pool_gpus": list(job.pool_gpus),
            "floating": floating,
            "gpu_sets": {k: list(v) for k, v in r.gpu_sets().items()},
            "gpu_seconds": gpu_s,
            "dedicated_gpu_seconds": dedicated,
            "lease_wait_seconds": None if waits is None else waits[1],
            "slowdown": wait_slowdown(waits, end),
            "services": [{"service_id": s.service_id, "role": s.role, "backend": s.backend,
                          "address": s.address, "state": s.state, "residency": s.residency,
                          "gpus": list(s.gpus)} for s in services],
        })
    if secret:
        out["secret"] = job.secret
    return out


def physical_gpus(pool: PoolRecord, windows: Sequence[WindowRecord] = ()) -> dict[int, int]:
    """Pool GPU -> the node's GPU index (as Slurm allocated it): a fixed pool's GPU i
    is its `gpu_indices[i]`; a floating pool's GPU w * G + i is its window w's GPU i
    (`windows`: its open ones)."""
    if not pool.floating:
        return dict(enumerate(pool.gpu_indices))
    return {w.window * len(w.gpu_indices) + i: d for w in windows
            for i, d in enumerate(w.gpu_indices)}


def lease_view(lease: Lease | LeaseRecord, pool_id: int, job: JobRecord | None,
               heartbeat_s: float, *, private: bool = True,
               physical: Mapping[int, int] | None = None) -> dict[str, Any]:
    if isinstance(lease, Lease):
        state, released_at, reason, gpus = LeaseState.HELD, None, "", sorted(lease.gpus)
        granted_at: float | None = lease.granted_at
    else:
        state, released_at, reason = lease.state, lease.released_at, lease.reason
        gpus, granted_at = list(lease.gpus), lease.granted_at
    out: dict[str, Any] = {
        "lease_id": lease.lease_id,
        "job_id": lease.job_id,
        "pool_id": pool_id,
        "phase": str(lease.phase),
        "state": str(state),
        "requested_at": lease.requested_at,
        "granted_at": granted_at,
        "deadline_at": lease.deadline_at,
        "released_at": released_at,
        "reason": reason,
        "heartbeat_s": heartbeat_s,
        "ngpus": len(gpus),
    }
    if private:
        local = []
        if job is not None:
            where = {g: i for i, g in enumerate(job.pool_gpus)}
            if gpus and not set(gpus) <= where.keys() and job.request.gpus:
                # a floating member's lease holds a whole window: pool GPU w * G + i is
                # its GPU i there
                where = {g: g % job.request.gpus for g in gpus}
            local = sorted(where[g] for g in gpus if g in where)
        out.update({
            "gpus": gpus,
            "local_gpus": local,
            "physical_gpus": [physical[g] for g in gpus if physical and g in physical],
        })
    return out


def pool_view(pool: PoolRecord, members: list[int], *, admin: bool,
              windows: Sequence[WindowRecord] = (),
              gpu_seconds: float | None = None) -> dict[str, Any]:
    """`windows`: a floating pool's open windows (each a Slurm allocation). A floating
    pool's `nodes` are its open windows' (a window recorded without a node is on the
    pool's first node), in window order. `gpu_seconds`: what Slurm allocated it so far
    (`Store.pool_gpu_seconds`: a floating pool's size changes with its windows)."""
    nodes = list(pool.nodes)
    if pool.floating and windows:
        home = pool.nodes[0] if pool.nodes else None
        nodes = list(dict.fromkeys(n for w in windows if (n := w.node or home)))
    out: dict[str, Any] = {
        "pool_id": pool.pool_id, "state": pool.state, "gpus": pool.gpus,
        "partition": pool.partition, "nodes": nodes, "members": members,
        "dedicated": pool.dedicated, "reason": pool.reason, "opened_at": pool.opened_at,
        "closed_at": pool.closed_at, "floating": pool.floating,
        "windows": len(windows) if pool.floating else None,
        "gpu_seconds": gpu_seconds,
    }
    if admin:
        out.update({"slurm_job_id": pool.slurm_job_id, "gpu_indices": list(pool.gpu_indices)})
        if pool.floating:
            out["window_slurm_job_ids"] = [w.slurm_job_id for w in windows]
    return out
