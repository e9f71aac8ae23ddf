"""The blocking RPC client of the controller: MUNGE-signed JSON over HTTP, with retries.

Each attempt is signed afresh (a MUNGE credential decodes once). With `use_sessions=True`
(the driver client) the first call opens a session with MUNGE (`POST /v1/sessions`) and
later calls are HMAC-signed with it (`slurmrl.auth.sessions`): no munged round trip per
call. When the controller no longer knows the session (restart, expiry, its job ended)
it answers 401 `auth-no-session` before doing anything, and the client opens a new
session and sends the call again, once. Connection failures and 503 answers are
retried with exponential backoff for up to `retry_for_s` (or until the caller's
`retry_until`), so a driver pauses while the controller restarts and then carries on;
500, 502 and 504 (a crash, a proxy in between) are retried the same way for calls that
are safe to repeat (`idempotent`: GETs by default). An outage is logged as a WARNING
once when it starts and once when the controller answers again. Other 4xx answers are
not retried: they raise `ControllerError` with the controller's code and message; an
answer that is not a JSON object, or an error without its `{"code", "message"}` object,
raises `ControllerError` with code `bad-answer` (so does `need` for a missing field).
One connection per `RpcClient`; guarded by a lock, so one call at a time.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
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


BAD_ANSWER = "bad-answer"


def need(answer: Mapping[str, Any], key: str, kind: type | tuple[type, ...] = object,
         status: int = 200) -> Any:
    """`answer[key]`, or `ControllerError` "bad-answer" naming the field the controller's
    answer lacks (or has of another type than `kind`)."""
    value = answer.get(key) if isinstance(answer, Mapping) else None
    if value is None or not isinstance(value, kind):
        got = "no" if value is None else f"a {type(value).__name__} as"
        raise ControllerError(status, BAD_ANSWER,
                              f"the controller's answer has {got} field {key!r}: "
                              f"{_shown(answer)}")
    return value


@dataclass(frozen=True)
class _NotJson:
    """A body that is not JSON (a proxy's page, a crashed handler's text)."""

    text: str


Answer = dict[str, Any] | _NotJson | list[Any] | str | int | float | bool | None


def _shown(answer: object) -> str:
    text = answer.text if isinstance(answer, _NotJson) else json.dumps(answer, default=str)
    return text[:200]


def _error_code(answer: Answer) -> str | None:
    err = answer.get("error") if isinstance(answer, dict) else None
    return str(err.get("code")) if isinstance(err, dict) else None


def _checked(status: int, answer: Answer, prefix: str = "") -> dict[str, Any]:
    """The answer of a call, or the `ControllerError` it means."""
    if not isinstance(answer, dict):
        what = "is not JSON" if isinstance(answer, _NotJson) else "is not a JSON object"
        raise ControllerError(status, BAD_ANSWER,
                              f"{prefix}the controller's answer {what}: {_shown(answer)!r}")
    if status >= 400:
        err = answer.get("error")
        if not isinstance(err, dict):
            raise ControllerError(status, BAD_ANSWER, f"{prefix}the controller's error answer "
                                  f"has no {{code, message}} object: {_shown(answer)}")
        raise ControllerError(status, str(err.get("code") or "error"),
                              prefix + str(err.get("message") or err))
    return answer


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


#: answers retried while `retry_for_s` lasts: 503 always (nothing was done), the others
#: (the call may have run) only for idempotent calls
_RETRY_ALWAYS = frozenset({503})
_RETRY_IDEMPOTENT = frozenset({500, 502, 503, 504})


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
        self._outage_lock = threading.Lock()
        self._outage_since: float | None = None  # when the outage being retried began
        #: a call gave up on the controller (no answer for `retry_for_s`), and none has
        #: been answered since: a driver's clean-up calls then try once, not for minutes
        self.lost = False

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
             query: dict[str, Any] | None = None, wait_s: float = 0.0,
             retry: bool = True, idempotent: bool | None = None,
             retry_until: float | None = None) -> tuple[int, dict[str, Any]]:
        """(status, JSON answer) of one call; retries while the controller is away.

        `idempotent` (default: GETs only) says the call may run twice: 500, 502 and 504
        answers are then retried like 503s. `retry_until` (a `time.monotonic()` time)
        ends the retries sooner than `retry_for_s` (the caller's own deadline); a call
        given up then does not count as the controller lost (`lost`)."""
        target = path + ("?" + urlencode(query) if query else "")
        raw = b"" if body is None else json.dumps(body).encode()
        own = time.monotonic() + (self.retry_for_s if retry else 0.0)
        deadline = own if retry_until is None else min(own, retry_until)
        lost = retry_until is None or retry_until >= own  # given up after retry_for_s
        again = _RETRY_IDEMPOTENT if (method == "GET" if idempotent is None else idempotent) \
            else _RETRY_ALWAYS
        what = f"{method} {path}"
        delay = 0.05
        while True:
            try:
                status, answer = self._once(method, target, raw, wait_s)
                if status not in again:
                    break
                if time.monotonic() >= deadline:
                    self._gave_up(what, lost)
                    break
                why = f"answered HTTP {status} ({_error_code(answer) or _shown(answer)[:80]})"
            except AuthError as exc:  # munged unreachable on this node
                raise ControllerError(None, f"auth-{exc.code}", exc.message) from None
            except _NET_ERRORS as exc:
                if time.monotonic() >= deadline:
                    self._gave_up(what, lost)
                    raise ControllerError(None, "unreachable",
                                          f"controller {self.url} unreachable: {exc}") from exc
                why = f"unreachable ({exc})"
            self._outage(what, why, deadline)
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
            delay = min(delay * 2, 2.0)
        if status not in again:
            self._recovered(what)
        return status, _checked(status, answer)

    def _outage(self, what: str, why: str, deadline: float) -> None:
        with self._outage_lock:
            now = time.monotonic()
            if self._outage_since is None:
                self._outage_since = now
                log.warning("controller %s %s; retrying %s for up to %.0f s", self.url, why,
                            what, max(0.0, deadline - now))
            else:
                log.debug("controller %s %s; retrying %s", self.url, why, what)

    def _gave_up(self, what: str, lost: bool) -> None:
        """This call stops retrying: said, so that the next call's retries are too;
        `lost`: after `retry_for_s` (not at the caller's `retry_until`)."""
        with self._outage_lock:
            if self._outage_since is not None and self.retry_for_s > 0:
                log.warning("controller %s: gave up on %s after %.1f s", self.url, what,
                            time.monotonic() - self._outage_since)
            self._outage_since = None
            self.lost = self.lost or lost

    def _recovered(self, what: str) -> None:
        self.lost = False
        with self._outage_lock:
            if self._outage_since is not None:
                log.warning("controller %s answers again (%s) after %.1f s", self.url, what,
                            time.monotonic() - self._outage_since)
                self._outage_since = None

    def _once(self, method: str, target: str, raw: bytes, wait_s: float) -> tuple[int, Answer]:
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
                    if exc.code == BAD_ANSWER:
                        raise
                    # e.g. the session's job has ended: MUNGE-sign this call, so the
                    # controller answers it as such (409 job-ended, ...)
                    return self._send(method, target, raw, wait_s, session=None)
            status, answer = self._send(method, target, raw, wait_s, session=self._session)
            code = _error_code(answer)
            if status != 401 or code != f"auth-{AuthCode.NO_SESSION}" or attempt:
                return status, answer
            log.info("controller forgot our session; opening a new one")
            self._session = None
        raise AssertionError("unreachable")

    def _open_session(self) -> tuple[str, str]:
        body = {"job_id": self.session_job_id}
        status, answer = self._send("POST", "/v1/sessions", json.dumps(body).encode(), 0.0,
                                    session=None)
        got = _checked(status, answer, prefix="cannot open a session: ")
        s = need(got, "session", dict, status)
        return str(need(s, "session_id", str, status)), str(need(s, "key", str, status))

    def _send(self, method: str, target: str, raw: bytes, wait_s: float,
              session: tuple[str, str] | None) -> tuple[int, Answer]:
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
            answer: Answer = json.loads(data) if data else {}
        except (ValueError, RecursionError):
            answer = _NotJson(data[:200].decode(errors="replace"))
        return resp.status, answer
