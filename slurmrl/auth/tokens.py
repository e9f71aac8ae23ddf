"""The data plane's per-job secret: a driver signs each call to its own services.

The controller mints one random secret per RL job (`mint_secret`) and hands it to the
job's driver and services only. The driver signs every data-plane call to the service it
is made out to, named `host:port/launch` as the service announced it and the controller
recorded it (`sign(..., service=address)`; `launch` is a random id each worker process
picks when it starts, so one launch's name is never another's, even on the same
`host:port`), with HMAC-SHA256 over

    slurmrl-data/3 \\n SERVICE \\n METHOD \\n PATH \\n sha256(body) hex \\n timestamp \\n nonce

and sends the result as three headers, the service in a fourth (`X-Slurmrl-Service`) and
the body's sha256 in a fifth (`X-Slurmrl-Body-SHA256`): a service checks the signature
over the headers alone before it reads a byte of the body (`Verifier.verify_head`), so
that nobody without the secret makes it buffer a large body, then the body against that
digest (`check_body`). A service's `Verifier` refuses calls that are unsigned, signed
with another secret, altered in any bound part, made out to another service (`MISMATCH`:
a call captured on its way to one of the job's services, e.g. by whoever took a dead
one's port, does not open the job's others, nor a later launch of the same service on
that `host:port`), outside the clock-skew window, or replayed (a nonce seen within the
window).

Without `service` (`sign` and `verify` as the controller's sessions use them,
`auth/sessions.py`), the signed string is the older `slurmrl-data/1` one, without a
service: a service never accepts it.

Why not MUNGE here: data-plane calls are frequent and carry large bodies; an HMAC costs
microseconds and needs no munged round trip, and the secret proves "this job's driver",
which is exactly the right to call this job's services.

A service signs its answers too, with the secret that opened the call: header
`X-Slurmrl-Answer`, HMAC-SHA256 over

    slurmrl-answer/1 \n nonce of the call \n status \n sha256(body) hex

(`answer_mac`), and a streamed answer (the hand-off state) ends in the hex HMAC of
everything before it (`stream_mac`). A caller refuses an answer that is not so signed
(`check_answer`): a service shares its node with other users' services, and one that
died leaves its port to whoever binds it next; such a process must not answer for it.
Bound to the call's nonce, an answer cannot be replayed for another call, nor given by
another launch of the service (which refuses the call: it is not made out to it).

Known limits: replay protection is per `Verifier` (per service process: the service
named in the call, its launch included, keeps it from opening any other), bounded in
memory: past `max_nonces` remembered calls within the window, the oldest are forgotten
and calls at or before their timestamp are refused as expired (never accepted twice).
The body is hashed in full, so sign and verify the bytes actually sent. The secret must
travel only over channels the job's user alone can read.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping

from slurmrl.auth.errors import AuthCode, AuthError

VERSION = "slurmrl-data/1"  #: the controller's sessions: no service named
SERVICE_VERSION = "slurmrl-data/3"  #: a service's calls: made out to one launch
SERVICE = "X-Slurmrl-Service"  #: the `host:port/launch` a call is made out to, signed
TIMESTAMP = "X-Slurmrl-Timestamp"
NONCE = "X-Slurmrl-Nonce"
SIGNATURE = "X-Slurmrl-Signature"
HEADERS = (TIMESTAMP, NONCE, SIGNATURE)
BODY_SHA256 = "X-Slurmrl-Body-SHA256"  #: the digest the signature covers, sent ahead
ANSWER = "X-Slurmrl-Answer"
ANSWER_VERSION = "slurmrl-answer/1"
STREAM_VERSION = "slurmrl-answer-stream/1"
STREAM_MAC_BYTES = 64  #: the hex HMAC a streamed answer ends in

_NONCE = re.compile(r"^[0-9a-f]{16,128}$")
_HEADERS_LOWER = {h.lower() for h in HEADERS}
_SIG = re.compile(r"^[0-9a-f]{64}$")
_SERVICE = re.compile(r"[!-~]{1,300}")  #: printable ASCII, no space: a header value
_MIN_SECRET_BYTES = 16


def mint_secret() -> str:
    """A fresh 256-bit secret, URL-safe text (fits a header, env var or JSON field)."""
    return secrets.token_urlsafe(32)


def sign(
    secret: str | bytes,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    service: str | None = None,
    now: float | None = None,
    nonce: str | None = None,
) -> dict[str, str]:
    """Headers that authenticate one call made out to `service` (a service's
    `host:port/launch`; None: the controller's sessions, no service); `now` and `nonce`
    are for tests."""
    if not method.isalpha() or not method.isascii():
        raise ValueError(f"not an HTTP method: {method!r}")
    if service is not None:
        check_service(service)
    ts = int(time.time() if now is None else now)
    nonce = secrets.token_hex(16) if nonce is None else nonce
    digest = hashlib.sha256(body).hexdigest()
    mac = _mac_digest(_key(secret), service, method.upper(), path, digest, ts, nonce)
    out = {TIMESTAMP: str(ts), NONCE: nonce, SIGNATURE: mac, BODY_SHA256: digest}
    if service is not None:
        out[SERVICE] = service
    return out


class Verifier:
    """Checks signed calls for one job's secret; thread-safe; remembers recent nonces."""

    def __init__(
        self,
        secret: str | bytes,
        *,
        skew_s: float = 30.0,
        max_nonces: int = 65536,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if skew_s <= 0:
            raise ValueError(f"skew_s must be positive, got {skew_s}")
        if max_nonces < 1:
            raise ValueError(f"max_nonces must be at least 1, got {max_nonces}")
        self._key = _key(secret)
        self.skew_s = skew_s
        self.max_nonces = max_nonces
        self._clock = clock
        self._lock = threading.Lock()
        self._heap: list[tuple[int, str]] = []  # (timestamp, nonce), oldest first
        self._seen: set[str] = set()
        self._floor = -1  # calls at or before this timestamp may have been forgotten

    def verify(self, headers: Mapping[str, str], method: str, path: str, body: bytes,
               service: str | None = None) -> None:
        """Return if the call is authentic, fresh and made out to `service` (this
        service's `host:port/launch`; None: a session's call, which names none); raise
        AuthError otherwise."""
        self._verify(headers, method, path, hashlib.sha256(body).hexdigest(), service)

    def verify_head(self, headers: Mapping[str, str], method: str, path: str,
                    service: str | None = None) -> str:
        """Check a call's signature before its body is read, over the body digest its
        `BODY_SHA256` header gives; return that digest, which the body must then match
        (`check_body`). AuthError as `verify`, and where that header is absent or
        malformed."""
        digest = next((v.strip() for k, v in headers.items()
                       if k.lower() == BODY_SHA256.lower()), None)
        if digest is None:
            if not any(k.lower() in _HEADERS_LOWER for k in headers):
                raise AuthError(AuthCode.MISSING,
                                "unsigned call: this service needs the job's key")
            raise AuthError(AuthCode.MALFORMED, f"signed call lacks {BODY_SHA256} (a "
                            "client older than this service: upgrade slurmrl)")
        if not _SIG.match(digest):
            raise AuthError(AuthCode.MALFORMED,
                            f"{BODY_SHA256} must be 64 lowercase hex digits")
        self._verify(headers, method, path, digest, service)
        return digest

    def _verify(self, headers: Mapping[str, str], method: str, path: str,
                digest: str, service: str | None) -> None:
        lower = {k.lower(): v for k, v in headers.items()}
        present = [h for h in HEADERS if h.lower() in lower]
        if not present:
            raise AuthError(AuthCode.MISSING, "unsigned call: this service needs the job's key")
        if len(present) < len(HEADERS):
            absent = ", ".join(h for h in HEADERS if h not in present)
            raise AuthError(AuthCode.MALFORMED, f"signed call lacks {absent}")
        ts_text, nonce, sig = (lower[h.lower()].strip() for h in HEADERS)
        # isascii(): isdigit() alone admits "²" and other digits int() refuses
        if not (ts_text.isascii() and ts_text.isdigit()) or len(ts_text) > 12:
            raise AuthError(AuthCode.MALFORMED, f"{TIMESTAMP} must be unix seconds")
        if not _NONCE.match(nonce):
            raise AuthError(AuthCode.MALFORMED, f"{NONCE} must be 16-128 lowercase hex digits")
        if not _SIG.match(sig):
            raise AuthError(AuthCode.MALFORMED, f"{SIGNATURE} must be 64 lowercase hex digits")
        ts = int(ts_text)
        claimed = None if service is None else _service(lower)
        expected = _mac_digest(self._key, claimed, method.upper(), path, digest, ts, nonce)
        if not hmac.compare_digest(expected, sig):
            raise AuthError(
                AuthCode.INVALID,
                "bad signature: the call was altered or signed with another job's key",
            )
        if claimed != service:
            raise AuthError(AuthCode.MISMATCH, f"call made out to service {claimed}, not "
                            f"to this one ({service}): refused{_relaunched(claimed, service)}")
        now = self._clock()
        if now - ts > self.skew_s:
            raise AuthError(
                AuthCode.EXPIRED, f"call signed {now - ts:.0f} s ago; window is {self.skew_s:g} s"
            )
        if ts - now > self.skew_s:
            raise AuthError(
                AuthCode.REWOUND,
                f"call signed {ts - now:.0f} s in the future; check the nodes' clocks",
            )
        with self._lock:
            self._remember(nonce, ts, now)

    def _remember(self, nonce: str, ts: int, now: float) -> None:
        # Entries older than the window can go: such calls fail the skew check anyway.
        while self._heap and self._heap[0][0] < now - self.skew_s:
            self._seen.discard(heapq.heappop(self._heap)[1])
        if nonce in self._seen:
            raise AuthError(AuthCode.REPLAYED, "call already made once (nonce reused)")
        if ts <= self._floor:
            raise AuthError(
                AuthCode.EXPIRED,
                "call older than the replay window this service can remember under load",
            )
        heapq.heappush(self._heap, (ts, nonce))
        self._seen.add(nonce)
        while len(self._heap) > self.max_nonces:
            old_ts, old_nonce = heapq.heappop(self._heap)
            self._seen.discard(old_nonce)
            self._floor = max(self._floor, old_ts)


def answer_mac(secret: str | bytes, nonce: str, status: int, body: bytes) -> str:
    """The `ANSWER` header a service sends with its answer to the call `nonce`."""
    digest = hashlib.sha256(body).hexdigest()
    message = f"{ANSWER_VERSION}\n{nonce}\n{status}\n{digest}".encode()
    return hmac.new(_key(secret), message, hashlib.sha256).hexdigest()


def check_answer(secret: str | bytes, nonce: str, status: int, body: bytes,
                 header: str | None) -> bool:
    """Whether `header` signs this answer to the call `nonce` with `secret`."""
    return header is not None and hmac.compare_digest(
        answer_mac(secret, nonce, status, body), header.strip())


def stream_mac(secret: str | bytes, nonce: str) -> hmac.HMAC:
    """The HMAC of a streamed answer to the call `nonce`: fed every byte of the body but
    its last `STREAM_MAC_BYTES`, which are its hex digest."""
    return hmac.new(_key(secret), f"{STREAM_VERSION}\n{nonce}\n".encode(), hashlib.sha256)


def _key(secret: str | bytes) -> bytes:
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if len(key) < _MIN_SECRET_BYTES:
        raise ValueError(f"secret must be at least {_MIN_SECRET_BYTES} bytes (use mint_secret())")
    return key


def check_body(digest: str, body: bytes) -> None:
    """The body a call's head was verified for (`Verifier.verify_head`), or AuthError."""
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest(), digest):
        raise AuthError(AuthCode.INVALID, "the body is not the one the call was signed for "
                        "(altered on the way?)")


def check_service(service: str) -> str:
    """`service` if it can name a service in a signed call (printable ASCII, no space:
    a `host:port/launch`); ValueError otherwise."""
    if not _SERVICE.fullmatch(service):
        raise ValueError(f"not a service address: {service!r}")
    return service


def _service(lower: Mapping[str, str]) -> str:
    """The service a signed call names (`lower`: its headers, names in lower case)."""
    claimed = lower.get(SERVICE.lower())
    if claimed is None:
        raise AuthError(AuthCode.MALFORMED, f"signed call lacks {SERVICE} (a client older "
                        "than this service: upgrade slurmrl)")
    claimed = claimed.strip()
    if not _SERVICE.fullmatch(claimed):
        raise AuthError(AuthCode.MALFORMED, f"{SERVICE} must be the service's "
                        "host:port/launch")
    return claimed


def _relaunched(claimed: str | None, service: str | None) -> str:
    """Why a call made out to `claimed` is not this service's, where the address alone
    does not say: another launch at the same `host:port`."""
    if claimed is None or service is None or \
            claimed.partition("/")[0] != service.partition("/")[0]:
        return ""
    return (" (another launch of the service at this address: a call captured for "
            "one, or a driver that did not learn of the relaunch)")


def _mac_digest(key: bytes, service: str | None, method: str, path: str, digest: str,
                ts: int, nonce: str) -> str:
    if service is None:  # a controller session's call
        message = f"{VERSION}\n{method}\n{path}\n{digest}\n{ts}\n{nonce}"
    else:
        message = f"{SERVICE_VERSION}\n{service}\n{method}\n{path}\n{digest}\n{ts}\n{nonce}"
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()
