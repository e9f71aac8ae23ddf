"""MUNGE-signed controller requests: who is calling, bound to what they ask.

Every RPC request to the controller carries

    Authorization: MUNGE <credential>

where the credential (made by the caller's local munged, so its uid cannot be forged)
carries this payload, binding it to one request:

    slurmrl-rpc/1 \\n METHOD \\n PATH \\n sha256(body) hex \\n unix time (s)

`verify_request` decodes the credential (munged refuses expired, forged and replayed
ones: a credential decodes once), then checks that the payload describes *this* request,
so a credential captured from one request cannot be attached to another. The caller's
uid comes from MUNGE only, never from anything the request says.

Known limits: PATH is the request target as sent (path and query string, percent-encoded,
e.g. aiohttp's `request.raw_path`); a proxy that rewrites it breaks verification. The
replay cache is munged's, so a credential is single-use only among controllers that share
one munged. A client retrying a request must sign it again.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import time
from collections.abc import Iterable

from slurmrl.auth import munge
from slurmrl.auth.errors import AuthCode, AuthError
from slurmrl.model import Identity

HEADER = "Authorization"
SCHEME = "MUNGE"
VERSION = "slurmrl-rpc/1"
#: A real credential is a few hundred bytes; refuse absurd headers before munged sees them.
MAX_CREDENTIAL_CHARS = 16384
DEFAULT_TTL_S = 60

_METHOD = re.compile(r"^[A-Z]{1,16}$")
_CRED = re.compile(r"^MUNGE:[A-Za-z0-9+/=:]+$")

_MUNGE_TO_AUTH: dict[int, AuthCode] = {
    munge.MungeCode.CRED_EXPIRED: AuthCode.EXPIRED,
    munge.MungeCode.CRED_REWOUND: AuthCode.REWOUND,
    munge.MungeCode.CRED_REPLAYED: AuthCode.REPLAYED,
    munge.MungeCode.BAD_CRED: AuthCode.MALFORMED,
    munge.MungeCode.SOCKET: AuthCode.UNAVAILABLE,
    munge.MungeCode.SNAFU: AuthCode.UNAVAILABLE,
    munge.MungeCode.NO_MEMORY: AuthCode.UNAVAILABLE,
    munge.MungeCode.TIMEOUT: AuthCode.UNAVAILABLE,
}


def request_payload(method: str, path: str, body: bytes, ts: int) -> bytes:
    """The bytes a credential carries for one request (see the module docstring)."""
    method, path = _check_target(method, path)
    digest = hashlib.sha256(body).hexdigest()
    return f"{VERSION}\n{method}\n{path}\n{digest}\n{ts}".encode("ascii")


def sign_request(
    method: str,
    path: str,
    body: bytes = b"",
    *,
    ttl_s: int | None = DEFAULT_TTL_S,
    socket: str | os.PathLike[str] | None = None,
    decoder_uid: int | None = None,
) -> str:
    """The `Authorization` header value for one request, as the calling process's uid.

    `decoder_uid` (the controller's uid, when the client knows it) restricts who can
    decode the credential, so a process that intercepts it cannot burn or read it.
    Raises AuthError(UNAVAILABLE) when munged cannot be reached.
    """
    payload = request_payload(method, path, body, int(time.time()))
    try:
        cred = munge.encode(payload, ttl_s=ttl_s, socket=socket, uid_restriction=decoder_uid)
    except munge.MungeError as exc:
        raise AuthError(
            AuthCode.UNAVAILABLE, f"cannot make a MUNGE credential: {exc.text}"
        ) from exc
    return f"{SCHEME} {cred}"


def verify_request(
    header: str | None,
    method: str,
    path: str,
    body: bytes,
    *,
    socket: str | os.PathLike[str] | None = None,
    max_age_s: float = DEFAULT_TTL_S,
    max_skew_s: float = 5.0,
) -> Identity:
    """Who made this request, or AuthError saying why it is refused.

    `max_age_s` bounds the credential's age by munged's encode time whatever TTL the
    client chose; `max_skew_s` bounds the payload's timestamp against that encode time
    (both are read on the caller's node, so they agree unless the payload was doctored).
    """
    cred = _parse_header(header)
    try:
        decoded = munge.decode(cred, socket=socket)
    except munge.MungeError as exc:
        code = _MUNGE_TO_AUTH.get(int(exc.code), AuthCode.INVALID)
        if isinstance(exc, munge.MungeUnavailable):
            code = AuthCode.UNAVAILABLE
        who = f" (made by uid {exc.uid})" if exc.uid is not None else ""
        raise AuthError(code, f"MUNGE credential refused: {exc.text}{who}") from None

    ts = _check_payload(decoded.payload, method, path, body)
    if abs(ts - decoded.encoded_at) > max_skew_s:
        raise AuthError(
            AuthCode.MISMATCH,
            f"request timestamp {ts} does not match the credential's encode time "
            f"{decoded.encoded_at}",
        )
    age = time.time() - decoded.encoded_at
    if age > max_age_s:
        raise AuthError(
            AuthCode.EXPIRED,
            f"credential is {age:.0f} s old; this controller accepts at most {max_age_s:g} s",
        )
    return Identity(uid=decoded.uid, gid=decoded.gid, user=user_name(decoded.uid))


def user_name(uid: int) -> str:
    """The passwd name of `uid`, or "" when it has none (a container's stray uid)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return ""


def is_admin(identity: Identity, admins: Iterable[str | int]) -> bool:
    """Root, or a user the site config names in `controller.admins` by name or uid."""
    if identity.uid == 0:
        return True
    for admin in admins:
        if isinstance(admin, int) and admin == identity.uid:
            return True
        if isinstance(admin, str) and identity.user and admin == identity.user:
            return True
    return False


def _parse_header(header: str | None) -> str:
    if header is None or not header.strip():
        raise AuthError(AuthCode.MISSING, f"no {HEADER} header: requests must carry a MUNGE "
                        "credential (is munged running on this node?)")  # fmt: skip
    scheme, _, cred = header.strip().partition(" ")
    if scheme.upper() != SCHEME:
        raise AuthError(
            AuthCode.MALFORMED, f"{HEADER} header must be '{SCHEME} <credential>', got "
            f"scheme {scheme[:20]!r}"
        )  # fmt: skip
    cred = cred.strip()
    if len(cred) > MAX_CREDENTIAL_CHARS:
        raise AuthError(AuthCode.MALFORMED, f"credential longer than {MAX_CREDENTIAL_CHARS}")
    if not _CRED.match(cred):
        raise AuthError(AuthCode.MALFORMED, "not a MUNGE credential ('MUNGE:<base64>:')")
    return cred


def _check_payload(payload: bytes, method: str, path: str, body: bytes) -> int:
    """The payload's timestamp, if the payload describes this very request."""
    try:
        version, p_method, p_path, p_digest, p_ts = payload.decode("ascii").split("\n")
        ts = int(p_ts)
    except ValueError:
        raise AuthError(
            AuthCode.MISMATCH, "credential does not carry a slurmrl request binding"
        ) from None
    if version != VERSION:
        raise AuthError(AuthCode.MISMATCH, f"request binding {version!r}, expected {VERSION!r}")
    method = method.upper()  # the server's own view of the request: compared, not checked
    if p_method != method or p_path != path:
        raise AuthError(
            AuthCode.MISMATCH,
            f"credential was made for {p_method} {p_path[:200]}, not {method} {path[:200]}",
        )
    if p_digest != hashlib.sha256(body).hexdigest():
        raise AuthError(AuthCode.MISMATCH, "credential was made for another request body")
    return ts


def _check_target(method: str, path: str) -> tuple[str, str]:
    method = method.upper()
    if not _METHOD.match(method):
        raise ValueError(f"not an HTTP method: {method!r}")
    if not path.startswith("/") or any(ord(c) <= 0x20 or ord(c) == 0x7F for c in path):
        raise ValueError(f"not a request path (absolute, no spaces or control chars): {path!r}")
    return method, path
