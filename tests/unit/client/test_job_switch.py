"""`Lease.switch` as a driver uses it: train -> sync without queueing, and the fallbacks.

    with job.phase("train") as lease:
        ...
        lease.switch("sync")
    with job.phase("sync"):
        ...

sends one acquire, one switch (with the train's timing up to the switch) and one
release (the sync's), never a release of the switched lease nor a second acquire. A
lease the controller will not switch (409 `cannot-switch`), a switch whose answer was
lost (a 504 after it landed), and a controller without switches (404) all fall back to
release + acquire, so the same driver code works. The controller is a stand-in on
loopback answering as docs/rpc.md says; the real controller's side is tested in
tests/unit/controller/test_server_switch.py and tests/integration/test_controller_switch.py.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from _controller_standin import Answer, Call, StandIn, error, lease

from slurmrl.client.job import Job

ACQUIRE = ("POST", "/v1/jobs/N/leases")
SWITCH = ("POST", "/v1/jobs/N/leases/N/switch")
RELEASE = ("POST", "/v1/jobs/N/leases/N/release")
GET = ("GET", "/v1/jobs/N/leases/N")


def _phase_lease(lease_id: int, phase: str, state: str = "held") -> dict[str, Any]:
    return {**lease(lease_id, state=state), "phase": phase}


def _grants(standin: StandIn, **by_phase: int) -> None:
    """Acquire answers the lease id given for its phase."""
    def grant(call: Call) -> Answer:
        phase = call.body["phase"]
        standin.held = [_phase_lease(by_phase[phase], phase)]
        return 200, {"lease": standin.held[0]}

    standin.routes[ACQUIRE] = grant


def _switches(standin: StandIn, to: int) -> None:
    """A switch answers lease `to`, and heartbeats then answer it held (as the controller
    does: the switched lease ended)."""
    def switch(call: Call) -> Answer:
        standin.held = [_phase_lease(to, call.body["phase"])]
        return 200, {"lease": standin.held[0]}

    standin.routes[SWITCH] = switch


def _paths(standin: StandIn) -> list[str]:
    return [f"{c.method} {c.path}" for c in standin.calls
            if "/heartbeat" not in c.path and "/sessions" not in c.path
            and c.path != "/v1/jobs"]


def test_the_switch_pattern_holds_one_lease_per_phase_and_releases_once(
        standin: StandIn, job: Job) -> None:
    _grants(standin, train=5)
    _switches(standin, 6)
    with job.phase("train") as train:
        time.sleep(0.2)
        sync = train.switch("sync")
        assert job.current is sync and not train.held and sync.held
        time.sleep(0.5)  # after the switch: not the train's busy time
    assert job.current is sync  # leaving the train block kept the sync lease
    with job.phase("sync") as adopted:
        assert adopted is sync
    assert job.current is None and not sync.held
    assert _paths(standin) == ["POST /v1/jobs/42/leases", "POST /v1/jobs/42/leases/5/switch",
                               "POST /v1/jobs/42/leases/6/release"]
    (switch,) = standin.seen(*SWITCH)
    assert switch.body["phase"] == "sync"
    assert 0.2 <= switch.body["timing"]["busy_s"] < 0.5


def test_only_the_switched_lease_of_its_phase_is_taken_up(standin: StandIn, job: Job) -> None:
    _grants(standin, train=5)
    _switches(standin, 6)
    with job.phase("train") as train:
        with pytest.raises(RuntimeError, match=r"already holding lease 5 \(train\)"):
            job.acquire("train")  # a held lease no switch made is not taken up
        train.switch("sync")
    with pytest.raises(RuntimeError, match=r"already holding lease 6 \(sync\)"):
        job.acquire("rollout")  # the switched lease is the sync's only
    with job.phase("sync"), pytest.raises(RuntimeError, match="already holding lease 6"):
        job.acquire("sync")  # taken up once


@pytest.mark.parametrize("refusal", [
    error(409, "cannot-switch", "lease 5 was granted by a switch: a lease switches once"),
    error(409, "cannot-switch", "lease 5 holds part of the pool ([1] of [0, 1]), and a "
          "member waiting for those GPUs has waited a larger share of its time than job "
          "42: it goes first; release the lease and acquire sync"),
    error(404, "http", "Not Found: POST /v1/jobs/42/leases/5/switch"),  # an older controller
], ids=["switched-already", "member-behind-waiting", "no-switch-route"])
def test_a_lease_that_cannot_switch_is_released_and_the_phase_acquired(
        standin: StandIn, job: Job, refusal: Answer) -> None:
    _grants(standin, train=5, sync=7)
    standin.routes[SWITCH] = lambda call: refusal
    standin.routes[GET] = lambda call: (200, {"lease": _phase_lease(5, "train")})
    with job.phase("train") as train:
        sync = train.switch("sync", {"busy_s": 2.0})
    assert sync.lease_id == 7 and job.current is sync
    with job.phase("sync") as adopted:
        assert adopted is sync
    (release, _) = standin.seen(*RELEASE)
    assert (release.path, release.body) == ("/v1/jobs/42/leases/5/release",
                                            {"timing": {"busy_s": 2.0}})
    assert [c.body["phase"] for c in standin.seen(*ACQUIRE)] == ["train", "sync"]


def test_a_switch_whose_answer_was_lost_ends_on_the_lease_it_became(
        standin: StandIn, job: Job) -> None:
    _grants(standin, train=5)
    switched: list[int] = []

    def switch(call: Call) -> Answer:
        if not switched:  # it landed, but a proxy timed out before the answer came back
            switched.append(6)
            return error(504, "http", "Gateway Timeout")
        return error(409, "cannot-switch", "lease 5 is not held by job 42")

    def acquire(call: Call) -> Answer:  # the controller answers the lease it became
        phase = call.body["phase"]
        return 200, {"lease": _phase_lease(6 if switched and phase == "sync" else 5, phase)}

    standin.routes[SWITCH] = switch
    standin.routes[ACQUIRE] = acquire
    standin.routes[GET] = lambda call: (200, {"lease": _phase_lease(5, "train", "released")})
    standin.routes[RELEASE] = lambda call: error(409, "lease-conflict",
                                                 "lease 5 is not held by job 42")
    with job.phase("train") as train:
        sync = train.switch("sync")
    assert (sync.lease_id, sync.phase, job.current) == (6, "sync", sync)
    assert len(standin.seen(*SWITCH)) == 2 and not train.held


def test_a_block_that_fails_after_its_switch_releases_the_lease_the_switch_made(
        standin: StandIn, job: Job) -> None:
    # the driver's code fails after `lease.switch("sync")`, and it retries the step: the
    # sync lease, never taken up by a phase, is released (held, it kept the GPUs from
    # the partner and the next phase was refused: "already holding lease 6")
    _grants(standin, train=5, rollout=7)
    _switches(standin, 6)
    with pytest.raises(ValueError, match="after the switch"), job.phase("train") as train:
        train.switch("sync")
        raise ValueError("the driver's code fails after the switch")
    assert job.current is None
    releases = [c.path for c in standin.calls if c.path.endswith("/release")]
    assert releases == ["/v1/jobs/42/leases/6/release"]
    with job.phase("rollout") as rollout:  # the retried step
        assert rollout.lease_id == 7
