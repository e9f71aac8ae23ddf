"""The HTTP server of a service: control plane and data plane over one port.

Control plane (the controller): `POST /v1/park`, `POST /v1/activate`, `POST /v1/stop`,
`GET /v1/status`. Data plane (the job's driver): `POST /v1/generate`,
`POST /v1/train_step`, `GET /v1/weights` (export), `PUT /v1/weights` (import). Every
request must carry an HMAC signature (`slurmrl.auth.tokens.sign`) made out to this
service, its `address` (`host:port/launch` as it announces it, which the controller
records and gives the driver; `serve` sets it once listening; `launch` is the random
`launch_id` this process picked, so a call made out to an earlier launch on the same
`host:port` is not made out to this one); anything else gets 401 (a call made out to
another service or launch: `mismatch`, naming both). With a control secret (the
controller's, one per service, never given to the job's driver), park, activate and stop
take only that one: the job's secret, which the driver holds, opens the data plane and
`status`, so a driver cannot wake its own parked service on GPUs the controller has
leased to another job. The control secret opens every route.
Without one (a service started by hand), the job's secret opens every route. The
control secret is in the service's environment, so code of the job's own running inside
the service could read it: it keeps the driver out, not the job's code. Data-plane
calls while the service is parked get 409 — except a weight import, which a parked
service accepts and stages in host memory until it is activated (a disaggregated job's
sync holds only the trainer's GPUs; see `ServiceBackend.import_weights`). JSON in and
out; weights travel as raw bytes.

Hand-off (floating pools; the worker needs `--handoff-dir`): `park` with
`"handoff": true` hands the whole state to `<dir>/<role>.state` and keeps none
(`ServiceBackend.hand_off`; `level` does not apply); `activate` with `"handoff": true`
takes that file over (`take_over`) when this copy handed its own state off or the file
holds a newer generation than its own, and otherwise activates as usual. `status`
reports `handed_off` and `generation`. Without `--handoff-dir`, `"handoff": true` is a
400. Across nodes (a floating pool whose windows are on several nodes), `activate` with
`"source": "host:port/launch"` first fetches the state file from the copy so named
(`GET /v1/handoff`, signed with the job's secret, which every copy holds) and stores it
in this node's directory unless this one holds that generation or a newer one
(streamed into a temp file there, `handoff.store_stream`), then goes on as above.
A source that is another service (its `status` names another role or backend), or
whose file holds another service's state, is refused (400) before anything in this
node's directory changes.
`GET /v1/handoff` answers this copy's state file as it is (404 when there is none): the
job's own state, to its own services and driver. `POST /v1/handoff/discard` (the
controller's, at the job's end) removes this role's state file from this node's
directory (under its lock: a store under way finishes first; a temp file a killed
writer left goes too), and the directory once empty. A fetch first asks the source's
`status` for the generation its file holds and streams nothing where this node's file
holds that one already. `POST /v1/handoff/fetch` with `"source"` (the
controller's) fetches the state from the copy there into this node's directory as
`activate` would, and activates nothing: the controller moves a job's newest state off
a node before giving back the only window there. `status` reports `stored_generation`,
that of the state file in this node's directory (null when none).

Backend calls run one at a time on a worker thread, so `status` (and with it the count
of active sequences during a long generate) stays answerable while a call runs. A park
waits for the call in flight to finish: the service never sleeps mid-request (a known way
to corrupt vLLM). Limits: one process, one backend, no TLS (the data plane belongs on the
cluster's private network; the signature authenticates, it does not encrypt).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from slurmrl.auth.errors import AuthCode, AuthError
from slurmrl.auth.tokens import (
    ANSWER,
    NONCE,
    STREAM_MAC_BYTES,
    Verifier,
    answer_mac,
    check_body,
    stream_mac,
)
from slurmrl.gpu.nvml import NvmlMonitor, reading_json
from slurmrl.model import Residency
from slurmrl.worker import handoff
from slurmrl.worker.protocol import (
    BackendError,
    Continuation,
    GenerateParams,
    NotReady,
    ServiceBackend,
    TrainSample,
)

log = logging.getLogger("slurmrl.worker")
T = TypeVar("T")
#: the secret that opened a call, which signs its answer (`tokens.answer_mac`)
SIGNER = web.RequestKey("signer", str)
STREAM_CHUNK = 1 << 20  #: bytes of a streamed answer read from its file at a time
DATA_PLANE = ("/v1/generate", "/v1/train_step", "/v1/weights")
#: the routes only the controller may call where the service has a control secret
CONTROL_ONLY = ("/v1/park", "/v1/activate", "/v1/stop", "/v1/handoff/discard",
                "/v1/handoff/fetch")


@dataclass(frozen=True)
class ServiceInfo:
    """Who this service is, reported by `status` and at registration."""

    job_id: str
    role: str
    backend: str
    step_id: str | None = None


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "status": status}, status=status)


class ServiceServer:
    """Serves one backend; `stopped` is set when a `stop` call (or a signal) arrives."""

    def __init__(
        self,
        backend: ServiceBackend,
        secret: str,
        info: ServiceInfo,
        max_body_bytes: int = 1 << 30,
        control_secret: str | None = None,
        handoff_dir: Path | None = None,
    ) -> None:
        """`handoff_dir`: where this service and its copies hand their state to each
        other (already checked private, `handoff.prepare_dir`); None: no hand-off."""
        self.backend = backend
        self.info = info
        self.handoff_dir = handoff_dir
        self._secret = secret  #: to fetch the job's state from a copy on another node
        self._verifier = Verifier(secret)
        #: the controller's: every route; without it the job's secret opens every route
        self._control = None if control_secret is None else Verifier(control_secret)
        self._control_secret = control_secret
        self._max_body = max_body_bytes
        #: this process's own: no other launch of the service, on any address, has it
        self.launch_id = secrets.token_hex(8)
        #: the `host:port/launch` calls must be made out to (`tokens.sign`'s `service`):
        #: what this service announces; set by `serve` once listening, no call opens before
        self.address: str | None = None
        self._lock = asyncio.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backend")
        self.stopped = asyncio.Event()
        self.calls = 0
        self._monitor: NvmlMonitor | None = None
        #: the node file's identity (inode, size, mtime) -> its generation: a header is
        #: parsed once per file (a file is never changed, only replaced), not per status
        self._stored: tuple[tuple[int, int, int], int | None] | None = None
        #: the backend's memory as of its last call, read on the backend thread after
        #: each: `status` answers during a call, and reading it then raced the call (a
        #: torch backend's read re-tracks the tensors a park is emptying, and lost them)
        self._memory = backend.memory()

    def _nvml(self) -> NvmlMonitor:
        # started on first use, kept for the service's life (nvmlInit is not free)
        if self._monitor is None:
            self._monitor = NvmlMonitor()
        return self._monitor

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self._max_body, middlewares=[self._middleware])
        app.add_routes(
            [
                web.get("/v1/status", self._status),
                web.post("/v1/park", self._park),
                web.post("/v1/activate", self._activate),
                web.post("/v1/stop", self._stop),
                web.post("/v1/generate", self._generate),
                web.post("/v1/train_step", self._train_step),
                web.get("/v1/weights", self._export),
                web.put("/v1/weights", self._import),
                web.get("/v1/handoff", self._handoff_state),
                web.post("/v1/handoff/discard", self._discard_handoff),
                web.post("/v1/handoff/fetch", self._fetch_handoff),
            ]
        )
        return app

    async def run_backend(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one backend call on the backend thread, after the one in flight."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._pool, self._then_memory, fn, *args)

    def _then_memory(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return fn(*args)
        finally:
            try:
                self._memory = self.backend.memory()
            except Exception:  # the call's own error is the one to answer
                log.exception("reading the backend's memory after a call failed")

    def shutdown_pool(self) -> None:
        self._pool.shutdown(wait=True)

    # --- plumbing ----------------------------------------------------------------

    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        try:
            # the headers first: nobody without a secret gets a byte of body read
            signer, digest = self._authenticate(request)
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                return _error(413, f"request body larger than {self._max_body} bytes")
            check_body(digest, body)
        except AuthError as exc:  # the one answer not signed: no secret opened the call
            return web.json_response(
                {"error": f"unauthenticated: {exc.message}", "code": str(exc.code),
                 "status": 401},
                status=401,
            )
        request[SIGNER] = signer
        return self._signed(request, await self._answer(request, handler))

    def _signed(self, request: web.Request,
                response: web.StreamResponse) -> web.StreamResponse:
        """`response` with its `ANSWER` header, the answer's signature with the secret
        that opened the call (a streamed one is signed in its last bytes instead)."""
        if isinstance(response, web.Response) and not response.prepared:
            body = response.body
            raw = body if isinstance(body, bytes) else b"" if body is None else (
                response.text or "").encode()
            response.headers[ANSWER] = answer_mac(
                request[SIGNER], request.headers[NONCE].strip(), response.status, raw)
        return response

    async def _answer(self, request: web.Request,
                      handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        staged_import = request.method == "PUT" and request.path == "/v1/weights"
        if request.path.startswith(DATA_PLANE) and not staged_import and (
            self.backend.residency in (Residency.PARKED, Residency.DROPPED)
        ):
            return _error(
                409,
                f"service {self.backend.residency}: acquire a lease first "
                "(the controller activates a job's services when it grants the lease)",
            )
        try:
            response: web.StreamResponse = await handler(request)
            self.calls += 1
            return response
        except web.HTTPException as exc:  # aiohttp's own 404/405: signed like any answer
            return _error(exc.status, exc.reason)
        except HttpError as exc:
            return _error(exc.status, exc.message)
        except NotReady as exc:
            return _error(409, str(exc))
        except BackendError as exc:
            return _error(400, str(exc))
        except Exception as exc:  # a bug or a device error: say so, keep serving
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, f"{type(exc).__name__}: {exc}")

    def _authenticate(self, request: web.Request) -> tuple[str, str]:
        """The secret that signed the request's head, if one that opens this route did,
        and the body digest it signed (the body is checked against it once read); else
        raises AuthError."""
        if self.address is None:
            raise AuthError(AuthCode.UNAVAILABLE, "this service is not listening yet")
        args = (request.headers, request.method, request.path_qs, self.address)
        if self._control is None or self._control_secret is None:
            return self._secret, self._verifier.verify_head(*args)
        try:
            return self._control_secret, self._control.verify_head(*args)
        except AuthError as exc:
            if exc.code is AuthCode.MISMATCH:  # the controller's, to another service
                raise
            if request.path in CONTROL_ONLY:
                if exc.code is AuthCode.INVALID:
                    raise AuthError(AuthCode.INVALID, f"{request.path} is the controller's: "
                                    "the job's key does not open it") from None
                raise
        return self._secret, self._verifier.verify_head(*args)

    @staticmethod
    async def _json(request: web.Request) -> dict[str, Any]:
        body = await request.read()
        if not body:
            return {}
        try:
            obj = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise HttpError(400, f"request body is not valid JSON: {exc}") from exc
        except RecursionError:
            raise HttpError(400, "request body is not valid JSON: nested too "
                            "deeply") from None
        if not isinstance(obj, dict):
            raise HttpError(400, "request body must be a JSON object")
        return obj

    @staticmethod
    def _only(obj: Mapping[str, Any], allowed: set[str], call: str) -> None:
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise HttpError(400, f"{call}: unknown field(s) {unknown}; valid: {sorted(allowed)}")

    # --- control plane -------------------------------------------------------------

    async def _status(self, request: web.Request) -> web.Response:
        mem = self._memory  # as of the last backend call: never read beside one
        return web.json_response(
            {
                "job_id": self.info.job_id,
                "role": self.info.role,
                "backend": self.info.backend,
                "step_id": self.info.step_id,
                "pid": os.getpid(),
                "residency": str(self.backend.residency),
                "weights_staged": self.backend.staged,
                "handed_off": self.backend.handed_off,
                "generation": self.backend.generation,
                "stored_generation": await self._stored_generation(),
                "active_sequences": self.backend.active_sequences(),
                "memory": mem.to_json(),
                "calls": self.calls,
                "gpus": reading_json(self._nvml()),  # its CUDA_VISIBLE_DEVICES
            }
        )

    async def _park(self, request: web.Request) -> web.Response:
        obj = await self._json(request)
        self._only(obj, {"level", "handoff"}, "park")
        level = obj.get("level", 1)
        if isinstance(level, bool) or not isinstance(level, int) or level not in (1, 2):
            raise HttpError(400, f"park: level must be 1 or 2, got {level!r}")
        path = self._handoff_path(obj, "park")
        if path is None:
            await self.run_backend(self.backend.park, level)
        else:
            await self.run_backend(self.backend.hand_off, path)
        return await self._status(request)

    async def _activate(self, request: web.Request) -> web.Response:
        obj = await self._json(request)
        self._only(obj, {"handoff", "source"}, "activate")
        path = self._handoff_path(obj, "activate")
        source = obj.get("source")
        if source is not None and (path is None or not isinstance(source, str)):
            raise HttpError(400, "activate: source must be a copy's host:port/launch, with "
                            f"handoff true; got {source!r}")
        if path is None:
            await self.run_backend(self.backend.activate)
            return await self._status(request)
        if source is not None:
            await self._fetch(source, path)

        def wake(state: Path) -> None:  # on the backend thread: no park in between
            b = self.backend
            if not b.handed_off:
                newer = handoff.peek_generation(state)
                if newer is None or newer <= b.generation:
                    b.activate()  # its own state is the newest: a plain activation
                    return
            b.take_over(state)

        await self.run_backend(wake, path)
        return await self._status(request)

    async def _fetch_handoff(self, request: web.Request) -> web.Response:
        """Fetch the job's state from its copy at `source` (another node) into this
        node's hand-off directory, and nothing else: this copy stays as it is. The
        controller moves a state so before it gives back the only window on the node
        that held it (its copies there stop)."""
        obj = await self._json(request)
        self._only(obj, {"source"}, "handoff/fetch")
        source = obj.get("source")
        if not isinstance(source, str):
            raise HttpError(400, f"handoff/fetch: source must be a copy's host:port/launch; "
                            f"got {source!r}")
        path = self._handoff_path({"handoff": True}, "handoff/fetch")
        assert path is not None
        await self._fetch(source, path, "handoff/fetch")
        return await self._status(request)

    async def _stored_generation(self) -> int | None:
        """The generation of the state file in this node's hand-off directory, if any
        (`status` answers it, polled during a rollout's tail: its header, which lists
        every tensor, is read only when the file is a new one)."""
        if self.handoff_dir is None:
            return None
        path = handoff.state_path(self.handoff_dir, self.info.role)
        try:
            st = os.stat(path)
        except OSError:  # none there
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        if self._stored is not None and self._stored[0] == key:
            return self._stored[1]
        try:
            gen = await asyncio.get_running_loop().run_in_executor(
                None, handoff.peek_generation, path)
        except (BackendError, OSError):  # a damaged file is no state to count on
            gen = None
        self._stored = (key, gen)
        return gen

    async def _fetch(self, source: str, path: Path, call: str = "activate") -> None:
        """Fetch the job's state from the copy at `source` (another node) into `path`."""
        from slurmrl.worker.handle import ServiceError, ServiceHandle

        def fetch() -> None:
            try:
                peer = ServiceHandle(source, self._secret, self.info.job_id, self.info.role)
            except ValueError as exc:
                raise HttpError(400, f"{call}: source: {exc}") from None
            try:
                # the generation it holds: where this node's file has it already (a
                # move of it landed while this call waited for the directory's lock),
                # nothing is fetched again
                try:
                    st = peer.status()
                except (ServiceError, OSError):
                    st = {}  # the fetch itself says what is wrong
                # another service's state would replace this one's before take_over
                # refused it (the file is checked too: `must_hold`)
                if any(k in st and st[k] != getattr(self.info, k) for k in ("role", "backend")):
                    raise HttpError(400, f"{call}: source {source} is a {st.get('backend')} "
                                    f"{st.get('role')}; this is a {self.info.backend} "
                                    f"{self.info.role}: its state is not this service's")
                held = st.get("stored_generation")
                expected = held if isinstance(held, int) and not isinstance(held, bool) \
                    else None
                # streamed into a temp file beside the state, checked, then published
                handoff.store_stream(path, peer.handoff_state_into,
                                     f"cannot fetch the handoff state from {source}",
                                     expected, {"backend": self.backend.name,
                                                "role": str(self.backend.role)})
            finally:
                peer.close()

        await asyncio.get_running_loop().run_in_executor(None, fetch)

    async def _handoff_state(self, request: web.Request) -> web.StreamResponse:
        if self.handoff_dir is None:
            raise HttpError(404, "this service has no --handoff-dir: no handoff state")
        path = handoff.state_path(self.handoff_dir, self.info.role)
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below, after the stream)
        except FileNotFoundError:
            raise HttpError(404, f"no handoff state here ({path.name}): no copy on this "
                            "node has handed its state off") from None
        loop = asyncio.get_running_loop()
        with f:
            size = os.fstat(f.fileno()).st_size  # the file is replaced, never rewritten
            mac = stream_mac(request[SIGNER], request.headers[NONCE].strip())
            resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
            resp.content_length = size + STREAM_MAC_BYTES
            await resp.prepare(request)
            left = size
            try:
                while left > 0:
                    chunk = await loop.run_in_executor(None, f.read,
                                                       min(STREAM_CHUNK, left))
                    if not chunk:  # cannot happen to a file replaced, not rewritten
                        raise OSError(f"{path} shrank while it was sent")
                    left -= len(chunk)
                    mac.update(chunk)
                    await resp.write(chunk)
                await resp.write(mac.hexdigest().encode())  # its signature, last
                await resp.write_eof()
            except OSError as exc:  # the caller gone, or the file: the answer is cut short
                log.warning("handoff state to %s cut short: %s", request.remote, exc)
                if request.transport is not None:
                    request.transport.close()
        return resp

    async def _discard_handoff(self, request: web.Request) -> web.Response:
        """The job has ended: remove its state file of this role from this node's
        hand-off directory, and the directory once no other role's file is left (its
        other services remove theirs). Memory-backed, it would otherwise hold a copy of
        the job's state until the node reboots."""
        self._only(await self._json(request), set(), "handoff/discard")
        if self.handoff_dir is None:
            return web.json_response({"discarded": False})

        had = await asyncio.get_running_loop().run_in_executor(
            None, handoff.discard, self.handoff_dir, self.info.role)
        return web.json_response({"discarded": had})

    def _handoff_path(self, obj: Mapping[str, Any], call: str) -> Path | None:
        """The state file when the call asks for a hand-off, else None; 400 if it can't."""
        want = obj.get("handoff", False)
        if not isinstance(want, bool):
            raise HttpError(400, f"{call}: handoff must be true or false, got {want!r}")
        if not want:
            return None
        if self.handoff_dir is None:
            raise HttpError(400, f"{call}: handoff needs a worker started with "
                            "--handoff-dir; this one has none")
        return handoff.state_path(self.handoff_dir, self.info.role)

    async def _stop(self, request: web.Request) -> web.Response:
        self.stopped.set()
        return web.json_response({"stopping": True, "pid": os.getpid()})

    # --- data plane ----------------------------------------------------------------

    async def _generate(self, request: web.Request) -> web.Response:
        obj = await self._json(request)
        self._only(obj, {"prompts", "params", "continuation"}, "generate")
        prompts = obj.get("prompts")
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise HttpError(400, "generate: prompts must be a list of strings")
        raw = obj.get("params", {})
        if not isinstance(raw, dict):
            raise HttpError(400, "generate: params must be an object")
        params = GenerateParams.from_json(raw)
        cont = (Continuation.from_json(obj["continuation"], len(prompts))
                if "continuation" in obj else None)
        result = await self.run_backend(self.backend.generate, prompts, params, cont)
        return web.json_response(result.to_json())

    async def _train_step(self, request: web.Request) -> web.Response:
        obj = await self._json(request)
        self._only(obj, {"samples"}, "train_step")
        raw = obj.get("samples")
        if not isinstance(raw, list):
            raise HttpError(400, "train_step: samples must be a list")
        samples = [TrainSample.from_json(s, i) for i, s in enumerate(raw)]
        metrics = await self.run_backend(self.backend.train_step, samples)
        return web.json_response({"metrics": metrics})

    async def _export(self, request: web.Request) -> web.Response:
        blob = await self.run_backend(self.backend.export_weights)
        return web.Response(body=blob, content_type="application/octet-stream")

    async def _import(self, request: web.Request) -> web.Response:
        blob = await request.read()
        if not blob:
            raise HttpError(400, "import_weights: empty body; send an exported weights blob")

        def load() -> bool:  # on the backend thread: no park or activate in between
            staged = self.backend.residency is not Residency.ACTIVE
            self.backend.import_weights(blob)
            return staged

        # staged: the service is parked; the weights are applied when it is activated
        staged = await self.run_backend(load)
        return web.json_response({"imported_bytes": len(blob), "staged": staged})


def advertised_host(host: str, advertise_host: str | None = None) -> str:
    """The host a service announces: `advertise_host`, else the bound one, or this
    machine's name where it binds every address."""
    if advertise_host:
        return advertise_host
    return socket.gethostname() if host in ("0.0.0.0", "::") else host


async def serve(
    server: ServiceServer,
    host: str,
    port: int,
    on_ready: Callable[[int], None],
    install_signals: bool = True,
    advertise_host: str | None = None,
) -> None:
    """Load the backend, listen, call `on_ready(port)`, and serve until stopped. The
    service's `address`, which every call must be made out to, is
    `advertised_host(host, advertise_host):port/launch_id`.

    SIGTERM and SIGINT (what `scancel` and `srun` send a step) stop it like `stop` does.
    """
    try:
        await server.run_backend(server.backend.load)
    except BackendError:
        raise
    except Exception as exc:  # the model's own code (a factory, a checkpoint) failed
        raise BackendError(f"loading the model failed: {type(exc).__name__}: {exc}") from exc
    runner = web.AppRunner(server.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    if install_signals:  # only the main thread may; tests serve from other threads
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, server.stopped.set)
    try:
        bound = int(runner.addresses[0][1])
        # before anything awaits: no call is served before the service knows its name
        server.address = f"{advertised_host(host, advertise_host)}:{bound}/{server.launch_id}"
        on_ready(bound)
        await server.stopped.wait()
        # let the stop reply (and any call in flight) finish before closing the backend
        await asyncio.sleep(0.05)
    finally:
        await runner.cleanup()
        await server.run_backend(server.backend.close)
        server.shutdown_pool()
