"""Who may do what, with real MUNGE credentials from real users.

rlbob's driver holds a lease. rlalice (another uid) cannot heartbeat, release, shrink,
grow, switch, end, or read the private details of bob's job; she sees only its public
fields. A request without a credential, with a forged one, with one made for another
request, or with a replayed one is refused with 401 and a code saying why. Root (an
admin) sees all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmrl.auth.requests import sign_request
from tests.integration.controller_harness import (
    RPC_AS,
    VENV_PY,
    ControllerProc,
    driver_script,
    holder_pool,
    raw_call,
    read_out,
    wait_output,
    wait_running,
)


def test_users_act_only_on_their_own_jobs(controller: ControllerProc, jobs,  # type: ignore[no-untyped-def]
                                          shared_tmp: Path) -> None:
    holder_pool(jobs, controller, gpus=2)
    driver = driver_script(shared_tmp)
    out = shared_tmp / "bob.out"
    sub = jobs.sbatch(["--rl-gpus=2", f"--output={out}", "--time=10",
                       f"--wrap={driver} {controller.url} 0 600"], user="rlbob")
    assert sub.job_id, sub.stderr
    bob = sub.job_id
    wait_output(out, "holding")
    lease_id = int(read_out(out).split("holding")[1].split()[0])

    def as_alice(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        proc = jobs.run([VENV_PY, "-c", RPC_AS, controller.url, method, path,
                         json.dumps(body)], user="rlalice")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)

    for method, path, body in [
        ("POST", f"/v1/jobs/{bob}/heartbeat", {}),
        ("POST", f"/v1/jobs/{bob}/leases/{lease_id}/release", {"timing": {}}),
        ("POST", f"/v1/jobs/{bob}/leases/{lease_id}/shrink", {"keep": 1}),
        ("POST", f"/v1/jobs/{bob}/leases/{lease_id}/grow", {"gpus": [0]}),
        ("POST", f"/v1/jobs/{bob}/leases/{lease_id}/switch", {"phase": "train"}),
        ("POST", f"/v1/jobs/{bob}/leases", {"phase": "train", "wait_s": 0}),
        ("POST", f"/v1/jobs/{bob}/end", {}),
        ("GET", f"/v1/jobs/{bob}/leases", None),
        ("GET", f"/v1/jobs/{bob}/observations", None),
        ("POST", "/v1/pools", {"slurm_job_id": bob}),
    ]:
        got = as_alice(method, path, body)
        assert got["status"] == 403, (method, path, got)
        assert got["answer"]["error"]["code"] in ("not-your-job", "admin-only")
    # registering bob's Slurm job as hers is refused too (Slurm says whose job it is)
    got = as_alice("POST", "/v1/jobs", {"job_id": bob, "env": {"SLURMRL_GPUS": "2"}})
    assert got["status"] == 403

    public = as_alice("GET", f"/v1/jobs/{bob}", None)["answer"]["job"]
    assert public["user"] == "rlbob" and public["private"] is False
    for private in ("name", "request", "pool_gpus", "gpu_seconds", "secret", "services"):
        assert private not in public
    leases = [x for x in as_alice("GET", "/v1/status", None)["answer"]["leases"]
              if x["job_id"] == bob]
    assert leases and "gpus" not in leases[0]

    # bob's lease survived all of that
    _, ans = controller.admin().call("GET", f"/v1/jobs/{bob}/leases/{lease_id}")
    assert ans["lease"]["state"] == "held"
    _, full = controller.admin().call("GET", f"/v1/jobs/{bob}")
    assert full["job"]["private"] and full["job"]["name"] and "secret" not in full["job"]


def test_bad_credentials_are_refused(controller: ControllerProc) -> None:
    url, path = controller.url, "/v1/jobs"
    status, ans = raw_call(url, "GET", path, b"", {})
    assert status == 401 and ans["error"]["code"] == "auth-missing"
    status, ans = raw_call(url, "GET", path, b"", {"Authorization": "MUNGE MUNGE:AAAAforged:"})
    assert status == 401 and ans["error"]["code"] in ("auth-invalid", "auth-malformed")
    status, ans = raw_call(url, "GET", path, b"", {"Authorization": "Bearer x"})
    assert status == 401 and ans["error"]["code"] == "auth-malformed"
    other = sign_request("GET", "/v1/pools")
    status, ans = raw_call(url, "GET", path, b"", {"Authorization": other})
    assert status == 401 and ans["error"]["code"] == "auth-mismatch"

    good = sign_request("GET", path)
    status, _ = raw_call(url, "GET", path, b"", {"Authorization": good})
    assert status == 200
    status, ans = raw_call(url, "GET", path, b"", {"Authorization": good})
    assert status == 401 and ans["error"]["code"] == "auth-replayed"


def test_a_job_name_forging_its_owner_is_refused_at_registration(  # type: ignore[no-untyped-def]
        controller: ControllerProc, jobs) -> None:
    # scontrol -o prints the job name (spaces allowed) before the real UserId=: a name
    # holding "UserId=root(<alice's uid>)" would pass the uid check and name root as the
    # user her services run as
    import pwd

    uid = pwd.getpwnam("rlalice").pw_uid
    sub = jobs.sbatch(["-J", f"x UserId=root({uid})", "--rl-gpus=1", "--time=5",
                       "--wrap=sleep 300"], user="rlalice")
    assert sub.job_id, sub.stderr
    wait_running(jobs, sub.job_id)
    proc = jobs.run([VENV_PY, "-c", RPC_AS, controller.url, "POST", "/v1/jobs",
                     json.dumps({"job_id": sub.job_id,
                                 "env": {"SLURMRL_GPUS": "1", "SLURMRL_MODEL": "tiny"}})],
                    user="rlalice")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["status"] == 409, got
    assert got["answer"]["error"]["code"] == "unreadable-slurm-job"
    assert "UserId= twice" in got["answer"]["error"]["message"]
    _, ans = controller.admin().call("GET", "/v1/jobs?all=1")
    assert sub.job_id not in [j["job_id"] for j in ans["jobs"]]  # nothing registered
