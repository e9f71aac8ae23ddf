"""`slurmrl simulate`: run a workload (or replay a trace) through the real policies.

With no argument it runs `polytrace-mix`, steady arrivals, the default policies
(`complementary` pairing, `round-robin` slicing, `site-limits` admission), seed 0.
`-w FILE.jsonl` (the suffix in any case) takes the jobs of a recorded trace (`slurmrl
report --trace`) instead of drawing them: what a pairing policy would have saved on the
site's own runs; any other file is read as a workload file.
`--replay FILE` runs a trace's jobs in their recorded pools and compares makespans.
`--param POLICY.KEY=VALUE` (repeatable) passes a policy parameter, as a site config's
`[policies.params.POLICY]` table does (`--param complementary.max_load=1.0`).
`--slice NAME` picks the slice policy, except for a pairing policy that fixes its own
(`fifo-lock`: fifo, `gang`: round-robin), where another is a usage error; `meta.slice`
says which ran. `--json` prints one envelope (`meta`, `errors`, `warnings`, `metrics`);
otherwise a table. `warnings` lists joins the simulator refused (a pool that could not
take the job: `slurmrl.sim.engine`), which then opened pools of their own, jobs the
admission policy rejected (with the first one's reason), and a replayed trace's own
(a recorded pool some of whose members it leaves out). A malformed
workload or trace, a simulation that cannot go on, or a policy that raises (its
`place`, `order` or `admit`: "pairing policy 'X' raised KeyError: ...") fails with one
line on stderr (exit 1); any other exception, the simulator's own bug, keeps its
traceback. A progress bar is drawn on stderr for long runs (not with --json).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from policies import registry
from slurmrl.cli import finite
from slurmrl.directives import MAX_SLOWDOWN
from slurmrl.sim.workload import JOBS_MAX

if TYPE_CHECKING:
    from slurmrl.sim.engine import JobRun

#: `--load`'s range: a hundredth to a hundred times the workload's arrival rate
LOAD_MIN, LOAD_MAX = 0.01, 100.0


def _param(value: str) -> tuple[str, str, Any]:
    """POLICY.KEY=VALUE -> (policy, key, value): the value read as the site config reads
    a flag's (a TOML value: 1.0, 3, true, "best-fit"; else the text itself)."""
    from slurmrl.config.loader import toml_literal

    target, eq, raw = value.partition("=")
    policy, dot, key = target.rpartition(".")
    if not (eq and dot and policy and key.isidentifier() and raw.strip()):
        raise click.BadParameter(f"{value!r}: expected POLICY.KEY=VALUE, e.g. "
                                 "complementary.max_load=1.0", param_hint="--param")
    return policy, key, toml_literal(raw.strip())


def _envelope(meta: dict[str, Any], warnings: list[str], payload: dict[str, Any]) -> str:
    """The --json envelope; a ValueError where a value is not finite (no `NaN` or
    `Infinity`, which are not JSON)."""
    return json.dumps({"meta": meta, "errors": [], "warnings": warnings, **payload},
                      indent=2, allow_nan=False)


def _is_trace(path: str) -> bool:
    """Whether `-w path` names a recorded trace (`*.jsonl`, in any case), not a
    workload file or suite name."""
    return path.lower().endswith(".jsonl")


#: a policy's method -> its extension point: an exception raised within one names it
_POLICY_METHODS = {"place": "pairing", "order": "slice", "admit": "admission"}


def _policy_raised(exc: BaseException) -> str | None:
    """"slice policy 'X' raised KeyError: ..." where `exc` came out of a policy's own
    `place`, `order` or `admit` (the outermost such call of its traceback), else None.
    The simulator names a raising `place` or `admit` itself (`SimError`); a slice
    policy's `order` is called by the lease table at every lease pass, too often to
    wrap, so it is told here, from the traceback, at no cost to the run."""
    tb = exc.__traceback__
    while tb is not None:
        kind = _POLICY_METHODS.get(tb.tb_frame.f_code.co_name)
        policy = tb.tb_frame.f_locals.get("self")
        if kind is not None and isinstance(policy, registry.PROTOCOLS[kind][0]):
            name = getattr(policy, "name", "?")  # its protocol's: it has one
            return f"{kind} policy {name!r} raised {type(exc).__name__}: {exc}"
        tb = tb.tb_next
    return None


def _rejections(runs: list[JobRun]) -> list[str]:
    """One warning for the jobs admission rejected, with the first's reason."""
    rejected = sorted((r for r in runs if not r.admitted),
                      key=lambda r: (r.job.submit_s, r.job.job_id))
    if not rejected:
        return []
    first = rejected[0]
    return [f"{len(rejected)} job(s) rejected by admission (first: job {first.job.job_id}: "
            f"{first.reject_reason or 'no reason given'})"]


def _refusals(pairing: str, refused: list[tuple[int, int, str]]) -> list[str]:
    """One warning for the joins the simulator refused, with the first's reason."""
    if not refused:
        return []
    job, pool, why = refused[0]
    return [f"pairing policy {pairing!r}: {len(refused)} join(s) refused, the jobs opened "
            f"pools of their own (first: job {job} to pool {pool}: {why})"]


@click.command("simulate")
@click.option("-w", "--workload", default="polytrace-mix", show_default=True,
              help="suite name (workloads/NAME.json), a workload file (.json), or a "
                   "recorded trace (.jsonl in any case, from `slurmrl report --trace`)")
@click.option("--arrivals", type=click.Choice(["steady", "bursty"]), default="steady",
              show_default=True)
@click.option("--pairing", "--policy", "pairing", default="complementary", show_default=True,
              help=f"pairing policy: {', '.join(registry.names('pairing'))}")
@click.option("--slice", "slice_name", default=None,
              help=f"slice policy: {', '.join(registry.names('slice'))} (default: "
                   "round-robin, or the one the pairing policy fixes)")
@click.option("--admission", default="site-limits", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--jobs", "n_jobs", type=click.IntRange(min=1, max=JOBS_MAX), default=None,
              help=f"number of jobs, 1..{JOBS_MAX:,} (default: the workload's)")
@click.option("--load", "load_scale", type=click.FloatRange(min=LOAD_MIN, max=LOAD_MAX),
              default=1.0, show_default=True, callback=finite,
              help=f"scale the arrival rate, {LOAD_MIN:g}..{LOAD_MAX:g} (below, the "
                   "cluster is idle between jobs and the metrics say nothing)")
@click.option("--max-slowdown", "max_slowdown",
              type=click.FloatRange(min=1.0, max=MAX_SLOWDOWN), default=None,
              callback=finite,
              help="what-if: every job's slowdown limit, as if each user asked "
                   f"--rl-max-slowdown=X, 1..{MAX_SLOWDOWN:g} (the site's cap rises to X "
                   "if lower)")
@click.option("--gpus-per-node", "gpus_per_node", type=click.IntRange(min=1), default=None,
              help="what-if: GPUs per node, or per NVLink domain where it spans nodes (72 "
                   "on an NVL72 rack); a staggered pool must fit one (default: the "
                   "workload's, 8)")
@click.option("--floating", is_flag=True,
              help="pools may float (site config slurm.floating_pools): members of one "
                   "GPU count take whichever whole window is free, and rollout tails pack "
                   "onto the fewest GPUs of the pool (as the controller packs tails of "
                   "one-GPU rollout replicas, services.rollout_replica_gpus = 1)")
@click.option("--held-tails", is_flag=True,
              help="with --floating: a rollout keeps its window through its tail, as the "
                   "controller runs floating pools whose rollouts are one engine")
@click.option("--floating-across-nodes", is_flag=True,
              help="with --floating: a floating pool's windows may span nodes, as the "
                   "controller's with slurm.floating_across_nodes (without, a pool holds "
                   "at most --gpus-per-node GPUs)")
@click.option("--nodes", "on_nodes", is_flag=True,
              help="what-if: the cluster's GPUs are nodes of --gpus-per-node, and a pool "
                   "takes all of its GPUs from one node, as the controller's pools (the "
                   "policy told each node's free GPUs; a job larger than a node is "
                   "refused); without, one bag of GPUs. Not with --floating")
@click.option("--max-jobs-per-pool", "max_jobs_per_pool", type=click.IntRange(1, 1000),
              default=None, help="what-if: the site's max_jobs_per_pool (default: the "
                                 "workload's)")
@click.option("--park-always", is_flag=True,
              help="what-if: price every hand-off between jobs as a park and an activate, "
                   "as the controller's default does (it parks the other jobs' services "
                   "on a granted lease's GPUs even where their models fit beside it); "
                   "without: a context switch where the models fit GPU memory together")
@click.option("--parked-host-mem", "parked_host_mem", default=None, metavar="SIZE",
              help="what-if: host memory per pool for parked state, e.g. 64G, above 0 (the "
                   "controller's [limits] parked_host_mem_per_node, whose 0, half the "
                   "node's memory, the simulator cannot know; default: the workload's, "
                   "none for most: unlimited; a trace's (-w FILE.jsonl): 64G, the "
                   "controller's where Slurm reports no node memory)")
@click.option("--rl-steps/--no-rl-steps", "declare_steps", default=True, show_default=True,
              help="every job declares its step count (#SBATCH --rl-steps), which lets "
                   "pairing judge a pool member on its whole run; or none does")
@click.option("--assume-profiles", is_flag=True,
              help="with -w FILE.jsonl: give each job without --rl-profile the one that "
                   "matches its recorded run (what if every user had written one)")
@click.option("--replay", "replay_path", type=click.Path(exists=True, dir_okay=False),
              default=None, help="replay a recorded phase trace (JSONL) instead")
@click.option("--param", "param_args", multiple=True, metavar="POLICY.KEY=VALUE",
              help="a policy parameter, as [policies.params.POLICY] in the site config")
@click.option("--no-check", is_flag=True, help="skip the lease invariant check per event")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
def simulate(workload: str, arrivals: str, pairing: str, slice_name: str | None,
             admission: str,
             seed: int, n_jobs: int | None, load_scale: float, max_slowdown: float | None,
             gpus_per_node: int | None, floating: bool, held_tails: bool,
             floating_across_nodes: bool, on_nodes: bool, max_jobs_per_pool: int | None,
             park_always: bool, parked_host_mem: str | None,
             declare_steps: bool, assume_profiles: bool,
             replay_path: str | None, param_args: tuple[str, ...], no_check: bool,
             as_json: bool) -> None:
    """Simulate RL jobs multiplexed on a cluster; report GPU-hours saved and slowdowns."""
    from slurmrl.sim.engine import SimError
    from slurmrl.sim.runner import SliceConflict, slice_for
    from slurmrl.sim.workload import WorkloadError

    host_mem: int | None = None
    if parked_host_mem is not None:
        from slurmrl.config.units import parse_size

        try:
            host_mem = parse_size(parked_host_mem)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--parked-host-mem") from None
        if host_mem == 0:  # not a budget of 0 bytes: the simulator knows no node memory
            raise click.BadParameter(
                f"{parked_host_mem!r}: the controller's 0 means half the node's memory, "
                "which the simulator does not know; give a size such as 512G",
                param_hint="--parked-host-mem")
    parsed = [(arg, *_param(arg)) for arg in param_args]
    params: dict[str, dict[str, Any]] = {}
    for _, policy, key, value in parsed:
        params.setdefault(policy, {})[key] = value

    try:
        for kind, name in (("pairing", pairing), ("slice", slice_name),
                           ("admission", admission)):
            if name is not None and name not in registry.REGISTRY[kind] and ":" not in name:
                raise click.UsageError(f"unknown {kind} policy {name!r}; valid: "
                                       f"{', '.join(registry.names(kind))}")
        ctx = click.get_current_context()
        given = {p for p in ("workload", "pairing", "arrivals", "seed", "n_jobs", "load_scale")
                 if ctx.get_parameter_source(p) is not ParameterSource.DEFAULT}
        if replay_path is not None and (
                given or max_slowdown is not None or params or gpus_per_node is not None
                or floating or on_nodes or max_jobs_per_pool is not None
                or not declare_steps or no_check
                or park_always or host_mem is not None
                or ctx.get_parameter_source("admission") is not ParameterSource.DEFAULT):
            raise click.UsageError("--replay runs a trace's jobs as recorded, in their "
                                   "recorded pools (only --slice applies); to place them by "
                                   "a pairing policy use -w FILE.jsonl --pairing NAME")
        if (held_tails or floating_across_nodes) and not floating:
            raise click.UsageError("--held-tails and --floating-across-nodes describe "
                                   "floating pools: add --floating")
        if on_nodes and floating:
            raise click.UsageError("--nodes lays pools out on nodes; a floating pool's "
                                   "windows are laid out by --floating itself: give one")
        if assume_profiles and (replay_path is not None or not _is_trace(workload)):
            raise click.UsageError("--assume-profiles applies to a recorded trace given "
                                   "as -w FILE.jsonl")
        if _is_trace(workload) and given & {"arrivals", "seed", "n_jobs", "load_scale"}:
            raise click.UsageError("--arrivals, --seed, --jobs and --load draw a synthetic "
                                   "workload; a trace's jobs arrive as recorded")
        # the slice policy that runs: a pairing policy that fixes its own takes no other
        if replay_path is not None:
            sname = slice_name or "round-robin"
        else:
            sname = slice_for(registry.load("pairing", pairing, params.get(pairing)),
                              slice_name)
        for arg, policy, _, _ in parsed:
            if policy not in (pairing, sname, admission):
                raise click.BadParameter(
                    f"{arg!r}: {policy!r} is none of this run's policies ({pairing}, "
                    f"{sname}, {admission})", param_hint="--param")
        t0 = time.perf_counter()
        warnings: list[str] = []
        if replay_path is not None:
            from slurmrl.sim.replay import replay_with_warnings

            replayed, warnings = replay_with_warnings(replay_path, slice_name=sname)
            payload: dict[str, Any] = {"replay": replayed}
            meta: dict[str, Any] = {"command": "simulate", "replay": replay_path,
                                    "slice": sname}
        else:
            payload, meta, warnings = _run(workload, arrivals, pairing, sname, admission,
                                           seed, n_jobs, load_scale, max_slowdown,
                                           gpus_per_node, declare_steps, assume_profiles,
                                           not no_check, as_json, params, floating,
                                           max_jobs_per_pool, held_tails,
                                           floating_across_nodes, park_always, host_mem,
                                           on_nodes)
        meta["wall_s"] = f"{time.perf_counter() - t0:.3f}"
    except SliceConflict as exc:
        raise click.UsageError(str(exc)) from None
    except Exception as exc:
        if isinstance(exc, click.ClickException):
            raise
        said = _policy_raised(exc)
        if said is None and not isinstance(exc, WorkloadError | ValueError | SimError):
            raise  # the simulator's own bug: its traceback
        click.echo(f"slurmrl simulate: {said or exc}", err=True)
        sys.exit(1)
    if as_json:
        try:
            out = _envelope(meta, warnings, payload)
        except ValueError as exc:  # a NaN or infinite metric: not JSON
            click.echo(f"slurmrl simulate: the results hold a value JSON cannot carry "
                       f"({exc}); no JSON printed", err=True)
            sys.exit(1)
        click.echo(out)
        return
    for w in warnings:
        click.echo(f"slurmrl simulate: warning: {w}", err=True)
    rows = payload.get("metrics") or payload["replay"]
    click.echo(" ".join(f"{k}={v}" for k, v in meta.items() if v is not None))
    for k, v in rows.items():
        click.echo(f"{k:22s} {v:.4f}" if isinstance(v, float) else f"{k:22s} {v}")


def _run(workload: str, arrivals: str, pairing: str, slice_name: str, admission: str,
         seed: int, n_jobs: int | None, load_scale: float, max_slowdown: float | None,
         gpus_per_node: int | None, declare_steps: bool, assume_profiles: bool, check: bool,
         quiet: bool, params: dict[str, dict[str, Any]], floating: bool = False,
         max_jobs_per_pool: int | None = None, held_tails: bool = False,
         across_nodes: bool = False, park_always: bool = False,
         host_mem: int | None = None, on_nodes: bool = False,
         ) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    from slurmrl.sim.runner import config_for, run_jobs, trace_config, with_max_slowdown
    from slurmrl.sim.workload import generate, load

    if _is_trace(workload):
        from slurmrl.sim.replay import trace_jobs

        jobs = trace_jobs(workload, assume_profiles)
        cfg = trace_config(jobs, check)
        meta: dict[str, Any] = {"command": "simulate", "workload": workload,
                                "source": "trace", "assume_profiles": assume_profiles}
    else:
        w = load(workload)
        jobs = generate(w, seed, arrivals, n_jobs, load_scale)
        cfg = config_for(w, check)
        meta = {"command": "simulate", "workload": w.name, "arrivals": arrivals,
                "seed": seed}
    if max_slowdown is not None:
        jobs, cfg = with_max_slowdown(jobs, cfg, max_slowdown)
    cfg = replace(cfg, declare_steps=declare_steps,
                  gpus_per_node=cfg.gpus_per_node if gpus_per_node is None else gpus_per_node,
                  floating=floating, pack_tails=floating and not held_tails,
                  floating_across_nodes=across_nodes)
    if max_jobs_per_pool is not None:
        cfg = replace(cfg, limits=replace(cfg.limits, max_jobs_per_pool=max_jobs_per_pool))
    cfg = replace(cfg, park_always=park_always, nodes=on_nodes)
    if host_mem is not None:
        cfg = replace(cfg, host_mem_per_pool_bytes=host_mem,
                      limits=replace(cfg.limits, parked_host_mem_bytes=host_mem))
    meta.update({"pairing": pairing, "slice": slice_name, "admission": admission,
                 "jobs": len(jobs), "cluster_gpus": cfg.gpus, "gpus_per_node": cfg.gpus_per_node,
                 "max_slowdown": max_slowdown, "rl_steps": declare_steps,
                 "floating": floating, "tails": None if not floating
                 else "held" if held_tails else "packed",
                 "floating_across_nodes": across_nodes if floating else None,
                 "max_jobs_per_pool": cfg.limits.max_jobs_per_pool,
                 "park_always": park_always, "nodes": on_nodes,
                 "parked_host_mem_bytes": cfg.host_mem_per_pool_bytes,
                 **({"params": params} if params else {})})
    if quiet or not sys.stderr.isatty():
        result = run_jobs(jobs, cfg, pairing, slice_name, admission, params)
    else:
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task(f"simulating {meta['workload']}", total=1.0)
            result = run_jobs(jobs, cfg, pairing, slice_name, admission, params,
                              progress=lambda f: bar.update(task, completed=f))
    meta["slice"] = result.slice_name
    pools = [*result.sim.closed, *result.sim.pools.values()]
    unused = ([f"--floating: pairing policy {pairing!r} formed no floating pool (only a "
               "policy whose placements ask for one forms any)"]
              if floating and not any(p.windows is not None for p in pools) else [])
    return ({"metrics": result.metrics.as_dict()}, meta,
            _refusals(pairing, result.sim.refused)
            + _rejections(list(result.sim.runs.values())) + unused)
