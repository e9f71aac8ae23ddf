"""Contract tests of every SlurmBackend against the real local Slurm (dev cluster).

Each test runs once per backend: `command` always; `pyslurm` only where a pyslurm that
matches the installed Slurm imports (skipped otherwise, with the reason — the one skip
the issue allows). Every submitted job is recorded and scancelled at teardown.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from slurmrl.slurm import (
    BatchSpec,
    CommandBackend,
    JobInfo,
    SlurmBackend,
    SlurmError,
    SlurmJobState,
    SlurmTimeout,
    StepHandle,
    default_backend,
    pyslurm_status,
)

pytestmark = pytest.mark.integration

DEV_CONF = "/var/lib/slurmrl-dev/etc/slurm.conf"
HOSTILE = ["it's", 'a "quoted" arg', "two  spaces", "new\nline", "$(touch /tmp/pwned)",
           "`id`", "$HOME", "semi;colon", "back\\slash", "*", ""]
ECHO_ARGV = [sys.executable, "-c", "import json,sys; print(json.dumps(sys.argv[1:]))"]


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    """The environment that points Slurm's clients at the dev cluster, once it answers."""
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", DEV_CONF)
    if not os.path.exists(env["SLURM_CONF"]):
        pytest.fail(f"no Slurm config at {env['SLURM_CONF']}: run "
                    "`slurmrl dev-cluster up --state-dir /var/lib/slurmrl-dev` first")
    b = CommandBackend(env)
    for _ in range(60):
        if b.ping():
            return env
        time.sleep(0.5)
    pytest.fail("slurmctld does not answer `scontrol ping` (dev cluster down?)")


@pytest.fixture(params=["command", "pyslurm"])
def backend(request: pytest.FixtureRequest, slurm_env: dict[str, str]) -> SlurmBackend:
    if request.param == "command":
        return CommandBackend(slurm_env, timeout_s=20)
    ok, why = pyslurm_status(slurm_env)
    if not ok:
        pytest.skip(f"pyslurm backend unavailable: {why}")
    from slurmrl.slurm.pyslurm_backend import PyslurmBackend

    return PyslurmBackend(slurm_env)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user can write (jobs run as test users)."""
    d = Path(tempfile.mkdtemp(prefix="slurmrl-it-", dir="/tmp"))
    d.chmod(0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def submit(backend: SlurmBackend) -> Iterator[Callable[[BatchSpec], int]]:
    """Submit through the backend under test; cancel everything at teardown."""
    ids: list[int] = []

    def _submit(spec: BatchSpec) -> int:
        job_id = backend.submit(spec)
        ids.append(job_id)
        return job_id

    yield _submit
    # A cancel acknowledged just before a slurmctld restart can be lost (seen here:
    # the job was recovered and ran again), so repeat until Slurm shows it ended.
    pending = set(ids)
    deadline = time.monotonic() + 60
    while pending and time.monotonic() < deadline:
        for job_id in sorted(pending):
            with contextlib.suppress(SlurmError):
                job = backend.job(job_id)
                if job is None or job.state.terminal:
                    pending.discard(job_id)
                else:
                    backend.cancel(job_id)
        time.sleep(0.5)


@pytest.fixture
def steps_to_stop() -> Iterator[list[StepHandle]]:
    handles: list[StepHandle] = []
    yield handles
    for h in handles:
        h.kill()
        h.wait(timeout_s=30)  # reaps srun; its temporary stderr file goes with it


def wait_for(backend: SlurmBackend, job_id: int, states: set[SlurmJobState],
             limit_s: float = 90) -> JobInfo:
    deadline = time.monotonic() + limit_s
    seen: JobInfo | None = None
    while time.monotonic() < deadline:
        seen = backend.job(job_id)
        if seen is not None and seen.state in states:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {states}; last seen {seen}")


def sleeper(partition: str = "drivers", **kw: object) -> BatchSpec:
    return BatchSpec(command=("sleep", "300"), partition=partition, workdir="/tmp",
                     output="/dev/null", time_limit_min=10, **kw)  # type: ignore[arg-type]


# ------------------------------------------------------------------ jobs


def test_batch_job_runs_then_completes(backend: SlurmBackend, submit: Callable[..., int],
                                       shared_dir: Path) -> None:
    marker = shared_dir / "ran"
    job_id = submit(BatchSpec(script=f"sleep 2\ntouch {marker}\n", partition="drivers",
                              name="it-complete", comment="contract test", workdir="/tmp",
                              output="/dev/null", time_limit_min=5))
    running = wait_for(backend, job_id, {SlurmJobState.RUNNING})
    assert (running.partition, running.name, running.comment) == (
        "drivers", "it-complete", "contract test")
    assert running.start_time is not None and running.time_limit_min == 5
    done = wait_for(backend, job_id, {SlurmJobState.COMPLETED})
    assert done.exit_code == 0 and done.state.terminal and marker.exists()
    assert [j.job_id for j in backend.jobs([job_id])] == [job_id]


def test_gpu_job_reports_its_gpu_indices(backend: SlurmBackend,
                                         submit: Callable[..., int]) -> None:
    job_id = submit(sleeper("pools", gpus=2, name="it-gpus"))
    job = wait_for(backend, job_id, {SlurmJobState.RUNNING})
    assert len(job.gpu_indices) == 2 and set(job.gpu_indices) <= {0, 1, 2, 3}
    listed = backend.jobs([job_id])
    assert listed[0].gpu_indices == job.gpu_indices


def test_failed_job_reports_its_exit_code(backend: SlurmBackend,
                                          submit: Callable[..., int]) -> None:
    job_id = submit(BatchSpec(command=("sh", "-c", "exit 7"), workdir="/tmp",
                              output="/dev/null", time_limit_min=5))
    job = wait_for(backend, job_id, {SlurmJobState.FAILED})
    assert job.exit_code == 7


def test_jobs_filter_by_user(backend: SlurmBackend, submit: Callable[..., int]) -> None:
    alice = submit(sleeper(uid="rlalice", name="it-alice"))
    bob = submit(sleeper(uid="rlbob", name="it-bob"))
    mine = backend.jobs(user="rlalice")
    assert alice in {j.job_id for j in mine} and bob not in {j.job_id for j in mine}
    assert all(j.user == "rlalice" for j in mine)
    a = backend.job(alice)
    assert a is not None and (a.user, a.uid) == ("rlalice", 1002)


def test_unknown_job_is_none_and_nodes_are_listed(backend: SlurmBackend) -> None:
    assert backend.job(99_999_999) is None
    assert backend.jobs([99_999_999]) == []
    nodes = {n.name: n for n in backend.nodes()}
    assert nodes["localhost"].gpus == 4 and nodes["localhost"].cpus >= 2
    assert {"drivers", "pools"} <= set(nodes["localhost"].partitions)
    assert backend.ping() is True
    assert backend.version()[:2] >= (22, 5)


def test_batch_command_gets_hostile_arguments_literally(
        backend: SlurmBackend, submit: Callable[..., int], shared_dir: Path) -> None:
    out = shared_dir / "argv.json"
    job_id = submit(BatchSpec(command=(*ECHO_ARGV, *HOSTILE), workdir="/tmp",
                              output=str(out), time_limit_min=5))
    wait_for(backend, job_id, {SlurmJobState.COMPLETED})
    assert json.loads(out.read_text()) == HOSTILE
    assert not os.path.exists("/tmp/pwned")


def test_json_and_scontrol_query_paths_agree(slurm_env: dict[str, str],
                                             submit: Callable[..., int]) -> None:
    job_id = submit(sleeper("pools", gpus=1, name="it-paths", comment="two words"))
    via_json = CommandBackend(slurm_env, use_json=True)
    wait_for(via_json, job_id, {SlurmJobState.RUNNING})
    a = via_json.jobs([job_id])
    b = CommandBackend(slurm_env, use_json=False).jobs([job_id])
    assert a == b and len(a) == 1 and a[0].comment == "two words"
    assert CommandBackend(slurm_env, use_json=False).nodes() == via_json.nodes()


def test_a_job_name_forging_an_owner_is_refused_and_hides_no_other_job(
        slurm_env: dict[str, str], submit: Callable[..., int]) -> None:
    # scontrol -o prints the name (spaces allowed) before the real UserId=
    uid = pwd.getpwnam("rlalice").pw_uid
    forged = submit(sleeper(name=f"x UserId=root({uid})", uid="rlalice"))
    plain = submit(sleeper(name="it-plain"))
    scontrol = CommandBackend(slurm_env, use_json=False)
    wait_for(scontrol, plain, {SlurmJobState.RUNNING})
    with pytest.raises(SlurmError, match="UserId= twice"):
        scontrol.job(forged)
    listed = {j.job_id for j in scontrol.jobs()}
    assert plain in listed and forged not in listed


def test_default_backend_is_pyslurm_only_when_it_matches(slurm_env: dict[str, str]) -> None:
    ok, why = pyslurm_status(slurm_env)
    chosen = default_backend(slurm_env)
    assert why
    assert isinstance(chosen, CommandBackend) is (not ok)


# ------------------------------------------------------------------ steps


def test_two_overlapping_steps_are_listed_with_their_ids(
        backend: SlurmBackend, submit: Callable[..., int],
        steps_to_stop: list[StepHandle]) -> None:
    job_id = submit(sleeper(cpus=2, name="it-steps"))
    wait_for(backend, job_id, {SlurmJobState.RUNNING})
    for _ in range(2):
        steps_to_stop.append(backend.launch_step(job_id, ["sleep", "300"], timeout_s=60))
    ids = [h.step_id(backend) for h in steps_to_stop]
    assert None not in ids and len(set(ids)) == 2
    listed = {s.step: s for s in backend.steps(job_id)}
    for h, sid in zip(steps_to_stop, ids, strict=True):
        assert sid in listed and listed[str(sid)].srun_pid == h.pid
        assert listed[str(sid)].state is SlurmJobState.RUNNING
    steps_to_stop[0].terminate()
    assert steps_to_stop[0].wait(timeout_s=30) is not None
    # srun has exited; slurmctld drops the step when it hears of its end (a moment
    # later on a loaded machine: one CI run still listed it right after srun exited)
    deadline = time.monotonic() + 15
    left = {s.step for s in backend.steps(job_id)}
    while ids[0] in left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = {s.step for s in backend.steps(job_id)}
    assert ids[0] not in left and ids[1] in left


def test_step_gets_hostile_argv_and_pinned_gpus_literally(
        backend: SlurmBackend, submit: Callable[..., int], shared_dir: Path,
        steps_to_stop: list[StepHandle]) -> None:
    job_id = submit(sleeper(name="it-argv"))
    wait_for(backend, job_id, {SlurmJobState.RUNNING})
    out = shared_dir / "step.json"
    h = backend.launch_step(job_id, [*ECHO_ARGV, *HOSTILE], stdout_path=str(out))
    steps_to_stop.append(h)
    assert h.wait(timeout_s=60) == 0
    assert json.loads(out.read_text()) == HOSTILE
    out2 = shared_dir / "cvd.txt"
    h2 = backend.launch_step(
        job_id, [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
        cuda_visible_devices=[2, 3], stdout_path=str(out2), env={"SLURMRL_X": "1"})
    steps_to_stop.append(h2)
    assert h2.wait(timeout_s=60) == 0
    assert out2.read_text().strip() == "2,3"


def test_a_step_sees_the_variables_it_is_given_not_the_callers_environment(
        slurm_env: dict[str, str], submit: Callable[..., int], shared_dir: Path,
        steps_to_stop: list[StepHandle]) -> None:
    # a service step runs as the job's user: with --export=ALL it saw all of the (root)
    # controller's environment
    # srun passes any variable whose name begins with "SLURM", whatever --export says
    backend = CommandBackend({**slurm_env, "SLURMRL_NOT_FOR_STEPS": "controller-only",
                              "NOT_FOR_STEPS": "controller-only"}, timeout_s=20)
    job_id = submit(sleeper(name="it-env"))
    wait_for(backend, job_id, {SlurmJobState.RUNNING})
    out = shared_dir / "env.txt"
    h = backend.launch_step(
        job_id, [sys.executable, "-c", "import os; e = os.environ; print(e.get('SLURMRL_X'),"
                 " e.get('SLURMRL_NOT_FOR_STEPS'), e.get('NOT_FOR_STEPS'), 'SLURM_JOB_ID' in e)"],
        stdout_path=str(out), env={"SLURMRL_X": "1"})
    steps_to_stop.append(h)
    assert h.wait(timeout_s=60) == 0
    assert out.read_text().split() == ["1", "None", "None", "True"]


def test_step_into_missing_job_is_a_clear_error(backend: SlurmBackend) -> None:
    left = set(Path(tempfile.gettempdir()).glob("slurmrl-step-99999999-*"))
    with pytest.raises(SlurmError, match="99999999"):
        backend.launch_step(99_999_999, ["true"], timeout_s=20, retries=0)
    # srun's stderr is in the error; its temporary file is not left behind
    assert set(Path(tempfile.gettempdir()).glob("slurmrl-step-99999999-*")) == left


# ------------------------------------------------------------ cancel/signal


def test_cancel_ends_a_running_job_and_is_idempotent(
        backend: SlurmBackend, submit: Callable[..., int]) -> None:
    job_id = submit(sleeper(name="it-cancel"))
    wait_for(backend, job_id, {SlurmJobState.RUNNING})
    backend.cancel(job_id)
    job = wait_for(backend, job_id, {SlurmJobState.CANCELLED})
    assert job.state.terminal
    backend.cancel(job_id)  # already ended: no error


def test_signal_reaches_the_batch_script_and_a_single_step(
        backend: SlurmBackend, submit: Callable[..., int], shared_dir: Path,
        steps_to_stop: list[StepHandle]) -> None:
    got = shared_dir / "got-usr1"
    script = (f"trap 'echo usr1 >> {got}; exit 0' USR1\n"
              "while true; do sleep 0.2; done\n")
    job_id = submit(BatchSpec(script=script, workdir="/tmp", output="/dev/null",
                              time_limit_min=5, name="it-signal"))
    wait_for(backend, job_id, {SlurmJobState.RUNNING})
    step_got = shared_dir / "step-usr1"
    handler = (f"import signal,time,pathlib\n"
               f"signal.signal(signal.SIGUSR1, lambda *a: pathlib.Path('{step_got}')"
               f".write_text('usr1'))\n"
               "while True: time.sleep(0.1)\n")
    h = backend.launch_step(job_id, [sys.executable, "-c", handler])
    steps_to_stop.append(h)
    sid = h.step_id(backend)
    assert sid is not None
    time.sleep(1)  # let the step install its handler
    backend.signal(job_id, "USR1", step=sid)
    for _ in range(100):
        if step_got.exists():
            break
        time.sleep(0.1)
    assert step_got.read_text() == "usr1" and not got.exists()
    h.kill()
    backend.signal(job_id, "USR1")
    wait_for(backend, job_id, {SlurmJobState.COMPLETED, SlurmJobState.CANCELLED,
                               SlurmJobState.FAILED})
    assert got.read_text().strip() == "usr1"


# ---------------------------------------------------------------- timeout


@pytest.fixture
def silent_controller(slurm_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """A config whose slurmctld port accepts connections and never answers."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    etc = tmp_path / "etc"
    shutil.copytree(Path(slurm_env["SLURM_CONF"]).parent, etc)
    conf = etc / "slurm.conf"
    lines = [ln for ln in conf.read_text().splitlines()
             if not ln.startswith("SlurmctldPort=")]
    lines.append(f"SlurmctldPort={srv.getsockname()[1]}")
    conf.write_text("\n".join(lines) + "\n")
    yield {**slurm_env, "SLURM_CONF": str(conf)}
    stop.set()
    t.join()
    for c in conns:
        c.close()
    srv.close()


def test_silent_controller_gives_slurm_timeout_not_a_hang(
        silent_controller: dict[str, str]) -> None:
    b = CommandBackend(silent_controller, timeout_s=2)
    with pytest.raises(SlurmTimeout, match="no answer within 2 s"):
        b.jobs()
    with pytest.raises(SlurmTimeout):
        b.nodes()
    assert b.ping() is False


def test_step_launch_against_silent_controller_retries_then_times_out(
        silent_controller: dict[str, str]) -> None:
    b = CommandBackend(silent_controller, timeout_s=2)
    with pytest.raises(SlurmTimeout) as e:
        b.launch_step(1, ["true"], timeout_s=3, retries=1)
    assert "srun" in " ".join(e.value.argv)
