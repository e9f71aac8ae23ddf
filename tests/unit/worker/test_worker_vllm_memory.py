"""The vllm backend's memory sizing, host-memory figures and sampling arguments, against
a FAKE `vllm` module, a FAKE engine and a FAKE NVML (no GPU, no vLLM here).

What these check is the backend's own arithmetic and what it passes to `vllm.LLM` and
`vllm.SamplingParams` (names as in vLLM's source: `LLM(kv_cache_memory_bytes=...,
gpu_memory_utilization=...)`, vllm/config/cache.py; `SamplingParams` refusing a
temperature over 2 with a ValueError, vllm/sampling_params.py). Nothing here shows that
vLLM, CUDA or NVML behave so on a GPU: that has not run in this project.
"""

from __future__ import annotations

import os
import sys
import time
import types
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from slurmrl.gpu.estimate import GiB
from slurmrl.gpu.nvml import NvmlMonitor
from slurmrl.model import Residency
from slurmrl.worker.backends import BackendOptions, make_backend
from slurmrl.worker.protocol import MAX_SEED, BackendError, GenerateParams, Role
from slurmrl.worker.vllm_backend import VllmBackend, WeightSyncExtension


class _Nvml:
    """FAKE pynvml: one 80 GiB GPU per index; `procs` is what this process holds."""

    class NVMLError(Exception):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    NVMLError_LibraryNotFound = NVMLError_DriverNotLoaded = NVMLError_NotSupported

    def __init__(self, count: int = 1) -> None:
        self.count = count
        self.used = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=self.used, total=80 * GiB)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        import os
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.used)]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=0)

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h}"

    def nvmlDeviceGetName(self, h: int) -> str:
        return "FAKE"


class _LLM:
    """FAKE `vllm.LLM`: records its arguments; its worker reports `weights` bytes."""

    made: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kw: Any) -> None:
        # what the engine's processes inherit: vLLM reads its VLLM_* settings there
        _LLM.made.append({**kw, "env": dict(os.environ)})
        self.weights = 3 * GiB

    def collective_rpc(self, method: str, args: tuple[Any, ...] = ()) -> list[Any]:
        assert method == "slurmrl_weights_bytes"
        return [self.weights]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> type[_LLM]:
    _LLM.made = []
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=_LLM))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    return _LLM


def _backend(nvml: _Nvml, **kw: Any) -> VllmBackend:
    b = VllmBackend("Qwen/Qwen2.5-1.5B", **kw)
    b._nvml = NvmlMonitor(nvml)
    return b


def test_the_engine_gets_the_planned_kv_cache_and_share_of_the_gpu(
        fake_vllm: type[_LLM]) -> None:
    b = _backend(_Nvml(), kv_cache_bytes=3 * GiB, gpu_memory_bytes=7 * GiB)
    b.load()
    (kw,) = fake_vllm.made
    assert kw["kv_cache_memory_bytes"] == 3 * GiB
    assert kw["gpu_memory_utilization"] == pytest.approx(7 / 80, abs=1e-4)
    assert kw["enable_sleep_mode"] is True
    # not the 0.85 default: vLLM would take ~68 GiB the planner does not know of
    assert kw["gpu_memory_utilization"] < 0.1


def test_without_a_budget_or_a_gpu_size_the_configured_share_stays(
        fake_vllm: type[_LLM]) -> None:
    _backend(_Nvml()).load()
    no_gpu = VllmBackend("Qwen/Qwen2.5-1.5B", kv_cache_bytes=GiB, gpu_memory_bytes=7 * GiB)
    no_gpu._nvml = NvmlMonitor(_Nvml(count=0))
    no_gpu.load()
    plain, sized = fake_vllm.made
    assert plain["gpu_memory_utilization"] == 0.85 and "kv_cache_memory_bytes" not in plain
    assert sized["gpu_memory_utilization"] == 0.85 and sized["kv_cache_memory_bytes"] == GiB


def test_the_worker_command_line_reaches_the_engine(fake_vllm: type[_LLM],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmrl.worker.cli import worker

    ctx = worker.make_context("worker", [
        "--backend", "vllm", "--role", "rollout", "--job-id", "1", "--model", "m-1.5B",
        "--gpu-memory-bytes", str(7 * GiB), "--kv-cache-bytes", str(3 * GiB)])
    p = ctx.params
    b = make_backend("vllm", Role.ROLLOUT, BackendOptions(
        model=p["model"], kv_cache_bytes=p["kv_cache_bytes"],
        gpu_memory_bytes=p["gpu_memory_bytes"]))
    assert isinstance(b, VllmBackend)
    b._nvml = NvmlMonitor(_Nvml())
    b.load()
    assert fake_vllm.made[0]["kv_cache_memory_bytes"] == 3 * GiB


def test_a_rollout_over_several_gpus_is_one_engine_split_over_them(
        fake_vllm: type[_LLM]) -> None:
    b = make_backend("vllm", Role.ROLLOUT, BackendOptions(model="m-7B",
                                                          tensor_parallel_size=2))
    assert isinstance(b, VllmBackend)
    b._nvml = NvmlMonitor(_Nvml(count=2))
    b.load()
    assert fake_vllm.made[0]["tensor_parallel_size"] == 2


def test_a_level_1_sleep_pins_the_weights_bytes_not_what_nvml_saw_freed(
        fake_vllm: type[_LLM]) -> None:
    nvml = _Nvml()
    b = _backend(nvml, kv_cache_bytes=3 * GiB, gpu_memory_bytes=7 * GiB)
    b.load()

    class Sleeps:
        def sleep(self, level: int) -> None:
            nvml.used = GiB  # the context stays; weights and KV cache left the GPU

    engine = b._llm
    b._llm = Sleeps()
    nvml.used = 7 * GiB
    b.park(1)
    assert b.last_freed_bytes == 6 * GiB  # weights and KV cache
    assert b.memory().host_bytes == engine.weights == 3 * GiB  # only the weights


def test_the_worker_extension_counts_model_tensors_once() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.embed.weight  # tied, as many LMs are
            self.register_buffer("inv_freq", torch.ones(3), persistent=False)

    ext = WeightSyncExtension()
    ext.model_runner = SimpleNamespace(model=Tied())
    assert ext.slurmrl_weights_bytes() == (10 * 4 + 3) * 4


class _Sampling:
    """FAKE `vllm.SamplingParams` with vLLM's own checks on temperature and seed."""

    def __init__(self, **kw: Any) -> None:
        if kw["temperature"] > 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {kw['temperature']}.")
        torch.Generator().manual_seed(kw["seed"])  # what a per-request seed must fit
        self.kw = kw


class _Generates:
    def __init__(self) -> None:
        self.seeds: list[int] = []

    def generate(self, inputs: list[Any], sps: list[_Sampling], use_tqdm: bool) -> list[Any]:
        self.seeds += [sp.kw["seed"] for sp in sps]
        comp = SimpleNamespace(token_ids=[1], text="x", finish_reason="stop")
        return [SimpleNamespace(prompt_token_ids=[1], outputs=[comp]) for _ in inputs]


def test_a_time_ns_seed_gives_per_sequence_seeds_within_64_bits(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=_Sampling))
    b = VllmBackend("m-1B")
    engine = _Generates()
    b._llm, b._residency, b._weights_valid = engine, Residency.ACTIVE, True
    for seed in (time.time_ns(), MAX_SEED):
        b.generate(["a", "b"], GenerateParams(seed=seed, first_index=2**31 - 1))
    assert len(engine.seeds) == 4 and all(0 <= s <= MAX_SEED for s in engine.seeds)
    assert len(set(engine.seeds)) == 4


def test_a_temperature_vllm_refuses_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match=r"temperature must be in 0\.\.2"):
        GenerateParams(temperature=5.0)


def test_any_sampling_parameter_vllm_refuses_is_a_backend_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Refuses:
        def __init__(self, **kw: Any) -> None:
            raise ValueError("max_tokens must be at least 1")  # VLLMValidationError's base

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=Refuses))
    b = VllmBackend("m-1B")
    b._llm, b._residency, b._weights_valid = _Generates(), Residency.ACTIVE, True
    with pytest.raises(BackendError, match="vLLM refused the sampling parameters"):
        b.generate(["a"], GenerateParams())
