"""`slurmrl doctor` on the real dev cluster: passes with everything up, fails (exit 1)
naming the controller when the controller is down."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.integration.controller_harness import ControllerProc, env_for_controller


def _doctor(env: dict[str, str], url: str) -> tuple[int, dict[str, Any]]:
    cp = subprocess.run([sys.executable, "-m", "slurmrl.cli.main", "doctor", "--controller",
                         url, "--json"], capture_output=True, text=True, env=env, timeout=120,
                        check=False)
    return cp.returncode, json.loads(cp.stdout)


def test_doctor_passes_with_all_up_and_fails_on_a_stopped_controller(
        shared_tmp: Path, slurm_env: dict[str, str]) -> None:
    env = env_for_controller(slurm_env)
    ctl = ControllerProc(shared_tmp, env)
    ctl.start()
    # a services directory made, as the controller of a site makes it (one not made yet
    # is a WARN); under /var/tmp: root's, sticky, as the check wants its parents
    services = Path(tempfile.mkdtemp(prefix="slurmrl-doctor-services-", dir="/var/tmp"))
    env = {**env, "SLURMRL_SERVICES__RUN_DIR": str(services)}
    try:
        rc, out = _doctor(env, ctl.url)
        levels = {c["name"]: c["level"] for c in out["checks"]}
        assert rc == 0, out
        assert out["errors"] == []
        for name in ("slurm", "spank", "munge", "controller", "nvml", "python",
                     "pinned-memory", "services"):
            assert levels[name] == "OK", (name, out)
        # the dev cluster's pools partition has 4 (fake) GPUs but is open to every user
        assert levels["pool-partition"] == "WARN"
        (pool,) = [c for c in out["checks"] if c["name"] == "pool-partition"]
        assert "4 GPU(s)" in pool["detail"] and "AllowGroups=root" in pool["remedy"]
    finally:
        ctl.stop()
    try:
        rc, out = _doctor(env, ctl.url)
    finally:
        shutil.rmtree(services, ignore_errors=True)
    assert rc == 1
    (c,) = [c for c in out["checks"] if c["name"] == "controller"]
    assert c["level"] == "FAIL" and ctl.url in c["detail"]
    assert "systemctl start slurmrl-controller" in c["remedy"]
    # the rest of the installation is still reported as fine
    assert {x["name"] for x in out["checks"] if x["level"] == "FAIL"} == {"controller"}


def test_doctor_asks_slurm_whether_it_would_take_a_pool(
        shared_tmp: Path, slurm_env: dict[str, str]) -> None:
    env = env_for_controller(slurm_env)
    cp = subprocess.run([sys.executable, "-m", "slurmrl.cli.main", "doctor", "--check",
                         "pool-submit"], capture_output=True, text=True, env=env, timeout=120,
                        check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
    assert cp.stdout.startswith("OK   pool-submit") and "as root" in cp.stdout
    # a pool asking more memory per GPU than the node has would never start
    site = shared_tmp / "bigpools.toml"
    site.write_text('[slurm]\npool_mem_per_gpu = "64T"\n')
    cp = subprocess.run([sys.executable, "-m", "slurmrl.cli.main", "doctor", "--config",
                         str(site), "--check", "pool-submit", "--json"],
                        capture_output=True, text=True, env=env, timeout=120, check=False)
    assert cp.returncode == 1, cp.stdout + cp.stderr
    (c,) = json.loads(cp.stdout)["checks"]
    assert c["level"] == "FAIL" and "would refuse a 1-GPU pool" in c["detail"]
    assert "pool_mem_per_gpu" in c["remedy"]
    # a test, not a submission: no job was left behind
    q = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True,
                       env=env, timeout=30, check=True)
    assert "slurmrl-pool" not in q.stdout
