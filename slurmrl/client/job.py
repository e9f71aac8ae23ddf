"""What a driver uses: `connect()`, `job.phase(...)`, leases, service handles.

    job = slurmrl.connect()                   # SLURM_JOB_ID + SLURMRL_* from the job
    with job.phase("rollout") as lease:       # waits for the GPUs, then holds them
        ...
        lease.shrink(2)                       # give all but 2 GPUs back (long tail)
        lease.grow([2, 3])                    # take back those of them now free
    with job.phase("train") as lease:
        ...
        lease.switch("sync")                  # the sync holds these GPUs now, no queueing
    with job.phase("sync"):                   # adopts the lease the switch granted
        ...

A background thread heartbeats every `heartbeat_s` while the job holds or waits for a
lease. If the controller revokes the lease (missed heartbeats, job ended, pool lost),
the next call through the lease or a service handle raises `LeaseRevoked`, and so does
leaving the `with` block; once the job has ended the heartbeats stop, and so they do
once the driver's main thread has ended (its lease then lapses, even where another
thread of the driver still runs). The interval is the site's (`heartbeat_s` in the
controller's answers), the first beat at once and one right after each grant. While the
controller restarts every call retries with backoff. A phase request given up
(`timeout_s`) is withdrawn, so the GPUs never go to a driver that stopped waiting.

Known limits: one phase at a time per Job object (the usual RL loop); calls are blocking.
"""

from __future__ import annotations

import logging
import operator
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from slurmrl.client.rpc import BAD_ANSWER, ControllerError, RpcClient, need

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:6829"


#: the most a heartbeat waits for its answer (its RPC client's default: 30 s)
HEARTBEAT_TIMEOUT_MAX_S = 30.0
#: how long a phase given up (`timeout_s`) retries withdrawing its request
WITHDRAW_RETRY_S = 5.0
#: the most of a driver's exception message its failed job's reason keeps
FAILURE_MESSAGE_MAX = 400


def _indices(gpus: Iterable[int]) -> list[int]:
    """Distinct GPU indices, sorted, as ints (NumPy's and torch's integers too)."""
    return sorted({operator.index(g) for g in gpus})


def _numbers(what: str, values: Mapping[str, float]) -> dict[str, float]:
    """`values` as floats (NumPy's and torch's scalars too): JSON numbers; `ValueError`
    naming the key of one that is not a number."""
    out: dict[str, float] = {}
    for key, value in values.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{what}[{key!r}] must be a number, got "
                             f"{type(value).__name__}") from None
    return out


def _failure(exc_type: type[BaseException], exc: BaseException | None) -> str:
    """The reason a failed job is ended with: the exception's type and message, on one
    line, its message cut to `FAILURE_MESSAGE_MAX` characters."""
    try:
        message = " ".join(str(exc).split()) if exc is not None else ""
    except Exception:  # a broken __str__ must not hide the driver's error
        message = ""
    if len(message) > FAILURE_MESSAGE_MAX:
        message = message[:FAILURE_MESSAGE_MAX - 3] + "..."
    # the controller refuses text that is not valid Unicode (a lone surrogate)
    message = message.encode("utf-8", "replace").decode()
    return f"driver raised {exc_type.__name__}" + (f": {message}" if message else "")


class LeaseRevoked(Exception):
    """The controller took the lease back; the GPUs are no longer this job's."""

    def __init__(self, lease_id: int, phase: str, reason: str) -> None:
        super().__init__(f"lease {lease_id} ({phase}) was revoked by the controller: {reason}")
        self.lease_id, self.phase, self.reason = lease_id, phase, reason


class NoLease(RuntimeError):
    """A GPU call was made outside a held lease."""


class Lease:
    """GPUs of the pool this job's phase holds now."""

    def __init__(self, job: Job, data: Mapping[str, Any], *,
                 asked_at: float | None = None) -> None:
        self._job = job
        self.lease_id: int = int(need(data, "lease_id", int))
        self.phase: str = str(need(data, "phase", str))
        self._update(data)
        self.revoked_reason: str | None = None
        self.released = False
        #: when this driver asked for the lease and when it got it (its own clock)
        self._held_from = time.time()
        self._asked_at = self._held_from if asked_at is None else asked_at
        #: granted by `switch` and not yet taken up by `Job.acquire` of its phase
        self._adoptable = False

    def _update(self, data: Mapping[str, Any]) -> None:
        self.gpus: tuple[int, ...] = tuple(data.get("local_gpus", ()))  #: job-local indices
        self.pool_gpus: tuple[int, ...] = tuple(data.get("gpus", ()))
        self.physical_gpus: tuple[int, ...] = tuple(data.get("physical_gpus", ()))
        self.pool_id: int = int(need(data, "pool_id", int))
        self.deadline_at: float = float(need(data, "deadline_at", (int, float)))
        self.granted_at: float = float(data.get("granted_at") or time.time())

    @property
    def held(self) -> bool:
        return not self.released and self.revoked_reason is None

    def timing(self) -> dict[str, float]:
        """What a release reports: `wait_s` (asking to getting it), `busy_s` (since); never
        negative (the controller refuses that), even if the clock stepped back."""
        return {"wait_s": max(0.0, self._held_from - self._asked_at),
                "busy_s": max(0.0, time.time() - self._held_from)}

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
            kept = _indices(gpus)
            if set(kept) == set(self.gpus):
                return
            body: dict[str, Any] = {"gpus": kept}
        elif keep is None:
            raise TypeError("shrink() needs keep (how many GPUs) or gpus (which ones)")
        elif keep >= len(self.gpus):
            return
        else:
            body = {"keep": int(keep)}
        ans = self._post("shrink", body)
        self._update(need(ans, "lease", dict))

    def grow(self, gpus: Iterable[int]) -> tuple[int, ...]:
        """Ask for more of this phase's job-local `gpus`: the lease takes those free
        now that no other phase waits for (it never makes a partner wait), once the
        job's services there are active. Does not block; returns the GPUs it took."""
        self.check()
        wanted = sorted(set(_indices(gpus)) - set(self.gpus))
        if not wanted:
            return ()
        # safe to repeat: `held` lets the controller answer a resend (its answer lost,
        # e.g. a timeout while hand-offs queue) with what the first attempt took
        ans = self._post("grow", {"gpus": wanted, "held": sorted(self.pool_gpus)},
                         idempotent=True)
        lease, added = need(ans, "lease", dict), need(ans, "added", list)
        self._update(lease)
        return tuple(added)

    def pack(self, gpus: Iterable[int]) -> None:
        """A floating pool's rollout tail: keep only as many GPUs as the job-local `gpus`
        of its window (its replicas still generating), wherever the controller packs
        them (the fullest window with room, so that a whole window frees; or exactly
        those on its own). Returns once the job's replicas there are active; read
        `pool_gpus` for where the lease is now."""
        self.check()
        # safe to repeat: `held` lets the controller tell a resend (its answer lost,
        # e.g. a timeout while hand-offs queue) from a new pack, and answer the lease
        ans = self._post("pack", {"gpus": _indices(gpus), "held": sorted(self.pool_gpus)},
                         idempotent=True)
        self._update(need(ans, "lease", dict))

    def release(self, timing: Mapping[str, float] | None = None) -> None:
        if self.released or self.revoked_reason is not None:
            return
        # after a call gave up on the controller, once: the lease lapses unrenewed anyway
        self._post("release", {"timing": _numbers("timing", timing or {})}, idempotent=True,
                   retry=not self._job._rpc.lost)
        self.released = True

    def switch(self, phase: str, timing: Mapping[str, float] | None = None) -> Lease:
        """End this lease (reporting `timing`, default `timing()`) and hold the job's
        `phase` at once: a colocated train keeps its GPUs for its weight sync instead of
        queueing behind its partner. Returns the new lease, now `job.current`; the next
        `job.phase` (or `acquire`) of `phase` takes it up instead of asking again.

        The controller switches a lease to a phase on the same GPUs, once; on part of a
        pool (a disaggregated trainer set, a staggered pool's window) only for the member
        that has waited the larger share of its time. Where it refuses (or has no
        switch), this falls back to `release(timing)` and `job.acquire(phase)`, which
        queues; so a driver may always call it.
        """
        self.check()
        report = _numbers("timing", self.timing() if timing is None else timing)
        asked = time.time()
        try:
            # safe to repeat: a retry after a lost answer finds this lease switched
            # (409), and the fallback's acquire then answers the lease it became
            ans = self._post("switch", {"phase": phase, "timing": report}, idempotent=True)
        except ControllerError as exc:
            route_unknown = exc.status == 404 and exc.code == "http"
            if not (exc.status == 409 and exc.code == "cannot-switch") and not route_unknown:
                raise
            log.debug("lease %d not switched to %s (%s): release and acquire",
                      self.lease_id, phase, exc.message)
            self.release(report)
            lease = self._job.acquire(phase)
        else:
            self.released = True
            data = need(ans, "lease", dict)
            lease = Lease(self._job, data, asked_at=asked)
            self._job.current = lease
        lease._adoptable = True
        return lease

    def _post(self, op: str, body: dict[str, Any], idempotent: bool = False,
              retry: bool = True) -> dict[str, Any]:
        """POST to this lease's `op`; a 409 because the controller took the lease back
        (its job ended, it lapsed) raises `LeaseRevoked` with the reason."""
        path = f"/v1/jobs/{self._job.job_id}/leases/{self.lease_id}/{op}"
        try:
            return self._job._rpc.call("POST", path, body, idempotent=idempotent,
                                       retry=retry)[1]
        except ControllerError as exc:
            if exc.status != 409:
                raise
            reason: str | None = None
            if exc.code == "job-ended":
                self._job._ended(exc.message)
                reason = exc.message
            else:  # e.g. "lease N is not held": read what became of it
                rec = self._job._read_lease(self.lease_id)
                if op == "release" and rec["state"] == "released":
                    return rec  # a retry after a restart: the first attempt landed
                if rec["state"] == "revoked":
                    reason = str(rec.get("reason") or "revoked")
            if reason is None or self.released:
                raise
            self.revoked_reason = reason
            raise LeaseRevoked(self.lease_id, self.phase, reason) from None

    def __repr__(self) -> str:
        return f"Lease({self.lease_id}, {self.phase}, gpus={list(self.gpus)})"


class Job:
    """A registered RL job, seen from its driver."""

    def __init__(self, job_id: int, url: str, env: Mapping[str, str], *,
                 retry_for_s: float = 300.0) -> None:
        self.job_id = job_id
        self._rpc = RpcClient(url, retry_for_s=retry_for_s)
        self._hb_rpc = RpcClient(url, retry_for_s=0.0)
        _, ans = self._rpc.call("POST", "/v1/jobs", {"job_id": job_id, "env": dict(env)},
                                idempotent=True)
        self.info: dict[str, Any] = need(ans, "job", dict)
        self.secret: str = str(self.info.pop("secret", ""))
        for rpc in (self._rpc, self._hb_rpc):  # registered: HMAC sessions from now on
            rpc.session_job_id, rpc.use_sessions = job_id, True
        self.heartbeat_s = 2.0
        self.current: Lease | None = None
        #: why the controller ended the job under the driver (None: it has not)
        self.ended_reason: str | None = None
        self._stop = threading.Event()
        #: set to beat at once: a grant (a new lease wants renewing within the site's
        #: interval, not the one the thread sleeps on) or a stop
        self._beat_now = threading.Event()
        self._hb = threading.Thread(target=self._heartbeat_loop, daemon=True,
                                    name=f"slurmrl-heartbeat-{job_id}")
        self._hb.start()

    # -- phases ---------------------------------------------------------------------------
    def acquire(self, phase: str, *, min_gpus: int | None = None,
                timeout_s: float | None = None, poll_s: float = 30.0) -> Lease:
        """Wait for the phase's GPUs (at most `timeout_s`, forever if None). The lease
        of `phase` a `Lease.switch` granted is taken up as it is."""
        current = self.current
        if current is not None and current.held:
            if current._adoptable and current.phase == phase:
                current._adoptable = False
                return current
            raise RuntimeError(f"already holding lease {current.lease_id} "
                               f"({current.phase}); release it first")
        asked = time.time()
        deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
        body: dict[str, Any] = {"phase": phase, "min_gpus": None if min_gpus is None
                                else operator.index(min_gpus)}
        told: tuple[str, str] | None = None  #: the state last logged
        request_id: int | None = None  #: the queued request, as last answered
        while True:
            left = poll_s
            if deadline is not None:
                left = max(0.0, min(poll_s, deadline - time.monotonic()))
            body["wait_s"] = left
            # idempotent: the controller joins a retry to the request queued for this
            # (job, phase), or answers the lease already granted to it. Retried while
            # the controller is away, up to the phase's deadline
            try:
                status, ans = self._rpc.call("POST", f"/v1/jobs/{self.job_id}/leases", body,
                                             wait_s=left, idempotent=True,
                                             retry_until=deadline)
            except ControllerError as exc:
                away = exc.code == "unreachable" or (exc.status or 0) >= 500
                if deadline is None or time.monotonic() < deadline or not away:
                    raise
                # the controller is likely away still: withdraw without retrying
                raise TimeoutError(f"no {phase} lease within {timeout_s:g} s (controller "
                                   f"away: {exc}); {self._withdraw(request_id, 0.0)}"
                                   ) from exc
            if status == 200:
                data = need(ans, "lease", dict)
                lease = Lease(self, data, asked_at=asked)
                self.heartbeat_s = float(data.get("heartbeat_s") or self.heartbeat_s)
                self.current = lease
                self._beat_now.set()
                return lease
            state, reason = need(ans, "state", str, status), ans.get("reason") or ""
            if state not in ("waiting", "unplaced", "ended"):
                raise ControllerError(status, BAD_ANSWER,
                                      f"unknown state {state[:40]!r} in an acquire answer")
            if state == "ended":
                raise ControllerError(409, "job-ended", f"RL job {self.job_id} has ended"
                                      + (f": {reason}" if reason else ""))
            if (state, reason) != told:  # a long wait says why, once per change
                told = (state, reason)
                # WARNING: what a driver that configured no logging still shows
                log.warning("RL job %d: %s lease %s%s", self.job_id, phase,
                         "waits for its placement in a pool" if state == "unplaced"
                         else "queued behind the pool's other jobs",
                         f" ({reason})" if reason else "")
            rid = ans.get("request_id")
            request_id = rid if isinstance(rid, int) else None
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no {phase} lease within {timeout_s:g} s ({state}"
                                   + (f": {reason}" if reason else "")
                                   + f"); {self._withdraw(request_id, WITHDRAW_RETRY_S)}")

    def _withdraw(self, request_id: int | None, retry_s: float) -> str:
        """Take back a queued request this driver no longer waits for (else heartbeats
        keep it queued and it is granted, and charged, to nobody); says what became of
        it. A request granted meanwhile is released by the same call. Retries for
        `retry_s` at most (the driver gave up waiting: it is not held for minutes)."""
        if request_id is None:
            return "no request was queued"
        until = time.monotonic() + retry_s
        try:
            try:
                _, ans = self._rpc.call(
                    "POST", f"/v1/jobs/{self.job_id}/leases/{request_id}/release",
                    {"timing": {}}, idempotent=True, retry_until=until)
                state = need(need(ans, "lease", dict), "state", str)
            except ControllerError as exc:
                if exc.status != 409:
                    raise
                # a retry that had landed
                state = self._read_lease(request_id, retry_until=until)["state"]
        except ControllerError as exc:
            log.warning("could not withdraw lease request %d: %s", request_id, exc)
            return f"request {request_id} may still be queued (withdrawing it failed: {exc})"
        if state in ("cancelled", "revoked"):
            return f"request {request_id} was withdrawn"
        if state == "released":
            return f"request {request_id} was withdrawn (granted meanwhile, now released)"
        log.warning("lease request %d is %s after withdrawing it", request_id, state)
        return f"request {request_id} could not be withdrawn (it is {state})"

    def _read_lease(self, lease_id: int, retry_until: float | None = None) -> dict[str, Any]:
        """The controller's record of one of this job's leases (or requests)."""
        _, ans = self._rpc.call("GET", f"/v1/jobs/{self.job_id}/leases/{lease_id}",
                                retry_until=retry_until)
        rec: dict[str, Any] = need(ans, "lease", dict)
        need(rec, "state", str)
        return rec

    @contextmanager
    def phase(self, phase: str, *, min_gpus: int | None = None,
              timeout_s: float | None = None) -> Iterator[Lease]:
        """Hold the GPUs of `phase` for the block; release them (with its timing) after,
        unless the block switched the lease to the next phase (`Lease.switch`)."""
        lease = self.acquire(phase, min_gpus=min_gpus, timeout_s=timeout_s)
        failed = False
        try:
            yield lease
        except BaseException:
            failed = True
            raise
        finally:
            try:
                if lease.revoked_reason is None:
                    try:
                        lease.release(lease.timing())
                    except (LeaseRevoked, ControllerError) as exc:
                        if not failed:
                            raise
                        # the block's own error is the one to see (its lease was revoked
                        # meanwhile, or the controller is away: it lapses unrenewed)
                        log.warning("lease %d (%s) not released after the block failed: "
                                    "%s", lease.lease_id, lease.phase, exc)
            finally:
                if self.current is lease:  # not the lease a switch made current
                    self.current = None
                elif failed:
                    self._drop_switched()
            if not failed and lease.revoked_reason is not None:
                raise LeaseRevoked(lease.lease_id, lease.phase, lease.revoked_reason)

    def _drop_switched(self) -> None:
        """The block that switched its lease failed: release the lease the switch made
        current, not taken up by a phase (a retried step acquires anew; held, it would
        keep the GPUs from the partner and refuse the job's next phase)."""
        switched = self.current
        if switched is None or not switched._adoptable:
            return
        self.current = None
        try:
            switched.release(switched.timing())
        except (ControllerError, LeaseRevoked) as exc:
            log.warning("lease %d (%s) a switch made was not released: %s",
                        switched.lease_id, switched.phase, exc)

    def observe(self, phase: str, started_at: float, ended_at: float, *,
                detail: Mapping[str, float] | None = None) -> None:
        """Report a gap phase (`reward`, `idle`) the job spent off GPU, from
        `started_at` to `ended_at` in wall-clock seconds (`time.time()`). It counts
        toward the job's profile only where the controller saw the job off its GPUs
        (after its latest lease and its previous gap, not before its first phase).

        `detail` (numbers only) is stored with the observation; `slurmrl report` draws
        the reward curve from `{"step": N, "reward": mean reward}` on `reward` gaps.
        """
        body: dict[str, Any] = {"phase": phase, "started_at": float(started_at),
                                "ended_at": float(ended_at)}
        if detail:  # added for `slurmrl report` (reward curves); the RPC already takes it
            body["detail"] = _numbers("detail", detail)
        # safe to repeat: the controller answers a resend with the one it recorded
        self._rpc.call("POST", f"/v1/jobs/{self.job_id}/observations", body, idempotent=True)

    def service(self, role: str, backend: str | None = None, *,
                timeout_s: float = 120.0) -> Any:
        """A handle on this job's `role` service; its calls need a held lease."""
        from slurmrl.client.services import LeasedService

        return LeasedService.find(self, role, backend, timeout_s)

    def status(self) -> dict[str, Any]:
        _, ans = self._rpc.call("GET", f"/v1/jobs/{self.job_id}")
        return dict(need(ans, "job", dict))

    def close(self, state: str = "CD", reason: str = "driver finished") -> None:
        """Deregister: the job's leases end and its pool slot is freed. A job the
        controller already ended is left as it is."""
        self._stop.set()
        self._beat_now.set()
        try:
            lease = self.current
            if lease is not None and lease.held:
                try:  # best effort: ending the job below ends its leases anyway
                    lease.release()
                except (ControllerError, LeaseRevoked) as exc:
                    log.warning("lease %d not released before deregistering: %s",
                                lease.lease_id, exc)
            try:
                self._rpc.call("POST", f"/v1/jobs/{self.job_id}/end",
                               {"state": state, "reason": reason},
                               retry=not self._rpc.lost)  # gave up already: once
            except ControllerError as exc:
                if exc.status != 409 or exc.code != "job-ended":
                    raise
                log.info("RL job %d was already ended: %s", self.job_id, exc.message)
        finally:
            if self._hb is not threading.current_thread():
                self._hb.join(timeout=5.0)
            self._rpc.close()
            if not self._hb.is_alive():
                self._hb_rpc.close()  # else the thread closes it on its way out

    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: object) -> None:
        # sys.exit() / sys.exit(0) is a driver finishing, not failing
        done = exc_type is None or (isinstance(exc, SystemExit) and exc.code in (None, 0))
        try:
            if exc_type is None or done:
                self.close("CD", "driver finished")
            else:
                self.close("F", _failure(exc_type, exc))
        except ControllerError as err:
            if exc is None:
                raise
            # the driver's own exception says what went wrong: keep it, log this
            log.warning("RL job %d not deregistered (%s) while the driver raised %r",
                        self.job_id, err, exc)

    # -- heartbeat --------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        failing_since: float | None = None
        try:
            # the first beat at once: its answer says the site's interval, which may be
            # shorter than the 2 s assumed until then (a waiting request would lapse)
            first = True
            while True:
                if not first:
                    self._beat_now.wait(self.heartbeat_s)
                first = False
                self._beat_now.clear()
                if self._stop.is_set():
                    return
                if not threading.main_thread().is_alive():
                    # the driver's main thread is gone (it raised, and Python waits for
                    # its other threads): stop renewing, so its lease lapses rather than
                    # being held for a hung thread
                    log.warning("RL job %d: the driver's main thread has ended; heartbeats "
                                "stop and its lease lapses", self.job_id)
                    return
                try:
                    self.heartbeat()
                except ControllerError as exc:
                    if exc.status == 409 and exc.code == "job-ended":
                        if not self._stop.is_set():  # not our own close() ending it
                            self._ended(exc.message)
                        return
                    if failing_since is None:
                        failing_since = time.monotonic()
                        log.warning("heartbeats to the controller fail (%s); retrying every "
                                    "%g s: a lease lapses if none gets through for the "
                                    "controller's lease timeout", exc, self.heartbeat_s)
                    else:
                        log.debug("heartbeat failed: %s", exc)
                    continue
                except Exception:  # never let the thread die silently
                    log.exception("heartbeat failed")
                    continue
                if failing_since is not None:
                    log.warning("heartbeats get through again after %.1f s",
                                time.monotonic() - failing_since)
                    failing_since = None
        finally:
            self._hb_rpc.close()

    def _ended(self, reason: str) -> None:
        """The controller ended the job under the driver: its lease is revoked."""
        if self.ended_reason is None:
            log.warning("%s; its leases are revoked", reason)
        self.ended_reason = reason
        lease = self.current
        if lease is not None and lease.held:
            lease.revoked_reason = reason
        self._stop.set()
        self._beat_now.set()

    def heartbeat(self) -> None:
        lease = self.current
        # a heartbeat stuck on a dead connection is given up after two beats, not the
        # RPC's 30 s (more than a lease timeout): the next one goes on a new connection
        self._hb_rpc.timeout_s = min(HEARTBEAT_TIMEOUT_MAX_S, max(1.0, 2 * self.heartbeat_s))
        _, ans = self._hb_rpc.call("POST", f"/v1/jobs/{self.job_id}/heartbeat", {},
                                   idempotent=True)
        beat = ans.get("heartbeat_s")  # the site's interval: follow it
        if isinstance(beat, int | float) and not isinstance(beat, bool) and beat > 0:
            self.heartbeat_s = float(beat)
        held = {need(x, "lease_id", int): x for x in need(ans, "held", list)}
        if lease is not None and lease.lease_id in held:  # renewed: its new deadline
            renewed = held[lease.lease_id].get("deadline_at")
            if isinstance(renewed, int | float) and not isinstance(renewed, bool):
                lease.deadline_at = float(renewed)
        elif lease is not None and lease.held:
            _, got = self._hb_rpc.call("GET", f"/v1/jobs/{self.job_id}/leases/{lease.lease_id}")
            rec = need(got, "lease", dict)
            if need(rec, "state", str) == "revoked" and not lease.released:
                lease.revoked_reason = str(rec.get("reason") or "revoked")
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
    if "SLURMRL_GPUS" not in environ and "SLURM_SPANK_SLURMRL_GPUS" in environ:
        # salloc's own shell: the plugin exports the directives to the job's steps only
        raise RuntimeError("this is the shell salloc started, not a step of the RL job: "
                           "run the driver as a step of the allocation (srun python "
                           "driver.py), where the --rl-* directives are exported")
    rl = {k: v for k, v in environ.items()
          if k.startswith("SLURMRL_") and "__" not in k and k != "SLURMRL_CONTROLLER"}
    return Job(int(raw), url or environ.get("SLURMRL_CONTROLLER") or DEFAULT_URL, rl,
               retry_for_s=retry_for_s)
