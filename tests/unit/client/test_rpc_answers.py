"""The RPC client against answers the controller should not give, and outages.

The controller is a stand-in on loopback (tests/unit/client/_controller_standin.py)
sending exactly the bodies a test gives it: a proxy's page, a crashed handler's text,
JSON of the wrong shape, 5xx answers before the right one.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
from _controller_standin import Answer, Call, StandIn, error, lease, until

from slurmrl.client.job import Job
from slurmrl.client.rpc import ControllerError, RpcClient

STATUS = ("GET", "/v1/status")
ACQUIRE = ("POST", "/v1/jobs/N/leases")


@pytest.mark.parametrize(("status", "body", "shown"), [
    (400, b'{"error": "bad things"}', "bad things"),  # error not an object
    (200, b"<html>ok</html>", "<html>ok</html>"),  # a proxy's page
    (200, b"[1, 2]", "[1, 2]"),  # JSON, not an object
], ids=["error-a-string", "200-html", "200-list"])
def test_an_answer_of_the_wrong_shape_is_a_bad_answer(
        standin: StandIn, status: int, body: bytes, shown: str) -> None:
    standin.routes[STATUS] = lambda call: (status, body)
    with pytest.raises(ControllerError) as got:
        RpcClient(standin.url, retry_for_s=0.0).call("GET", "/v1/status")
    assert (got.value.status, got.value.code) == (status, "bad-answer")
    assert shown in got.value.message


def test_a_session_answer_without_the_session_is_a_bad_answer(standin: StandIn) -> None:
    standin.routes["POST", "/v1/sessions"] = lambda call: (200, {"sessions": {}})
    client = RpcClient(standin.url, retry_for_s=0.0, use_sessions=True, session_job_id=42)
    with pytest.raises(ControllerError, match="field 'session'") as got:
        client.call("GET", "/v1/status")
    assert got.value.code == "bad-answer"


def _fails_then(statuses: list[int], then: Answer) -> Callable[[Call], Answer]:
    left = list(statuses)

    def answer(call: Call) -> Answer:
        if left:
            return left.pop(0), b"Bad Gateway"
        return then
    return answer


@pytest.mark.parametrize("status", [500, 502, 504])
def test_5xx_answers_are_retried_for_calls_safe_to_repeat_only(
        standin: StandIn, status: int) -> None:
    client = RpcClient(standin.url, retry_for_s=5.0)
    standin.routes[STATUS] = _fails_then([status, status], (200, {"jobs": []}))
    _, ans = client.call("GET", "/v1/status")
    assert ans == {"jobs": []} and len(standin.seen(*STATUS)) == 3
    # the call may have run: an observation is not sent twice
    observe = ("POST", "/v1/jobs/N/observations")
    standin.routes[observe] = _fails_then([status], (200, {"observation_id": 1}))
    with pytest.raises(ControllerError) as got:
        client.call("POST", "/v1/jobs/42/observations", {})
    assert got.value.status == status and len(standin.seen(*observe)) == 1


def test_acquire_retries_a_502_from_a_proxy(standin: StandIn, job: Job) -> None:
    standin.routes[ACQUIRE] = _fails_then([502], (200, {"lease": lease()}))
    assert job.acquire("rollout").lease_id == 5
    assert len(standin.seen(*ACQUIRE)) == 2


def test_an_outage_is_one_warning_when_it_starts_and_one_when_it_ends(
        standin: StandIn, caplog: pytest.LogCaptureFixture) -> None:
    standin.routes[STATUS] = _fails_then([503] * 4, (200, {"jobs": []}))
    client = RpcClient(standin.url, retry_for_s=30.0)
    with caplog.at_level(logging.INFO, logger="slurmrl.client"):
        client.call("GET", "/v1/status")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned
    assert "retrying GET /v1/status for up to 30 s" in warned[0]
    assert "answers again (GET /v1/status)" in warned[1]


def test_failing_heartbeats_are_one_warning_when_they_start_and_one_when_they_end(
        standin: StandIn, job: Job, caplog: pytest.LogCaptureFixture) -> None:
    job.acquire("rollout")  # heartbeats every 0.05 s from now on
    beat = standin.routes["POST", "/v1/jobs/N/heartbeat"]
    failing = [True]
    standin.routes["POST", "/v1/jobs/N/heartbeat"] = lambda call: (
        error(503, "auth-unavailable", "munged unreachable") if failing[0] else beat(call))
    with caplog.at_level(logging.INFO, logger="slurmrl.client"):
        until(lambda: len(standin.seen("POST", "/v1/jobs/N/heartbeat")) >= 5)
        failing[0] = False
        until(lambda: any("get through again" in r.getMessage()
                              for r in caplog.records))
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 2, warned
    assert "heartbeats to the controller fail" in warned[0] and "munged" in warned[0]



def test_a_call_stops_retrying_at_the_callers_deadline_without_losing_the_controller(
        standin: StandIn) -> None:
    standin.routes[STATUS] = lambda call: error(503, "starting", "controller starting")
    client = RpcClient(standin.url, retry_for_s=30.0)
    started = time.monotonic()
    with pytest.raises(ControllerError, match="controller starting"):
        client.call("GET", "/v1/status", retry_until=started + 0.5)
    assert 0.5 <= time.monotonic() - started < 2.5
    # the caller gave up, not the client: the next calls still retry for retry_for_s
    assert not client.lost
