"""NVML readings recorded with each lease: the JSON a service returns, and the DB table.

The with-GPU formatting path uses a fake NVML module (this machine has no GPU); the
no-GPU path uses the real nvidia-ml-py installed here.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from slurmrl.db import Store
from slurmrl.db.migrations import LATEST
from slurmrl.db.readings import add_lease_reading, lease_readings
from slurmrl.gpu.nvml import NvmlMonitor, reading_json, visible_indices


class _FakeNvml:
    """A stand-in for pynvml with two GPUs (unit test only: there is no GPU here)."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NoPermission(NVMLError):
        pass

    NVMLError_LibraryNotFound = NVMLError_DriverNotLoaded = NVMLError_NotSupported

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUtilizationRates(self, h: int) -> Any:
        return SimpleNamespace(gpu=40 + h)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return SimpleNamespace(used=(h + 1) << 30, total=80 << 30)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[Any]:
        if h == 1:
            raise self.NVMLError_NotSupported()
        return [SimpleNamespace(pid=4242, usedGpuMemory=1 << 30)]

    def nvmlDeviceGetUUID(self, h: int) -> bytes:
        return f"GPU-{h}".encode()

    def nvmlDeviceGetName(self, h: int) -> str:
        return "H100"


def test_a_reading_of_the_lease_gpus_with_processes_and_unreported_values() -> None:
    got = reading_json(NvmlMonitor(_FakeNvml()), [1, 0, 1])
    assert got["nvml"] == "ok"
    g0, g1 = got["gpus"]
    assert (g0["index"], g0["utilization_pct"], g0["memory_used_bytes"]) == (0, 40, 1 << 30)
    assert g0["processes"] == [{"pid": 4242, "used_bytes": 1 << 30}]
    assert g1["processes"] is None  # not reported is None, never an empty list


def test_without_a_gpu_the_reading_is_an_explicit_marker_not_numbers() -> None:
    got = reading_json(NvmlMonitor(), [0])  # the real nvidia-ml-py, no driver here
    assert got["nvml"] == "unavailable" and "no GPU" in got["reason"]
    assert "gpus" not in got


def test_visible_indices_follow_cuda_visible_devices() -> None:
    assert visible_indices({"CUDA_VISIBLE_DEVICES": "2,3"}) == (2, 3)
    assert visible_indices({}) == ()


def test_readings_are_stored_with_their_lease(tmp_path: Path) -> None:
    store = Store(str(tmp_path / "c.db"))
    try:
        assert store.version == LATEST
        store.conn.execute("PRAGMA foreign_keys = OFF")  # no job/lease rows needed here
        add_lease_reading(store, lease_id=7, job_id=3, role="rollout", at=1.0,
                          reading={"nvml": "unavailable", "reason": "no GPU"})
        add_lease_reading(store, lease_id=8, job_id=3, role="trainer", at=2.0,
                          reading={"nvml": "ok", "gpus": []})
        (r,) = lease_readings(store, 7)
        assert (r.job_id, r.role, r.reading["nvml"]) == (3, "rollout", "unavailable")
        assert [x.lease_id for x in lease_readings(store)] == [7, 8]
    finally:
        store.close()
