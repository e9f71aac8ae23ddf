"""Data-plane signing: a service accepts its driver's calls once, and nothing else."""

from __future__ import annotations

import pytest

from slurmrl.auth import AuthCode, AuthError
from slurmrl.auth.tokens import (
    NONCE,
    SERVICE,
    SIGNATURE,
    TIMESTAMP,
    Verifier,
    mint_secret,
    sign,
)

NOW = 1_800_000_000.0


class Clock:
    def __init__(self, t: float = NOW) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def refused(verifier: Verifier, headers: dict[str, str], *call: object) -> AuthCode:
    with pytest.raises(AuthError) as info:
        verifier.verify(headers, *call)  # type: ignore[arg-type]
    return info.value.code


@pytest.fixture
def secret() -> str:
    return mint_secret()


@pytest.fixture
def verifier(secret: str) -> Verifier:
    return Verifier(secret, skew_s=30, clock=Clock())


def test_signed_call_is_accepted(secret: str, verifier: Verifier) -> None:
    body = b'{"prompts": ["1+1="]}'
    headers = sign(secret, "POST", "/v1/generate", body, now=NOW)
    verifier.verify(headers, "POST", "/v1/generate", body)


def test_header_names_are_case_insensitive(secret: str, verifier: Verifier) -> None:
    headers = {k.lower(): v for k, v in sign(secret, "get", "/v1/state", now=NOW).items()}
    verifier.verify(headers, "GET", "/v1/state", b"")


def test_secrets_are_fresh_and_long() -> None:
    a, b = mint_secret(), mint_secret()
    assert a != b
    assert len(a) >= 40


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/v1/generate", b"x"),  # another method
        ("POST", "/v1/train_step", b"x"),  # another path
        ("POST", "/v1/generate?n=2", b"x"),  # another query
        ("POST", "/v1/generate", b"y"),  # another body
        ("POST", "/v1/generate", b""),
    ],
)
def test_tampered_call_is_refused(
    secret: str, verifier: Verifier, method: str, path: str, body: bytes
) -> None:
    headers = sign(secret, "POST", "/v1/generate", b"x", now=NOW)
    assert refused(verifier, headers, method, path, body) is AuthCode.INVALID


def test_tampered_headers_are_refused(secret: str, verifier: Verifier) -> None:
    headers = sign(secret, "POST", "/v1/generate", b"x", now=NOW)
    later = {**headers, TIMESTAMP: str(int(NOW) + 1)}
    assert refused(verifier, later, "POST", "/v1/generate", b"x") is AuthCode.INVALID
    other_nonce = {**headers, NONCE: "0" * 32}
    assert refused(verifier, other_nonce, "POST", "/v1/generate", b"x") is AuthCode.INVALID


def test_wrong_secret_is_refused(verifier: Verifier) -> None:
    headers = sign(mint_secret(), "POST", "/v1/generate", b"x", now=NOW)
    assert refused(verifier, headers, "POST", "/v1/generate", b"x") is AuthCode.INVALID


def test_replay_is_refused(secret: str, verifier: Verifier) -> None:
    headers = sign(secret, "POST", "/v1/generate", b"x", now=NOW)
    verifier.verify(headers, "POST", "/v1/generate", b"x")
    assert refused(verifier, headers, "POST", "/v1/generate", b"x") is AuthCode.REPLAYED
    # the same request signed again (new nonce) is a new call
    verifier.verify(sign(secret, "POST", "/v1/generate", b"x", now=NOW), "POST",
                    "/v1/generate", b"x")  # fmt: skip


def test_skew_window(secret: str) -> None:
    clock = Clock()
    verifier = Verifier(secret, skew_s=30, clock=clock)
    old = sign(secret, "GET", "/v1/state", now=NOW - 31)
    assert refused(verifier, old, "GET", "/v1/state", b"") is AuthCode.EXPIRED
    future = sign(secret, "GET", "/v1/state", now=NOW + 31)
    assert refused(verifier, future, "GET", "/v1/state", b"") is AuthCode.REWOUND
    verifier.verify(sign(secret, "GET", "/v1/state", now=NOW - 29), "GET", "/v1/state", b"")
    verifier.verify(sign(secret, "GET", "/v1/state", now=NOW + 29), "GET", "/v1/state", b"")


def test_replay_after_window_is_refused_as_expired(secret: str) -> None:
    clock = Clock()
    verifier = Verifier(secret, skew_s=30, clock=clock)
    headers = sign(secret, "GET", "/v1/state", now=NOW)
    verifier.verify(headers, "GET", "/v1/state", b"")
    clock.t = NOW + 60  # the nonce is forgotten, but the timestamp is now too old
    assert refused(verifier, headers, "GET", "/v1/state", b"") is AuthCode.EXPIRED


def test_nonce_cache_is_bounded_and_never_accepts_twice(secret: str) -> None:
    clock = Clock()
    verifier = Verifier(secret, skew_s=30, max_nonces=4, clock=clock)
    calls = [sign(secret, "GET", "/v1/state", now=NOW - 10 + i) for i in range(10)]
    for headers in calls:
        verifier.verify(headers, "GET", "/v1/state", b"")
    assert len(verifier._seen) <= 4
    for headers in calls:  # forgotten or remembered, none is accepted a second time
        code = refused(verifier, headers, "GET", "/v1/state", b"")
        assert code in (AuthCode.REPLAYED, AuthCode.EXPIRED)
    # fresh calls still go through
    verifier.verify(sign(secret, "GET", "/v1/state", now=NOW), "GET", "/v1/state", b"")


def test_missing_and_malformed_headers(secret: str, verifier: Verifier) -> None:
    assert refused(verifier, {}, "GET", "/v1/state", b"") is AuthCode.MISSING
    good = sign(secret, "GET", "/v1/state", now=NOW)
    partial = {SIGNATURE: good[SIGNATURE]}
    with pytest.raises(AuthError, match="lacks X-Slurmrl-Timestamp, X-Slurmrl-Nonce") as info:
        verifier.verify(partial, "GET", "/v1/state", b"")
    assert info.value.code is AuthCode.MALFORMED
    for header, value in [
        (TIMESTAMP, "yesterday"),
        (TIMESTAMP, "-5"),
        (NONCE, "short"),
        (NONCE, "Z" * 32),
        (SIGNATURE, "abc"),
        (SIGNATURE, "g" * 64),
    ]:
        bad = {**good, header: value}
        assert refused(verifier, bad, "GET", "/v1/state", b"") is AuthCode.MALFORMED, header


@pytest.mark.parametrize("stamp", ["\u00b2", "1800000000\u00b2", "\u0661\u0668\u0660"])
def test_a_timestamp_of_non_ascii_digits_is_malformed_not_a_crash(
    secret: str, verifier: Verifier, stamp: str,
) -> None:
    # "²".isdigit() is True but int("²") raises: that was a 500 on the controller's
    # session-signed calls and on every service's data plane
    bad = {**sign(secret, "GET", "/v1/state", now=NOW), TIMESTAMP: stamp}
    assert refused(verifier, bad, "GET", "/v1/state", b"") is AuthCode.MALFORMED


def test_short_secret_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        Verifier("hunter2")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        sign(b"", "GET", "/")


# --- a service's calls: each made out to one service ---------------------------------

ROLLOUT0, ROLLOUT1 = "node1:40001", "node2:40001"  #: two services of one job


def test_a_call_opens_only_the_service_it_is_made_out_to(secret: str,
                                                         verifier: Verifier) -> None:
    headers = sign(secret, "POST", "/v1/generate", b"x", service=ROLLOUT0, now=NOW)
    with pytest.raises(AuthError, match=f"made out to service {ROLLOUT0}, not to this one "
                       f"\\({ROLLOUT1}\\)") as info:
        verifier.verify(headers, "POST", "/v1/generate", b"x", ROLLOUT1)
    assert info.value.code is AuthCode.MISMATCH
    verifier.verify(headers, "POST", "/v1/generate", b"x", ROLLOUT0)  # not spent above
    assert refused(verifier, headers, "POST", "/v1/generate", b"x",
                   ROLLOUT0) is AuthCode.REPLAYED


def test_a_call_opens_only_the_launch_it_is_made_out_to(secret: str) -> None:
    # a service relaunched on the same host:port is another launch: a fresh process,
    # whose verifier has seen none of the earlier one's nonces
    earlier, later = "node1:40001/0123456789abcdef", "node1:40001/fedcba9876543210"
    headers = sign(secret, "POST", "/v1/generate", b"x", service=earlier, now=NOW)
    with pytest.raises(AuthError, match="another launch of the service at this address") \
            as info:
        Verifier(secret, clock=Clock()).verify(headers, "POST", "/v1/generate", b"x", later)
    assert info.value.code is AuthCode.MISMATCH


def test_the_service_a_call_names_is_signed(secret: str, verifier: Verifier) -> None:
    headers = sign(secret, "POST", "/v1/generate", b"x", service=ROLLOUT0, now=NOW)
    renamed = {**headers, SERVICE: ROLLOUT1}
    assert refused(verifier, renamed, "POST", "/v1/generate", b"x",
                   ROLLOUT1) is AuthCode.INVALID


def test_a_service_refuses_a_call_that_names_no_service(secret: str,
                                                        verifier: Verifier) -> None:
    # as a session's call is signed, or an older driver's: naming no service
    headers = sign(secret, "POST", "/v1/generate", b"x", now=NOW)
    with pytest.raises(AuthError, match=f"lacks {SERVICE}") as info:
        verifier.verify_head(headers, "POST", "/v1/generate", ROLLOUT0)
    assert info.value.code is AuthCode.MALFORMED
    # and a session's verifier (no service) does not take a service's call
    to_service = sign(secret, "POST", "/v1/generate", b"x", service=ROLLOUT0, now=NOW)
    assert refused(verifier, to_service, "POST", "/v1/generate", b"x") is AuthCode.INVALID
    malformed = {**to_service, SERVICE: "node1 :1"}
    assert refused(verifier, malformed, "POST", "/v1/generate", b"x",
                   ROLLOUT0) is AuthCode.MALFORMED


@pytest.mark.parametrize("service", ["", "node1:1\n", "node 1:1", "n\u00e9:1"])
def test_a_service_address_must_be_printable_ascii(secret: str, service: str) -> None:
    with pytest.raises(ValueError, match="not a service address"):
        sign(secret, "GET", "/v1/status", service=service)
