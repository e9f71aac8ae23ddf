"""The RPC app in process (a fake Slurm, a real Store and Controller), as a caller sees it:
malformed bodies and frames, a malformed credential, and where `/metrics` is served."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import WSMsgType
from aiohttp.test_utils import TestClient, TestServer

from slurmrl.auth import sessions
from slurmrl.auth.tokens import TIMESTAMP
from slurmrl.config import Config, ControllerConfig
from slurmrl.controller.core import Controller
from slurmrl.controller.server import SESSIONS, make_app, serve
from slurmrl.db import Store
from slurmrl.model import Identity, JobState
from slurmrl.slurm import JobInfo, SlurmJobState

ALICE = Identity(1001, 1001, "alice")
DEEP = b"[" * 50_000  # json's decoder recurses once per level: RecursionError, not ValueError


class FakeSlurm:
    """Slurm as registration sees it: the `running` jobs (job id -> owner) run; by
    default alice's job 100."""

    def __init__(self, running: dict[int, Identity] | None = None) -> None:
        self.known = {job: JobInfo(job_id=job, name=f"j{job}", user=who.user, uid=who.uid,
                                   state=SlurmJobState.RUNNING, partition="cpu",
                                   nodes=("n1",))
                      for job, who in (running or {100: ALICE}).items()}

    def job(self, job_id: int) -> JobInfo | None:
        return self.known.get(job_id)

    def jobs(self, job_ids: Sequence[int] | None = None,
             user: str | None = None) -> list[JobInfo]:
        return [j for j in self.known.values() if job_ids is None or j.job_id in job_ids]


@dataclass
class Rig:
    c: Controller
    client: TestClient[Any, Any]
    session: sessions.SessionGrant

    async def call(self, method: str, path: str, body: bytes = b"",
                   headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        signed = sessions.sign(self.session.session_id, self.session.key, method, path, body)
        r = await self.client.request(method, path, data=body,
                                      headers={**signed, **(headers or {})})
        return r.status, await r.json()


@asynccontextmanager
async def rig(tmp_path: Path, cfg: Config | None = None) -> AsyncIterator[Rig]:
    store = Store(tmp_path / "c.db")
    c = Controller(cfg or Config(), store, FakeSlurm())  # type: ignore[arg-type]
    await c.pools.start(c)
    app = make_app(c)
    client = TestClient(TestServer(app))
    await client.start_server()
    try:
        r = Rig(c, client, app[SESSIONS].open(ALICE))
        status, _ = await r.call("POST", "/v1/jobs",
                                 json.dumps({"job_id": 100, "env": {"SLURMRL_GPUS": "2"}}).encode())
        assert status == 200
        yield r
    finally:
        await client.close()
        store.close()


def test_a_deeply_nested_body_is_a_400_naming_the_nesting(tmp_path: Path) -> None:
    async def main() -> tuple[int, dict[str, Any]]:
        async with rig(tmp_path) as r:
            return await r.call("POST", "/v1/jobs/100/heartbeat", DEEP)

    status, answer = asyncio.run(main())
    assert status == 400
    assert answer["error"]["code"] == "bad-request"
    assert "nested too deeply" in answer["error"]["message"]


def test_a_key_or_query_parameter_given_twice_is_a_400_and_changes_nothing(
        tmp_path: Path) -> None:
    # which of the two values counts would be the decoder's choice, not the caller's
    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with rig(tmp_path) as r:
            out = [await r.call("POST", "/v1/jobs/100/leases",
                                b'{"phase": "rollout", "phase": "train", "wait_s": 0}'),
                   await r.call("POST", "/v1/jobs/100/observations",
                                b'{"phase": "reward", "started_at": 1, "ended_at": 2, '
                                b'"detail": {"reward": 1, "reward": 0}}'),
                   await r.call("GET", "/v1/jobs?user=alice&user=bob")]
            assert r.c.store.leases() == [] and r.c.store.observations() == []
            return out

    (lease, obs, query) = asyncio.run(main())
    assert lease[0] == 400 and lease[1]["error"]["message"] == (
        "request body: key 'phase' is given twice")
    assert obs[0] == 400 and "key 'reward' is given twice" in obs[1]["error"]["message"]
    assert query[0] == 400 and query[1]["error"]["message"] == (
        "query parameter(s) given twice: user")


def test_a_timestamp_of_a_superscript_digit_is_a_401_not_a_500(tmp_path: Path) -> None:
    async def main() -> tuple[int, dict[str, Any]]:
        async with rig(tmp_path) as r:
            return await r.call("GET", "/v1/jobs", headers={TIMESTAMP: "\u00b2"})

    status, answer = asyncio.run(main())
    assert status == 401
    assert answer["error"]["code"] == "auth-malformed"


def test_a_deep_frame_gets_an_error_frame_and_the_stream_carries_on(tmp_path: Path) -> None:
    async def main() -> list[dict[str, Any]]:
        async with rig(tmp_path) as r:
            s = r.session
            ws = await r.client.ws_connect(
                "/v1/stream", headers=sessions.sign(s.session_id, s.key, "GET", "/v1/stream"))
            # job 100 has no pool: this acquire waits (1 s) while the stream reads on
            await ws.send_str(json.dumps({"id": 5, "op": "acquire", "job_id": 100,
                                          "phase": "rollout", "wait_s": 1}))
            await ws.send_str('{"id": 6, "op": "heartbeat", "job_id": 100, "x": '
                              + DEEP.decode())
            await ws.send_str(json.dumps({"id": 7, "op": "heartbeat", "job_id": 100}))
            frames = []
            for _ in range(3):
                msg = await ws.receive(timeout=10)
                assert msg.type is WSMsgType.TEXT, (msg.type, msg.data, msg.extra)
                frames.append(json.loads(msg.data))
            await ws.close()
            return frames

    error, heartbeat, acquire = asyncio.run(main())
    assert error["id"] is None and error["status"] == 400
    assert "nested too deeply" in error["error"]["message"]
    assert (heartbeat["id"], heartbeat["status"]) == (7, 200)
    # the waiting acquire was not cancelled with the stream: it is answered when it times out
    assert (acquire["id"], acquire["status"], acquire["state"]) == (5, 202, "unplaced")


def _metrics_status(tmp_path: Path, cfg: Config) -> int:
    async def main() -> int:
        async with rig(tmp_path, cfg) as r:
            resp = await r.client.get("/metrics")  # no credential, like Prometheus
            return resp.status

    return asyncio.run(main())


def test_metrics_are_served_on_the_rpc_port_by_default(tmp_path: Path) -> None:
    assert _metrics_status(tmp_path, Config()) == 200


def test_metrics_count_the_jobs_by_state(tmp_path: Path) -> None:
    async def main() -> str:
        async with rig(tmp_path) as r:  # alice's job 100 registered
            resp = await r.client.get("/metrics")
            return await resp.text()

    text = asyncio.run(main())
    got = {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
           for line in text.splitlines() if line.startswith("slurmrl_jobs{")}
    assert set(got) == {"PD", "R", "CD", "F", "CA"} and sum(got.values()) == 1


def test_metrics_enabled_false_serves_no_metrics(tmp_path: Path) -> None:
    cfg = Config(controller=ControllerConfig(metrics_enabled=False))
    assert _metrics_status(tmp_path, cfg) == 404


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_port_serves_metrics_there_and_not_on_the_rpc_port(tmp_path: Path) -> None:
    rpc_port, metrics_port = _free_port(), _free_port()
    cfg = Config(controller=ControllerConfig(metrics_port=metrics_port))

    async def main() -> tuple[int, int, int, str]:
        store = Store(tmp_path / "c.db")
        c = Controller(cfg, store, FakeSlurm())  # type: ignore[arg-type]
        runner = await serve(c, "127.0.0.1", rpc_port)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{rpc_port}/metrics") as r:
                    on_rpc = r.status
                async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
                    on_metrics, text = r.status, await r.text()
                async with http.get(f"http://127.0.0.1:{metrics_port}/v1/ping") as r:
                    ping = r.status
        finally:
            await runner.cleanup()
            await c.stop()
            store.close()
        return on_rpc, on_metrics, ping, text

    on_rpc, on_metrics, ping, text = asyncio.run(main())
    assert (on_rpc, on_metrics, ping) == (404, 200, 404)
    assert "slurmrl_lease_requests_waiting" in text


def test_a_head_of_ping_needs_no_credential_as_its_get(tmp_path: Path) -> None:
    # a load balancer's health check: HEAD /v1/ping was refused 401
    async def main() -> tuple[int, int]:
        async with rig(tmp_path) as r:
            head = await r.client.head("/v1/ping")
            get = await r.client.get("/v1/ping")
            return head.status, get.status

    assert asyncio.run(main()) == (200, 200)


def test_a_stop_does_not_wait_out_a_drivers_long_poll(tmp_path: Path) -> None:
    # a driver waiting for GPUs (a 30 s long poll by default, up to 300 s) held a stop
    # for as long, past systemd's TimeoutStopSec: SIGKILL, `Result: timeout`
    async def main() -> float:
        store = Store(tmp_path / "c.db")
        c = Controller(Config(), store, FakeSlurm())  # type: ignore[arg-type]
        with socket.create_server(("127.0.0.1", 0)) as free:
            port = free.getsockname()[1]
        runner = await serve(c, "127.0.0.1", port)
        grant = runner.app[SESSIONS].open(ALICE)
        url = f"http://127.0.0.1:{port}"

        async def call(path: str, body: dict[str, Any]) -> int:
            raw = json.dumps(body).encode()
            signed = sessions.sign(grant.session_id, grant.key, "POST", path, raw)
            async with aiohttp.ClientSession() as s, \
                    s.post(url + path, data=raw, headers=signed) as r:
                return r.status

        assert await call("/v1/jobs", {"job_id": 100, "env": {"SLURMRL_GPUS": "2"}}) == 200
        poll = asyncio.ensure_future(call("/v1/jobs/100/leases",
                                          {"phase": "rollout", "wait_s": 120}))
        await asyncio.sleep(0.5)  # waiting (the job has no pool)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        c.scheduler.stopping = True  # as `slurmrl controller` does on SIGTERM
        await runner.cleanup()
        took = loop.time() - t0
        await c.stop()
        store.close()
        with contextlib.suppress(aiohttp.ClientError):
            await poll  # the driver sees its connection drop, and retries
        return took

    assert asyncio.run(main()) < 10.0


def test_a_gap_outside_the_jobs_life_is_a_400_naming_the_clock_and_changes_nothing(
        tmp_path: Path) -> None:
    # time.monotonic() stamps (seconds since boot), or a gap ending in 2^40 s: stored,
    # they made the job's steps years long and a partner was placed beside it
    async def main() -> list[tuple[int, dict[str, Any]]]:
        async with rig(tmp_path) as r:
            now = time.time()
            out = [await r.call("POST", "/v1/jobs/100/observations",
                                json.dumps({"phase": "reward", "started_at": a,
                                            "ended_at": b}).encode())
                   for a, b in ((5000.0, 5004.0), (now - 5.0, 2.0**40))]
            assert r.c.store.observations() == []
            out.append(await r.call("POST", "/v1/jobs/100/observations",
                                    json.dumps({"phase": "reward", "started_at": now - 5.0,
                                                "ended_at": now - 1.0}).encode()))
            return out

    *bad, good = asyncio.run(main())
    for status, answer in bad:
        assert status == 400 and answer["error"]["code"] == "bad-value"
        assert "wall-clock time (time.time()) within the job's life" in (
            answer["error"]["message"])
    assert good[0] == 200


async def _open_stream(r: Rig, s: sessions.SessionGrant,
                       path: str = "/v1/stream") -> aiohttp.ClientWebSocketResponse:
    return await r.client.ws_connect(path, headers=sessions.sign(s.session_id, s.key, "GET",
                                                                 path))


def test_a_stream_ends_with_the_session_that_opened_it(tmp_path: Path) -> None:
    # a stream opened with a session tied to job 100 went on acting on the user's other
    # jobs after job 100 ended (HTTP refused the session), and one opened just before
    # its session expired went on for another whole TTL
    async def main() -> tuple[list[Any], list[Any]]:
        async with rig(tmp_path) as r:
            table = r.client.app[SESSIONS]
            closes = []
            for end in ("close", "job"):
                s = table.open(ALICE, job_id=100 if end == "job" else None)
                ws = await _open_stream(r, s)
                await ws.send_str(json.dumps({"id": 1, "op": "heartbeat", "job_id": 100}))
                first = json.loads((await ws.receive(timeout=10)).data)
                assert first["status"] == 200, first
                if end == "job":
                    await r.c.end_job(100, JobState.CANCELLED, "scancelled")
                else:  # as when it expires: gone from the table
                    table._sessions.pop(s.session_id)
                await ws.send_str(json.dumps({"id": 2, "op": "heartbeat", "job_id": 100}))
                msg = await ws.receive(timeout=10)
                closes.append((msg.type, ws.close_code, msg.extra))
            status = await r.call("GET", "/v1/jobs")  # the rig's own session lives on
            return closes, [status[0]]

    closes, status = asyncio.run(main())
    assert closes[0] == (WSMsgType.CLOSE, 4401, "session closed: reopen")
    assert closes[1] == (WSMsgType.CLOSE, 4401, "session tied to RL job 100, which has "
                         "ended: reopen")
    assert status == [200]


def test_a_frame_id_of_a_waiting_acquire_is_refused_for_any_op(tmp_path: Path) -> None:
    # a heartbeat reusing it was answered under the acquire's id: a client matching
    # answers by id took it for the acquire's
    async def main() -> list[dict[str, Any]]:
        async with rig(tmp_path) as r:
            ws = await _open_stream(r, r.session)
            await ws.send_str(json.dumps({"id": 1, "op": "acquire", "job_id": 100,
                                          "phase": "rollout", "wait_s": 1}))
            await asyncio.sleep(0.2)
            await ws.send_str(json.dumps({"id": 1, "op": "heartbeat", "job_id": 100}))
            frames = [json.loads((await ws.receive(timeout=10)).data) for _ in range(2)]
            await ws.close()
            return frames

    reused, acquire = asyncio.run(main())
    assert (reused["id"], reused["status"], reused["error"]["code"]) == (1, 400, "bad-value")
    assert "frame id 1 is still in use" in reused["error"]["message"]
    assert (acquire["id"], acquire["status"]) == (1, 202)


def test_a_stream_upgrade_with_a_query_parameter_is_a_400(tmp_path: Path) -> None:
    async def main() -> int:
        async with rig(tmp_path) as r:
            with contextlib.suppress(aiohttp.WSServerHandshakeError):
                await _open_stream(r, r.session, "/v1/stream?foo=1")
                return 101
            s = r.session
            resp = await r.client.get("/v1/stream?foo=1", headers=sessions.sign(
                s.session_id, s.key, "GET", "/v1/stream?foo=1"))
            return resp.status

    assert asyncio.run(main()) == 400


def test_a_peer_gone_before_its_answer_is_no_internal_error(
        caplog: pytest.LogCaptureFixture) -> None:
    # a driver killed mid-stream: its answer's write raised, logged as an internal
    # error with a traceback, and counted as an RPC 500
    from slurmrl.controller.stream import Stream

    class Gone:  # stands in for the WebSocket whose transport closed (no socket here)
        closed = False

        async def send_json(self, data: Any) -> None:
            raise ConnectionResetError("Cannot write to closing transport")

    stream = Stream(None, ALICE, Gone())  # type: ignore[arg-type]
    with caplog.at_level("WARNING"):
        asyncio.run(stream.send(1, 200, {"ok": True}))
    assert caplog.records == []
