"""The service's HTTP surface, served for real on loopback and called like a driver.

One test holds the real tiny model's decode step at a gate (it still decodes) until the
status poller has reported a shrunk active count, so what it sees does not depend on
thread scheduling."""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
from typing import Any, cast

import pytest
from _worker_service import STANDIN_LAUNCH, Running, host_port, raw_call, start

from slurmrl.auth.tokens import BODY_SHA256, mint_secret, sign
from slurmrl.worker.handle import (
    ServiceError,
    ServiceHandle,
    ServiceParked,
    ServiceUnauthorized,
    ServiceUnreachable,
)
from slurmrl.worker.protocol import MemoryUse, Role
from slurmrl.worker.tiny import TinyBackend

PROMPTS = ["1+2=", "30*4="]


def _handle(svc: Running, secret: str | None = None) -> ServiceHandle:
    return ServiceHandle(svc.address, secret or svc.secret, "42", "rollout", timeout_s=30)


def _raw(svc: Running, method: str, path: str, body: bytes,
         headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    return raw_call(svc.address, method, path, body, headers)


def test_status_reports_identity_and_residency(rollout_service: Running) -> None:
    st = _handle(rollout_service).status()
    assert st["job_id"] == "42" and st["role"] == "rollout" and st["backend"] == "tiny"
    assert st["residency"] == "active"
    assert st["memory"]["device_bytes"] > 0  # type: ignore[index]


def test_unsigned_call_is_refused_with_a_reason(rollout_service: Running) -> None:
    status, body = _raw(rollout_service, "GET", "/v1/status", b"", {})
    assert status == 401
    assert body["code"] == "missing" and "unsigned" in str(body["error"])


def test_wrong_secret_and_replay_and_tampering_are_refused(rollout_service: Running) -> None:
    with pytest.raises(ServiceUnauthorized, match="another job's key"):
        _handle(rollout_service, mint_secret()).generate(PROMPTS)
    headers = sign(rollout_service.secret, "GET", "/v1/status", b"",
                   service=rollout_service.address)
    assert _raw(rollout_service, "GET", "/v1/status", b"", headers)[0] == 200
    status, body = _raw(rollout_service, "GET", "/v1/status", b"", headers)
    assert status == 401 and body["code"] == "replayed"
    signed_for = json.dumps({"prompts": ["1="]}).encode()
    sent = json.dumps({"prompts": ["9="]}).encode()
    headers = sign(rollout_service.secret, "POST", "/v1/generate", signed_for,
                   service=rollout_service.address)
    assert _raw(rollout_service, "POST", "/v1/generate", sent, headers)[0] == 401


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not valid JSON"),
        # a RecursionError out of json.loads: a 500 with a traceback in the log
        (b'{"prompts": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
         "not valid JSON: nested too deeply"),
        (b"[1, 2]", "must be a JSON object"),
        (json.dumps({"prompts": "1+1="}).encode(), "prompts must be a list of strings"),
        (json.dumps({"prompts": ["1="], "n": 2}).encode(), r"unknown field\(s\) \['n'\]"),
        (json.dumps({"prompts": ["1="], "params": {"top_p": 1}}).encode(), "top_p"),
        (json.dumps({"prompts": ["hello"]}).encode(), "outside the tiny vocabulary"),
        (json.dumps({"prompts": ["1=", "2="], "continuation": {"indices": [0],
                     "prefixes": [[], []]}}).encode(), r"continuation.indices must be a list of 2"),
        (json.dumps({"prompts": ["1="], "continuation": {"indices": [0],
                     "prefixes": [[4, "x"]]}}).encode(), r"continuation.prefixes\[0\]"),
        (json.dumps({"prompts": ["1=", "2="], "continuation": {"indices": [3, 3],
                     "prefixes": [[], []]}}).encode(), "duplicates"),
        (json.dumps({"prompts": ["1="], "continuation": {"indices": [0], "prefixes": [[4, 2]],
                     }}).encode(), r"prefixes\[0\] has token\(s\) \[2\] that end"),
        (json.dumps({"prompts": ["1="], "continuation": {"indices": [0], "prefixes": [[]],
                     "cache": 1}}).encode(), r"unknown key\(s\) \['cache'\]"),
    ],
)
def test_malformed_generate_gets_400_naming_the_problem(
    rollout_service: Running, body: bytes, message: str
) -> None:
    headers = sign(rollout_service.secret, "POST", "/v1/generate", body,
                   service=rollout_service.address)
    status, reply = _raw(rollout_service, "POST", "/v1/generate", body, headers)
    assert status == 400
    assert re.search(message, str(reply["error"]))


def _sample(**change: object) -> dict[str, object]:
    return {"prompt_ids": [4], "completion_ids": [6, 2], "advantage": 1.0, **change}


@pytest.mark.parametrize(
    ("role", "path", "obj", "message"),
    [
        (Role.ROLLOUT, "/v1/generate", {"prompts": ["1="], "params": {"temperature": 10**400}},
         "temperature must be in"),
        (Role.TRAINER, "/v1/train_step", {"samples": [_sample(advantage=10**400)]},
         r"samples\[0\]\.advantage must be finite"),
        (Role.TRAINER, "/v1/train_step", {"samples": [_sample(prompt_ids=[2**64])]},
         r"samples\[0\]\.prompt_ids must be a list of token ids"),
        # finite in JSON, infinite in float32: a step with it would make the weights NaN
        (Role.TRAINER, "/v1/train_step", {"samples": [_sample(advantage=1e39)]},
         "step not applied: non-finite loss/gradient"),
    ],
    ids=["temperature", "advantage", "token id", "float32 overflow"],
)
def test_out_of_range_numbers_get_400_naming_the_field(
    role: Role, path: str, obj: dict[str, object], message: str
) -> None:
    svc, stop = start(role, mint_secret())
    try:
        body = json.dumps(obj).encode()
        status, reply = _raw(svc, "POST", path, body, sign(svc.secret, "POST", path, body,
                                                                service=svc.address))
        assert status == 400 and re.search(message, str(reply["error"]))
        if role is Role.TRAINER:  # and the trainer trains on, its weights untouched
            h = ServiceHandle(svc.address, svc.secret, "42", "trainer", timeout_s=30)
            metrics = h.train_step([_sample()])
            assert metrics["step"] == 1.0 and metrics["loss"] == metrics["loss"]  # not NaN
    finally:
        stop()


def test_parked_service_refuses_data_plane_with_409(rollout_service: Running) -> None:
    h = _handle(rollout_service)
    before = h.generate(PROMPTS, seed=5)
    assert h.park(level=1)["residency"] == "parked"
    with pytest.raises(ServiceParked, match="acquire a lease first"):
        h.generate(PROMPTS, seed=5)
    with pytest.raises(ServiceParked):
        h.export_weights()
    assert h.status()["residency"] == "parked"  # control plane still answers
    h.activate()
    assert h.generate(PROMPTS, seed=5) == before


def test_bad_park_level_and_unknown_route(rollout_service: Running) -> None:
    h = _handle(rollout_service)
    with pytest.raises(ServiceError, match="level must be 1") as err:
        h.park(level=7)
    assert err.value.status == 400
    headers = sign(rollout_service.secret, "GET", "/v1/nothing", b"",
                   service=rollout_service.address)
    conn = http.client.HTTPConnection(*host_port(rollout_service.address), timeout=30)
    conn.request("GET", "/v1/nothing", headers=headers)
    assert conn.getresponse().status == 404
    conn.close()


def test_weights_sync_between_services_over_http(
    rollout_service: Running, trainer_service: Running
) -> None:
    roll = _handle(rollout_service)
    trainer = ServiceHandle(trainer_service.address, trainer_service.secret, "42", "trainer")
    out = roll.generate(PROMPTS, seed=1, max_tokens=6)
    before = roll.generate(PROMPTS, seed=9, max_tokens=12)
    for _ in range(3):
        metrics = trainer.train_step([s.with_advantage(1.0) for s in out.samples])
    assert metrics["step"] == 3.0
    assert trainer.sync_weights_to(roll) > 0
    assert roll.export_weights() == trainer.export_weights()
    assert roll.generate(PROMPTS, seed=9, max_tokens=12) != before


def test_body_over_the_limit_gets_413() -> None:
    svc, stop = start(Role.TRAINER, mint_secret(), max_body_bytes=1024)
    try:
        h = ServiceHandle(svc.address, svc.secret, "42", "trainer")
        with pytest.raises(ServiceError, match="larger than 1024 bytes") as err:
            h.import_weights(b"x" * 4096)
        assert err.value.status == 413
    finally:
        stop()


def test_on_tail_sees_the_active_count_shrink(rollout_service: Running,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    prompts = ["1+1="] * 64
    seen: list[int] = []
    shrunk = threading.Event()  # on_tail reported a count between 0 and len(prompts)

    def tail(n: int) -> None:
        seen.append(n)
        if 0 < n < len(prompts):
            shrunk.set()

    # a gate around the real model's decode step: once the service's count has shrunk
    # (a sequence finished) it holds the decoding until the poller has reported that
    # count, so the test does not hang on thread scheduling (10 s: a hang guard only)
    backend = rollout_service.server.backend
    model = cast(Any, backend)._model
    real_step = model.step

    def gated_step(*args: Any, **kw: Any) -> Any:
        if 0 < backend.active_sequences() < len(prompts) and not shrunk.is_set():
            shrunk.wait(10)
        return real_step(*args, **kw)

    monkeypatch.setattr(model, "step", gated_step)
    _handle(rollout_service).generate(prompts, max_tokens=48, micro_batch=1, temperature=0.0,
                                      on_tail=tail, poll_s=0.005)
    # the poller saw the count part way down, not just the whole batch or its end
    assert any(0 < n < len(prompts) for n in seen), seen
    assert all(0 <= n <= len(prompts) for n in seen)
    assert seen == sorted(seen, reverse=True)


def test_unreachable_service_and_bad_address() -> None:
    for bad in ("nowhere", "127.0.0.1:1", "127.0.0.1:1/", "127.0.0.1/0123"):
        with pytest.raises(ValueError, match="host:port/launch"):
            ServiceHandle(bad, mint_secret(), "1", "rollout")
    h = ServiceHandle(f"127.0.0.1:1/{STANDIN_LAUNCH}", mint_secret(), "1", "rollout",
                      timeout_s=2)
    with pytest.raises(ServiceUnreachable):
        h.status()


def test_a_service_trickling_its_answer_cannot_hold_a_control_call() -> None:
    # a service is its job user's process: one answering a byte at a time, each within
    # the socket timeout, must not hold the controller's park/activate/status call (and
    # its partners waiting on the pool) past the call's timeout
    import socket
    import time

    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100000:
                if stop.is_set():
                    return
                with contextlib.suppress(OSError):
                    conn.sendall(bytes([byte]))
                time.sleep(0.05)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    h = ServiceHandle(f"127.0.0.1:{srv.getsockname()[1]}/{STANDIN_LAUNCH}", mint_secret(),
                      "1", "rollout")
    try:
        with pytest.raises(ServiceUnreachable, match="no whole answer within 1 s"):
            h.status(timeout_s=1.0)
    finally:
        stop.set()
        h.close()
        srv.close()


def test_with_a_control_secret_the_jobs_key_cannot_park_activate_or_stop() -> None:
    # the controller launches each service with a key of its own: the job's driver holds
    # the job's key, and with it had woken its parked service on GPUs leased to another
    # job. The job's key still opens the data plane and status; the controller's all.
    control = mint_secret()
    svc, stop = start(Role.ROLLOUT, mint_secret(), control_secret=control)
    try:
        driver, controller = _handle(svc), _handle(svc, control)
        for call in (driver.park, driver.activate, driver.stop):
            with pytest.raises(ServiceUnauthorized, match="is the controller's"):
                call()
        assert driver.status()["residency"] == "active"
        assert len(driver.generate(PROMPTS).samples) == 2
        assert controller.park(level=1)["residency"] == "parked"
        with pytest.raises(ServiceUnauthorized):
            driver.activate()
        with pytest.raises(ServiceParked):
            driver.generate(PROMPTS)
        assert controller.activate()["residency"] == "active"
        assert len(controller.generate(PROMPTS).samples) == 2
    finally:
        stop()


def test_every_answer_of_a_service_is_signed_its_routers_404_too() -> None:
    # aiohttp's own 404 (a path the service does not have) went out unsigned: the
    # caller took its own service for another process on the port
    svc, stop = start(Role.ROLLOUT, mint_secret())
    try:
        h = ServiceHandle(svc.address, svc.secret, "42", "rollout")
        with pytest.raises(ServiceError) as err:
            h._call("probe", "GET", "/v1/nope", b"", None, 10.0)
        assert err.value.status == 404 and "signature" not in str(err.value)
        assert h.status()["role"] == "rollout"  # and the service answers signed
    finally:
        stop()


class _GatedPark(TinyBackend):
    """A tiny trainer whose park waits at a gate; `memory()` notes calls made while a
    park is under way (a torch backend's memory read re-tracks the tensors a park is
    emptying: a read beside a park lost the parked weights)."""

    def __init__(self) -> None:
        super().__init__(Role.TRAINER)
        self.parking = threading.Event()
        self.gate = threading.Event()
        self.read_while_parking = 0

    def park(self, level: int) -> None:
        self.parking.set()
        assert self.gate.wait(30)
        super().park(level)
        self.parking.clear()

    def memory(self) -> MemoryUse:
        if self.parking.is_set():
            self.read_while_parking += 1
        return super().memory()


def test_status_during_a_park_answers_without_reading_the_backend_beside_it() -> None:
    backend = _GatedPark()
    secret, control = mint_secret(), mint_secret()
    svc, stop = start(Role.TRAINER, secret, control_secret=control, backend=backend)
    try:
        parked = threading.Thread(
            target=ServiceHandle(svc.address, control, "42", "trainer", timeout_s=30).park)
        parked.start()
        assert backend.parking.wait(30)
        status = ServiceHandle(svc.address, secret, "42", "trainer", timeout_s=30).status()
        assert status["residency"] == "active"  # as of before the park: it is under way
        assert status["memory"]["device_bytes"] > 0
        backend.gate.set()
        parked.join(30)
        after = ServiceHandle(svc.address, secret, "42", "trainer", timeout_s=30).status()
        assert after["residency"] == "parked" and after["memory"]["device_bytes"] == 0
        assert backend.read_while_parking == 0
    finally:
        backend.gate.set()
        stop()


class _SlowRollout(TinyBackend):
    """A tiny rollout whose generate computes for 1.5 s before its answer."""

    def __init__(self) -> None:
        super().__init__(Role.ROLLOUT)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.5)
        return super().generate(*args, **kwargs)


def test_a_rollout_longer_than_the_control_planes_timeout_is_waited_for() -> None:
    # the data plane waited at most the handle's timeout_s (120 s by default) for a
    # rollout's answer: any rollout longer than that failed while the service went on
    svc, stop = start(Role.ROLLOUT, mint_secret(), backend=_SlowRollout())
    try:
        h = ServiceHandle(svc.address, svc.secret, "42", "rollout", timeout_s=0.5)
        assert len(h.generate(PROMPTS, max_tokens=2).samples) == len(PROMPTS)
        capped = ServiceHandle(svc.address, svc.secret, "42", "rollout", timeout_s=0.5,
                               compute_timeout_s=0.5)
        with pytest.raises(ServiceUnreachable, match="timed out"):
            capped.generate(PROMPTS, max_tokens=2)
    finally:
        stop()


def _head_then_wait(svc: Running, head: dict[str, str], declared: int) -> bytes:
    """Send a PUT's head declaring a `declared`-byte body, and none of the body; the
    answer it gets within 5 s (a server reading the body first gives none)."""
    with socket.create_connection(host_port(svc.address), timeout=5) as s:
        lines = ["PUT /v1/weights HTTP/1.1", f"Host: {svc.address.partition('/')[0]}",
                 f"Content-Length: {declared}", *(f"{k}: {v}" for k, v in head.items())]
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        return s.recv(4096)


def test_a_call_without_a_valid_signed_head_is_refused_before_its_body_is_read(
        rollout_service: Running) -> None:
    # anyone reaching the port made the service buffer up to --max-body-mb (1 GiB) per
    # call before it looked at the signature
    forged = {**sign("not-the-jobs-secret-" * 2, "PUT", "/v1/weights", b"x" * 10,
                     service=rollout_service.address)}
    for head in ({}, forged):
        answer = _head_then_wait(rollout_service, head, 500 << 20)
        assert answer.startswith(b"HTTP/1.1 401"), answer[:80]


def test_a_body_other_than_the_one_signed_for_is_refused(rollout_service: Running) -> None:
    head = sign(rollout_service.secret, "POST", "/v1/generate", b'{"prompts": ["1+1="]}',
                service=rollout_service.address)
    status, body = _raw(rollout_service, "POST", "/v1/generate", b'{"prompts": ["2+2="]}',
                        head)
    assert status == 401 and "not the one the call was signed for" in str(body["error"])
    old_client = {k: v for k, v in head.items() if k != BODY_SHA256}
    status, body = _raw(rollout_service, "POST", "/v1/generate", b'{"prompts": ["1+1="]}',
                        old_client)
    assert status == 401 and BODY_SHA256 in str(body["error"])
