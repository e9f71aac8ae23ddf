"""Lease handoff latency and throughput: the full RPC beside in-process and asyncio floors.

N fake drivers contend for one pool GPU: each loops acquire -> hold -> release. The
handoff latency is the time from a holder *sending* its release to the next driver
*receiving* its grant (both stamped in the drivers' process, one clock). Three rows:

1. `asyncio.Lock`: N tasks, one lock, same hold — the floor of any asyncio handoff.
2. `scheduler (in-process)`: the controller's LeaseScheduler + SQLite Store, no RPC.
3. `RPC session (HMAC + HTTP + SQLite)`: a real `slurmrl controller` process on
   loopback; each driver (aiohttp, in this process) opens a session with one MUNGE
   credential and signs every request with the session's HMAC (what `slurmrl.client`
   drivers do).
4. `RPC MUNGE (MUNGE + HTTP + SQLite)`: the same with a fresh MUNGE credential per
   request (what a one-shot `slurmrl status` does), for comparison.

The controller's DB is pre-filled with `--jobs` registered RL jobs (default 10,000:
the benchmark drivers plus pending and ended ones), to show the DB size does not slow
the lease path. Needs munged (`slurmrl dev-cluster up` or the system munged).

    python benchmarks/lease_latency.py [--drivers 8] [--seconds 10] [--hold-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

# benchmarks/policies.py would shadow the `policies` package when run as a script
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

from policies.registry import load  # noqa: E402
from slurmrl.auth.requests import sign_request  # noqa: E402
from slurmrl.auth.sessions import sign  # noqa: E402
from slurmrl.controller.scheduler import LeaseScheduler  # noqa: E402
from slurmrl.db import JobRecord, Store  # noqa: E402
from slurmrl.model import JobState, Phase, RlRequest  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class Meter:
    """Handoffs (release sent -> next grant received) and op counts."""

    def __init__(self) -> None:
        self.last_release: float | None = None
        self.handoffs: list[float] = []
        self.ops = 0
        self.started = time.perf_counter()

    def granted(self) -> None:
        now = time.perf_counter()
        if self.last_release is not None:
            self.handoffs.append(now - self.last_release)
            self.last_release = None
        self.ops += 1

    def releasing(self) -> None:
        self.last_release = time.perf_counter()
        self.ops += 1

    def row(self, name: str) -> str:
        h = sorted(self.handoffs) or [float("nan")]
        p50 = statistics.median(h) * 1e3
        p99 = h[min(len(h) - 1, int(len(h) * 0.99))] * 1e3
        rate = self.ops / (time.perf_counter() - self.started)
        return f"{name:30} {p50:9.3f} {p99:9.3f} {rate:10.0f} {len(self.handoffs):9d}"


async def bench_lock(n: int, seconds: float, hold_s: float) -> Meter:
    lock, m = asyncio.Lock(), Meter()
    stop = time.perf_counter() + seconds

    async def driver() -> None:
        while time.perf_counter() < stop:
            async with lock:
                m.granted()
                await asyncio.sleep(hold_s)
                m.releasing()
            await asyncio.sleep(0)

    await asyncio.gather(*(driver() for _ in range(n)))
    return m


def fill(store: Store, drivers: int, total: int) -> int:
    """A pool of one GPU with `drivers` member jobs, plus pending and ended jobs."""
    pool = store.add_pool(gpus=1, opened_at=time.time())
    req = RlRequest(gpus=1)
    now = time.time()
    with store.transaction():
        for i in range(1, total + 1):
            if i <= drivers:
                job = JobRecord(i, "root", 0, req, JobState.RUNNING, now, pool_id=pool,
                                pool_gpus=(0,))
            elif i % 10 == 0:
                job = JobRecord(i, "root", 0, req, JobState.PENDING, now, reason="PoolPending")
            else:
                job = JobRecord(i, "root", 0, req, JobState.COMPLETED, now, ended_at=now)
            store.add_job(job)
    return pool


async def bench_scheduler(n: int, seconds: float, hold_s: float, jobs: int,
                          db: Path) -> Meter:
    store = Store(db)
    store.checkpoint_in_background()
    fill(store, n, jobs)
    sched = LeaseScheduler(store, lambda: load("slice", "fifo"), 30.0)
    sched.restore()
    m = Meter()
    stop = time.perf_counter() + seconds

    async def driver(job_id: int) -> None:
        job = store.job(job_id)
        assert job is not None
        while time.perf_counter() < stop:
            t = sched.request(job, Phase.ROLLOUT)
            lease = t.lease or await sched.wait(t.request_id, 30.0)
            assert lease is not None
            m.granted()
            await asyncio.sleep(hold_s)
            m.releasing()
            sched.release(job, lease.lease_id, {})
            await asyncio.sleep(0)

    await asyncio.gather(*(driver(i) for i in range(1, n + 1)))
    store.close()
    return m


async def bench_rpc(n: int, seconds: float, hold_s: float, url: str,
                    sessions: bool) -> Meter:
    m = Meter()
    ready, stop = asyncio.Event(), float("inf")

    async def call(s: aiohttp.ClientSession, path: str, body: bytes,
                   session: tuple[str, str] | None) -> dict[str, object]:
        if session is None:
            headers = {"Authorization": sign_request("POST", path, body)}
        else:
            headers = sign(session[0], session[1], "POST", path, body)
        headers["Content-Type"] = "application/json"
        async with s.post(url + path, data=body, headers=headers) as r:
            out = await r.json()
            if r.status >= 400:
                raise RuntimeError(f"{path}: {r.status} {out}")
            assert isinstance(out, dict)
            return out

    async def driver(s: aiohttp.ClientSession, job_id: int) -> None:
        acquire = b'{"phase": "rollout", "wait_s": 30}'
        session = None
        if sessions:
            opened = await call(s, "/v1/sessions", f'{{"job_id": {job_id}}}'.encode(), None)
            info = opened["session"]
            assert isinstance(info, dict)
            session = (str(info["session_id"]), str(info["key"]))
        await ready.wait()
        while time.perf_counter() < stop:
            ans = await call(s, f"/v1/jobs/{job_id}/leases", acquire, session)
            lease = ans["lease"]
            assert isinstance(lease, dict)
            m.granted()
            await asyncio.sleep(hold_s)
            m.releasing()
            await call(s, f"/v1/jobs/{job_id}/leases/{lease['lease_id']}/release", b"{}",
                       session)

    async def start() -> None:
        nonlocal stop
        await asyncio.sleep(0.2)  # sessions opened: measure the steady state only
        m.started = time.perf_counter()
        stop = m.started + seconds
        ready.set()

    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        await asyncio.gather(start(), *(driver(s, i) for i in range(1, n + 1)))
    return m


async def bench_stream(n: int, seconds: float, hold_s: float, url: str) -> Meter:
    """Each driver: a session (one MUNGE credential), then one WebSocket `/v1/stream`
    opened with the session's HMAC; acquire/release are frames on it."""
    m = Meter()
    ready, stop = asyncio.Event(), float("inf")

    async def driver(s: aiohttp.ClientSession, job_id: int) -> None:
        body = f'{{"job_id": {job_id}}}'.encode()
        headers = {"Authorization": sign_request("POST", "/v1/sessions", body),
                   "Content-Type": "application/json"}
        async with s.post(url + "/v1/sessions", data=body, headers=headers) as r:
            info = (await r.json())["session"]
        headers = sign(info["session_id"], info["key"], "GET", "/v1/stream", b"")
        async with s.ws_connect(url + "/v1/stream", headers=headers) as ws:
            await ready.wait()
            fid = 0
            while time.perf_counter() < stop:
                fid += 1
                await ws.send_str(f'{{"id": {fid}, "op": "acquire", "job_id": {job_id}, '
                                  '"phase": "rollout", "wait_s": 30}')
                ans = await ws.receive_json()
                if ans.get("status") != 200:
                    raise RuntimeError(f"acquire: {ans}")
                m.granted()
                await asyncio.sleep(hold_s)
                m.releasing()
                fid += 1
                await ws.send_str(f'{{"id": {fid}, "op": "release", "job_id": {job_id}, '
                                  f'"lease_id": {ans["lease"]["lease_id"]}}}')
                ans = await ws.receive_json()
                if ans.get("status") != 200:
                    raise RuntimeError(f"release: {ans}")

    async def start() -> None:
        nonlocal stop
        await asyncio.sleep(0.3)  # streams opened: measure the steady state only
        m.started = time.perf_counter()
        stop = m.started + seconds
        ready.set()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(start(), *(driver(s, i) for i in range(1, n + 1)))
    return m


def start_controller(db: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, SLURMRL_CONTROLLER__RECONCILE_INTERVAL_S="3600",
               PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmrl.cli.main", "controller", "--port", str(port),
         "--db", str(db), "--lease-timeout", "30", "--log-level", "warning"],
        cwd=REPO, env=env)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("controller did not start")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--drivers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hold-ms", type=float, default=1.0)
    ap.add_argument("--jobs", type=int, default=10_000, help="registered jobs in the DB")
    ap.add_argument("--rows", default="stream,session,munge",
                    help="RPC rows to run (comma-separated: stream, session, munge)")
    a = ap.parse_args()
    hold = a.hold_ms / 1e3
    print(f"{a.drivers} drivers, one GPU, hold {a.hold_ms:g} ms, {a.seconds:g} s each, "
          f"{a.jobs} registered jobs in the DB; cpus={os.cpu_count()}")
    print(f"{'':30} {'p50 ms':>9} {'p99 ms':>9} {'ops/s':>10} {'handoffs':>9}")
    print(asyncio.run(bench_lock(a.drivers, a.seconds, hold)).row("asyncio.Lock (floor)"))
    with tempfile.TemporaryDirectory() as tmp:
        m = asyncio.run(bench_scheduler(a.drivers, a.seconds, hold, a.jobs,
                                        Path(tmp) / "inproc.db"))
        print(m.row("scheduler in-process (SQLite)"))
        db = Path(tmp) / "rpc.db"
        store = Store(db)
        fill(store, a.drivers, a.jobs)
        store.close()
        for mode, name in (("stream", "RPC stream (WebSocket+SQLite)"),
                           ("session", "RPC session (HMAC+HTTP+SQLite)"),
                           ("munge", "RPC MUNGE (MUNGE+HTTP+SQLite)")):
            if mode not in a.rows:
                continue
            proc, url = start_controller(db)
            try:
                run = (bench_stream(a.drivers, a.seconds, hold, url) if mode == "stream"
                       else bench_rpc(a.drivers, a.seconds, hold, url, mode == "session"))
                print(asyncio.run(run).row(name))
            finally:
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
