"""A drop is counted as freeing host memory only where the service's backend frees it:
a rollout the plan itself parks (a level-2 park from active frees it in every backend),
or an already parked one of a backend that frees its host copy on a level-2 park from
parked (`DROPS_PARKED_BACKENDS`: `tiny`; not `vllm`, whose sleeping engine keeps it,
tests/unit/worker/test_worker_park_levels.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmrl.controller.residency import (
    Footprint,
    GpuCapacity,
    ResidencyError,
    admit,
    footprints_for_job,
    plan_grant,
)
from slurmrl.gpu.estimate import GiB
from slurmrl.model import Phase, Residency, RlRequest

CAP = [GpuCapacity(0, 79 * GiB)]


def _pool(drops_parked: bool) -> list[Footprint]:
    # the reviewer's case: job 1's rollout parked (16 GiB on the host), its trainer
    # active (50 GiB when parked); job 2's parked rollout is granted the GPU
    return [
        Footprint(1, "rollout", frozenset({0}), 60 * GiB, GiB, 16 * GiB,
                  residency=Residency.PARKED, drops_parked=drops_parked),
        Footprint(1, "trainer", frozenset({0}), 70 * GiB, GiB, 50 * GiB),
        Footprint(2, "rollout", frozenset({0}), 60 * GiB, GiB, 16 * GiB,
                  residency=Residency.PARKED, drops_parked=drops_parked),
    ]


def test_a_parked_rollout_whose_backend_cannot_drop_it_is_not_counted_freed() -> None:
    # vllm: the drop would leave it parked, 16 + 50 GiB pinned against a 60 GiB budget
    with pytest.raises(ResidencyError, match=r"66\.00 GiB.*60\.00 GiB"):
        plan_grant(_pool(False), CAP, job_id=2, phase=Phase.ROLLOUT,
                   host_budget_bytes=60 * GiB, gpus=[0])


def test_a_parked_rollout_whose_backend_drops_it_makes_room() -> None:
    plan = plan_grant(_pool(True), CAP, job_id=2, phase=Phase.ROLLOUT,
                      host_budget_bytes=60 * GiB, gpus=[0])
    assert plan.drop == ((1, "rollout"),) and plan.park == ((1, "trainer"),)
    assert plan.host_bytes_after == 50 * GiB


def test_a_rollout_the_plan_parks_may_be_dropped_whatever_its_backend() -> None:
    services = [
        Footprint(1, "trainer", frozenset({0}), 70 * GiB, GiB, 50 * GiB),
        Footprint(2, "rollout", frozenset({0}), 70 * GiB, GiB, 40 * GiB),
        Footprint(2, "trainer", frozenset({0}), GiB // 2, GiB, 30 * GiB,
                  residency=Residency.PARKED),
    ]
    plan = plan_grant(services, CAP, job_id=1, phase=Phase.TRAIN,
                      host_budget_bytes=50 * GiB)
    assert plan.drop == ((2, "rollout"),) and plan.park == ()


def test_footprints_know_which_rollout_backends_drop_when_parked() -> None:
    req = RlRequest(gpus=1, model="Qwen2.5-1.5B")
    for backend, drops in (("tiny", True), ("vllm", False), (None, False)):
        ro, tr = footprints_for_job(1, req, [0], rollout_backend=backend)
        assert (ro.drops_parked, tr.drops_parked) == (drops, False), backend


def test_admission_counts_no_drop_a_parked_vllm_rollout_cannot_make() -> None:
    # worst case, every other service parked: job 1's rollout phase leaves both
    # trainers' state and job 2's rollout's on the host, one byte over the budget unless
    # that rollout can be dropped. The drop rule alone: an active `tiny` rollout keeps
    # its host buffers too (`keeps_host`), which would need as much as the vllm pair
    def job(jid: int, backend: str) -> list[Footprint]:
        return [replace(f, keeps_host=False) for f in footprints_for_job(
            jid, RlRequest(gpus=1, model="Qwen2.5-7B"), [0], rollout_backend=backend)]

    cap = [GpuCapacity(0, 200 * GiB)]
    (ro, tr) = job(1, "tiny")
    budget = 2 * tr.host_bytes + ro.host_bytes - 1
    assert admit(job(2, "tiny"), job(1, "tiny"), cap, budget) is None
    why = admit(job(2, "vllm"), job(1, "vllm"), cap, budget)
    assert why is not None and "host memory" in why
