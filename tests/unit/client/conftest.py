"""Fixtures: a stand-in controller on loopback per test (see _controller_standin), and
the driver's `Job` registered with it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _controller_standin import JOB_ID, StandIn

from slurmrl.client import rpc
from slurmrl.client.job import Job


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[StandIn]:
    # no munged here: the stand-in checks no credential
    monkeypatch.setattr(rpc, "sign_request", lambda *args, **kwargs: "MUNGE stub")
    s = StandIn()
    yield s
    s.stop()


@pytest.fixture
def job(standin: StandIn) -> Iterator[Job]:
    j = Job(JOB_ID, standin.url, {"SLURMRL_GPUS": "2"}, retry_for_s=5.0)
    yield j
    j._stop.set()  # the tests close it themselves where closing is what they test
    j._beat_now.set()
    j._hb.join(timeout=5.0)
