"""The driver's (and the controller's) blocking client for one service.

`ServiceHandle(address, secret, job_id, role)` signs every request with the job's
secret, made out to the service at `address` (`host:port/launch` as the controller
recorded it: a service refuses a call made out to another, or to another launch of
itself on the same `host:port`), and keeps one HTTP/1.1 keep-alive connection (guarded
by a lock: one call at a time per handle). Failures raise
`ServiceError` carrying the server's message; `ServiceParked` (409) means the service is
not active — call it inside a held lease. Every answer must carry the service's
signature (`tokens.answer_mac`; a streamed one in its last bytes): one that does not
(another process on a dead service's port) is a `ServiceUnreachable`, as a service that
is gone would be. A request body (weights, prompts, samples) goes only on a connection
the service has so answered on: on a fresh one (the first call, or the retry after the
service closed an idle one) a call with a body first makes a bodiless signed `status`
call there, one more round trip; calls on a proven connection take one. That `status`
is made out to the same launch: a later launch of the service on the same `host:port`
refuses it (401), and gets no body either.

Long tail: `generate(..., on_tail=f)` polls the service's `status` on a second
connection every `poll_s` while the call runs and calls `f(active_sequences)` from the
moment the service has taken up the batch (it reports a count that only shrinks); the
result itself carries each sample's finish order and the per-step active count.

The client library (`slurmrl.client`) wraps this as `job.service("rollout")` and checks
that calls happen inside a held lease; this module knows nothing of leases.
"""

from __future__ import annotations

import contextlib
import hmac
import http.client
import io
import json
import math
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO

from slurmrl.auth.tokens import (
    ANSWER,
    NONCE,
    STREAM_MAC_BYTES,
    check_answer,
    check_service,
    sign,
    stream_mac,
)
from slurmrl.worker.protocol import Continuation, GenerateResult, TrainSample


class ServiceError(Exception):
    """A service call failed; `status` is the HTTP status (None: no answer at all)."""

    def __init__(self, call: str, status: int | None, message: str) -> None:
        super().__init__(f"{call}: {message}" + (f" (HTTP {status})" if status else ""))
        self.call = call
        self.status = status
        self.message = message


class ServiceParked(ServiceError):
    """409: the service is parked/dropped (or its weights are); acquire a lease first."""


class ServiceUnauthorized(ServiceError):
    """401: the signature was refused (wrong secret, not this job's service, or a
    call made out to another service: the address is not the one it announced, e.g.
    that of an earlier launch on the same `host:port`)."""


class ServiceUnreachable(ServiceError):
    """No HTTP answer: connection refused, reset, or the call timed out."""


_RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
CONTROL_TIMEOUT_S = 120.0  #: a control-plane call's limit, whole (status, park, ...)


class ServiceHandle:
    """One service of one RL job, addressed as `host:port/launch`."""

    def __init__(
        self, address: str, secret: str, job_id: str, role: str,
        timeout_s: float = CONTROL_TIMEOUT_S,
        max_answer_bytes: int | None = None, compute_timeout_s: float | None = None,
    ) -> None:
        """`timeout_s`: the control plane's calls (status, park, activate, ...), each
        bounded whole. `compute_timeout_s`: how long a rollout, a train step or a weight
        transfer may go without a byte of answer (None, the default: as long as it
        computes; TCP keepalive still notices a service whose node vanished within
        about two minutes). `max_answer_bytes`: the largest answer read (None: any);
        the controller sets one, since a service runs the user's code and must not
        exhaust the controller's memory or, through the readings it stores, its
        database's disk."""
        addr = address.removeprefix("http://")
        where, slash, launch = addr.partition("/")
        host, sep, port = where.rpartition(":")
        if not (slash and launch and sep and host and port.isascii() and port.isdigit()):
            raise ValueError(f"service address {address!r} must look like "
                             "host:port/launch, as the service announced it")
        check_service(addr)  # every call is made out to it (`tokens.sign`)
        self.address = addr
        self.job_id = job_id
        self.role = role
        self.timeout_s = timeout_s
        self.compute_timeout_s = compute_timeout_s
        self.max_answer_bytes = max_answer_bytes
        self._host, self._port = host.strip("[]"), int(port)
        self._secret = secret
        self._lock = threading.Lock()
        self._conn: http.client.HTTPConnection | None = None

    def __repr__(self) -> str:
        return f"ServiceHandle(job={self.job_id}, role={self.role}, address={self.address})"

    def __enter__(self) -> ServiceHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._drop()

    # --- data plane ----------------------------------------------------------------

    def generate(
        self,
        prompts: Sequence[str],
        *,
        max_tokens: int = 16,
        temperature: float = 1.0,
        seed: int = 0,
        micro_batch: int = 8,
        timeout_s: float | None = None,
        on_tail: Callable[[int], None] | None = None,
        poll_s: float = 0.5,
        first_index: int = 0,
        continuation: Continuation | None = None,
    ) -> GenerateResult:
        params = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed,
                  "micro_batch": micro_batch}
        if first_index:  # the call's place in a batch split over rollout replicas
            params["first_index"] = first_index
        body: dict[str, Any] = {"prompts": list(prompts), "params": params}
        if continuation is not None:  # prompts placed anywhere in the batch, continued
            body["continuation"] = continuation.to_json()
        if on_tail is None:
            return GenerateResult.from_json(self._json("generate", "POST", "/v1/generate",
                                                       body, self._compute(timeout_s)))
        done = threading.Event()
        poller = threading.Thread(target=self._poll_tail, args=(on_tail, poll_s, done),
                                  daemon=True)
        poller.start()
        try:
            raw = self._json("generate", "POST", "/v1/generate", body,
                             self._compute(timeout_s))
        finally:
            done.set()
            poller.join()
        return GenerateResult.from_json(raw)

    def train_step(
        self, samples: Sequence[TrainSample | Mapping[str, Any]], timeout_s: float | None = None
    ) -> dict[str, float]:
        wire = [s.to_json() if isinstance(s, TrainSample) else dict(s) for s in samples]
        raw = self._json("train_step", "POST", "/v1/train_step", {"samples": wire},
                         self._compute(timeout_s))
        return {k: float(v) for k, v in raw["metrics"].items()}

    def export_weights(self, timeout_s: float | None = None) -> bytes:
        return self._call("export_weights", "GET", "/v1/weights", b"", None,
                          self._compute(timeout_s))

    def handoff_state(self, timeout_s: float | None = None) -> bytes:
        """This copy's handoff state file as it is (a floating pool's copy on another
        node fetches it to take the job's state over: `handoff_state_into`)."""
        out = io.BytesIO()
        self.handoff_state_into(out, timeout_s)
        return out.getvalue()

    def handoff_state_into(self, out: BinaryIO, timeout_s: float | None = None) -> int:
        """Stream this copy's handoff state file into `out` (from its start; a retried
        call starts `out` over), `STREAM_CHUNK` bytes at a time, never the whole file
        in memory; returns the bytes written."""
        self._call("handoff_state", "GET", "/v1/handoff", b"", None, timeout_s, sink=out)
        return out.tell()

    def import_weights(self, blob: bytes, timeout_s: float | None = None) -> dict[str, Any]:
        """Load `blob` into this service; the answer says `staged: true` when it was
        parked (the weights are applied when the controller next activates it)."""
        raw = self._call("import_weights", "PUT", "/v1/weights", blob,
                         "application/octet-stream", self._compute(timeout_s))
        try:
            out = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ServiceError("import_weights", 200,
                               f"service answered non-JSON: {raw[:200]!r}") from exc
        return dict(out) if isinstance(out, dict) else {}

    def sync_weights_to(self, other: ServiceHandle, timeout_s: float | None = None) -> int:
        """Copy this service's weights into `other` (trainer -> rollout); returns bytes.

        `other` may be parked (a disaggregated sync leases the trainer set only): it
        stages the weights in host memory and generates with them once activated."""
        blob = self.export_weights(timeout_s)
        other.import_weights(blob, timeout_s)
        return len(blob)

    # --- control plane -------------------------------------------------------------

    def status(self, timeout_s: float | None = None) -> dict[str, Any]:
        return self._json("status", "GET", "/v1/status", None, timeout_s, whole=True)

    def park(self, level: int = 1, timeout_s: float | None = None, *,
             handoff: bool = False) -> dict[str, Any]:
        """Park; with `handoff`, hand the whole state to the service's handoff file and
        keep none (the worker needs `--handoff-dir`; `level` does not apply)."""
        body: dict[str, Any] = {"level": level}
        if handoff:  # sent only when asked, so a server without hand-off sees no change
            body["handoff"] = True
        return self._json("park", "POST", "/v1/park", body, timeout_s, whole=True)

    def activate(self, timeout_s: float | None = None, *,
                 handoff: bool = False, source: str | None = None) -> dict[str, Any]:
        """Activate; with `handoff`, take over the handoff file's state when this copy
        handed its own off or the file holds a newer generation; with `source` too (a
        copy on another node, `host:port/launch`), fetch that copy's state file first."""
        body: dict[str, Any] = {"handoff": True} if handoff else {}
        if source is not None:
            body["source"] = source
        return self._json("activate", "POST", "/v1/activate", body, timeout_s, whole=True)

    def discard_handoff(self, timeout_s: float | None = None) -> bool:
        """The job has ended: the copy removes the job's state of its role from its
        node's hand-off directory (the controller's call); True if there was one."""
        out = self._json("discard_handoff", "POST", "/v1/handoff/discard", {}, timeout_s,
                         whole=True)
        return out.get("discarded") is True

    def fetch_handoff(self, source: str, timeout_s: float | None = None) -> dict[str, Any]:
        """Fetch the job's state from its copy at `source` (`host:port/launch`, on
        another node) into this copy's node (the controller's call); the copy's residency
        stays as it is. Returns the copy's status (`stored_generation` the file's)."""
        return self._json("fetch_handoff", "POST", "/v1/handoff/fetch", {"source": source},
                          timeout_s, whole=True)

    def stop(self, timeout_s: float | None = None) -> None:
        self._json("stop", "POST", "/v1/stop", {}, timeout_s, whole=True)
        self.close()

    # --- plumbing ------------------------------------------------------------------

    def _poll_tail(self, on_tail: Callable[[int], None], poll_s: float,
                   done: threading.Event) -> None:
        probe = ServiceHandle(self.address, self._secret, self.job_id, self.role,
                              timeout_s=max(poll_s * 4, 2.0),
                              max_answer_bytes=self.max_answer_bytes)
        started = False  # a probe before the service took up the batch reads 0: not a tail
        try:
            while not done.wait(poll_s):
                with contextlib.suppress(ServiceError):  # a missed probe is no failure
                    active = int(probe.status()["active_sequences"])
                    started = started or active > 0
                    if started:
                        on_tail(active)
        finally:
            probe.close()

    def _compute(self, timeout_s: float | None) -> float:
        """A data-plane call's timeout: the caller's, else `compute_timeout_s` (inf:
        none)."""
        if timeout_s is not None:
            return timeout_s
        return math.inf if self.compute_timeout_s is None else self.compute_timeout_s

    def _json(self, call: str, method: str, path: str, obj: Any,
              timeout_s: float | None, whole: bool = False) -> dict[str, Any]:
        body = b"" if obj is None else json.dumps(obj).encode()
        ctype = None if obj is None else "application/json"
        raw = self._call(call, method, path, body, ctype, timeout_s, whole)
        try:
            out = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ServiceError(call, 200, f"service answered non-JSON: {raw[:200]!r}") from exc
        if not isinstance(out, dict):
            raise ServiceError(call, 200, "service answered JSON that is not an object")
        return out

    def _call(self, call: str, method: str, path: str, body: bytes,
              content_type: str | None, timeout_s: float | None,
              whole: bool = False, sink: BinaryIO | None = None) -> bytes:
        """One signed call. The timeout bounds each socket operation; with `whole`, the
        control plane's, it bounds the whole call: the controller makes these while
        other jobs wait on the pool, and a service (the job user's process) answering a
        byte at a time must not hold them for longer. With `sink`, a 200 answer's body
        is written there (b"" returned) instead of read into memory."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        assert not (whole and math.isinf(timeout)), "a whole call is bounded"
        expired = threading.Event()
        timer = threading.Timer(timeout, self._abort, (expired,)) if whole else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        late = ServiceUnreachable(call, None, f"{self.address}: no whole answer within "
                                  f"{timeout:g} s")
        try:
            data = self._call_once(call, method, path, body, content_type, timeout, sink)
        except ServiceError as exc:
            if expired.is_set():
                raise late from exc
            raise
        finally:
            if timer is not None:
                timer.cancel()
        if expired.is_set():  # what was read when the socket was shut is cut short
            self.close()
            raise late
        return data

    def _abort(self, expired: threading.Event) -> None:
        """The whole call's deadline passed: shut its socket, which ends the read."""
        expired.set()
        conn = self._conn
        sock = None if conn is None else conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _call_once(self, call: str, method: str, path: str, body: bytes,
                   content_type: str | None, timeout: float,
                   sink: BinaryIO | None = None) -> bytes:
        limit = None if math.isinf(timeout) else timeout  # inf: block
        with self._lock:
            for attempt in (0, 1):
                if sink is not None:  # a retry writes the answer from its start
                    sink.seek(0)
                    sink.truncate()
                # kept: a connection the service has answered on, signed (below)
                reused = self._conn is not None and self._conn.sock is not None
                conn = self._conn if reused else None
                if conn is None:
                    self._drop()
                    conn = self._conn = http.client.HTTPConnection(self._host, self._port,
                                                                   timeout=limit)
                conn.timeout = limit
                if conn.sock is not None:
                    conn.sock.settimeout(limit)
                try:
                    if not reused:
                        conn.connect()
                        _keepalive(conn.sock)
                        if body:  # not a byte of it before the peer proved who it is
                            self._prove(conn, call, limit)
                    status, data = self._exchange(conn, call, method, path, body,
                                                  content_type, sink, self.max_answer_bytes)
                    break
                except _RETRYABLE as exc:
                    self._drop()
                    # the server closed an idle keep-alive connection: retry once, fresh
                    if reused and attempt == 0:
                        continue
                    raise ServiceUnreachable(call, None, f"{self.address}: {exc}") from exc
                except (TimeoutError, OSError) as exc:
                    self._drop()
                    what = "timed out" if isinstance(exc, TimeoutError) else str(exc)
                    raise ServiceUnreachable(call, None, f"{self.address}: {what}") from exc
                except ServiceError:
                    self._drop()  # its peer unproven, or an answer left unread
                    raise
            if not reused and status in (401, 413):
                self._drop()  # an unsigned answer proves nothing of who gave it
        if status == 200:
            return data
        raise _refusal(call, status, data)

    def _drop(self) -> None:
        """Close this handle's connection: the next call opens (and proves) a new one."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _prove(self, conn: http.client.HTTPConnection, call: str,
               limit: float | None) -> None:
        """Before a body goes out on a fresh connection: a bodiless signed `status` on
        it, which the service must answer signed, within the control plane's timeout at
        most. A process that took a dead service's port so gets no body (weights,
        prompts, samples): `ServiceUnreachable` (`_impostor`), or the 401 it answered."""
        assert conn.sock is not None
        conn.sock.settimeout(self.timeout_s if limit is None else min(limit, self.timeout_s))
        status, data = self._exchange(conn, call, "GET", "/v1/status", b"", None, None,
                                      PROOF_ANSWER_BYTES)
        if status != 200:
            raise _refusal(call, status, data)
        if conn.sock is None:  # closed after it answered: the body would go elsewhere
            raise ServiceUnreachable(call, None, f"{self.address} closed the connection "
                                     "after proving itself")
        conn.sock.settimeout(limit)

    def _exchange(self, conn: http.client.HTTPConnection, call: str, method: str,
                  path: str, body: bytes, content_type: str | None,
                  sink: BinaryIO | None, cap: int | None) -> tuple[int, bytes]:
        """One signed request on `conn`, made out to this service, and its answer's
        status and body (b"": a 200 streamed into `sink`), read up to `cap` bytes
        (None: any), its signature checked (a streamed one as it streams, `_copy`).
        Only a refusal made before any secret opened the call (401, or 413: a body too
        large to be read) comes unsigned: a service cannot sign it, and it carries no
        result. ServiceError where the answer is not the service's, or is too large."""
        headers = dict(sign(self._secret, method, path, body, service=self.address))
        nonce = headers[NONCE]  # signed per attempt: a retry must not look like a replay
        if content_type:
            headers["Content-Type"] = content_type
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        status = resp.status
        if sink is not None and status == 200:
            _copy(resp, sink, call, self.address, stream_mac(self._secret, nonce))
            return status, b""
        data = resp.read() if cap is None else resp.read(cap + 1)
        if cap is not None and len(data) > cap:
            raise ServiceError(call, status, f"{self.address} answered more than {cap} "
                               "bytes")
        if status not in (401, 413) and not check_answer(self._secret, nonce, status, data,
                                                          resp.getheader(ANSWER)):
            raise _impostor(call, self.address)
        return status, data


STREAM_CHUNK = 1 << 20  #: bytes read from the socket at a time when streaming an answer
PROOF_ANSWER_BYTES = 1 << 20  #: the largest `status` answer read to prove a connection


class _SinkFailed(Exception):
    """Writing a streamed answer failed (not the connection: the local file)."""


def _keepalive(sock: socket.socket | None) -> None:
    """Probe an idle connection after 60 s, every 10 s, 6 times: a call that waits
    without a timeout on a service whose node vanished ends in about two minutes."""
    if sock is None:
        return
    with contextlib.suppress(OSError, AttributeError):  # the TCP_* names are Linux's
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 6)


def _refusal(call: str, status: int, data: bytes) -> ServiceError:
    """The error a service's non-200 answer stands for, with its message."""
    try:
        message = str(json.loads(data)["error"])
    except (ValueError, KeyError, TypeError):
        message = data[:500].decode(errors="replace") or http.client.responses.get(
            status, "error")
    cls = {409: ServiceParked, 401: ServiceUnauthorized}.get(status, ServiceError)
    return cls(call, status, message)


def _impostor(call: str, address: str) -> ServiceUnreachable:
    return ServiceUnreachable(call, None, f"{address} answered without the service's "
                              "signature: not the job's service (it is gone, and another "
                              "process has its port?)")


def _copy(resp: http.client.HTTPResponse, sink: BinaryIO, call: str, address: str,
          mac: hmac.HMAC) -> None:
    """Copy `resp`'s body into `sink` but its last `STREAM_MAC_BYTES`, the hex `mac` of
    the rest (`tokens.stream_mac`): one that does not match is a ServiceUnreachable
    (`_impostor`), as is a body cut short of its Content-Length (or of a chunk), naming
    the address; a failed write is a ServiceError saying so."""
    got = 0
    tail = b""  # the last bytes read: the signature, once the body ends
    try:
        while chunk := resp.read(STREAM_CHUNK):
            got += len(chunk)
            data = tail + chunk
            cut = max(0, len(data) - STREAM_MAC_BYTES)
            body, tail = data[:cut], data[cut:]
            mac.update(body)
            try:
                sink.write(body)
            except OSError as exc:
                raise _SinkFailed(exc.strerror or str(exc)) from exc
    except _SinkFailed as exc:
        raise ServiceError(call, 200, f"cannot write the answer of {address}: {exc}") from exc
    except http.client.IncompleteRead as exc:
        raise ServiceUnreachable(call, None, f"{address}: answer cut short after "
                                 f"{got + len(exc.partial)} bytes") from exc
    # read(n) ends quietly where the peer closes early: what is left says so
    if resp.length:
        raise ServiceUnreachable(call, None, f"{address}: answer cut short after {got} "
                                 f"bytes, {resp.length} more announced")
    if not hmac.compare_digest(tail, mac.hexdigest().encode()):
        raise _impostor(call, address)
