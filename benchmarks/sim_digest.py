"""The first N jobs of the 1,000-job speed run (benchmarks/policies.py `speed`): wall time,
events, and a digest of every job's finish time and GPU-seconds.

For speed work on the simulator or the lease table: a change that only makes it faster
must leave the events and the digest as they were.

    PYTHONPATH=. python benchmarks/sim_digest.py [N]   (default 400)
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.policies import config_for, generate, load, run_jobs


def main(n: int) -> None:
    w = load("polytrace-mix")
    jobs = generate(w, 0, "steady", 1000, load_scale=(1000 / (30 * 24)) / 0.8)[:n]
    cfg = replace(config_for(w, check_invariants=False), gpus=640)
    t = time.perf_counter()
    r = run_jobs(jobs, cfg, "complementary")
    wall = time.perf_counter() - t
    runs = sorted((j, round(x.finished_at or -1.0, 6), round(x.lease_gpu_s, 3))
                  for j, x in r.sim.runs.items())
    digest = hashlib.sha1(json.dumps(runs).encode()).hexdigest()[:12]
    print(f"jobs {n}  wall {wall:.2f} s  events {r.sim.events}  digest {digest}")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 400)
