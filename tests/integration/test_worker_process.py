"""A real `slurmrl worker` process on loopback, driven through ServiceHandle.

Needs no Slurm (so no `integration` marker): it starts the worker as a plain child
process, the way a pool step would run it, and checks what a driver and the controller
see: calls, park/activate with state surviving, 409 while parked, weight sync (also
into a parked rollout, as a disaggregated job's sync does), refused unauthenticated
calls, and `stop` ending the process. It lives here, not in tests/unit,
because it runs real processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.auth.tokens import mint_secret
from slurmrl.worker.handle import (
    ServiceHandle,
    ServiceParked,
    ServiceUnauthorized,
    ServiceUnreachable,
)
from tests.integration.controller_harness import _end_with_parent

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["12+7=", "3*4=", "99-9=", "5+5="]


class Worker:
    def __init__(self, tmp: Path, role: str, secret: str, *, job_id: str = "101",
                 secret_file: Path | None = None, name: str | None = None) -> None:
        self.address_file = tmp / f"{name or role}.addr"
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        args = [sys.executable, "-m", "slurmrl.cli.main", "worker", "--backend", "tiny",
                "--role", role, "--job-id", job_id, "--host", "127.0.0.1",
                "--address-file", str(self.address_file), "--seed", "0"]
        if secret_file is None:
            env["SLURMRL_JOB_SECRET"] = secret
        else:
            env.pop("SLURMRL_JOB_SECRET", None)
            args += ["--secret-file", str(secret_file)]
        # it dies with the test run, however that dies (as the controller harness's)
        self.proc = subprocess.Popen(args, env=env, cwd=tmp, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True,
                                     preexec_fn=_end_with_parent)
        try:
            self.handle = ServiceHandle(self._wait_address(), secret, job_id, role,
                                        timeout_s=60)
        except BaseException:
            self.kill()  # it never started: no fixture's teardown will stop it
            raise

    def _wait_address(self) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.address_file.exists():
                return self.address_file.read_text().strip()
            if self.proc.poll() is not None:
                raise AssertionError(f"worker exited early: {self.proc.stderr.read()}")  # type: ignore[union-attr]
            time.sleep(0.05)
        raise AssertionError("worker did not write its address within 60 s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate(timeout=30)


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[dict[str, Worker]]:
    secret = mint_secret()
    started: dict[str, Worker] = {}
    try:
        for role in ("rollout", "trainer"):
            started[role] = Worker(tmp_path, role, secret)
        yield started
    finally:
        for w in started.values():
            w.kill()


def test_driver_path_park_activate_sync_and_stop(workers: dict[str, Worker]) -> None:
    roll, trainer = workers["rollout"].handle, workers["trainer"].handle
    st = roll.status()
    assert st["pid"] == workers["rollout"].proc.pid and st["residency"] == "active"

    before = roll.generate(PROMPTS, seed=11, max_tokens=10)
    assert [s.prompt for s in before.samples] == PROMPTS

    # park both, as the controller would for the partner's phase
    assert roll.park(level=1)["memory"]["device_bytes"] == 0
    trainer.park(level=1)
    with pytest.raises(ServiceParked, match="acquire a lease first"):
        roll.generate(PROMPTS)
    with pytest.raises(ServiceParked):
        trainer.train_step([s.with_advantage(1.0) for s in before.samples])
    roll.activate()
    trainer.activate()
    assert roll.generate(PROMPTS, seed=11, max_tokens=10) == before

    metrics = trainer.train_step([s.with_advantage(1.0 - i) for i, s in
                                  enumerate(before.samples)])
    assert metrics["step"] == 1.0 and metrics["tokens"] > 0
    nbytes = trainer.sync_weights_to(roll)
    assert nbytes > 0
    assert roll.export_weights() == trainer.export_weights()
    after = roll.generate(PROMPTS, seed=11, max_tokens=10)
    assert after != before

    # a second trainer step after a park continues from the same optimizer state
    trainer.park()
    trainer.activate()
    assert trainer.train_step([s.with_advantage(1.0) for s in after.samples])["step"] == 2.0

    roll.stop()
    proc = workers["rollout"].proc
    assert proc.wait(timeout=30) == 0
    assert "stopped" in (proc.stdout.read() if proc.stdout else "")
    with pytest.raises(ServiceUnreachable):
        roll.status()


def test_weights_synced_into_a_parked_rollout_are_used_after_activation(
        workers: dict[str, Worker], tmp_path: Path) -> None:
    # A disaggregated job's sync leases the trainer's GPUs only: its rollout may be
    # parked for a partner. The weights must wait in host memory, and be the ones the
    # rollout generates with once the controller activates it for its next rollout.
    roll, trainer = workers["rollout"].handle, workers["trainer"].handle
    ref = Worker(tmp_path, "rollout", mint_secret(), name="reference")
    try:
        before = roll.generate(PROMPTS, seed=3, max_tokens=10)
        for _ in range(2):
            trainer.train_step([s.with_advantage(1.0 - i) for i, s in
                                enumerate(before.samples)])
        parked = roll.park(level=1)
        assert parked["residency"] == "parked" and parked["memory"]["device_bytes"] == 0

        blob = trainer.export_weights()
        ans = roll.import_weights(blob)  # what trainer.sync_weights_to(roll) sends
        assert ans == {"imported_bytes": len(blob), "staged": True}
        st = roll.status()
        # still parked, nothing brought back onto its device, no extra host memory
        assert st["residency"] == "parked" and st["weights_staged"] is True
        assert st["memory"] == parked["memory"]
        with pytest.raises(ServiceParked):
            roll.generate(PROMPTS, seed=3, max_tokens=10)

        # the reference got the same weights while active: loaded at once
        assert ref.handle.import_weights(blob)["staged"] is False
        expected = ref.handle.generate(PROMPTS, seed=3, max_tokens=10)
        assert expected != before

        st = roll.activate()
        assert st["residency"] == "active" and st["weights_staged"] is False
        assert roll.generate(PROMPTS, seed=3, max_tokens=10) == expected
        assert roll.export_weights() == blob
    finally:
        ref.kill()


def test_unauthenticated_and_foreign_calls_are_refused(workers: dict[str, Worker]) -> None:
    address = workers["rollout"].handle.address
    other_job = ServiceHandle(address, mint_secret(), "202", "rollout", timeout_s=30)
    with pytest.raises(ServiceUnauthorized, match="another job's key"):
        other_job.generate(PROMPTS)
    with pytest.raises(ServiceUnauthorized):
        other_job.stop()
    import http.client

    host, port = address.partition("/")[0].split(":")  # host:port/launch
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/stop", body=b"{}")
    assert conn.getresponse().status == 401
    conn.close()
    assert workers["rollout"].proc.poll() is None  # still serving its own job
    assert workers["rollout"].handle.status()["residency"] == "active"


def test_sigterm_stops_the_worker_cleanly(workers: dict[str, Worker]) -> None:
    proc = workers["trainer"].proc
    proc.terminate()  # what scancel sends a step
    assert proc.wait(timeout=30) == 0


def test_secret_file_must_be_private(tmp_path: Path) -> None:
    secret = mint_secret()
    path = tmp_path / "secret"
    path.write_text(secret)
    path.chmod(0o644)
    env = {k: v for k, v in os.environ.items() if k != "SLURMRL_JOB_SECRET"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "slurmrl.cli.main", "worker", "--backend", "tiny", "--role",
         "rollout", "--job-id", "1", "--secret-file", str(path)],
        env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "chmod 600" in done.stderr
    path.chmod(0o600)
    w = Worker(tmp_path, "rollout", secret, secret_file=path)
    try:
        assert w.handle.status()["residency"] == "active"
    finally:
        w.kill()
