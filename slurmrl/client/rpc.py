"""The blocking RPC client of the controller: MUNGE-signed JSON over HTTP, with retries.

Each attempt is signed afresh (a MUNGE credential decodes once). With `use_sessions=True`
(the driver client) the first call opens a session with MUNGE (`POST /v1/sessions`) and
later calls are HMAC-signed with it (`slurmrl.auth.sessions`): no munged round trip per
call. When the controller no longer knows the session (restart, expiry, its job ended)
it answers 401 `auth-no-session` before doing anything, and the client opens a new
session and sends the call again, once. Connection failures
and 503 answers are retried with exponential backoff for up to `retry_for_s`, so a
driver pauses while the controller restarts and then carries on. Other 4xx answers are
not retried: they raise `ControllerError` with the controller's code and message.
One connection per `RpcClient`; guarded by a lock, so one call at a time.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
from typing import Any
from urllib.parse import urlencode

from slurmrl.auth import AuthCode, AuthError, sessions
from slurmrl.auth.requests import sign_request

log = logging.getLogger(__name__)


class ControllerError(Exception):
    """The controller refused a call (`status`, `code`) or could not be reached."""

    def __init__(self, status: int | None, code: str, message: str) -> None:
        where = f"HTTP {status}, {code}" if status else code
        super().__init__(f"{message} ({where})")
        self.status, self.code, self.message = status, code, message


_NET_ERRORS = (ConnectionError, TimeoutError, OSError, http.client.HTTPException)

DEFAULT_PORT = 6829
#: a controller URL: http://HOST[:PORT][/], HOST a name or IPv4 address, or [IPv6]. The
#: SPANK plugin checks plugstack.conf's controller= against this same rule (url_ok in
#: spank_plugin/slurmrl.c), so that it never hands jobs a URL this client refuses.
_URL = re.compile(r"http://([A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])(?::([0-9]{1,5}))?/?")
URL_MAX = 1023


def split_url(url: str) -> tuple[str, int]:
    """(host, port) of a controller URL; ValueError naming the accepted form."""
    m = _URL.fullmatch(url) if len(url) <= URL_MAX else None
    port = int(m.group(2)) if m and m.group(2) else DEFAULT_PORT
    if m is None or not 1 <= port <= 65535:
        raise ValueError(f"controller URL {url[:80]!r} must look like http://host:port "
                         "(host a name, IPv4 or [IPv6] address; port 1..65535; no https, "
                         "user or path)")
    return m.group(1).strip("[]"), port


class RpcClient:
    def __init__(self, url: str, *, retry_for_s: float = 300.0, timeout_s: float = 30.0,
                 munge_socket: str | None = None, use_sessions: bool = False,
                 session_job_id: int | None = None) -> None:
        self._host, self._port = split_url(url)
        self.url = url
        self.retry_for_s = retry_for_s
        self.timeout_s = timeout_s
        self._socket = munge_socket
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()
        self.use_sessions = use_sessions
        #: tie the session to this RL job: it dies with the job
        self.session_job_id = session_job_id
        self._session: tuple[str, str] | None = None  # (id, key)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
             query: dict[str, Any] | None = None, wait_s: float = 0.0,
             retry: bool = True) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of one call; retries while the controller is away."""
        target = path + ("?" + urlencode(query) if query else "")
        raw = b"" if body is None else json.dumps(body).encode()
        deadline = time.monotonic() + (self.retry_for_s if retry else 0.0)
        delay = 0.05
        while True:
            try:
                status, answer = self._once(method, target, raw, wait_s)
                if status != 503 or time.monotonic() >= deadline:
                    break
                log.info("controller busy (%s); retrying", answer.get("error"))
            except AuthError as exc:  # munged unreachable on this node
                raise ControllerError(None, f"auth-{exc.code}", exc.message) from None
            except _NET_ERRORS as exc:
                if time.monotonic() >= deadline:
                    raise ControllerError(None, "unreachable",
                                          f"controller {self.url} unreachable: {exc}") from exc
                log.info("controller %s unreachable (%s); retrying in %.2fs", self.url, exc,
                         delay)
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        if status >= 400:
            err = answer.get("error") or {}
            raise ControllerError(status, str(err.get("code", "error")),
                                  str(err.get("message", answer)))
        return status, answer

    def _once(self, method: str, target: str, raw: bytes,
              wait_s: float) -> tuple[int, dict[str, Any]]:
        if not self.use_sessions:
            return self._send(method, target, raw, wait_s, session=None)
        for attempt in range(2):
            if self._session is None:
                try:
                    self._session = self._open_session()
                except ControllerError as exc:
                    if exc.status is None or exc.status >= 500:  # retried by call()
                        return exc.status or 503, {"error": {"code": exc.code,
                                                             "message": exc.message}}
                    # e.g. the session's job has ended: MUNGE-sign this call, so the
                    # controller answers it as such (409 job-ended, ...)
                    return self._send(method, target, raw, wait_s, session=None)
            status, answer = self._send(method, target, raw, wait_s, session=self._session)
            code = (answer.get("error") or {}).get("code")
            if status != 401 or code != f"auth-{AuthCode.NO_SESSION}" or attempt:
                return status, answer
            log.info("controller forgot our session; opening a new one")
            self._session = None
        raise AssertionError("unreachable")

    def _open_session(self) -> tuple[str, str]:
        body = {"job_id": self.session_job_id}
        status, answer = self._send("POST", "/v1/sessions", json.dumps(body).encode(), 0.0,
                                    session=None)
        if status >= 400:
            err = answer.get("error") or {}
            raise ControllerError(status, str(err.get("code", "error")),
                                  "cannot open a session: " + str(err.get("message", answer)))
        s = answer["session"]
        return str(s["session_id"]), str(s["key"])

    def _send(self, method: str, target: str, raw: bytes, wait_s: float,
              session: tuple[str, str] | None) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if session is None:
                headers = {"Authorization": sign_request(method, target, raw,
                                                         socket=self._socket)}
            else:
                headers = sessions.sign(session[0], session[1], method, target, raw)
            headers["Content-Type"] = "application/json"
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port,
                                                        timeout=self.timeout_s + wait_s)
            self._conn.timeout = self.timeout_s + wait_s
            if self._conn.sock is not None:
                self._conn.sock.settimeout(self._conn.timeout)
            try:
                self._conn.request(method, target, body=raw or None, headers=headers)
                resp = self._conn.getresponse()
                data = resp.read()
            except BaseException:
                self._conn.close()
                self._conn = None
                raise
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            text = data[:200].decode(errors="replace")
            answer = {"error": {"code": "bad-answer", "message": text}}
        return resp.status, answer if isinstance(answer, dict) else {"value": answer}
