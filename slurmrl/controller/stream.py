"""The lease stream: one long-lived, authenticated WebSocket per driver (`GET /v1/stream`).

Why: per-request HTTP handling (parsing, routing, the middleware, aiohttp's response
machinery) was most of a lease operation's cost (docs/benchmarks.md, "Lease latency").
A driver opens the stream once; acquire, release, switch and heartbeat then travel as
small JSON text frames and the server answers each with one frame (a grant is pushed the
moment it is committed). Everything else stays on the HTTP API, which is also the
fallback.

Security is that of HTTP, not less: the upgrade request goes through the same middleware
(MUNGE credential or session HMAC over `GET /v1/stream` with an empty body, replay
protected), and the stream is bound to the uid so authenticated. Every frame names its
job and is checked against that identity by the very code the HTTP handlers run
(`Api.acquire_op`, `release_op`, `switch_op`, `heartbeat_op`: a user acts only on their
own jobs and leases); its fields are checked with the same `validate` specs. A malformed
frame gets an error frame naming what is wrong and changes nothing. A stream is used at
most the session TTL (`SessionTable.ttl_s`), and one opened with a session no longer
than that session is usable (expired, closed, or tied to a job that has ended, as HTTP
refuses it): the first frame after closes the stream (4401, naming why); the client
opens a new one, authenticating afresh.

Frames (client -> server), one JSON object each:

    {"id": 7, "op": "acquire", "job_id": 12, "phase": "rollout", "min_gpus": null, "wait_s": 30}
    {"id": 8, "op": "release", "job_id": 12, "lease_id": 40, "timing": {"busy_s": 1.5}}
    {"id": 9, "op": "switch", "job_id": 12, "lease_id": 41, "phase": "sync", "timing": {}}
    {"id": 10, "op": "heartbeat", "job_id": 12}

Answers (server -> client) carry the frame's `id`, the HTTP `status` the same call would
have had, and the HTTP answer's fields, or `{"id", "status", "error": {"code",
"message"}}` (`id` is null when the frame had no usable id). Acquires and switches run
concurrently (a heartbeat is answered while an acquire waits, or a switch waits for its
phase's services); at most `MAX_PENDING` per stream. When the stream closes, its waiting
acquires are withdrawn, as for a dropped long poll.

Known limits: JSON text frames only (binary frames are refused); no per-frame signature
(the stream's TCP connection is what is authenticated, like an HTTP keep-alive session
would be if it were bound to its socket), so the stream must, like the session key,
travel over loopback or a trusted network.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aiohttp import WSMsgType, web

from slurmrl.controller.validate import (
    ACQUIRE,
    MAX_ID,
    RELEASE,
    SWITCH,
    F,
    RpcError,
    bad,
    fields,
    parse_json,
)
from slurmrl.leases import LeaseError
from slurmrl.model import Identity

if TYPE_CHECKING:
    from slurmrl.controller.server import Api

log = logging.getLogger(__name__)

PATH = "/v1/stream"
MAX_PENDING = 16  #: acquires and switches in flight per stream
SEND_TIMEOUT_S = 10.0  #: a peer that reads nothing for this long has its stream closed
CLOSE_TIMEOUT_S = 5.0  #: at shutdown, a stream not closed within this is cut
CONCURRENT = frozenset({"acquire", "switch"})  #: ops that may wait: run beside the others
CLOSE_EXPIRED = 4401  #: the stream outlived its session TTL: open a new one

_COMMON = {"id": F("int", True, 0, MAX_ID), "op": F("str", True),
           "job_id": F("int", True, 1, MAX_ID)}
OPS: dict[str, dict[str, F]] = {
    "acquire": {**_COMMON, **ACQUIRE},
    "release": {**_COMMON, "lease_id": F("int", True, 1, MAX_ID), **RELEASE},
    "switch": {**_COMMON, "lease_id": F("int", True, 1, MAX_ID), **SWITCH},
    "heartbeat": dict(_COMMON),
}


def parse_frame(raw: str | bytes) -> tuple[str, dict[str, Any]]:
    """(op, checked fields) of one frame, or RpcError naming what is wrong."""
    obj = parse_json(raw.encode() if isinstance(raw, str) else raw)
    op = obj.get("op")
    if not isinstance(op, str) or op not in OPS:
        shown = op[:40] if isinstance(op, str) else op
        raise bad(f"field 'op' must be one of {', '.join(OPS)}, got {shown!r}",
                  "missing-field" if "op" not in obj else "bad-value")
    return op, fields(obj, OPS[op])


def frame_id(raw: str | bytes) -> int | None:
    """The frame's id if it has a usable one (for error frames of malformed frames)."""
    try:
        value = parse_json(raw.encode() if isinstance(raw, str) else raw).get("id")
    except RpcError:
        return None
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_ID
    return value if ok else None


class Stream:
    """One open stream: its identity, its acquires in flight."""

    def __init__(self, api: Api, who: Identity, ws: web.WebSocketResponse,
                 transport: asyncio.Transport | None = None) -> None:
        self.api, self.who, self.ws = api, who, ws
        self.transport = transport  #: cut at shutdown if the close does not get through
        self.pending: dict[int, asyncio.Task[None]] = {}
        #: the controller closes the stream (its session's TTL) and the driver reopens
        #: it: its waiting acquires keep their place (a reopened acquire joins them)
        self.reopen = False

    async def send(self, fid: int | None, status: int, answer: dict[str, Any]) -> None:
        if not self.ws.closed:
            try:  # a peer that reads nothing must not hold the controller
                await asyncio.wait_for(self.ws.send_json({"id": fid, "status": status,
                                                          **answer}), SEND_TIMEOUT_S)
            except TimeoutError:
                log.warning("stream of uid %d: no frame read for %g s; cut", self.who.uid,
                            SEND_TIMEOUT_S)
                self.cut()
            except ConnectionError:  # the peer went (a driver killed): nothing to answer
                log.debug("stream of uid %d: peer gone before its answer", self.who.uid)

    def cut(self) -> None:
        """End the connection at once, without a closing handshake."""
        if self.transport is not None:
            self.transport.abort()

    async def error(self, fid: int | None, exc: RpcError) -> None:
        self.api.c.metrics.rpc_errors.labels(str(exc.status)).inc()
        await self.send(fid, exc.status, {"error": {"code": exc.code, "message": exc.message}})

    async def frame(self, raw: str) -> None:
        try:
            op, b = parse_frame(raw)
        except RpcError as exc:
            await self.error(frame_id(raw), exc)
            return
        except Exception:  # as HTTP's 500: one bad frame must not drop the stream
            log.exception("stream frame could not be parsed")
            await self.error(None, RpcError(500, "internal", "internal error; see the "
                                            "controller's log"))
            return
        fid = b["id"]
        if fid in self.pending:  # its answer would be taken for the waiting one's
            await self.error(fid, bad(f"frame id {fid} is still in use by a waiting "
                                      "acquire or switch", "bad-value"))
        elif op not in CONCURRENT:
            await self._answer(fid, op, b)
        elif len(self.pending) >= MAX_PENDING:
            await self.error(fid, RpcError(429, "too-many-pending",
                                           f"at most {MAX_PENDING} acquires and switches "
                                           "may wait on one stream"))
        else:  # these wait concurrently: the stream keeps reading frames meanwhile
            task = asyncio.create_task(self._answer(fid, op, b))
            self.pending[fid] = task
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        for fid, t in list(self.pending.items()):
            if t is task:
                del self.pending[fid]

    async def _answer(self, fid: int, op: str, b: dict[str, Any]) -> None:
        """Run one operation and send its answer, or its error as HTTP would have."""
        try:
            if op == "acquire":
                status, answer = await self.api.acquire_op(
                    self.who, b["job_id"], b, withdraw_on_cancel=lambda: not self.reopen)
            elif op == "release":
                status, answer = 200, self.api.release_op(self.who, b["job_id"],
                                                          b["lease_id"], b)
            elif op == "switch":
                status, answer = 200, await self.api.switch_op(self.who, b["job_id"],
                                                               b["lease_id"], b)
            else:
                status, answer = 200, self.api.heartbeat_op(self.who, b["job_id"])
        except RpcError as exc:
            await self.error(fid, exc)
            return
        except LeaseError as exc:
            await self.error(fid, RpcError(409, "lease-conflict", str(exc)))
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # as HTTP's 500: the stream itself stays usable
            log.exception("stream %s failed", op)
            await self.error(fid, RpcError(500, "internal", "internal error; see the "
                                           "controller's log"))
            return
        await self.send(fid, status, answer)

    async def close(self) -> None:
        tasks = list(self.pending.values())
        for t in tasks:
            # withdraws waiting requests, as a dropped long poll does (unless `reopen`)
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


STREAMS: web.AppKey[weakref.WeakSet[Any]] = web.AppKey("streams", weakref.WeakSet)


async def serve_stream(api: Api, request: web.Request, who: Identity, ttl_s: float,
                       session_ended: Callable[[], str | None] | None = None,
                       ) -> web.StreamResponse:
    """The `/v1/stream` handler; the middleware has authenticated the upgrade as `who`.
    `session_ended`: why the session that opened it is no longer usable (None while it
    is), for a stream opened with one: checked before each frame, as HTTP checks it."""
    if request.method != "GET":
        raise RpcError(405, "http", "open the stream with GET")
    limit = api.c.config.controller.max_body_bytes
    # frames up to 4x the body limit are read and refused with an error frame, as HTTP
    # refuses the body (413); beyond, aiohttp closes the stream (1009); pings find a
    # peer that is gone
    ws = web.WebSocketResponse(max_msg_size=max(4 * limit, 1 << 20), autoping=True,
                               heartbeat=30.0)
    if not ws.can_prepare(request).ok:
        raise bad("GET /v1/stream must be a WebSocket upgrade", "not-websocket")
    await ws.prepare(request)
    stream = Stream(api, who, ws, request.transport)
    request.app[STREAMS].add(stream)
    ends = time.monotonic() + ttl_s
    try:
        async for msg in ws:
            why = "session TTL passed" if time.monotonic() >= ends else (
                session_ended() if session_ended is not None else None)
            if why is not None:
                stream.reopen = True
                await ws.close(code=CLOSE_EXPIRED, message=f"{why}: reopen".encode()[:123])
                break
            if msg.type is WSMsgType.TEXT and len(msg.data.encode()) > limit:
                await stream.error(frame_id(msg.data), RpcError(
                    413, "too-large", f"frame larger than {limit} bytes"))
            elif msg.type is WSMsgType.TEXT:
                await stream.frame(msg.data)
            elif msg.type is WSMsgType.BINARY:
                await stream.error(None, bad("frames must be JSON text, not binary",
                                             "bad-frame"))
            else:
                break
    finally:
        await stream.close()
    return ws


async def close_all(app: web.Application) -> None:
    """On shutdown: close every stream (1001 going away), so cleanup does not wait."""
    streams: weakref.WeakSet[Any] = app[STREAMS]

    async def close(stream: Stream) -> None:
        try:  # all at once, each bounded: a peer that reads nothing holds none of them
            await asyncio.wait_for(stream.ws.close(code=1001, message=b"controller stopping"),
                                   CLOSE_TIMEOUT_S)
        except TimeoutError:
            stream.cut()

    await asyncio.gather(*(close(s) for s in list(streams)), return_exceptions=True)
