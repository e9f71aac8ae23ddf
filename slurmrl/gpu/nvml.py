"""NVML monitoring through nvidia-ml-py (`import pynvml`), with a clean "no GPU" mode.

`NvmlMonitor()` initialises NVML once. Where the library or the driver is missing
(`NVMLError_LibraryNotFound`, `NVMLError_DriverNotLoaded`, or pynvml not importable) it
sets `available=False` with a `reason` and every reading is empty/None — callers plan
from declared sizes instead. A reading a device does not support (`NotSupported`,
`NoPermission`: e.g. utilisation on MIG instances) is None, not an error.

Devices this process may not open are left out. Where Slurm confines a job to its GPUs
(`task/cgroup`, `ConstrainDevices=yes`) NVML still counts every GPU of the node, but
`nvmlDeviceGetHandleByIndex` of one outside the job raises `NVMLError_NoPermission`:
such a GPU is skipped (`devices()`), never taken for a failed reading.

Which GPUs a service uses: `visible()` maps `CUDA_VISIBLE_DEVICES` to NVML indices. An
entry that is a whole GPU's UUID (`GPU-...`, or a unique prefix, as CUDA takes it) is
matched by UUID; a MIG instance's (`MIG-...`) is not (MIG devices are not read: the list
ends there, as at any entry that names no GPU). A number N is CUDA's N-th device among
those this process may open, taken in NVML's order: with confinement the job's devices
(CUDA numbers them 0..n-1, as slurmrl's `local` numbering does), without it the node's
(N is Slurm's node-wide index).
That holds where CUDA orders devices by PCI bus id as NVML does: service steps get
`CUDA_DEVICE_ORDER=PCI_BUS_ID` (`controller/services.step_env`); under CUDA's default
(fastest first) the order of unlike GPUs on one node may differ. slurmrl pins services
by number, not UUID (the controller does not know the UUIDs of a pool's GPUs).

Known limits: per-process memory is matched by PID, which breaks across PID namespaces
(containers); only compute processes are listed (graphics contexts are not).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessMemory:
    """GPU memory one process holds on one GPU (None: the driver would not say)."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant; None marks a value this GPU does not report."""

    index: int
    uuid: str | None
    name: str | None
    utilization_pct: int | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    processes: tuple[ProcessMemory, ...] | None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlMonitor:
    """Reads GPUs through NVML; `nvml` is the pynvml module (a fake only in unit tests)."""

    def __init__(self, nvml: Any | None = None) -> None:
        self.available = False
        self.reason = ""
        self._devices: tuple[int, ...] | None = None
        self._nvml: Any = nvml
        if nvml is None:
            try:
                import pynvml
            except ImportError as exc:
                self.reason = f"nvidia-ml-py is not installed: {exc}"
                return
            self._nvml = nvml = pynvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError_LibraryNotFound:
            self.reason = "no GPU: the NVIDIA management library (libnvidia-ml) is not found"
            return
        except nvml.NVMLError_DriverNotLoaded:
            self.reason = "no GPU: the NVIDIA driver is not loaded"
            return
        except nvml.NVMLError as exc:
            self.reason = f"no GPU: NVML failed to start: {exc}"
            return
        self.available = True

    def close(self) -> None:
        if self.available:
            self._nvml.nvmlShutdown()
            self.available = False
            self.reason = "closed"

    def __enter__(self) -> NvmlMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _maybe(self, fn: Callable[..., T], *args: Any) -> T | None:
        """`fn(*args)`, or None where the device does not report it: not supported, not
        permitted, or the driver too old for the library's function (pynvml raises
        `NVMLError_FunctionNotFound`, or `NVMLLibraryMismatchError`, which is no
        `NVMLError`, for e.g. `nvmlDeviceGetComputeRunningProcesses_v3` on a driver
        without it)."""
        n = self._nvml
        unreported: tuple[type[BaseException], ...] = tuple(e for e in (
            getattr(n, "NVMLError_NotSupported", None),
            getattr(n, "NVMLError_NoPermission", None),
            getattr(n, "NVMLError_FunctionNotFound", None),
            getattr(n, "NVMLLibraryMismatchError", None)) if isinstance(e, type))
        try:
            return fn(*args)
        except unreported:
            return None

    def device_count(self) -> int:
        """GPUs on the node, as NVML counts them (also those this process may not open)."""
        return int(self._nvml.nvmlDeviceGetCount()) if self.available else 0

    def devices(self) -> tuple[int, ...]:
        """NVML indices of the GPUs this process may open, in NVML's order: the node's
        less those outside its job (handle refused with NoPermission). Read once."""
        if not self.available:
            return ()
        if self._devices is None:
            found = []
            for i in range(self.device_count()):
                try:
                    self._nvml.nvmlDeviceGetHandleByIndex(i)
                except self._nvml.NVMLError_NoPermission:
                    continue  # another job's GPU (Slurm's ConstrainDevices)
                found.append(i)
            self._devices = tuple(found)
        return self._devices

    def visible(self, env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
        """NVML indices of the GPUs `CUDA_VISIBLE_DEVICES` gives this process (all it may
        open where unset), by UUID or by number among `devices()` (the module's
        docstring); as CUDA does, the list ends at the first entry that names none."""
        mine = self.devices()
        raw = env.get("CUDA_VISIBLE_DEVICES")
        if raw is None:
            return mine
        uuids: dict[int, str] | None = None
        out: list[int] = []
        for entry in (e.strip() for e in raw.split(",")):
            if entry.isdigit():
                n = int(entry)
                if n >= len(mine):
                    break
                out.append(mine[n])
                continue
            if uuids is None:
                uuids = {i: _text(u) for i in mine
                         if (u := self._maybe(self._nvml.nvmlDeviceGetUUID,
                                              self._nvml.nvmlDeviceGetHandleByIndex(i)))}
            hits = [i for i, u in uuids.items() if entry and u.startswith(entry)]
            if len(hits) != 1:
                break
            out.append(hits[0])
        return tuple(dict.fromkeys(out))

    def read(self, index: int) -> GpuReading:
        """One GPU's utilisation, memory and compute processes."""
        if not self.available:
            raise RuntimeError(f"cannot read GPU {index}: {self.reason}")
        n = self._nvml
        h = n.nvmlDeviceGetHandleByIndex(index)
        util = self._maybe(n.nvmlDeviceGetUtilizationRates, h)
        mem = self._maybe(n.nvmlDeviceGetMemoryInfo, h)
        procs = self._maybe(n.nvmlDeviceGetComputeRunningProcesses, h)
        uuid = self._maybe(n.nvmlDeviceGetUUID, h)
        name = self._maybe(n.nvmlDeviceGetName, h)
        return GpuReading(
            index=index,
            uuid=None if uuid is None else _text(uuid),
            name=None if name is None else _text(name),
            utilization_pct=None if util is None else int(util.gpu),
            memory_used_bytes=None if mem is None else int(mem.used),
            memory_total_bytes=None if mem is None else int(mem.total),
            processes=None if procs is None else tuple(_process(p) for p in procs),
        )

    def snapshot(self) -> tuple[GpuReading, ...]:
        """Every GPU this process may open (`devices()`); empty without a GPU."""
        return tuple(self.read(i) for i in self.devices())

    def process_memory(self, pids: Iterable[int]) -> int | None:
        """GPU memory all of `pids` hold, summed over every GPU; None if unknown.

        None also when NVML is unavailable or any matching reading is unreported, so a
        caller never mistakes "could not tell" for "freed".
        """
        if not self.available:
            return None
        wanted = set(pids)
        total = 0
        try:
            readings = self.snapshot()
        except self._nvml.NVMLError as exc:  # a GPU lost, or one this process may not read
            log.warning("NVML could not read the GPUs' processes: %s", exc)
            return None
        for reading in readings:
            if reading.processes is None:
                return None
            for proc in reading.processes:
                if proc.pid in wanted:
                    if proc.used_bytes is None:
                        return None
                    total += proc.used_bytes
        return total


def reading_json(monitor: NvmlMonitor, indices: Iterable[int] | None = None
                 ) -> dict[str, Any]:
    """A JSON reading of GPUs `indices` for the record, or an explicit no-GPU marker.

    `{"nvml": "ok", "gpus": [...]}` with per-GPU utilisation, memory and per-process
    memory (None where the device does not report it), or `{"nvml": "unavailable",
    "reason": ...}` — never made-up numbers. A failing read is recorded as
    `{"nvml": "error", "reason": ...}`: a reading is evidence, not a reason to fail a lease.
    `indices` are NVML's (default: this process's own GPUs, `NvmlMonitor.visible()`),
    and so is each GPU's `index` in the record.
    """
    if not monitor.available:
        return {"nvml": "unavailable", "reason": monitor.reason}
    try:
        wanted = monitor.visible() if indices is None else indices
        readings = [monitor.read(i) for i in sorted(set(wanted))]
    except monitor._nvml.NVMLError as exc:
        return {"nvml": "error", "reason": str(exc)}
    return {"nvml": "ok", "gpus": [
        {"index": r.index, "uuid": r.uuid, "name": r.name,
         "utilization_pct": r.utilization_pct, "memory_used_bytes": r.memory_used_bytes,
         "memory_total_bytes": r.memory_total_bytes,
         "processes": None if r.processes is None else
         [{"pid": p.pid, "used_bytes": p.used_bytes} for p in r.processes]}
        for r in readings]}


def visible_indices(env: Mapping[str, str] = os.environ) -> tuple[int, ...]:
    """The numbers in CUDA_VISIBLE_DEVICES as written (CUDA's numbering: node-wide or,
    under device confinement, the job's 0..n-1); not NVML's indices under confinement,
    which `NvmlMonitor.visible` maps them to."""
    raw = env.get("CUDA_VISIBLE_DEVICES", "")
    return tuple(int(x) for x in raw.split(",") if x.strip().isdigit())


def _process(raw: Any) -> ProcessMemory:
    used = getattr(raw, "usedGpuMemory", None)
    # pynvml reports "not available" as None (or, in some versions, as a huge sentinel)
    if used is not None and (used < 0 or used >= 2**63):
        used = None
    return ProcessMemory(pid=int(raw.pid), used_bytes=None if used is None else int(used))


def descendant_pids(pid: int, proc_root: Path = Path("/proc")) -> set[int]:
    """`pid` and all its descendants (vLLM runs its engine in child processes)."""
    children: dict[int, list[int]] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # the process ended while we looked
        # field 4 is the parent pid; the command name (field 2) may contain spaces
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out, todo = {pid}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def this_process_tree() -> set[int]:
    return descendant_pids(os.getpid())
