"""A signed call is made out to one service, and its body goes only to that service.

A pool node runs several users' services, and one that dies leaves its port to whoever
binds it next. Such a process used to get the job's next call whole, body and all
(weights on `PUT /v1/weights`, prompts, samples): the handle sent it on any fresh
connection, the automatic retry after a dropped keep-alive included, and checked the
answer's signature only afterwards. And the call it captured, signed with the job's
secret but naming no service, opened the job's other services within its window. Now a
call names the service's address in what it signs, each service refuses one made out
to another, and on a fresh connection a call with a body first makes a bodiless signed
`status` there, whose answer must be the service's, before the body goes out. The
address names one launch of the service (`host:port/launch`, the launch a random id the
worker picks at start): a call captured for one launch no longer opens a later launch
of the same job's service that took the same `host:port` (a relaunch, a new pool on
the node) within its window, as it did when the address alone named the service.

A plain HTTP server on loopback plays the other user's process (`_Recorder`); the
services are real (`_worker_service.start`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest
from _worker_service import Running, host_port, http_standin, raw_call, start

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
    with http_standin(_Recorder, port=host_port(svc.address)[1]), \
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
    own = rollout_service.address  # 127.0.0.1:port/launch
    other = f"localhost:{own.removeprefix('127.0.0.1:')}"
    handle = ServiceHandle(other, rollout_service.secret, "42", "rollout", timeout_s=10)
    refusal = f"made out to service {other}, not to this one \\({own}\\)"
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


def test_a_call_captured_for_one_launch_is_refused_by_a_later_one_on_its_address() -> None:
    # the job's rollout is relaunched on the port its earlier launch had (same node, same
    # job, same secret), within the window of a call captured on its way to the first
    secret = mint_secret()
    first, stop = start(Role.ROLLOUT, secret)
    body = json.dumps({"prompts": PROMPTS}).encode()
    captured = sign(secret, "POST", "/v1/generate", body, service=first.address)
    assert _replay(first, "POST", "/v1/generate", captured, body)[0] == 200
    stop()
    later, stop = start(Role.ROLLOUT, secret, port=host_port(first.address)[1])
    try:
        assert host_port(later.address) == host_port(first.address)
        status, answer = _replay(later, "POST", "/v1/generate", captured, body)
        assert status == 401 and answer["code"] == "mismatch", answer
        assert "another launch of the service at this address" in str(answer["error"])
        # a driver that still holds the first launch's address is refused at the status
        # that proves a fresh connection: its prompts never reach the later launch
        stale = ServiceHandle(first.address, secret, "42", "rollout", timeout_s=10)
        with pytest.raises(ServiceUnauthorized, match=f"not to this one \\({later.address}"):
            stale.generate(PROMPTS)
        assert later.server.calls == 0
        # the address the later launch announced opens it
        fresh = ServiceHandle(later.address, secret, "42", "rollout", timeout_s=10)
        assert fresh.generate(PROMPTS).samples
    finally:
        stop()
