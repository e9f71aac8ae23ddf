"""The one exception authentication raises, with a short machine-readable code.

The controller and services map an `AuthError` to HTTP 401 with `code` in the JSON body,
so a client (and a test) can tell a replay from an expiry without parsing prose.
"""

from __future__ import annotations

from enum import StrEnum


class AuthCode(StrEnum):
    """Why a request was refused."""

    MISSING = "missing"  #: no credential / signature headers at all
    MALFORMED = "malformed"  #: the header is not of the expected form
    INVALID = "invalid"  #: forged, corrupted, or made with another key
    EXPIRED = "expired"  #: older than its time-to-live (MUNGE) or the skew window
    REWOUND = "rewound"  #: made in the future (clock skew between nodes)
    REPLAYED = "replayed"  #: already used once
    MISMATCH = "mismatch"  #: valid, but made for another request (method, path or body)
    NO_SESSION = "no-session"  #: session unknown, expired or its job ended: open a new one
    UNAVAILABLE = "unavailable"  #: munged unreachable or libmunge missing: not the caller's fault


class AuthError(Exception):
    """A request that must be refused: `code` for machines, `message` for people."""

    def __init__(self, code: AuthCode, message: str) -> None:
        self.code, self.message = code, message
        super().__init__(f"{code}: {message}")
