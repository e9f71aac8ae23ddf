"""`job.service(role)` answers at once where no such service will come up: a role no
service has, a job that has ended, a job whose services are all up and none is it.

The controller is a stand-in on loopback (tests/unit/client/_controller_standin.py)
answering `GET /v1/jobs/{id}` with the JobView a test gives it.
"""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from _controller_standin import StandIn

from slurmrl.client.job import Job
from slurmrl.client.rpc import ControllerError

STATUS = ("GET", "/v1/jobs/N")
SERVICES = [{"role": "rollout", "backend": "tiny", "address": "127.0.0.1:1", "gpus": [0, 1]},
            {"role": "trainer", "backend": "tiny", "address": "127.0.0.1:2", "gpus": [0, 1]}]


def _answers(standin: StandIn, job: dict[str, Any]) -> None:
    standin.routes[STATUS] = lambda call: (200, {"job": {"job_id": 42, **job}})


def test_a_role_no_service_has_is_refused_naming_the_roles(
        standin: StandIn, job: Job) -> None:
    with pytest.raises(ValueError, match="no service role 'train': a job's services are "
                                         "rollout and trainer"):
        job.service("train", timeout_s=5)
    assert not standin.seen(*STATUS)


@pytest.mark.parametrize(("state", "reason"), [
    ("F", "admission refused: 8 GPUs asked, the partition has 4"),
    ("CA", "pool 1 failed to start: rollout service exited (CUDA out of memory)"),
], ids=["admission-refused", "pool-failed"])
def test_a_job_that_ended_says_why_at_once(standin: StandIn, job: Job, state: str,
                                          reason: str) -> None:
    _answers(standin, {"state": state, "reason": reason, "pool_id": None, "services": []})
    started = time.monotonic()
    with pytest.raises(ControllerError, match=f"the job has ended \\({state}\\): "
                                              f"{reason[:20]}") as got:
        job.service("rollout", timeout_s=5)
    assert (got.value.status, got.value.code) == (409, "job-ended")
    assert time.monotonic() - started < 3.0


def test_a_job_the_controller_ended_under_the_driver_says_why_at_once(
        standin: StandIn, job: Job) -> None:
    # the heartbeat heard it (409 job-ended) before the job's view says so
    _answers(standin, {"state": "PD", "reason": "", "pool_id": None, "services": []})
    job._ended("RL job 42 has ended (F): pool 1 failed to start")
    with pytest.raises(ControllerError, match="pool 1 failed to start") as got:
        job.service("rollout", timeout_s=5)
    assert got.value.code == "job-ended"


@pytest.mark.parametrize(("services", "args", "said"), [
    (SERVICES, ("rollout", "vllm"), "no rollout service of backend 'vllm'; its services: "
                                    "rollout (tiny), trainer (tiny)"),
    (SERVICES[:1], ("trainer",), "no trainer service; its services: rollout (tiny)"),
], ids=["other-backend", "no-trainer"])
def test_a_placed_job_without_the_service_lists_those_it_has(
        standin: StandIn, job: Job, services: list[dict[str, Any]],
        args: tuple[str, ...], said: str) -> None:
    _answers(standin, {"state": "R", "pool_id": 1, "pool_gpus": [0, 1],
                       "services": services})
    with pytest.raises(ValueError, match=re.escape(said)):
        job.service(*args, timeout_s=5)


def test_a_service_not_up_yet_is_waited_for(standin: StandIn, job: Job) -> None:
    # placed, a service still starting (no address): the one asked for may come
    starting = [SERVICES[0], {**SERVICES[1], "address": ""}]
    _answers(standin, {"state": "R", "pool_id": 1, "pool_gpus": [0, 1],
                       "services": starting})
    with pytest.raises(TimeoutError, match=r"has no rollout service after 0\.6 s"):
        job.service("rollout", "vllm", timeout_s=0.6)
