"""The report's arithmetic, on plain value types: per job, per pool, and the ledger.

Inputs (`ReportInput`) are what the colocation DB records — jobs, pools, per-GPU lease
holds, phase requests and reward points — so the same numbers come out whether they are
read from the DB file, from the controller's RPC, or built by hand in a test.
`compute()` is pure: it reads no clock (the caller passes `now`) and no file.

Definitions (also in docs/user-guide.md):
- wall time of a job: `ended_at - registered_at` (to `now` while it runs);
- dedicated GPU-seconds: the job's GPUs × the time from its first phase request to its
  end — what a dedicated allocation would have cost. Not from its registration: a driver
  registers as its CPU job starts, while its pool may still be pending in Slurm or
  waiting for a partner, when a dedicated allocation would cost nothing. 0 before any
  request; none where the caller may not read its requests (another user's, through the
  controller). `slurmrl status`'s DEDIC starts there too, as its SLOWDN does;
- granted GPU-seconds: the sum over its lease holds of (end - start) per GPU (a shrink
  ends a GPU's hold early; a hold still open counts to `now`);
- saved: `1 - granted / dedicated`; 0 for a `--rl-mux=off` job (its pool was its own:
  the GPU time it left idle could not go to anyone else); none for a job never placed
  in a pool (it waited, it did not save 100%) or whose leases the caller may not read
  (another user's, through the controller);
- totals: over the jobs placed whose leases were read and that made a phase request
  (before one a job has nothing granted or dedicated); a `--rl-mux=off` job counts as
  granted its whole dedicated allocation (so the totals' saved agrees with the rows'),
  not its GPU-S: `Totals.charged_whole` names such jobs;
- slowdown: wall time / wall time of the same job (matched by name) in a baseline run
  (a dedicated `--rl-mux=off` run); `None` — shown as "n/a" — when no baseline is given
  or the name is not in it. Never estimated;
- wait: `granted_at - requested_at` of each granted lease; requests never granted
  are counted apart; none, nor a lease count, where the caller may not read its
  requests (another user's, through the controller);
- pool utilisation: leased GPU-seconds / (pool GPUs × time the pool was open), over
  every hold in the pool, whichever jobs the report lists (`ReportInput.holds` may hold
  other jobs' holds for that: they count in no job row);
- handoffs: the instants a pool GPU passed from one job's lease to another job's. With
  `park_others` (the default) each is where the controller parked the previous job's
  services and activated the next one's. They are derived from lease history, not
  recorded park/activate calls (the DB keeps only the current residency).

Known limits: a baseline matches jobs by name only (duplicate names in the baseline are
ambiguous and give "n/a" with a warning).
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from slurmrl.model import dedicated_gpu_s


@dataclass(frozen=True)
class JobInfo:
    """One RL job as the report needs it."""

    job_id: int
    user: str | None  #: None: hidden (another user's, where the site hides names)
    gpus: int
    registered_at: float
    name: str = ""
    state: str = "R"
    ended_at: float | None = None
    pool_id: int | None = None
    dedicated: bool = False  #: ran with --rl-mux=off (a pool of its own)
    #: its leases were read (False: another user's job, read through the controller,
    #: whose GPU-seconds are not the caller's to see)
    visible: bool = True


@dataclass(frozen=True)
class PoolInfo:
    pool_id: int
    gpus: int
    opened_at: float
    closed_at: float | None = None
    dedicated: bool = False
    #: GPU-seconds Slurm allocated to it, where its size changed (a floating pool's
    #: windows); None: `gpus` for its whole life
    gpu_s: float | None = None
    #: the jobs placed in it, listed in the report's jobs or not
    members: tuple[int, ...] = ()


@dataclass(frozen=True)
class Hold:
    """One pool GPU held by one lease from `start` to `end` (None: still held)."""

    lease_id: int
    job_id: int
    pool_id: int
    gpu: int
    phase: str
    start: float
    end: float | None = None


@dataclass(frozen=True)
class Request:
    """A phase request; granted requests became leases."""

    lease_id: int
    job_id: int
    pool_id: int
    phase: str
    requested_at: float
    granted_at: float | None = None
    ended_at: float | None = None
    state: str = "released"


@dataclass(frozen=True)
class RewardPoint:
    """The mean reward of one RL step, as the driver reported it."""

    job_id: int
    step: int
    at: float
    reward: float


@dataclass(frozen=True)
class ReportInput:
    jobs: tuple[JobInfo, ...]
    pools: tuple[PoolInfo, ...] = ()
    holds: tuple[Hold, ...] = ()
    requests: tuple[Request, ...] = ()
    rewards: tuple[RewardPoint, ...] = ()
    now: float = 0.0


@dataclass(frozen=True)
class WaitStats:
    count: int
    total_s: float
    p50_s: float | None
    p95_s: float | None
    never_granted: int


@dataclass(frozen=True)
class JobReport:
    job_id: int
    user: str | None
    name: str
    state: str
    pool_id: int | None
    gpus: int
    wall_s: float
    granted_gpu_s: float | None  #: None: another user's, not visible to the caller
    #: from its first phase request (0 before one); None where not visible
    dedicated_gpu_s: float | None
    #: fraction; 0 for a --rl-mux=off job; None when dedicated is 0, before the job was
    #: placed in a pool, or where its GPU-seconds are not visible
    saved: float | None
    slowdown: float | None  #: None: no baseline for this job
    baseline_wall_s: float | None
    wait: WaitStats | None  #: None: another user's, not visible to the caller
    leases: int | None  #: None: another user's, not visible to the caller
    rewards: tuple[tuple[int, float, float], ...]  #: (step, at, reward)
    reward_first: float | None  #: mean of the first min(5, n//2) reported steps
    reward_last: float | None  #: mean of the last min(5, n//2) reported steps


@dataclass(frozen=True)
class PoolReport:
    pool_id: int
    gpus: int
    open_s: float
    leased_gpu_s: float
    utilisation: float | None  #: None when the pool was open for no time
    members: tuple[int, ...]
    handoffs: int
    dedicated: bool


@dataclass(frozen=True)
class Totals:
    """Over the jobs counted: placed in a pool, their GPU-seconds visible to the caller,
    with a phase request made."""

    jobs: int
    granted_gpu_s: float
    dedicated_gpu_s: float
    saved: float | None
    pool_gpu_s: float
    #: jobs in a pool of their own (--rl-mux=off) counted in `granted_gpu_s` at their
    #: whole dedicated GPU-seconds, not at what they leased
    charged_whole: tuple[int, ...] = ()


@dataclass(frozen=True)
class Handoff:
    pool_id: int
    gpu: int
    at: float
    from_job: int
    to_job: int


@dataclass(frozen=True)
class Report:
    jobs: tuple[JobReport, ...]
    pools: tuple[PoolReport, ...]
    totals: Totals
    handoffs: tuple[Handoff, ...]
    warnings: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["warnings"] = list(self.warnings)
        return d


def quantile(xs: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default); None for no data."""
    if not xs:
        return None
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def handoffs(holds: Iterable[Hold]) -> list[Handoff]:
    """Where a pool GPU's holder changed from one job to another, in time order."""
    by_gpu: dict[tuple[int, int], list[Hold]] = defaultdict(list)
    for h in holds:
        by_gpu[(h.pool_id, h.gpu)].append(h)
    out = []
    for (pool_id, gpu), hs in by_gpu.items():
        hs.sort(key=lambda h: (h.start, h.lease_id))
        for prev, cur in itertools.pairwise(hs):
            if prev.job_id != cur.job_id:
                out.append(Handoff(pool_id, gpu, cur.start, prev.job_id, cur.job_id))
    return sorted(out, key=lambda x: (x.at, x.pool_id, x.gpu))


def _held(h: Hold, now: float) -> float:
    end = h.end if h.end is not None else now
    return max(0.0, end - h.start)


def compute(
    data: ReportInput, baseline: Mapping[str, float] | None = None,
    ambiguous: Iterable[str] = (),
) -> Report:
    """The report of `data`; `baseline` maps job name -> wall seconds of its solo run."""
    warnings: list[str] = []
    ambiguous = set(ambiguous)
    now = data.now
    granted: dict[int, float] = defaultdict(float)
    leased_in_pool: dict[int, float] = defaultdict(float)
    # the dedicated clock's start: its first phase request (a hold starts after its own)
    first: dict[int, float] = {}
    for job_id, at in itertools.chain(((r.job_id, r.requested_at) for r in data.requests),
                                      ((h.job_id, h.start) for h in data.holds)):
        first[job_id] = min(at, first.get(job_id, at))
    for h in data.holds:
        s = _held(h, now)
        granted[h.job_id] += s
        leased_in_pool[h.pool_id] += s
    waits: dict[int, list[float]] = defaultdict(list)
    never: dict[int, int] = defaultdict(int)
    for r in data.requests:
        if r.granted_at is not None:
            waits[r.job_id].append(max(0.0, r.granted_at - r.requested_at))
        elif r.state != "waiting":
            never[r.job_id] += 1
    rewards: dict[int, list[RewardPoint]] = defaultdict(list)
    for pt in data.rewards:
        rewards[pt.job_id].append(pt)

    jobs = []
    for j in sorted(data.jobs, key=lambda j: j.job_id):
        end = j.ended_at if j.ended_at is not None else now
        wall = max(0.0, end - j.registered_at)
        start = first.get(j.job_id)
        dedic = dedicated_gpu_s(j.gpus, j.registered_at, start, end)
        g = granted.get(j.job_id, 0.0)
        placed = j.pool_id is not None or g > 0
        base = None
        if baseline is not None:
            if j.name in ambiguous:
                warnings.append(f"job {j.job_id}: name {j.name!r} appears more than once "
                                "in the baseline; slowdown n/a")
            elif j.name and j.name in baseline:
                base = baseline[j.name]
            else:
                warnings.append(f"job {j.job_id}: no job named {j.name!r} in the baseline; "
                                "slowdown n/a")
        ws = waits.get(j.job_id, [])
        pts = sorted(rewards.get(j.job_id, []), key=lambda p: (p.step, p.at))
        vals = [p.reward for p in pts]
        w = min(5, max(1, len(vals) // 2))  # first/last window; never overlapping
        jobs.append(JobReport(
            job_id=j.job_id, user=j.user, name=j.name, state=j.state, pool_id=j.pool_id,
            gpus=j.gpus, wall_s=wall, granted_gpu_s=g if j.visible else None,
            dedicated_gpu_s=dedic if j.visible else None,
            # a --rl-mux=off job holds its pool alone: what it left idle nobody else
            # could use, so it saved nothing; a job never placed saved nothing either
            # (it waited: not 100%)
            saved=(None if not j.visible or not placed else 0.0 if j.dedicated
                   else (1 - g / dedic) if dedic > 0 else None),
            slowdown=(wall / base) if base else None, baseline_wall_s=base,
            wait=(WaitStats(len(ws), sum(ws), quantile(ws, 0.5), quantile(ws, 0.95),
                            never.get(j.job_id, 0)) if j.visible else None),
            leases=len(ws) if j.visible else None,
            rewards=tuple((p.step, p.at, p.reward) for p in pts),
            reward_first=sum(vals[:w]) / w if vals else None,
            reward_last=sum(vals[-w:]) / w if vals else None,
        ))

    hand = handoffs(data.holds)
    members: dict[int, set[int]] = defaultdict(set)
    for h in data.holds:
        members[h.pool_id].add(h.job_id)
    for j in data.jobs:
        if j.pool_id is not None:
            members[j.pool_id].add(j.job_id)
    for p in data.pools:
        members[p.pool_id].update(p.members)
    pools = []
    pool_total = 0.0
    for p in sorted(data.pools, key=lambda p: p.pool_id):
        open_s = max(0.0, (p.closed_at if p.closed_at is not None else now) - p.opened_at)
        cap = p.gpu_s if p.gpu_s is not None else p.gpus * open_s
        pool_total += cap
        pools.append(PoolReport(
            pool_id=p.pool_id, gpus=p.gpus, open_s=open_s,
            leased_gpu_s=leased_in_pool.get(p.pool_id, 0.0),
            utilisation=leased_in_pool.get(p.pool_id, 0.0) / cap if cap > 0 else None,
            members=tuple(sorted(members.get(p.pool_id, ()))),
            handoffs=sum(1 for x in hand if x.pool_id == p.pool_id), dedicated=p.dedicated,
        ))
    # the totals count what the rows' SAVED counts: a --rl-mux=off job as costing its
    # whole dedicated allocation; neither another user's job (its GPU-seconds unread),
    # nor a job never placed (it used nothing, and would save 100%), nor one placed
    # that made no phase request yet (nothing granted, nothing dedicated)
    counted = [(r, info) for r, info in zip(jobs, sorted(data.jobs, key=lambda j: j.job_id),
                                            strict=True)
               if r.granted_gpu_s is not None and info.job_id in first
               and (info.pool_id is not None or r.granted_gpu_s > 0)]
    tg = sum((r.dedicated_gpu_s if info.dedicated else r.granted_gpu_s) or 0.0
             for r, info in counted)
    td = sum(r.dedicated_gpu_s or 0.0 for r, _ in counted)
    totals = Totals(len(counted), tg, td, (1 - tg / td) if td > 0 else None, pool_total,
                    tuple(r.job_id for r, info in counted if info.dedicated))
    return Report(tuple(jobs), tuple(pools), totals, tuple(hand), tuple(warnings))


def baseline_from_report(report: Report) -> tuple[dict[str, float], set[str]]:
    """Wall seconds by job name of a (dedicated) run, and the names seen twice."""
    return baseline_from_pairs((j.name, j.wall_s) for j in report.jobs)


def baseline_from_pairs(pairs: Iterable[tuple[str, float]]) -> tuple[dict[str, float], set[str]]:
    out: dict[str, float] = {}
    dup: set[str] = set()
    for name, wall in pairs:
        if not name:
            continue
        if name in out:
            dup.add(name)
        out[name] = float(wall)
    for name in dup:
        del out[name]
    return out, dup
