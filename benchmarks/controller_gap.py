"""What the simulator credits to mechanisms the controller does not run, and what the
controller's rollout replicas recover.

    python benchmarks/controller_gap.py [--jobs 60] [--seeds 2] [--no-write]

Runs the default policy on the suite six ways, every job's limit set to the users'
limit shown, and writes the "Simulator and controller" section of docs/benchmarks.md
(means over seeds x (steady, bursty)):
- `designed`: the simulator as it is: a rollout's lease shrinks through its tail with
  the unfinished sequences consolidated (G/2, G/4, ... 1 GPU), and a partner's rollout
  starts on part of a set and grows back;
- `replicas + migration`: rollouts as replicas (below) whose unfinished sequences move
  onto the fewest replicas between rounds (`ReplicatedRollout.generate(round_tokens=)`):
  the designed tail at replica granularity (`workload.consolidated_replica_points`),
  started on half the set (`min_gpus`), no grow, the controller's priors; the rounds'
  prefills unpriced;
- `replicas + migration + grow`: the same, growing back as the controller does
  (`SimConfig.grow_free_only`: the lease takes the GPUs free that no waiter asks for,
  `Lease.grow`, asked again whenever GPUs free; the controller asks at its next round);
- `replicas + grow`: rollouts as data-parallel replicas (`services.rollout_replica_gpus`,
  the fewest GPUs whose engine of the job's model fits one GPU), no sequence migrating: a
  replica's GPUs free when its share of the batch is done
  (`workload.replica_tail_points`); starts on part of a set and grows; the controller's
  priors (`ROLLOUT_HELD_SHARE`);
- `replicas`: the same without growing, granted the whole set;
- `controller today`: one engine per rollout (the controller's default): no tail points,
  its rollout holds the whole set throughout for the same time, granted it whole.
"""

from __future__ import annotations

import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.frontier import grid_args, write_marked  # noqa: E402
from benchmarks.policies import WORKLOADS  # noqa: E402
from slurmrl.controller.placement import ROLLOUT_HELD_SHARE  # noqa: E402
from slurmrl.gpu.estimate import estimate_model_memory  # noqa: E402
from slurmrl.sim.engine import SimConfig  # noqa: E402
from slurmrl.sim.runner import config_for, run_jobs, with_max_slowdown  # noqa: E402
from slurmrl.sim.workload import (  # noqa: E402
    SimJob,
    Workload,
    consolidated_replica_points,
    generate,
    load,
    replica_tail_points,
)

LIMITS = [1.15, 1.5]
MODES = ["designed", "replicas + migration", "replicas + migration + grow",
         "replicas + grow", "replicas", "controller today"]


def replica_gpus(job: SimJob, gpu_mem_bytes: int) -> int:
    """The fewest GPUs (a power of 2) whose rollout engine of the job's model fits a GPU:
    the replica size a site would configure for it."""
    r = 1
    while r < job.rollout_gpus:
        est = estimate_model_memory(int(job.params), "rollout", gpus=r)
        if est.device_bytes <= gpu_mem_bytes:
            break
        r *= 2
    return min(r, job.rollout_gpus)


def run_as(mode: str, w: Workload, jobs: list[SimJob],
           cfg: SimConfig) -> tuple[list[SimJob], SimConfig]:
    """The jobs and config that run the suite as `mode` (module docstring)."""
    if mode == "designed":
        return jobs, cfg
    # the controller's priors: a rollout holds its whole set until its own leases show
    # otherwise (slurmrl.controller.placement.ROLLOUT_HELD_SHARE); it learns no prior
    # from other jobs (`SitePriors` is the simulator's alone)
    cfg = replace(cfg, rollout_prior_gpu_share=ROLLOUT_HELD_SHARE, learn_priors=False)
    if mode == "controller today":
        # one engine per rollout: it holds its whole set throughout and is granted it whole
        return [replace(j, tail=()) for j in jobs], replace(cfg, elastic_min=1.0)
    if mode.startswith("replicas + migration"):
        # the consolidated tail at replica granularity (round_tokens); started on half
        # the set (min_gpus), growing back or not
        return [replace(j, tail=consolidated_replica_points(
            j.tail, j.rollout_gpus, replica_gpus(j, cfg.gpu_mem_bytes))) for j in jobs], \
            replace(cfg, grow=mode.endswith("+ grow"), grow_free_only=True)
    kinds = {str(c["name"]): str(c.get("tail", "heavy")) for c in w.data["classes"]}
    jobs = [replace(j, tail=replica_tail_points(
        kinds[j.cls], j.rollout_gpus, replica_gpus(j, cfg.gpu_mem_bytes)))
        for j in jobs]
    if mode == "replicas":
        # no grow, granted the whole set (started on half, without migration or grow, a
        # rollout runs at half speed to its end: see SECTION)
        return jobs, replace(cfg, elastic_min=1.0, grow=False)
    return jobs, cfg


def one(args: tuple[str, float, str, str, int, int]) -> dict[str, Any]:
    wname, limit, mode, arrivals, seed, n_jobs = args
    w = load(wname)
    jobs, cfg = with_max_slowdown(generate(w, seed, arrivals, n_jobs),
                                  config_for(w, check_invariants=False), limit)
    jobs, cfg = run_as(mode, w, jobs, cfg)
    m = run_jobs(jobs, cfg, "complementary").metrics
    return {"workload": wname, "limit": limit, "mode": mode, "savings": m.savings,
            "p95": m.slowdown_p95, "max": m.slowdown_max}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | users' limit | run as | savings % | p95 slowdown | max slowdown |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    for w in WORKLOADS:
        for L in LIMITS:
            for mode in MODES:
                rs = [r for r in rows if (r["workload"], r["limit"], r["mode"]) == (w, L, mode)]
                lines.append(f"| {w} | {L} | {mode} | "
                             f"{100 * statistics.fmean(r['savings'] for r in rs):.1f} | "
                             f"{statistics.fmean(r['p95'] for r in rs):.3f} | "
                             f"{max(r['max'] for r in rs):.2f} |")
    return "\n".join(lines)


def main() -> None:
    a = grid_args(__doc__)
    tasks = [(w, L, mode, arr, s, a.jobs) for w in WORKLOADS for L in LIMITS for mode in MODES
             for arr in ("steady", "bursty") for s in range(a.seeds)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.procs) as ex:
        rows = list(ex.map(one, tasks, chunksize=2))
    tab = table(rows)
    print(tab)
    if a.no_write:
        return
    write_marked("controller-gap", SECTION.format(
        jobs=a.jobs, seeds=a.seeds, runs=len(tasks), wall=time.perf_counter() - t0, table=tab))


SECTION = """## Simulator and controller

Produced by `python benchmarks/controller_gap.py --jobs {jobs} --seeds {seeds}` ({runs} runs
in {wall:.0f} s). The figures above are the designed system's: a rollout's lease shrinks
through its tail, its unfinished sequences consolidated onto G/2, G/4, ... 1 GPU, and a
partner's rollout starts on part of a set and grows back. The controller runs a rollout
as one engine over its set by default, or as data-parallel replicas
(`[services] rollout_replica_gpus`, docs/pools.md) whose lease shrinks to the replicas
still generating, and which consolidate their tail between rounds with
`generate(round_tokens=N)`, growing back between rounds where started on part of the
set (`Lease.grow`: GPUs free now that no waiter asks for). Measured with bursty arrivals
of their documented mean burst (fixed at commit 00011fe; "Policies and simulator" above).
Each row runs the same jobs under the default policy, every job's limit set to the users'
limit shown:
- **designed**: the simulator as above;
- **replicas + migration**: rollouts as replicas of the fewest GPUs whose engine of the
  job's model fits one GPU, consolidating their tail in rounds: the designed tail with
  each point's GPU count rounded up to whole replicas
  (`workload.consolidated_replica_points`); started on half the set
  (`job.phase("rollout", min_gpus=G/2)`), no grow; the rounds' prefills are not priced;
- **replicas + migration + grow**: the same, growing back as the controller does: the
  lease takes the missing GPUs that are free and that no waiter asks for
  (`SimConfig.grow_free_only`, `LeaseTable.grow`), asked again whenever GPUs free (the
  controller asks at its next round), where the designed row's grow is a request queued
  in the slice policy's order;
- **replicas + grow**: the same replicas without rounds, the batch split evenly, a
  replica's GPUs freed when its longest response is done (`workload.replica_tail_points`:
  mean order statistics of the replicas' ends); starting on part of a set and growing
  as designed;
- **replicas**: the same without growing, granted the whole set (the driver's default);
- **controller today**: one engine: no tail points, the rollout holds its set
  throughout for the same time and is granted it whole.
The five controller rows use the controller's priors (a rollout holds its set,
`slurmrl.controller.placement.ROLLOUT_HELD_SHARE`, until its own leases show otherwise)
and, as the controller, learn nothing from other jobs (the designed row learns each new
job's prior from observed jobs of its model and size: `SimConfig.learn_priors`).
Means over {seeds} seeds x (steady, bursty), max over runs.

{table}

Reading (re-measured on 2026-11-27 at commit d3af4b3, the default policy picturing a
rollout's tail in halves learned from its leases, judging a newcomer with no
`--rl-profile` on its peer's phases, widened to the periods its model's running jobs
show, else on a model-size prior within its sources' ranges, and one with a
`--rl-profile` at both ends of the period it gave, two such at opposite ends, on the
suite as corrected at commit 1134820: at 1.15 every workload saves 0.5-12.2% as
designed;
every job declares its steps, `--rl-steps`). The controller rows learn no prior from
other jobs, as the controller (since commit 35eaeec):
- **Judging a newcomer on its peer's phases narrowed the gap at 1.5**: a newcomer that
  gave no `--rl-profile` is predicted on the observed phases of the pool member of its
  model and size (commit d685b6a), which the controller rows use as the designed one
  does. One engine (`controller today`) saves 24.9% on agentic-tools at 1.5 (18.6% in
  this section's run before that change) and 7.2% on polytrace-mix (6.4%); long-cot
  (0.0%, 1.0% before) and math-sync (0.0%, 1.6%) stay where a whole-set rollout leaves
  no room. At 1.15 the gap stays: agentic-tools 4.8-7.8% on the controller rows against
  12.2% designed, polytrace-mix 1.4-3.9% against 4.6%.
- **Replicas consolidating their tail recover most of the designed system's
  savings**: at 1.5, agentic-tools 28.8% (designed 30.7%), polytrace-mix 14.9% (18.0%),
  long-cot 10.8% (14.4%) and math-sync 2.6% (3.9%), where one engine saves 24.9%,
  7.2%, 0.0% and 0.0%. What is left is the rounding of the tail to whole replicas and
  the priors: a new job is placed on the controller's prior (its rollout holds its whole
  set) until its own leases show its tail, where the designed row's new jobs start from
  their peers' observed share. The rounds' prefills are not priced here. The controller
  does this with `round_tokens` and `job.phase("rollout", min_gpus=G/2)`
  (docs/pools.md); the simulator measures it, no real rollout has shown it (the `tiny`
  model's rounds take milliseconds).
- **Growing back as the controller does adds up to 1.3 points**: math-sync 3.9% at 1.5
  (2.6% without, p95 1.396 -> 1.345), long-cot 11.9% (10.8%, p95 1.381 -> 1.365),
  polytrace-mix 15.5% (14.9%, p95 1.469 -> 1.442); agentic-tools 28.7% (28.8%) and
  disaggregated 21.2% (21.4%) barely move.
- **Without moving sequences, replicas free GPUs late**: with 1-GPU replicas of a
  `heavy` tail the first GPU frees after ~41% of the rollout and the last-but-one after
  ~82% (`replica_tail_points("heavy", 8, 1)`), where a consolidated tail is down to half
  the set after 11% and to one GPU after 26% (`tail_points("heavy", 8)`); on math tails
  the replicas end within ~20% of each other. Growing without rounds (`replicas +
  grow`) saves 27.0% on agentic-tools at 1.5 (one engine 24.9%), 9.8% on
  polytrace-mix (7.2%), 2.4% on long-cot (0.0%).
- **Growing adds up to 2.2 points** over replicas alone (polytrace-mix at 1.5; 1.6 on
  agentic-tools and long-cot). Started on half the set without growing or moving
  sequences, a rollout runs at half speed to its end (measured in an earlier revision
  with the `replicas` row so: disaggregated at 1.15, 3.8% at p95 1.41, max 1.83), hence
  the whole set for replicas without rounds (the controller grows those only while
  micro-batches wait unstarted, which the row's even split does not model).
- **Disaggregated is the exception**: there every controller row saves about what the
  designed one does, or more at a higher p95 (1.15: 4.8-5.0% at p95 1.138-1.158 against
  4.8% at 1.131; 1.5: 20.9-22.0% against 21.5%). Its jobs' rollout and training sets
  are apart, the tail matters less than the pairing, and on the controller's priors the
  policy forms more pairs than the designed row's learned ones allow; measured, not tuned.
Staggered pools would widen the gap where a pool of G + 1 fits one node (none on the
suite's 8-GPU nodes). Until an earlier round the controller used the designed prior (a
tail-shrunk rollout holds 55% of its set), which placed jobs more optimistically than
they ran: measured that way, disaggregated at 1.15 saved 13.3% at p95 1.20 (max 1.36),
and at 1.5 27.5% at p95 1.36 (max 1.91).
"""


if __name__ == "__main__":
    main()
