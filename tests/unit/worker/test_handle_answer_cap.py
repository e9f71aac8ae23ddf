"""The controller reads at most `max_answer_bytes` of a service's answer.

A service runs the user's code; the root controller polls its status and parks and
activates it, and keeps what it answers in its database. A service that answers without
end must cost the controller an error, not its memory. A real HTTP server on loopback
stands in for the service (no worker needed: the cap is the handle's); it signs its
answers as a service does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from _worker_service import http_standin

from slurmrl.auth.tokens import ANSWER, NONCE, answer_mac
from slurmrl.worker.handle import ServiceError, ServiceHandle

BIG = 4 << 20  #: the answer's size: 4 MiB of JSON
SECRET = "s" * 32


class _Answer(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"state": "active", "junk": "x" * BIG}).encode()
        self.send_response(200)
        self.send_header(ANSWER, answer_mac(SECRET, self.headers[NONCE], 200, body))
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def address() -> Iterator[str]:
    with http_standin(_Answer) as addr:
        yield addr


def test_an_answer_over_the_cap_is_an_error_naming_the_service(address: str) -> None:
    capped = ServiceHandle(address, SECRET, "1", "rollout", timeout_s=10,
                           max_answer_bytes=1 << 20)
    with pytest.raises(ServiceError, match=f"{address} answered more than 1048576 bytes"):
        capped.status()
    # the handle is usable again (a fresh connection), and without a cap it reads it all
    with pytest.raises(ServiceError, match="more than"):
        capped.status()
    whole = ServiceHandle(address, SECRET, "1", "rollout", timeout_s=10)
    assert whole.status()["state"] == "active"
