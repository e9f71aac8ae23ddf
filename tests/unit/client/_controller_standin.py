"""A stand-in controller on loopback for the driver client's unit tests.

A threaded HTTP server in the test process that speaks the wire format of docs/rpc.md
(JSON bodies, `{"error": {"code", "message"}}` refusals) but keeps no state of its own
beyond the lease it hands out: each test sets the answers of the routes it exercises and
reads back the calls it got. It checks no credential (the client's MUNGE signing is
stubbed by the fixture). What the real controller does on its side of these calls is
tested in tests/unit/controller.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

JOB_ID = 42


@dataclass(frozen=True)
class Call:
    method: str
    path: str  #: with the query string
    body: Any


#: an answer: (status, JSON-able value) or (status, raw bytes sent as they are)
Answer = tuple[int, Any]
Route = Callable[[Call], Answer]


def lease(lease_id: int = 5, state: str = "held", reason: str = "") -> dict[str, Any]:
    """A LeaseView of job 42's rollout on job-local GPUs 0 and 1."""
    return {"lease_id": lease_id, "job_id": JOB_ID, "pool_id": 1, "phase": "rollout",
            "state": state, "gpus": [0, 1], "local_gpus": [0, 1], "physical_gpus": [0, 1],
            "requested_at": time.time(), "granted_at": time.time(),
            "deadline_at": time.time() + 10, "released_at": None, "reason": reason,
            "heartbeat_s": 0.05, "ngpus": 2}


def error(status: int, code: str, message: str) -> Answer:
    return status, {"error": {"code": code, "message": message}}


def until(cond: Callable[[], object], within_s: float = 10.0) -> None:
    """Wait for `cond` (what a background thread does), failing after `within_s`."""
    deadline = time.monotonic() + within_s
    while not cond():
        assert time.monotonic() < deadline, "not within time"
        time.sleep(0.02)


class StandIn:
    """Routes are keyed by method and path with every id as N:
    `standin.routes["POST", "/v1/jobs/N/leases"] = lambda call: (200, {...})`."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.held: list[dict[str, Any]] = []  #: what heartbeats answer as held
        self.routes: dict[tuple[str, str], Route] = {
            ("POST", "/v1/sessions"): lambda c: (200, {"session": {
                "session_id": "a" * 32, "key": "b" * 64, "expires_at": time.time() + 3600,
                "job_id": JOB_ID, "uid": 1000}}),
            ("POST", "/v1/jobs"): lambda c: (200, {"job": {"job_id": JOB_ID, "secret": "s"}}),
            ("POST", "/v1/jobs/N/heartbeat"): lambda c: (200, {
                "job_id": JOB_ID, "state": "R", "held": self.held, "heartbeat_s": 0.05}),
            ("POST", "/v1/jobs/N/leases"): self._grant,
            ("POST", "/v1/jobs/N/leases/N/release"): self._release,
            ("POST", "/v1/jobs/N/leases/N/shrink"): lambda c: (200, {"lease": lease()}),
            ("POST", "/v1/jobs/N/end"): lambda c: (200, {"job_id": JOB_ID, "state": "CD"}),
        }
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        daemon=True)
        self._thread.start()

    def _grant(self, call: Call) -> Answer:
        self.held = [lease()]
        return 200, {"lease": self.held[0]}

    def _release(self, call: Call) -> Answer:
        self.held = []
        return 200, {"lease": lease(state="released")}

    def seen(self, method: str, pattern: str) -> list[Call]:
        """The calls got so far to a route (as keyed in `routes`)."""
        with self._lock:
            return [c for c in self.calls if c.method == method and _key(c.path) == pattern]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def _answer(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                call = Call(method, self.path, json.loads(raw) if raw else None)
                with standin._lock:
                    standin.calls.append(call)
                route = standin.routes.get((method, _key(self.path)))
                status, body = (route(call) if route is not None else
                                error(404, "http", f"Not Found: {method} {self.path}"))
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def _key(path: str) -> str:
    return re.sub(r"/[0-9]+(?=/|$)", "/N", path.split("?")[0])
