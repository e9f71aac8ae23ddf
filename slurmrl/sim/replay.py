"""Replay recorded phase timings through the simulator and compare makespans.

Trace format (JSONL, documented in workloads/README.md): the first line is a header
`{"format": "slurmrl-trace/1", "jobs": [{"job_id", "gpus", "layout", "rollout_gpus",
"model", "pool"}]}` (optional per job: "user", "group" (its `--rl-group`), "profile" as
written in `--rl-profile`, "max_slowdown", "steps" as declared in `--rl-steps`, "mux":
"off"; its recorded pool's "pool_gpus", "floating" and the job's "gpu_offset" in it;
optional for the trace: "warnings"); every other line is one phase observation
`{"job_id", "phase", "requested_at", "granted_at", "released_at", "gpus"}` (epoch
seconds; `phase` a GPU phase; gaps are inferred between a release and the job's next
request).

Each job's solo timeline is rebuilt from its own observations: GPU phases last
`released_at - granted_at` (their waits removed), gaps last from one release to the
next request. The jobs then run in the recorded groups (`pool` in the header; jobs
without one share pool 0) from their first request, under the given slice policy, and
the predicted makespan is compared with the recorded one. A group's pool is opened as
recorded (`RecordedPool`): of its `pool_gpus` (absent, as in traces written before
them: its jobs' GPU count), each member on its window from `gpu_offset` (a staggered
pool), or floating (whole windows of its members' GPUs, as `slurmrl simulate
--floating` runs them, tails held); a pool the simulator cannot run as recorded is
refused (`WorkloadError` naming it and why), not replayed otherwise. `trace_jobs`
gives the same jobs without their groups, as a workload any pairing policy can place
(`slurmrl simulate -w FILE.jsonl --pairing NAME`: what a policy would have saved on
these runs).

Known limits: a recorded phase includes the park/activate it paid, so the replay adds
the simulator's handoff cost on top (a small overestimate); no tail shrink is replayed;
nodes are not: a pool is as many interchangeable GPUs as it had.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from policies.base import Action, ClusterSnapshot, Placement, PoolMode, SiteLimits
from slurmrl.directives import GPUS_MAX, MAX_SLOWDOWN, STEPS_MAX, DirectiveError, parse_profile
from slurmrl.model import GPU_PHASES, Layout, Mux, Phase, PhasePrior
from slurmrl.sim import schema as sc
from slurmrl.sim.workload import Segment, SimJob, WorkloadError, read_text

TRACE_FORMAT = "slurmrl-trace/1"
#: how a file that is no trace was read: the CLI reads `-w *.jsonl` as one
READ_AS = "read as a trace: a workload file must not be named *.jsonl"
#: an observation's times (seconds: since the epoch, or since the trace's start) at most
#: this far from 0; beyond, their differences overflow and every metric is NaN
TIME_MAX_S = 1e12

#: a recorded pool's GPUs at most (`pool_gpus`): as a workload's `cluster.gpus`
POOL_GPUS_MAX = 1_000_000


def _flag(v: Any, key: str) -> None:
    if not isinstance(v, bool):
        raise sc.must(key, "true or false", v)


#: the header's line (workloads/README.md, "Trace format"); a job's `steps` is checked
#: where it is read, with the --rl-steps range, and its `rollout_gpus` against its `gpus`
HEADER = sc.table({
    "format": (True, sc.anything),
    "warnings": (False, sc.list_of(sc.text)),
    "jobs": (True, sc.list_of(sc.table({
        "job_id": (True, sc.whole(0)),
        "gpus": (True, sc.whole(1, hi=GPUS_MAX)),
        "layout": (False, sc.one_of(*(str(x) for x in Layout))),
        "rollout_gpus": (False, sc.optional(sc.whole(1, hi=GPUS_MAX))),
        "model": (False, sc.text),
        "pool": (False, sc.optional(sc.whole(0))),
        "user": (False, sc.text),
        "profile": (False, sc.optional(sc.text)),
        "max_slowdown": (False, sc.optional(sc.number(1.0, strict=False,
                                                      hi=MAX_SLOWDOWN))),
        "steps": (False, sc.anything),
        "mux": (False, sc.optional(sc.one_of(*(str(x) for x in Mux)))),
        "group": (False, sc.optional(sc.text)),
        "pool_gpus": (False, sc.optional(sc.whole(1, hi=POOL_GPUS_MAX))),
        "floating": (False, sc.optional(_flag)),
        "gpu_offset": (False, sc.optional(sc.whole(0, hi=POOL_GPUS_MAX - 1))),
    }, strict=False))),
}, strict=False)
#: one phase observation line
OBSERVATION = sc.table({
    "job_id": (True, sc.whole(0)),
    "phase": (True, sc.one_of(*(str(x) for x in GPU_PHASES))),
    "requested_at": (True, sc.number(-TIME_MAX_S, strict=False, hi=TIME_MAX_S)),
    "granted_at": (True, sc.number(-TIME_MAX_S, strict=False, hi=TIME_MAX_S)),
    "released_at": (True, sc.number(-TIME_MAX_S, strict=False, hi=TIME_MAX_S)),
}, strict=False)


@dataclass(frozen=True)
class RecordedPool:
    """A group's pool as it ran: its GPUs, whether it floated (then `gpus` is whole
    windows of its members' GPU count), each member's first GPU in it (a fixed pool)."""

    gpus: int
    floating: bool = False
    offsets: dict[int, int] = field(default_factory=dict)


class FixedGroups:
    """Pairing by a recorded grouping: the first job of a group opens its pool, the
    others join it; a group with a `RecordedPool` gets that pool (else one of its
    first job's GPUs)."""

    name = "fixed-groups"
    mode = PoolMode.LEASE

    def __init__(self, groups: dict[int, int],
                 pools: dict[int, RecordedPool] | None = None) -> None:
        self.groups = groups
        self.pools = pools or {}

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        by_group = {}
        for pool in snapshot.pools:
            for m in pool.members:
                by_group[self.groups[m.job_id]] = pool.pool_id
        out = []
        opened: dict[int, int] = {}
        for job in snapshot.waiting:
            g = self.groups[job.job_id]
            rec = self.pools.get(g, RecordedPool(job.request.gpus))
            first = rec.offsets.get(job.job_id, 0)
            if g in by_group:  # a floating pool's JOIN names its size: windows come back
                out.append(Placement(job.job_id, Action.JOIN, by_group[g],
                                     rec.gpus if rec.floating else None,
                                     gpu_offset=first, floating=rec.floating))
            else:
                pid = opened.setdefault(g, -1 - len(opened))
                out.append(Placement(job.job_id, Action.OPEN, pid, rec.gpus,
                                     gpu_offset=first, floating=rec.floating))
        return out


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A trace's header and observations, checked: a `WorkloadError` naming the file (and
    the line, or the header's job) for a file that cannot be read, a malformed header or
    line, a job listed twice, an observation of a job the header does not list, or no
    observation at all."""
    # (line number in the file, line): blank lines are skipped, and counted
    lines = [(n, ln) for n, ln in enumerate(read_text(path, "trace").splitlines(), 1)
             if ln.strip()]
    if not lines:
        raise WorkloadError(f"{path}: empty trace")
    parsed: list[tuple[int, Any]] = []
    for n, ln in lines:
        try:
            parsed.append((n, json.loads(ln)))
        except json.JSONDecodeError as exc:
            raise WorkloadError(f"{path}:{n}: not a JSON line: {exc.msg} (column "
                                f"{exc.colno}; {READ_AS})") from exc
    header = parsed[0][1]
    numbered = parsed[1:]
    obs = [o for _, o in numbered]
    if not isinstance(header, dict) or header.get("format") != TRACE_FORMAT:
        raise WorkloadError(f"{path}: first line must be a header with format "
                            f"{TRACE_FORMAT!r} ({READ_AS})")
    sc.check(HEADER, header, f"{path}: header")
    first: dict[int, int] = {}
    for k, spec in enumerate(header["jobs"]):
        jid = spec["job_id"]
        if jid in first:
            raise WorkloadError(f"{path}: header: jobs[{k}].job_id {jid} is listed twice "
                                f"(also jobs[{first[jid]}]); a job has one entry")
        first[jid] = k
    for i, o in numbered:
        sc.check(OBSERVATION, o, f"{path}:{i}")
        if not o["requested_at"] <= o["granted_at"] <= o["released_at"]:
            raise WorkloadError(f"{path}:{i}: times must satisfy requested <= granted <= "
                                "released")
        if o["job_id"] not in first:
            raise WorkloadError(f"{path}:{i}: job {o['job_id']} is not in the header's "
                                "jobs; every observed job must be listed there")
    if not obs:
        raise WorkloadError(f"{path}: a trace with no leases (a header only)")
    return header, obs


def jobs_from_trace(header: dict[str, Any], obs: list[dict[str, Any]],
                    where: str = "trace") -> tuple[list[SimJob], dict[int, int]]:
    """The jobs of a checked trace (`read_trace`) and their recorded groups; a
    `WorkloadError` naming `where` (the file) and the job for a job the simulator could
    not run (one with no recorded GPU time among them)."""
    by_job: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for o in obs:
        by_job[int(o["job_id"])].append(o)
    t0 = min(o["requested_at"] for o in obs)
    jobs, groups = [], {}
    for spec in header["jobs"]:
        jid = int(spec["job_id"])
        mine = sorted(by_job.get(jid, []), key=lambda o: o["requested_at"])
        if not mine:
            raise WorkloadError(f"{where}: job {jid} has no observations")
        steps: list[list[Segment]] = [[]]
        for prev, o in zip([None, *mine[:-1]], mine, strict=True):
            phase = Phase(o["phase"])
            # a rollout after the step's training or sync starts the next step
            if phase is Phase.ROLLOUT and any(x.phase in (Phase.TRAIN, Phase.SYNC)
                                              for x in steps[-1]):
                steps.append([])
            if prev is not None and o["requested_at"] > prev["released_at"]:
                steps[-1].append(Segment(Phase.IDLE, o["requested_at"] - prev["released_at"]))
            steps[-1].append(Segment(phase, o["released_at"] - o["granted_at"]))
        if not any(seg.seconds > 0 for step in steps for seg in step if seg.phase.needs_gpu):
            raise WorkloadError(f"{where}: job {jid} has no recorded GPU time: its leases "
                                "last 0 seconds in all (granted_at == released_at)")
        gpus = int(spec["gpus"])
        layout = Layout(spec.get("layout", "colocated"))
        given = spec.get("rollout_gpus")
        if layout is Layout.DISAGGREGATED and gpus < 2:
            raise WorkloadError(f"{where}: header: job {jid}: a disaggregated job needs at "
                                f"least 2 GPUs (a rollout set and a trainer set), got "
                                f"gpus {gpus}")
        if layout is Layout.DISAGGREGATED and given is not None and not 1 <= given < gpus:
            raise WorkloadError(f"{where}: header: job {jid}: rollout_gpus must be at "
                                f"least 1 and fewer than its gpus ({gpus}), got {given}")
        if layout is Layout.COLOCATED and given not in (None, gpus):
            raise WorkloadError(f"{where}: header: job {jid}: rollout_gpus {given} differs "
                                f"from its gpus ({gpus}); a colocated job rolls out on all "
                                "of its GPUs (leave rollout_gpus out)")
        rg = int(given or (gpus if layout is Layout.COLOCATED else gpus // 2))
        prior = None
        if spec.get("profile"):
            try:
                prior = parse_profile(str(spec["profile"]))
            except DirectiveError as exc:
                raise WorkloadError(f"{where}: header: job {jid}: {exc}") from None
        ms = spec.get("max_slowdown")
        declared = spec.get("steps")
        if declared is not None and (isinstance(declared, bool)
                                     or not isinstance(declared, int)
                                     or not 1 <= declared <= STEPS_MAX):
            raise WorkloadError(f"{where}: header: job {jid}: steps must be a whole number "
                                f"1..{STEPS_MAX} (its --rl-steps), got {declared!r}")
        jobs.append(SimJob(jid, "trace", str(spec.get("user", "trace")),
                           mine[0]["requested_at"] - t0, str(spec.get("model", "tiny")),
                           _params(str(spec.get("model", "tiny"))), gpus, layout, rg,
                           tuple(tuple(x) for x in steps), (), prior,
                           None if ms is None else float(ms), spec.get("mux") == "off",
                           declared, spec.get("group")))
        groups[jid] = int(spec.get("pool") or 0)  # null or absent: the shared pool 0
    return jobs, groups


def trace_jobs(path: str | Path, assume_profiles: bool = False) -> list[SimJob]:
    """A recorded trace's jobs as a workload: each job's solo timeline (waits removed,
    split into steps at each rollout that follows a training or sync), arriving when it
    first asked for GPUs; the recorded pools are left out, for a pairing policy to
    place the jobs anew (`slurmrl simulate -w FILE.jsonl`).

    `assume_profiles`: a job submitted without `--rl-profile` gets one that matches its
    recorded run (phase shares and mean step over the whole run): what the policy
    would do had every user given an accurate profile."""
    header, obs = read_trace(path)
    jobs = jobs_from_trace(header, obs, str(path))[0]
    if assume_profiles:
        jobs = [j if j.prior is not None else replace(j, prior=recorded_profile(j, str(path)))
                for j in jobs]
    return jobs


def recorded_profile(job: SimJob, where: str = "trace") -> PhasePrior:
    """The `--rl-profile` that describes `job`'s run: each phase's share of its time and
    its mean step (`where`: the trace, for the error of a job with no recorded time)."""
    total: dict[Phase, float] = defaultdict(float)
    for step in job.steps:
        for seg in step:
            total[seg.phase] += seg.seconds
    wall = sum(total.values())
    if wall <= 0:
        raise WorkloadError(f"{where}: job {job.job_id} has no recorded time")
    shares = tuple((ph, t / wall) for ph, t in sorted(total.items()) if t > 0)
    return PhasePrior(shares, wall / len(job.steps))


def _params(model: str) -> float:
    from slurmrl.gpu.estimate import parse_param_count

    try:
        return float(parse_param_count(model))
    except ValueError:
        return 1e9


def recorded_pools(header: dict[str, Any], jobs: list[SimJob], groups: dict[int, int],
                   where: str = "trace") -> dict[int, RecordedPool]:
    """Each group's pool as the header records it (`pool_gpus`, `floating`,
    `gpu_offset`; a group whose jobs give none is left out: a pool of their GPUs), or
    a `WorkloadError` naming `where` and the pool the simulator cannot run as recorded."""
    specs = {int(s["job_id"]): s for s in header["jobs"]}
    members: dict[int, list[SimJob]] = defaultdict(list)
    for j in jobs:
        members[groups[j.job_id]].append(j)
    out = {}
    for pool, mine in sorted(members.items()):
        gpus = {j.gpus for j in mine}
        if len(gpus) > 1:
            raise WorkloadError(f"{where}: header: the jobs of pool {pool} have different "
                                f"GPU counts ({', '.join(map(str, sorted(gpus)))}); a "
                                "recorded pool's members have one")
        g = gpus.pop()
        for key in ("pool_gpus", "floating"):
            given = {specs[j.job_id].get(key) for j in mine}
            if len(given) > 1:
                shown = ", ".join(sorted(map(json.dumps, given)))
                raise WorkloadError(f"{where}: header: the jobs of pool {pool} give different "
                                    f"{key} ({shown}); a recorded pool has one")
        size = specs[mine[0].job_id].get("pool_gpus")
        floating = bool(specs[mine[0].job_id].get("floating"))
        if size is None and not floating:
            continue  # a trace from before these keys: a pool of its jobs' GPUs, as then
        size = int(size or g)
        name = f"{where}: pool {pool}"
        if floating:
            split = next((j for j in mine if j.rollout_gpus != j.gpus), None)
            if split is not None:
                raise WorkloadError(f"{name} floated with disaggregated job "
                                    f"{split.job_id}: the simulator floats pools of "
                                    "colocated jobs only; it cannot replay this pool")
            if size % g:
                raise WorkloadError(f"{name} floated with {size} GPUs, not whole windows "
                                    f"of its jobs' {g}: it cannot be replayed")
            out[pool] = RecordedPool(size, True)
            continue
        offsets = {j.job_id: int(specs[j.job_id].get("gpu_offset") or 0) for j in mine}
        for jid, first in offsets.items():
            if first + g > size:
                raise WorkloadError(f"{name}: job {jid}'s {g} GPUs from GPU {first} do not "
                                    f"fit the pool's {size} GPUs")
        out[pool] = RecordedPool(size, False, offsets)
    return out


def replay(path: str | Path, slice_name: str = "round-robin") -> dict[str, float]:
    """Predicted vs recorded makespan of the traced jobs, in their recorded groups."""
    return replay_with_warnings(path, slice_name)[0]


def replay_with_warnings(path: str | Path, slice_name: str = "round-robin",
                         ) -> tuple[dict[str, float], list[str]]:
    """`replay`, and the trace's warnings (its header's: a recorded pool some of whose
    members it leaves out, so that the replay runs the others without them)."""
    from policies import registry
    from policies.admission_limits import SiteLimitsAdmission
    from slurmrl.sim.engine import SimConfig, Simulation
    from slurmrl.sim.metrics import compute

    header, obs = read_trace(path)
    jobs, groups = jobs_from_trace(header, obs, str(path))
    pools = recorded_pools(header, jobs, groups, str(path))
    recorded = max(o["released_at"] for o in obs) - min(o["requested_at"] for o in obs)
    # every recorded group whole: the simulator refuses a join beyond the site's most
    largest = max(Counter(groups.values()).values())
    # GPUs for every job and every recorded pool at once; nodes as large as the cluster:
    # the recorded pools ran, and a trace does not say where
    gpus = sum(j.gpus for j in jobs) + sum(p.gpus for p in pools.values())
    cfg = SimConfig(gpus=gpus, limits=SiteLimits(max_jobs_per_pool=max(largest, 2)),
                    gpus_per_node=gpus, floating=any(p.floating for p in pools.values()))
    sim = Simulation(jobs, cfg, FixedGroups(groups, pools),
                     lambda: registry.load("slice", slice_name), SiteLimitsAdmission())
    sim.run()
    if sim.refused:  # the recorded grouping did not run: its makespan is not the replay's
        job, _, why = sim.refused[0]
        raise WorkloadError(f"{path}: job {job} cannot share recorded pool {groups[job]} "
                            f"here ({why}); a recorded pool's members may share")
    m = compute(sim)
    predicted = m.makespan_h * 3600
    return ({"recorded_makespan_s": recorded, "predicted_makespan_s": predicted,
             "error": (predicted - recorded) / recorded if recorded else 0.0,
             "used_gpu_s": m.used_gpu_h * 3600, "dedicated_gpu_s": m.dedicated_gpu_h * 3600},
            [str(w) for w in header.get("warnings", [])])
