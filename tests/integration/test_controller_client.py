"""The driver client and `slurmrl status` against a real controller on real Slurm.

- A lease revoked under a driver (here: an admin closes the pool) makes the `with
  job.phase(...)` block raise `LeaseRevoked` naming the reason.
- `slurmrl status`: `--pools`, `-o`, `-h`, `-j`, and a clear error with exit 1 when the
  controller cannot be reached.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.client import Job, LeaseRevoked
from tests.integration.controller_harness import (
    ControllerProc,
    env_for_controller,
    free_port,
    holder_pool,
    wait_running,
)


@pytest.fixture
def controller(shared_tmp: Path, slurm_env: dict[str, str]) -> Iterator[ControllerProc]:
    ctl = ControllerProc(shared_tmp, env_for_controller(slurm_env), lease_timeout_s=2.0,
                         heartbeat_s=0.2)
    ctl.start()
    yield ctl
    ctl.stop()


def _status(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurmrl.cli.main", "status", *args],
                          capture_output=True, text=True, env=env, timeout=60, check=False)


def test_revoked_lease_raises_and_status_shows_it(controller: ControllerProc, jobs,  # type: ignore[no-untyped-def]
                                                   slurm_env: dict[str, str]) -> None:
    pool_id = holder_pool(jobs, controller, gpus=1)
    sub = jobs.sbatch(["--rl-gpus=1", "--time=10", "--wrap=sleep 600"])
    assert sub.job_id, sub.stderr
    wait_running(jobs, sub.job_id)
    job = Job(sub.job_id, controller.url, {"SLURMRL_GPUS": "1"}, retry_for_s=5)
    env = env_for_controller(slurm_env)
    try:
        with pytest.raises(LeaseRevoked, match="pool-lost"), job.phase("train") as lease:
            assert lease.gpus == (0,)
            table = _status("--controller", controller.url, "--pools", "-h", "-o",
                            "pool,gpus,members", env=env)
            assert table.returncode == 0, table.stderr
            assert table.stdout.split() == [f"p{pool_id}", "1", str(sub.job_id)]
            mine = _status("--controller", controller.url, "-j", str(sub.job_id), "-o",
                           "jobid,st,phase", env=env)
            assert mine.stdout.splitlines()[1].split() == [str(sub.job_id), "R", "train"]
            controller.admin().call("POST", f"/v1/pools/{pool_id}/close",
                                    {"reason": "pool-lost"})
            deadline = time.monotonic() + 10
            while lease.held:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        job._stop.set()


def test_status_fails_clearly_without_a_controller(slurm_env: dict[str, str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    proc = _status("--controller", url, env=env_for_controller(slurm_env))
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "unreachable" in proc.stderr and url in proc.stderr
    bad = _status("--controller", url, "-o", "jobid,nosuch", env=env_for_controller(slurm_env))
    assert bad.returncode == 2 and "nosuch" in bad.stderr
