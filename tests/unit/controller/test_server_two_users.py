"""The RPC app in process with two users' jobs (a fake Slurm, a real Store and
Controller, real HMAC sessions): what one caller's request may and may not do to the
other's, and requests racing a job's end, as the callers see it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from test_server_inputs import FakeSlurm

from slurmrl.auth import sessions
from slurmrl.config import Config
from slurmrl.controller.core import Controller
from slurmrl.controller.server import SESSIONS, make_app
from slurmrl.db import Store
from slurmrl.model import Identity, JobState, LeaseState

ALICE = Identity(1001, 1001, "alice")
BOB = Identity(1002, 1002, "bob")
ROOT = Identity(0, 0, "root")
OPS = Identity(1500, 1500, "ops")  # an admin by name, not root
A, B = 100, 101


@dataclass
class Rig:
    c: Controller
    client: TestClient[Any, Any]
    grants: dict[int, sessions.SessionGrant]

    def signed(self, who: Identity, method: str, path: str, raw: bytes) -> dict[str, str]:
        g = self.grants[who.uid]
        return sessions.sign(g.session_id, g.key, method, path, raw)

    async def call(self, who: Identity, method: str, path: str,
                   body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
        raw = b"" if body is None else json.dumps(body).encode()
        r = await self.client.request(method, path, data=raw,
                                      headers=self.signed(who, method, path, raw))
        return r.status, await r.json()


@asynccontextmanager
async def rig(tmp_path: Path, *, register: tuple[tuple[Identity, int], ...] = (
        (ALICE, A), (BOB, B)), clock: Callable[[], float] = time.time) -> AsyncIterator[Rig]:
    cfg = Config()
    cfg = replace(cfg, controller=replace(cfg.controller, admins=("ops",)))
    store = Store(tmp_path / "c.db")
    c = Controller(cfg, store, FakeSlurm({A: ALICE, B: BOB}),  # type: ignore[arg-type]
                   clock=clock)
    await c.pools.start(c)
    app = make_app(c)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        r = Rig(c, client, {w.uid: app[SESSIONS].open(w) for w in (ALICE, BOB, ROOT, OPS)})
        for who, job in register:
            status, answer = await r.call(who, "POST", "/v1/jobs",
                                          {"job_id": job, "env": {"SLURMRL_GPUS": "2"}})
            assert status == 200, answer
        yield r
    finally:
        await client.close()
        store.close()


def _pool_of_both(r: Rig) -> int:
    pool = r.c.open_pool(gpus=2, slurm_job_id=None)
    for job in (A, B):
        r.c.place_job(job, pool.pool_id, (0, 1))
    return pool.pool_id


def test_a_string_no_utf8_can_hold_is_a_400_naming_the_field_and_changes_nothing(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            _pool_of_both(r)
            status, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                        {"phase": "train", "wait_s": 0})
            assert status == 200
            # json.dumps writes the lone surrogate as the escape \ud800
            status, answer = await r.call(ALICE, "POST", f"/v1/jobs/{A}/end",
                                          {"reason": "\ud800"})
            assert status == 400 and answer["error"]["code"] == "bad-value"
            assert "field 'reason' is not valid Unicode text" in answer["error"]["message"]
            job = r.c.store.job(A)
            assert job is not None and job.state is JobState.RUNNING
            lease = r.c.store.lease(held["lease"]["lease_id"])
            assert lease is not None and lease.state is LeaseState.HELD

    asyncio.run(main())


def test_reading_a_waiting_request_with_a_long_poll_and_hanging_up_leaves_it_queued(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            _pool_of_both(r)
            await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", {"phase": "train", "wait_s": 0})
            status, waiting = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases",
                                           {"phase": "rollout", "wait_s": 0})
            assert status == 202
            rid = waiting["request_id"]
            path = f"/v1/jobs/{B}/leases/{rid}?wait_s=30"  # an admin's read
            with suppress(TimeoutError):
                await r.client.get(path, headers=r.signed(ROOT, "GET", path, b""),
                                   timeout=aiohttp.ClientTimeout(total=0.3))
            await asyncio.sleep(0.2)
            rec = r.c.store.lease(rid)
            assert rec is not None and rec.state is LeaseState.WAITING, rec

    asyncio.run(main())


def test_an_acquire_waiting_for_placement_of_a_job_that_then_ends_gets_no_lease(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool = r.c.open_pool(gpus=2, slurm_job_id=None)
            acquire = asyncio.create_task(r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                                 {"phase": "train", "wait_s": 5}))
            await asyncio.sleep(0.3)  # the acquire waits for the job's placement
            r.c.place_job(A, pool.pool_id, (0, 1))
            await r.c.end_job(A, JobState.CANCELLED, "scancel")  # before it wakes
            status, answer = await acquire
            assert status == 202 and answer["state"] == "ended", answer
            assert r.c.store.leases(job_id=A) == []
            assert r.c.scheduler.tables[pool.pool_id].leases == ()

    asyncio.run(main())


def test_an_acquire_waits_wait_s_in_all_placement_included(tmp_path: Path) -> None:
    async def main() -> float:
        async with rig(tmp_path) as r:
            pool = r.c.open_pool(gpus=2, slurm_job_id=None)
            r.c.place_job(B, pool.pool_id, (0, 1))
            await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", {"phase": "train", "wait_s": 0})
            t0 = time.monotonic()
            acquire = asyncio.create_task(r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                                 {"phase": "train", "wait_s": 2}))
            await asyncio.sleep(1.2)
            r.c.place_job(A, pool.pool_id, (0, 1))  # placed, but bob holds the GPUs
            status, answer = await acquire
            assert status == 202 and answer["state"] == "waiting"
            return time.monotonic() - t0

    # it used to wait wait_s for placement and wait_s again for the grant (3.2 s here)
    assert asyncio.run(main()) < 2.8


def test_closing_a_closed_pool_is_a_409_and_keeps_its_history(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool_id = _pool_of_both(r)
            status, _ = await r.call(ROOT, "POST", f"/v1/pools/{pool_id}/close",
                                     {"reason": "maintenance"})
            assert status == 200
            first = r.c.store.pool(pool_id)
            status, answer = await r.call(ROOT, "POST", f"/v1/pools/{pool_id}/close",
                                          {"reason": "oops"})
            assert status == 409 and answer["error"]["code"] == "pool-not-running"
            again = r.c.store.pool(pool_id)
            assert first is not None and again is not None
            assert (again.closed_at, again.reason) == (first.closed_at, "maintenance")

    asyncio.run(main())


def test_an_admin_registering_anothers_job_gets_it_without_its_secret(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, register=((ALICE, A),)) as r:
            status, answer = await r.call(OPS, "POST", "/v1/jobs",
                                          {"job_id": A, "env": {"SLURMRL_GPUS": "2"}})
            assert status == 200 and answer["job"]["user"] == "alice"
            assert "secret" not in answer["job"] or answer["job"]["secret"] is None
            status, mine = await r.call(ALICE, "POST", "/v1/jobs",
                                        {"job_id": A, "env": {"SLURMRL_GPUS": "2"}})
            assert status == 200 and mine["job"]["secret"]

    asyncio.run(main())


def test_a_refused_shrink_names_the_gpus_in_the_callers_job_local_numbers(
        tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool = r.c.open_pool(gpus=4, slurm_job_id=None)
            r.c.place_job(A, pool.pool_id, (2, 3))
            _, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                   {"phase": "train", "wait_s": 0})
            lid = held["lease"]["lease_id"]
            path = f"/v1/jobs/{A}/leases/{lid}/shrink"
            status, _ = await r.call(ALICE, "POST", path, {"gpus": [0]})
            assert status == 200
            status, answer = await r.call(ALICE, "POST", path, {"gpus": [1]})
            assert status == 409
            assert answer["error"]["message"] == (
                "a shrink keeps a non-empty subset of the lease's GPUs [0] (job-local), "
                "got [1]")

    asyncio.run(main())


def test_a_shrink_cutting_a_service_is_a_400_naming_it_and_changes_nothing(
        tmp_path: Path) -> None:
    # a shrink of a lease holding one engine over both GPUs was granted: the GPU it gave
    # back still held the engine, and the partner's grant there was given back
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool = r.c.open_pool(gpus=4, slurm_job_id=None)
            r.c.place_job(A, pool.pool_id, (2, 3))
            r.c.store.add_service(job_id=A, role="rollout", started_at=0.0,
                                  pool_id=pool.pool_id, gpus=(2, 3))
            _, held = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                   {"phase": "rollout", "wait_s": 0})
            lid = held["lease"]["lease_id"]
            path = f"/v1/jobs/{A}/leases/{lid}"
            for body, got in (({"keep": 1}, "keep=1"), ({"gpus": [1]}, "gpus [1]")):
                status, answer = await r.call(ALICE, "POST", f"{path}/shrink", body)
                assert (status, answer["error"]) == (400, {
                    "code": "bad-value",
                    "message": f"a shrink keeps whole services: job {A}'s rollout services "
                               f"span all of its job-local GPUs [0, 1] in lease {lid}; "
                               f"got {got}"})
            _, now = await r.call(ALICE, "GET", path)
            assert now["lease"]["gpus"] == held["lease"]["gpus"] == [2, 3]  # pool GPUs

    asyncio.run(main())


def test_status_of_one_user_lists_only_that_users_leases(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool = r.c.open_pool(gpus=4, slurm_job_id=None)
            r.c.place_job(A, pool.pool_id, (0, 1))
            r.c.place_job(B, pool.pool_id, (2, 3))
            await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases", {"phase": "train", "wait_s": 0})
            await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", {"phase": "train", "wait_s": 0})
            for query in ("user=alice", f"ids={A}"):
                status, answer = await r.call(ALICE, "GET", f"/v1/status?{query}")
                assert status == 200
                assert [j["job_id"] for j in answer["jobs"]] == [A]
                assert [x["job_id"] for x in answer["leases"]] == [A], query
            _, everyone = await r.call(ALICE, "GET", "/v1/status")
            assert sorted(x["job_id"] for x in everyone["leases"]) == [A, B]

    asyncio.run(main())


def test_only_its_owner_registers_a_job_admins_included(tmp_path: Path) -> None:
    # a registration's request (the model, ...) is the caller's, and the job's services
    # run as the job's owner: an admin registering Bob's job chose what ran as Bob
    async def main() -> None:
        async with rig(tmp_path, register=()) as r:
            for who in (OPS, ALICE):
                status, answer = await r.call(who, "POST", "/v1/jobs", {
                    "job_id": B, "env": {"SLURMRL_GPUS": "2", "SLURMRL_MODEL": "/x/m"}})
                assert status == 403 and answer["error"]["code"] == "not-your-job"
                assert "only its owner registers it" in answer["error"]["message"]
            assert r.c.store.job(B) is None
            status, _ = await r.call(BOB, "POST", "/v1/jobs",
                                     {"job_id": B, "env": {"SLURMRL_GPUS": "2"}})
            assert status == 200

    asyncio.run(main())


async def _stream(r: Rig, who: Identity) -> aiohttp.ClientWebSocketResponse:
    return await r.client.ws_connect("/v1/stream",
                                     headers=r.signed(who, "GET", "/v1/stream", b""))


async def _frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
    msg = await ws.receive(timeout=10)
    assert msg.type is aiohttp.WSMsgType.TEXT, (msg.type, msg.data, msg.extra)
    return json.loads(msg.data)  # type: ignore[no-any-return]


def test_a_stream_closed_at_its_ttl_keeps_its_waiting_acquires_queued(
        tmp_path: Path) -> None:
    # the controller closes a stream whose session TTL passed and the driver reopens it:
    # its waiting acquire was withdrawn as if the driver had gone, and lost its place
    async def main() -> None:
        async with rig(tmp_path) as r:
            _pool_of_both(r)
            await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", {"phase": "train", "wait_s": 0})
            r.client.server.app[SESSIONS].ttl_s = 1.0  # streams opened from now on
            ws = await _stream(r, ALICE)
            await ws.send_str(json.dumps({"id": 1, "op": "acquire", "job_id": A,
                                          "phase": "rollout", "wait_s": 60}))
            await asyncio.sleep(0.3)
            (waiting,) = r.c.scheduler.tables[r.c.store.job(A).pool_id].waiting  # type: ignore[union-attr,index]
            await asyncio.sleep(1.0)  # past the TTL
            await ws.send_str(json.dumps({"id": 2, "op": "heartbeat", "job_id": A}))
            msg = await ws.receive(timeout=10)
            assert msg.type is aiohttp.WSMsgType.CLOSE and msg.data == 4401
            await asyncio.sleep(0.2)
            rec = r.c.store.lease(waiting.request_id)
            assert rec is not None and rec.state is LeaseState.WAITING
            again = await _stream(r, ALICE)  # the reopened stream's acquire joins it
            await again.send_str(json.dumps({"id": 3, "op": "acquire", "job_id": A,
                                             "phase": "rollout", "wait_s": 0}))
            answer = await _frame(again)
            assert (answer["status"], answer["request_id"]) == (202, waiting.request_id)
            await again.close()

    asyncio.run(main())


def test_a_frame_over_the_body_limit_gets_a_413_frame_and_the_stream_goes_on(
        tmp_path: Path) -> None:
    # it closed the stream (1009), withdrawing its waiting acquires; over HTTP the same
    # body is a 413 and changes nothing
    async def main() -> None:
        async with rig(tmp_path) as r:
            _pool_of_both(r)
            await r.call(BOB, "POST", f"/v1/jobs/{B}/leases", {"phase": "train", "wait_s": 0})
            ws = await _stream(r, ALICE)
            await ws.send_str(json.dumps({"id": 1, "op": "acquire", "job_id": A,
                                          "phase": "rollout", "wait_s": 60}))
            await asyncio.sleep(0.3)
            big = r.c.config.controller.max_body_bytes + 10
            await ws.send_str(json.dumps({"id": 2, "op": "heartbeat", "job_id": A,
                                          "pad": "x" * big}))
            refused = await _frame(ws)
            assert (refused["id"], refused["status"]) == (2, 413)
            assert refused["error"]["code"] == "too-large"
            await ws.send_str(json.dumps({"id": 3, "op": "heartbeat", "job_id": A}))
            beat = await _frame(ws)
            assert (beat["id"], beat["status"]) == (3, 200)
            pool = r.c.store.job(A).pool_id  # type: ignore[union-attr]
            assert [w.job_id for w in r.c.scheduler.tables[pool].waiting] == [A]  # type: ignore[index]
            await ws.close()

    asyncio.run(main())


def test_every_answer_with_a_job_in_it_says_the_same_of_it(tmp_path: Path) -> None:
    # the list, the status and a repeated registration (another rank) said "not
    # floating" and, re-registering, "no GPU-seconds": only GET /v1/jobs/{id} was right
    async def main() -> None:
        async with rig(tmp_path, register=((ALICE, A),)) as r:
            pool = r.c.open_pool(gpus=2, slurm_job_id=777, floating=True)
            r.c.place_job(A, pool.pool_id, (0, 1))
            _, got = await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases",
                                  {"phase": "train", "wait_s": 0})
            await asyncio.sleep(0.2)
            await r.call(ALICE, "POST", f"/v1/jobs/{A}/leases/{got['lease']['lease_id']}/release",
                         {})
            one = (await r.call(ALICE, "GET", f"/v1/jobs/{A}"))[1]["job"]
            listed = (await r.call(ALICE, "GET", "/v1/jobs"))[1]["jobs"][0]
            status = (await r.call(ALICE, "GET", "/v1/status"))[1]["jobs"][0]
            again = (await r.call(ALICE, "POST", "/v1/jobs",
                                  {"job_id": A, "env": {"SLURMRL_GPUS": "2"}}))[1]["job"]
            assert one["floating"] is True and one["gpu_seconds"] > 0.3
            for view in (listed, status, again):
                for key in ("floating", "gpu_seconds", "lease_wait_seconds", "slowdown"):
                    assert view[key] == pytest.approx(one[key]), (key, view[key], one[key])

    asyncio.run(main())


def test_only_an_admin_closes_a_pool_and_only_its_owner_reads_or_reports_for_a_job(
        tmp_path: Path) -> None:
    # closing a shared pool cancels every member's job: a user closing it ended Bob's
    async def main() -> None:
        async with rig(tmp_path) as r:
            pool_id = _pool_of_both(r)
            status, answer = await r.call(ALICE, "POST", f"/v1/pools/{pool_id}/close",
                                          {"reason": "mine now"})
            assert (status, answer["error"]["code"]) == (403, "admin-only"), answer
            pool = r.c.store.pool(pool_id)
            assert pool is not None and pool.state == "open"
            assert r.c.store.job(B).state is JobState.RUNNING  # type: ignore[union-attr]
            # Bob's lease is not Alice's to read, nor his job hers to report timings for
            _, got = await r.call(BOB, "POST", f"/v1/jobs/{B}/leases",
                                  {"phase": "train", "wait_s": 0})
            lease_id = got["lease"]["lease_id"]
            status, answer = await r.call(ALICE, "GET", f"/v1/jobs/{B}/leases/{lease_id}")
            assert (status, answer["error"]["code"]) == (403, "not-your-job"), answer
            status, answer = await r.call(ALICE, "POST", f"/v1/jobs/{B}/observations",
                                          {"phase": "reward", "started_at": 1.0,
                                           "ended_at": 2.0})
            assert (status, answer["error"]["code"]) == (403, "not-your-job"), answer
            assert r.c.store.observations(B) == []
            status, _ = await r.call(OPS, "POST", f"/v1/pools/{pool_id}/close",
                                     {"reason": "maintenance"})
            assert status == 200
            assert r.c.store.job(B).state is JobState.CANCELLED  # type: ignore[union-attr]

    asyncio.run(main())
