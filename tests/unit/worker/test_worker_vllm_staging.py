"""The vllm backend's weight staging, against a FAKE engine (no GPU, no vLLM here).

vLLM cannot run on this machine (no GPU, not installed), so `FakeEngine` stands in for
`vllm.LLM` and only records the calls the backend makes; nothing here shows vLLM itself
behaves. What it does check is the backend's own logic: weights imported while asleep
reach the engine only at activation, in the order vLLM's sleep mode needs (wake the
weights' memory, load, wake the KV cache, reset the prefix cache), and not before; and
that it refuses to hand its state to another copy (floating pools) without touching the
engine.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import torch

from slurmrl.model import Residency
from slurmrl.worker.protocol import BackendError
from slurmrl.worker.vllm_backend import VllmBackend


class FakeEngine:
    """Records `vllm.LLM` calls (sleep, wake_up, collective_rpc, reset_prefix_cache),
    and keeps which of its memories sleep as vLLM's executor does
    (vllm/v1/executor/abstract.py): it is sleeping until every tag woke, and a `sleep`
    while sleeping does nothing."""

    TAGS = frozenset({"weights", "kv_cache"})

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.asleep: set[str] = set()

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))
        if not self.asleep:  # vLLM: "Executor is already sleeping." and returns
            self.asleep = set(self.TAGS)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))
        self.asleep -= set(tags or self.TAGS)

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        # the weights come as a file's path (vllm_backend._load): what it holds is the
        # call's record
        self.calls.append(("collective_rpc", method, Path(*args).read_bytes()))
        return [None]

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))


def _blob() -> bytes:
    buf = io.BytesIO()
    torch.save({"model.embed_tokens.weight": torch.ones(4, 2)}, buf)
    return buf.getvalue()


def _backend() -> tuple[VllmBackend, FakeEngine]:
    b = VllmBackend("Qwen/Qwen3-0.6B")
    engine = FakeEngine()
    # what load() leaves behind, without vLLM: an awake engine with its weights
    b._llm, b._residency, b._weights_valid = engine, Residency.ACTIVE, True
    return b, engine


LOAD = [("wake_up", ("weights",)), ("collective_rpc", "slurmrl_load_weights", _blob()),
        ("wake_up", ("kv_cache",)), ("reset_prefix_cache",)]


@pytest.mark.parametrize("level", [1, 2])
def test_weights_imported_asleep_reach_the_engine_only_at_activation(level: int) -> None:
    b, engine = _backend()
    b.park(level)
    assert engine.calls == [("sleep", level)]
    b.import_weights(_blob())
    assert engine.calls == [("sleep", level)]  # nothing sent to the engine (its GPUs)
    assert b.staged and b.residency is not Residency.ACTIVE
    assert b.memory().host_bytes >= len(_blob())
    b.activate()
    assert engine.calls[1:] == LOAD
    assert b.residency is Residency.ACTIVE and not b.staged and b._weights_valid


def test_awake_engine_loads_at_once_and_plain_wake_without_staged_weights() -> None:
    b, engine = _backend()
    b.import_weights(_blob())
    assert engine.calls == [("collective_rpc", "slurmrl_load_weights", _blob()),
                            ("reset_prefix_cache",)]
    engine.calls.clear()
    b.park(1)
    b.activate()
    assert engine.calls == [("sleep", 1), ("wake_up", None)]


def test_a_blob_that_is_not_a_state_dict_is_refused_while_asleep() -> None:
    b, engine = _backend()
    b.park(1)
    with pytest.raises(BackendError, match="not a torch state_dict"):
        b.import_weights(b"garbage")
    assert not b.staged
    b.activate()
    assert engine.calls == [("sleep", 1), ("wake_up", None)]


def test_vllm_cannot_hand_its_state_to_another_copy(tmp_path: Path) -> None:
    b, engine = _backend()
    for call in (b.hand_off, b.take_over):
        with pytest.raises(BackendError, match=r"vllm backend cannot hand its state to "
                           r"another copy.*floating pools need a backend that can "
                           r"\(torch or tiny\)"):
            call(tmp_path / "rollout.state")
    assert engine.calls == [] and list(tmp_path.iterdir()) == []
    assert b.residency is Residency.ACTIVE and not b.handed_off and b.generation == 0


def test_a_park_after_a_weights_only_wake_puts_the_whole_engine_to_sleep() -> None:
    # a dropped rollout woke for a refit wakes its weights alone (the KV cache waits
    # for the new weights); parked again before they came, its sleep must not be the
    # no-op vLLM makes of a sleep while anything sleeps: its weights would stay on the GPU
    b, engine = _backend()
    b.park(2)
    b.activate()
    assert engine.asleep == {"kv_cache"}
    b.park(1)
    assert engine.calls[-2:] == [("wake_up", ("kv_cache",)), ("sleep", 1)]
    assert engine.asleep == FakeEngine.TAGS and b.residency is Residency.PARKED
    b.activate()
    assert not b._weights_valid  # still no weights: a refit comes first
    b.import_weights(_blob())
    assert engine.asleep == set() and b._weights_valid
