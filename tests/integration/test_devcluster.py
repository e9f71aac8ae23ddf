"""The dev cluster itself: idempotent `up`, recovery after kill -9, status, refusals.

Other integration tests share this cluster, so every test here leaves it up and healthy.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurmrl.devcluster import DevCluster
from tests.integration.conftest import JobFactory

pytestmark = pytest.mark.integration


def _cli(*args: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
    # cwd=/ so another user imports the installed copy, not this (maybe unreadable) tree
    argv = [sys.executable, "-m", "slurmrl.cli.main", "dev-cluster", *args]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/",
                          check=False)


def test_up_twice_restarts_nothing(dev_cluster: DevCluster) -> None:
    before = {d.name: d.pid for d in dev_cluster.status().daemons}
    report = dev_cluster.up()
    assert report.started == ()
    assert report.status is not None and report.status.healthy
    assert {d.name: d.pid for d in report.status.daemons} == before


def test_status_shows_daemons_and_both_partitions(dev_cluster: DevCluster) -> None:
    proc = _cli("status", "--state-dir", str(dev_cluster.layout.state_dir))
    assert proc.returncode == 0, proc.stderr
    for name in ("munged", "slurmctld", "slurmd", "slurmd-n2", "slurmd-n3"):
        pid = next(d.pid for d in dev_cluster.status().daemons if d.name == name)
        assert f"{name}" in proc.stdout and f"pid {pid}" in proc.stdout
    assert "controller UP" in proc.stdout
    assert "drivers*" in proc.stdout and "pools" in proc.stdout
    assert "gpu:4" in proc.stdout
    # the spread nodes' GPUs have a GRES type each: sinfo lists a line each
    assert re.search(r"^spread up 1 \S+ gpu:fake_a:2 n2$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^spread up 1 \S+ gpu:fake_b:2 n3$", proc.stdout, re.M), proc.stdout
    for node in ("localhost", "n2", "n3"):
        assert f"node       {node} " in proc.stdout


def test_kill_9_of_every_daemon_then_up_brings_the_node_back(
    dev_cluster: DevCluster, jobs: JobFactory,
) -> None:
    live_before = set(jobs.live_job_ids())
    pids = {d.name: d.pid for d in dev_cluster.status().daemons}
    assert all(pids.values()), pids
    try:
        for pid in pids.values():
            assert pid is not None
            os.kill(pid, signal.SIGKILL)
        crashed = dev_cluster.status()
        assert not crashed.healthy
        assert not crashed.controller_up
        report = dev_cluster.up()
        assert set(report.started) == {"munged", "slurmctld", "slurmd", "slurmd-n2",
                                       "slurmd-n3"}
    finally:
        dev_cluster.up()  # whatever happened, leave the shared cluster up
        # slurmctld saves job state asynchronously, a few seconds behind: jobs that
        # ended (earlier tests' scancels) just before the kill -9 come back from its
        # state files as running, holding the GPUs later tests need. End those.
        jobs.cancel_and_wait(sorted(set(jobs.live_job_ids()) - live_before))
    status = dev_cluster.status()
    assert status.healthy and status.node_state in ("idle", "mixed", "allocated")
    assert all(d.pid not in (None, pids[d.name]) for d in status.daemons)
    out = jobs.workdir / "after-crash.txt"
    sub = jobs.sbatch([f"--output={out}", "--rl-gpus=1", "--wrap", "echo alive"])
    assert sub.job_id is not None, sub.stderr
    assert jobs.wait(sub.job_id) in ("COMPLETED", "GONE")
    assert out.read_text().strip() == "alive"


def test_down_kills_the_step_daemons_and_tasks_no_cancel_reached(
    dev_cluster: DevCluster, jobs: JobFactory,
) -> None:
    # slurmctld died, so `down` cannot cancel the queue: the running job's step daemon
    # and its task outlive the slurmds, and `down` must not leave them behind
    from slurmrl.devcluster import daemons

    live_before = set(jobs.live_job_ids())
    out = jobs.workdir / "task-pid.txt"
    sub = jobs.sbatch([f"--output={out}", "--wrap", "echo $$; exec sleep 300"])
    assert sub.job_id is not None, sub.stderr
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_text().strip()):
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.1)
    task = int(out.read_text().split()[0])
    conf = dev_cluster.layout.slurm_conf
    steps = daemons.step_daemons(conf)
    assert steps and all(daemons.process_name(p) == "slurmstepd" for p in steps)
    try:
        ctld = next(d.pid for d in dev_cluster.status().daemons if d.name == "slurmctld")
        assert ctld is not None
        os.kill(ctld, signal.SIGKILL)
        stopped = dev_cluster.down()
        assert f"slurmstepd(x{len(steps)})" in stopped
        assert daemons.step_daemons(conf) == []
        assert daemons.process_name(task) is None  # `sleep 300`, the job's task
    finally:
        dev_cluster.up()  # leave the shared cluster up
        jobs.cancel_and_wait(sorted(set(jobs.live_job_ids()) - live_before))


def test_pool_partition_hands_out_the_four_fake_gpus(jobs: JobFactory) -> None:
    out = jobs.workdir / "gpus.txt"
    sub = jobs.sbatch([f"--output={out}", "-p", "pools", "--gres=gpu:4", "--wrap",
                       "echo $CUDA_VISIBLE_DEVICES"])
    assert sub.job_id is not None, sub.stderr
    assert jobs.wait(sub.job_id) in ("COMPLETED", "GONE")
    assert out.read_text().strip() == "0,1,2,3"


def test_spread_partition_is_two_slurm_nodes_of_two_gpus(jobs: JobFactory) -> None:
    # one job over both spread nodes: a task on each, each given its node's two GPUs
    out = jobs.workdir / "spread.txt"
    sub = jobs.sbatch([f"--output={out}", "-p", "spread", "-N", "2", "--gres=gpu:2",
                       "--wrap", "srun -l bash -c 'echo $SLURMD_NODENAME $CUDA_VISIBLE_DEVICES'"])
    assert sub.job_id is not None, sub.stderr
    assert jobs.wait(sub.job_id) in ("COMPLETED", "GONE")
    lines = sorted(line.split(":", 1)[1].strip() for line in out.read_text().splitlines())
    assert lines == ["n2 0,1", "n3 0,1"]


def test_test_users_exist_with_homes() -> None:
    for user in ("slurmrl", "rlalice", "rlbob"):
        proc = subprocess.run(["getent", "passwd", user], capture_output=True, text=True,
                              check=False)
        assert proc.returncode == 0
        assert Path(proc.stdout.split(":")[5]).is_dir()


def test_down_with_nothing_running_is_fine(tmp_path: Path) -> None:
    # A state dir that never ran: nothing to stop, and the shared munged is not ours.
    assert DevCluster(tmp_path / "never-up").down() == ()


def test_up_refuses_a_non_root_user_readably() -> None:
    proc = _cli("up", "--state-dir", "/tmp/slurmrl-never", user="rlbob")
    assert proc.returncode == 1
    assert "must be managed as root" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_node_drained_as_kill_task_failed_is_resumed_and_no_other(
    dev_cluster: DevCluster, slurm_env: dict[str, str],
) -> None:
    # the session's healer resumes a "Kill task failed" drain within seconds (a
    # slurmstepd hung at a cancel must not fail every later test); an admin's drain
    # for any other reason stays
    def state(node: str) -> str:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
                             capture_output=True, text=True, env=slurm_env, timeout=30,
                             check=False).stdout.split()
        return out[0] if out else "?"

    def drain(node: str, reason: str) -> None:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=drain",
                        f"reason={reason}"], env=slurm_env, timeout=30, check=True)

    drain("n3", "Kill task failed")
    drain("n2", "maintenance")
    try:
        deadline = time.monotonic() + 20
        while state("n3") != "idle" and time.monotonic() < deadline:
            time.sleep(0.5)
        assert state("n3") == "idle"
        assert state("n2") == "drained"
        assert dev_cluster.resume_kill_task_failed() == []
        assert state("n2") == "drained"
    finally:
        for node in ("n2", "n3"):
            subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"],
                           env=slurm_env, timeout=30, check=False)
