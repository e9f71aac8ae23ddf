"""Registration: a signed POST the controller can verify; clear errors otherwise.

One fake: the receiving end (`controller` fixture) is a stand-in HTTP endpoint on
loopback that checks signatures with the real `Verifier` and records what it got. The
controller (slurmrl/controller/server.py) serves no route that receives a service
registration, so nothing real here can take the POST."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from slurmrl.auth.errors import AuthError
from slurmrl.auth.tokens import Verifier, mint_secret
from slurmrl.worker.registration import (
    Registration,
    RegistrationError,
    register,
    write_address_file,
)

SECRET = mint_secret()
Endpoint = tuple[str, list[dict[str, object]]]
REG = Registration(job_id="77", role="rollout", address="node1:4242", pid=123, step_id="3")


@pytest.fixture
def controller() -> Iterator[Endpoint]:
    """A stand-in HTTP endpoint that checks signatures with the real Verifier."""
    received: list[dict[str, object]] = []
    verifier = Verifier(SECRET)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            try:
                verifier.verify(dict(self.headers), "POST", self.path, body)
            except AuthError as exc:
                self.send_response(401)
                self.end_headers()
                self.wfile.write(str(exc).encode())
                return
            received.append(json.loads(body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1/services?x=1", received
    server.shutdown()
    server.server_close()


def test_registration_is_signed_and_carries_the_service(controller: Endpoint) -> None:
    url, received = controller
    register(url, SECRET, REG)
    assert received == [
        {"job_id": "77", "role": "rollout", "address": "node1:4242", "pid": 123, "step_id": "3"}
    ]


def test_wrong_secret_is_a_refusal_not_a_retry(controller: Endpoint) -> None:
    url, received = controller
    with pytest.raises(RegistrationError, match="refused the registration \\(401\\)"):
        register(url, mint_secret(), REG)
    assert received == []


def test_unreachable_controller_and_bad_url() -> None:
    with pytest.raises(RegistrationError, match="after 2 attempts"):
        register("http://127.0.0.1:1/x", SECRET, REG, attempts=2, backoff_s=0.01)
    with pytest.raises(RegistrationError, match="not an http"):
        register("ftp://host/x", SECRET, REG)


def test_address_file_is_written_whole(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "addr"
    write_address_file(path, "h:1")
    write_address_file(path, "h:2")
    assert path.read_text() == "h:2\n"
    assert [p.name for p in path.parent.iterdir()] == ["addr"]  # no temp files left
