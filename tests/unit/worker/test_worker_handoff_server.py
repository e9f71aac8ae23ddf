"""Hand-off over HTTP: two copies of one service, served for real on loopback, pass the
job's state through their shared private directory as the controller would ask them to."""

from __future__ import annotations

import http.client
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from _worker_service import STANDIN_LAUNCH, Running, host_port, start

from slurmrl.auth.tokens import mint_secret, sign
from slurmrl.worker.handle import ServiceError, ServiceHandle, ServiceParked
from slurmrl.worker.handoff import prepare_dir, store_stream, write_state
from slurmrl.worker.protocol import BackendError, Role

PROMPTS = ["1+2=", "30*4="]


def _handle(svc: Running) -> ServiceHandle:
    return ServiceHandle(svc.address, svc.secret, "42", "trainer", timeout_s=30)


@pytest.fixture
def copies(tmp_path: Path) -> Iterator[tuple[ServiceHandle, ServiceHandle, Path]]:
    """Two trainer copies of one job sharing a handoff directory."""
    secret = mint_secret()
    shared = prepare_dir(tmp_path / "slurmrl-job42-abc")
    a, stop_a = start(Role.TRAINER, secret, handoff_dir=shared)
    b, stop_b = start(Role.TRAINER, secret, handoff_dir=shared)
    yield _handle(a), _handle(b), shared
    stop_a()
    stop_b()


@dataclass
class ControlledNodes:
    """Two trainer copies of job 42 on two "nodes" (a hand-off directory each), both
    with the controller's control secret."""

    secret: str
    control: str
    a: Running
    b: Running
    dir_a: Path
    dir_b: Path
    stop_a: Callable[[], None]


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[ControlledNodes]:
    secret, control = mint_secret(), mint_secret()
    dir_a, dir_b = prepare_dir(tmp_path / "node-a"), prepare_dir(tmp_path / "node-b")
    a, stop_a = start(Role.TRAINER, secret, control_secret=control, handoff_dir=dir_a)
    b, stop_b = start(Role.TRAINER, secret, control_secret=control, handoff_dir=dir_b)
    yield ControlledNodes(secret, control, a, b, dir_a, dir_b, stop_a)
    stop_b()
    stop_a()


def _batch(rollout: Running) -> list[Any]:
    h = ServiceHandle(rollout.address, rollout.secret, "42", "rollout", timeout_s=30)
    out = h.generate(PROMPTS, seed=1, max_tokens=6)
    return [s.with_advantage(1.0) for s in out.samples]


def test_the_state_moves_to_the_other_copy_and_back(
    copies: tuple[ServiceHandle, ServiceHandle, Path], rollout_service: Running
) -> None:
    a, b, shared = copies
    batch = _batch(rollout_service)
    a.train_step(batch)
    a.train_step(batch)
    weights = a.export_weights()

    st = a.park(handoff=True)
    assert st["residency"] == "parked" and st["handed_off"] is True
    assert st["memory"] == {"device_bytes": 0, "host_bytes": 0}
    assert st["generation"] == 1
    assert (shared / "trainer.state").is_file()
    with pytest.raises(ServiceParked):
        a.train_step(batch)

    st = b.activate(handoff=True)  # b was active with its own fresh state: replaced
    assert st["residency"] == "active" and st["handed_off"] is False
    assert st["generation"] == 1
    assert b.export_weights() == weights
    assert b.train_step(batch)["step"] == 3.0

    trained = b.export_weights()
    b.park(handoff=True)
    st = a.activate(handoff=True)
    assert st["residency"] == "active" and st["generation"] == 2
    assert a.export_weights() == trained
    assert a.train_step(batch)["step"] == 4.0


def test_activate_with_handoff_keeps_a_copys_own_current_state(
    copies: tuple[ServiceHandle, ServiceHandle, Path], rollout_service: Running
) -> None:
    a, b, _ = copies
    batch = _batch(rollout_service)
    a.train_step(batch)
    weights = a.export_weights()
    # no state file yet: a plainly parked copy comes back with its own state
    a.park(level=1)
    assert a.activate(handoff=True)["residency"] == "active"
    assert a.export_weights() == weights
    # the file holds a's state (generation 1); b takes it; parked plainly at the same
    # generation, b keeps its own newer training
    a.park(handoff=True)
    b.activate(handoff=True)
    b.train_step(batch)
    trained = b.export_weights()
    b.park(level=1)
    st = b.activate(handoff=True)
    assert st["generation"] == 1 and b.export_weights() == trained


def test_a_handed_off_copy_needs_handoff_to_wake_and_a_parked_one_cannot_hand_off(
    copies: tuple[ServiceHandle, ServiceHandle, Path],
) -> None:
    a, b, _ = copies
    a.park(handoff=True)
    with pytest.raises(ServiceParked, match="activate it with handoff"):
        a.activate()
    assert a.status()["handed_off"] is True
    b.park(level=1)  # only the active copy holds the state to hand off
    with pytest.raises(ServiceParked, match="only an active service"):
        b.park(handoff=True)
    assert b.status()["handed_off"] is False


def _raw_post(svc: Running, path: str, obj: dict[str, Any]) -> tuple[int, str]:
    body = json.dumps(obj).encode()
    headers = sign(svc.secret, "POST", path, body, service=svc.address)
    conn = http.client.HTTPConnection(*host_port(svc.address), timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, str(json.loads(resp.read())["error"])
    finally:
        conn.close()


@pytest.mark.parametrize("route", ["/v1/park", "/v1/activate"])
def test_handoff_without_a_handoff_dir_is_a_400(rollout_service: Running, route: str) -> None:
    status, error = _raw_post(rollout_service, route, {"handoff": True})
    assert status == 400
    assert "needs a worker started with --handoff-dir" in error
    assert ServiceHandle(rollout_service.address, rollout_service.secret, "42",
                         "rollout").status()["residency"] == "active"


@pytest.mark.parametrize("route", ["/v1/park", "/v1/activate"])
@pytest.mark.parametrize(("obj", "message"), [
    ({"handoff": "yes"}, "handoff must be true or false, got 'yes'"),
    ({"handoff": 1}, "handoff must be true or false, got 1"),
    ({"handoff": True, "force": True}, r"unknown field(s) ['force']"),
])
def test_a_malformed_handoff_is_a_400(tmp_path: Path, route: str, obj: dict[str, Any],
                                      message: str) -> None:
    svc, stop = start(Role.ROLLOUT, mint_secret(), handoff_dir=prepare_dir(tmp_path / "h"))
    try:
        status, error = _raw_post(svc, route, obj)
        assert status == 400 and message in error
    finally:
        stop()


def test_the_handle_sends_handoff_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    # a server from before hand-off refuses unknown fields: plain calls must not send it
    sent: list[tuple[str, Any]] = []

    def record(self: ServiceHandle, call: str, method: str, path: str, obj: Any,
               timeout_s: float | None, whole: bool = False) -> dict[str, Any]:
        sent.append((path, obj))
        return {}

    monkeypatch.setattr(ServiceHandle, "_json", record)
    h = ServiceHandle(f"127.0.0.1:1/{STANDIN_LAUNCH}", mint_secret(), "42", "rollout")
    h.park()
    h.activate()
    h.park(2, handoff=True)
    h.activate(handoff=True)
    assert sent == [("/v1/park", {"level": 1}), ("/v1/activate", {}),
                    ("/v1/park", {"level": 2, "handoff": True}),
                    ("/v1/activate", {"handoff": True})]


def test_status_of_a_plain_service_says_it_holds_its_state(rollout_service: Running) -> None:
    st = ServiceHandle(rollout_service.address, rollout_service.secret, "42",
                       "rollout").status()
    assert st["handed_off"] is False and st["generation"] == 0
    with pytest.raises(ServiceError, match="--handoff-dir"):
        ServiceHandle(rollout_service.address, rollout_service.secret, "42",
                      "rollout").park(handoff=True)


@pytest.fixture
def two_nodes(tmp_path: Path) -> Iterator[tuple[ServiceHandle, ServiceHandle, Path, Path]]:
    """Two trainer copies of one job, each with a directory of its own: as on two nodes,
    whose node-local memory the other cannot read."""
    secret = mint_secret()
    dir_a = prepare_dir(tmp_path / "node-a")
    dir_b = prepare_dir(tmp_path / "node-b")
    a, stop_a = start(Role.TRAINER, secret, handoff_dir=dir_a)
    b, stop_b = start(Role.TRAINER, secret, handoff_dir=dir_b)
    yield _handle(a), _handle(b), dir_a, dir_b
    stop_a()
    stop_b()


def test_across_nodes_the_state_is_fetched_from_the_copy_that_handed_it_off(
    two_nodes: tuple[ServiceHandle, ServiceHandle, Path, Path], rollout_service: Running
) -> None:
    a, b, dir_a, dir_b = two_nodes
    batch = _batch(rollout_service)
    a.train_step(batch)
    a.train_step(batch)
    weights = a.export_weights()
    a.park(handoff=True)
    with pytest.raises(ServiceError, match="404"):
        b.handoff_state()  # b's node holds no state
    assert a.handoff_state() == (dir_a / "trainer.state").read_bytes()
    st = b.activate(handoff=True, source=a.address)
    assert st["residency"] == "active" and st["generation"] == 1
    assert (dir_b / "trainer.state").read_bytes() == (dir_a / "trainer.state").read_bytes()
    assert b.export_weights() == weights
    assert b.train_step(batch)["step"] == 3.0
    # and back: a's own file is older than b's hand-off, so it fetches b's
    trained = b.export_weights()
    b.park(handoff=True)
    st = a.activate(handoff=True, source=b.address)
    assert st["generation"] == 2 and a.export_weights() == trained
    assert a.train_step(batch)["step"] == 4.0


def test_a_fetch_that_fails_changes_nothing_and_says_why(
    two_nodes: tuple[ServiceHandle, ServiceHandle, Path, Path], rollout_service: Running
) -> None:
    a, b, dir_a, dir_b = two_nodes
    a.train_step(_batch(rollout_service))
    a.park(handoff=True)
    b.park(level=1)
    with pytest.raises(ServiceError, match="cannot fetch the handoff state from"):
        b.activate(handoff=True, source=f"127.0.0.1:1/{STANDIN_LAUNCH}")  # nobody there
    assert b.status()["residency"] == "parked" and not (dir_b / "trainer.state").exists()
    with pytest.raises(ServiceError, match="source must be"):
        b.activate(handoff=False, source=a.address)
    # a truncated state file at the source is refused before it replaces anything
    whole = (dir_a / "trainer.state").read_bytes()
    (dir_a / "trainer.state").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(ServiceError, match=r"the state for .*trainer.state is (truncated|corrupt)"):
        b.activate(handoff=True, source=a.address)
    assert b.status()["residency"] == "parked"
    assert [p.name for p in dir_b.iterdir()] == []  # nor a temp file left behind


def _one_answer_server(head: bytes, body: bytes, secret: str = "") -> tuple[str, Any]:
    """A socket that answers one request with `head` + `body` and closes: an HTTP
    answer whose body may be shorter than its Content-Length (a source cut off). With
    `secret`, `body` ends in its signature for the request, as a service's stream does
    (`head` counts it: `STREAM_MAC_BYTES`)."""
    import socket
    import threading

    from slurmrl.auth.tokens import NONCE, stream_mac

    srv = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            buf = b""
            while b"\r\n\r\n" not in buf:
                buf += conn.recv(4096)
            signed = body
            if secret:
                nonce = next(line.split(b":", 1)[1].strip().decode()
                             for line in buf.split(b"\r\n")
                             if line.lower().startswith(NONCE.lower().encode()))
                mac = stream_mac(secret, nonce)
                mac.update(body)
                signed = body + mac.hexdigest().encode()
            conn.sendall(head + signed)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return f"127.0.0.1:{srv.getsockname()[1]}/{STANDIN_LAUNCH}", t


def test_a_fetched_state_is_streamed_to_a_file_not_held_whole(tmp_path: Path) -> None:
    # 5 MB arrive in chunks of at most STREAM_CHUNK into the file; a body cut short
    # is an error naming the source, never a short file taken for the state
    import io

    from slurmrl.worker import handle as handle_mod
    from slurmrl.worker.handle import ServiceUnreachable

    body = bytes(range(256)) * (5 * 4096)
    writes: list[int] = []

    class Recording(io.BytesIO):
        def write(self, b: Any) -> int:
            writes.append(len(b))
            return super().write(b)

    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % (len(body) + 64))
    secret = mint_secret()
    address, t = _one_answer_server(head, body, secret)
    out = Recording()
    assert ServiceHandle(address, secret, "42", "trainer").handoff_state_into(out) \
        == len(body)
    t.join(5)
    assert out.getvalue() == body
    assert max(writes) <= handle_mod.STREAM_CHUNK and len(writes) >= 5
    cut = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
           % (len(body) + 100))
    address, t = _one_answer_server(cut, body)
    with pytest.raises(ServiceUnreachable, match="cut short"):
        ServiceHandle(address, mint_secret(), "42", "trainer").handoff_state_into(
            io.BytesIO())
    t.join(5)


def test_at_the_jobs_end_a_copy_discards_its_state_from_the_nodes_directory(
    tmp_path: Path, rollout_service: Running,
) -> None:
    # memory-backed, the hand-off directory would keep the job's state after the job:
    # the controller has a copy discard it (its call only, with its control secret)
    secret, control = mint_secret(), mint_secret()
    shared = prepare_dir(tmp_path / "slurmrl-job42-abc")
    svc, stop = start(Role.TRAINER, secret, control_secret=control, handoff_dir=shared)
    try:
        ctl = ServiceHandle(svc.address, control, "42", "trainer", timeout_s=30)
        driver = ServiceHandle(svc.address, secret, "42", "trainer", timeout_s=30)
        driver.train_step(_batch(rollout_service))
        ctl.park(handoff=True)
        assert (shared / "trainer.state").exists()
        with pytest.raises(ServiceError, match="401"):
            driver.discard_handoff()  # the job's own secret does not open it
        assert (shared / "trainer.state").exists()
        (shared / "rollout.state").write_bytes(b"another role's")
        assert ctl.discard_handoff() is True
        assert [p.name for p in shared.iterdir()] == ["rollout.state"]  # its own only
        (shared / "rollout.state").unlink()
        assert ctl.discard_handoff() is False  # nothing left: the directory goes too
        assert not shared.exists()
    finally:
        stop()


def test_a_fetch_moves_the_state_to_another_node_and_wakes_nothing(
    nodes: ControlledNodes, rollout_service: Running
) -> None:
    # before giving back the only window on node a, the controller has b's copy fetch
    # the state a's copy handed off there; b stays parked, and later takes it over
    secret, control, dir_a, dir_b = nodes.secret, nodes.control, nodes.dir_a, nodes.dir_b
    a, b, stop_a = nodes.a, nodes.b, nodes.stop_a
    ctl_a = ServiceHandle(a.address, control, "42", "trainer", timeout_s=30)
    ctl_b = ServiceHandle(b.address, control, "42", "trainer", timeout_s=30)
    driver_b = ServiceHandle(b.address, secret, "42", "trainer", timeout_s=30)
    batch = _batch(rollout_service)
    ctl_a.train_step(batch)
    trained = ctl_a.export_weights()
    ctl_a.park(handoff=True)
    ctl_b.park(handoff=True)  # b had nothing newer: its park hands off nothing
    assert ctl_b.status()["stored_generation"] == 0  # its fresh state, generation 0
    with pytest.raises(ServiceError, match="401"):
        driver_b.fetch_handoff(a.address)  # the controller's call only
    st = ctl_b.fetch_handoff(a.address)
    assert st["residency"] == "parked" and st["handed_off"] and st["stored_generation"] == 1
    assert (dir_b / "trainer.state").read_bytes() == (dir_a / "trainer.state").read_bytes()
    stop_a()  # a's node gone: b holds the newest state on its own
    st = ctl_b.activate(handoff=True)
    assert st["generation"] == 1 and ctl_b.export_weights() == trained
    assert ctl_b.train_step(batch)["step"] == 2.0
    with pytest.raises(ServiceError, match="cannot fetch the handoff state from"):
        ctl_b.fetch_handoff(f"127.0.0.1:1/{STANDIN_LAUNCH}")
    with pytest.raises(ServiceError, match="source must be"):
        ctl_b._json("fetch_handoff", "POST", "/v1/handoff/fetch", {"source": 7}, 10,
                    whole=True)


def test_status_reads_the_node_files_header_once_per_file(
    tmp_path: Path, rollout_service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `status` is polled through a rollout's tail; a state file's header lists every
    # tensor, so it is parsed once per file, and again only once a hand-off replaced it
    from slurmrl.worker import handoff

    peeks: list[Path] = []
    real = handoff.peek_generation

    def counted(path: Path) -> int | None:
        peeks.append(path)
        return real(path)

    monkeypatch.setattr(handoff, "peek_generation", counted)
    secret = mint_secret()
    shared = prepare_dir(tmp_path / "slurmrl-job42-abc")
    svc, stop = start(Role.TRAINER, secret, handoff_dir=shared)
    try:
        h = _handle(svc)
        assert h.status()["stored_generation"] is None and peeks == []  # no file yet
        h.train_step(_batch(rollout_service))
        assert h.park(handoff=True)["stored_generation"] == 1  # its answer is a status
        peeks.clear()  # (the hand-off's own write peeked too)
        assert [h.status()["stored_generation"] for _ in range(5)] == [1] * 5
        assert peeks == []  # the same file: not parsed again
        h.activate(handoff=True)
        h.train_step(_batch(rollout_service))
        h.park(handoff=True)  # a new file, generation 2: read anew
        assert h.status()["stored_generation"] == 2
    finally:
        stop()


def test_a_state_the_node_holds_already_is_not_fetched_again(
    nodes: ControlledNodes, rollout_service: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a grant on a node whose copy waited for the directory's lock while a move of the
    # same state landed there finds it has that generation: nothing is streamed twice
    # (over a network, a GB-size state held the pool's grants twice as long)
    streamed: list[str] = []
    real = ServiceHandle.handoff_state_into

    def counted(self: ServiceHandle, out: Any, timeout_s: float | None = None) -> int:
        streamed.append(self.address)
        return real(self, out, timeout_s)

    monkeypatch.setattr(ServiceHandle, "handoff_state_into", counted)
    control, dir_b, a, b = nodes.control, nodes.dir_b, nodes.a, nodes.b
    ctl_a = ServiceHandle(a.address, control, "42", "trainer", timeout_s=30)
    ctl_b = ServiceHandle(b.address, control, "42", "trainer", timeout_s=30)
    batch = _batch(rollout_service)
    ctl_a.train_step(batch)
    trained = ctl_a.export_weights()
    ctl_a.park(handoff=True)
    ctl_b.park(handoff=True)
    assert ctl_b.fetch_handoff(a.address)["stored_generation"] == 1
    assert streamed == [a.address]
    before = (dir_b / "trainer.state").stat()
    assert ctl_b.fetch_handoff(a.address)["stored_generation"] == 1  # again: no-op
    st = ctl_b.activate(handoff=True, source=a.address)  # and at the grant
    assert streamed == [a.address]
    after = (dir_b / "trainer.state").stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert st["generation"] == 1 and ctl_b.export_weights() == trained
    # a newer one at the source is still fetched
    ctl_b.train_step(batch)
    ctl_b.park(handoff=True)
    assert ctl_a.activate(handoff=True, source=b.address)["generation"] == 2
    assert streamed == [a.address, b.address]


def test_a_discard_waits_for_a_store_under_way_and_leaves_nothing(tmp_path: Path) -> None:
    # the job ended while its state was being fetched onto this node: the discard waits
    # for the store (it holds the directory's lock), so the state does not land after
    # it; a temp file a writer killed mid-write left goes with it
    import threading

    import torch

    from slurmrl.worker.handoff import discard, state_path, store_stream, write_state

    src = state_path(prepare_dir(tmp_path / "src"), "trainer")
    write_state(src, {"w": torch.ones(4)}, 3)
    whole = src.read_bytes()
    node = prepare_dir(tmp_path / "slurmrl-job42-abc")
    (node / ".trainer.state.killed.tmp").write_bytes(whole[:10])
    go = threading.Event()

    def slow_fill(out: Any) -> None:
        out.write(whole[:100])
        go.wait(10)
        out.write(whole[100:])

    stored = threading.Thread(target=store_stream, args=(state_path(node, "trainer"),
                                                          slow_fill))
    stored.start()
    while not list(node.glob(".trainer.state.*.tmp"))[1:]:  # the store's own temp file
        pass
    done: list[bool] = []
    discarding = threading.Thread(target=lambda: done.append(discard(node, "trainer")))
    discarding.start()
    discarding.join(0.3)
    assert done == []  # waits for the store under way
    go.set()
    stored.join(10)
    discarding.join(10)
    assert done == [True]  # the state that landed was removed
    assert not node.exists()
    assert discard(node, "trainer") is False  # nothing there: nothing to do


def test_a_source_of_another_service_replaces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a rollout activated with its job's trainer as the source: the trainer's newer
    # state must not replace the rollout's own file (take_over would refuse it after)
    secret = mint_secret()
    dir_t, dir_r = prepare_dir(tmp_path / "node-t"), prepare_dir(tmp_path / "node-r")
    t_svc, stop_t = start(Role.TRAINER, secret, handoff_dir=dir_t)
    r_svc, stop_r = start(Role.ROLLOUT, secret, handoff_dir=dir_r)
    try:
        t = _handle(t_svc)
        r = ServiceHandle(r_svc.address, secret, "42", "rollout", timeout_s=30)
        t.train_step([{"prompt_ids": [4], "completion_ids": [6, 2], "advantage": 1.0}])
        t.park(handoff=True)  # trainer.state: generation 1
        r.park(handoff=True)  # rollout.state: generation 0, the rollout's only state
        own = (dir_r / "rollout.state").read_bytes()
        with pytest.raises(ServiceError, match=f"source {t.address} is a tiny trainer; "
                           "this is a tiny rollout") as err:
            r.activate(handoff=True, source=t.address)
        assert err.value.status == 400

        # where the source's status says nothing, the file it sends is checked
        def no_status(self: ServiceHandle, timeout_s: float | None = None) -> dict[str, Any]:
            raise ServiceError("status", 503, "unavailable")

        monkeypatch.setattr(ServiceHandle, "status", no_status)
        calls: list[Callable[[], object]] = [
            lambda: r.activate(handoff=True, source=t.address),
            lambda: r.fetch_handoff(t.address)]
        for call in calls:
            with pytest.raises(ServiceError, match=r"it holds the state of another "
                               r"service \(\{'role': 'trainer'\}\)"):
                call()
        monkeypatch.undo()
        assert [p.name for p in dir_r.iterdir()] == ["rollout.state"]
        assert (dir_r / "rollout.state").read_bytes() == own
        assert r.activate(handoff=True)["residency"] == "active"  # its own state back
    finally:
        stop_t()
        stop_r()


def test_a_stored_state_must_be_the_storing_services(tmp_path: Path) -> None:
    src = tmp_path / "trainer.state"
    dst = prepare_dir(tmp_path / "node") / "rollout.state"
    write_state(src, {"backend": "tiny", "role": "trainer"}, 5)
    write_state(dst, {"backend": "tiny", "role": "rollout"}, 0)
    own = dst.read_bytes()

    def fill(out: BinaryIO) -> None:
        out.write(src.read_bytes())

    rollout = {"backend": "tiny", "role": "rollout"}
    with pytest.raises(BackendError, match=r"^fetch: it holds the state of another "
                       r"service \(\{'role': 'trainer'\}\); this one is"):
        store_stream(dst, fill, "fetch", None, rollout)
    assert dst.read_bytes() == own and [p.name for p in dst.parent.iterdir()] == [dst.name]
    assert store_stream(dst, fill, "fetch", None, {**rollout, "role": "trainer"})
    assert dst.read_bytes() == src.read_bytes()
