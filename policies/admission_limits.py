"""`site-limits` admission: enforce the site's limits at registration, with a reason.

Rejects a job asking for more GPUs than `max_gpus_per_job`, a `--rl-max-slowdown`
below 1, or a per-GPU memory need above `gpu_mem_bytes` (when the site states it);
runs `--rl-mux=off` jobs dedicated; accepts everything else. With `partitions`, only
jobs submitted to one of them (`JobSnapshot.submit_partition`: the partition of the
job's own allocation, where its driver runs; in the simulator, which has none, the
job's pool partition) are RL jobs; any other is refused with the valid list. A `--rl-max-slowdown`
above the site's cap is accepted and capped (the reason says so).
"""

from __future__ import annotations

from policies.base import Admission, JobSnapshot, SiteLimits, Verdict
from slurmrl.model import Mux


class SiteLimitsAdmission:
    name = "site-limits"

    def __init__(self, gpu_mem_bytes: int | None = None,
                 partitions: tuple[str, ...] | list[str] | None = None) -> None:
        if gpu_mem_bytes is not None and gpu_mem_bytes < 1:
            raise ValueError(f"gpu_mem_bytes must be >= 1, got {gpu_mem_bytes}")
        if partitions is not None and (
                isinstance(partitions, str) or not partitions
                or not all(isinstance(p, str) and p.strip() for p in partitions)):
            raise ValueError(f"partitions must list at least one partition name (leave it "
                             f"out to allow any), got {partitions!r}")
        self.gpu_mem_bytes = gpu_mem_bytes
        self.partitions = tuple(partitions) if partitions is not None else None

    def admit(self, job: JobSnapshot, limits: SiteLimits) -> Admission:
        r = job.request
        if r.gpus < 1:
            return Admission(Verdict.REJECT, f"--rl-gpus={r.gpus}: must be at least 1")
        if r.gpus > limits.max_gpus_per_job:
            return Admission(Verdict.REJECT, f"--rl-gpus={r.gpus} exceeds the site limit of "
                             f"{limits.max_gpus_per_job} GPUs per RL job")
        if r.max_slowdown is not None and r.max_slowdown < 1.0:
            return Admission(Verdict.REJECT,
                             f"--rl-max-slowdown={r.max_slowdown}: must be at least 1.0")
        part = job.submit_partition if job.submit_partition is not None else job.partition
        if self.partitions is not None and part not in self.partitions:
            return Admission(Verdict.REJECT, f"RL jobs are accepted from partitions "
                             f"{', '.join(self.partitions)} only; this job is in {part!r}")
        if self.gpu_mem_bytes is not None and r.mem_bytes is not None \
                and r.mem_bytes > self.gpu_mem_bytes:
            return Admission(Verdict.REJECT, f"--rl-mem={r.mem_bytes / 2**30:.2f}GiB per GPU "
                             f"exceeds the GPUs' {self.gpu_mem_bytes / 2**30:.2f} GiB")
        if r.mux is Mux.OFF:
            return Admission(Verdict.DEDICATED, "--rl-mux=off: runs on its own pool")
        if r.max_slowdown is not None and r.max_slowdown > limits.max_slowdown:
            return Admission(Verdict.ACCEPT, f"--rl-max-slowdown={r.max_slowdown} capped at "
                             f"the site's {limits.max_slowdown}")
        return Admission(Verdict.ACCEPT)
