"""RPC request signing, the parts that need no munged: header form, binding, admins."""

from __future__ import annotations

import hashlib

import pytest

from slurmrl.auth import AuthCode, AuthError
from slurmrl.auth.requests import is_admin, request_payload, user_name, verify_request
from slurmrl.model import Identity


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (None, AuthCode.MISSING),
        ("", AuthCode.MISSING),
        ("   ", AuthCode.MISSING),
        ("Bearer abc", AuthCode.MALFORMED),
        ("MUNGE", AuthCode.MALFORMED),
        ("MUNGE not-a-credential", AuthCode.MALFORMED),
        ("MUNGE MUNGE:abc def:", AuthCode.MALFORMED),
        ("MUNGE MUNGE:" + "A" * 20000 + ":", AuthCode.MALFORMED),
    ],
)
def test_header_form_is_checked_before_munged(header: str | None, code: AuthCode) -> None:
    # a socket that does not exist proves munged is never asked
    with pytest.raises(AuthError) as info:
        verify_request(header, "GET", "/v1/status", b"", socket="/nonexistent/munge.sock")
    assert info.value.code is code
    assert info.value.message


def test_payload_binds_method_path_body_and_time() -> None:
    payload = request_payload("post", "/v1/leases?job=7", b'{"phase":"rollout"}', 1234)
    digest = hashlib.sha256(b'{"phase":"rollout"}').hexdigest()
    assert payload == f"slurmrl-rpc/1\nPOST\n/v1/leases?job=7\n{digest}\n1234".encode()


@pytest.mark.parametrize(
    ("method", "path"), [("GET", "v1/status"), ("GET", "/a b"), ("GET", "/a\nb"), ("G T", "/")]
)
def test_payload_refuses_odd_targets(method: str, path: str) -> None:
    with pytest.raises(ValueError):
        request_payload(method, path, b"", 0)


def test_admins_by_name_or_uid() -> None:
    alice = Identity(uid=1001, gid=1001, user="alice")
    assert is_admin(Identity(uid=0, gid=0, user="root"), [])
    assert is_admin(alice, ["alice"])
    assert is_admin(alice, [1001])
    assert not is_admin(alice, ["bob", 1002])
    # a uid with no passwd entry is not matched by an empty name
    assert not is_admin(Identity(uid=4242, gid=4242, user=""), [""])


def test_user_name_from_passwd() -> None:
    assert user_name(0) == "root"
    assert user_name(2**31 - 7) == ""
