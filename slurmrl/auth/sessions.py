"""Controller sessions: authenticate once with MUNGE, then sign each request with an HMAC.

A driver opens a session with one MUNGE-signed `POST /v1/sessions`; the controller answers
a random session id and 256-bit key, bound to the uid MUNGE vouched for (and, optionally,
to one RL job: the session dies when that job ends). Every later request carries

    Authorization: SLURMRL-SESSION <session id>
    X-Slurmrl-Timestamp / X-Slurmrl-Nonce / X-Slurmrl-Signature

where the signature is `slurmrl.auth.tokens`'s HMAC-SHA256 over method, raw path (query
included), sha256(body), timestamp and nonce. `SessionTable.verify` refuses an unknown or
expired session, a forged or altered request, one signed outside the skew window, and a
replayed nonce (each session remembers the nonces of its window, bounded), with the same
`AuthError` codes as MUNGE refusals. Why: a MUNGE round trip costs ~0.3 ms of the
controller's time per request (encode + decode, each a call to munged); an HMAC ~0.02 ms.

Choice on restart: sessions live in the controller's memory only (the key never touches
disk). After a controller restart every session is unknown; the client sees 401
`auth-no-session` (nothing was executed) and transparently opens a new one with MUNGE.

Known limits: a session key is a bearer secret for its TTL: it must travel only over
loopback or a trusted network (the RPC is plain HTTP, like the MUNGE credentials). The
replay cache is per process, bounded (`max_nonces` per session): past it, requests at or
before the oldest forgotten timestamp are refused as expired, never accepted twice.
"""

from __future__ import annotations

import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from slurmrl.auth import tokens
from slurmrl.auth.errors import AuthCode, AuthError
from slurmrl.model import Identity

SCHEME = "SLURMRL-SESSION"
DEFAULT_TTL_S = 3600.0
DEFAULT_SKEW_S = 30.0
#: per uid: a runaway client cannot fill the controller's memory with sessions
MAX_PER_UID = 64
MAX_NONCES = 4096

_SID = re.compile(r"^[0-9a-f]{32}$")


@dataclass(frozen=True)
class SessionGrant:
    """What the controller hands the client when it opens a session."""

    session_id: str
    key: str
    expires_at: float
    job_id: int | None


@dataclass
class _Session:
    who: Identity
    expires_at: float
    job_id: int | None
    verifier: tokens.Verifier = field(repr=False)


class SessionTable:
    """Open sessions of one controller; thread-safe; call `verify` per request."""

    def __init__(
        self,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        skew_s: float = DEFAULT_SKEW_S,
        max_per_uid: int = MAX_PER_UID,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0 or skew_s <= 0 or max_per_uid < 1:
            raise ValueError("ttl_s and skew_s must be positive, max_per_uid at least 1")
        self.ttl_s, self.skew_s, self.max_per_uid = ttl_s, skew_s, max_per_uid
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, _Session] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, who: Identity, job_id: int | None = None) -> SessionGrant:
        """A new session for `who` (authenticated by MUNGE), optionally tied to a job."""
        sid, key = secrets.token_hex(16), tokens.mint_secret()
        expires = self._clock() + self.ttl_s
        verifier = tokens.Verifier(key, skew_s=self.skew_s, max_nonces=MAX_NONCES,
                                   clock=self._clock)
        with self._lock:
            self._purge()
            mine = [s for s, x in self._sessions.items() if x.who.uid == who.uid]
            for old in mine[: max(0, len(mine) - self.max_per_uid + 1)]:
                del self._sessions[old]  # the oldest go first
            self._sessions[sid] = _Session(who, expires, job_id, verifier)
        return SessionGrant(sid, key, expires, job_id)

    def end_job(self, job_id: int) -> int:
        """Close every session tied to `job_id`; returns how many."""
        with self._lock:
            gone = [s for s, x in self._sessions.items() if x.job_id == job_id]
            for s in gone:
                del self._sessions[s]
        return len(gone)

    def verify(
        self, header: str, headers: Mapping[str, str], method: str, path: str, body: bytes,
        *, job_alive: Callable[[int], bool] | None = None,
    ) -> Identity:
        """The caller of a session-signed request, or AuthError saying why it is refused.

        `job_alive(job_id)` (the controller's view) ends a job-bound session whose job
        has ended, even if `end_job` was not called (e.g. the job ended before a restart).
        """
        sid = _parse_header(header)
        with self._lock:
            s = self._sessions.get(sid)
        if s is None:
            raise AuthError(AuthCode.NO_SESSION, "unknown session (expired, closed, or the "
                            "controller restarted): open a new one with MUNGE")  # fmt: skip
        now = self._clock()
        if now >= s.expires_at:
            with self._lock:
                self._sessions.pop(sid, None)
            raise AuthError(AuthCode.NO_SESSION,
                            f"session expired {now - s.expires_at:.0f} s ago: open a new one")
        s.verifier.verify(headers, method, path, body)  # forgery, skew, replay
        if s.job_id is not None and job_alive is not None and not job_alive(s.job_id):
            self.end_job(s.job_id)
            raise AuthError(AuthCode.NO_SESSION,
                            f"session was tied to RL job {s.job_id}, which has ended")
        return s.who

    def ended(self, header: str, *, job_alive: Callable[[int], bool] | None = None
              ) -> str | None:
        """Why the session of a request `verify` took is no longer usable (closed,
        expired, its job ended), or None while it is: what a stream opened with it
        checks before each frame."""
        sid = _parse_header(header)
        with self._lock:
            s = self._sessions.get(sid)
        if s is None:
            return "session closed"
        if self._clock() >= s.expires_at:
            return "session expired"
        if s.job_id is not None and job_alive is not None and not job_alive(s.job_id):
            return f"session tied to RL job {s.job_id}, which has ended"
        return None

    def _purge(self) -> None:
        now = self._clock()
        for sid in [s for s, x in self._sessions.items() if x.expires_at <= now]:
            del self._sessions[sid]


def sign(session_id: str, key: str, method: str, path: str, body: bytes = b"",
         *, now: float | None = None, nonce: str | None = None) -> dict[str, str]:
    """The headers (Authorization and the three X-Slurmrl-*) for one session request."""
    out = tokens.sign(key, method, path, body, now=now, nonce=nonce)
    out["Authorization"] = f"{SCHEME} {session_id}"
    return out


def is_session(header: str | None) -> bool:
    return bool(header) and header.strip().upper().startswith(SCHEME + " ")  # type: ignore[union-attr]


def _parse_header(header: str) -> str:
    _, _, sid = header.strip().partition(" ")
    sid = sid.strip()
    if not _SID.match(sid):
        raise AuthError(AuthCode.MALFORMED, f"'{SCHEME} <id>': the id must be 32 hex digits")
    return sid

