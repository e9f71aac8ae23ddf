"""A level-2 park (a rollout's drop) frees the host copy, also from parked: the contract
`protocol.ServiceBackend.park` states and the residency planner counts on
(`residency.DROPS_PARKED_BACKENDS`); and `tiny`/`torch` keep their host buffers while
active, which the planner counts too (`residency.KEEPS_HOST_BACKENDS`).

`tiny` and `torch` run here on the CPU, where the host buffers are ordinary tensors
(pinned memory only exists with CUDA): these tests check the backends' bookkeeping of
which buffers they hold, not that CUDA gives pinned memory back. The `vllm` one runs
against a FAKE engine (no GPU, no vLLM here): it checks only what the backend asks of it.
"""

from __future__ import annotations

import io

import pytest
import torch
from torch import nn

from slurmrl.controller.residency import DROPS_PARKED_BACKENDS, KEEPS_HOST_BACKENDS
from slurmrl.model import Residency
from slurmrl.worker.offload import Offloader
from slurmrl.worker.protocol import GenerateParams, MemoryUse, Role
from slurmrl.worker.tiny import TinyBackend
from slurmrl.worker.torch_backend import TorchModelBackend
from slurmrl.worker.vllm_backend import VllmBackend

PROMPTS = ["1+2=", "30*4="]
PARAMS = GenerateParams(max_tokens=8, seed=5)


def _rollout() -> TinyBackend:
    b = TinyBackend(Role.ROLLOUT, seed=1)
    b.load()
    return b


def _blob(b: TinyBackend) -> bytes:
    return b.export_weights()


def test_a_parked_tiny_rollout_dropped_frees_its_host_copy() -> None:
    b = _rollout()
    b.park(1)
    assert b.memory().host_bytes > 0
    b.park(2)
    assert b.residency is Residency.DROPPED
    assert b.memory() == MemoryUse(0, 0)  # TinyLM has no non-persistent buffers


def test_a_drop_from_active_keeps_no_host_copy_either() -> None:
    b = _rollout()
    b.park(2)
    assert b.residency is Residency.DROPPED and b.memory() == MemoryUse(0, 0)


def test_weights_staged_while_parked_go_with_the_drop_and_a_sync_refills() -> None:
    b = _rollout()
    blob = _blob(b)
    expected = b.generate(PROMPTS, PARAMS)
    b.park(1)
    b.import_weights(blob)
    assert b.staged
    b.park(2)
    assert b.residency is Residency.DROPPED and not b.staged
    assert b.memory().host_bytes == 0
    b.import_weights(blob)  # the next sync: host buffers again, for the weights only
    assert b.memory().host_bytes == sum(
        v.numel() * v.element_size()
        for v in torch.load(io.BytesIO(blob), weights_only=True).values())
    b.activate()
    assert b.generate(PROMPTS, PARAMS) == expected
    b.park(1)  # and a later level-1 park has all its buffers again
    b.activate()
    assert b.generate(PROMPTS, PARAMS) == expected


def test_a_sync_staged_at_level_1_refills_a_rollout_woken_without_weights() -> None:
    # dropped, woken before any sync (its weights invalid), parked for a partner's phase:
    # the sync reaches it parked, and its next activation runs with those weights
    b = _rollout()
    blob = _blob(b)
    expected = b.generate(PROMPTS, PARAMS)
    b.park(2)
    b.activate()
    b.park(1)
    b.import_weights(blob)
    assert b.staged
    b.activate()
    assert b.generate(PROMPTS, PARAMS) == expected


def test_a_parked_model_dropped_keeps_the_buffers_its_weights_do_not_carry() -> None:
    class Rotary(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.arange(1.0, 3.0), persistent=False)

    b = TorchModelBackend(Role.ROLLOUT, Rotary, device="cpu")
    b.load()
    blob = b.export_weights()
    b.park(1)
    b.park(2)
    assert b.residency is Residency.DROPPED
    assert b.memory().host_bytes == 2 * 4  # inv_freq only
    b.import_weights(blob)
    b.activate()
    model = b._model
    assert model is not None
    assert model.inv_freq.tolist() == [1.0, 2.0]  # type: ignore[operator]
    assert torch.equal(model.proj.weight,  # type: ignore[union-attr]
                       torch.load(io.BytesIO(blob), weights_only=True)["proj.weight"])


def test_a_trainer_still_refuses_level_2_when_parked() -> None:
    b = TinyBackend(Role.TRAINER)
    b.load()
    b.park(1)
    with pytest.raises(Exception, match="level 2"):
        b.park(2)
    assert b.residency is Residency.PARKED


def test_released_buffers_are_allocated_again_only_when_asked() -> None:
    keep, drop = torch.ones(2), torch.ones(6)
    off = Offloader(torch.device("cpu"))
    off.refresh([keep, drop])
    off.offload()
    off.release_host(keep=[keep])
    assert off.host_bytes() == 2 * 4
    with pytest.raises(ValueError, match="released"):
        off.write_host([(drop, torch.full((6,), 3.0))])
    off.write_host([(drop, torch.full((6,), 3.0))], allocate=True)
    assert off.host_bytes() == 8 * 4
    off.onload()
    assert keep.tolist() == [1.0, 1.0] and drop.tolist() == [3.0] * 6


class _SleepingEngine:
    """FAKE `vllm.LLM`: a `sleep` while asleep does nothing (vLLM's executor)."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.asleep = False

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))
        self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tags))


def test_a_parked_vllm_engine_stays_parked_on_a_drop_and_says_so() -> None:
    b = VllmBackend("Qwen/Qwen3-0.6B")
    engine = _SleepingEngine()
    b._llm, b._residency, b._weights_valid = engine, Residency.ACTIVE, True
    b._weights_bytes = 1234
    b.park(1)
    b.park(2)
    assert engine.calls == [("sleep", 1)]  # no second sleep, no wake on the GPU
    assert b.residency is Residency.PARKED  # what its answer to the controller says
    assert b.memory().host_bytes == 1234  # still pinned: the planner must not count it


def test_the_planners_list_matches_what_the_rollout_backends_do() -> None:
    tiny = _rollout()
    tiny.park(1)
    tiny.park(2)
    assert ("tiny" in DROPS_PARKED_BACKENDS) == (tiny.residency is Residency.DROPPED)
    assert "vllm" not in DROPS_PARKED_BACKENDS  # the test above


def test_the_planners_list_of_backends_keeping_host_buffers_while_active_matches() -> None:
    # tiny and torch allocate their host buffers at load and keep them through an
    # activation: the planner counted an active service as pinning no host memory
    trainer = TorchModelBackend(Role.TRAINER, lambda: nn.Linear(64, 64), device="cpu")
    trainer.load()
    for name, b in (("tiny", _rollout()), ("torch", trainer)):
        held = [b.memory().host_bytes]  # loaded, active
        b.park(1)
        b.activate()
        held.append(b.memory().host_bytes)
        assert b.residency is Residency.ACTIVE
        assert (name in KEEPS_HOST_BACKENDS) == (min(held) > 0), (name, held)
    assert "vllm" not in KEEPS_HOST_BACKENDS  # its engine pins host memory once asleep
