"""Helpers of the controller integration tests: a real controller process, a pool.

`ControllerProc` runs `slurmrl controller` from this checkout (as root) on a free port
with a temporary DB and `--debug-invariants`; `kill9()` and `start()` restart it on the
same DB. `holder_pool()` submits a real Slurm allocation in the `pools` partition and
attaches it as a pool through the admin RPC (the pool manager of the next issue opens
pools itself; the test does by hand what it will do).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from slurmrl.client.rpc import RpcClient

REPO = Path(__file__).resolve().parents[2]
VENV_PY = sys.executable  # the venv make test runs in (under /opt: every user can run it)


#: run as a job's user (`jobs.run([VENV_PY, "-c", RPC_AS, url, method, path, body])`):
#: one RPC call, its status and answer printed as JSON
RPC_AS = """
import json, sys
from slurmrl.client.rpc import ControllerError, RpcClient
url, method, path, body = sys.argv[1:5]
try:
    status, ans = RpcClient(url, retry_for_s=0).call(method, path, json.loads(body))
except ControllerError as exc:
    status, ans = exc.status, {"error": {"code": exc.code, "message": exc.message}}
print(json.dumps({"status": status, "answer": ans}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _end_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the test run that started it dies,
    however it dies (a CI timeout's SIGKILL included), so no controller outlives it."""
    import ctypes
    import signal

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class ControllerProc:
    def __init__(self, workdir: Path, env: dict[str, str], *, lease_timeout_s: float = 3.0,
                 heartbeat_s: float = 0.5) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = workdir / "controller.db"
        self.log = workdir / "controller.log"
        self.env = dict(env)
        self.env["SLURMRL_CONFIG"] = ""  # defaults + flags only, whatever the host has
        self.args = ["--port", str(self.port), "--db", str(self.db),
                     "--lease-timeout", str(lease_timeout_s), "--heartbeat", str(heartbeat_s),
                     "--log-level", "debug", "--debug-invariants"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "slurmrl.cli.main", "controller", *self.args],
                cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_end_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited {self.proc.returncode}:\n"
                                     + self.log.read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/v1/ping", timeout=1) as r:
                    if json.load(r)["api"] == "v1":
                        return
            except OSError:
                time.sleep(0.1)
        raise AssertionError("controller did not answer /v1/ping:\n" + self.log.read_text())

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def admin(self) -> RpcClient:
        """An RPC client as root (an admin)."""
        return RpcClient(self.url, retry_for_s=10.0)


def raw_call(url: str, method: str, path: str, body: bytes, headers: dict[str, str],
             ) -> tuple[int, dict[str, Any]]:
    """One request to the controller at `url` exactly as given (headers and all, no
    client): its status and JSON answer."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def wait_running(jobs: Any, job_id: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = jobs.state(job_id)
        if state == "RUNNING":
            return
        if state is None or state in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT"):
            break
        time.sleep(0.2)
    raise AssertionError(f"Slurm job {job_id} is {state}, not RUNNING")


def holder_pool(jobs: Any, ctl: ControllerProc, gpus: int = 2) -> int:
    """A real allocation of `gpus` GPUs in `pools`, attached as a pool; its pool id."""
    sub = jobs.sbatch(["--partition=pools", f"--gres=gpu:{gpus}", "--time=30",
                       "--wrap=sleep 1800"])
    assert sub.returncode == 0 and sub.job_id, sub.stderr
    wait_running(jobs, sub.job_id)
    _, ans = ctl.admin().call("POST", "/v1/pools", {"slurm_job_id": sub.job_id})
    return int(ans["pool"]["pool_id"])


DRIVER = '''#!{python}
"""A test driver: alternates rollout and train phases for some rounds (or holds one)."""
import os, sys, time, slurmrl
url, rounds, hold_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
job = slurmrl.connect(url=url)
print("registered", job.job_id, os.getpid(), flush=True)
if rounds == 0:  # hold a rollout lease until killed
    with job.phase("rollout") as lease:
        print("holding", lease.lease_id, flush=True)
        time.sleep(hold_s)
for i in range(rounds):
    with job.phase("rollout") as lease:
        print("rollout", i, lease.lease_id, list(lease.gpus), flush=True)
        time.sleep(hold_s)
    with job.phase("train") as lease:
        print("train", i, lease.lease_id, list(lease.gpus), flush=True)
        time.sleep(hold_s)
    t0 = time.time(); time.sleep(hold_s / 2); job.observe("reward", t0, time.time())
job.close()
print("done", flush=True)
'''


def driver_script(dirpath: Path) -> Path:
    path = dirpath / "driver.py"
    path.write_text(DRIVER.format(python=VENV_PY))
    path.chmod(0o755)
    return path


def env_for_controller(base: dict[str, str]) -> dict[str, str]:
    env = dict(base)
    env["PYTHONPATH"] = str(REPO)
    env.pop("SLURMRL_CONFIG", None)
    return {k: v for k, v in env.items() if v is not None}


def read_out(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def wait_output(path: Path, marker: str, timeout_s: float = 60.0) -> str:
    """A job's output file once it contains `marker` (fails with the output so far)."""
    deadline = time.monotonic() + timeout_s
    while marker not in (text := read_out(path)):
        assert time.monotonic() < deadline, f"no {marker!r} within {timeout_s:g} s:\n{text}"
        time.sleep(0.1)
    return text


__all__ = ["ControllerProc", "driver_script", "env_for_controller", "holder_pool",
           "os", "read_out", "wait_output", "wait_running"]
