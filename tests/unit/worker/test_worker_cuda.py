"""The CUDA paths on a real NVIDIA GPU.

Parking a trainer into pinned host memory and back between steps, a rollout's drop and a
weight sync staged into it, a hand-off between two copies (with CUDA's random-number
state), an activation that finds the GPU full, what NVML sees a park give back, torch's
pinned allocator sized exactly where torch takes the setting (`pin_exactly`), and two
worker processes serving a trainer on the GPU over their sockets.

Marked `gpu`: this project's CI has no GPU and deselects them (pyproject's addopts).
Run them on a GPU node with `pytest -m gpu tests/unit/worker`; docs/benchmarks.md
says where they last ran.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from _worker_service import train_batches

from slurmrl.auth.tokens import mint_secret
from slurmrl.gpu.nvml import NvmlMonitor, reading_json, this_process_tree
from slurmrl.model import Residency
from slurmrl.worker.cli import SECRET_ENV
from slurmrl.worker.handle import ServiceHandle
from slurmrl.worker.lm import WideLM
from slurmrl.worker.protocol import MemoryUse, Role
from slurmrl.worker.torch_backend import TorchModelBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

# cuBLAS picks its reductions by workspace: a fixed one makes matrix products repeat
# bit for bit (read when cuBLAS starts, so set before any product runs)
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")



@pytest.fixture
def deterministic() -> Iterator[None]:
    """Kernels that repeat bit for bit, so two runs of the same steps can be compared."""
    was = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
           torch.backends.cudnn.benchmark)
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    yield
    torch.use_deterministic_algorithms(was[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = was[1], was[2]


def _make(role: Role = Role.TRAINER, dim: int = 512, layers: int = 4,
          dropout: float = 0.0) -> Callable[[], TorchModelBackend]:
    def make() -> TorchModelBackend:
        b = TorchModelBackend(role, lambda: WideLM(dim, layers, dropout=dropout),
                              device="cuda", lr=1e-3, seed=3)
        b.load()
        return b
    return make


def _params(b: TorchModelBackend) -> list[torch.Tensor]:
    assert b._model is not None
    return [p.detach().cpu().clone() for p in b._model.parameters()]


def _max_diff(x: list[torch.Tensor], y: list[torch.Tensor]) -> float:
    assert [a.shape for a in x] == [b.shape for b in y]
    return max(float((a.double() - b.double()).abs().max()) for a, b in zip(x, y, strict=True))


def _adam(b: TorchModelBackend) -> list[torch.Tensor]:
    assert b._opt is not None
    return [v.detach().cpu().clone() for state in b._opt.state.values()
            for v in state.values() if isinstance(v, torch.Tensor)]


def test_a_trainer_parked_between_steps_trains_on_as_one_never_parked(
        deterministic: None) -> None:
    batches = train_batches(4)
    make = _make()
    reference = make()
    ref_losses = [reference.train_step(b)["loss"] for b in batches]
    parked = make()
    losses = []
    for batch in batches:
        losses.append(parked.train_step(batch)["loss"])
        parked.park(1)
        assert parked.residency is Residency.PARKED and parked.memory().device_bytes == 0
        assert all(p.numel() == 0 for p in parked._model.parameters())  # type: ignore[union-attr]
        parked.activate()
    assert losses == ref_losses
    assert _max_diff(_params(parked), _params(reference)) == 0.0
    assert _max_diff(_adam(parked), _adam(reference)) == 0.0


def test_a_park_gives_the_memory_back_to_the_driver_as_nvml_sees_it() -> None:
    # what another process can use is what the driver has back, not torch's own count
    mon = NvmlMonitor()
    assert mon.available, mon.reason
    me = this_process_tree()
    b = _make(dim=4096, layers=8)()  # 134M parameters: 2.1 GB with Adam's moments
    batch = train_batches(1)[0]
    b.train_step(batch)
    state = b.memory().device_bytes
    assert state >= 3 * 4 * 8 * 4096 * 4096
    torch.cuda.synchronize()
    before = mon.process_memory(me)
    b.park(1)
    parked = mon.process_memory(me)
    assert before is not None and parked is not None, "NVML did not list this process"
    assert before - parked >= 0.95 * state, (before, parked, state)
    assert b.memory() == MemoryUse(0, state)  # pinned host buffers, the same bytes
    b.activate()
    back = mon.process_memory(me)
    assert back is not None and back - parked >= 0.95 * state, (back, parked, state)
    assert b.train_step(batch)["step"] == 2.0


def test_nvml_reads_this_gpu_and_maps_cuda_visible_devices() -> None:
    mon = NvmlMonitor()
    assert mon.available, mon.reason
    assert mon.devices(), "NVML lists no GPU this process may open"
    first = mon.read(mon.devices()[0])
    assert first.name and first.uuid and first.uuid.startswith("GPU-")
    assert first.memory_total_bytes is not None and first.memory_total_bytes > 8 << 30
    assert mon.visible({"CUDA_VISIBLE_DEVICES": "0"}) == (mon.devices()[0],)
    assert mon.visible({"CUDA_VISIBLE_DEVICES": first.uuid}) == (mon.devices()[0],)
    assert mon.visible({"CUDA_VISIBLE_DEVICES": first.uuid[:12]}) == (mon.devices()[0],)
    record = reading_json(mon, [mon.devices()[0]])
    assert record["nvml"] == "ok" and record["gpus"][0]["uuid"] == first.uuid
    assert record["gpus"][0]["utilization_pct"] is not None


def test_an_activation_that_finds_the_gpu_full_stays_parked_and_can_retry() -> None:
    b = _make(dim=2048, layers=4)()
    batch = train_batches(1)[0]
    b.train_step(batch)
    want = _params(b)
    b.park(1)
    torch.cuda.empty_cache()
    hog: list[torch.Tensor] = []
    for size in (1 << 30, 64 << 20, 1 << 20):  # fill the GPU, coarse to fine
        try:
            while True:
                hog.append(torch.empty(size, dtype=torch.uint8, device="cuda"))
        except torch.OutOfMemoryError:
            pass
    try:
        with pytest.raises(torch.OutOfMemoryError):
            b.activate()
        assert b.residency is Residency.PARKED and b.memory().device_bytes == 0
        assert all(p.numel() == 0 for p in b._model.parameters())  # type: ignore[union-attr]
    finally:
        hog.clear()
        torch.cuda.empty_cache()
    b.activate()
    assert _max_diff(_params(b), want) == 0.0
    assert b.train_step(batch)["step"] == 2.0


def test_a_dropped_rollout_takes_a_weight_sync_without_touching_the_gpu() -> None:
    trainer = _make()()
    trainer.train_step(train_batches(1)[0])
    rollout = _make(Role.ROLLOUT)()
    rollout.park(2)
    assert rollout.memory() == MemoryUse(0, 0)
    torch.cuda.synchronize()
    used = torch.cuda.memory_allocated()
    rollout.import_weights(trainer.export_weights())
    assert rollout.staged and torch.cuda.memory_allocated() == used
    rollout.activate()
    assert _max_diff(_params(rollout), _params(trainer)) == 0.0


def test_a_trainer_with_dropout_handed_to_another_copy_trains_on_as_in_one_process(
        tmp_path: Path, deterministic: None) -> None:
    # dropout draws from CUDA's generator: the hand-off carries its state
    batches = train_batches(5)
    make = _make(dropout=0.3)
    reference = make()
    losses = [reference.train_step(b)["loss"] for b in batches]
    first = make()
    for b in batches[:2]:
        first.train_step(b)
    first.hand_off(tmp_path / "trainer.state")
    assert first.memory() == MemoryUse(0, 0)
    second = make()
    second.take_over(tmp_path / "trainer.state")
    assert [second.train_step(b)["loss"] for b in batches[2:]] == losses[2:]
    assert _max_diff(_params(second), _params(reference)) == 0.0


PROBE = """
import json, torch
from slurmrl.worker.offload import Offloader, pin_exactly
took = {pin} and pin_exactly()
started = torch.cuda.is_initialized()
t = torch.empty({n}, dtype=torch.uint8, device="cuda")
off = Offloader(torch.device("cuda"))
off.refresh([t])
stats = getattr(torch.cuda, "host_memory_stats", dict)()
print(json.dumps({{"took": took, "cuda_started_by_it": started,
                   "host_bytes": off.host_bytes(),
                   "allocated": stats.get("allocated_bytes.current"),
                   "torch": torch.__version__}}))
"""


def _pinned(n: int, pin: bool) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_ALLOC_CONF"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(n=n, pin=pin)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    print("pin_exactly" if pin else "default", got)
    return got


def test_pin_exactly_says_truly_whether_a_parked_buffer_is_pinned_at_its_own_size() -> None:
    # torch rounds each pinned block up to a power of two: 1.12 GB pinned 2 GiB. The
    # worker asks for exact blocks (pin_exactly) where its torch knows the setting.
    n = 1_200_000_000
    exact = _pinned(n, pin=True)
    assert not exact["cuda_started_by_it"]  # vLLM picks how to start its engine by it
    assert exact["host_bytes"] == n and exact["allocated"] is not None
    if exact["took"]:
        assert exact["allocated"] <= n * 1.01, exact
    else:  # it warned that blocks are rounded: they are
        assert exact["allocated"] >= 1 << 31, exact
    assert _pinned(n, pin=False)["allocated"] >= 1 << 31  # the default rounds


def test_a_worker_serves_a_trainer_on_the_gpu_parks_it_and_hands_it_over(
        tmp_path: Path) -> None:
    # two copies of one trainer, as a floating pool runs them, in real worker processes
    secret = mint_secret()
    handoff_dir = tmp_path / "handoff"
    env = {**os.environ, SECRET_ENV: secret, "SLURMRL_HANDOFF_DIR": str(handoff_dir)}
    env.pop("PYTORCH_ALLOC_CONF", None)  # as the controller starts it (services.step_env)
    procs, handles = [], []
    try:
        for name in ("a", "b"):
            addr = tmp_path / f"address-{name}"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "slurmrl.worker", "--backend", "torch", "--role",
                 "trainer", "--device", "cuda", "--job-id", "9", "--host", "127.0.0.1",
                 "--address-file", str(addr), "--lr", "0.01"],
                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            deadline = time.monotonic() + 120
            while not addr.exists():
                p = procs[-1]
                assert p.poll() is None, p.stderr.read() if p.stderr else ""
                assert time.monotonic() < deadline, "the worker did not announce itself"
                time.sleep(0.2)
            announced = addr.read_text().strip()
            assert re.fullmatch(r"127\.0\.0\.1:[0-9]+/[0-9a-f]{16}", announced)
            handles.append(ServiceHandle(announced, secret, "9", "trainer", timeout_s=120))
        a, b = handles
        batch = train_batches(1)[0]
        for _ in range(2):
            a.train_step(batch)
        status = a.status()
        assert status["gpus"]["nvml"] == "ok", status["gpus"]
        assert status["memory"]["device_bytes"] > 0
        parked = a.park(1)
        assert parked["residency"] == "parked" and parked["memory"]["device_bytes"] == 0
        a.activate()
        assert a.train_step(batch)["step"] == 3.0
        moved = a.park(handoff=True)
        assert moved["handed_off"] and moved["memory"] == {"device_bytes": 0,
                                                           "host_bytes": 0}
        took = b.activate(handoff=True)
        assert took["residency"] == "active" and took["generation"] == 1
        assert b.train_step(batch)["step"] == 4.0
        for h in handles:
            h.stop()
        for p in procs:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
