"""Start a real service server on loopback, in a thread of the test process."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slurmrl.worker.protocol import GenerateParams, Role, ServiceBackend, TrainSample
from slurmrl.worker.server import ServiceInfo, ServiceServer, serve
from slurmrl.worker.tiny import TinyBackend


@dataclass
class Running:
    server: ServiceServer
    address: str
    secret: str


#: the launch id a stand-in announces (a real service picks a random one at start)
STANDIN_LAUNCH = "0123456789abcdef"


def start(
    role: Role, secret: str, max_body_bytes: int = 1 << 20, control_secret: str | None = None,
    handoff_dir: Path | None = None, backend: ServiceBackend | None = None, port: int = 0,
) -> tuple[Running, Callable[[], None]]:
    """A service on loopback, on `port` (0: any free one; a given one may be that of a
    stopped service, as a relaunch on its node takes), and what stops it."""
    server = ServiceServer(backend or TinyBackend(role), secret,
                           ServiceInfo("42", str(role), "tiny"),
                           max_body_bytes=max_body_bytes, control_secret=control_secret,
                           handoff_dir=handoff_dir)
    ready = threading.Event()
    loop = asyncio.new_event_loop()

    def on_ready(p: int) -> None:
        ready.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(server, "127.0.0.1", port, on_ready,
                                      install_signals=False))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(30), "service did not start"

    def stop() -> None:
        loop.call_soon_threadsafe(server.stopped.set)
        thread.join(30)

    assert server.address is not None
    return Running(server, server.address, secret), stop


@contextmanager
def http_standin(handler: type[BaseHTTPRequestHandler], port: int = 0) -> Iterator[str]:
    """A plain HTTP server on loopback answering with `handler` (a service stand-in that
    answers as a test says), on `port` (0: any free one; a given one may be a stopped
    service's, which it binds as another user's process could); yields the name it
    goes by, `host:port/STANDIN_LAUNCH`, as a service announces itself."""
    srv = ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{srv.server_address[1]}/{STANDIN_LAUNCH}"
    finally:
        srv.shutdown()
        srv.server_close()


def raw_call(address: str, method: str, path: str, body: bytes,
             headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    """One HTTP request to a service as the bytes and headers given (no signing, no
    checks): what a caller outside `ServiceHandle`, or a replayer, sends."""
    conn = http.client.HTTPConnection(*host_port(address), timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def host_port(address: str) -> tuple[str, int]:
    """Where the service named `address` (`host:port/launch`) listens."""
    host, port = address.partition("/")[0].rsplit(":", 1)
    return host, int(port)


def train_batches(n: int, prompts: tuple[str, ...] = ("1+2=", "30*4=", "9-7="),
                  ) -> list[list[TrainSample]]:
    """n different policy-gradient batches (advantages 1, -0.5, 0.25) sampled by a
    fresh tiny rollout: the same batches in every test that trains two copies alike."""
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    out = []
    for i in range(n):
        samples = roll.generate(list(prompts), GenerateParams(max_tokens=8, seed=i)).samples
        out.append([s.with_advantage(a) for s, a in zip(samples, (1.0, -0.5, 0.25),
                                                        strict=True)])
    return out
