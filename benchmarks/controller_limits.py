"""Which of a suite workload's jobs the controller, under its default site config, would
refuse or not run as the simulator runs them.

    python benchmarks/controller_limits.py [-w WORKLOAD ...] [--jobs 200] [--seed 0]

Per workload (steady arrivals, `--jobs` drawn with `--seed`): the jobs asking more GPUs
than `[limits] max_gpus_per_job` (8; a pool is one allocation on one node, so a job of
16 GPUs has no pool there), and the jobs the controller's own admission check
(`residency.admit`, the footprints it plans with, on 80 GiB GPUs) refuses even alone,
with the host budget for parked state of a small node (64 GiB) and of a large one
(1 TiB). The simulator admits all of them: its pools are interchangeable GPUs, and its
join guard checks host memory only where the workload gives a budget. Prints a table;
writes nothing (docs/benchmarks.md, "What the simulated figures assume", quotes it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.policies import WORKLOADS  # noqa: E402
from slurmrl.config import Config  # noqa: E402
from slurmrl.controller.residency import GpuCapacity, admit, footprints_for_job  # noqa: E402
from slurmrl.model import RlRequest  # noqa: E402
from slurmrl.sim.workload import SimJob, generate, load  # noqa: E402

GPU_BYTES = 80 << 30
HOSTS = (("64 GiB", 64 << 30), ("1 TiB", 1 << 40))


def refused(job: SimJob, host_bytes: int) -> str | None:
    """Why the controller's admission check refuses the job alone, if it does."""
    req = RlRequest(job.gpus, job.model, layout=job.layout,
                    rollout_gpus=job.rollout_gpus if job.rollout_gpus != job.gpus else None)
    mine = footprints_for_job(job.job_id, req, tuple(range(job.gpus)))
    return admit(mine, [], [GpuCapacity(i, GPU_BYTES) for i in range(job.gpus)], host_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-w", "--workload", action="append", default=None, choices=WORKLOADS)
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if not 1 <= args.jobs <= 100_000:
        ap.error(f"--jobs must be in 1..100000, got {args.jobs}")
    limit = Config().limits.max_gpus_per_job
    print(f"| workload | jobs | more than {limit} GPUs | refused alone, 64 GiB host | "
          "refused alone, 1 TiB host |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name in args.workload or WORKLOADS:
        jobs = generate(load(name), args.seed, "steady", args.jobs)
        big = sum(j.gpus > limit for j in jobs)
        counts = [sum(refused(j, host) is not None for j in jobs) for _, host in HOSTS]
        print(f"| {name} | {len(jobs)} | {big} | {counts[0]} | {counts[1]} |")


if __name__ == "__main__":
    main()
