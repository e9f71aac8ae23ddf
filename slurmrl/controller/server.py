"""The controller's RPC: JSON over HTTP/1.1 (aiohttp) under `/v1/`, MUNGE or a session.

See docs/rpc.md for every endpoint and field. Each request is authenticated before its
handler runs: `Authorization: MUNGE <credential>` bound to method, path and body (the
uid comes from MUNGE only; decoded in a worker thread, so a round trip to munged never
stalls a grant), or `Authorization: SLURMRL-SESSION <id>` with an HMAC over the same
(`slurmrl.auth.sessions`; the session was opened with MUNGE). Its body is bounded by
`controller.max_body_bytes` and validated whole before anything changes. Errors are
JSON: `{"error": {"code", "message"}}` with 400 (malformed), 401 (credential),
403 (not yours / admins only), 404, 409 (state conflict), 413 (too big),
503 (Slurm or munged unavailable).

A driver waiting for a lease holds its HTTP request open (long poll, `wait_s`); if it
disconnects, the server cancels the handler (`handler_cancellation=True`) and the waiting
request is withdrawn, unless another poll of the same request is still waiting. A driver
that stops waiting between polls (`timeout_s`) withdraws it by releasing its request id.
`/v1/ping` and `/metrics` need no credential (they reveal nothing private). `/metrics` is
served only with `controller.metrics_enabled`, on this port when `controller.metrics_port`
is 0, else on a listener of its own on that port (same host), which serves nothing else.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from slurmrl import __version__
from slurmrl.auth import AuthCode, AuthError, sessions
from slurmrl.auth.requests import verify_request
from slurmrl.controller import stream
from slurmrl.controller.core import CLOCK_SKEW_S, Controller
from slurmrl.controller.residency import replica_sets
from slurmrl.controller.scheduler import CutsAService, RequestEnded
from slurmrl.controller.validate import (
    ACQUIRE,
    GROW,
    PACK,
    RELEASE,
    SHRINK,
    SWITCH,
    F,
    RpcError,
    bad,
    fields,
    parse_id,
    parse_ids,
    parse_json,
    parse_wait,
)
from slurmrl.controller.views import job_view, lease_view, physical_gpus, pool_view
from slurmrl.db import JobRecord, PoolRecord
from slurmrl.leases import LeaseError
from slurmrl.leases.types import Lease
from slurmrl.model import Identity, LeaseState, Phase

log = logging.getLogger(__name__)

API_VERSION = "v1"
MAX_WAIT_S = 300.0
#: how long a stop waits for the requests under way (a lease request's long poll is cut
#: short: its request is kept for the restart, and its driver retries)
SHUTDOWN_S = 2.0
PUBLIC = {("GET", "/v1/ping"), ("HEAD", "/v1/ping"), ("GET", "/metrics"), ("HEAD", "/metrics")}
CTRL: web.AppKey[Controller] = web.AppKey("controller", Controller)
SESSIONS: web.AppKey[sessions.SessionTable] = web.AppKey("sessions", sessions.SessionTable)
#: what the middleware learnt of a request: a session signed it (not MUNGE), who sent it,
#: its body as read
IS_SESSION: web.RequestKey[bool] = web.RequestKey("is_session", bool)
WHO: web.RequestKey[Identity] = web.RequestKey("who", Identity)
BODY: web.RequestKey[bytes] = web.RequestKey("body", bytes)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


def _error(status: int, code: str, message: str) -> web.Response:
    return _json({"error": {"code": code, "message": message}}, status)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Authenticate, then turn every refusal into a JSON error."""
    c = request.app[CTRL]
    try:
        body = await request.read()
        if (request.method, request.path) not in PUBLIC:
            header = request.headers.get("Authorization")
            request[IS_SESSION] = sessions.is_session(header)
            if request[IS_SESSION]:
                assert header is not None
                request[WHO] = request.app[SESSIONS].verify(
                    header, request.headers, request.method, request.raw_path, body,
                    job_alive=lambda job_id: _job_alive(c, job_id))
            else:
                # munged's round trip runs in a worker thread: grants go on meanwhile
                request[WHO] = await asyncio.get_running_loop().run_in_executor(
                    None, lambda: verify_request(
                        header, request.method, request.raw_path, body,
                        socket=c.config.auth.munge_socket or None,
                        max_age_s=c.config.auth.credential_ttl_s))
        request[BODY] = body
        return await handler(request)
    except AuthError as exc:
        status = 503 if exc.code is AuthCode.UNAVAILABLE else 401
        c.metrics.rpc_errors.labels(str(status)).inc()
        return _error(status, f"auth-{exc.code}", exc.message)
    except RpcError as exc:
        c.metrics.rpc_errors.labels(str(exc.status)).inc()
        return _error(exc.status, exc.code, exc.message)
    except LeaseError as exc:
        c.metrics.rpc_errors.labels("409").inc()
        return _error(409, "lease-conflict", str(exc))
    except web.HTTPRequestEntityTooLarge:
        c.metrics.rpc_errors.labels("413").inc()
        return _error(413, "too-large", f"request body larger than "
                      f"{c.config.controller.max_body_bytes} bytes")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        c.metrics.rpc_errors.labels(str(exc.status)).inc()
        return _error(exc.status, "http", f"{exc.reason}: {request.method} {request.path}")
    except Exception:  # a fault of ours: logged with its traceback, answered as JSON
        log.exception("internal error answering %s %s", request.method, request.path)
        c.metrics.rpc_errors.labels("500").inc()
        return _error(500, "internal", f"internal error answering {request.method} "
                      f"{request.path}; the controller's log has the details")


def _job_alive(c: Controller, job_id: int) -> bool:
    job = c.store.job(job_id)
    return job is not None and not job.state.terminal


def _who(request: web.Request) -> Identity:
    return request[WHO]


def _body(request: web.Request, spec: dict[str, F]) -> dict[str, Any]:
    """A POST's checked body; it takes no query parameter (its fields are in the body)."""
    _query(request, set())
    return fields(parse_json(request[BODY]), spec)


def _no_body(request: web.Request) -> None:
    _query(request, set())
    fields(parse_json(request[BODY]), {})


def _query(request: web.Request, allowed: set[str]) -> dict[str, str]:
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise bad(f"unknown query parameter(s) {', '.join(unknown[:5])}; accepted: "
                  f"{', '.join(sorted(allowed)) or '(none)'}", "unknown-field")
    twice = sorted(k for k in set(request.query) if len(request.query.getall(k)) > 1)
    if twice:
        raise bad(f"query parameter(s) given twice: {', '.join(twice[:5])}")
    return {k: request.query[k] for k in allowed if k in request.query}


def _users(text: str) -> frozenset[str]:
    """`user=`: comma-separated user names and numeric uids, as squeue's `-u` takes them
    (spaces around each allowed, no empty entry)."""
    names = [p.strip() for p in text.split(",")]
    if not 1 <= len(names) <= 1000 or "" in names:
        raise bad(f"user: expected 1 to 1000 comma-separated user names or uids, no empty "
                  f"entry; got {text[:40]!r}")
    return frozenset(names)


def _dedicated(pool: PoolRecord | None) -> bool:
    """A pool that is its one job's for good (it takes no partner)."""
    return pool is not None and pool.dedicated


class Api:
    """The route handlers; thin: check input, call the Controller, shape the answer."""

    def __init__(self, c: Controller) -> None:
        self.c = c
        self._gpu_indices: dict[int, dict[int, int]] = {}

    def _lease(self, lease: Lease | Any, pool_id: int, private: bool = True,
               job: JobRecord | None = None) -> dict[str, Any]:
        """A lease's view; `job` when the caller has it (saves re-reading the row)."""
        if job is None or job.job_id != lease.job_id:
            job = self.c.store.job(lease.job_id)
        return lease_view(lease, pool_id, job, self.c.config.controller.heartbeat_s,
                          private=private, physical=self._physical(pool_id))

    def _physical(self, pool_id: int) -> dict[int, int]:
        """A pool's GPUs as the node's indices (`physical_gpus`): fixed when a pool
        opens, so read once; a floating pool's change as windows come and go, so they
        are read each time."""
        got = self._gpu_indices.get(pool_id)
        if got is None:
            pool = self.c.store.pool(pool_id)
            if pool is None:
                return {}
            got = physical_gpus(pool, self.c.store.windows(pool_id) if pool.floating else ())
            if got and not pool.floating:  # an empty one might be filled in later
                self._gpu_indices[pool_id] = got
        return got

    async def stream(self, request: web.Request) -> web.StreamResponse:
        _query(request, set())
        table, header = request.app[SESSIONS], request.headers.get("Authorization", "")
        ended = (functools.partial(table.ended, header,
                                   job_alive=lambda job_id: _job_alive(self.c, job_id))
                 if request[IS_SESSION] else None)
        return await stream.serve_stream(self, request, request[WHO], table.ttl_s, ended)

    async def ping(self, request: web.Request) -> web.Response:
        return _json({"api": API_VERSION, "version": __version__})

    async def metrics(self, request: web.Request) -> web.Response:
        self.c.metrics.set_jobs(self.c.store.count_jobs_by_state())  # read at each scrape
        return web.Response(body=self.c.metrics.render(),
                            content_type="text/plain", charset="utf-8")

    async def register(self, request: web.Request) -> web.Response:
        b = _body(request, {"job_id": F("int", True, 1, 2**53), "env": F("strmap", True)})
        bad_keys = [k for k in b["env"] if not k.startswith("SLURMRL_")]
        if bad_keys:
            raise bad(f"env may only carry SLURMRL_* variables, got {bad_keys[0][:40]!r}")
        job = await self.c.register(_who(request), b["job_id"], b["env"])
        # a repeated registration (another rank) answers the job as it is by now; the
        # secret signs calls to the job's services: its owner's only, not an admin's
        return _json({"job": self._view(job, private=True,
                                        secret=job.uid == _who(request).uid)})

    def _view(self, job: JobRecord, private: bool, **extra: Any) -> dict[str, Any]:
        """One job as `GET /v1/jobs/{id}` shows it: its ledger and waits where `private`,
        its pool's kind (`extra`: `job_view`'s other keywords)."""
        now = self.c.clock()
        pool = self.c.store.pool(job.pool_id) if job.pool_id is not None else None
        return job_view(
            job, private=private, now=now,
            gpu_s=self.c.gpu_seconds_now([job.job_id]).get(job.job_id, 0.0) if private
            else None,
            waits=self.c.store.lease_waits([job.job_id], now).get(job.job_id) if private
            else None,
            hide_user=self.c.config.controller.hide_other_users,
            floating=pool is not None and pool.floating, dedicated_pool=_dedicated(pool),
            **extra)

    async def open_session(self, request: web.Request) -> web.Response:
        b = _body(request, {"job_id": F("int", lo=1, hi=2**53, nullable=True)})
        if request[IS_SESSION]:
            raise RpcError(401, "auth-mismatch",
                           "a session is opened with a MUNGE credential, not another session")
        who = _who(request)
        if b["job_id"] is not None:
            self.c.active_job(who, b["job_id"])  # yours and running, or 403/404/409
        g = request.app[SESSIONS].open(who, b["job_id"])
        return _json({"session": {"session_id": g.session_id, "key": g.key,
                                  "expires_at": g.expires_at, "job_id": g.job_id,
                                  "uid": who.uid}})

    async def list_jobs(self, request: web.Request) -> web.Response:
        return _json({"jobs": self._jobs(request)})

    def _jobs(self, request: web.Request) -> list[dict[str, Any]]:
        q = _query(request, {"user", "ids", "all"})
        who = _who(request)
        ids = parse_ids(q["ids"], "ids") if "ids" in q else None
        users = _users(q["user"]) if "user" in q else None
        if "all" in q and q["all"] not in ("0", "1"):
            raise bad("all must be 0 or 1")
        active = None if q.get("all") == "1" else True
        jobs = self.c.store.jobs(active=active, ids=ids)
        if users is not None:  # a job's user name or its uid, as squeue -u matches them
            jobs = [j for j in jobs if j.user in users or str(j.uid) in users]
        admin = self.c.is_admin(who)
        hide = self.c.config.controller.hide_other_users and not admin
        if hide and "user" in q:  # no finding out whose jobs are whose by filtering
            jobs = [j for j in jobs if j.uid == who.uid]
        mine = [j.job_id for j in jobs if admin or j.uid == who.uid]
        gpu_s = self.c.gpu_seconds_now(mine)
        now = self.c.clock()
        waits = self.c.store.lease_waits(mine, now)
        pools = {pid: self.c.store.pool(pid) for pid in {j.pool_id for j in jobs}
                 if pid is not None}
        return [job_view(j, private=admin or j.uid == who.uid, hide_user=hide,
                         gpu_s=gpu_s.get(j.job_id, 0.0), now=now, waits=waits.get(j.job_id),
                         floating=(p := pools.get(j.pool_id or -1)) is not None and p.floating,
                         dedicated_pool=_dedicated(p)) for j in jobs]

    async def get_job(self, request: web.Request) -> web.Response:
        _query(request, set())
        who = _who(request)
        job_id = parse_id(request.match_info["job_id"], "job id")
        job = self.c.store.job(job_id)
        if job is None:
            raise RpcError(404, "no-such-job", f"RL job {job_id} is not registered")
        private = job.uid == who.uid or self.c.is_admin(who)
        services = self.c.store.services(job_id=job_id, live_only=True) if private else []
        return _json({"job": self._view(job, private, services=services)})

    async def end(self, request: web.Request) -> web.Response:
        b = _body(request, {"state": F("str", choices=("CD", "F", "CA")),
                            "reason": F("str")})
        job_id = parse_id(request.match_info["job_id"], "job id")
        await self.c.deregister(_who(request), job_id, b["state"] or "CD",
                                b["reason"] or "deregistered")
        return _json({"job_id": job_id, "state": b["state"] or "CD"})

    async def heartbeat(self, request: web.Request) -> web.Response:
        _no_body(request)
        return _json(self.heartbeat_op(_who(request),
                                       parse_id(request.match_info["job_id"], "job id")))

    def heartbeat_op(self, who: Identity, job_id: int) -> dict[str, Any]:
        """Renew the job's leases (HTTP and stream)."""
        job = self.c.active_job(who, job_id)
        held = self.c.scheduler.heartbeat(job)
        return {"job_id": job.job_id, "state": str(job.state),
                "held": [self._lease(x, job.pool_id or 0, job=job) for x in held],
                "heartbeat_s": self.c.config.controller.heartbeat_s}

    async def acquire(self, request: web.Request) -> web.Response:
        b = _body(request, ACQUIRE)
        status, answer = await self.acquire_op(
            _who(request), parse_id(request.match_info["job_id"], "job id"), b)
        return _json(answer, status)

    async def acquire_op(self, who: Identity, job_id: int, b: dict[str, Any],
                         withdraw_on_cancel: bool | Callable[[], bool] = True,
                         ) -> tuple[int, dict[str, Any]]:
        """Acquire (HTTP long poll and stream): (200, {"lease"}) or (202, {"state", ...}).
        `withdraw_on_cancel`: as `LeaseScheduler.wait`."""
        job = self.c.active_job(who, job_id)
        wait_s = 30.0 if b["wait_s"] is None else b["wait_s"]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s  # placement and grant together: wait_s at most
        phase = Phase(b["phase"])
        self._check_min_gpus(job, phase, b["min_gpus"])
        if job.pool_id is None:
            placed = await self.c.wait_placed(job.job_id, wait_s)
            if placed is not None:  # it may have ended since it was placed
                placed = self.c.store.job(job.job_id)
            if placed is None or placed.pool_id is None or placed.state.terminal:
                state = "ended" if placed is None or placed.state.terminal else "unplaced"
                return 202, {"request_id": None, "state": state,
                             "reason": placed.reason if placed else "gone"}
            job = placed
            self._check_min_gpus(job, phase, b["min_gpus"])  # now for its pool
        rid = self._open_request(job.job_id, phase)
        if rid is None:
            ticket = self.c.scheduler.request(job, phase, b["min_gpus"])
            rid, lease = ticket.request_id, ticket.lease
        else:
            lease = self.c.scheduler.tables[job.pool_id].lease(rid)  # type: ignore[index]
        if lease is None:
            try:
                lease = await self.c.scheduler.wait(rid, max(0.0, deadline - loop.time()),
                                                    withdraw_on_cancel)
            except RequestEnded as exc:
                raise RpcError(409, f"request-{exc.state}",
                               f"request {rid} was {exc.state}: {exc.reason}") from None
        if lease is None:
            return 202, {"request_id": rid, "state": "waiting"}
        await self.c.pools.before_answer(job, lease)
        return 200, {"lease": self._lease(lease, job.pool_id or 0, job=job)}

    def _check_min_gpus(self, job: JobRecord, phase: Phase, min_gpus: int | None) -> None:
        """400 `bad-value` for a `min_gpus` the scheduler would refuse, before a retry
        joins the job's request or lease (which would answer it regardless)."""
        refused = self.c.scheduler.min_gpus_refusal(job, phase, min_gpus)
        if refused:
            raise bad(refused, "bad-value")

    def _open_request(self, job_id: int, phase: Phase) -> int | None:
        """An open request of this job for this phase (a retried acquire joins it), or
        its held lease of it (granted to it, or by a switch whose answer was lost)."""
        for table in self.c.scheduler.tables.values():
            for x in table.leases:
                if x.job_id == job_id and x.phase is phase:
                    return x.lease_id
            for r in table.waiting:
                if r.job_id == job_id and r.phase is phase:
                    return r.request_id
        return None

    async def get_lease(self, request: web.Request) -> web.Response:
        q = _query(request, {"wait_s"})
        job = self.c.own_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        lease_id = parse_id(request.match_info["lease_id"], "lease id")
        rec = self.c.store.lease(lease_id)
        if rec is None or rec.job_id != job.job_id:
            raise RpcError(404, "no-such-lease", f"job {job.job_id} has no lease {lease_id}")
        wait_s = parse_wait(q.get("wait_s"), 0.0, MAX_WAIT_S)
        if rec.state is LeaseState.WAITING and wait_s > 0:
            try:
                lease = await self.c.scheduler.wait(lease_id, wait_s,
                                                    withdraw_on_cancel=False)
            except RequestEnded:
                lease = None
            if lease is not None:
                await self.c.pools.before_answer(job, lease)
            rec = self.c.store.lease(lease_id) or rec
        return _json({"lease": self._lease(rec, rec.pool_id)})

    async def list_leases(self, request: web.Request) -> web.Response:
        _query(request, set())
        job = self.c.own_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        return _json({"leases": [self._lease(r, r.pool_id)
                                 for r in self.c.store.leases(job_id=job.job_id)]})

    async def release(self, request: web.Request) -> web.Response:
        b = _body(request, RELEASE)
        return _json(self.release_op(_who(request),
                                     parse_id(request.match_info["job_id"], "job id"),
                                     parse_id(request.match_info["lease_id"], "lease id"), b))

    def release_op(self, who: Identity, job_id: int, lease_id: int,
                   b: dict[str, Any]) -> dict[str, Any]:
        """Release (HTTP and stream); the next waiter's grant is committed with it. A
        request still waiting is withdrawn instead (a driver that gave up waiting)."""
        job = self.c.active_job(who, job_id)
        if self.c.scheduler.withdraw(job, lease_id):
            rec = self.c.store.lease(lease_id)
            assert rec is not None
            return {"lease": self._lease(rec, rec.pool_id, job=job)}
        now = self.c.clock()
        with self.c.store.transaction():  # one commit for the release, grant and phase
            held = self.c.scheduler.release(job, lease_id, b["timing"] or {}, now)
            self.c.store.update_job(job.job_id, phase="idle")
        # the lease as it was held, now ended (not read back: the row holds the same)
        view = self._lease(held, job.pool_id or 0, job=job)
        view.update(state=str(LeaseState.RELEASED), released_at=now)
        return {"lease": view}

    async def switch(self, request: web.Request) -> web.Response:
        b = _body(request, SWITCH)
        return _json(await self.switch_op(
            _who(request), parse_id(request.match_info["job_id"], "job id"),
            parse_id(request.match_info["lease_id"], "lease id"), b))

    async def switch_op(self, who: Identity, job_id: int, lease_id: int,
                        b: dict[str, Any]) -> dict[str, Any]:
        """Switch (HTTP and stream): end the held lease and grant the job's next phase
        on its GPUs at once; answers the new lease once that phase's services are active,
        as acquire does. A lease that cannot switch is 409 `cannot-switch`, unchanged."""
        job = self.c.active_job(who, job_id)
        try:
            lease = self.c.scheduler.switch(job, lease_id, Phase(b["phase"]),
                                            b["timing"] or {})
        except LeaseError as exc:
            raise RpcError(409, "cannot-switch", str(exc)) from None
        await self.c.pools.before_answer(job, lease)
        return {"lease": self._lease(lease, job.pool_id or 0, job=job)}

    async def shrink(self, request: web.Request) -> web.Response:
        b = _body(request, SHRINK)
        if (b["keep"] is None) == (b["gpus"] is None):
            raise bad("a shrink names either 'keep' (how many GPUs) or 'gpus' (which "
                      "job-local GPUs to keep), not both or neither")
        job = self.c.active_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        try:
            lease = self.c.scheduler.shrink(
                job, parse_id(request.match_info["lease_id"], "lease id"), b["keep"], b["gpus"])
        except CutsAService as exc:  # part of a service: the GPUs given back would hold it
            raise bad(str(exc), "bad-value") from None
        return _json({"lease": self._lease(lease, job.pool_id or 0)})

    async def grow(self, request: web.Request) -> web.Response:
        """Add free job-local GPUs to a held lease (none waited for); answers the lease,
        with `added` (job-local), once the services on the added GPUs are active."""
        b = _body(request, GROW)
        job = self.c.active_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        lease_id = parse_id(request.match_info["lease_id"], "lease id")
        lease, added = self.c.scheduler.grow(job, lease_id, b["gpus"])
        pool_gpus = job.pool_gpus or ()
        if b["held"] is not None:
            # `added` from the GPUs the caller saw the lease hold: a resend of a grow whose
            # answer was lost answers what its first attempt took (after its hand-off)
            asked = {pool_gpus[g] for g in b["gpus"] if g < len(pool_gpus)}
            added = frozenset(lease.gpus & asked) - frozenset(b["held"])
        if added:
            await self.c.pools.before_answer(job, lease)
        return _json({"lease": self._lease(lease, job.pool_id or 0),
                      "added": sorted(pool_gpus.index(g) for g in added)})

    async def pack(self, request: web.Request) -> web.Response:
        """A floating member's rollout tail moves onto the fullest window with room for
        its replicas still generating (or shrinks to them on its own window); answers
        the lease once the job's replicas on its new GPUs are active."""
        b = _body(request, PACK)
        job = self.c.active_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        lease_id = parse_id(request.match_info["lease_id"], "lease id")
        table = self.c.scheduler.tables.get(job.pool_id or -1)
        was = table.lease(lease_id) if table is not None else None
        n = self.c.config.services.rollout_replica_gpus
        g = job.request.gpus
        pool = self.c.store.pool(job.pool_id) if job.pool_id is not None else None
        # outside a floating pool the scheduler refuses it as such (`lease-conflict`)
        if pool is not None and pool.floating and len(replica_sets(range(g), n)) < 2:
            raise RpcError(409, "cannot-pack", f"job {job.job_id}'s rollout is one engine over "
                           f"its {g} GPUs (services.rollout_replica_gpus = {n}): its tail "
                           "cannot leave part of its window")
        lease = self.c.scheduler.pack(job, lease_id, b["gpus"], unit=n, held=b["held"])
        # from the GPUs the caller saw (a resend's: those before its first attempt, whose
        # hand-off it then waits for, queued behind it) or the lease held before
        seen = (frozenset(b["held"]) if b["held"] is not None
                else was.gpus if was is not None else None)
        if seen is not None and not lease.gpus <= seen:
            await self.c.pools.before_answer(job, lease)
        return _json({"lease": self._lease(lease, job.pool_id or 0, job=job)})

    async def observe(self, request: web.Request) -> web.Response:
        b = _body(request, {"phase": F("str", True, choices=("reward", "idle")),
                            "started_at": F("num", True, 0, 2**40),
                            "ended_at": F("num", True, 0, 2**40),
                            "busy_s": F("num", lo=0, hi=2**40),
                            "detail": F("nummap")})
        job = self.c.active_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        if b["ended_at"] < b["started_at"]:
            raise bad("ended_at must not be before started_at")
        # wall-clock times within the job's life (a `time.monotonic()` stamp is not)
        now, since = self.c.clock(), job.registered_at - CLOCK_SKEW_S
        if b["started_at"] < since or b["ended_at"] > now + CLOCK_SKEW_S:
            raise bad(f"a gap is wall-clock time (time.time()) within the job's life: from "
                      f"its registration ({job.registered_at:.0f}) to now ({now:.0f}), "
                      f"give or take {CLOCK_SKEW_S:.0f} s of clock skew; got started_at "
                      f"{b['started_at']:.0f}, ended_at {b['ended_at']:.0f}", "bad-value")
        # a resend of one recorded already (its answer lost) is answered, not stored twice
        seen = self.c.store.gap_observation(
            job_id=job.job_id, phase=Phase(b["phase"]), started_at=b["started_at"],
            ended_at=b["ended_at"], busy_s=b["busy_s"], detail=b["detail"])
        if seen is not None:
            return _json({"observation_id": seen})
        oid = self.c.store.add_observation(
            job_id=job.job_id, phase=Phase(b["phase"]), requested_at=b["started_at"],
            granted_at=b["started_at"], released_at=b["ended_at"], busy_s=b["busy_s"],
            detail=b["detail"])
        return _json({"observation_id": oid})

    async def observations(self, request: web.Request) -> web.Response:
        _query(request, set())
        job = self.c.own_job(_who(request), parse_id(request.match_info["job_id"], "job id"))
        obs = self.c.store.observations(job.job_id)
        return _json({"observations": [
            {"observation_id": o.observation_id, "phase": str(o.phase), "lease_id": o.lease_id,
             "requested_at": o.requested_at, "granted_at": o.granted_at,
             "released_at": o.released_at, "busy_s": o.busy_s, "gpus": o.gpus,
             "detail": o.detail} for o in obs]})

    def _pools(self, admin: bool) -> list[dict[str, Any]]:
        out = []
        now = self.c.clock()
        for p in self.c.store.pools(open_only=True):
            members = [j.job_id for j in self.c.store.jobs(active=True, pool_id=p.pool_id)]
            out.append(pool_view(p, members, admin=admin,
                                 windows=self.c.store.windows(p.pool_id) if p.floating else (),
                                 gpu_seconds=self.c.store.pool_gpu_seconds(p, now)))
        return out

    async def list_pools(self, request: web.Request) -> web.Response:
        _query(request, set())
        return _json({"pools": self._pools(self.c.is_admin(_who(request)))})

    async def attach_pool(self, request: web.Request) -> web.Response:
        b = _body(request, {"slurm_job_id": F("int", True, 1, 2**53), "dedicated": F("bool")})
        pool = await self.c.attach_pool(_who(request), b["slurm_job_id"], bool(b["dedicated"]))
        await self.c.pools.pool_opened(pool)
        return _json({"pool": pool_view(pool, [], admin=True)})

    async def close_pool(self, request: web.Request) -> web.Response:
        b = _body(request, {"reason": F("str")})
        self.c.require_admin(_who(request), "closing a pool")
        pool_id = parse_id(request.match_info["pool_id"], "pool id")
        pool = self.c.store.pool(pool_id)
        if pool is None:
            raise RpcError(404, "no-such-pool", f"pool {pool_id} does not exist")
        if pool.state == "closed":  # its closing time and reason are history: kept
            raise RpcError(409, "pool-not-running", f"pool {pool_id} is closed already")
        await self.c.close_pool(pool_id, b["reason"] or "closed by admin")
        return _json({"pool_id": pool_id, "state": "closed"})

    async def status(self, request: web.Request) -> web.Response:
        who = _who(request)
        admin = self.c.is_admin(who)
        jobs = self._jobs(request)
        own = {j["job_id"] for j in jobs if j["private"]}
        shown = {j["job_id"] for j in jobs}  # `user=`/`ids=` select the leases too
        leases = []
        for pool_id, table in self.c.scheduler.tables.items():
            ids = [x.lease_id for x in table.leases] + [x.request_id for x in table.waiting]
            for lid in ids:
                rec = self.c.store.lease(lid)
                if rec is not None and rec.job_id in shown:
                    leases.append(self._lease(rec, pool_id,
                                              private=admin or rec.job_id in own))
        return _json({"jobs": jobs, "pools": self._pools(admin), "leases": leases,
                      "controller": self.c.describe()})


def metrics_app(c: Controller) -> web.Application:
    """The `/metrics` listener of `controller.metrics_port`: that route only."""
    app = web.Application()
    app.router.add_get("/metrics", Api(c).metrics)
    return app


def make_app(c: Controller) -> web.Application:
    app = web.Application(middlewares=[_guard], client_max_size=c.config.controller.max_body_bytes)
    app[CTRL] = c
    app[SESSIONS] = sessions.SessionTable()
    app[stream.STREAMS] = weakref.WeakSet()
    app.on_shutdown.append(stream.close_all)
    a = Api(c)
    r = app.router
    r.add_get("/v1/ping", a.ping)
    r.add_post("/v1/sessions", a.open_session)
    cc = c.config.controller
    if cc.metrics_enabled and not cc.metrics_port:
        r.add_get("/metrics", a.metrics)
    r.add_post("/v1/jobs", a.register)
    r.add_get("/v1/jobs", a.list_jobs)
    r.add_get("/v1/jobs/{job_id}", a.get_job)
    r.add_post("/v1/jobs/{job_id}/end", a.end)
    r.add_post("/v1/jobs/{job_id}/heartbeat", a.heartbeat)
    r.add_post("/v1/jobs/{job_id}/leases", a.acquire)
    r.add_get("/v1/jobs/{job_id}/leases", a.list_leases)
    r.add_get("/v1/jobs/{job_id}/leases/{lease_id}", a.get_lease)
    r.add_post("/v1/jobs/{job_id}/leases/{lease_id}/release", a.release)
    r.add_post("/v1/jobs/{job_id}/leases/{lease_id}/shrink", a.shrink)
    r.add_post("/v1/jobs/{job_id}/leases/{lease_id}/grow", a.grow)
    r.add_post("/v1/jobs/{job_id}/leases/{lease_id}/pack", a.pack)
    r.add_post("/v1/jobs/{job_id}/leases/{lease_id}/switch", a.switch)
    r.add_post("/v1/jobs/{job_id}/observations", a.observe)
    r.add_get("/v1/jobs/{job_id}/observations", a.observations)
    r.add_get("/v1/pools", a.list_pools)
    r.add_post("/v1/pools", a.attach_pool)
    r.add_post("/v1/pools/{pool_id}/close", a.close_pool)
    r.add_get("/v1/status", a.status)
    r.add_get(stream.PATH, a.stream)
    return app


async def serve(c: Controller, host: str, port: int) -> web.AppRunner:
    """Start the controller and its HTTP server; returns the runner (call .cleanup())."""
    await c.start()
    app = make_app(c)
    cc = c.config.controller
    metrics: web.AppRunner | None = None
    if cc.metrics_enabled and cc.metrics_port:
        metrics = web.AppRunner(metrics_app(c), access_log=None)
        await metrics.setup()

        async def stop_metrics(_: web.Application) -> None:
            assert metrics is not None
            await metrics.cleanup()

        app.on_cleanup.append(stop_metrics)  # the caller cleans up the returned runner only
    # aiohttp's default wait at a stop (60 s, then 60 more) outlasted systemd's
    # TimeoutStopSec whenever a driver waited for GPUs
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                           shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await site.start()
    log.info("slurmrl controller listening on http://%s:%d (API %s)", host, port, API_VERSION)
    if metrics is not None:
        await web.TCPSite(metrics, host, cc.metrics_port, reuse_address=True).start()
        log.info("metrics on http://%s:%d/metrics", host, cc.metrics_port)
    return runner
