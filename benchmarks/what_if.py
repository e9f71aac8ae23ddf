"""What-ifs for the default policy, side by side with the default as the suite runs it.

    python benchmarks/what_if.py --oracle-priors [-w WORKLOAD ...] [-L 1.15 ...]
    python benchmarks/what_if.py --slice bounded-slowdown [--max-group 2] [-w ...] [-L ...]
    python benchmarks/what_if.py --site-prior shares|profile [--what-if-param margin=1.05]

Each row: `complementary` on 60 jobs (`--jobs`) of a suite workload, every job's limit
set to L (`slurmrl simulate --max-slowdown L`), means over seeds 0..`--seeds`-1 x
(steady, bursty); "max" is the largest over those runs. The what-if row changes one
thing:

- `--oracle-priors`: every job's `--rl-profile` is its whole run's phase shares and mean
  step (`slurmrl.sim.replay.recorded_profile`): what exactly right priors would buy;
- `--slice NAME`: the pools' slice policy (`bounded-slowdown`: each job's own limit);
- `--site-prior shares|profile`: a job without `--rl-profile` takes the mean phase shares
  of the jobs of its model and size that completed a step, at the model-size period or
  at theirs (`SimConfig.site_prior`);
- `--what-if-param KEY=VALUE`: one of `complementary`'s parameters, the what-if row only;
- `--max-group N`, `--param KEY=VALUE`: both rows with that `complementary` parameter.

Prints a table; writes nothing (docs/benchmarks.md and docs/site-policies.md quote it).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.frontier import within_limit  # noqa: E402
from benchmarks.policies import WORKLOADS, check_grid_args  # noqa: E402
from slurmrl.sim.replay import recorded_profile  # noqa: E402
from slurmrl.sim.runner import config_for, run_jobs, with_max_slowdown  # noqa: E402
from slurmrl.sim.workload import generate, load  # noqa: E402


class Row(NamedTuple):
    """One row's run settings."""

    oracle: bool
    slice_name: str
    site_prior: str | None
    params: dict[str, Any]


def one(args: tuple[str, float, str, int, int, Row]) -> dict[str, float]:
    wname, limit, arrivals, seed, n_jobs, row = args
    w = load(wname)
    jobs = generate(w, seed, arrivals, n_jobs)
    if row.oracle:
        jobs = [replace(j, prior=recorded_profile(j)) for j in jobs]
    cfg = config_for(w, check_invariants=False, site_prior=row.site_prior)
    jobs, cfg = with_max_slowdown(jobs, cfg, limit)
    r = run_jobs(jobs, cfg, "complementary", row.slice_name,
                 params={"complementary": row.params})
    m = r.metrics
    return {"savings": m.savings, "p95": m.slowdown_p95, "max": m.slowdown_max,
            "within": within_limit(r, cfg)}


def param(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` with VALUE an int, a float or a word."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for kind in (int, float):
        try:
            return key, kind(value)
        except ValueError:
            pass
    return key, value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-w", "--workload", action="append", choices=WORKLOADS)
    ap.add_argument("-L", "--limit", action="append", type=float)
    ap.add_argument("--oracle-priors", action="store_true")
    ap.add_argument("--slice", default="round-robin")
    ap.add_argument("--site-prior", choices=("shares", "profile"))
    ap.add_argument("--max-group", type=int, default=3)
    ap.add_argument("--param", action="append", type=param, default=[])
    ap.add_argument("--what-if-param", action="append", type=param, default=[])
    ap.add_argument("--jobs", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=min(os.cpu_count() or 1, 256))
    a = ap.parse_args()
    check_grid_args(ap, a)
    if a.limit and not all(1.0 <= x <= 100.0 and math.isfinite(x) for x in a.limit):
        ap.error("-L/--limit must be in 1..100")
    if not 1 <= a.max_group <= 100:
        ap.error(f"--max-group must be in 1..100, got {a.max_group}")
    if not (a.oracle_priors or a.site_prior or a.what_if_param) and a.slice == "round-robin":
        ap.error("nothing to compare: give --oracle-priors, --site-prior, --what-if-param "
                 "or --slice NAME")
    both = {"max_group": a.max_group, **dict(a.param)}
    rows = [("default", Row(False, "round-robin", None, both)),
            ("what-if", Row(a.oracle_priors, a.slice, a.site_prior,
                            {**both, **dict(a.what_if_param)}))]
    keys = [(w, L, label, row) for w in a.workload or WORKLOADS
            for L in a.limit or [1.15] for label, row in rows]
    runs = [(w, L, arr, s, a.jobs, row) for w, L, _, row in keys
            for arr in ("steady", "bursty") for s in range(a.seeds)]
    with ProcessPoolExecutor(a.procs) as ex:
        out = list(ex.map(one, runs, chunksize=1))
    per = 2 * a.seeds
    print("| workload | L | run | savings % | p95 slowdown | max slowdown | within limit % |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for i, (w, L, label, _) in enumerate(keys):
        got: list[dict[str, Any]] = out[i * per:(i + 1) * per]
        mean = {k: statistics.mean(g[k] for g in got) for k in ("savings", "p95", "within")}
        print(f"| {w} | {L} | {label} | {100 * mean['savings']:.1f} | {mean['p95']:.3f} | "
              f"{max(g['max'] for g in got):.2f} | {100 * mean['within']:.0f} |")


if __name__ == "__main__":
    main()
