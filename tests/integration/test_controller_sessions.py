"""Session-signed requests on a real controller, beside MUNGE-signed ones.

A session is opened with a real MUNGE credential and then signs requests with an HMAC.
Replayed, forged, altered and unknown-session requests are refused with 401 and a code;
a session cannot open another; a session carries its opener's uid (rlalice's session is
not an admin's); after a controller restart the client opens a new session by itself.
"""

from __future__ import annotations

import json

from slurmrl.auth.requests import sign_request
from slurmrl.auth.sessions import sign
from slurmrl.client.rpc import RpcClient
from tests.integration.controller_harness import VENV_PY, ControllerProc, raw_call

AS_USER = """
import json, sys
from slurmrl.client.rpc import ControllerError, RpcClient
rpc = RpcClient(sys.argv[1], retry_for_s=0, use_sessions=True)
out = {"jobs": rpc.call("GET", "/v1/jobs")[0]}
try:
    rpc.call("POST", "/v1/pools", {"slurm_job_id": 1})
except ControllerError as exc:
    out["pools"] = [exc.status, exc.code]
out["session"] = rpc._session is not None
print(json.dumps(out))
"""


def _open(url: str) -> tuple[str, str]:
    body = b'{"job_id": null}'
    status, ans = raw_call(url, "POST", "/v1/sessions", body,
                       {"Authorization": sign_request("POST", "/v1/sessions", body)})
    assert status == 200, ans
    assert ans["session"]["uid"] == 0
    return ans["session"]["session_id"], ans["session"]["key"]


def test_session_requests_are_checked_like_munge_ones(controller: ControllerProc) -> None:
    url = controller.url
    sid, key = _open(url)
    h = sign(sid, key, "GET", "/v1/jobs?all=1")
    status, ans = raw_call(url, "GET", "/v1/jobs?all=1", b"", h)
    assert status == 200 and "jobs" in ans
    status, ans = raw_call(url, "GET", "/v1/jobs?all=1", b"", h)  # the same request again
    assert status == 401 and ans["error"]["code"] == "auth-replayed"

    forged = sign(sid, "k" * 43, "GET", "/v1/jobs")
    status, ans = raw_call(url, "GET", "/v1/jobs", b"", forged)
    assert status == 401 and ans["error"]["code"] == "auth-invalid"
    altered = sign(sid, key, "GET", "/v1/pools")
    status, ans = raw_call(url, "GET", "/v1/jobs", b"", altered)
    assert status == 401 and ans["error"]["code"] == "auth-invalid"
    old = sign(sid, key, "GET", "/v1/jobs", now=0)
    status, ans = raw_call(url, "GET", "/v1/jobs", b"", old)
    assert status == 401 and ans["error"]["code"] == "auth-expired"
    unknown = sign("f" * 32, key, "GET", "/v1/jobs")
    status, ans = raw_call(url, "GET", "/v1/jobs", b"", unknown)
    assert status == 401 and ans["error"]["code"] == "auth-no-session"

    body = b'{"job_id": null}'
    status, ans = raw_call(url, "POST", "/v1/sessions", body, sign(sid, key, "POST",
                                                               "/v1/sessions", body))
    assert status == 401 and ans["error"]["code"] == "auth-mismatch"
    # MUNGE-signed requests keep working beside sessions
    status, _ = raw_call(url, "GET", "/v1/jobs", b"",
                     {"Authorization": sign_request("GET", "/v1/jobs")})
    assert status == 200


def test_a_session_carries_its_openers_uid(controller: ControllerProc, jobs) -> None:  # type: ignore[no-untyped-def]
    proc = jobs.run([VENV_PY, "-c", AS_USER, controller.url], user="rlalice")
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got == {"jobs": 200, "pools": [403, "admin-only"], "session": True}


def test_client_opens_a_new_session_after_a_restart(controller: ControllerProc) -> None:
    rpc = RpcClient(controller.url, retry_for_s=30.0, use_sessions=True)
    assert rpc.call("GET", "/v1/jobs")[0] == 200
    first = rpc._session
    controller.kill9()
    controller.start()
    assert rpc.call("GET", "/v1/jobs")[0] == 200
    assert rpc._session is not None and rpc._session != first
