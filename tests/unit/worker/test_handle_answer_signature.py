"""A service's answers carry its signature, and a caller refuses one that does not.

A service shares its node with other users' services; one that died leaves its port to
whoever binds it next. Such a process must not answer for it: forged completions would
go into the driver's training, a forged state into the job's next copy. A real HTTP
server on loopback plays that process (no worker: the check is the handle's); the real
service's side (it signs every answer) runs in the worker server tests.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest
from _worker_service import http_standin

from slurmrl.auth.tokens import ANSWER, NONCE, answer_mac, stream_mac
from slurmrl.worker.handle import ServiceHandle, ServiceUnreachable

SECRET = "k" * 32


class _Squatter(BaseHTTPRequestHandler):
    """Answers as the test says: `mode` "unsigned", "other-key", "replay" (a signed
    answer of an earlier call), or "signed" (what the service would send)."""

    mode: ClassVar[str] = "unsigned"
    first_nonce: ClassVar[str | None] = None

    def do_GET(self) -> None:
        nonce = self.headers[NONCE]
        if self.path == "/v1/handoff":
            state = b"poisoned state" * 100
            mac = stream_mac("x" * 32 if self.mode != "signed" else SECRET, nonce)
            mac.update(state)
            body = state + mac.hexdigest().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        body = json.dumps({"state": "active", "residency": "active"}).encode()
        type(self).first_nonce = type(self).first_nonce or nonce
        signer = {"other-key": "x" * 32}.get(self.mode, SECRET)
        signed_for = self.first_nonce if self.mode == "replay" else nonce
        self.send_response(200)
        if self.mode != "unsigned":
            self.send_header(ANSWER, answer_mac(signer, signed_for or nonce, 200, body))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def address() -> Iterator[str]:
    _Squatter.first_nonce = None
    with http_standin(_Squatter) as addr:
        yield addr


@pytest.mark.parametrize("mode", ["unsigned", "other-key"])
def test_an_answer_the_service_did_not_sign_is_refused(address: str, mode: str) -> None:
    _Squatter.mode = mode
    handle = ServiceHandle(address, SECRET, "7", "rollout", timeout_s=10)
    with pytest.raises(ServiceUnreachable, match="answered without the service's "
                       "signature: not the job's service"):
        handle.status()


def test_a_signed_answer_replayed_for_another_call_is_refused(address: str) -> None:
    _Squatter.mode = "signed"
    handle = ServiceHandle(address, SECRET, "7", "rollout", timeout_s=10)
    assert handle.status()["state"] == "active"  # the service's own answer
    _Squatter.mode = "replay"  # the same answer again, signed for the first call
    with pytest.raises(ServiceUnreachable, match="without the service's signature"):
        handle.status()


def test_a_streamed_state_not_signed_with_the_jobs_key_is_refused(address: str) -> None:
    _Squatter.mode = "other-key"
    handle = ServiceHandle(address, SECRET, "7", "trainer", timeout_s=10)
    with pytest.raises(ServiceUnreachable, match="without the service's signature"):
        handle.handoff_state()
    _Squatter.mode = "signed"
    assert handle.handoff_state() == b"poisoned state" * 100  # as the service signs it
