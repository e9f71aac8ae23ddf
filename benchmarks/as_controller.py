"""The policies table's savings, side by side with the same runs under three of the
controller's defaults the simulator does not hold by itself.

    python benchmarks/as_controller.py [-w WORKLOAD ...] [--jobs 60] [--seeds 2]
                                       [--node-mem 2T] [--procs 2]

Per suite workload, seed and arrival pattern (steady, bursty), `--jobs` jobs are drawn
as `benchmarks/policies.py` draws them, and every policy the controller can run
(`complementary`, `random`, `greedy`; `dedicated` is the reference) runs twice:

- **as simulated**: the simulator's defaults, the policies table's cells;
- **as the controller**: only the jobs the controller admits (at most
  `[limits] max_gpus_per_job` = 8 GPUs, and its own admission check,
  `residency.admit`, passing the job alone on 80 GiB GPUs), every hand-off priced as a
  park and an activate (`simulate --park-always`, as `SlurmPools(park_others=True)`),
  and a host budget for parked state of half of `--node-mem` per pool (the controller's
  default `parked_host_mem_per_node = 0`: half of the node's RealMemory; 2 TiB is a
  DGX H100's). A pool is charged the whole budget of its node, an upper bound: pools
  sharing a node share one budget in the controller.

The jobs the controller refuses would run at a site as ordinary Slurm jobs, outside
slurmrl; they are left out of both the savings and the dedicated GPU-hours of the
second run. Users' slowdown limits stay the workload's (1.15 by default; the
controller's default `default_max_slowdown` is 1.3). Prints a Markdown table; writes
nothing (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.controller_limits import refused  # noqa: E402
from benchmarks.policies import WORKLOADS, check_grid_args  # noqa: E402
from slurmrl.config import Config  # noqa: E402
from slurmrl.config.units import parse_size  # noqa: E402
from slurmrl.sim.runner import config_for, run_jobs  # noqa: E402
from slurmrl.sim.workload import SimJob, generate, load  # noqa: E402

POLICIES = ["complementary", "random", "greedy"]
ARRIVALS = ["steady", "bursty"]


def admitted(jobs: list[SimJob], host_bytes: int) -> list[SimJob]:
    """The jobs the controller would run under its defaults."""
    limit = Config().limits.max_gpus_per_job
    return [j for j in jobs if j.gpus <= limit and refused(j, host_bytes) is None]


def one(args: tuple[str, str, str, int, int, int]) -> dict[str, Any]:
    wname, policy, arrivals, seed, n_jobs, host_bytes = args
    w = load(wname)
    jobs = generate(w, seed, arrivals, n_jobs)
    cfg = config_for(w, check_invariants=False)
    out: dict[str, Any] = {"workload": wname, "policy": policy}
    sim = run_jobs(jobs, cfg, policy).metrics
    out["sim"] = (100 * sim.savings, sim.slowdown_p95)
    mine = admitted(jobs, host_bytes)
    out["admitted"] = len(mine)
    if mine:
        ccfg = replace(cfg, park_always=True, host_mem_per_pool_bytes=host_bytes,
                       limits=replace(cfg.limits, parked_host_mem_bytes=host_bytes))
        ctl = run_jobs(mine, ccfg, policy).metrics
        out["ctl"] = (100 * ctl.savings, ctl.slowdown_p95)
    return out


def _mean(cells: list[tuple[float, float]]) -> str:
    if not cells:
        return "-"
    return (f"{statistics.fmean(c[0] for c in cells):.1f} "
            f"({statistics.fmean(c[1] for c in cells):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-w", "--workload", action="append", default=None, choices=WORKLOADS)
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--node-mem", default="2T", help="host memory of a node (default 2T)")
    ap.add_argument("--procs", type=int, default=2)
    args = ap.parse_args()
    check_grid_args(ap, args)
    host = parse_size(args.node_mem) // 2
    names = args.workload or WORKLOADS
    cells = [(w, p, a, s, args.jobs, host) for w in names for p in POLICIES
             for a in ARRIVALS for s in range(args.seeds)]
    t = time.perf_counter()
    with ProcessPoolExecutor(args.procs) as ex:
        rows = list(ex.map(one, cells))
    print(f"{len(cells)} cells x 2 runs in {time.perf_counter() - t:.0f} s; node memory "
          f"{args.node_mem}, parked-state budget {host / 2**30:.0f} GiB per pool; "
          f"{args.jobs} jobs, seeds 0-{args.seeds - 1}, steady and bursty; "
          "savings % (p95 slowdown), means over the cells\n")
    print("| workload | jobs admitted (mean) | policy | as simulated | as the controller |")
    print("| --- | ---: | --- | --- | --- |")
    for w in names:
        for p in POLICIES:
            mine = [r for r in rows if r["workload"] == w and r["policy"] == p]
            jobs = statistics.fmean(r["admitted"] for r in mine)
            print(f"| {w} | {jobs:.1f} of {args.jobs} | {p} | "
                  f"{_mean([r['sim'] for r in mine])} | "
                  f"{_mean([r['ctl'] for r in mine if 'ctl' in r])} |")


if __name__ == "__main__":
    main()
