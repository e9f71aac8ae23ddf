"""Workload files and the synthetic RL jobs they describe.

A workload file (JSON, `format: "slurmrl-workload/1"`, documented in workloads/README.md)
names the cluster, the site limits, the arrival processes (`steady`: Poisson; `bursty`:
Poisson bursts of several jobs at once) and job classes; `validate` checks every key
(the tables below, `slurmrl.sim.schema`) before anything is drawn. `generate` draws jobs from it,
seeded: arrival time, GPU count, layout, model, and every step's phase durations.

The RL job model, per step: rollout (one or several turns separated by tool stalls, the
stalls on top of the class's step and shares), reward gap, train (log-prob + update),
sync, idle gap. Rollout lengths drift over the
job's steps (`drift`: relative growth from first to last step) with per-step lognormal
noise (`noise_cv`). The rollout's long tail: response lengths follow the class's length
distribution (PolyTrace's math mixture, or a lognormal with p99 ~ 10x median); a rollout
of G GPUs may shrink to G/2, G/4, ... 1 GPUs once the still-active sequences fit, at
the instants the length quantiles give. Every figure a suite file uses cites
shared/research/rl-workloads.md or is labelled an assumption in its `sources`.

Known limits: no correlation between jobs' phases; rollout speed on fewer GPUs than
asked scales the bulk by G/g (memory-bound decode), the tail keeps its length.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from policies.base import SiteLimits
from slurmrl.config.schema import LimitsConfig
from slurmrl.directives import GPUS_MAX, MAX_SLOWDOWN, STEP_MAX_S, STEPS_MAX
from slurmrl.model import Layout, Phase, PhasePrior
from slurmrl.sim import schema as sc

FORMAT = "slurmrl-workload/1"
#: GPUs per node (an HGX board) where a workload does not say
DEFAULT_GPUS_PER_NODE = 8
#: the suite: workloads/ of the source tree, else the copy an install puts in
#: <prefix>/share/slurmrl/workloads (setup.cfg data_files), else of the current directory
WORKLOAD_DIR = next(
    (p for p in (Path(__file__).resolve().parents[2] / "workloads",
                 Path(sys.prefix) / "share" / "slurmrl" / "workloads",
                 Path("workloads").resolve())
     if p.is_dir()),
    Path("workloads").resolve(),
)

#: PolyTrace math (235B, n=385,024): component weights and means of output tokens; the
#: per-component sd (3,780) is chosen so the mixture's sd is the published 5,943.
MATH_MIXTURE = ((0.36, 4959.0), (0.37, 9175.0), (0.07, 12720.0), (0.19, 17655.0))
MATH_COMPONENT_SD = 3780.0
#: lognormal sigma of "heavy" tails: 0.75 puts the last 10% of responses at ~70% of the
#: rollout's time and p99 at ~5.7x the median, between Seer (last 10% take ~50% of the
#: time) and Laminar (p99 ~ 10x median): a modelling choice, see workloads/README.md
HEAVY_SIGMA = 0.75


class WorkloadError(ValueError):
    """A workload file is malformed; the message names the file and the key."""


def read_text(path: str | Path, what: str) -> str:
    """The text of a workload or trace file, or a `WorkloadError` naming it (missing, a
    directory, unreadable, not UTF-8)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkloadError(f"{path}: not a {what} (not UTF-8 text: byte "
                            f"{exc.object[exc.start]:#04x} at offset {exc.start})") from None
    except OSError as exc:
        raise WorkloadError(f"{path}: cannot read the {what}: "
                            f"{exc.strerror or exc}") from None


@dataclass(frozen=True)
class Segment:
    """One phase of one step: `seconds` at full speed on its GPU set (or a gap)."""

    phase: Phase
    seconds: float


@dataclass(frozen=True)
class SimJob:
    """One synthetic RL job, fully drawn: what happens to it is up to the pool."""

    job_id: int
    cls: str
    user: str
    submit_s: float
    model: str
    params: float  #: parameters
    gpus: int
    layout: Layout
    rollout_gpus: int  #: == gpus when colocated
    steps: tuple[tuple[Segment, ...], ...]
    tail: tuple[tuple[float, int], ...]  #: (fraction of rollout time, GPUs still needed)
    prior: PhasePrior | None  #: the job's --rl-profile, if it gave one
    max_slowdown: float | None
    mux_off: bool
    #: the `--rl-steps` it declared, where that differs from its steps or is known to
    #: (a recorded trace's); None: its step count, when the simulation has jobs declare
    declared_steps: int | None = None
    #: its `--rl-group` (None: none): it shares only with jobs of the same group
    group: str | None = None

    @property
    def trainer_gpus(self) -> int:
        return self.gpus if self.layout is Layout.COLOCATED else self.gpus - self.rollout_gpus

    def set_size(self, phase: Phase) -> int:
        """GPUs `phase` runs on: as `RlRequest.gpus_for` (a disaggregated sync: the
        trainer set; the rollout engine loads the staged weights when next activated)."""
        if self.layout is Layout.COLOCATED:
            return self.gpus
        return self.rollout_gpus if phase is Phase.ROLLOUT else self.trainer_gpus

    def solo_s(self) -> float:
        """Wall time alone on dedicated GPUs: every phase back to back."""
        return sum(seg.seconds for step in self.steps for seg in step)

    def rollout_gpu_s(self, seconds: float) -> float:
        """GPU-seconds of a full-speed rollout of `seconds` with its tail consolidated."""
        total, prev = 0.0, 0.0
        keep = self.rollout_gpus
        for frac, k in self.tail:
            total += (frac - prev) * keep
            prev, keep = frac, k
        return seconds * (total + (1.0 - prev) * keep)

    def busy_gpu_s(self) -> float:
        """GPU-seconds its GPU phases need: GPU count of each set, the tail consolidated."""
        total = 0.0
        for step in self.steps:
            for seg in step:
                if seg.phase is Phase.ROLLOUT:
                    total += self.rollout_gpu_s(seg.seconds)
                elif seg.phase.needs_gpu:
                    total += seg.seconds * self.set_size(seg.phase)
        return total


@dataclass(frozen=True)
class Workload:
    name: str
    data: Mapping[str, Any]
    path: Path | None

    @property
    def cluster_gpus(self) -> int:
        return int(self.data["cluster"]["gpus"])

    @property
    def gpus_per_node(self) -> int:
        return int(self.data["cluster"].get("gpus_per_node", DEFAULT_GPUS_PER_NODE))

    @property
    def gpu_mem_bytes(self) -> int:
        return int(float(self.data["cluster"].get("gpu_mem_gib", 80)) * 2**30)

    @property
    def host_mem_per_pool_bytes(self) -> int | None:
        v = self.data["cluster"].get("host_mem_per_pool_gib")
        return None if v is None else int(float(v) * 2**30)

    @property
    def limits(self) -> Mapping[str, Any]:
        """Its `limits`, each one it does not set at the controller's default
        (`DEFAULT_LIMITS`)."""
        return limits_of(self.data)

    @property
    def n_jobs(self) -> int:
        return int(self.data["jobs"])


#: one job class (workloads/README.md, "Per class"). Steps at most `--rl-steps`'s
#: bound, durations at most `--rl-profile`'s step bound, `max_slowdown` in
#: `--rl-max-slowdown`'s range: a larger value would make the run hang or its metrics
#: infinite
#: rollout turns per step a class may draw (each turn is simulated: a bound, not a hang)
TURNS_MAX = 1000
#: arrivals: at least one job per million hours (below, every metric is of an idle
#: cluster), bursts of at most 10,000 jobs on average (a larger mean underflows the draw)
RATE_MIN_PER_H = 1e-6
BURST_MEAN_MAX = 10_000
#: jobs one run draws at most (`jobs`, `--jobs`): each is held in memory and simulated
JOBS_MAX = 1_000_000
#: a cluster's GPUs (`cluster.gpus`) and GPUs per node at most: each GPU of a pool is a
#: member of its lease table's sets
CLUSTER_GPUS_MAX = 1_000_000
#: GiB of a GPU's memory, and of a pool's host memory, at most (a larger value overflows
#: the byte counts the policies compare)
GPU_MEM_GIB_MAX = 65_536
HOST_MEM_GIB_MAX = 1 << 30
#: per-step lognormal noise (a coefficient of variation) and drift from first to last
#: step, at most: beyond, durations overflow to infinity and every metric is NaN
NOISE_CV_MAX = 100.0
DRIFT_MAX = 1000.0

CLASS: sc.Table = {
    "name": (True, sc.text),
    "weight": (True, sc.number(0.0, hi=sc.WEIGHT_MAX)),
    "model": (True, sc.drawn(sc.model, ranged=False)),
    "gpus": (True, sc.drawn(sc.whole(1, hi=GPUS_MAX))),
    "layout": (True, sc.one_of(*(str(x) for x in Layout))),
    "rollout_fraction": (False, sc.number(0.0, hi=1.0)),
    "steps": (True, sc.drawn(sc.whole(1, hi=STEPS_MAX))),
    "step_s": (True, sc.drawn(sc.number(0.0, hi=STEP_MAX_S))),
    "shares": (True, sc.shares),
    "sync_s": (False, sc.number(0.0, strict=False, hi=STEP_MAX_S)),
    "turns": (False, sc.drawn(sc.whole(1, hi=TURNS_MAX))),
    "tool_calls": (False, sc.drawn(sc.whole(0, hi=TURNS_MAX - 1))),
    "tool_gap_s": (False, sc.drawn(sc.number(0.0, strict=False, hi=STEP_MAX_S))),
    "tail": (False, sc.one_of("math", "heavy", "none")),
    "drift": (False, sc.number(-1.0, hi=DRIFT_MAX)),
    "noise_cv": (False, sc.number(0.0, strict=False, hi=NOISE_CV_MAX)),
    "profile_hint": (False, sc.number(0.0, strict=False, hi=1.0)),
    "max_slowdown": (False, sc.optional(sc.drawn(sc.number(1.0, strict=False,
                                                           hi=MAX_SLOWDOWN)))),
    "mux_off": (False, sc.number(0.0, strict=False, hi=1.0)),
}


def _arrivals(bursty: bool) -> sc.Check:
    return sc.table({"process": (False, sc.anything),
                     "rate_per_h": (True, sc.number(RATE_MIN_PER_H, strict=False)),
                     **({"burst_mean": (False, sc.number(1.0, strict=False,
                                                         hi=BURST_MEAN_MAX))} if bursty
                        else {})})


#: a workload file (workloads/README.md, "Format")
WORKLOAD = sc.table({
    "format": (True, sc.anything),  # checked first, with its own message
    "name": (True, sc.text),
    "description": (False, sc.anything),
    "sources": (False, sc.anything),
    "cluster": (True, sc.table({
        "gpus": (True, sc.whole(1, hi=CLUSTER_GPUS_MAX)),
        "gpus_per_node": (False, sc.whole(1, hi=CLUSTER_GPUS_MAX)),
        "gpu_mem_gib": (False, sc.number(0.0, hi=GPU_MEM_GIB_MAX)),
        "host_mem_per_pool_gib": (False, sc.optional(sc.number(0.0, hi=HOST_MEM_GIB_MAX))),
    })),
    "jobs": (True, sc.whole(1, hi=JOBS_MAX)),
    "arrivals": (True, sc.table({"steady": (True, _arrivals(False)),
                                 "bursty": (True, _arrivals(True))})),
    "limits": (False, sc.table({
        "max_slowdown": (False, sc.number(1.0, strict=False, hi=MAX_SLOWDOWN)),
        "default_max_slowdown": (False, sc.number(1.0, strict=False, hi=MAX_SLOWDOWN)),
        "max_jobs_per_pool": (False, sc.whole(1)),
        "max_gpus_per_job": (False, sc.whole(1)),
    })),
    "classes": (True, sc.list_of(sc.table(CLASS))),
})


#: a workload's limits where it does not set them: the controller's `[limits]` defaults
#: (`slurmrl.config.LimitsConfig`, as a default `Config` gives `placement.site_limits`) of
#: the `SiteLimits` fields of the same name, so that a workload file without `limits`
#: simulates a site that runs the controller as shipped
DEFAULT_LIMITS: Mapping[str, Any] = {
    f.name: f.default for f in dataclasses.fields(LimitsConfig)
    if f.name in SiteLimits.__dataclass_fields__}


def limits_of(data: Mapping[str, Any]) -> dict[str, Any]:
    """A workload's (`data`'s) limits: its `limits`, over `DEFAULT_LIMITS`."""
    return {**DEFAULT_LIMITS, **data.get("limits", {})}


def load(name_or_path: str) -> Workload:
    """A workload by suite name (workloads/NAME.json) or by path."""
    p = Path(name_or_path)
    if not p.suffix and not p.is_file():  # a suite name (a file is read as it is)
        p = WORKLOAD_DIR / f"{name_or_path}.json"
    if not p.is_file():
        names = sorted(x.stem for x in WORKLOAD_DIR.glob("*.json"))
        raise WorkloadError(f"no workload {name_or_path!r}; suite: {', '.join(names)}")
    try:
        data = json.loads(read_text(p, "workload file"))
    except json.JSONDecodeError as exc:
        raise WorkloadError(f"{p}: not JSON: {exc} (read as a workload file: a trace "
                            "must be named *.jsonl)") from exc
    return validate(data, str(p), p)


def validate(data: Any, where: str = "workload", path: Path | None = None) -> Workload:
    """`data` as a `Workload`, or a `WorkloadError` naming `where` and the first bad key
    (every key's type and range: the tables above)."""
    if not isinstance(data, Mapping):
        raise WorkloadError(f"{where}: must be a JSON object (a workload), got "
                            f"{type(data).__name__}")
    if data.get("format") != FORMAT:
        raise WorkloadError(f"{where}: format must be {FORMAT!r}, got {data.get('format')!r}")
    sc.check(WORKLOAD, data, where)
    lim = SiteLimits(**limits_of(data))
    if lim.default_max_slowdown > lim.max_slowdown:  # as the site config refuses it
        unset = "default_max_slowdown" not in data.get("limits", {})
        raise WorkloadError(f"{where}: limits.default_max_slowdown must not exceed "
                            f"limits.max_slowdown ({lim.max_slowdown}), got "
                            f"{lim.default_max_slowdown}"
                            + (" (the controller's default: set it)" if unset else ""))
    # a job that admission accepts but no pool could ever hold would wait forever
    cluster = data["cluster"]["gpus"]
    most = lim.max_gpus_per_job
    for i, c in enumerate(data["classes"]):
        if "turns" in c and "tool_calls" in c:
            raise WorkloadError(
                f"{where}: classes[{i}] sets both turns and tool_calls: give one (tool_calls "
                "c: c tool stalls and c + 1 generation turns a step; turns t: t - 1 stalls)")
        spec = c["gpus"]
        spans = [tuple(spec)] if isinstance(spec, list) else [(g, g) for g in sc.values(spec)]
        if Layout(c["layout"]) is Layout.DISAGGREGATED and min(lo for lo, _ in spans) < 2:
            # else the run fails at the first such draw, depending on the seed and --jobs
            raise WorkloadError(
                f"{where}: classes[{i}].gpus can draw jobs of 1 GPU, but a disaggregated "
                f"class's jobs need at least 2 (a rollout set and a trainer set), got "
                f"{json.dumps(spec)}: draw from 2 up, or make the class colocated")
        widest = max(hi for _, hi in spans)
        if widest > most and "max_gpus_per_job" not in data.get("limits", {}):
            # a file written before the controller's defaults applied here: its jobs
            # would be rejected silently, its figures changed
            raise WorkloadError(
                f"{where}: classes[{i}].gpus draws jobs of up to {widest} GPUs, over the "
                f"controller's default limits.max_gpus_per_job ({most}), which this file "
                "does not set: set it (1024 to admit them, as the suite does; the default "
                "to see them refused)")
        for lo, hi in spans:
            if max(lo, cluster + 1) <= min(hi, most):
                raise WorkloadError(
                    f"{where}: classes[{i}].gpus draws jobs of {max(lo, cluster + 1)} GPUs, "
                    f"more than cluster.gpus ({cluster}), which limits.max_gpus_per_job "
                    f"({most}) admits: no pool could ever hold one; lower it, or set "
                    "limits.max_gpus_per_job to refuse them")
    return Workload(str(data["name"]), data, path)


@lru_cache(maxsize=4)
def _lengths(kind: str) -> tuple[float, ...]:
    """20,000 response lengths of a tail kind, seeded (decode time ~ length)."""
    rng = random.Random(12345)
    if kind == "math":
        ws = [w for w, _ in MATH_MIXTURE]
        return tuple(
            min(28_000.0, max(1.0, rng.gauss(rng.choices(MATH_MIXTURE, ws)[0][1],
                                             MATH_COMPONENT_SD)))
            for _ in range(20_000)
        )
    return tuple(math.exp(rng.gauss(0.0, HEAVY_SIGMA)) for _ in range(20_000))


@lru_cache(maxsize=64)
def tail_points(kind: str, gpus: int, batch: int = 512) -> tuple[tuple[float, int], ...]:
    """(fraction of rollout time, GPUs needed from then on), for k = G/2, G/4, ..., 1.

    A sequence's decode time is proportional to its length, the rollout lasts as long
    as the batch's longest response (quantile 1 - 1/batch), and `k` GPUs suffice once
    at most k/G of the sequences are still active (they move to the GPUs kept).
    """
    if kind == "none" or gpus <= 1:
        return ()
    xs = sorted(_lengths(kind))

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    top = q(1.0 - 1.0 / batch)
    points = []
    k = gpus // 2
    while k >= 1:
        points.append((min(1.0, q(1.0 - k / gpus) / top), k))
        k //= 2
    return tuple(points)


def _replica_count(gpus: int, replica_gpus: int) -> int:
    """How many rollout replicas of `replica_gpus` GPUs a set of `gpus` runs: the
    controller's split (`slurmrl.controller.residency.replica_sets`; 1, one engine,
    where `replica_gpus` is 0, not smaller than the set, or does not divide it)."""
    from slurmrl.controller.residency import replica_sets

    return len(replica_sets(range(gpus), replica_gpus))


@lru_cache(maxsize=64)
def replica_tail_points(kind: str, gpus: int, replica_gpus: int, batch: int = 512,
                        trials: int = 200) -> tuple[tuple[float, int], ...]:
    """Tail points of a rollout run as data-parallel replicas of `replica_gpus` GPUs,
    with no sequence migrating: the batch is split evenly over the G/r replicas, each
    replica's GPUs free when its longest response is done, the rollout ends with the
    batch's longest (as one engine would). (fraction of rollout time, GPUs still needed)
    after each replica but the last finishes; the fractions are the mean order
    statistics of the replicas' finish over the batch's end, over `trials` seeded
    batches. This is what `slurmrl.client.replicas.ReplicatedRollout` gives with
    `micro_batch = batch / replicas`. One engine (`_replica_count` 1) has no tail points.
    """
    n_rep = _replica_count(gpus, replica_gpus)
    if kind == "none" or n_rep == 1:
        return ()
    pool, rng = _lengths(kind), random.Random(54321)
    per = max(1, batch // n_rep)
    acc = [0.0] * n_rep
    for _ in range(trials):
        ends = sorted(max(rng.choices(pool, k=per)) for _ in range(n_rep))
        for i, e in enumerate(ends):
            acc[i] += e / ends[-1]
    return tuple((acc[i] / trials, (n_rep - 1 - i) * replica_gpus) for i in range(n_rep - 1))


def consolidated_replica_points(tail: tuple[tuple[float, int], ...], gpus: int,
                                replica_gpus: int) -> tuple[tuple[float, int], ...]:
    """A consolidated tail (`tail_points`) as rollout replicas of `replica_gpus` GPUs run
    it when the unfinished sequences move between rounds
    (`ReplicatedRollout.generate(round_tokens=...)`): each point's GPU count rounded up
    to whole replicas, points that free no replica dropped. One engine (the set, not
    split: see `replica_tail_points`) keeps no point."""
    if _replica_count(gpus, replica_gpus) == 1:
        return ()
    out: list[tuple[float, int]] = []
    held = gpus
    for frac, k in tail:
        need = -(-k // replica_gpus) * replica_gpus
        if need < held:
            out.append((frac, need))
            held = need
    return tuple(out)


def _pick(rng: random.Random, spec: Any) -> Any:
    """A value from a spec: scalar, [lo, hi] uniform range, or {"choices", "weights"}."""
    if isinstance(spec, Mapping):
        return rng.choices(spec["choices"], spec.get("weights"))[0]
    if isinstance(spec, Sequence) and not isinstance(spec, str) and len(spec) == 2:
        lo, hi = spec
        if isinstance(lo, int) and isinstance(hi, int):
            return rng.randint(lo, hi)
        return rng.uniform(float(lo), float(hi))
    return spec


def _params(model: str) -> float:
    from slurmrl.gpu.estimate import parse_param_count

    return float(parse_param_count(model))


def _draw_job(rng: random.Random, c: Mapping[str, Any], job_id: int, submit: float) -> SimJob:
    model = str(_pick(rng, c["model"]))
    gpus = int(_pick(rng, c["gpus"]))
    layout = Layout(c["layout"])
    if layout is Layout.DISAGGREGATED and gpus < 2:
        raise WorkloadError(f"class {c['name']!r}: a disaggregated job needs at least 2 GPUs "
                            f"(a rollout set and a trainer set), drew {gpus}")
    rollout_gpus = gpus if layout is Layout.COLOCATED else min(gpus - 1, max(1, int(
        gpus * c.get("rollout_fraction", 0.5))))
    n_steps = int(_pick(rng, c["steps"]))
    step_s = float(_pick(rng, c["step_s"]))
    shares = {Phase(k): float(v) for k, v in c["shares"].items()}
    drift, cv = float(c.get("drift", 0.0)), float(c.get("noise_cv", 0.1))
    # `tool_calls`: c calls a step, each a stall between generation turns (c + 1 turns);
    # `turns`: generation turns, a stall between each two (turns - 1 stalls)
    calls = c.get("tool_calls")
    turns = c.get("turns", 1)
    tool = c.get("tool_gap_s", [0.0, 0.0])
    sigma = math.sqrt(math.log(1 + cv * cv))

    def noisy(x: float) -> float:
        return x * math.exp(rng.gauss(-sigma * sigma / 2, sigma)) if x > 0 else 0.0

    steps = []
    for k in range(n_steps):
        grow = 1.0 + drift * k / max(1, n_steps - 1)
        segs: list[Segment] = []
        m = int(_pick(rng, calls)) + 1 if calls is not None else int(_pick(rng, turns))
        roll = noisy(step_s * shares.get(Phase.ROLLOUT, 0.0) * grow)
        for t in range(m):
            segs.append(Segment(Phase.ROLLOUT, roll / m))
            if t < m - 1:
                segs.append(Segment(Phase.IDLE, float(_pick(rng, tool))))
        for ph in (Phase.REWARD, Phase.TRAIN, Phase.SYNC, Phase.IDLE):
            d = noisy(step_s * shares.get(ph, 0.0) * (grow if ph is Phase.REWARD else 1.0))
            if ph is Phase.SYNC:
                d = max(d, float(c.get("sync_s", 0.0)))
            if d > 0:
                segs.append(Segment(ph, d))
        steps.append(tuple(segs))
    prior = None
    if rng.random() < float(c.get("profile_hint", 0.0)):
        # the user's --rl-profile, as one who profiled a run of it would write it: the
        # job's own phase shares (drift and tool stalls included) and mean step, the step
        # off by up to 15% either way
        err = 1.0 + rng.uniform(-0.15, 0.15)
        own = own_profile(steps)
        prior = PhasePrior(own.shares, (own.step_s or 0.0) * err)
    ms = c.get("max_slowdown")
    return SimJob(
        job_id, str(c["name"]), f"user{rng.randint(1, 20)}", submit, model, _params(model),
        gpus, layout, rollout_gpus, tuple(steps),
        tail_points(str(c.get("tail", "heavy")), rollout_gpus), prior,
        None if ms is None else float(_pick(rng, ms)), rng.random() < float(c.get("mux_off", 0.0)),
    )


def own_profile(steps: Sequence[Sequence[Segment]]) -> PhasePrior:
    """The `--rl-profile` that describes a job's drawn `steps` exactly: each phase's share
    of their time (tool stalls are `idle`) and their mean step, in seconds."""
    total: dict[Phase, float] = {}
    for step in steps:
        for seg in step:
            total[seg.phase] = total.get(seg.phase, 0.0) + seg.seconds
    wall = sum(total.values())
    if not steps or wall <= 0:
        raise WorkloadError("a job with no drawn time has no profile")
    return PhasePrior(tuple((ph, t / wall) for ph, t in sorted(total.items()) if t > 0),
                      wall / len(steps))


def _geometric(rng: random.Random, mean: float) -> int:
    """A geometric draw on 0, 1, 2, ... with mean `mean` (> 0): failures before the first
    success at p = 1 / (mean + 1), by inversion (one uniform draw)."""
    u = 1.0 - rng.random()  # in (0, 1]
    return int(math.log(u) / math.log(mean / (mean + 1.0)))


def generate(w: Workload, seed: int, arrivals: str = "steady", n_jobs: int | None = None,
             load_scale: float = 1.0) -> list[SimJob]:
    """Draw the workload's jobs: Poisson arrivals, seeded. `bursty`: bursts of
    1 + geometric(mean `burst_mean` - 1) jobs at a time (mean `burst_mean`), the bursts
    Poisson at `rate_per_h / burst_mean`, so the mean rate is the steady one's."""
    if arrivals not in ("steady", "bursty"):
        raise WorkloadError(f"arrivals must be 'steady' or 'bursty', got {arrivals!r}")
    if not (math.isfinite(load_scale) and load_scale > 0):
        raise WorkloadError(f"load_scale must be a finite number > 0, got {load_scale}")
    rng = random.Random(seed)
    a = w.data["arrivals"][arrivals]
    rate = float(a["rate_per_h"]) * load_scale / 3600.0
    burst = float(a.get("burst_mean", 1.0)) if arrivals == "bursty" else 1.0
    classes = list(w.data["classes"])
    weights = [float(c["weight"]) for c in classes]
    jobs: list[SimJob] = []
    t = 0.0
    total = w.n_jobs if n_jobs is None else n_jobs
    while len(jobs) < total:
        t += rng.expovariate(rate / burst)
        size = 1 if burst <= 1 else 1 + _geometric(rng, burst - 1)
        for _ in range(min(size, total - len(jobs))):
            c = rng.choices(classes, weights)[0]
            jobs.append(_draw_job(rng, c, len(jobs) + 1, t))
    return jobs
