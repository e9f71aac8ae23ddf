"""GPU facts for residency planning: NVML readings and model memory estimates.

`NvmlMonitor` degrades to a clean "no GPU" mode (`available=False`) where there is no
NVIDIA driver; `estimate_model_memory` needs no GPU at all.
"""

from slurmrl.gpu.estimate import MemoryEstimate, estimate_model_memory, parse_param_count
from slurmrl.gpu.nvml import GpuReading, NvmlMonitor, ProcessMemory, descendant_pids

__all__ = [
    "GpuReading",
    "MemoryEstimate",
    "NvmlMonitor",
    "ProcessMemory",
    "descendant_pids",
    "estimate_model_memory",
    "parse_param_count",
]
