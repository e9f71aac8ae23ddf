"""`POST /v1/jobs/{job}/leases/{lease}/switch` and the stream's `switch`, as callers see
them: the RPC app in process on a real Store and Controller (Slurm is a fake that knows
two running jobs; the sessions are real HMAC sessions opened for two users).

Alice's colocated job trains on both GPUs of a pool while Bob's rollout waits for them;
her switch to sync is granted at once, Bob gets the GPUs when her sync is released. A
lost switch answer does not matter: acquiring the phase again answers the same lease. A
lease switches once (409 `cannot-switch`), Bob cannot switch Alice's lease (403), and a
malformed body is a 400 naming its field; none of them changes anything.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer
from test_server_inputs import FakeSlurm

from slurmrl.auth import sessions
from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.controller.server import SESSIONS, make_app
from slurmrl.db import Store
from slurmrl.model import Identity

ALICE = Identity(1001, 1001, "alice")
BOB = Identity(1002, 1002, "bob")
A, B = 100, 101  #: alice's job, bob's job


@dataclass
class Rig:
    c: Controller
    client: TestClient[Any, Any]
    grants: dict[int, sessions.SessionGrant]  #: uid -> its session

    async def call(self, who: Identity, method: str, path: str,
                   body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        raw = b"" if body is None else json.dumps(body).encode()
        g = self.grants[who.uid]
        r = await self.client.request(method, path, data=raw, headers=sessions.sign(
            g.session_id, g.key, method, path, raw))
        return r.status, await r.json()

    async def leases(self) -> list[Any]:
        """Every lease row and the tables' state: what a refused call must not change."""
        table = self.c.scheduler.tables
        return [self.c.store.leases(), self.c.store.observations(),
                {p: (t.leases, t.waiting) for p, t in table.items()}]


@asynccontextmanager
async def rig(tmp_path: Path, floating: bool = False, replicas: int = 0
              ) -> AsyncIterator[Rig]:
    """Jobs A and B in one pool of 2 GPUs; `floating`: a floating pool of two windows
    of 2 GPUs (Slurm jobs 900 and 901) with rollouts of `replicas`-GPU replicas."""
    store = Store(tmp_path / "c.db")
    cfg = Config()
    if floating:
        cfg = replace(cfg, slurm=replace(cfg.slurm, floating_pools=True),
                      services=replace(cfg.services, rollout_replica_gpus=replicas))
    c = Controller(cfg, store, FakeSlurm({A: ALICE, B: BOB}))  # type: ignore[arg-type]
    await c.pools.start(c)
    app = make_app(c)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        r = Rig(c, client, {w.uid: app[SESSIONS].open(w) for w in (ALICE, BOB)})
        for who, job in ((ALICE, A), (BOB, B)):
            status, ans = await r.call(who, "POST", "/v1/jobs",
                                       {"job_id": job, "env": {"SLURMRL_GPUS": "2"}})
            assert status == 200, ans
        if floating:
            pool = c.open_pool(gpus=2, slurm_job_id=900, gpu_indices=(0, 1), floating=True)
            c.add_window(pool.pool_id, 901, (2, 3))
        else:
            pool = c.open_pool(gpus=2, slurm_job_id=None)
        for job in (A, B):
            c.place_job(job, pool.pool_id, (0, 1))
        yield r
    finally:
        await client.close()
        store.close()


def _acquire(phase: str) -> dict[str, Any]:
    return {"phase": phase, "wait_s": 0}


def test_a_switch_is_granted_at_once_and_the_waiter_gets_the_gpus_after_it(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            status, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("train"))
            assert status == 200, ans
            train = ans["lease"]
            status, ans = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", _acquire("rollout"))
            assert (status, ans["state"]) == (202, "waiting")
            waiting = ans["request_id"]

            status, ans = await r.call(ALICE, "POST",
                                       f"/v1/jobs/{A}/leases/{train['lease_id']}/switch",
                                       {"phase": "sync", "timing": {"busy_s": 1.5}})
            assert status == 200, ans
            sync = ans["lease"]
            assert (sync["phase"], sync["state"], sync["local_gpus"]) == ("sync", "held", [0, 1])
            assert sync["lease_id"] != train["lease_id"]
            _, ans = await r.call(ALICE, "GET", f"/v1/jobs/{A}/leases/{train['lease_id']}")
            assert ans["lease"]["state"] == "released"
            _, ans = await r.call(BOB, "GET", f"/v1/jobs/{B}/leases/{waiting}")
            assert ans["lease"]["state"] == "waiting"  # the partner still waits
            _, ans = await r.call(ALICE, "GET", f"/v1/jobs/{A}")
            assert ans["job"]["phase"] == "sync"
            (obs,) = r.c.store.observations(A)
            assert (str(obs.phase), obs.busy_s) == ("train", 1.5)

            # the switch's answer lost: acquiring sync again answers the same lease
            status, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("sync"))
            assert (status, ans["lease"]["lease_id"]) == (200, sync["lease_id"])

            status, ans = await r.call(ALICE, "POST",
                                       f"/v1/jobs/{A}/leases/{sync['lease_id']}/release",
                                       {"timing": {}})
            assert status == 200, ans
            _, ans = await r.call(BOB, "GET", f"/v1/jobs/{B}/leases/{waiting}")
            assert (ans["lease"]["state"], ans["lease"]["local_gpus"]) == ("held", [0, 1])

    asyncio.run(main())


def test_refused_switches_say_why_and_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("train"))
            train = ans["lease"]["lease_id"]
            await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", _acquire("rollout"))
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases/{train}/switch",
                                  {"phase": "sync"})
            sync = ans["lease"]["lease_id"]
            before = await r.leases()
            refused = [
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch", {"phase": "rollout"},
                 409, "cannot-switch", "a lease switches once"),
                (ALICE, f"/v1/jobs/{A}/leases/{train}/switch", {"phase": "sync"},
                 409, "cannot-switch", f"lease {train} is not held by job {A}"),
                (BOB, f"/v1/jobs/{A}/leases/{sync}/switch", {"phase": "rollout"},
                 403, "not-your-job", f"RL job {A} belongs to another user"),
                (BOB, f"/v1/jobs/{B}/leases/{sync}/switch", {"phase": "rollout"},
                 409, "cannot-switch", f"lease {sync} is not held by job {B}"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch", {"phase": "reward"},
                 400, "bad-value", "field 'phase' must be one of"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch", {},
                 400, "missing-field", "field 'phase' is required"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch",
                 {"phase": "rollout", "timing": {"busy_s": "long"}},
                 400, "bad-type", "field 'timing': 'busy_s' must be a finite number"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch",
                 {"phase": "rollout", "timing": {"busy_s": 1.0, "state": "held"}},
                 400, "unknown-field", "field 'timing': unknown key 'state'"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch",
                 {"phase": "rollout", "timing": {"wait_s": -1.0}},
                 400, "bad-value", "field 'timing': 'wait_s' must be between 0 and"),
                (ALICE, f"/v1/jobs/{A}/leases/{sync}/switch", {"phase": "rollout", "gpus": [0]},
                 400, "unknown-field", "unknown field(s) 'gpus'"),
            ]
            for who, path, body, status, code, says in refused:
                got, ans = await r.call(who, "POST", path, body)
                assert (got, ans["error"]["code"]) == (status, code), (path, body, ans)
                assert says in ans["error"]["message"], ans
            assert await r.leases() == before

    asyncio.run(main())


def test_the_stream_switches_too(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        async with rig(tmp_path) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("train"))
            train = ans["lease"]["lease_id"]
            g = r.grants[ALICE.uid]
            ws = await r.client.ws_connect(
                "/v1/stream", headers=sessions.sign(g.session_id, g.key, "GET", "/v1/stream"))
            frames = []
            for fid, lease_id in ((1, train), (2, train)):
                await ws.send_str(json.dumps({"id": fid, "op": "switch", "job_id": A,
                                              "lease_id": lease_id, "phase": "sync",
                                              "timing": {"busy_s": 0.5}}))
                msg = await ws.receive(timeout=10)
                assert msg.type is WSMsgType.TEXT, (msg.type, msg.data)
                frames.append(json.loads(msg.data))
            await ws.close()
            return frames

    switched, again = asyncio.run(main())
    assert (switched["id"], switched["status"], switched["lease"]["phase"]) == (1, 200, "sync")
    assert (again["id"], again["status"], again["error"]["code"]) == (2, 409, "cannot-switch")


def test_metrics_count_gpu_seconds_by_pool_and_name_no_job(tmp_path: Path) -> None:
    # /metrics asks no credential and a job's GPU-seconds are private to its owner: the
    # series was labelled by job id, so anyone could read every job's usage
    async def main() -> str:
        async with rig(tmp_path) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("train"))
            lease = ans["lease"]["lease_id"]
            await asyncio.sleep(0.05)
            status, _ = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases/{lease}/release",
                                     {"timing": {}})
            assert status == 200
            _, ans = await r.call(BOB, "GET", f"/v1/jobs/{A}")
            assert "gpu_seconds" not in ans["job"]  # private in the job's view
            resp = await r.client.get("/metrics")
            return await resp.text()

    text = asyncio.run(main())
    (line,) = [x for x in text.splitlines() if x.startswith("slurmrl_gpu_seconds_total{")]
    assert line.startswith('slurmrl_gpu_seconds_total{pool="') and float(line.split()[-1]) > 0
    assert 'job="' not in text


def test_a_pack_outside_a_floating_pool_is_refused_by_name_and_changes_nothing(
        tmp_path: Path) -> None:
    # `POST .../pack` (a floating pool's rollout tail): a fixed pool's rollout cannot
    # pack (nor one engine's over a floating pool's window), with or without replicas
    async def main() -> None:
        async with rig(tmp_path / "one-engine", floating=True) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("rollout"))
            lease = ans["lease"]["lease_id"]
            before = await r.leases()
            path = f"/v1/jobs/{A}/leases/{lease}/pack"
            status, ans = await r.call(ALICE, "POST", path, {"gpus": [0]})
            assert (status, ans["error"]["code"]) == (409, "cannot-pack"), ans
            assert "one engine" in ans["error"]["message"]
            assert await r.leases() == before
        async with rig(tmp_path) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("rollout"))
            lease = ans["lease"]["lease_id"]
            before = await r.leases()
            path = f"/v1/jobs/{A}/leases/{lease}/pack"
            status, ans = await r.call(ALICE, "POST", path, {"gpus": [0]})
            assert (status, ans["error"]["code"]) == (409, "lease-conflict"), ans
            assert "not in a floating pool" in ans["error"]["message"]
            status, ans = await r.call(ALICE, "POST", path, {"gpus": []})
            assert (status, ans["error"]["code"]) == (400, "bad-value"), ans
            assert "'gpus'" in ans["error"]["message"]
            status, ans = await r.call(BOB, "POST", path, {"gpus": [0]})
            assert (status, ans["error"]["code"]) == (403, "not-your-job"), ans
            assert await r.leases() == before
        async with rig(tmp_path / "replicas") as r:  # replicas, but a fixed pool
            r.c.config = replace(r.c.config, services=replace(r.c.config.services,
                                                              rollout_replica_gpus=1))
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("rollout"))
            lease = ans["lease"]["lease_id"]
            before = await r.leases()
            status, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases/{lease}/pack",
                                       {"gpus": [0]})
            assert (status, ans["error"]["code"]) == (409, "lease-conflict"), ans
            assert "not in a floating pool" in ans["error"]["message"]
            assert await r.leases() == before

    asyncio.run(main())


def test_a_pack_resent_with_the_gpus_it_saw_is_answered_as_the_lease_is_now(
        tmp_path: Path) -> None:
    # a client whose pack answer was lost (a timeout while hand-offs queue) sends it
    # again: the lease moved already, so the resend changes nothing and answers it
    async def main() -> None:
        async with rig(tmp_path, floating=True, replicas=1) as r:
            leases = {}
            for who, job in ((ALICE, A), (BOB, B)):
                status, ans = await r.call(who, "POST", f"/v1/jobs/{job}/leases",
                                           _acquire("rollout"))
                assert status == 200, ans
                leases[job] = ans["lease"]
            assert (leases[A]["gpus"], leases[B]["gpus"]) == ([0, 1], [2, 3])
            path = f"/v1/jobs/{B}/leases/{leases[B]['lease_id']}/pack"
            status, ans = await r.call(BOB, "POST", path, {"gpus": [0], "held": [2, 3]})
            assert (status, ans["lease"]["gpus"]) == (200, [2]), ans
            path = f"/v1/jobs/{A}/leases/{leases[A]['lease_id']}/pack"
            body = {"gpus": [0], "held": [0, 1]}
            status, ans = await r.call(ALICE, "POST", path, body)
            assert (status, ans["lease"]["gpus"]) == (200, [3]), ans  # beside B's tail
            before = await r.leases()
            status, ans = await r.call(ALICE, "POST", path, body)
            assert (status, ans["lease"]["gpus"]) == (200, [3]), ans
            assert await r.leases() == before
            # a new pack from what it holds now is checked as any is
            status, ans = await r.call(ALICE, "POST", path, {"gpus": [0], "held": [3]})
            assert (status, ans["error"]["code"]) == (409, "lease-conflict"), ans

    asyncio.run(main())


def test_a_grow_resent_with_the_gpus_it_saw_answers_what_it_took(tmp_path: Path) -> None:
    # a client whose grow answer was lost (a timeout while hand-offs queue) sends it
    # again: the GPUs are the lease's already, and the answer names them as added (it
    # named none, and the driver never used GPUs it was charged for)
    async def main() -> None:
        async with rig(tmp_path) as r:
            _, ans = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", _acquire("rollout"))
            lease = ans["lease"]["lease_id"]
            base = f"/v1/jobs/{A}/leases/{lease}"
            status, ans = await r.call(ALICE, "POST", f"{base}/shrink", {"keep": 1})
            assert (status, ans["lease"]["gpus"]) == (200, [0]), ans
            body = {"gpus": [1], "held": [0]}
            for _ in range(2):  # the first attempt, then its resend
                status, ans = await r.call(ALICE, "POST", f"{base}/grow", body)
                assert status == 200, ans
                assert (ans["lease"]["gpus"], ans["added"]) == ([0, 1], [1])
            # without `held`, a grow of GPUs it holds adds nothing (as before)
            status, ans = await r.call(ALICE, "POST", f"{base}/grow", {"gpus": [1]})
            assert (status, ans["added"]) == (200, []), ans

    asyncio.run(main())


def test_an_observation_resent_after_a_lost_answer_is_recorded_once(tmp_path: Path) -> None:
    # the driver's reward gap, sent again after its answer was lost: the reward curve
    # had the point twice
    async def main() -> None:
        async with rig(tmp_path) as r:
            path = f"/v1/jobs/{A}/observations"
            t = time.time() - 10.0
            body = {"phase": "reward", "started_at": t, "ended_at": t + 1.5,
                    "detail": {"step": 3, "reward": 0.5}}
            ids = []
            for _ in range(2):
                status, ans = await r.call(ALICE, "POST", path, body)
                assert status == 200, ans
                ids.append(ans["observation_id"])
            assert ids[0] == ids[1]
            other = {**body, "detail": {"step": 4, "reward": 0.6}}  # another gap
            status, ans = await r.call(ALICE, "POST", path, other)
            assert status == 200 and ans["observation_id"] != ids[0]
            _, got = await r.call(ALICE, "GET", path)
            assert [o["detail"]["step"] for o in got["observations"]] == [3, 4]

    asyncio.run(main())
