"""What a pool's GPUs on one node cost: every suite workload with and without the
simulator's node model, side by side in one run.

    python benchmarks/nodes.py [-w WORKLOAD ...] [--seeds 2] [--jobs 60] [--procs 2]

The controller's pools are one Slurm allocation on one node each, so a job waits while
no node has room for it even where the cluster has as many GPUs free over its nodes;
the suite's figures count one bag of GPUs. Runs each workload at its own limits with the
default policy and `dedicated` (the baseline's own waits grow too), over seeds
0..`--seeds`-1 x (steady, bursty), once as one bag (`SimConfig.nodes` off) and once on
nodes of the workload's `gpus_per_node` (`simulate --nodes`), and prints a markdown table
of means: savings, p95 slowdown, mean and p95 queueing delay, jobs refused (larger than a
node), makespan. It writes nothing: docs/benchmarks.md quotes it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.policies import WORKLOADS, check_grid_args  # noqa: E402
from slurmrl.sim.runner import config_for, run_jobs  # noqa: E402
from slurmrl.sim.workload import generate, load  # noqa: E402

POLICIES = ["complementary", "dedicated"]


def one(args: tuple[str, str, bool, str, int, int]) -> dict[str, Any]:
    wname, policy, nodes, arrivals, seed, n_jobs = args
    w = load(wname)
    cfg = replace(config_for(w, check_invariants=False), nodes=nodes)
    m = run_jobs(generate(w, seed, arrivals, n_jobs), cfg, policy).metrics
    return {"workload": wname, "policy": policy, "nodes": nodes, "savings": m.savings,
            "p95": m.slowdown_p95, "queue": m.queue_mean_h, "queue95": m.queue_p95_h,
            "rejected": m.rejected, "makespan": m.makespan_h, "node": cfg.gpus_per_node,
            "gpus": cfg.gpus}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-w", "--workload", action="append", choices=WORKLOADS)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--procs", type=int, default=min(os.cpu_count() or 1, 256))
    a = ap.parse_args()
    check_grid_args(ap, a)
    tasks = [(w, p, nodes, arr, seed, a.jobs) for w in (a.workload or WORKLOADS)
             for p in POLICIES for nodes in (False, True)
             for arr in ("steady", "bursty") for seed in range(a.seeds)]
    with ProcessPoolExecutor(a.procs) as ex:
        rows = list(ex.map(one, tasks))
    print("| workload (GPUs, per node) | policy | pools | saved | p95 slowdown | queue h, "
          "mean | queue h, p95 | refused | makespan h |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for w in a.workload or WORKLOADS:
        for p in POLICIES:
            for nodes in (False, True):
                got = [r for r in rows if (r["workload"], r["policy"], r["nodes"])
                       == (w, p, nodes)]
                mean = {k: statistics.mean(r[k] for r in got)
                        for k in ("savings", "p95", "queue", "queue95", "rejected",
                                  "makespan")}
                print(f"| {w} ({got[0]['gpus']}, {got[0]['node']}) | {p} | "
                      f"{'on nodes' if nodes else 'one bag'} | "
                      f"{100 * mean['savings']:.1f}% | {mean['p95']:.3f} | "
                      f"{mean['queue']:.2f} | {mean['queue95']:.2f} | "
                      f"{mean['rejected']:.1f} | {mean['makespan']:.1f} |")


if __name__ == "__main__":
    main()
