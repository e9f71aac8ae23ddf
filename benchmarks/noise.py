"""How much of a frontier verdict is noise: the same simulations over more seeds.

    python benchmarks/noise.py [-w WORKLOAD ...] [--seeds 3] [--jobs 60] [--procs 2]

Runs what `benchmarks/frontier.py` runs for the chosen workloads (`complementary` and
its `max_load = 1.0` variant at every users' limit L, and each baseline) over seeds
0..`--seeds`-1 x (steady, bursty), and prints each point's mean savings and p95 with
their standard errors over those runs, then the verdicts as frontier.py reads them. It
writes nothing: docs/benchmarks.md quotes it beside the 2-seed section.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.frontier import BASELINES, LIMITS, one, summarise, verdicts  # noqa: E402
from benchmarks.policies import LABEL, LOAD_CAPPED, WORKLOADS, check_grid_args  # noqa: E402

CURVES = ["complementary", LOAD_CAPPED]


def stderr(xs: list[float]) -> float:
    return statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-w", "--workload", action="append", choices=WORKLOADS)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--procs", type=int, default=min(os.cpu_count() or 1, 256))
    a = ap.parse_args()
    check_grid_args(ap, a)
    chosen = a.workload or WORKLOADS
    points = [*((w, p, L) for w in chosen for p in CURVES for L in LIMITS),
              *((w, b, None) for w in chosen for b in BASELINES)]
    tasks = [(w, p, L, arr, seed, a.jobs) for w, p, L in points
             for arr in ("steady", "bursty") for seed in range(a.seeds)]
    with ProcessPoolExecutor(a.procs) as ex:
        rows = list(ex.map(one, tasks, chunksize=2))
    print(f"{a.seeds} seeds x (steady, bursty), {a.jobs} jobs; mean (standard error)")
    print("| workload | policy | users' limit | savings % | p95 slowdown |")
    print("| --- | --- | ---: | ---: | ---: |")
    for w, p, L in points:
        rs = [r for r in rows if (r["workload"], r["policy"], r["limit"]) == (w, p, L)]
        sav, p95 = [100 * r["savings"] for r in rs], [r["p95"] for r in rs]
        print(f"| {w} | {LABEL.get(p, p)} | {'suite' if L is None else L} | "
              f"{statistics.fmean(sav):.1f} ({stderr(sav):.1f}) | "
              f"{statistics.fmean(p95):.3f} ({stderr(p95):.3f}) |")
    s = summarise(rows)
    for curve in CURVES:
        print(f"\nverdicts, {LABEL.get(curve, curve)}:")
        print("\n".join(verdicts(s, curve, chosen, rows)))


if __name__ == "__main__":
    main()
