"""Faults on real Slurm: the controller is `kill -9`ed mid-run; a driver is `kill -9`ed.

- Controller restart: two users' drivers alternate on one pool; the controller is killed
  while one holds a lease and the other waits, then restarted on the same DB. Both
  drivers carry on to the end, and the DB shows no GPU ever held by two leases.
- Dead driver: a driver holding a lease is killed; its lease is revoked ("expired")
  within the lease timeout and the waiting job is granted.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.db import Store
from slurmrl.leases.invariants import check_history
from slurmrl.model import LeaseState
from tests.integration.controller_harness import (
    ControllerProc,
    driver_script,
    env_for_controller,
    holder_pool,
    read_out,
    wait_output,
)

LEASE_TIMEOUT_S = 3.0


@pytest.fixture
def controller(shared_tmp: Path, slurm_env: dict[str, str]) -> Iterator[ControllerProc]:
    env = env_for_controller(slurm_env)
    # only heartbeats may end a lease here, not the reconciler noticing the job ended
    env["SLURMRL_CONTROLLER__RECONCILE_INTERVAL_S"] = "600"
    ctl = ControllerProc(shared_tmp, env, lease_timeout_s=LEASE_TIMEOUT_S)
    ctl.start()
    yield ctl
    ctl.stop()


def _submit(jobs, user: str, url: str, out: Path, driver: Path, rounds: int,  # type: ignore[no-untyped-def]
            hold_s: float) -> int:
    sub = jobs.sbatch(["--rl-gpus=2", f"--output={out}", "--time=10",
                       f"--wrap={driver} {url} {rounds} {hold_s}"], user=user)
    assert sub.returncode == 0 and sub.job_id, sub.stderr
    return sub.job_id


def _open_leases(ctl: ControllerProc) -> tuple[int, int]:
    store = Store(ctl.db)
    try:
        rows = store.leases(open_only=True)
    finally:
        store.close()
    held = sum(r.state is LeaseState.HELD for r in rows)
    return held, len(rows) - held


def test_controller_kill9_and_restart_drivers_carry_on(controller: ControllerProc, jobs,  # type: ignore[no-untyped-def]
                                                        shared_tmp: Path) -> None:
    pool_id = holder_pool(jobs, controller, gpus=2)
    driver = driver_script(shared_tmp)
    a_out, b_out = shared_tmp / "a.out", shared_tmp / "b.out"
    a = _submit(jobs, "rlalice", controller.url, a_out, driver, 4, 0.8)
    b = _submit(jobs, "rlbob", controller.url, b_out, driver, 4, 0.8)
    deadline = time.monotonic() + 60
    while _open_leases(controller) != (1, 1):  # one holds, the other waits
        assert time.monotonic() < deadline, read_out(a_out) + read_out(b_out)
        time.sleep(0.05)
    controller.kill9()
    time.sleep(1.0)
    # the DB alone knows who holds and who waits, in order
    assert _open_leases(controller) == (1, 1)
    controller.start()

    assert jobs.wait(a, 120) == "COMPLETED", read_out(a_out)
    assert jobs.wait(b, 120) == "COMPLETED", read_out(b_out)
    store = Store(controller.db)
    try:
        check_history(store.intervals(pool_id))
        for job_id in (a, b):
            done = [o for o in store.observations(job_id) if o.lease_id is not None
                    and o.detail.get("state") == "released"]
            # every phase the driver ran ended in a clean release, none double-granted
            assert len(done) == 8, [(o.phase, o.detail) for o in store.observations(job_id)]
    finally:
        store.close()
    assert "restored" in controller.log.read_text()


def test_killed_driver_loses_its_lease_and_the_waiter_is_granted(  # type: ignore[no-untyped-def]
        controller: ControllerProc, jobs, shared_tmp: Path) -> None:
    pool_id = holder_pool(jobs, controller, gpus=2)
    driver = driver_script(shared_tmp)
    a_out, b_out = shared_tmp / "a.out", shared_tmp / "b.out"
    a = _submit(jobs, "rlalice", controller.url, a_out, driver, 0, 600)
    wait_output(a_out, "holding")
    pid = int(read_out(a_out).split()[2])
    b = _submit(jobs, "rlbob", controller.url, b_out, driver, 1, 0.2)
    deadline = time.monotonic() + 60
    while _open_leases(controller) != (1, 1):
        assert time.monotonic() < deadline, read_out(b_out)
        time.sleep(0.05)
    killing_at = time.time()
    os.kill(pid, signal.SIGKILL)
    # 60 s: a hang guard only (b waits out a's lease timeout, 3 s, then runs one round)
    assert jobs.wait(b, 60) == "COMPLETED", read_out(b_out)

    store = Store(controller.db)
    try:
        a_lease = store.leases(job_id=a)[0]
        # revoked by the lease timeout (the reconciler, which would see the job end, is
        # off here): "expired", after the kill and no earlier than its last deadline
        assert a_lease.state is LeaseState.REVOKED and a_lease.reason == "expired"
        assert a_lease.released_at is not None
        assert a_lease.released_at >= killing_at
        assert a_lease.released_at >= a_lease.deadline_at
        # b waited for a's GPUs and got them only once a's lease was gone
        b_first = store.leases(job_id=b)[0]
        assert b_first.requested_at < a_lease.released_at
        assert b_first.granted_at is not None and b_first.granted_at >= a_lease.released_at
        assert set(b_first.gpus) == set(a_lease.gpus)
        check_history(store.intervals(pool_id))
    finally:
        store.close()
