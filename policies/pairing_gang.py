"""`gang`: Slurm `PreemptMode=SUSPEND,GANG`-style time slicing, memory held.

Pairs jobs in arrival order like `fifo-lock` (`pair_in_arrival_order`: fixed pairs, with
waiting jobs of the same round paired with each other too), but the pool is sliced in
fixed time quanta (`quantum_s`, Slurm's SchedulerTimeSlice defaults to 30 s) whatever
the phases: a member is suspended (SIGSTOP: GPU and CPU work alike) outside its quantum,
and both members' memory stays on the GPUs, so they must fit it together.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import ClusterSnapshot, JobSnapshot, Placement, PoolMode, PoolSnapshot
from policies.pairing_fifo_lock import pair_in_arrival_order


def device_bytes(job: JobSnapshot) -> int:
    """GPU memory per GPU of the job's resident services (given, or estimated)."""
    if job.request.mem_bytes is not None:
        return job.request.mem_bytes
    from slurmrl.gpu.estimate import estimate_model_memory

    try:
        g = job.request.gpus
        return (estimate_model_memory(job.request.model, "rollout", gpus=g).device_bytes
                + estimate_model_memory(job.request.model, "trainer", gpus=g).device_bytes)
    except ValueError:
        return 0


class GangPairing:
    name = "gang"
    mode = PoolMode.GANG
    slice_policy = "round-robin"
    fixed_group = 2

    def __init__(self, quantum_s: float = 30.0, gpu_mem_bytes: int = 80 * 2**30) -> None:
        if not quantum_s >= 1.0:  # Slurm's gang time slice is whole seconds
            raise ValueError(f"quantum_s must be at least 1 s (Slurm's time slice is "
                             f"whole seconds), got {quantum_s}")
        if gpu_mem_bytes < 1:
            raise ValueError(f"gpu_mem_bytes must be >= 1, got {gpu_mem_bytes}")
        self.quantum_s, self.gpu_mem_bytes = quantum_s, gpu_mem_bytes

    def _gpu_mem(self, snapshot: ClusterSnapshot, job: JobSnapshot,
                 pool: PoolSnapshot | None) -> int:
        """A GPU's memory where the pair would run: its pool's, else the partition's (a
        pair opened this round), else `gpu_mem_bytes`."""
        return ((pool.gpu_mem_bytes if pool is not None else None)
                or snapshot.gpu_mem_bytes.get(job.partition) or self.gpu_mem_bytes)

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        def fits(job: JobSnapshot, mate: JobSnapshot, pool: PoolSnapshot | None) -> bool:
            # both resident at once: their GPU memory within a GPU's
            return device_bytes(job) + device_bytes(mate) <= self._gpu_mem(snapshot, job, pool)

        return pair_in_arrival_order(snapshot, fits, reason="gang pair")
