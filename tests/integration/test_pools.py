"""Pools and service steps on the real local Slurm (4 fake GPUs), as real users.

The pool manager's Slurm half (`PoolAllocator`) and the service launcher
(`ServiceLauncher`) run here without the controller: a pool is opened as a real batch
job, `tiny` workers of two users run as steps of it, and everything a user would notice
is checked on the live processes — their uid, their pinned GPUs, their step ids, their
state across park/activate, and what is left after scancel.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.auth.tokens import mint_secret
from slurmrl.controller.pools import PoolAllocator, SlurmPool
from slurmrl.controller.services import RunningService, ServiceLauncher, ServiceSpec
from slurmrl.devcluster import DevCluster
from slurmrl.slurm import CommandBackend
from slurmrl.worker.handle import ServiceParked, ServiceUnauthorized

PYTHON = "/opt/slurmrl/venv/bin/python"
PROMPTS = ["1+2=", "7*3=", "12-5=", "9*9="]


def _proc_field(pid: int, name: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"/proc/{pid}/status has no {name}")


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


@pytest.fixture
def slurm(dev_cluster: DevCluster) -> CommandBackend:
    return CommandBackend(dev_cluster.env())


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="slurmrl-svc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def allocator(slurm: CommandBackend) -> PoolAllocator:
    return PoolAllocator(slurm, "pools", start_timeout_s=60)


@pytest.fixture
def pool(allocator: PoolAllocator) -> Iterator[SlurmPool]:
    opened = allocator.open(4, label="test")
    yield opened
    allocator.close(opened.slurm_job_id)


@pytest.fixture
def launcher(slurm: CommandBackend, run_dir: Path) -> ServiceLauncher:
    return ServiceLauncher(slurm, run_dir, python=PYTHON, bind_host="127.0.0.1",
                           ready_timeout_s=90)


def _launch_two_users(launcher: ServiceLauncher, pool: SlurmPool
                      ) -> tuple[dict[str, RunningService], dict[str, str]]:
    secrets = {"rlalice": mint_secret(), "rlbob": mint_secret()}
    gpus = {"rlalice": (0, 1), "rlbob": (2, 3)}
    out: dict[str, RunningService] = {}
    for job_id, user in ((9001, "rlalice"), (9002, "rlbob")):
        for role in ("rollout", "trainer"):
            spec = ServiceSpec(job_id, role, user, gpus[user], seed=job_id)
            out[f"{user}/{role}"] = launcher.launch(pool.slurm_job_id, pool.node, spec,
                                                    secrets[user])
    return out, secrets


def test_pool_is_a_running_slurm_job_with_four_gpus(pool: SlurmPool,
                                                    slurm: CommandBackend) -> None:
    info = slurm.job(pool.slurm_job_id)
    assert info is not None and info.state.value == "RUNNING"
    assert info.partition == "pools"
    assert sorted(pool.gpu_indices) == [0, 1, 2, 3]


def test_services_run_as_their_users_on_pinned_gpus_and_survive_parking(
    pool: SlurmPool, launcher: ServiceLauncher, slurm: CommandBackend,
) -> None:
    services, secrets = _launch_two_users(launcher, pool)
    try:
        steps_before = {k: s.step_id for k, s in services.items()}
        listed = {s.step for s in slurm.steps(pool.slurm_job_id)}
        assert all(sid is not None and sid in listed for sid in steps_before.values())
        assert len(set(steps_before.values())) == 4

        for key, svc in services.items():
            user = key.split("/")[0]
            pw = pwd.getpwnam(user)
            # every uid (real, effective, saved, fs) and gid is the job's user's
            assert _proc_field(svc.pid, "Uid").split() == [str(pw.pw_uid)] * 4, key
            assert _proc_field(svc.pid, "Gid").split() == [str(pw.pw_gid)] * 4, key
            env = _environ(svc.pid)
            want = "0,1" if user == "rlalice" else "2,3"
            assert env["CUDA_VISIBLE_DEVICES"] == want, key
            cmdline = Path(f"/proc/{svc.pid}/cmdline").read_bytes().decode()
            assert secrets[user] not in cmdline
            # the other user cannot read this service's environment (where the secret is)
            other = "rlbob" if user == "rlalice" else "rlalice"
            peek = subprocess.run(["runuser", "-u", other, "--", "cat",
                                   f"/proc/{svc.pid}/environ"], capture_output=True,
                                  check=False)
            assert peek.returncode != 0 and secrets[user].encode() not in peek.stdout

        # alice's rollout: outputs before parking == outputs after activation
        ro = services["rlalice/rollout"].handle
        before = ro.generate(PROMPTS, max_tokens=12, seed=3)
        assert ro.park(level=1)["residency"] == "parked"
        with pytest.raises(ServiceParked):
            ro.generate(PROMPTS, max_tokens=12, seed=3)
        assert ro.activate()["residency"] == "active"
        after = ro.generate(PROMPTS, max_tokens=12, seed=3)
        assert [s.completion_ids for s in after.samples] == [
            s.completion_ids for s in before.samples]

        # bob's trainer: its weights after a train step survive a park/activate
        tr = services["rlbob/trainer"].handle
        tr.train_step([s.with_advantage(1.0) for s in before.samples])
        trained = tr.export_weights()
        assert tr.park(level=1)["residency"] == "parked"
        assert tr.activate()["residency"] == "active"
        assert tr.export_weights() == trained

        # bob's secret does not open alice's service
        from slurmrl.worker.handle import ServiceHandle
        intruder = ServiceHandle(services["rlalice/rollout"].address, secrets["rlbob"],
                                 "9001", "rollout")
        with pytest.raises(ServiceUnauthorized):
            intruder.status()

        # nothing was relaunched by the handoffs
        assert {k: s.step_id for k, s in services.items()} == steps_before
        assert all(s.alive() for s in services.values())
        assert {s.step for s in slurm.steps(pool.slurm_job_id)} >= set(steps_before.values())
    finally:
        for svc in services.values():
            launcher.stop(svc)
    assert not any(s.alive() for s in services.values())
    left = {s.step for s in slurm.steps(pool.slurm_job_id)}
    assert not left & {s.step_id for s in services.values()}


def test_cancelling_the_pool_ends_its_services_and_is_reported(
    allocator: PoolAllocator, launcher: ServiceLauncher, slurm: CommandBackend,
) -> None:
    opened = allocator.open(4, label="cancel-test")
    try:
        svc = launcher.launch(opened.slurm_job_id, opened.node,
                              ServiceSpec(9003, "rollout", "rlalice", (1,)), mint_secret())
        assert allocator.losses([opened.slurm_job_id]) == []
        subprocess.run(["scancel", str(opened.slurm_job_id)], env=slurm.env, check=True)
        deadline = time.monotonic() + 30
        while svc.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not svc.alive(), "the service step outlived its pool"
        assert not Path(f"/proc/{svc.pid}").exists(), "the worker process outlived its pool"
        losses = allocator.losses([opened.slurm_job_id])
        assert [loss.slurm_job_id for loss in losses] == [opened.slurm_job_id]
        assert "cancelled" in losses[0].message
        assert str(opened.slurm_job_id) in losses[0].message
        launcher.stop(svc)  # stopping a dead service is harmless
    finally:
        allocator.close(opened.slurm_job_id)


def test_a_service_that_cannot_start_fails_with_its_output(
    pool: SlurmPool, slurm: CommandBackend, run_dir: Path,
) -> None:
    broken = ServiceLauncher(slurm, run_dir, python="/nonexistent/python",
                             bind_host="127.0.0.1", ready_timeout_s=20, launch_attempts=2)
    from slurmrl.controller.services import ServiceLaunchError
    with pytest.raises(ServiceLaunchError, match="after 2 attempt"):
        broken.launch(pool.slurm_job_id, pool.node,
                      ServiceSpec(9004, "rollout", "rlbob", (0,)), mint_secret())
    # nothing of the failed attempts is left in the pool
    assert [s for s in slurm.steps(pool.slurm_job_id) if s.number is not None] == []


def test_unknown_user_is_refused_by_name(pool: SlurmPool, launcher: ServiceLauncher) -> None:
    from slurmrl.controller.services import ServiceLaunchError
    with pytest.raises(ServiceLaunchError, match="no-such-user-x"):
        launcher.launch(pool.slurm_job_id, pool.node,
                        ServiceSpec(9005, "rollout", "no-such-user-x", (0,)), mint_secret())


def test_pool_over_the_partitions_gpus_is_refused(allocator: PoolAllocator) -> None:
    from slurmrl.controller.pools import PoolError
    with pytest.raises(PoolError, match="pools"):
        allocator.open(64)
    assert os.geteuid() == 0
