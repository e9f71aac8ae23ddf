"""Admission through the site's policy, on a real controller and real Slurm.

A job over the site's limits is refused at registration by the `site-limits` admission
policy: the driver's `connect` fails with the policy's reason, and `slurmrl status`
shows the job failed with that reason.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurmrl.client import Job
from slurmrl.client.rpc import ControllerError
from tests.integration.conftest import JobFactory
from tests.integration.controller_harness import ControllerProc, env_for_controller, wait_running


def test_an_admission_reject_reaches_the_driver_and_status_with_its_reason(
        shared_tmp: Path, slurm_env: dict[str, str], jobs: JobFactory) -> None:
    env = env_for_controller(slurm_env)
    env["SLURMRL_LIMITS__MAX_GPUS_PER_JOB"] = "2"
    ctl = ControllerProc(shared_tmp, env)
    ctl.start()
    try:
        sub = jobs.sbatch(["--time=5", "--wrap=sleep 300"])
        assert sub.job_id, sub.stderr
        wait_running(jobs, sub.job_id)
        with pytest.raises(ControllerError) as err:
            Job(sub.job_id, ctl.url, {"SLURMRL_GPUS": "4"}, retry_for_s=5)
        assert err.value.code == "admission-refused"
        assert "--rl-gpus=4 exceeds the site limit of 2 GPUs per RL job" in str(err.value)
        # asking again gets the same answer, not a fresh registration
        with pytest.raises(ControllerError, match="exceeds the site limit of 2"):
            Job(sub.job_id, ctl.url, {"SLURMRL_GPUS": "1"}, retry_for_s=5)
        status = subprocess.run(
            [sys.executable, "-m", "slurmrl.cli.main", "status", "--controller", ctl.url,
             "-j", str(sub.job_id), "--all", "-h", "-o", "jobid,st,reason"],
            capture_output=True, text=True, env=env, timeout=60, check=False)
        assert status.returncode == 0, status.stderr
        assert status.stdout.split()[:2] == [str(sub.job_id), "F"], status.stdout
        assert "admission refused: --rl-gpus=4 exceeds the site limit of 2" in status.stdout
    finally:
        ctl.stop()
