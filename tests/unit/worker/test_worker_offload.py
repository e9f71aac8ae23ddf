"""Offloader: state survives a trip through host buffers allocated once."""

from __future__ import annotations

import logging
import os

import pytest
import torch

from slurmrl.worker import offload
from slurmrl.worker.offload import ALLOC_CONF_ENV, PINNED_EXACT, Offloader, pin_exactly


def test_offload_frees_and_onload_restores_exact_values() -> None:
    a, b = torch.randn(4, 5), torch.randn(7)
    keep = (a.clone(), b.clone())
    off = Offloader(torch.device("cpu"))
    off.refresh([a, b, a])  # duplicates are tracked once
    assert off.device_bytes() == (20 + 7) * 4
    off.offload()
    assert a.numel() == 0 and b.numel() == 0
    off.onload()
    assert torch.equal(a, keep[0]) and torch.equal(b, keep[1])


def test_host_buffers_are_allocated_once_across_cycles() -> None:
    t = torch.randn(3, 3)
    off = Offloader(torch.device("cpu"))
    off.refresh([t])
    buffers = [id(x) for x in off._host.values()]
    for _ in range(3):
        off.refresh([t])
        off.offload()
        off.onload()
    assert [id(x) for x in off._host.values()] == buffers


def test_drop_without_host_copy_restores_zeros() -> None:
    t = torch.ones(6)
    off = Offloader(torch.device("cpu"))
    off.refresh([t])
    off.offload(keep_host_copy=False)
    off.onload(restore=False)
    assert torch.equal(t, torch.zeros(6))


def test_tracked_set_cannot_change_while_offloaded() -> None:
    t = torch.ones(2)
    off = Offloader(torch.device("cpu"))
    off.refresh([t])
    off.offload()
    with pytest.raises(RuntimeError, match="while offloaded"):
        off.refresh([t, torch.ones(3)])


def test_released_host_buffers_hold_nothing_until_refreshed() -> None:
    t = torch.ones(6)
    off = Offloader(torch.device("cpu"))
    off.refresh([t])
    off.offload(keep_host_copy=False)
    off.release_host()
    assert off.host_bytes() == 0 and off.shape_of(t) == torch.Size([6])
    with pytest.raises(ValueError, match="host buffers were released"):
        off.write_host([(t, torch.ones(6))])
    off.onload(restore=False)
    assert torch.equal(t, torch.zeros(6))
    off.refresh([t])  # the next park has its buffer again
    assert off.host_bytes() == 6 * 4


def test_a_failed_onload_stays_offloaded_and_can_be_retried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # e.g. the device is out of memory: nothing half-allocated stays, the state stays
    a, b = torch.randn(4), torch.randn(3)
    keep = (a.clone(), b.clone())
    off = Offloader(torch.device("cpu"))
    off.refresh([a, b])
    off.offload()

    def out_of_memory(tensors: object, to_host: bool) -> None:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(off, "_copy", out_of_memory)
    with pytest.raises(RuntimeError, match="out of memory"):
        off.onload()
    assert off.offloaded and a.numel() == 0 and b.numel() == 0
    monkeypatch.undo()
    off.onload()
    assert torch.equal(a, keep[0]) and torch.equal(b, keep[1])


def test_write_host_refuses_a_value_that_is_not_dense_before_writing_any() -> None:
    a, b = torch.randn(4, 5), torch.randn(7)
    keep = (a.clone(), b.clone())
    off = Offloader(torch.device("cpu"))
    off.refresh([a, b])
    off.offload()
    with pytest.raises(ValueError, match="sparse_coo tensor is not a dense tensor"):
        off.write_host([(a, torch.zeros(4, 5)), (b, torch.ones(7).to_sparse())])
    off.onload()
    assert torch.equal(a, keep[0]) and torch.equal(b, keep[1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (none here)")
def test_cuda_offload_frees_gpu_memory_and_restores() -> None:
    dev = torch.device("cuda")
    t = torch.randn(64, 1 << 20, device=dev)  # 256 MiB
    keep = t.clone().cpu()
    off = Offloader(dev)
    off.refresh([t])
    assert all(b.is_pinned() for b in off._host.values())
    before = torch.cuda.memory_reserved(dev)
    off.offload()
    assert torch.cuda.memory_reserved(dev) <= before - (256 << 20)
    off.onload()
    assert torch.equal(t.cpu(), keep)


def test_a_bare_cuda_device_is_taken_as_the_current_index(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A fake GPU (none here): torch says the current device is 1. A tensor made on
    # `cuda` reports `cuda:1`, and `torch.device("cuda") != torch.device("cuda:1")`: an
    # offloader comparing with a bare `cuda` tracked no tensor, so parking a trainer
    # on the default `--device cuda` freed nothing but its gradients.
    from slurmrl.worker.torch_backend import resolve_device

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert torch.device("cuda") != torch.device("cuda", 1)
    assert Offloader(torch.device("cuda")).device == torch.device("cuda", 1)
    assert resolve_device("cuda") == torch.device("cuda", 1)
    assert resolve_device("cuda:0") == torch.device("cuda", 0)
    assert resolve_device("cpu") == torch.device("cpu")


def test_pin_exactly_applies_the_setting_here_and_for_the_processes_started_from_here(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake setter (the CPU torch here accepts any key): what a torch that knows the
    # key does. vLLM's engine runs in a child process: it gets the setting by env.
    took: list[str] = []
    monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", took.append,
                        raising=False)
    monkeypatch.setenv(ALLOC_CONF_ENV, "expandable_segments:True")
    assert pin_exactly() is True
    assert took == [PINNED_EXACT]
    assert os.environ[ALLOC_CONF_ENV] == f"expandable_segments:True,{PINNED_EXACT}"
    assert pin_exactly() and os.environ[ALLOC_CONF_ENV].count(PINNED_EXACT) == 1


@pytest.mark.parametrize("refusal", ["raises", "missing"])
def test_pin_exactly_where_torch_refuses_the_key_warns_and_changes_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        refusal: str) -> None:
    # torch 2.11 on an H200: "Unrecognized key 'pinned_max_round_threshold_mb' in CUDA
    # allocator config." Put in the environment, it failed every CUDA start.
    def refuse(_: str) -> None:
        raise ValueError("Unrecognized key 'pinned_max_round_threshold_mb' in CUDA "
                         "allocator config.")

    if refusal == "raises":
        monkeypatch.setattr(torch._C, "_accelerator_setAllocatorSettings", refuse,
                            raising=False)
    else:
        monkeypatch.delattr(torch._C, "_accelerator_setAllocatorSettings", raising=False)
    monkeypatch.delenv(ALLOC_CONF_ENV, raising=False)
    with caplog.at_level(logging.WARNING, logger=offload.__name__):
        assert pin_exactly() is False
    assert ALLOC_CONF_ENV not in os.environ
    assert "rounded up to a power of two" in caplog.text and PINNED_EXACT in caplog.text
