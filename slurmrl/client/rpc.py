"""The blocking RPC client of the controller: MUNGE-signed JSON over HTTP, with retries.

Each attempt is signed afresh (a MUNGE credential decodes once). Connection failures
and 503 answers are retried with exponential backoff for up to `retry_for_s`, so a
driver pauses while the controller restarts and then carries on. Other 4xx answers are
not retried: they raise `ControllerError` with the controller's code and message.
One connection per `RpcClient`; guarded by a lock, so one call at a time.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from typing import Any
from urllib.parse import urlencode, urlsplit

from slurmrl.auth import AuthError
from slurmrl.auth.requests import sign_request

log = logging.getLogger(__name__)


class ControllerError(Exception):
    """The controller refused a call (`status`, `code`) or could not be reached."""

    def __init__(self, status: int | None, code: str, message: str) -> None:
        where = f"HTTP {status}, {code}" if status else code
        super().__init__(f"{message} ({where})")
        self.status, self.code, self.message = status, code, message


_NET_ERRORS = (ConnectionError, TimeoutError, OSError, http.client.HTTPException)


class RpcClient:
    def __init__(self, url: str, *, retry_for_s: float = 300.0, timeout_s: float = 30.0,
                 munge_socket: str | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"controller URL {url!r} must look like http://host:port")
        self.url = url
        self._host, self._port = parts.hostname, parts.port or 6829
        self.retry_for_s = retry_for_s
        self.timeout_s = timeout_s
        self._socket = munge_socket
        self._conn: http.client.HTTPConnection | None = None
        self._lock = threading.Lock()

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
        with self._lock:
            headers = {"Authorization": sign_request(method, target, raw, socket=self._socket),
                       "Content-Type": "application/json"}
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
