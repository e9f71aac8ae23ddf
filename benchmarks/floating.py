"""What do floating pools buy? The simulator's floating pools (and fixed-shape what-ifs),
which the controller runs with `slurm.floating_pools`.

Today a pool member has one fixed window of GPUs (its set, or a staggered offset in a
larger pool). A *floating* pool holds k whole windows for n > k members of the same GPU
count: each GPU phase takes whichever window is free (FIFO), consecutive GPU phases keep
it, a gap gives it back, and taking a window another member used last costs that
member's park and this one's activate (`slurmrl.sim.costs.switch_s`; between nodes this
assumes the network moves each GPU's state at least as fast as PCIe). The pool keeps
min(k, members alive) windows.

Groups started together (the default table) run in `policies.floatsim`, a small event
model. Rows "held": a rollout holds its whole window through its tail. Rows "packed":
at each tail point its unfinished sequences move to the fewest GPUs they need, best fit
anywhere in the pool (two tails of G/2 share a window). Either way no partner's rollout
starts on part of a window, which the simulator allows, so on one window the model is
pessimistic. `--calibrate` checks it against the simulator where both apply: one
window, two members, tails removed, FIFO slicing. `--cluster` runs floating pools in
the simulator under arrivals (`SimConfig.floating`): the default policy where pools may
float, beside fixed shapes placed by `FloatingGroups`; `--curve L` the default policy
with floating pools at users' limit L; `--concurrency` how many jobs of a job's size run
beside it. `--cluster` and `--curve` keep a floating pool on one node, as the controller
does by default; `--across-nodes` lets its windows span nodes (the controller's
`slurm.floating_across_nodes`, opt-in).

    PYTHONPATH=. python benchmarks/floating.py [-w WORKLOAD ...] [--groups 40] [--calibrate]
        [--concurrency] [--move-s S] [--cluster] [--curve L ...] [--across-nodes]
        [--seeds 2] [--jobs 60]

Each group's members start at the same instant, as in the feasibility table of
docs/benchmarks.md ("Policies and simulator"), and are drawn the same way (60 jobs of
the workload, seed 0, steady arrivals; same GPU count, colocated, shareable, parked
state within the pool's host memory). Reported per (members, windows): groups whose
every member ran within its own limit, the worst member's slowdown (median and best
group), and the GPU-hours saved against dedicated over whole lives (the pool giving
windows back as members end) and while every member still runs (what a pool that
takes a joiner for each member that ends would approach).
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies import floatsim, registry
from policies.base import Action, ClusterSnapshot, JobSnapshot, Placement, PoolMode
from policies.complementarity import compatible, fits_memory, shareable
from slurmrl.model import Layout, Phase
from slurmrl.sim import costs
from slurmrl.sim.engine import Simulation
from slurmrl.sim.metrics import compute
from slurmrl.sim.runner import config_for, run_jobs
from slurmrl.sim.workload import SimJob, generate, load

SUITE = ("agentic-tools", "polytrace-mix", "math-sync", "long-cot", "mixed-sizes")
SHAPES = ((2, 1), (3, 2), (4, 3), (5, 3))
MOVE_S = 1.0  #: seconds to move a tail's unfinished sequences to another window


@dataclass(frozen=True)
class GroupRun:
    slowdowns: tuple[float, ...]  #: each member's (finished - start) / solo
    saved: float  #: 1 - pool GPU-s / dedicated GPU-s, whole lives
    shared_slowdowns: tuple[float, ...]  #: until the first member ends, over work done
    shared_saved: float  #: savings over that same horizon


def _plan(job: SimJob, pack_tails: bool) -> list[tuple[float, int]]:
    """The job's segments as (seconds, GPUs needed; 0 for a gap). With `pack_tails` a
    rollout is its head on the whole set, then each tail point's GPU count."""
    g, out = job.gpus, []
    for seg in (s for step in job.steps for s in step):
        if seg.phase is Phase.ROLLOUT and pack_tails and job.tail:
            prev, need = 0.0, g
            for frac, k in job.tail:
                if frac > prev:
                    out.append(((frac - prev) * seg.seconds, need))
                prev, need = frac, k
            out.append(((1.0 - prev) * seg.seconds, need))
        else:
            out.append((seg.seconds, g if seg.phase.needs_gpu else 0))
    return out


def run_group(jobs: Sequence[SimJob], windows: int, pack_tails: bool = False,
              move_s: float = MOVE_S) -> GroupRun:
    """Members of one GPU count G floating over `windows` windows of G GPUs from t = 0
    (`policies.floatsim`): a whole-set phase takes the first wholly free window, a move
    to a window another member used last costs a park and an activate; with
    `pack_tails`, a tail point moves the rollout to the fewest GPUs it still needs, best
    fit over the pool, paying `move_s` for its sequences too; without, the rollout holds
    its window to the end."""
    g = jobs[0].gpus
    r = floatsim.simulate(
        [_plan(j, pack_tails) for j in jobs], g, windows, pack_tails, move_s,
        lambda i, k: costs.switch_s(jobs[i], jobs[k], resident=False))
    sl = tuple(f / j.solo_s() for f, j in zip(r.finished, jobs, strict=True))
    return GroupRun(sl, 1 - r.pool_gpu_s / sum(g * j.solo_s() for j in jobs),
                    r.shared_slowdowns, 1 - windows / sum(1 / x for x in r.shared_slowdowns))


def candidates(wname: str, seed: int = 0) -> tuple[list[SimJob], list[float], int | None]:
    w = load(wname)
    jobs = [replace(j, submit_s=0.0) for j in generate(w, seed, "steady", 60)
            if j.layout is Layout.COLOCATED and not j.mux_off]
    cap = w.host_mem_per_pool_bytes
    lim = float(w.limits["max_slowdown"])
    default = float(w.limits["default_max_slowdown"])
    limits = [min(lim, j.max_slowdown or default) for j in jobs]
    return jobs, limits, cap


def draw(jobs: list[SimJob], n: int, cap: int | None, rng: random.Random) -> list[int]:
    """Indices of n jobs of one GPU count whose parked state fits the pool's host memory."""
    sizes = [g for g in {j.gpus for j in jobs} if sum(j.gpus == g for j in jobs) >= n]
    for _ in range(10_000):
        g = rng.choice(sorted(sizes))
        pick = rng.sample([i for i, j in enumerate(jobs) if j.gpus == g], n)
        if cap is None or sum(costs.host_bytes(jobs[i]) for i in pick) <= cap:
            return pick
    raise RuntimeError(f"no group of {n} fits the host memory")


def table(wnames: Sequence[str], groups: int, seed: int, move_s: float) -> str:
    rows = ["| workload | members on windows | rollout tail | groups within limits | worst "
            "member, median (best) | saved, whole lives, median | while all share: worst "
            "median, saved median |", "| --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for wname in wnames:
        jobs, limits, cap = candidates(wname, seed)
        for (n, k), pack in itertools.product(SHAPES, (False, True)):
            rng = random.Random(seed)  # the same groups for both tails
            runs, ok = [], 0
            for _ in range(groups):
                pick = draw(jobs, n, cap, rng)
                r = run_group([jobs[i] for i in pick], k, pack, move_s)
                runs.append(r)
                ok += all(s <= limits[i] + 1e-9 for s, i in zip(r.slowdowns, pick, strict=True))
            worst = [max(r.slowdowns) for r in runs]
            sworst = [max(r.shared_slowdowns) for r in runs]
            rows.append(
                f"| {wname} | {n} on {k} | {'packed' if pack else 'held'} | {ok} of {groups} "
                f"| {statistics.median(worst):.3f} ({min(worst):.3f}) | "
                f"{100 * statistics.median(r.saved for r in runs):.1f}% | "
                f"{statistics.median(sworst):.3f}, "
                f"{100 * statistics.median(r.shared_saved for r in runs):.1f}% |")
    return "\n".join(rows)


def concurrency(wnames: Sequence[str], seed: int, samples: int = 50) -> str:
    """Are there groups to form? For each job (60, as above, each as if dedicated from
    its arrival), the share of its life during which at least 2 and 4 other colocated,
    shareable jobs of its GPU count run too, sampled at `samples` instants of its life."""
    out = []
    for wname in wnames:
        w = load(wname)
        for arrivals in ("steady", "bursty"):
            jobs = [j for j in generate(w, seed, arrivals, 60)
                    if j.layout is Layout.COLOCATED and not j.mux_off]
            life = [(j.submit_s, j.submit_s + j.solo_s()) for j in jobs]
            hits = {2: 0, 4: 0}
            for j, (a, b) in zip(jobs, life, strict=True):
                for k in range(samples):
                    t = a + (b - a) * (k + 0.5) / samples
                    others = sum(1 for o, (c, d) in zip(jobs, life, strict=True)
                                 if o is not j and o.gpus == j.gpus and c <= t < d)
                    for n in hits:
                        hits[n] += others >= n
            total = len(jobs) * samples
            out.append(f"{wname}, {arrivals}: at least 2 others {100 * hits[2] / total:.0f}%"
                       f", at least 4 others {100 * hits[4] / total:.0f}% of a job's life")
    return "\n".join(out)


class FloatingGroups:
    """A what-if pairing policy for `SimConfig.floating` (not registered; the controller
    cannot enact it): a colocated job that may share joins the fullest floating pool of
    its GPU count with room (at most `members` members, with whom it may share, parked
    state within host memory), the pool growing to ceil(n x windows / members) windows
    for its n members; else it opens a pool of one window. It predicts nothing: it
    measures what a fixed shape of group gives under arrivals, users' limits unread."""

    name = "floating-groups"
    mode = PoolMode.LEASE

    def __init__(self, members: int, windows: int) -> None:
        if not 1 <= windows <= members:
            raise ValueError(f"windows must be in 1..{members}, got {windows}")
        self.members, self.windows = members, windows

    def size(self, n: int, g: int) -> int:
        return math.ceil(n * self.windows / self.members) * g

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        free = dict(snapshot.free_gpus)
        # pool id -> [GPUs, members, open (True) or opened this round (False)]
        pools: dict[int, tuple[list[int], list[JobSnapshot], bool]] = {
            p.pool_id: ([p.gpus], list(p.members), True) for p in snapshot.pools
            if not p.dedicated and p.members and p.gpus % p.members[0].request.gpus == 0}
        snaps = {p.pool_id: p for p in snapshot.pools}
        out = []
        for job in snapshot.waiting:
            g, part = job.request.gpus, job.partition
            fits = [(len(m), pid) for pid, (_, m, _) in pools.items()
                    if shareable(job) and job.request.rollout_gpus is None
                    and len(m) < self.members and all(x.request.gpus == g for x in m)
                    and all(compatible(job, x) is None for x in m)
                    and fits_memory([*m, job], snaps.get(pid), snapshot.limits) is None]
            placed = False
            for _, pid in sorted(fits, reverse=True):
                gpus, m, is_open = pools[pid]
                want = self.size(len(m) + 1, g)
                if want - gpus[0] > free.get(part, 0):
                    continue
                free[part] = free.get(part, 0) - (want - gpus[0])
                gpus[0] = want
                m.append(job)
                out.append(Placement(job.job_id, Action.JOIN if is_open else Action.OPEN,
                                     pid, want, reason="floating group", floating=True))
                placed = True
                break
            if placed:
                continue
            if free.get(part, 0) < g:
                out.append(Placement(job.job_id, Action.WAIT, reason="no free GPUs"))
                continue
            free[part] -= g
            pid = -1 - len(out)
            if shareable(job) and job.request.rollout_gpus is None:
                pools[pid] = ([g], [job], False)
                out.append(Placement(job.job_id, Action.OPEN, pid, g, reason="alone",
                                     floating=True))
            else:
                out.append(Placement(job.job_id, Action.DEDICATED, pid, g, reason="alone"))
        return out


CLUSTER_SHAPES = ((3, 2, False), (3, 2, True), (4, 3, True), (5, 3, True))
#: the sites' `max_jobs_per_pool` (and the policy's `floating_members`) the default
#: policy runs at with floating pools, beside the workload's own
POOL_CAPS = (5, 12, 40)


def _cell(sim: Simulation, limits: Sequence[float]) -> tuple[float, float, float, float]:
    """Savings %, p95 slowdown, % of jobs within their limit, shared % of one run."""
    m = compute(sim)
    runs = sorted(sim.runs.values(), key=lambda r: r.job.job_id)
    within = sum(((r.finished_at or 0.0) - (r.placed_at or 0.0)) / r.solo_s <= x + 1e-9
                 for r, x in zip(runs, limits, strict=True))
    return (100 * m.savings, m.slowdown_p95, 100 * within / len(runs),
            100 * m.shared_fraction)


def cluster(wnames: Sequence[str], seeds: int, jobs: int, move_s: float,
            held: bool = False, across: bool = False, node: int | None = None) -> str:
    """Each workload's jobs under arrivals (steady and bursty): the default policy at
    the suite's limits, then the same where pools may float (`SimConfig.floating`, tails
    packed; at most the workload's `max_jobs_per_pool` jobs a pool, then each of
    `POOL_CAPS`), then `FloatingGroups` of each fixed shape, all on the same jobs. With
    `held`, the floating rows are the controller's floating pools instead (a rollout
    keeps its window through its tail) and the fixed shapes are left out. A floating
    pool holds at most one node's GPUs (`node`, default the workload's), as the controller
    keeps one by default, unless `across` (windows across nodes, as with the controller's
    opt-in `slurm.floating_across_nodes`); the fixed shapes are what-ifs across nodes."""
    rows = ["| workload | placed by | savings % | p95 slowdown | jobs within their limit "
            "| shared % |", "| --- | --- | ---: | ---: | ---: | ---: |"]
    for wname in wnames:
        w = load(wname)
        cells: dict[str, list[tuple[float, float, float, float]]] = {}
        for seed, arrivals in itertools.product(range(seeds), ("steady", "bursty")):
            drawn = generate(w, seed, arrivals, jobs)
            base = config_for(w, check_invariants=True)
            base = replace(base, gpus_per_node=node or base.gpus_per_node)
            lim = [min(base.limits.max_slowdown, j.max_slowdown or
                       base.limits.default_max_slowdown) for j in drawn]

            cells.setdefault("complementary (default)", []).append(
                _cell(run_jobs(drawn, base).sim, lim))
            for most in (base.limits.max_jobs_per_pool, *POOL_CAPS):
                cfg = replace(base, floating=True, pack_tails=not held, tail_move_s=move_s,
                              floating_across_nodes=across,
                              limits=replace(base.limits, max_jobs_per_pool=most))
                params = {"complementary": {"floating_members": most}}
                how = ", tails held" if held else ""
                cells.setdefault(f"complementary, floating pools of at most {most} jobs{how}",
                                 []).append(_cell(run_jobs(drawn, cfg, params=params).sim,
                                                  lim))
            for n, k, pack in () if held else CLUSTER_SHAPES:
                cfg = replace(base, floating=True, pack_tails=pack, tail_move_s=move_s,
                              floating_across_nodes=True,
                              limits=replace(base.limits, max_jobs_per_pool=n))
                sim = Simulation(drawn, cfg, FloatingGroups(n, k),
                                 lambda: registry.load("slice", "fifo"),
                                 registry.load("admission", "site-limits")).run()
                label = f"floating {n} on {k}, tails {'packed' if pack else 'held'}"
                cells.setdefault(label, []).append(_cell(sim, lim))
        for label, vals in cells.items():
            mean = [statistics.mean(v[i] for v in vals) for i in range(4)]
            rows.append(f"| {wname} | {label} | {mean[0]:.1f} | {mean[1]:.3f} | "
                        f"{mean[2]:.0f}% | {mean[3]:.0f}% |")
    return "\n".join(rows)


def curve(wnames: Sequence[str], seeds: int, jobs: int, limits: Sequence[float],
          cap: int = 5, across: bool = False, node: int | None = None) -> str:
    """The default policy where pools may float (at most `cap` jobs a pool), every job's
    limit set to L (`runner.with_max_slowdown`, as benchmarks/frontier.py), for each L:
    savings and p95 to read beside frontier.py's baselines (the same jobs: 60 jobs,
    seeds 0-1, steady and bursty)."""
    from slurmrl.sim.runner import with_max_slowdown

    rows = ["| workload | users' limit L | savings % | p95 slowdown |",
            "| --- | ---: | ---: | ---: |"]
    for wname in wnames:
        w = load(wname)
        for limit in limits:
            vals = []
            for seed, arrivals in itertools.product(range(seeds), ("steady", "bursty")):
                drawn, cfg = with_max_slowdown(generate(w, seed, arrivals, jobs),
                                               config_for(w, check_invariants=True), limit)
                cfg = replace(cfg, floating=True, pack_tails=True,
                              floating_across_nodes=across,
                              gpus_per_node=node or cfg.gpus_per_node,
                              limits=replace(cfg.limits, max_jobs_per_pool=cap))
                m = run_jobs(drawn, cfg,
                             params={"complementary": {"floating_members": cap}}).metrics
                vals.append((100 * m.savings, m.slowdown_p95))
            rows.append(f"| {wname} | {limit:g} | {statistics.mean(v[0] for v in vals):.1f} | "
                        f"{statistics.mean(v[1] for v in vals):.3f} |")
    return "\n".join(rows)


def pairing_speed(cap: int = 5, node: int | None = None) -> str:
    """The speed benchmark's batch (benchmarks/policies.py `speed`: 1,000 waiting
    polytrace-mix jobs profiled from a simulated month, as newcomers, no open pool)
    placed in one round by the default policy where pools may float (at most `cap` jobs
    a pool), tails held (the controller's) and packed (the what-if); seconds each. With
    `node`, the policy is told nodes of that many GPUs (where a staggered pool fits,
    each job is weighed for one against floating: `_prefers_staggered`)."""
    import time

    from policies import complementarity

    w = load("polytrace-mix")
    jobs = generate(w, 0, "steady", 1000, load_scale=(1000 / (30 * 24)) / 0.8)
    cfg = replace(config_for(w, check_invariants=False), gpus=640)
    r = run_jobs(jobs, cfg, "complementary")
    snaps = tuple(replace(s, request=replace(s.request, steps=None), running_s=0.0)
                  for s in (r.sim._snapshot(run) for run in list(r.sim.runs.values())[:1000]))
    limits = replace(cfg.limits, max_jobs_per_pool=cap)
    out = []
    for pack in (False, True):
        snap = ClusterSnapshot(0.0, (), snaps, {"pools": 10**6}, limits,
                               node_gpus={"pools": node} if node else {},
                               floating={"pools": True}, packs_tails={"pools": pack})
        pol = registry.load("pairing", "complementary", {"floating_members": cap})
        complementarity.clear_caches()
        t = time.perf_counter()
        placed = pol.place(snap)
        took = time.perf_counter() - t
        floating = sum(p.floating for p in placed)
        out.append(f"tails {'packed' if pack else 'held'}: {took:.2f} s "
                   f"({floating} of {len(placed)} placed in floating pools)")
    return "\n".join(out)


def calibrate(wnames: Sequence[str], pairs: int, seed: int) -> str:
    """The model against the simulator on one window: two members, no tail, FIFO."""
    import importlib.util

    # benchmarks/policies.py's one-pool placement (its name clashes with the package)
    spec = importlib.util.spec_from_file_location(
        "bench_policies", Path(__file__).resolve().parent / "policies.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    out = []
    for wname in wnames:
        jobs, _, cap = candidates(wname, seed)
        cfg = config_for(load(wname), check_invariants=True)
        rng = random.Random(seed)
        diffs = []
        for _ in range(pairs):
            pick = draw(jobs, 2, cap, rng)
            pair = [replace(jobs[i], job_id=n + 1, tail=()) for n, i in enumerate(pick)]
            sim = Simulation(pair, cfg, bench._OnePool(0), lambda: registry.load("slice", "fifo"),
                             registry.load("admission", "site-limits")).run()
            engine = max((r.finished_at - r.placed_at) / r.solo_s for r in sim.runs.values()
                         if r.finished_at is not None and r.placed_at is not None)
            diffs.append(max(run_group(pair, 1).slowdowns) - engine)
        out.append(f"{wname}: model minus simulator, worst member's slowdown, {pairs} pairs: "
                   f"mean {statistics.mean(diffs):+.3f}, sd {statistics.stdev(diffs):.3f}, "
                   f"range {min(diffs):+.3f} to {max(diffs):+.3f}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("-w", "--workload", action="append", choices=SUITE)
    ap.add_argument("--groups", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--move-s", type=float, default=MOVE_S,
                    help="seconds to move a packed tail's sequences to another window, "
                    "on top of a park and an activate")
    ap.add_argument("--calibrate", action="store_true",
                    help="also compare the model with the simulator on one window")
    ap.add_argument("--cluster", action="store_true",
                    help="also run floating pools under arrivals in the simulator")
    ap.add_argument("--seeds", type=int, default=2,
                    help="--cluster, --curve: seeds (x steady, bursty)")
    ap.add_argument("--jobs", type=int, default=60, help="--cluster, --curve: jobs per run")
    ap.add_argument("--curve", type=float, action="append", metavar="L",
                    help="also run the default policy with floating pools at users' limit L "
                         "(repeatable), as benchmarks/frontier.py runs it with fixed ones")
    ap.add_argument("--pool-cap", type=int, default=5,
                    help="--curve: at most this many jobs a floating pool (the site's "
                         "max_jobs_per_pool and the policy's floating_members)")
    ap.add_argument("--held-tails", action="store_true",
                    help="--cluster: floating pools as the controller runs them (a rollout "
                         "keeps its window through its tail), without the fixed shapes")
    ap.add_argument("--across-nodes", action="store_true",
                    help="--cluster, --curve: a floating pool's windows may span nodes (the "
                         "controller's opt-in slurm.floating_across_nodes; without, one node)")
    ap.add_argument("--gpus-per-node", type=int, default=None,
                    help="--cluster, --curve: GPUs per node (default: the workload's)")
    ap.add_argument("--pairing-speed", action="store_true",
                    help="time one round placing 1,000 waiting jobs where pools may float "
                         "(at most --pool-cap jobs a pool)")
    ap.add_argument("--concurrency", action="store_true",
                    help="also say how much of a job's life others of its size run beside it")
    a = ap.parse_args(argv)
    if not 1 <= a.groups <= 10_000:
        ap.error(f"--groups must be in 1..10000, got {a.groups}")
    if not 0 <= a.move_s <= 3600:
        ap.error(f"--move-s must be in 0..3600 seconds, got {a.move_s}")
    if not (1 <= a.seeds <= 100 and 2 <= a.jobs <= 100_000):
        ap.error("--seeds must be in 1..100 and --jobs in 2..100000")
    if a.curve and not all(1.0 <= x <= 100.0 and math.isfinite(x) for x in a.curve):
        ap.error("--curve limits must be in 1..100")
    if not 1 <= a.pool_cap <= 1000:
        ap.error("--pool-cap must be in 1..1000")
    if a.gpus_per_node is not None and not 1 <= a.gpus_per_node <= 1024:
        ap.error("--gpus-per-node must be in 1..1024")
    wnames = a.workload or list(SUITE)
    print(table(wnames, a.groups, a.seed, a.move_s))
    if a.calibrate:
        print()
        print(calibrate(wnames, min(a.groups, 20), a.seed))
    if a.concurrency:
        print()
        print(concurrency(wnames, a.seed))
    if a.curve:
        print()
        print(curve(wnames, a.seeds, a.jobs, a.curve, a.pool_cap, a.across_nodes,
                    a.gpus_per_node))
    if a.cluster:
        print()
        print(cluster(wnames, a.seeds, a.jobs, a.move_s, a.held_tails, a.across_nodes,
                      a.gpus_per_node))
    if a.pairing_speed:
        print()
        print(pairing_speed(a.pool_cap, a.gpus_per_node))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
