"""A colocated driver's train -> sync switch through the client and the real controller.

Two RL jobs share one pool's two GPUs (a real Slurm allocation attached as a pool, a
real `slurmrl controller` process, MUNGE sessions). Job A trains while job B's rollout
waits for the GPUs; A's `lease.switch("sync")` inside its `with job.phase("train")`
block is granted at once, the next `with job.phase("sync")` holds that lease, and B gets
the GPUs only when A's sync ends. A lease that cannot switch again falls back to release
+ acquire; another user cannot switch A's lease (403), and a malformed body is a 400
naming its field.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from slurmrl.client import Job
from slurmrl.client.rpc import ControllerError
from slurmrl.db import Store
from slurmrl.leases.invariants import check_history
from tests.integration.controller_harness import (
    RPC_AS,
    VENV_PY,
    ControllerProc,
    holder_pool,
    wait_running,
)

#: a mostly idle step: the default pairing policy puts the two jobs in one pool at once
PROFILE = "rollout=0.2,train=0.1,reward=0.7,step=1"


def _rl_job(jobs: Any, ctl: ControllerProc) -> Job:
    sub = jobs.sbatch(["--rl-gpus=2", f"--rl-profile={PROFILE}", "--time=10",
                       "--wrap=sleep 600"])
    assert sub.job_id, sub.stderr
    wait_running(jobs, sub.job_id)
    return Job(sub.job_id, ctl.url, {"SLURMRL_GPUS": "2", "SLURMRL_PROFILE": PROFILE},
               retry_for_s=5)


def _waiting(job: Job) -> list[int]:
    _, ans = job._rpc.call("GET", f"/v1/jobs/{job.job_id}/leases")
    return [x["lease_id"] for x in ans["leases"] if x["state"] == "waiting"]


def _until(cond: Any, what: str, within_s: float = 20.0) -> None:
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, f"not within {within_s:g} s: {what}"
        time.sleep(0.05)


def test_a_switched_sync_keeps_the_gpus_and_the_partner_gets_them_after(  # type: ignore[no-untyped-def]
        controller: ControllerProc, jobs, shared_tmp: Path) -> None:
    pool_id = holder_pool(jobs, controller, gpus=2)
    a, b = _rl_job(jobs, controller), _rl_job(jobs, controller)
    got: list[Any] = []
    try:
        with a.phase("train") as train:
            waiter = threading.Thread(target=lambda: got.append(b.acquire("rollout")))
            waiter.start()
            _until(lambda: _waiting(b), "job B's rollout request queued")
            time.sleep(0.3)
            sync = train.switch("sync")
            assert (sync.phase, sync.gpus, a.current) == ("sync", (0, 1), sync)
        assert not train.held and sync.held
        with a.phase("sync") as adopted:
            assert adopted is sync
            time.sleep(0.5)
            assert not got and _waiting(b)  # B still waits: A's sync holds the GPUs
        waiter.join(20)
        (rollout,) = got
        assert rollout.phase == "rollout" and rollout.gpus == (0, 1)
        assert rollout.granted_at >= sync.granted_at + 0.5

        # a lease a switch granted does not switch again: the client releases it and
        # acquires the phase instead, the same driver code
        rollout.release()
        with a.phase("train") as train2:
            sync2 = train2.switch("sync")
        with a.phase("sync"):
            again = sync2.switch("train")
        assert again.phase == "train" and again.lease_id != sync2.lease_id and not sync2.held
        again.release()
    finally:
        for job in (a, b):
            job._stop.set()

    store = Store(controller.db)
    try:
        old = store.lease(train.lease_id)
        assert old is not None and str(old.state) == "released"
        assert old.reason == f"switched to lease {sync.lease_id}"
        assert old.released_at == store.lease(sync.lease_id).granted_at  # type: ignore[union-attr]
        obs = {o.lease_id: o for o in store.observations(a.job_id)}
        assert obs[train.lease_id].busy_s is not None and obs[train.lease_id].busy_s >= 0.3
        assert str(obs[sync.lease_id].phase) == "sync"
        assert store.gpu_seconds([a.job_id])[a.job_id] > 0
        check_history(store.intervals(pool_id))
    finally:
        store.close()
    assert "Traceback" not in controller.log.read_text()


def test_a_switch_is_the_owners_and_its_body_is_checked(  # type: ignore[no-untyped-def]
        controller: ControllerProc, jobs) -> None:
    holder_pool(jobs, controller, gpus=2)
    a = _rl_job(jobs, controller)
    try:
        lease = a.acquire("train")
        path = f"/v1/jobs/{a.job_id}/leases/{lease.lease_id}/switch"
        proc = jobs.run([VENV_PY, "-c", RPC_AS, controller.url, "POST", path,
                         json.dumps({"phase": "sync"})], user="rlalice")
        assert proc.returncode == 0, proc.stderr
        got = json.loads(proc.stdout)
        assert (got["status"], got["answer"]["error"]["code"]) == (403, "not-your-job")
        for body, field in [({"phase": "nap"}, "'phase'"),
                            ({"phase": "sync", "timing": {"busy_s": "long"}}, "'timing'"),
                            ({"phase": "sync", "keep": 1}, "'keep'")]:
            with pytest.raises(ControllerError, match=field) as err:
                a._rpc.call("POST", path, body)
            assert err.value.status == 400
        assert lease.held and _held(a) == [lease.lease_id]
        sync = lease.switch("sync")  # still switchable: nothing above changed it
        assert sync.phase == "sync"
        sync.release()
    finally:
        a._stop.set()


def _held(job: Job) -> list[int]:
    _, ans = job._rpc.call("POST", f"/v1/jobs/{job.job_id}/heartbeat", {})
    return [x["lease_id"] for x in ans["held"]]
