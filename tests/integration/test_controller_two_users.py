"""Two users' RL jobs share one pool's GPUs through the real controller on real Slurm.

rlalice and rlbob each submit a driver with `sbatch --rl-gpus=2`; both register with a
controller started by the test, alternate rollout and train leases on the same two GPUs
for a few rounds, and finish. The DB then holds every phase observation, no two leases
ever overlapped on a GPU (checked from the DB's per-GPU hold intervals), the two jobs'
holds took turns, and `slurmrl status` lists both jobs.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.db import Store
from slurmrl.leases.invariants import check_history
from tests.integration.controller_harness import (
    VENV_PY,
    ControllerProc,
    driver_script,
    env_for_controller,
    holder_pool,
    read_out,
)

ROUNDS = 3


@pytest.fixture
def controller(shared_tmp: Path, slurm_env: dict[str, str]) -> Iterator[ControllerProc]:
    ctl = ControllerProc(shared_tmp, env_for_controller(slurm_env))
    ctl.start()
    yield ctl
    ctl.stop()


def _submit_driver(jobs, user: str, url: str, out: Path, driver: Path) -> int:  # type: ignore[no-untyped-def]
    # a declared mostly idle step: the default policy pairs the two jobs on it at once
    sub = jobs.sbatch(["--rl-gpus=2", "--rl-profile=rollout=0.2,train=0.1,reward=0.7,step=1",
                       f"--output={out}", "--time=10",
                       f"--wrap={driver} {url} {ROUNDS} 0.3"], user=user)
    assert sub.returncode == 0 and sub.job_id, sub.stderr
    return sub.job_id


def test_two_users_alternate_on_one_pool(controller: ControllerProc, jobs,  # type: ignore[no-untyped-def]
                                         shared_tmp: Path) -> None:
    pool_id = holder_pool(jobs, controller, gpus=2)
    driver = driver_script(shared_tmp)
    a_out, b_out = shared_tmp / "alice.out", shared_tmp / "bob.out"
    a = _submit_driver(jobs, "rlalice", controller.url, a_out, driver)
    b = _submit_driver(jobs, "rlbob", controller.url, b_out, driver)

    # while they run, `slurmrl status` (as alice) lists both, bob's without private details
    seen: dict[int, dict[str, object]] = {}
    for _ in range(100):
        proc = jobs.run([VENV_PY, "-m", "slurmrl.cli.main", "status", "--controller",
                         controller.url, "--json"], user="rlalice")
        assert proc.returncode == 0, proc.stderr
        seen = {j["job_id"]: j for j in json.loads(proc.stdout)["jobs"]}
        if {a, b} <= set(seen):
            break
        subprocess.run(["sleep", "0.2"], check=True)
    assert {a, b} <= set(seen), seen
    assert seen[a]["private"] and seen[a]["name"]
    assert not seen[b]["private"] and "name" not in seen[b] and "gpu_seconds" not in seen[b]
    table = jobs.run([VENV_PY, "-m", "slurmrl.cli.main", "status", "--controller",
                      controller.url, "--all"], user="rlbob")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:3] == ["JOBID", "USER", "NAME"]
    assert any(line.split()[:2] == [str(a), "rlalice"] for line in table.stdout.splitlines())

    assert jobs.wait(a, 120) == "COMPLETED", read_out(a_out)
    assert jobs.wait(b, 120) == "COMPLETED", read_out(b_out)
    assert "done" in read_out(a_out) and "done" in read_out(b_out)

    store = Store(controller.db)
    try:
        for job_id in (a, b):
            job = store.job(job_id)
            assert job is not None and job.pool_id == pool_id and str(job.state) == "CD"
            phases = [str(o.phase) for o in store.observations(job_id)]
            assert phases.count("rollout") == ROUNDS
            assert phases.count("train") == ROUNDS
            assert phases.count("reward") == ROUNDS
            for o in store.observations(job_id):
                if o.lease_id is not None:
                    assert o.requested_at <= o.granted_at <= o.released_at  # type: ignore[operator]
                    assert o.busy_s is not None and o.busy_s >= 0.3
        assert {job for job in store.gpu_seconds([a, b])} == {a, b}
        intervals = store.intervals(pool_id)
        assert len(intervals) == 2 * 2 * ROUNDS * 2  # jobs x phases x rounds x GPUs
        check_history(intervals)
        # and they took turns: the pool was time-sliced between the two jobs, not held
        # by one job's whole run and then the other's
        job_of = {o.lease_id: job_id for job_id in (a, b)
                  for o in store.observations(job_id) if o.lease_id is not None}
        holders = [job_of[iv.lease_id] for iv in sorted(intervals,
                                                        key=lambda iv: (iv.start, iv.lease_id))]
        turns = sum(1 for x, y in itertools.pairwise(holders) if x != y)
        assert turns >= 3, holders
    finally:
        store.close()
    with urllib.request.urlopen(controller.url + "/metrics", timeout=5) as resp:
        metrics = resp.read().decode()
    granted = [line for line in metrics.splitlines()
               if line.startswith(f'slurmrl_leases_granted_total{{pool="{pool_id}"}}')]
    assert granted and float(granted[0].split()[-1]) == 2 * 2 * ROUNDS
    # GPU-seconds by pool: a job's own are private, and /metrics asks no credential
    assert f'slurmrl_gpu_seconds_total{{pool="{pool_id}"}}' in metrics
    assert 'job="' not in metrics
    assert "slurmrl_lease_wait_seconds_bucket" in metrics
    assert "Traceback" not in controller.log.read_text()
