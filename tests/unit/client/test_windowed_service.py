"""`job.service(role)` of a floating pool's member: a copy on every window; each call
goes to the copy on the GPUs the job's lease holds, and the copies are asked for again
with each new lease (the pool may have taken a window, or given one back and taken
another, since). A stand-in job object: no controller, no service is called."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from slurmrl.client.job import NoLease
from slurmrl.client.services import LeasedService, WindowedService


@dataclass
class StandInLease:
    lease_id: int
    pool_gpus: tuple[int, ...]


@dataclass
class StandInJob:
    services: list[dict[str, Any]]
    job_id: int = 7
    secret: str = "s" * 64
    current: StandInLease | None = None
    ended_reason: str | None = None
    asked: int = 0  #: status() calls
    pool_gpus: list[int] = field(default_factory=lambda: [0, 1])

    def status(self) -> dict[str, Any]:
        self.asked += 1
        return {"pool_id": 1, "floating": True, "pool_gpus": self.pool_gpus,
                "services": self.services}


def at(port: int) -> str:
    """The address a copy on `port` announces: `host:port/launch`."""
    return f"n1:{port}/{port:016x}"


def copy(gpus: list[int], port: int, role: str = "trainer") -> dict[str, Any]:
    return {"role": role, "backend": "tiny", "gpus": gpus, "address": at(port)}


def test_each_call_goes_to_the_copy_on_the_leases_window() -> None:
    job = StandInJob([copy([0, 1], 5001), copy([2, 3], 5002), copy([0, 1], 6001, "rollout")])
    svc = LeasedService.find(job, "trainer", None, 1.0)  # type: ignore[arg-type]
    assert isinstance(svc, WindowedService)
    with pytest.raises(NoLease, match="held lease"):
        _ = svc.address
    job.current = StandInLease(1, (2, 3))
    assert svc.address == at(5002)
    job.current = StandInLease(2, (0, 1))
    assert svc.address == at(5001)


def test_a_window_taken_since_is_found_and_one_given_back_and_taken_again_is_renewed(
) -> None:
    job = StandInJob([copy([0, 1], 5001)])  # placed while the pool had one window
    svc = LeasedService.find(job, "trainer", None, 1.0)  # type: ignore[arg-type]
    job.services = [copy([0, 1], 5001), copy([2, 3], 5002)]  # the pool grew
    job.current = StandInLease(1, (2, 3))
    assert svc.address == at(5002)
    asked = job.asked
    assert svc.address == at(5002) and job.asked == asked  # once per lease
    # window 1 given back, then taken again: a new copy there, at a new address
    job.services = [copy([0, 1], 5001), copy([2, 3], 5003)]
    job.current = StandInLease(2, (2, 3))
    assert svc.address == at(5003)


def test_a_lease_on_gpus_without_a_copy_says_so() -> None:
    job = StandInJob([copy([0, 1], 5001)])
    svc = LeasedService.find(job, "trainer", None, 1.0)  # type: ignore[arg-type]
    job.current = StandInLease(1, (4, 5))
    with pytest.raises(NoLease, match=r"no trainer service on the GPUs its lease holds "
                                      r"\(\[4, 5\]\)"):
        _ = svc.address
