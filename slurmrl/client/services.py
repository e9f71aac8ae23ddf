"""`job.service(role)`: the worker's `ServiceHandle`, usable only inside a held lease.

The controller lists a job's services (address, role) once the pool manager launched
them; this module waits for one, then wraps its `ServiceHandle` so that every call first
checks that the job holds a lease (raising `NoLease` or `LeaseRevoked` otherwise).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from slurmrl.client.job import NoLease
from slurmrl.client.replicas import FloatingRollout, ReplicatedRollout
from slurmrl.client.rpc import ControllerError
from slurmrl.worker.handle import ServiceUnreachable
from slurmrl.worker.protocol import Role

if TYPE_CHECKING:
    from slurmrl.client.job import Job

#: the roles a job's services have
ROLES = tuple(r.value for r in Role)
#: the states of a job that has ended (JobView's `state`)
ENDED = ("CD", "F", "CA")


class LeasedService:
    """A service handle whose calls need a held lease of its job."""

    def __init__(self, job: Job, handle: Any) -> None:
        self._job = job
        self._handle = handle

    @classmethod
    def find(cls, job: Job, role: str, backend: str | None, timeout_s: float
             ) -> LeasedService | ReplicatedRollout | WindowedService:
        """The job's `role` service once the job is placed and its services are up; a
        rollout run as several replicas comes back as one `ReplicatedRollout`. Raises
        `ValueError` at once for a role no service has (or, once the job's services
        are up, a role and backend none of them has), and `ControllerError`
        `job-ended` once the job has ended (its pool failed to start, its admission was
        refused, ...), saying why."""
        from slurmrl.worker.handle import ServiceHandle

        if role not in ROLES:
            raise ValueError(f"no service role {role!r}: a job's services are "
                             f"{' and '.join(ROLES)}")
        deadline = time.monotonic() + timeout_s
        while True:
            st = job.status()
            _check_running(job, st, role)
            services = st.get("services", [])
            found = [s for s in services if s["role"] == role
                     and (backend is None or s["backend"] == backend)]
            if st.get("pool_id") is not None and services and not found \
                    and all(s["address"] for s in services):  # up, and none will come
                have = ", ".join(f"{s['role']} ({s['backend']})" for s in services)
                raise ValueError(f"RL job {job.job_id} has no {role} service"
                                 + (f" of backend {backend!r}" if backend else "")
                                 + f"; its services: {have}")
            # placed only once every service of the job is up; each has its address then
            if st.get("pool_id") is not None and found and all(s["address"] for s in found):
                if st.get("floating"):  # a copy on every window the pool has, or will have
                    g = len(st.get("pool_gpus", ()))
                    size = len(found[0]["gpus"])
                    if role == "rollout" and 0 < size < g:  # replicas: its tail can pack
                        return FloatingRollout(job, g // size, found)
                    return WindowedService(job, role, backend, found)
                handles = [cls(job, ServiceHandle(s["address"], job.secret, str(job.job_id),
                                                  role)) for s in found]
                if len(handles) == 1:
                    return handles[0]
                where = {g: i for i, g in enumerate(st.get("pool_gpus", []))}
                gpus = [tuple(where[g] for g in s["gpus"]) for s in found]
                return ReplicatedRollout(job, handles, gpus)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"RL job {job.job_id} has no {role} service after "
                                   f"{timeout_s:g} s (is it placed in a pool?)")
            time.sleep(0.5)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._handle, name)
        if not callable(attr) or name in ("close",):
            return attr

        def guarded(*args: Any, **kwargs: Any) -> Any:
            lease = self._job.current
            if lease is None:
                raise NoLease(f"{self._handle.role}.{name}() needs a held lease: call it "
                              "inside `with job.phase(...)`")
            lease.check()
            try:
                return attr(*args, **kwargs)
            except ServiceUnreachable as exc:
                raise self._explain(exc) from exc

        return guarded

    # issue 4 (pool manager): a service that vanished mid-call usually went down with its
    # pool; ask the controller why, so the driver sees the reason, not ECONNREFUSED.
    def _explain(self, exc: Exception, wait_s: float = 15.0) -> Exception:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                st = self._job.status()
            except Exception:
                return exc
            if st.get("state") in ENDED:
                return ServiceLost(f"the {self._handle.role} service of RL job "
                                   f"{self._job.job_id} is gone: the job ended "
                                   f"({st.get('state')}): {st.get('reason') or 'no reason'}")
            if time.monotonic() >= deadline:
                return exc
            time.sleep(0.5)


def _check_running(job: Job, st: dict[str, Any], role: str) -> None:
    """`ControllerError` `job-ended` (as an acquire raises it) if the job has ended: its
    `role` service will never come up."""
    if st.get("state") in ENDED:
        why = f"the job has ended ({st['state']}): {st.get('reason') or 'no reason given'}"
    elif job.ended_reason is not None:
        why = job.ended_reason
    else:
        return
    raise ControllerError(409, "job-ended", f"RL job {job.job_id} has no {role} service: "
                          f"{why}")


class WindowedService:
    """A floating pool member's service: one copy on every window of the pool, the job's
    state in whichever its lease's window runs; each call goes to the copy on the GPUs
    the job's lease holds. The copies are asked for again with each new lease: the pool
    may have taken a window since, or given one back and taken another."""

    def __init__(self, job: Job, role: str, backend: str | None,
                 found: list[dict[str, Any]]) -> None:
        self._job, self.role, self._backend = job, role, backend
        self._copies: dict[frozenset[int], tuple[str, LeasedService]] = {}
        self._lease_id: int | None = None
        self._learn(found)

    def _learn(self, found: list[dict[str, Any]]) -> None:
        from slurmrl.worker.handle import ServiceHandle

        for s in found:
            gpus, address = frozenset(s["gpus"]), s["address"]
            if address and self._copies.get(gpus, ("",))[0] != address:
                self._copies[gpus] = (address, LeasedService(self._job, ServiceHandle(
                    address, self._job.secret, str(self._job.job_id), self.role)))

    def _here(self) -> LeasedService:
        lease = self._job.current
        if lease is None:
            raise NoLease(f"{self.role} calls need a held lease: call them inside "
                          "`with job.phase(...)`")
        if lease.lease_id != self._lease_id:
            self._learn([s for s in self._job.status().get("services", [])
                         if s["role"] == self.role
                         and (self._backend is None or s["backend"] == self._backend)])
            self._lease_id = lease.lease_id
        held = set(lease.pool_gpus)
        for gpus, (_, svc) in self._copies.items():
            if gpus <= held:
                return svc
        raise NoLease(f"RL job {self._job.job_id} has no {self.role} service on the GPUs "
                      f"its lease holds ({sorted(held)})")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._here(), name)


class ServiceLost(RuntimeError):
    """A service's job ended under it (e.g. its pool was cancelled); says why."""
