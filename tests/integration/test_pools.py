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
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from slurmrl.auth.tokens import mint_secret
from slurmrl.controller.pools import PoolAllocator, SlurmPool
from slurmrl.controller.services import RunningService, ServiceLauncher, ServiceSpec
from slurmrl.devcluster import DevCluster
from slurmrl.model import Phase
from slurmrl.slurm import CommandBackend
from slurmrl.worker.handle import ServiceParked, ServiceUnauthorized

if TYPE_CHECKING:
    from slurmrl.db import JobRecord, PoolRecord, Store
    from tests.integration.controller_harness import ControllerProc

PYTHON = sys.executable  # the venv make test runs in (under /opt: every user can run it)
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
            # of the controller's environment, only what it hands the service
            assert {k for k in env if k.startswith("SLURMRL_")} == {
                "SLURMRL_JOB_SECRET", "SLURMRL_CONTROL_SECRET"}, key
            assert env["HOME"] == pw.pw_dir and env["USER"] == user, key
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
        # nor does alice's own (her driver's) park, activate or stop it: the controller
        # launched it with a key of its own
        owner = ServiceHandle(services["rlalice/rollout"].address, secrets["rlalice"],
                              "1", "rollout")
        for call in (owner.park, owner.activate, owner.stop):
            with pytest.raises(ServiceUnauthorized, match="is the controller's"):
                call()
        assert owner.status()["residency"] == "active"

        # nothing was relaunched by the handoffs
        assert {k: s.step_id for k, s in services.items()} == steps_before
        assert all(s.alive() for s in services.values())
        assert {s.step for s in slurm.steps(pool.slurm_job_id)} >= set(steps_before.values())
    finally:
        for svc in services.values():
            launcher.stop(svc)
    assert not any(s.alive() for s in services.values())
    left = _steps_left(slurm, pool.slurm_job_id, {s.step_id for s in services.values()})
    assert not left


def _steps_left(slurm: CommandBackend, job_id: int, steps: set[str | None],
                timeout_s: float = 15.0) -> set[str]:
    """Which of `steps` Slurm still lists after up to `timeout_s`: slurmctld drops a step
    a moment after its srun exits (later on a loaded machine)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = {s.step for s in slurm.steps(job_id)} & {x for x in steps if x is not None}
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


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
        while losses and losses[0].state == "COMPLETING" and time.monotonic() < deadline:
            time.sleep(0.2)  # reported as lost at once; the final state follows
            losses = allocator.losses([opened.slurm_job_id])
        assert [loss.slurm_job_id for loss in losses] == [opened.slurm_job_id]
        assert "cancelled" in losses[0].message
        assert str(opened.slurm_job_id) in losses[0].message
        launcher.stop(svc)  # stopping a dead service is harmless
    finally:
        allocator.close(opened.slurm_job_id)


def test_a_service_step_no_live_record_owns_is_killed_and_the_others_run_on(
    pool: SlurmPool, launcher: ServiceLauncher, slurm: CommandBackend,
) -> None:
    # what a restarted controller finds: steps of services its database no longer
    # holds live (a launch under way at the crash, a stop that did not end one). Slurm
    # lists each service's step under its record's name; only those are killed
    stray = launcher.launch(pool.slurm_job_id, pool.node,
                            ServiceSpec(9006, "rollout", "rlalice", (0,), service_id=41),
                            mint_secret())
    kept = launcher.launch(pool.slurm_job_id, pool.node,
                           ServiceSpec(9007, "trainer", "rlbob", (1,), service_id=42),
                           mint_secret())
    other = slurm.launch_step(pool.slurm_job_id, ["/bin/sleep", "300"])  # not a service
    try:
        names = {s.step: s.name for s in slurm.steps(pool.slurm_job_id)}
        assert names[str(stray.step_id)] == "slurmrl-41-job9006-rollout"
        assert names[str(kept.step_id)] == "slurmrl-42-job9007-trainer"
        killed = launcher.kill_strays([pool.slurm_job_id], lambda sid: sid == 42)
        assert killed == [(pool.slurm_job_id, str(stray.step_id), 41)]
        deadline = time.monotonic() + 30
        while Path(f"/proc/{stray.pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not Path(f"/proc/{stray.pid}").exists(), "the stray's worker runs on"
        # the live service answers as before; the step slurmrl did not name runs on
        assert kept.handle.status()["residency"] == "active"
        assert other.poll() is None
        # once Slurm has ended the killed step (its worker gone, slurmstepd may list it a
        # little longer on a loaded machine), the next sweep finds nothing to kill
        while (str(stray.step_id) in {s.step for s in slurm.steps(pool.slurm_job_id)}
               and time.monotonic() < deadline):
            time.sleep(0.2)
        assert launcher.kill_strays([pool.slurm_job_id], lambda sid: sid == 42) == []
    finally:
        other.kill()
        launcher.stop(kept)
        launcher.stop(stray)


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
    numbered = {s.step for s in slurm.steps(pool.slurm_job_id) if s.number is not None}
    assert not _steps_left(slurm, pool.slurm_job_id, numbered)


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


def test_a_controller_cancels_at_start_its_allocations_that_no_pool_holds(
        shared_tmp: Path, slurm_env: dict[str, str], run_dir: Path,
        slurm: CommandBackend) -> None:
    # a controller killed between submitting a pool and recording it leaves the
    # allocation to Slurm alone: its next start finds it by the controller's tag in
    # the job's comment (as Slurm lists it back) and cancels it. Another controller's
    # allocation runs on.
    from slurmrl.db import Store
    from slurmrl.slurm import SlurmJobState

    store = Store(shared_tmp / "controller.db")  # the controller's DB, made first
    tag = store.controller_tag()
    store.close()
    mine = PoolAllocator(slurm, "pools", start_timeout_s=60, tag=tag)
    other = PoolAllocator(slurm, "pools", start_timeout_s=60, tag="0123456789abcdef")
    leaked, kept = mine.open(1, "for job 1"), other.open(1, "for job 1")
    try:
        assert mine.tagged() == []  # being recorded: never a stray
        mine.recorded(leaked.slurm_job_id)
        other.recorded(kept.slurm_job_id)
        assert mine.tagged() == [leaked.slurm_job_id]
        assert other.tagged() == [kept.slurm_job_id]
        ctl = _pool_controller(shared_tmp, slurm_env, run_dir)
        try:
            def ended(jid: int) -> bool:
                info = slurm.job(jid)
                return info is None or info.state.terminal
            _wait(lambda: ended(leaked.slurm_job_id), 30,
                  f"the controller to cancel its stray allocation {leaked.slurm_job_id}",
                  lambda: read(ctl.log)[-3000:])
            assert f"Slurm job {leaked.slurm_job_id} runs on" in read(ctl.log)
            running = slurm.job(kept.slurm_job_id)
            assert running is not None and running.state is SlurmJobState.RUNNING
        finally:
            ctl.stop()
    finally:
        mine.close(leaked.slurm_job_id)
        other.close(kept.slurm_job_id)


# --------------------------------------------------------------------------------------
# The whole path: a controller with the Slurm pool manager, two users' drivers

#: what the two-user tests' jobs declare: mostly idle steps, so they are paired at once
PROFILE = "--rl-profile=rollout=0.2,train=0.1,reward=0.7,step=1"

POOL_DRIVER = '''#!{python}
"""Alternate rollout/train through the job's own tiny services until told otherwise."""
import json, sys, time, slurmrl
url = sys.argv[1]
job = slurmrl.connect(url=url)
ro, tr = job.service("rollout"), job.service("trainer")
prompts = ["1+2=", "3*4=", "9-7=", "5+5="]
last, began_on_0 = None, 0
try:
    for i in range(10000):
        with job.phase("rollout"):
            out = [s.completion_ids for s in ro.generate(prompts, max_tokens=8,
                                                         seed=11).samples]
            # same weights, same seed: a service whose state survived parking repeats
            print(json.dumps({{"round": i, "same": last is None or out == last}}), flush=True)
            last = out
        with job.phase("train"):
            tr.train_step([{{"prompt_ids": [1], "completion_ids": [2, 3],
                            "advantage": 0.0}}])
        time.sleep(0.1)
except Exception as exc:
    print("ERROR", type(exc).__name__, exc, flush=True)
    sys.exit(3)
'''


def _rounds(path: Path) -> list[dict[str, object]]:
    import json
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()
            if line.startswith("{")]


def _wait(cond: object, timeout_s: float, what: str,
          evidence: Callable[[], str] | None = None) -> None:
    """Wait for `cond`; on timeout fail with `what` and, if given, what `evidence()`
    reads then (the drivers' output, the controller's log)."""
    assert callable(cond)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.3)
    seen = f":\n{evidence()}" if evidence is not None else ""
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}{seen}")


def _pool_controller(shared_tmp: Path, slurm_env: dict[str, str], run_dir: Path,
                     **env: str) -> ControllerProc:
    """A controller (reconciling every second) that opens pools in Slurm itself."""
    from tests.integration.controller_harness import ControllerProc, env_for_controller

    full = env_for_controller(slurm_env)
    full["SLURMRL_CONTROLLER__RECONCILE_INTERVAL_S"] = "1"
    full.update(env)
    ctl = ControllerProc(shared_tmp, full, lease_timeout_s=10.0)
    ctl.args += ["--pool-manager", "slurm", "--services-dir", str(run_dir)]
    ctl.start()
    return ctl


def _submit_drivers(jobs: object, shared_tmp: Path, ctl: ControllerProc, template: str,
                    tag: str, rl_args: list[str], ids: dict[str, int]) -> dict[str, Path]:
    """One RL job each for rlalice and rlbob running `template` against `ctl`; fills
    `ids` (user -> Slurm job id) as it goes and returns each job's output file."""
    from tests.integration.controller_harness import VENV_PY

    driver = shared_tmp / f"{tag}_driver.py"
    driver.write_text(template.format(python=VENV_PY))
    driver.chmod(0o755)
    outs = {u: shared_tmp / f"{u}-{tag}.out" for u in ("rlalice", "rlbob")}
    for user in ("rlalice", "rlbob"):
        sub = jobs.sbatch([*rl_args, f"--output={outs[user]}",  # type: ignore[attr-defined]
                           "--time=15", f"--wrap={driver} {ctl.url}"], user=user)
        assert sub.returncode == 0 and sub.job_id, sub.stderr
        ids[user] = sub.job_id
    return outs


def _one_driver(jobs: object, shared_tmp: Path, ctl: ControllerProc, tag: str,
                rl_args: list[str], user: str = "rlalice") -> tuple[int, Path]:
    """One RL job of `user` running POOL_DRIVER against `ctl`: its Slurm job id and its
    output file."""
    from tests.integration.controller_harness import VENV_PY

    driver = shared_tmp / f"{tag}_driver.py"
    driver.write_text(POOL_DRIVER.format(python=VENV_PY))
    driver.chmod(0o755)
    out = shared_tmp / f"{user}-{tag}.out"
    sub = jobs.sbatch([*rl_args, f"--output={out}", "--time=15",  # type: ignore[attr-defined]
                       f"--wrap={driver} {ctl.url}"], user=user)
    assert sub.returncode == 0 and sub.job_id, sub.stderr
    return sub.job_id, out


def _one_gpu_taken_on_each_spread_node(jobs: object) -> list[int]:
    """Another user's batch job on one GPU of each of `spread`'s nodes (n2, n3), running:
    their Slurm job ids, n2's first."""
    blockers: list[int] = []
    for node in ("n2", "n3"):
        sub = jobs.sbatch(["-p", "spread", "--gres=gpu:1", f"--nodelist={node}",  # type: ignore[attr-defined]
                           "--time=15", "--output=/dev/null", "--wrap=sleep 900"],
                          user="rlbob")
        assert sub.returncode == 0 and sub.job_id, sub.stderr
        blockers.append(sub.job_id)
    _wait(lambda: all(jobs.state(b) == "RUNNING" for b in blockers), 60,  # type: ignore[attr-defined]
          "the other user's jobs to run")
    return blockers


def _end_drivers_and_pools(jobs: object, ids: dict[str, int], ctl: ControllerProc,
                           run_dir: Path) -> None:
    """End the drivers, then the pools (a stopped controller leaves its pools running,
    and a leftover pool holds the GPUs), stop the controller, show the services' logs."""
    from slurmrl.db import Store

    for jid in ids.values():
        jobs.run(["scancel", str(jid)])  # type: ignore[attr-defined]
    if ctl.db.exists():
        for p in Store(ctl.db).pools():
            if p.slurm_job_id is not None:
                jobs.run(["scancel", str(p.slurm_job_id)])  # type: ignore[attr-defined]
    ctl.stop()
    for path in run_dir.glob("*.log"):
        print(path.name, path.read_text()[-1500:])


def _shared_pool(outs: dict[str, Path], ids: dict[str, int], ctl: ControllerProc,
                 rounds: int = 4) -> tuple[Store, dict[str, JobRecord], PoolRecord]:
    """Wait until both drivers ran `rounds` rounds; then the DB, each user's job, and the
    one pool both jobs were placed in (asserted)."""
    from slurmrl.db import Store

    _wait(lambda: all(len(_rounds(o)) >= rounds for o in outs.values()), 180,
          f"both drivers to finish {rounds} rounds:\n" + "\n".join(
              read(o) for o in outs.values()) + read(ctl.log))
    store = Store(ctl.db)
    placed = {u: store.job(i) for u, i in ids.items()}
    pool_ids = {j.pool_id for j in placed.values() if j is not None}
    assert len(pool_ids) == 1 and None not in pool_ids, "both jobs share one pool"
    pool = store.pool(pool_ids.pop() or 0)
    assert pool is not None
    return store, {u: j for u, j in placed.items() if j is not None}, pool


def test_two_users_share_a_pool_with_resident_services(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:

    # the users declare mostly idle steps (--rl-profile), so the default policy pairs the
    # jobs on that prior at once; the drivers are in fact busy nearly all the time, so
    # the site and both users accept up to 3x
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir, SLURMRL_LIMITS__MAX_SLOWDOWN="3")
    ids: dict[str, int] = {}
    try:
        outs = _submit_drivers(jobs, shared_tmp, ctl, POOL_DRIVER, "pool",
                               ["--rl-gpus=4", "--rl-model=tiny", "--rl-max-slowdown=3",
                                PROFILE], ids)
        store, _, pool = _shared_pool(outs, ids, ctl)
        assert pool.slurm_job_id is not None and pool.gpus == 4
        steps_then = {(s.job_id, s.role): s.step_id
                      for s in store.services(pool_id=pool.pool_id, live_only=True)}
        assert len(steps_then) == 4 and None not in steps_then.values()

        # each service runs as its job's user, on the pool's GPUs
        from slurmrl.worker.handle import ServiceHandle
        pids: dict[tuple[int, str], int] = {}
        for s in store.services(pool_id=pool.pool_id, live_only=True):
            job = store.job(s.job_id)
            assert job is not None
            st = ServiceHandle(s.address, job.secret, str(job.job_id), s.role).status()
            pids[(s.job_id, s.role)] = int(st["pid"])
            assert _proc_field(int(st["pid"]), "Uid").split()[0] == str(job.uid)
            assert _environ(int(st["pid"]))["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"

        # more rounds: every handoff parked the partner and its state survived
        n = {u: len(_rounds(o)) for u, o in outs.items()}
        _wait(lambda: all(len(_rounds(o)) >= n[u] + 3 for u, o in outs.items()), 120,
              "three more rounds each")
        for out in outs.values():
            assert all(r["same"] for r in _rounds(out)), read(out)
        log = read(ctl.log)
        for user in ("rlalice", "rlbob"):
            other = ids["rlbob" if user == "rlalice" else "rlalice"]
            assert log.count(f"handoff to job {ids[user]} ") >= 3
            assert f"parked [({other}, " in log
        # no service was relaunched between phases
        assert {(s.job_id, s.role): s.step_id for s in store.services(
            pool_id=pool.pool_id, live_only=True)} == steps_then

        # scancel alice's RL job: her services stop, bob carries on in the pool
        jobs.run(["scancel", str(ids["rlalice"])])  # type: ignore[attr-defined]
        alice_pids = [p for (j, _), p in pids.items() if j == ids["rlalice"]]
        _wait(lambda: not any(Path(f"/proc/{p}").exists() for p in alice_pids), 60,
              "alice's services to stop")
        b_now = len(_rounds(outs["rlbob"]))
        _wait(lambda: len(_rounds(outs["rlbob"])) >= b_now + 2, 60, "bob to go on alone",
              lambda: "bob's driver:\n" + read(outs["rlbob"])[-1500:]
              + "\ncontroller log:\n" + read(ctl.log)[-6000:])
        _wait(lambda: [s.job_id for s in store.services(pool_id=pool.pool_id,
                                                         live_only=True)] == [ids["rlbob"]] * 2,
              30, "only bob's services to be listed live")
        assert jobs.state(pool.slurm_job_id) == "RUNNING"  # type: ignore[attr-defined]

        # scancel the pool: bob's driver fails with a clear error, nothing stays up
        jobs.run(["scancel", str(pool.slurm_job_id)])  # type: ignore[attr-defined]
        _wait(lambda: "ERROR" in read(outs["rlbob"]), 60, "bob's driver to get an error")
        err = read(outs["rlbob"])
        assert "ServiceLost" in err or "LeaseRevoked" in err or "job-ended" in err, err
        # Slurm may still show the pool COMPLETING when the controller notices (22.05
        # says no more then: docs/pools.md, "Endings")
        assert re.search(rf"pool allocation \(Slurm job {pool.slurm_job_id}\) "
                         r"(cancelled|is ending \(COMPLETING)", err), err
        bob_pids = [p for (j, _), p in pids.items() if j == ids["rlbob"]]
        _wait(lambda: not any(Path(f"/proc/{p}").exists() for p in bob_pids), 30,
              "bob's services to end")
        _wait(lambda: jobs.state(ids["rlbob"]) in (None, "FAILED", "COMPLETED"),  # type: ignore[attr-defined]
              30, "bob's driver job to end")
        closed = store.pool(pool.pool_id)
        assert closed is not None and closed.state == "closed"
        _wait(lambda: store.services(pool_id=pool.pool_id, live_only=True) == [], 30,
              "the DB to list no live service in the closed pool")
    finally:
        ctl.stop()
        for path in run_dir.glob("*.log"):
            print(path.name, path.read_text()[-1500:])


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


DISAGG_DRIVER = '''#!{python}
"""A disaggregated job: rollout on its rollout set, train and sync on its trainer set."""
import json, random, sys, time, slurmrl
job = slurmrl.connect(url=sys.argv[1])
ro, tr = job.service("rollout"), job.service("trainer")
rng = random.Random(job.job_id)
prompts = ["1+2=", "3*4=", "9-7=", "5+5="]
synced = None
try:
    for i in range(10000):
        with job.phase("rollout"):
            out = ro.generate(prompts, max_tokens=8, seed=11)
            # the rollout runs with the weights of the last sync, staged or not
            same = synced is None or ro.export_weights() == synced
        with job.phase("train"):
            tr.train_step([{{"prompt_ids": list(s.prompt_ids),
                            "completion_ids": list(s.completion_ids),
                            "advantage": 1.0 if k % 2 else -1.0}}
                           for k, s in enumerate(out.samples)])
        with job.phase("sync") as lease:
            synced = tr.export_weights()
            tr.sync_weights_to(ro)
            st = ro.status()
            print(json.dumps({{"round": i, "same": same, "sync_gpus": list(lease.gpus),
                              "rollout": st["residency"],
                              "staged": st["weights_staged"]}}), flush=True)
        time.sleep(rng.uniform(0.0, 0.3))  # no lock-step rhythm between the two jobs
except Exception as exc:
    print("ERROR", type(exc).__name__, exc, flush=True)
    sys.exit(3)
'''


def test_a_job_waits_while_no_node_has_its_gpus_free_and_runs_once_one_has(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """On partition `spread` (Slurm nodes n2 and n3 of 2 GPUs each), another user's
    batch jobs hold one GPU of each node: the partition has 2 GPUs free, but a pool
    needs all its GPUs on one node. An RL job of --rl-gpus=2 waits, PoolPending with
    the reason, which its user sees in `slurmrl status`, and no pool is submitted for
    it, even past the pool start timeout (before, the pool was submitted, Slurm kept it
    pending, and at the timeout it was cancelled and the job refused). Once one of the
    other jobs ends, the RL job's pool opens on that node and its driver runs."""
    import json

    from slurmrl.db import Store
    from tests.integration.controller_harness import VENV_PY

    blockers = _one_gpu_taken_on_each_spread_node(jobs)
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir,
                           SLURMRL_SLURM__POOL_PARTITION="spread",
                           SLURMRL_SLURM__STEP_LAUNCH_TIMEOUT_S="20")
    ids: dict[str, int] = {}
    try:
        job_id, out = _one_driver(jobs, shared_tmp, ctl, "frag",
                                  ["--rl-gpus=2", "--rl-model=tiny"])
        ids["rlalice"] = job_id
        store = Store(ctl.db)
        want = "PoolPending: no node of partition 'spread' has 2 GPUs free (at most 1 on one)"
        _wait(lambda: (j := store.job(job_id)) is not None and j.reason == want, 90,
              "the job to wait for room", lambda: read(ctl.log)[-4000:])
        seen = jobs.run([VENV_PY, "-m", "slurmrl.cli.main", "status", "--controller",  # type: ignore[attr-defined]
                         ctl.url, "--json", "-j", str(job_id)], user="rlalice")
        assert seen.returncode == 0, seen.stderr
        (shown,) = json.loads(seen.stdout)["jobs"]
        assert (shown["state"], shown["reason"]) == ("PD", want), shown
        # a job of 3 GPUs, more than any node of the partition has, is refused at once
        big, _ = _one_driver(jobs, shared_tmp, ctl, "frag3", ["--rl-gpus=3", "--rl-model=tiny"],
                             user="rlbob")
        ids["rlbob"] = big
        _wait(lambda: (j := store.job(big)) is not None and j.state.value == "F",
              60, "the 3-GPU job to be refused", lambda: read(ctl.log)[-4000:])
        assert store.job(big).reason == (  # type: ignore[union-attr]
            "refused: --rl-gpus=3 is more than any node of partition 'spread' has (the "
            "largest has 2); a pool's GPUs are one node's")
        # past the pool start timeout: still waiting, never refused, no pool asked for
        time.sleep(25)
        job = store.job(job_id)
        assert job is not None and job.state.value == "PD" and job.pool_id is None, job
        assert store.pools() == []
        queued = jobs.run(["squeue", "-h", "-p", "spread", "-n", "slurmrl-pool",  # type: ignore[attr-defined]
                           "-o", "%i"])
        assert queued.returncode == 0 and queued.stdout.split() == [], queued.stdout
        # n3's other job ends: the next round opens the RL job's pool there
        jobs.cancel_and_wait([blockers[1]])  # type: ignore[attr-defined]
        _wait(lambda: len(_rounds(out)) >= 2, 120, "the driver to run in its pool",
              lambda: read(out) + read(ctl.log)[-4000:])
        job = store.job(job_id)
        assert job is not None and job.pool_id is not None and job.reason == ""
        pool = store.pool(job.pool_id)
        assert pool is not None and pool.nodes == ("n3",) and pool.gpus == 2
        assert "ERROR" not in read(out), read(out)
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)
        jobs.cancel_and_wait(blockers)  # type: ignore[attr-defined]


def test_a_younger_job_leaves_the_node_an_older_one_waits_for(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """On partition `spread` (n2, n3 of 2 GPUs), another user's jobs hold one GPU of
    each node. An RL job of 2 GPUs waits for room and holds n2 (the first node nearest
    to having room); a younger RL job of 1 GPU then gets its pool on n3, not on n2,
    whose free GPU it would take otherwise (best fit, n2 first). Once n2's other job
    ends, the older RL job's pool opens there."""
    from slurmrl.db import Store

    blockers = _one_gpu_taken_on_each_spread_node(jobs)
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir,
                           SLURMRL_SLURM__POOL_PARTITION="spread")
    ids: dict[str, int] = {}
    try:
        store = Store(ctl.db)
        old, old_out = _one_driver(jobs, shared_tmp, ctl, "old",
                                   ["--rl-gpus=2", "--rl-model=tiny", "--rl-mux=off"])
        ids["rlalice"] = old
        _wait(lambda: (j := store.job(old)) is not None and j.reason.startswith(
            "PoolPending: no node"), 90, "the older job to wait for room",
            lambda: read(ctl.log)[-4000:])
        young, young_out = _one_driver(jobs, shared_tmp, ctl, "young",
                                       ["--rl-gpus=1", "--rl-model=tiny", "--rl-mux=off"],
                                       user="rlbob")
        ids["rlbob"] = young
        _wait(lambda: len(_rounds(young_out)) >= 2, 120, "the younger job to run",
              lambda: read(young_out) + read(ctl.log)[-4000:])
        placed = store.job(young)
        assert placed is not None and placed.pool_id is not None
        pool = store.pool(placed.pool_id)
        assert pool is not None and pool.nodes == ("n3",), pool
        assert store.job(old).pool_id is None  # type: ignore[union-attr]
        jobs.cancel_and_wait([blockers[0]])  # type: ignore[attr-defined]
        _wait(lambda: len(_rounds(old_out)) >= 2, 120, "the older job to run on n2",
              lambda: read(old_out) + read(ctl.log)[-4000:])
        job = store.job(old)
        assert job is not None and job.pool_id is not None
        assert store.pool(job.pool_id).nodes == ("n2",)  # type: ignore[union-attr]
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)
        jobs.cancel_and_wait(blockers)  # type: ignore[attr-defined]


def test_a_job_asking_for_a_gpu_type_gets_a_pool_of_that_type(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """On partition `spread`, whose nodes' GPUs have a GRES type each (n2 `fake_a`, n3
    `fake_b`): an RL job of `--rl-gpus=fake_b:2` gets its pool on n3, as Slurm's typed
    GRES (`--gres=gpu:fake_b:2`), and its driver runs there; one asking for a type no
    node has is refused at once, told the types there are."""
    from slurmrl.db import Store
    from tests.integration.controller_harness import VENV_PY

    ctl = _pool_controller(shared_tmp, slurm_env, run_dir,
                           SLURMRL_SLURM__POOL_PARTITION="spread")
    ids: dict[str, int] = {}
    try:
        typed, out = _one_driver(jobs, shared_tmp, ctl, "typed",
                                 ["--rl-gpus=fake_b:2", "--rl-model=tiny"])
        nosuch, _ = _one_driver(jobs, shared_tmp, ctl, "nosuch",
                                ["--rl-gpus=nosuch:1", "--rl-model=tiny"], user="rlbob")
        ids.update(rlalice=typed, rlbob=nosuch)
        store = Store(ctl.db)
        _wait(lambda: len(_rounds(out)) >= 2, 120, "the typed job's driver to run",
              lambda: read(out) + read(ctl.log)[-4000:])
        job = store.job(typed)
        assert job is not None and job.request.gpu_type == "fake_b" and job.pool_id
        pool = store.pool(job.pool_id)
        assert pool is not None and pool.nodes == ("n3",) and pool.slurm_job_id
        shown = jobs.run(["scontrol", "-d", "show", "job", str(pool.slurm_job_id)])  # type: ignore[attr-defined]
        assert "gpu:fake_b:2" in shown.stdout, shown.stdout
        row = jobs.run([VENV_PY, "-m", "slurmrl.cli.main", "status", "--controller",  # type: ignore[attr-defined]
                        ctl.url, "-h", "-j", str(typed), "-o", "jobid,gpus"],
                       user="rlalice")
        assert row.stdout.split() == [str(typed), "fake_b:2"], row.stdout + row.stderr
        _wait(lambda: (j := store.job(nosuch)) is not None
              and j.state.value == "F", 60, "the job of an unknown type to be refused",
              lambda: read(ctl.log)[-4000:])
        assert store.job(nosuch).reason == (  # type: ignore[union-attr]
            "refused: no node of partition 'spread' has GPUs of type 'nosuch' (its types: "
            "fake_a, fake_b)")
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)


def _workers_of(allocation: int) -> list[int]:
    """Pids of slurmrl service workers running in Slurm allocation `allocation`."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile
            continue
        if b"slurmrl.worker" in cmd and f"SLURM_JOB_ID={allocation}".encode() in env:
            pids.append(int(proc.name))
    return pids


def test_a_controller_killed_while_a_jobs_services_launch_places_it_anew_after_a_restart(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    """The controller is `kill -9`ed while an RL job's services are being launched into
    the pool opened for it (a service record still `starting`, the job not placed yet),
    and restarted on the same DB. The job is not lost: it is placed anew and its driver
    runs. Nothing of the interrupted launch is left: the pool opened for it (no member)
    is cancelled, with any worker its steps had started, and no step or allocation of
    it runs on."""
    from slurmrl.db import Store

    ctl = _pool_controller(shared_tmp, slurm_env, run_dir)
    ids: dict[str, int] = {}
    try:
        job_id, out = _one_driver(jobs, shared_tmp, ctl, "crash",
                                  ["--rl-gpus=2", "--rl-model=tiny"])
        ids["rlalice"] = job_id
        store = Store(ctl.db)

        def launching() -> bool:
            job = store.job(job_id)
            return (job is not None and job.pool_id is None
                    and any(s.state == "starting" for s in store.services(job_id=job_id)))

        deadline = time.monotonic() + 90
        while not launching():
            assert time.monotonic() < deadline, "the job's services never seen launching:\n" \
                + read(ctl.log)[-4000:]
            time.sleep(0.02)
        ctl.kill9()
        (old,) = store.pools()
        assert old.slurm_job_id is not None and old.state == "open"
        interrupted = {s.service_id for s in store.services(job_id=job_id)}
        ctl.start()

        # the job is placed anew and its driver runs in its (new) pool
        _wait(lambda: len(_rounds(out)) >= 3, 150, "the driver to run after the restart",
              lambda: read(out) + read(ctl.log)[-6000:])
        assert "ERROR" not in read(out) and all(r["same"] for r in _rounds(out)), read(out)
        job = store.job(job_id)
        assert job is not None and job.state.value == "R" and job.pool_id is not None
        assert job.pool_id != old.pool_id
        live = store.services(job_id=job_id, live_only=True)
        assert sorted(s.role for s in live) == ["rollout", "trainer"]
        assert not interrupted & {s.service_id for s in live}
        # the interrupted launch's pool is closed and its allocation gone, with any
        # worker it had started; no step of it runs anywhere
        _wait(lambda: (p := store.pool(old.pool_id)) is not None and p.state == "closed",
              60, "the interrupted launch's pool to close", lambda: read(ctl.log)[-4000:])
        _wait(lambda: jobs.state(old.slurm_job_id) in (None, "CANCELLED", "COMPLETED"),  # type: ignore[attr-defined]
              60, f"allocation {old.slurm_job_id} to end")
        _wait(lambda: _workers_of(old.slurm_job_id or 0) == [], 60,
              "the interrupted launch's workers to end")
        steps = jobs.run(["squeue", "-h", "-s", "-o", "%j"])  # type: ignore[attr-defined]
        assert steps.returncode == 0
        assert not [n for n in steps.stdout.split()
                    if any(n.startswith(f"slurmrl-{sid}-") for sid in interrupted)], steps.stdout
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)


def test_disaggregated_sync_holds_the_trainer_set_and_stages_into_a_parked_rollout(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    from slurmrl.db import Store

    # busy drivers: see the test above
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir, SLURMRL_LIMITS__MAX_SLOWDOWN="3")
    ids: dict[str, int] = {}
    try:
        outs = _submit_drivers(jobs, shared_tmp, ctl, DISAGG_DRIVER, "disagg",
                               ["--rl-gpus=4", "--rl-model=tiny", "--rl-layout=disaggregated:2",
                                "--rl-max-slowdown=3", PROFILE], ids)
        # a sync is staged when the partner's rollout parked this job's rollout after its
        # own rollout ended: timing decides in which round, so wait for one (or time out)
        _wait(lambda: all(len(_rounds(o)) >= 6 for o in outs.values())
              and any(r["staged"] for o in outs.values() for r in _rounds(o)), 240,
              "both drivers to finish 6 rounds, one sync staged:\n" + "\n".join(
                  read(o) for o in outs.values()) + read(ctl.log))
        store = Store(ctl.db)
        pool_ids = {store.job(i).pool_id for i in ids.values()}  # type: ignore[union-attr]
        assert len(pool_ids) == 1 and None not in pool_ids, "both jobs share one pool"
        rounds = {u: _rounds(o) for u, o in outs.items()}
        for user, rs in rounds.items():
            # job-local GPUs 0,1 are the rollout set, 2,3 the trainer set
            assert all(r["sync_gpus"] == [2, 3] for r in rs), (user, rs)
            # every rollout generated with the weights its job synced last
            assert all(r["same"] for r in rs), (user, rs)
        # the partner's rollout parked this job's rollout; the sync went in regardless
        staged = [r for rs in rounds.values() for r in rs if r["staged"]]
        assert staged and all(r["rollout"] in ("parked", "dropped") for r in staged), rounds
        log = read(ctl.log)
        for job_id in ids.values():
            syncs = re.findall(rf"handoff to job {job_id} \(sync\): [^\n]*", log)
            assert all(f"({job_id}, 'rollout')" not in s.split("activated")[1]
                       for s in syncs), syncs
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)


#: a site pairing policy (docs/site-policies.md, "Writing one") that places every job in
#: a staggered pool: one GPU more than the job, the first member from GPU 0, the second
#: from GPU 1. The default policy opens such pools only for rollouts that shrink through
#: a tail, which the controller's do not; this one lets the test drive the controller's
#: side of them (offsets enacted, services pinned, leases kept in each window).
STAGGERED_POLICY = '''
from policies.base import Action, Placement, PoolMode


class Staggered:
    name = "staggered-test"
    mode = PoolMode.LEASE

    def place(self, snapshot):
        out, opened = [], {}
        for job in snapshot.waiting:
            g = job.request.gpus
            pool = next((p for p in snapshot.pools
                         if len(p.members) == 1 and p.gpus == g + 1), None)
            if pool is not None:
                off = 1 if (pool.offsets or (0,))[0] == 0 else 0
                out.append(Placement(job.job_id, Action.JOIN, pool.pool_id, gpu_offset=off))
            elif g in opened:
                out.append(Placement(job.job_id, Action.OPEN, opened.pop(g), g + 1,
                                     gpu_offset=1))
            else:
                opened[g] = -1 - len(out)
                out.append(Placement(job.job_id, Action.OPEN, opened[g], g + 1))
        return out
'''


def test_a_staggered_placement_runs_each_job_on_its_own_window_of_the_pool(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:

    (shared_tmp / "staggertest.py").write_text(STAGGERED_POLICY)
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir,
                           SLURMRL_POLICIES__PAIRING="staggertest:Staggered",
                           PYTHONPATH=str(shared_tmp))
    ids: dict[str, int] = {}
    try:
        outs = _submit_drivers(jobs, shared_tmp, ctl, POOL_DRIVER, "stagger",
                               ["--rl-gpus=2", "--rl-model=tiny", "--rl-max-slowdown=3",
                                PROFILE], ids)
        store, placed, pool = _shared_pool(outs, ids, ctl)
        assert pool.gpus == 3, "a pool one GPU larger than each job"
        windows = {j.job_id: j.pool_gpus for j in placed.values()}
        assert sorted(windows.values()) == [(0, 1), (1, 2)]
        # each job's services run on its own window, pinned to those pool GPUs
        for s in store.services(pool_id=pool.pool_id, live_only=True):
            assert tuple(s.gpus) == windows[s.job_id], (s, windows)
        # and every lease it was granted lay within it, with no GPU ever held twice
        leases = store.leases(pool_id=pool.pool_id)
        assert {le.job_id for le in leases if le.gpus} == set(windows)
        for le in leases:
            assert set(le.gpus) <= set(windows[le.job_id]), (le, windows)
        from slurmrl.leases.invariants import check_history
        check_history(store.intervals(pool.pool_id))
        assert all(r["same"] for o in outs.values() for r in _rounds(o))
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)


TAIL_DRIVER = '''#!{python}
"""A rollout run as two replicas: its tail gives the finished replica's GPU away (or, in
rounds, the replica its unfinished sequences moved off). Once the test creates `grow`
beside this script, rlbob's job takes GPU 1 and holds it until rlalice's rollout has
begun on GPU 0 alone (she marks it with a file), then leaves it for three seconds (a
long reward check); rlalice runs slow rollouts only, every other one in rounds, and one
that began on GPU 0 takes GPU 1 back: between rounds, or without rounds while
micro-batches wait."""
import getpass, json, os, sys, time, slurmrl
job = slurmrl.connect(url=sys.argv[1])
ro, tr = job.service("rollout"), job.service("trainer")
prompts = [f"{{k}}+{{k}}=" for k in range(48)]  # 3 micro-batches on 2 replicas: a tail
here = os.path.dirname(os.path.abspath(__file__))
grow, on0 = os.path.join(here, "grow"), os.path.join(here, "alice-on-0")
last, began_on_0 = None, 0
try:
    for i in range(100000):
        # start on whatever part of the rollout set is free; every other rollout in
        # rounds of 4 tokens, its unfinished sequences moved onto the fewest replicas
        rounds, slow = (4 if i % 2 else None), 0.0
        if os.path.exists(grow):
            if getpass.getuser() == "rlbob":
                with job.phase("rollout", min_gpus=1) as lease:
                    if 1 in lease.gpus:
                        lease.shrink(gpus=[1])
                        t0 = time.monotonic()
                        while not os.path.exists(on0) and time.monotonic() - t0 < 20:
                            time.sleep(0.05)
                time.sleep(3.0)
                continue
            time.sleep(0.1)
            slow = 0.2
        with job.phase("rollout", min_gpus=1) as lease:
            held, most = list(lease.gpus), [len(lease.gpus)]
            if slow:  # those that begin on GPU 0 alone alternate: in rounds, and not
                rounds = 1 if began_on_0 % 2 else None
                if held == [0]:
                    began_on_0 += 1
                    open(on0, "w").close()

            def tail(left):
                most.append(len(lease.gpus))  # the GPUs the round that ended ran on
                time.sleep(slow)

            out = [s.completion_ids for s in ro.generate(
                prompts, max_tokens=16, seed=11, micro_batch=4 if slow else 16,
                round_tokens=rounds, on_tail=tail, poll_s=0.1).samples]
            # same weights and seed: the same outputs, however the batch was split
            print(json.dumps({{"round": i, "same": last is None or out == last,
                              "held": held, "kept": list(lease.gpus), "rounds": rounds,
                              "most": max(most), "slow": bool(slow),
                              "handle": type(ro).__name__}}), flush=True)
            last = out
            # only rlalice's slow rollouts mark it; rlbob may not remove her file (a
            # rollout of his that began before `grow` appeared ends after it did)
            if slow and os.path.exists(on0):
                os.remove(on0)
        if slow:
            continue  # rollouts only: a training would wait for rlbob's GPU 1 each time
        with job.phase("train"):
            tr.train_step([{{"prompt_ids": [1], "completion_ids": [2, 3],
                            "advantage": 0.0}}])
except Exception as exc:
    print("ERROR", type(exc).__name__, exc, flush=True)
    sys.exit(3)
'''


def _evidence(outs: dict[str, Path], log: Path | None = None) -> Callable[[], str]:
    """What a failed wait shows: the tail of each driver's output (and of `log`)."""
    return lambda: "\n".join(read(o)[-1500:] for o in outs.values()) + (
        read(log)[-4000:] if log is not None else "")


def _rollout_overlaps(store: Store, pool_id: int) -> list[tuple[int, int]]:
    """(lease, lease) pairs of two jobs' rollout leases holding different GPUs of the
    pool at the same time."""
    leases = {le.lease_id: le for le in store.leases(pool_id=pool_id)}
    ivs = [iv for iv in store.intervals(pool_id)
           if iv.lease_id in leases and leases[iv.lease_id].phase is Phase.ROLLOUT]
    out = []
    for a in ivs:
        for b in ivs:
            ja, jb = leases[a.lease_id].job_id, leases[b.lease_id].job_id
            if ja < jb and a.gpu != b.gpu and max(a.start, b.start) < min(
                    a.end or float("inf"), b.end or float("inf")):
                out.append((a.lease_id, b.lease_id))
    return out


def test_a_rollout_tail_hands_its_finished_replicas_gpus_to_the_partners_rollout(
    shared_tmp: Path, slurm_env: dict[str, str], jobs: object, run_dir: Path,
) -> None:
    from slurmrl.db import Store
    from slurmrl.leases.invariants import check_history

    # rollouts as replicas of one GPU each (services.rollout_replica_gpus); busy drivers,
    # paired on their declared profile: see test_two_users_share_a_pool_with_resident_services
    ctl = _pool_controller(shared_tmp, slurm_env, run_dir, SLURMRL_LIMITS__MAX_SLOWDOWN="3",
                           SLURMRL_SERVICES__ROLLOUT_REPLICA_GPUS="1")
    ids: dict[str, int] = {}
    try:
        outs = _submit_drivers(jobs, shared_tmp, ctl, TAIL_DRIVER, "tail",
                               ["--rl-gpus=2", "--rl-model=tiny", "--rl-max-slowdown=3",
                                PROFILE], ids)
        store, placed, pool = _shared_pool(outs, ids, ctl)
        assert pool.gpus == 2
        # each job: a rollout replica on each of its GPUs and one trainer over both
        for job in placed.values():
            mine = sorted((s.role, tuple(s.gpus)) for s in store.services(
                job_id=job.job_id, live_only=True))
            assert mine == [("rollout", (0,)), ("rollout", (1,)), ("trainer", (0, 1))], mine
        # the partner's rollout ran on a GPU this job's tail had given back, beside it
        _wait(lambda: _rollout_overlaps(Store(ctl.db), pool.pool_id), 120,
              "two jobs' rollouts to hold the pool's two GPUs at once",
              _evidence(outs, ctl.log))
        rounds = {u: _rounds(o) for u, o in outs.items()}
        for user, rs in rounds.items():
            assert all(r["handle"] == "ReplicatedRollout" for r in rs), rs
            assert all(r["same"] for r in rs), (user, rs)  # split or not, same outputs
        shrunk = [r for rs in rounds.values() for r in rs
                  if len(r["held"]) == 2 and len(r["kept"]) == 1]  # type: ignore[arg-type]
        assert shrunk, rounds

        # in rounds, the tail is consolidated: 22 of the 48 sequences are unfinished
        # after the first 4 tokens (the untrained tiny model, seed 11: its weights do
        # not change here), which fits one replica, so a rollout that began on both
        # GPUs ends on one; and its outputs are those of the plain split
        def consolidated() -> list[dict[str, object]]:
            return [r for o in outs.values() for r in _rounds(o)
                    if r["rounds"] and len(r["held"]) == 2]  # type: ignore[arg-type]

        _wait(consolidated, 120, "a rollout in rounds that began on both GPUs",
              _evidence(outs))
        for r in consolidated():
            assert r["kept"] == [0] and r["same"], r

        # a rollout that began on GPU 0 alone (rlbob held GPU 1) took GPU 1 once rlbob
        # left it for his reward check, with one engine's outputs: in rounds, between
        # them; without rounds (12 micro-batches of 4), while micro-batches waited
        (shared_tmp / "grow").write_text("")

        def grown() -> list[dict[str, object]]:
            return [r for r in _rounds(outs["rlalice"])
                    if r["slow"] and r["held"] == [0] and r["most"] == 2]

        _wait(lambda: {bool(r["rounds"]) for r in grown()} == {True, False}, 180,
              "rollouts that began on one GPU to grow onto two, in rounds and without",
              _evidence(outs, ctl.log))
        assert all(r["same"] for r in grown())
        assert re.search(r"\(rollout\): parked [^\n]*activated \[\(\d+, 'rollout:1'\)\]",
                         read(ctl.log))
        assert all(r["same"] for o in outs.values() for r in _rounds(o))
        # a grant on one GPU woke only the replica there
        assert re.search(r"\(rollout\): parked [^\n]*activated \[\(\d+, 'rollout:[01]'\)\]",
                         read(ctl.log)), read(ctl.log)[-4000:]
        check_history(Store(ctl.db).intervals(pool.pool_id))
    finally:
        _end_drivers_and_pools(jobs, ids, ctl, run_dir)
