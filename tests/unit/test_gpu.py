"""GPU monitoring and memory estimates.

The no-GPU tests use the real pynvml on this GPU-less machine. The parsing tests use a
FAKE NVML module (`FakeNvml` below), because there is no GPU here to read: they check
how readings are turned into values, not that NVML works.
"""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from slurmrl.gpu import (
    NvmlMonitor,
    descendant_pids,
    estimate_model_memory,
    parse_param_count,
)
from slurmrl.gpu.estimate import GiB, active_param_count


def test_no_gpu_mode_is_clean_with_real_pynvml() -> None:
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.fail("this machine has an NVIDIA driver; the no-GPU test needs none")
    mon = NvmlMonitor()
    assert mon.available is False
    assert "no GPU" in mon.reason
    assert mon.snapshot() == ()
    assert mon.device_count() == 0
    assert mon.process_memory([os.getpid()]) is None  # unknown, never "0 bytes"
    with pytest.raises(RuntimeError, match="no GPU"):
        mon.read(0)
    mon.close()


class FakeNvml:
    """FAKE pynvml for unit tests only: two GPUs, the second a MIG-like device."""

    class NVMLError(Exception):
        pass

    class NVMLError_LibraryNotFound(NVMLError):
        pass

    class NVMLError_DriverNotLoaded(NVMLError):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    def __init__(self, init_error: type[Exception] | None = None) -> None:
        self.init_error = init_error
        self.shut = False

    def nvmlInit(self) -> None:
        if self.init_error:
            raise self.init_error()

    def nvmlShutdown(self) -> None:
        self.shut = True

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        if h == 1:
            raise self.NVMLError_NotSupported()
        return SimpleNamespace(gpu=87, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(h + 1) * GiB, total=80 * GiB, free=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if h == 0:
            return [SimpleNamespace(pid=100, usedGpuMemory=3 * GiB),
                    SimpleNamespace(pid=200, usedGpuMemory=None)]
        return [SimpleNamespace(pid=100, usedGpuMemory=GiB)]

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "FAKE H100"


def test_fake_readings_parse_and_unsupported_is_none() -> None:
    mon = NvmlMonitor(FakeNvml())
    assert mon.available
    g0, g1 = mon.snapshot()
    assert (g0.index, g0.uuid, g0.name, g0.utilization_pct) == (0, "GPU-0", "FAKE H100", 87)
    assert g0.memory_used_bytes == GiB and g0.memory_total_bytes == 80 * GiB
    assert g1.utilization_pct is None  # NotSupported per call -> unknown, not an error
    assert g0.processes is not None and g0.processes[1].used_bytes is None


def test_fake_process_memory_sums_over_gpus_and_refuses_to_guess() -> None:
    mon = NvmlMonitor(FakeNvml())
    assert mon.process_memory([100]) == 4 * GiB
    assert mon.process_memory([999]) == 0
    assert mon.process_memory([100, 200]) is None  # one reading unreported


def test_fake_process_memory_is_unknown_when_a_gpu_cannot_be_read() -> None:
    # a GPU lost (or one outside the job this process may not open): NVML raises
    # another error than NotSupported; a vLLM park asking what it freed must not fail
    nvml = FakeNvml()

    def lost(h: int) -> list[Any]:
        raise nvml.NVMLError("GPU is lost")

    nvml.nvmlDeviceGetComputeRunningProcesses = lost  # type: ignore[method-assign]
    assert NvmlMonitor(nvml).process_memory([100]) is None


@pytest.mark.parametrize("error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded"])
def test_fake_init_failures_give_no_gpu_mode(error: str) -> None:
    fake = FakeNvml()
    fake.init_error = getattr(FakeNvml, error)
    mon = NvmlMonitor(fake)
    assert not mon.available and mon.reason.startswith("no GPU")
    assert mon.snapshot() == ()


def test_descendant_pids_finds_a_real_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = descendant_pids(os.getpid())
        assert os.getpid() in tree and child.pid in tree
        assert 1 not in tree
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", 7_000_000_000),
        ("Qwen3-30B-A3B", 30_000_000_000),
        ("deepseek-r1-distill-1.5b", 1_500_000_000),
        ("facebook/opt-125m", 125_000_000),
        ("Qwen2.5-Math-1.5B-128k", 1_500_000_000),  # its size, not its context
        ("tiny", 29_970),
        (12345, 12345),
    ],
)
def test_parameter_counts_from_names(name: str | int, params: int) -> None:
    assert parse_param_count(name) == params


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("Qwen/Qwen3-30B-A3B", 3_000_000_000),  # a mixture of experts: its active ones
        ("Qwen3-235B-A22B-Instruct", 22_000_000_000),
        ("Qwen2.5-7B", 7_000_000_000),  # dense: all of them
        ("ABC-7B", 7_000_000_000),  # an "A" that starts a name is no active count
        (12345, 12345),
    ],
)
def test_active_parameters_of_a_mixture_of_experts(name: str | int, params: int) -> None:
    assert active_param_count(name) == params


# a context length in the name ("4k", "128k") was read as the size: Phi-3-mini a 4,000
# parameter model, its trainer planned at 1 GiB and its weight syncs refused (413)
@pytest.mark.parametrize("name", ["gpt2", "Mixtral-8x7B", "", 0,
                                  "microsoft/Phi-3-mini-4k-instruct",
                                  "microsoft/Phi-3-medium-128k-instruct"])
def test_unparseable_sizes_say_how_to_fix(name: str | int) -> None:
    with pytest.raises(ValueError, match=r"parameter count|must be > 0"):
        parse_param_count(name)


def test_trainer_needs_adam_state_and_parks_it_on_the_host() -> None:
    est = estimate_model_memory("Llama-3.1-70B", "trainer", gpus=8)
    per_gpu = 70_000_000_000 // 8
    assert est.weights_bytes == per_gpu * 2 and est.optimizer_bytes == per_gpu * 12
    assert est.device_bytes == per_gpu * 16 + GiB
    assert est.parked_host_bytes() == per_gpu * 14
    # the research facts: a 70B job's trainer state is ~1.1 TB in total
    assert 0.9e12 < est.parked_host_bytes() * 8 < 1.2e12
    with pytest.raises(ValueError, match="level 2"):
        est.parked_host_bytes(level=2)


def test_rollout_weights_plus_kv_budget() -> None:
    est = estimate_model_memory("Qwen2.5-7B", "rollout", kv_cache_bytes=20 * GiB)
    assert est.device_bytes == 14_000_000_000 + 20 * GiB + GiB
    assert est.parked_host_bytes(1) == 14_000_000_000
    assert est.parked_host_bytes(2) == 0
    assert est.parked_device_bytes() == GiB
    small = estimate_model_memory("tiny", "rollout")
    assert small.kv_cache_bytes == GiB  # default budget has a floor


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"role": "critic"}, "role must be"),
        ({"role": "rollout", "gpus": 0}, "gpus must be"),
        ({"role": "rollout", "dtype_bytes": 3}, "dtype_bytes"),
        ({"role": "rollout", "kv_cache_bytes": -1}, "kv_cache_bytes"),
    ],
)
def test_estimate_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate_model_memory("7B", **kwargs)


class ConfinedNvml(FakeNvml):
    """FAKE pynvml of a node of 4 GPUs where Slurm confines the job to GPUs 1 and 3
    (ConstrainDevices): NVML counts all four, and opening another job's GPU is refused
    with NoPermission, as the reviewer's repro has it (not seen on a real node here)."""

    MINE = (1, 3)

    def nvmlDeviceGetCount(self) -> int:
        return 4

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if i not in self.MINE:
            raise self.NVMLError_NoPermission("Insufficient Permissions")
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=50)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        return [SimpleNamespace(pid=100, usedGpuMemory=(h + 1) * GiB)]


def test_another_jobs_gpu_is_skipped_not_taken_for_a_failed_reading() -> None:
    mon = NvmlMonitor(ConfinedNvml())
    assert mon.device_count() == 4 and mon.devices() == (1, 3)
    assert [r.index for r in mon.snapshot()] == [1, 3]
    assert mon.process_memory([100]) == 2 * GiB + 4 * GiB  # its own GPUs only


def test_cuda_numbers_map_to_the_gpus_this_process_may_open() -> None:
    confined = NvmlMonitor(ConfinedNvml())
    # confined: CUDA numbers the job's GPUs 0..n-1 (Slurm's `local` numbering)
    assert confined.visible({"CUDA_VISIBLE_DEVICES": "1"}) == (3,)
    assert confined.visible({"CUDA_VISIBLE_DEVICES": "0,1"}) == (1, 3)
    assert confined.visible({}) == (1, 3)  # unset: all it may open
    assert confined.visible({"CUDA_VISIBLE_DEVICES": "1,7,0"}) == (3,)  # ends at 7, as CUDA
    # by UUID (or a unique prefix), whatever the numbering
    assert confined.visible({"CUDA_VISIBLE_DEVICES": "GPU-3,GPU-1"}) == (3, 1)
    assert confined.visible({"CUDA_VISIBLE_DEVICES": "GPU-0"}) == ()  # not the job's
    # not confined: every GPU opens, and a number is the node-wide index
    assert NvmlMonitor(FakeNvml()).visible({"CUDA_VISIBLE_DEVICES": "1"}) == (1,)


def test_a_services_reading_is_of_its_own_gpus_under_confinement(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmrl.gpu.nvml import reading_json

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the job's second GPU: node GPU 3
    got = reading_json(NvmlMonitor(ConfinedNvml()))
    assert got["nvml"] == "ok"
    assert [(g["index"], g["uuid"]) for g in got["gpus"]] == [(3, "GPU-3")]


def test_service_steps_number_gpus_in_pci_order_as_nvml_does() -> None:
    from slurmrl.controller.services import ServiceSpec, step_env

    env = step_env(ServiceSpec(1, "rollout", "someone", (0,)), "s" * 64, "c" * 64)
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_driver_too_old_for_a_reading_leaves_it_unknown_not_an_error() -> None:
    # pynvml raises NVMLLibraryMismatchError (no NVMLError) where the driver lacks
    # nvmlDeviceGetComputeRunningProcesses_v3: every reading of the service failed
    nvml = FakeNvml()

    class NVMLLibraryMismatchError(Exception):
        pass

    def old_driver(h: int) -> list[Any]:
        raise NVMLLibraryMismatchError("Unversioned function called and the pyNVML version "
                                       "does not match the NVML lib version")

    nvml.NVMLLibraryMismatchError = NVMLLibraryMismatchError  # type: ignore[attr-defined]
    nvml.nvmlDeviceGetComputeRunningProcesses = old_driver  # type: ignore[method-assign]
    from slurmrl.gpu.nvml import reading_json

    mon = NvmlMonitor(nvml)
    assert mon.process_memory([100]) is None
    record = reading_json(mon, [0])
    assert record["nvml"] == "ok" and record["gpus"][0]["processes"] is None
    assert record["gpus"][0]["memory_used_bytes"] == GiB
