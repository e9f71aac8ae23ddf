"""What a driver uses: `connect()`, `job.phase(...)`, leases, service handles.

    job = slurmrl.connect()                   # SLURM_JOB_ID + SLURMRL_* from the job
    with job.phase("rollout") as lease:       # waits for the GPUs, then holds them
        ...
        lease.shrink(2)                       # give all but 2 GPUs back (long tail)
        lease.grow([2, 3])                    # take back those of them now free

A background thread heartbeats every `heartbeat_s` while the job holds or waits for a
lease. If the controller revokes the lease (missed heartbeats, job ended, pool lost),
the next call through the lease or a service handle raises `LeaseRevoked`, and so does
leaving the `with` block. While the controller restarts every call retries with backoff.

Known limits: one phase at a time per Job object (the usual RL loop); calls are blocking.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from slurmrl.client.rpc import ControllerError, RpcClient

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:6829"


class LeaseRevoked(Exception):
    """The controller took the lease back; the GPUs are no longer this job's."""

    def __init__(self, lease_id: int, phase: str, reason: str) -> None:
        super().__init__(f"lease {lease_id} ({phase}) was revoked by the controller: {reason}")
        self.lease_id, self.phase, self.reason = lease_id, phase, reason


class NoLease(RuntimeError):
    """A GPU call was made outside a held lease."""


class Lease:
    """GPUs of the pool this job's phase holds now."""

    def __init__(self, job: Job, data: Mapping[str, Any]) -> None:
        self._job = job
        self.lease_id: int = int(data["lease_id"])
        self.phase: str = str(data["phase"])
        self._update(data)
        self.revoked_reason: str | None = None
        self.released = False

    def _update(self, data: Mapping[str, Any]) -> None:
        self.gpus: tuple[int, ...] = tuple(data.get("local_gpus", ()))  #: job-local indices
        self.pool_gpus: tuple[int, ...] = tuple(data.get("gpus", ()))
        self.physical_gpus: tuple[int, ...] = tuple(data.get("physical_gpus", ()))
        self.pool_id: int = int(data["pool_id"])
        self.deadline_at: float = float(data["deadline_at"])
        self.granted_at: float = float(data.get("granted_at") or time.time())

    @property
    def held(self) -> bool:
        return not self.released and self.revoked_reason is None

    def check(self) -> None:
        """Raise `LeaseRevoked` if the controller took this lease back."""
        if self.revoked_reason is not None:
            raise LeaseRevoked(self.lease_id, self.phase, self.revoked_reason)
        if self.released:
            raise NoLease(f"lease {self.lease_id} ({self.phase}) was already released")

    def shrink(self, keep: int | None = None, *, gpus: Iterable[int] | None = None) -> None:
        """Keep only `keep` GPUs (the controller picks which: those no partner's window
        covers, else the lowest), or exactly the job-local `gpus`; the rest go to others
        now."""
        self.check()
        if gpus is not None:
            kept = sorted(set(gpus))
            if set(kept) == set(self.gpus):
                return
            body: dict[str, Any] = {"gpus": kept}
        elif keep is None:
            raise TypeError("shrink() needs keep (how many GPUs) or gpus (which ones)")
        elif keep >= len(self.gpus):
            return
        else:
            body = {"keep": int(keep)}
        _, ans = self._job._rpc.call(
            "POST", f"/v1/jobs/{self._job.job_id}/leases/{self.lease_id}/shrink", body)
        self._update(ans["lease"])

    def grow(self, gpus: Iterable[int]) -> tuple[int, ...]:
        """Ask for more of this phase's job-local `gpus`: the lease takes those free
        now that no other phase waits for (it never makes a partner wait), once the
        job's services there are active. Does not block; returns the GPUs it took."""
        self.check()
        wanted = sorted(set(gpus) - set(self.gpus))
        if not wanted:
            return ()
        _, ans = self._job._rpc.call(
            "POST", f"/v1/jobs/{self._job.job_id}/leases/{self.lease_id}/grow",
            {"gpus": wanted})
        self._update(ans["lease"])
        return tuple(ans["added"])

    def release(self, timing: Mapping[str, float] | None = None) -> None:
        if self.released or self.revoked_reason is not None:
            return
        path = f"/v1/jobs/{self._job.job_id}/leases/{self.lease_id}/release"
        try:
            self._job._rpc.call("POST", path, {"timing": dict(timing or {})})
        except ControllerError as exc:
            if exc.status != 409:
                raise
            # a retry after a restart: the first attempt may have landed
            _, ans = self._job._rpc.call(
                "GET", f"/v1/jobs/{self._job.job_id}/leases/{self.lease_id}")
            state = ans["lease"]["state"]
            if state == "revoked":
                self.revoked_reason = ans["lease"]["reason"] or "revoked"
                raise LeaseRevoked(self.lease_id, self.phase, self.revoked_reason) from None
            if state != "released":
                raise
        self.released = True

    def __repr__(self) -> str:
        return f"Lease({self.lease_id}, {self.phase}, gpus={list(self.gpus)})"


class Job:
    """A registered RL job, seen from its driver."""

    def __init__(self, job_id: int, url: str, env: Mapping[str, str], *,
                 retry_for_s: float = 300.0) -> None:
        self.job_id = job_id
        self._rpc = RpcClient(url, retry_for_s=retry_for_s)
        self._hb_rpc = RpcClient(url, retry_for_s=0.0)
        _, ans = self._rpc.call("POST", "/v1/jobs", {"job_id": job_id, "env": dict(env)})
        self.info: dict[str, Any] = ans["job"]
        self.secret: str = str(self.info.pop("secret", ""))
        for rpc in (self._rpc, self._hb_rpc):  # registered: HMAC sessions from now on
            rpc.session_job_id, rpc.use_sessions = job_id, True
        self.heartbeat_s = 2.0
        self.current: Lease | None = None
        self._stop = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                    name=f"slurmrl-heartbeat-{job_id}")
        self._hb.start()

    # -- phases ---------------------------------------------------------------------------
    def acquire(self, phase: str, *, min_gpus: int | None = None,
                timeout_s: float | None = None, poll_s: float = 30.0) -> Lease:
        """Wait for the phase's GPUs (at most `timeout_s`, forever if None)."""
        if self.current is not None and self.current.held:
            raise RuntimeError(f"already holding lease {self.current.lease_id} "
                               f"({self.current.phase}); release it first")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        body: dict[str, Any] = {"phase": phase, "min_gpus": min_gpus}
        while True:
            left = poll_s
            if deadline is not None:
                left = max(0.0, min(poll_s, deadline - time.monotonic()))
            body["wait_s"] = left
            status, ans = self._rpc.call("POST", f"/v1/jobs/{self.job_id}/leases", body,
                                         wait_s=left)
            if status == 200:
                lease = Lease(self, ans["lease"])
                self.heartbeat_s = float(ans["lease"].get("heartbeat_s", self.heartbeat_s))
                self.current = lease
                return lease
            if ans.get("state") == "ended":
                raise ControllerError(409, "job-ended", f"RL job {self.job_id} has ended")
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no {phase} lease within {timeout_s:g} s "
                                   f"({ans.get('state')}, {ans.get('reason', '')})")

    @contextmanager
    def phase(self, phase: str, *, min_gpus: int | None = None,
              timeout_s: float | None = None) -> Iterator[Lease]:
        """Hold the GPUs of `phase` for the block; release them (with its timing) after."""
        t0 = time.time()
        lease = self.acquire(phase, min_gpus=min_gpus, timeout_s=timeout_s)
        t1 = time.time()
        failed = False
        try:
            yield lease
        except BaseException:
            failed = True
            raise
        finally:
            timing = {"wait_s": t1 - t0, "busy_s": time.time() - t1}
            try:
                if lease.revoked_reason is None:
                    lease.release(timing)
            finally:
                self.current = None
            if not failed and lease.revoked_reason is not None:
                raise LeaseRevoked(lease.lease_id, lease.phase, lease.revoked_reason)

    def observe(self, phase: str, started_at: float, ended_at: float, *,
                detail: Mapping[str, float] | None = None) -> None:
        """Report a gap phase (`reward`, `idle`) the job spent off GPU.

        `detail` (numbers only) is stored with the observation; `slurmrl report` draws
        the reward curve from `{"step": N, "reward": mean reward}` on `reward` gaps.
        """
        body: dict[str, Any] = {"phase": phase, "started_at": started_at,
                                "ended_at": ended_at}
        if detail:  # added for `slurmrl report` (reward curves); the RPC already takes it
            body["detail"] = dict(detail)
        self._rpc.call("POST", f"/v1/jobs/{self.job_id}/observations", body)

    def service(self, role: str, backend: str | None = None, *,
                timeout_s: float = 120.0) -> Any:
        """A handle on this job's `role` service; its calls need a held lease."""
        from slurmrl.client.services import LeasedService

        return LeasedService.find(self, role, backend, timeout_s)

    def status(self) -> dict[str, Any]:
        _, ans = self._rpc.call("GET", f"/v1/jobs/{self.job_id}")
        return dict(ans["job"])

    def close(self, state: str = "CD", reason: str = "driver finished") -> None:
        """Deregister: the job's leases end and its pool slot is freed."""
        self._stop.set()
        if self.current is not None and self.current.held:
            self.current.release()
        self._rpc.call("POST", f"/v1/jobs/{self.job_id}/end", {"state": state, "reason": reason})
        self._rpc.close()

    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close("CD" if exc_type is None else "F",
                   "driver finished" if exc_type is None else f"driver raised {exc_type}")

    # -- heartbeat --------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.heartbeat()
            except ControllerError as exc:
                log.info("heartbeat failed: %s", exc)
            except Exception:  # never let the thread die silently
                log.exception("heartbeat failed")

    def heartbeat(self) -> None:
        lease = self.current
        _, ans = self._hb_rpc.call("POST", f"/v1/jobs/{self.job_id}/heartbeat", {})
        held = {x["lease_id"] for x in ans.get("held", [])}
        if lease is not None and lease.held and lease.lease_id not in held:
            _, got = self._hb_rpc.call("GET", f"/v1/jobs/{self.job_id}/leases/{lease.lease_id}")
            rec = got["lease"]
            if rec["state"] == "revoked" and not lease.released:
                lease.revoked_reason = rec["reason"] or "revoked"
                log.warning("lease %d revoked: %s", lease.lease_id, lease.revoked_reason)


def connect(env: Mapping[str, str] | None = None, *, url: str | None = None,
            retry_for_s: float = 300.0) -> Job:
    """Register this Slurm job with the controller and return its `Job`.

    Reads `SLURM_JOB_ID` and the `SLURMRL_*` variables the SPANK plugin exported;
    the controller URL is `url`, else `SLURMRL_CONTROLLER`, else http://127.0.0.1:6829.
    """
    environ = os.environ if env is None else env
    raw = environ.get("SLURM_JOB_ID", "")
    if not (raw.isascii() and raw.isdigit()):
        raise RuntimeError("SLURM_JOB_ID is not set: slurmrl.connect() runs inside a "
                           "Slurm batch job submitted with --rl-gpus")
    rl = {k: v for k, v in environ.items()
          if k.startswith("SLURMRL_") and "__" not in k and k != "SLURMRL_CONTROLLER"}
    return Job(int(raw), url or environ.get("SLURMRL_CONTROLLER") or DEFAULT_URL, rl,
               retry_for_s=retry_for_s)
