"""Park/activate costs and memory footprints of simulated jobs, by model size.

Per GPU, a job's resident state is its rollout weights (2 bytes/param), its trainer
state (weights, grads and Adam: 16 bytes/param) sharded over its GPUs, a KV budget as
large as the weights (at least 1 GiB) and 2 GiB of CUDA context/graphs/NCCL. Handing a
GPU set from one job to another parks the first (weights + optimizer, 16 bytes/param
less the 2 of gradients, plus 2 of rollout weights: 16 bytes/param over its GPUs) and
activates the second, copies in both directions over PCIe at 25 GB/s pinned
(rl-workloads.md: 25-52 GB/s per GPU), plus 1 s of fixed cost (vLLM level-1 wake is
2.9-5.7 s for 30B-235B; the fixed part covers allocator and graph re-capture). When
every member fits the GPU memory at once nothing is copied: 0.1 s of context switch.
Measured on an H200 (docs/benchmarks.md, "On a GPU"): the `torch` backend parks and
activates a trainer at 50-52 GB/s with no fixed cost to speak of, so for a trainer on
such a card these constants overcharge (1.1-2.0 s for switches that took 0.12-0.95 s);
they are kept, as a PCIe 4 node's price and vLLM's wake.

Known limits: no level-2 (drop) parking, no NCCL communicator re-init cost.
"""

from __future__ import annotations

from slurmrl.sim.workload import SimJob

GIB = 2**30
PCIE_BPS = 25e9
FIXED_SWITCH_S = 1.0
RESIDENT_SWITCH_S = 0.1


#: the least GPU memory per GPU any job takes (`device_bytes` of a model of no size: its
#: KV floor and CUDA context)
MIN_DEVICE_BYTES = 3 * GIB


def device_bytes(job: SimJob) -> float:
    """GPU memory per GPU with all the job's services active."""
    weights = job.params * 2 / job.gpus
    return job.params * 16 / job.gpus + max(weights, GIB) + 2 * GIB


def moved_bytes(job: SimJob) -> float:
    """Bytes per GPU copied to park (or activate) the job's services."""
    return job.params * 16 / job.gpus


def host_bytes(job: SimJob) -> int:
    """Host memory the job's parked state takes (all its GPUs)."""
    return int(job.params * 16)


def fits_together(jobs: list[SimJob], gpu_mem_bytes: int) -> bool:
    return sum(device_bytes(j) for j in jobs) <= gpu_mem_bytes


def switch_s(incoming: SimJob, outgoing: SimJob, resident: bool) -> float:
    """Seconds to hand a GPU set from `outgoing` to `incoming`."""
    if resident:
        return RESIDENT_SWITCH_S
    return FIXED_SWITCH_S + max(moved_bytes(incoming), moved_bytes(outgoing)) / PCIE_BPS


def min_switch_s(job: SimJob, gpu_mem_bytes: int) -> float:
    """The cheapest handoff the job can have: a context switch where the smallest
    partner fits beside it (the pool is then resident, as the engine charges it), else
    parking and activating its own state."""
    if device_bytes(job) + MIN_DEVICE_BYTES <= gpu_mem_bytes:
        return RESIDENT_SWITCH_S
    return switch_s(job, job, resident=False)
