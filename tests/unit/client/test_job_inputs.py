"""What a driver passes in: NumPy (or torch) scalars where numbers are asked for.

A training loop's rewards, steps and GPU indices are often `np.float32` / `np.int64`,
which `json` cannot write: the client takes them as the numbers they are. The controller
is a stand-in on loopback (tests/unit/client/_controller_standin.py).
"""

from __future__ import annotations

import time

import pytest
from _controller_standin import StandIn, lease

from slurmrl.client.job import Job

OBSERVE = ("POST", "/v1/jobs/N/observations")


def test_observe_takes_numpy_scalars(standin: StandIn, job: Job) -> None:
    np = pytest.importorskip("numpy")
    standin.routes[OBSERVE] = lambda call: (200, {"observation_id": 1})
    rewards = np.array([0.0, 1.0, 1.0], dtype=np.float32)
    now = np.float64(time.time())
    job.observe("reward", now - 1, now, detail={"step": np.int64(3), "reward": rewards.mean()})
    (call,) = standin.seen(*OBSERVE)
    assert call.body["detail"] == {"step": 3.0, "reward": pytest.approx(2 / 3)}
    assert call.body["ended_at"] == pytest.approx(float(now))


def test_observe_refuses_a_detail_that_is_no_number_naming_it(
        standin: StandIn, job: Job) -> None:
    with pytest.raises(ValueError, match=r"detail\['reward'\] must be a number, got str"):
        job.observe("reward", time.time() - 1, time.time(), detail={"reward": "high"})
    assert not standin.seen(*OBSERVE)


def test_lease_calls_take_numpy_integers(standin: StandIn, job: Job) -> None:
    np = pytest.importorskip("numpy")
    standin.routes["POST", "/v1/jobs/N/leases/N/grow"] = lambda call: (
        200, {"lease": lease(), "added": []})
    standin.routes["POST", "/v1/jobs/N/leases/N/pack"] = lambda call: (200, {"lease": lease()})
    with job.phase("rollout", min_gpus=np.int64(1), timeout_s=np.float32(5.0)) as held:
        held.grow(np.arange(4))
        held.pack(np.array([0], dtype=np.int64))
        held.shrink(gpus=[np.int64(0)])
        held.release({"busy_s": np.float32(1.5), "wait_s": np.float64(0.0)})
    bodies = {call.path.rsplit("/", 1)[1]: call.body for call in standin.calls}
    assert bodies["leases"]["min_gpus"] == 1
    assert bodies["grow"]["gpus"] == [2, 3]
    assert bodies["pack"]["gpus"] == [0]
    assert bodies["shrink"] == {"gpus": [0]}
    assert bodies["release"] == {"timing": {"busy_s": 1.5, "wait_s": 0.0}}
