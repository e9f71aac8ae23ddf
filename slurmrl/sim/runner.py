"""Run a workload with policies chosen by name: the one entry point the CLI, the
benchmarks and the tests share."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies import registry
from policies.base import SiteLimits
from slurmrl.sim.engine import SimConfig, Simulation
from slurmrl.sim.metrics import Metrics, compute
from slurmrl.sim.workload import SimJob, Workload, generate


@dataclass(frozen=True)
class RunResult:
    metrics: Metrics
    sim: Simulation
    slice_name: str  #: the slice policy that ran (`slice_for`)


class SliceConflict(ValueError):
    """A slice policy was asked for a pairing policy that fixes its own."""


def slice_for(pairing: Any, slice_name: str | None) -> str:
    """The slice policy a run uses: the pairing policy's own where it fixes one (its
    `slice_policy`: `fifo-lock` and `gang` are defined by their slicing), else
    `slice_name`, by default `round-robin`. Raises `SliceConflict` where `slice_name`
    names another than the one the pairing policy fixes."""
    fixed = getattr(pairing, "slice_policy", None)
    if not isinstance(fixed, str):
        return slice_name or "round-robin"
    if slice_name is not None and slice_name != fixed:
        raise SliceConflict(f"pairing policy {pairing.name!r} slices its pools with "
                            f"{fixed!r} (that is what it models); it takes no other slice "
                            f"policy, got {slice_name!r}")
    return fixed


def config_for(w: Workload, check_invariants: bool = True, **overrides: Any) -> SimConfig:
    lim = SiteLimits(**{k: v for k, v in w.limits.items() if k in SiteLimits.__dataclass_fields__})
    if w.host_mem_per_pool_bytes is not None:
        from dataclasses import replace

        lim = replace(lim, parked_host_mem_bytes=w.host_mem_per_pool_bytes)
    cfg = SimConfig(w.cluster_gpus, w.gpu_mem_bytes, w.host_mem_per_pool_bytes, lim,
                    check_invariants=check_invariants, gpus_per_node=w.gpus_per_node)
    if overrides:
        from dataclasses import replace

        cfg = replace(cfg, **overrides)
    return cfg


def trace_config(jobs: list[SimJob], check_invariants: bool = True) -> SimConfig:
    """A recorded trace's cluster: GPUs enough for every job at once (the runs were not
    queued for one another), the controller's default site limits (`[limits]` of a
    default `Config`, through the controller's own `placement.site_limits`), its host
    memory for parked state also each pool's budget, as the controller's join guard
    holds it. The default `parked_host_mem_per_node` (0) has the controller take half
    of the pool node's memory as Slurm reports it (`SlurmPools._host_budget`); a trace
    does not say the nodes' memory, so the budget is the controller's fallback where
    Slurm reports none (`pools.UNKNOWN_HOST_BUDGET`, 64 GiB), not unlimited. One
    exception: `max_gpus_per_job` is raised to the trace's largest job, so that no
    recorded job (admitted by the controller that ran it) is rejected."""
    from dataclasses import replace

    from slurmrl.config import Config
    from slurmrl.controller.placement import site_limits
    from slurmrl.controller.pools import UNKNOWN_HOST_BUDGET

    lim = site_limits(Config())
    if lim.parked_host_mem_bytes is None:  # the site config's 0: "from the nodes"
        lim = replace(lim, parked_host_mem_bytes=UNKNOWN_HOST_BUDGET)
    largest = max((j.gpus for j in jobs), default=1)
    lim = replace(lim, max_gpus_per_job=max(lim.max_gpus_per_job, largest))
    return SimConfig(max(1, sum(j.gpus for j in jobs)),
                     host_mem_per_pool_bytes=lim.parked_host_mem_bytes, limits=lim,
                     check_invariants=check_invariants)


def with_max_slowdown(jobs: list[SimJob], cfg: SimConfig, limit: float,
                      ) -> tuple[list[SimJob], SimConfig]:
    """What if every user asked for `--rl-max-slowdown=limit`? Each job's limit becomes
    `limit` and the site's default and cap follow it (the cap only ever rises)."""
    from dataclasses import replace

    if not limit >= 1.0:
        raise ValueError(f"max slowdown must be at least 1.0, got {limit}")
    lim = replace(cfg.limits, default_max_slowdown=limit,
                  max_slowdown=max(cfg.limits.max_slowdown, limit))
    return [replace(j, max_slowdown=limit) for j in jobs], replace(cfg, limits=lim)


def run_jobs(jobs: list[SimJob], cfg: SimConfig, pairing: str = "complementary",
             slice_name: str | None = None, admission: str = "site-limits",
             params: Mapping[str, Mapping[str, Any]] | None = None,
             progress: Callable[[float], None] | None = None) -> RunResult:
    """`slice_name`: as `slice_for` (None: the pairing policy's own, else round-robin)."""
    params = params or {}
    pol = registry.load("pairing", pairing, params.get(pairing))
    sname = slice_for(pol, slice_name)
    registry.load("slice", sname, params.get(sname))  # fail early on a bad name
    adm = registry.load("admission", admission, params.get(admission))
    sim = Simulation(jobs, cfg, pol, lambda: registry.load("slice", sname, params.get(sname)),
                     adm, progress)
    sim.run()
    return RunResult(compute(sim), sim, sname)


def run_workload(w: Workload, seed: int = 0, arrivals: str = "steady",
                 n_jobs: int | None = None, load_scale: float = 1.0,
                 check_invariants: bool = True, **kwargs: Any) -> RunResult:
    jobs = generate(w, seed, arrivals, n_jobs, load_scale)
    return run_jobs(jobs, config_for(w, check_invariants), **kwargs)
