"""A signed call is made out to one service, and its body goes only to that service.

A pool node runs several users' services, and one that dies leaves its port to whoever
binds it next. Such a process used to get the job's next call whole, body and all
(weights on `PUT /v1/weights`, prompts, samples): the handle sent it on any fresh
connection, the automatic retry after a dropped keep-alive included, and checked the
answer's signature only afterwards. And the call it captured, signed with the job's
secret but naming no service, opened the job's other services within its window. Now a
call names the service's address in what it signs, each service refuses one made out
to another, and on a fresh connection a call with a body first makes a bodiless signed
`status` there, whose answer must be the service's, before the body goes out.

A plain HTTP server on loopback plays the other user's process (`_Recorder`); the
services are real (`_worker_service.start`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest
from _worker_service import Running, http_standin, raw_call, start

from slurmrl.auth.tokens import mint_secret, sign
from slurmrl.worker.handle import ServiceHandle, ServiceUnauthorized, ServiceUnreachable
from slurmrl.worker.protocol import Role

WEIGHTS = b"ALICE-MODEL-WEIGHTS" * 1000
PROMPTS = ["12+34="]


class _Recorder(BaseHTTPRequestHandler):
    """Another user's process on a service's port: keeps each request, head and body,
    and answers it 200 without the service's signature (it has not the job's secret)."""

    protocol_version = "HTTP/1.1"  # keep-alive: a body sent after the status comes here
    seen: ClassVar[list[tuple[str, str, dict[str, str], bytes]]] = []

    def _record(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else b""
        type(self).seen.append((self.command, self.path, dict(self.headers), body))
        reply = b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    do_GET = do_POST = do_PUT = _record

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(autouse=True)
def _forget() -> Iterator[None]:
    _Recorder.seen = []
    yield
    _Recorder.seen = []


def _calls() -> list[tuple[str, str]]:
    return [(method, path) for method, path, _, _ in _Recorder.seen]


def _replay(svc: Running, method: str, path: str, headers: dict[str, str],
            body: bytes) -> tuple[int, dict[str, object]]:
    return raw_call(svc.address, method, path, body, headers)


def test_a_process_on_a_dead_services_port_gets_no_body() -> None:
    secret = mint_secret()
    svc, stop = start(Role.ROLLOUT, secret)
    handle = ServiceHandle(svc.address, secret, "42", "rollout", timeout_s=10)
    assert handle.status()["role"] == "rollout"  # a keep-alive connection to it
    stop()  # the service dies; another user binds its port
    # the kept connection is gone: the handle retries on a fresh one, to whoever has the
    # port now, and asks it to prove itself before any weights go out
    with http_standin(_Recorder, port=int(svc.address.rsplit(":", 1)[1])), \
            pytest.raises(ServiceUnreachable, match="without the service's signature"):
        handle.import_weights(WEIGHTS, timeout_s=10)
    assert _calls() == [("GET", "/v1/status")]
    assert not any(body for *_, body in _Recorder.seen)


#: calls with a body, each as a driver makes it
SENDS: dict[str, Callable[[ServiceHandle], object]] = {
    "generate": lambda h: h.generate(PROMPTS),
    "train_step": lambda h: h.train_step([{"prompt_ids": [4]}]),
    "import_weights": lambda h: h.import_weights(WEIGHTS),
}


@pytest.mark.parametrize("call", sorted(SENDS))
def test_a_first_call_sends_its_body_only_to_the_service(call: str) -> None:
    with http_standin(_Recorder) as address:
        handle = ServiceHandle(address, mint_secret(), "42", "rollout", timeout_s=10)
        with pytest.raises(ServiceUnreachable, match="without the service's signature"):
            SENDS[call](handle)
    assert _calls() == [("GET", "/v1/status")]


def test_a_call_captured_at_one_services_address_opens_no_other(
        rollout_service: Running) -> None:
    # replica 0's port, taken by another user; replica 1 (same job, same secret) alive
    with http_standin(_Recorder) as replica0:
        handle = ServiceHandle(replica0, rollout_service.secret, "42", "rollout",
                               timeout_s=10)
        with pytest.raises(ServiceUnreachable):
            handle.generate(PROMPTS)
    assert _Recorder.seen
    for method, path, headers, body in _Recorder.seen:  # replayed as captured
        status, answer = _replay(rollout_service, method, path, headers, body)
        assert status == 401 and answer["code"] == "mismatch", answer
        assert f"made out to service {replica0}, not to this one " \
               f"({rollout_service.address})" in str(answer["error"])


def test_a_service_takes_only_calls_made_out_to_itself(rollout_service: Running) -> None:
    body = json.dumps({"prompts": PROMPTS}).encode()
    other = sign(rollout_service.secret, "POST", "/v1/generate", body,
                 service="127.0.0.1:1")
    status, answer = _replay(rollout_service, "POST", "/v1/generate", other, body)
    assert status == 401 and answer["code"] == "mismatch"
    own = sign(rollout_service.secret, "POST", "/v1/generate", body,
               service=rollout_service.address)
    assert _replay(rollout_service, "POST", "/v1/generate", own, body)[0] == 200


def test_a_handle_names_the_service_as_it_announced_itself(rollout_service: Running) -> None:
    # the address the controller records is the one the service announces; another
    # name for the same socket is another service's name to it
    port = rollout_service.address.rsplit(":", 1)[1]
    handle = ServiceHandle(f"localhost:{port}", rollout_service.secret, "42", "rollout",
                           timeout_s=10)
    refusal = f"made out to service localhost:{port}, not to this one \\(127.0.0.1:{port}\\)"
    with pytest.raises(ServiceUnauthorized, match=refusal):
        handle.status()
    with pytest.raises(ServiceUnauthorized, match=refusal):  # refused at its status
        handle.generate(PROMPTS)


def test_a_proven_connection_takes_one_round_trip_a_call(rollout_service: Running) -> None:
    handle = ServiceHandle(rollout_service.address, rollout_service.secret, "42", "rollout",
                           timeout_s=10)
    server = rollout_service.server
    handle.generate(PROMPTS)
    assert server.calls == 2  # its status on the fresh connection, then the call
    handle.generate(PROMPTS)
    handle.import_weights(handle.export_weights())
    assert server.calls == 5  # one each, on the same connection
    handle.close()
    handle.generate(PROMPTS)
    assert server.calls == 7  # a new connection is proven again
