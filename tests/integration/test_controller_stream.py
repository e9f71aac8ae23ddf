"""The lease stream (`GET /v1/stream`): lease operations as WebSocket frames.

rlbob's driver holds the pool's two GPUs. rlalice's Slurm job opens a stream with her
own MUNGE-opened session and, frame by frame: gets named errors for a binary frame and a
malformed one (the stream stays usable), is refused bob's lease (403), heartbeats while
her acquire waits, is granted the GPUs the moment bob's lease ends, and releases them.
An upgrade without a credential, or an authenticated GET that is no upgrade, is refused.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from slurmrl.auth.requests import sign_request
from tests.integration.controller_harness import (
    VENV_PY,
    ControllerProc,
    driver_script,
    holder_pool,
    read_out,
    wait_output,
)

ALICE = '''
import asyncio, json, sys
import aiohttp, slurmrl
from slurmrl.auth.requests import sign_request
from slurmrl.auth.sessions import sign
url, bob, bob_lease = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
job = slurmrl.connect(url=url)  # registers her Slurm job (HTTP)

def say(tag, value):
    print(tag, json.dumps(value), flush=True)

async def main():
    async with aiohttp.ClientSession() as s:
        body = json.dumps({"job_id": job.job_id}).encode()
        async with s.post(url + "/v1/sessions", data=body, headers={
                "Authorization": sign_request("POST", "/v1/sessions", body),
                "Content-Type": "application/json"}) as r:
            info = (await r.json())["session"]
        hdrs = sign(info["session_id"], info["key"], "GET", "/v1/stream", b"")
        async with s.ws_connect(url + "/v1/stream", headers=hdrs) as ws:
            await ws.send_bytes(b"{}")
            say("binary", await ws.receive_json())
            await ws.send_str('{"id": 1, "op": "acquire"}')
            say("malformed", await ws.receive_json())
            await ws.send_str(json.dumps({"id": 2, "op": "release", "job_id": bob,
                                          "lease_id": bob_lease}))
            say("others", await ws.receive_json())
            await ws.send_str(json.dumps({"id": 3, "op": "acquire", "job_id": job.job_id,
                                          "phase": "rollout", "wait_s": 60}))
            await ws.send_str(json.dumps({"id": 4, "op": "heartbeat",
                                          "job_id": job.job_id}))
            say("heartbeat", await ws.receive_json())
            say("waiting", job.job_id)
            grant = await ws.receive_json()
            say("grant", grant)
            await ws.send_str(json.dumps({"id": 5, "op": "release", "job_id": job.job_id,
                                          "lease_id": grant["lease"]["lease_id"],
                                          "timing": {"busy_s": 0.5}}))
            say("release", await ws.receive_json())

asyncio.run(main())
job.close()
'''


def _lines(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in read_out(path).splitlines():
        tag, _, rest = line.partition(" ")
        if rest.startswith(("{", "[", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9")):
            out[tag] = json.loads(rest)
    return out


def _wait_for(path: Path, tag: str, timeout_s: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while tag not in (got := _lines(path)):
        assert time.monotonic() < deadline, f"no {tag!r} in:\n{read_out(path)}"
        time.sleep(0.1)
    return got


def test_stream_frames_are_checked_and_hand_off_gpus(
        controller: ControllerProc, jobs, shared_tmp: Path) -> None:  # type: ignore[no-untyped-def]
    holder_pool(jobs, controller, gpus=2)
    bob_out = shared_tmp / "bob.out"
    sub = jobs.sbatch(["--rl-gpus=2", f"--output={bob_out}", "--time=10",
                       f"--wrap={driver_script(shared_tmp)} {controller.url} 0 600"],
                      user="rlbob")
    assert sub.job_id, sub.stderr
    bob = sub.job_id
    wait_output(bob_out, "holding")
    bob_lease = int(read_out(bob_out).split("holding")[1].split()[0])

    script = shared_tmp / "alice_stream.py"
    script.write_text(ALICE)
    script.chmod(0o644)
    alice_out = shared_tmp / "alice.out"
    sub = jobs.sbatch(["--rl-gpus=2", f"--output={alice_out}", "--time=10",
                       f"--wrap={VENV_PY} {script} {controller.url} {bob} {bob_lease}"],
                      user="rlalice")
    assert sub.job_id, sub.stderr
    alice = sub.job_id

    got = _wait_for(alice_out, "waiting")
    assert got["binary"]["status"] == 400 and got["binary"]["error"]["code"] == "bad-frame"
    assert got["malformed"]["id"] == 1 and got["malformed"]["status"] == 400
    assert "job_id" in got["malformed"]["error"]["message"]
    assert got["others"]["id"] == 2 and got["others"]["status"] == 403
    assert got["others"]["error"]["code"] == "not-your-job"
    # answered while her acquire waits for bob's GPUs
    assert got["heartbeat"]["id"] == 4 and got["heartbeat"]["status"] == 200
    assert got["heartbeat"]["job_id"] == alice
    assert "grant" not in got
    _, ans = controller.admin().call("GET", f"/v1/jobs/{bob}/leases/{bob_lease}")
    assert ans["lease"]["state"] == "held"  # her frame did not touch it

    # bob's lease ends (an admin releases it): the grant is pushed to her stream (the
    # 60 s of _wait_for is a hang guard only)
    controller.admin().call("POST", f"/v1/jobs/{bob}/leases/{bob_lease}/release",
                            {"timing": {}})
    got = _wait_for(alice_out, "release")
    _, ans = controller.admin().call("GET", f"/v1/jobs/{bob}/leases/{bob_lease}")
    ended = ans["lease"]
    assert ended["state"] == "released" and ended["released_at"] is not None
    grant = got["grant"]
    assert grant["id"] == 3 and grant["status"] == 200
    assert grant["lease"]["job_id"] == alice and len(grant["lease"]["gpus"]) == 2
    # she asked while bob held the GPUs and was granted his GPUs once his lease ended
    assert grant["lease"]["requested_at"] < ended["released_at"] <= grant["lease"]["granted_at"]
    assert sorted(grant["lease"]["gpus"]) == sorted(ended["gpus"])
    rel = got["release"]
    assert rel["id"] == 5 and rel["status"] == 200 and rel["lease"]["state"] == "released"
    _, ans = controller.admin().call("GET", f"/v1/jobs/{alice}/leases")
    states = {x["lease_id"]: x["state"] for x in ans["leases"]}
    assert states[grant["lease"]["lease_id"]] == "released"


def test_stream_upgrade_needs_a_credential_and_an_upgrade(controller: ControllerProc) -> None:
    async def probe() -> tuple[int, int, dict[str, Any]]:
        async with aiohttp.ClientSession() as s:
            try:
                await s.ws_connect(controller.url + "/v1/stream")
                unauth = 101
            except aiohttp.WSServerHandshakeError as exc:
                unauth = exc.status
            hdrs = {"Authorization": sign_request("GET", "/v1/stream", b"")}
            async with s.get(controller.url + "/v1/stream", headers=hdrs) as r:
                return unauth, r.status, await r.json()

    unauth, plain, answer = asyncio.run(probe())
    assert unauth == 401
    assert plain == 400 and answer["error"]["code"] == "not-websocket"
