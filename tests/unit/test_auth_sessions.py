"""Session table: expiry, job death, replay, forgery, theft of an id, memory bound.

Pure Python with a hand-driven clock (no munged needed: opening a session takes the
Identity MUNGE vouched for; the controller tests cover that step on real MUNGE).
"""

from __future__ import annotations

import pytest

from slurmrl.auth import AuthCode, AuthError
from slurmrl.auth.sessions import SessionTable, sign
from slurmrl.model import Identity

ALICE = Identity(uid=1001, gid=1001, user="rlalice")
BOB = Identity(uid=1002, gid=1002, user="rlbob")


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def _verify(table: SessionTable, headers: dict[str, str], path: str = "/v1/jobs",
            body: bytes = b"", **kw: object) -> Identity:
    return table.verify(headers["Authorization"], headers, "POST", path, body, **kw)  # type: ignore[arg-type]


def _refused(code: AuthCode, table: SessionTable, headers: dict[str, str], **kw: object) -> None:
    with pytest.raises(AuthError) as exc:
        _verify(table, headers, **kw)  # type: ignore[arg-type]
    assert exc.value.code is code, exc.value


def test_signed_request_names_the_sessions_owner_and_replay_is_refused() -> None:
    clock = Clock()
    table = SessionTable(clock=clock)
    g = table.open(ALICE)
    h = sign(g.session_id, g.key, "POST", "/v1/jobs", b"{}", now=clock.t)
    assert _verify(table, h, body=b"{}") == ALICE
    _refused(AuthCode.REPLAYED, table, h, body=b"{}")


def test_forged_altered_and_stolen_requests_are_refused() -> None:
    clock = Clock()
    table = SessionTable(clock=clock)
    alice, bob = table.open(ALICE), table.open(BOB)
    # bob knows alice's session id but not her key: his own key does not open it
    stolen = sign(alice.session_id, bob.key, "POST", "/v1/jobs", now=clock.t)
    _refused(AuthCode.INVALID, table, stolen)
    # signed for another path, or another body
    h = sign(alice.session_id, alice.key, "POST", "/v1/pools", now=clock.t)
    _refused(AuthCode.INVALID, table, h)
    h = sign(alice.session_id, alice.key, "POST", "/v1/jobs", b'{"a": 1}', now=clock.t)
    _refused(AuthCode.INVALID, table, h, body=b'{"a": 2}')
    # query strings are bound too
    h = sign(alice.session_id, alice.key, "POST", "/v1/jobs?all=0", now=clock.t)
    _refused(AuthCode.INVALID, table, h, path="/v1/jobs?all=1")
    # signature headers missing, or an id that is not one
    _refused(AuthCode.MISSING, table, {"Authorization": f"SLURMRL-SESSION {alice.session_id}"})
    _refused(AuthCode.MALFORMED, table, {**h, "Authorization": "SLURMRL-SESSION ../etc"})
    _refused(AuthCode.NO_SESSION, table, {**h, "Authorization": "SLURMRL-SESSION " + "0" * 32})


def test_stale_or_future_timestamps_are_refused() -> None:
    clock = Clock()
    table = SessionTable(clock=clock, skew_s=30)
    g = table.open(ALICE)
    _refused(AuthCode.EXPIRED, table, sign(g.session_id, g.key, "POST", "/v1/jobs",
                                            now=clock.t - 120))
    _refused(AuthCode.REWOUND, table, sign(g.session_id, g.key, "POST", "/v1/jobs",
                                            now=clock.t + 120))


def test_sessions_expire_after_their_ttl() -> None:
    clock = Clock()
    table = SessionTable(clock=clock, ttl_s=60)
    g = table.open(ALICE)
    clock.t += 61
    _refused(AuthCode.NO_SESSION, table, sign(g.session_id, g.key, "POST", "/v1/jobs",
                                               now=clock.t))
    assert len(table) == 0


def test_a_job_bound_session_dies_with_its_job() -> None:
    clock = Clock()
    table = SessionTable(clock=clock)
    g = table.open(ALICE, job_id=42)
    alive = {42: True}
    h = sign(g.session_id, g.key, "POST", "/v1/jobs", now=clock.t)
    assert _verify(table, h, job_alive=alive.__getitem__) == ALICE
    alive[42] = False
    h = sign(g.session_id, g.key, "POST", "/v1/jobs", now=clock.t)
    _refused(AuthCode.NO_SESSION, table, h, job_alive=alive.__getitem__)
    other = table.open(ALICE, job_id=7)
    assert table.end_job(7) == 1
    _refused(AuthCode.NO_SESSION, table, sign(other.session_id, other.key, "POST", "/v1/jobs",
                                               now=clock.t))


def test_one_user_cannot_fill_memory_with_sessions() -> None:
    table = SessionTable(max_per_uid=3)
    first = table.open(ALICE)
    for _ in range(5):
        table.open(ALICE)
    bob = table.open(BOB)
    assert len(table) == 4  # alice's 3 newest and bob's
    with pytest.raises(AuthError) as exc:
        _verify(table, sign(first.session_id, first.key, "POST", "/v1/jobs"))
    assert exc.value.code is AuthCode.NO_SESSION
    assert _verify(table, sign(bob.session_id, bob.key, "POST", "/v1/jobs")) == BOB
