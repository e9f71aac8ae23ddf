"""MUNGE against the real munged: who made a credential, and what is refused.

Needs munged running with the site key (`slurmrl dev-cluster up` starts it) and, for the
other-user cases, the installed copy of slurmrl (`make install`) runnable by `nobody`.
"""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmrl.auth import AuthCode, AuthError, munge
from slurmrl.auth.requests import sign_request, verify_request

pytestmark = pytest.mark.integration

NOBODY = pwd.getpwnam("nobody")
# The venv the tests run in is the site install that other users execute (see Makefile).
VENV_PYTHON = Path(sys.prefix) / "bin" / "python"


@pytest.fixture(scope="module", autouse=True)
def munged_running(dev_cluster: object) -> None:
    # the dev cluster (tests/integration/conftest.py) starts munged, or reuses a live one
    try:
        munge.decode(munge.encode(b"ping"))
    except munge.MungeError as exc:
        pytest.fail(f"munged is not usable ({exc}); start it with `slurmrl dev-cluster up`")


def as_nobody(code: str) -> str:
    """Run Python `code` as user nobody with the installed slurmrl; its stdout."""
    out = subprocess.run(
        ["runuser", "-u", "nobody", "--", str(VENV_PYTHON), "-c", code],
        cwd="/",  # not the checkout: the installed copy, as services and drivers use
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, f"as nobody: {out.stderr}"
    return out.stdout.strip()


def refused(header: str, method: str, path: str, body: bytes, **kw: object) -> AuthError:
    with pytest.raises(AuthError) as info:
        verify_request(header, method, path, body, **kw)  # type: ignore[arg-type]
    return info.value


# -- libmunge through ctypes ------------------------------------------------------------


def test_round_trip_returns_our_uid_and_payload() -> None:
    cred = munge.encode(b"payload \x00 with nul", ttl_s=30)
    decoded = munge.decode(cred)
    assert (decoded.uid, decoded.gid) == (os.getuid(), os.getgid())
    assert decoded.payload == b"payload \x00 with nul"
    assert decoded.ttl_s == 30
    assert abs(decoded.encoded_at - time.time()) < 5


def test_credential_from_another_user_decodes_to_that_uid() -> None:
    cred = as_nobody("from slurmrl.auth import munge; print(munge.encode(b'hi'))")
    decoded = munge.decode(cred)
    assert decoded.uid == NOBODY.pw_uid == 65534
    assert decoded.payload == b"hi"


def test_second_decode_is_a_replay() -> None:
    cred = munge.encode(b"once")
    munge.decode(cred)
    with pytest.raises(munge.MungeError) as info:
        munge.decode(cred)
    assert info.value.code is munge.MungeCode.CRED_REPLAYED
    assert info.value.uid == os.getuid()


@pytest.mark.parametrize("garbage", ["garbage", "MUNGE:AAAA:", "MUNGE:" + "x" * 200 + ":", ""])
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(munge.MungeError) as info:
        munge.decode(garbage)
    assert info.value.code in (
        munge.MungeCode.BAD_ARG,  # the empty string
        munge.MungeCode.BAD_CRED,
        munge.MungeCode.BAD_VERSION,
        munge.MungeCode.CRED_INVALID,
    )


def test_tampered_credential_is_invalid() -> None:
    cred = munge.encode(b"amount=1")
    mid = len(cred) // 2
    forged = cred[:mid] + ("A" if cred[mid] != "A" else "B") + cred[mid + 1 :]
    with pytest.raises(munge.MungeError) as info:
        munge.decode(forged)
    assert info.value.code in (munge.MungeCode.CRED_INVALID, munge.MungeCode.BAD_CRED)


def test_expired_credential_is_refused() -> None:
    cred = munge.encode(b"soon stale", ttl_s=1)
    time.sleep(2)
    with pytest.raises(munge.MungeError) as info:
        munge.decode(cred)
    assert info.value.code is munge.MungeCode.CRED_EXPIRED


def test_missing_socket_names_the_path() -> None:
    with pytest.raises(munge.MungeError) as info:
        munge.encode(b"", socket="/nonexistent/munge.socket")
    assert info.value.code is munge.MungeCode.SOCKET
    assert "/nonexistent/munge.socket" in info.value.text


def test_uid_restricted_credential_only_decodes_for_that_uid() -> None:
    cred = munge.encode(b"for nobody", uid_restriction=NOBODY.pw_uid)
    with pytest.raises(munge.MungeError) as info:
        munge.decode(cred)
    assert info.value.code is munge.MungeCode.CRED_UNAUTHORIZED


# -- signed RPC requests ----------------------------------------------------------------


def test_signed_request_identifies_the_caller() -> None:
    header = sign_request("POST", "/v1/jobs/42/leases", b'{"phase":"rollout"}')
    who = verify_request(header, "POST", "/v1/jobs/42/leases", b'{"phase":"rollout"}')
    assert (who.uid, who.user) == (0, "root")


def test_signed_request_from_another_user() -> None:
    header = as_nobody(
        "from slurmrl.auth.requests import sign_request;"
        "print(sign_request('GET', '/v1/status?me=1', b''))"
    )
    who = verify_request(header, "GET", "/v1/status?me=1", b"")
    assert (who.uid, who.user) == (65534, "nobody")


def test_replayed_request_is_refused() -> None:
    header = sign_request("POST", "/v1/leases/7/release", b"{}")
    verify_request(header, "POST", "/v1/leases/7/release", b"{}")
    err = refused(header, "POST", "/v1/leases/7/release", b"{}")
    assert err.code is AuthCode.REPLAYED


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("DELETE", "/v1/jobs/42", b"{}"),  # another method
        ("POST", "/v1/jobs/43", b"{}"),  # another job
        ("POST", "/v1/jobs/42?force=1", b"{}"),  # another query
        ("POST", "/v1/jobs/42", b'{"all": true}'),  # another body
    ],
)
def test_credential_for_another_request_is_refused(method: str, path: str, body: bytes) -> None:
    header = sign_request("POST", "/v1/jobs/42", b"{}")
    err = refused(header, method, path, body)
    assert err.code is AuthCode.MISMATCH
    assert "made for" in err.message


def test_plain_munge_credential_is_not_a_request_binding() -> None:
    err = refused(f"MUNGE {munge.encode(b'')}", "GET", "/v1/status", b"")
    assert err.code is AuthCode.MISMATCH


def test_forged_request_credential_is_refused() -> None:
    header = sign_request("GET", "/v1/status", b"")
    mid = len(header) // 2
    forged = header[:mid] + ("A" if header[mid] != "A" else "B") + header[mid + 1 :]
    err = refused(forged, "GET", "/v1/status", b"")
    assert err.code in (AuthCode.INVALID, AuthCode.MALFORMED)


def test_garbage_request_credential_is_refused() -> None:
    err = refused("MUNGE MUNGE:AAAA:", "GET", "/v1/status", b"")
    assert err.code is AuthCode.INVALID


def test_expired_request_is_refused() -> None:
    header = sign_request("GET", "/v1/status", b"", ttl_s=1)
    time.sleep(2)
    err = refused(header, "GET", "/v1/status", b"")
    assert err.code is AuthCode.EXPIRED


def test_controller_caps_credential_age_whatever_the_ttl() -> None:
    header = sign_request("GET", "/v1/status", b"", ttl_s=3600)
    time.sleep(2)
    err = refused(header, "GET", "/v1/status", b"", max_age_s=1)
    assert err.code is AuthCode.EXPIRED
    assert "at most 1 s" in err.message


def test_munged_unreachable_is_not_blamed_on_the_caller() -> None:
    with pytest.raises(AuthError) as info:
        sign_request("GET", "/v1/status", b"", socket="/nonexistent/munge.socket")
    assert info.value.code is AuthCode.UNAVAILABLE
    header = sign_request("GET", "/v1/status", b"")
    err = refused(header, "GET", "/v1/status", b"", socket="/nonexistent/munge.socket")
    assert err.code is AuthCode.UNAVAILABLE
