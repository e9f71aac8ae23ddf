"""Shared fixtures of the integration tier: the real local Slurm and jobs submitted to it.

- `dev_cluster` (session): brings the dev cluster up (idempotent, so a cluster that
  `make integration` already started is reused) and exports SLURM_CONF for every
  subprocess of the session. A cluster that cannot come up fails the tests, never skips.
- `slurm_env` (session): a clean environment for Slurm clients (SLURM_CONF set, the
  runner's own SLURMRL_* variables removed so jobs see only what the plugin exports).
- `jobs` (function): a `JobFactory` that records every job it submits and scancels them
  all at teardown, pyslurm-style.
- `shared_tmp` (function): a world-writable scratch dir for job output of other users.
- `controller` (function): a real `slurmrl controller` process (tests/integration/
  controller_harness.py) on a fresh DB, 30 s lease timeout; a test file that needs other
  settings defines its own `controller`.

Add new fixtures below; keep them on real processes (no mocks in this tier).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from slurmrl.devcluster import DevCluster, DevClusterError
from tests.integration.controller_harness import ControllerProc, env_for_controller

STATE_DIR = Path(os.environ.get("SLURMRL_DEV_STATE", "/var/lib/slurmrl-dev"))
COMMAND_TIMEOUT_S = 30.0
JOB_WAIT_S = 60.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def pytest_configure(config: pytest.Config) -> None:
    # a SIGTERM (`make`'s trap on Ctrl-C or a CI timeout) ends the run as Ctrl-C does:
    # the fixtures' teardown stops the controllers, drivers and jobs they started
    import signal

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Everything in this directory runs on the real cluster.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def dev_cluster() -> Iterator[DevCluster]:
    cluster = DevCluster(STATE_DIR)
    try:
        cluster.up()
    except DevClusterError as exc:
        pytest.fail(f"the dev cluster did not come up: {exc}")
    stop = threading.Event()
    healer = threading.Thread(target=_heal, args=(cluster, stop), daemon=True)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in cluster.env().items():
            mp.setenv(key, value)
        healer.start()
        try:
            yield cluster
        finally:
            stop.set()
            healer.join(10)


def _heal(cluster: DevCluster, stop: threading.Event) -> None:
    """Resume a node Slurm drains as "Kill task failed" (a slurmstepd that hung at a
    pool's cancel on this loaded machine: DevCluster.resume_kill_task_failed), within
    seconds, as a site's admin would: otherwise one hung step daemon fails every later
    test that needs the node. Each resume is reported on stderr (shown with -s or on a
    failure's captured output)."""
    while not stop.wait(2.0):
        for node in cluster.resume_kill_task_failed():
            print(f"[dev cluster] resumed node {node}, drained as 'Kill task failed'",
                  file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def slurm_env(dev_cluster: DevCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMRL_")}
    env.update(dev_cluster.env())
    return env


@dataclass(frozen=True)
class Submission:
    """The outcome of one sbatch/srun call."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    job_id: int | None


@dataclass
class JobFactory:
    """Submits jobs (as root or as another user), remembers them, cancels them all."""

    env: dict[str, str]
    workdir: Path
    job_ids: list[int] = field(default_factory=list)

    def run(self, argv: Sequence[str], *, user: str | None = None,
            input_text: str | None = None, timeout_s: float = COMMAND_TIMEOUT_S,
            ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command in the cluster's environment."""
        full = ["runuser", "-u", user, "--", *argv] if user else list(argv)
        return subprocess.run(full, capture_output=True, text=True, env=self.env,
                              cwd=self.workdir, timeout=timeout_s, input=input_text,
                              check=False)

    def sbatch(self, args: Sequence[str], *, user: str | None = None,
               script: str | None = None) -> Submission:
        """`sbatch --parsable ARGS [script]`; a unique --job-name unless ARGS has one."""
        argv = ["sbatch", "--parsable"]
        if not any(a.startswith(("--job-name", "-J")) for a in args):
            argv.append(f"--job-name=t-{uuid.uuid4().hex[:10]}")
        argv.extend(args)
        if script is not None:
            path = self.workdir / f"job-{uuid.uuid4().hex[:8]}.sh"
            path.write_text(script)
            path.chmod(0o755)
            argv.append(str(path))
        proc = self.run(argv, user=user)
        job_id = None
        match = re.match(r"^(\d+)", proc.stdout.strip())
        if proc.returncode == 0 and match:
            job_id = int(match.group(1))
            self.job_ids.append(job_id)
        return Submission(tuple(argv), proc.returncode, proc.stdout, proc.stderr, job_id)

    def state(self, job_id: int) -> str | None:
        proc = self.run(["squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T"])
        out = proc.stdout.strip()
        return out or None

    def wait(self, job_id: int, timeout_s: float = JOB_WAIT_S) -> str:
        """Wait until the job is in a terminal state; return that state."""
        deadline = time.monotonic() + timeout_s
        state = None
        while time.monotonic() < deadline:
            state = self.state(job_id)
            if state is None or state in TERMINAL:
                return state or "GONE"
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} still {state} after {timeout_s:g} s")

    def jobs_named(self, name: str) -> list[str]:
        """Ids of every job (any state) called `name`."""
        proc = self.run(["squeue", "-h", "-t", "all", "-n", name, "-o", "%i"])
        return proc.stdout.split()

    def cancel_all(self) -> None:
        """scancel every job this factory submitted and wait until Slurm has ended them."""
        self.cancel_and_wait(self.job_ids)

    def cancel_and_wait(self, job_ids: Sequence[int], timeout_s: float = JOB_WAIT_S) -> None:
        """scancel `job_ids` and wait until none is pending, running or completing."""
        if not job_ids:
            return
        ids = ",".join(map(str, job_ids))
        self.run(["scancel", *map(str, job_ids)])
        deadline = time.monotonic() + timeout_s
        live: list[str] = []
        while time.monotonic() < deadline:
            proc = self.run(["squeue", "-h", "-t", "all", "-j", ids, "-o", "%i %T"])
            live = [line for line in proc.stdout.splitlines()
                    if line.split()[-1] not in TERMINAL]
            if proc.returncode == 0 and not live:
                return
            if "Invalid job id" in proc.stderr:  # every one already purged from the queue
                return
            time.sleep(0.2)
        raise AssertionError(f"jobs still not ended {timeout_s:g} s after scancel: {live}")

    def live_job_ids(self) -> list[int]:
        """Every job of anyone that is pending, running or completing."""
        proc = self.run(["squeue", "-h", "-o", "%i"])
        assert proc.returncode == 0, proc.stderr
        return [int(x) for x in proc.stdout.split()]


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory every test user can write job output into (pytest's are root-only)."""
    path = Path(tempfile.mkdtemp(prefix="slurmrl-it-"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def jobs(slurm_env: dict[str, str], shared_tmp: Path) -> Iterator[JobFactory]:
    factory = JobFactory(env=slurm_env, workdir=shared_tmp)
    yield factory
    factory.cancel_all()


@pytest.fixture
def controller(shared_tmp: Path, slurm_env: dict[str, str]) -> Iterator[ControllerProc]:
    ctl = ControllerProc(shared_tmp, env_for_controller(slurm_env), lease_timeout_s=30.0)
    ctl.start()
    yield ctl
    ctl.stop()
