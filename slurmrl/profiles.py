"""Profiles: per-job statistics of phase durations, the input to pairing.

A `ProfileBuilder` is fed phase observations as the job runs (`observe(phase, start,
end)` for a phase's busy or gap interval, or `observe_lease(...)` with a lease's
requested/granted/released times, from which the gap since the previous release is
inferred). It keeps a sliding window of the most recent `window` durations per phase,
so quantiles follow the drift of lengths as the policy learns, and an exponentially
weighted mean per phase. `build()` returns a frozen `Profile`.

Before any observation a profile comes from a prior: the user's `--rl-profile`
(`PhasePrior`: phase shares of a step and the step period), else a default by model
size (`prior_for_model`). Per phase, the prior is used until `min_obs` observations of
that phase exist.

Terms: *busy* is time in GPU phases (rollout, train, sync) per step; *gap* is time in
reward/idle per step; a *step* starts at a rollout that follows a train or sync (or at
the first observation). `shape` is the ordered phase sequence of the last complete step,
used to simulate several GPU phases per step (agentic jobs alternate rollout turns and
tool stalls).

A phase that recurs within a step (rollout turns, tool stalls) is described by its
totals per complete step once `min_obs` steps are seen: its quantiles are those of the
per-step totals, divided by its mean occurrences per step, so `per_step(phase, q)` is the
q-quantile of a step's time in it. (Before, and for phases seen at most once a step, the
quantiles are those of single occurrences; a turn's length varies with the number of
turns its step took, and its p90 times the mean count overstated a step's p90 rollout
by a third on the agentic workloads.) The window forgets anything older than `window`
occurrences, or steps for per-step totals.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from slurmrl.model import GPU_PHASES, Phase, PhasePrior

#: phases whose time counts as a gap (no GPU needed)
GAP_PHASES: tuple[Phase, ...] = (Phase.REWARD, Phase.IDLE)

#: default shares of a colocated step when the user gave no --rl-profile
#: (verl DAPO 7B on 32 GPUs: generation 45%, log-prob + update 48%, other 7%;
#: shared/research/rl-workloads.md)
DEFAULT_SHARES: tuple[tuple[Phase, float], ...] = (
    (Phase.ROLLOUT, 0.45), (Phase.REWARD, 0.07), (Phase.TRAIN, 0.47), (Phase.SYNC, 0.01),
)

#: share of a rollout's GPU set its lease holds on average once the tail shrinks it, before
#: any observation (Seer: the last 10% of requests take ~50% of rollout time: half the
#: rollout on the whole set, half on the few GPUs the last 10% need, ~0.5 + 0.5 * 0.1)
ROLLOUT_PRIOR_GPU_SHARE = 0.55


@dataclass(frozen=True)
class PhaseStats:
    """Durations (seconds) of one phase of one job: count and quantiles of the window."""

    phase: Phase
    n: int  #: observations in the window (0 = from the prior)
    per_step: float  #: mean occurrences of this phase per step
    p10: float
    p50: float
    p90: float
    ewma: float  #: exponentially weighted mean, follows drift fastest
    gpu_share: float = 1.0  #: mean share of its GPU set the phase's lease held (tail shrink)
    #: mean share of its GPU set's time the phase's lease held before it first shrank
    #: (set-equivalent, as `gpu_share`: the rollout before its tail); None where not
    #: observed
    head_share: float | None = None

    def quantile(self, q: float) -> float:
        """Duration at quantile q in [0, 1], interpolated between p10, p50 and p90."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile must be in [0, 1], got {q}")
        if q <= 0.5:
            t = max(0.0, (q - 0.1) / 0.4)
            return self.p10 + (self.p50 - self.p10) * t
        t = min(1.0, (q - 0.5) / 0.4)
        return self.p50 + (self.p90 - self.p50) * t


@dataclass(frozen=True)
class Profile:
    """What pairing knows of a job's phases. Durations in seconds."""

    phases: Mapping[Phase, PhaseStats]
    shape: tuple[Phase, ...]  #: phase order of one step (last complete one, or the prior's)
    source: str  #: "observed", "prior", or "mixed"
    steps: int = 0  #: complete steps observed

    def per_step(self, phase: Phase, q: float = 0.5) -> float:
        """Wall seconds per step in `phase` at quantile q."""
        s = self.phases.get(phase)
        return 0.0 if s is None else s.quantile(q) * s.per_step

    def load(self, phase: Phase, q: float = 0.5) -> float:
        """Set-equivalent busy seconds per step: wall time x the GPU share it held."""
        s = self.phases.get(phase)
        return 0.0 if s is None else s.quantile(q) * s.per_step * s.gpu_share

    def busy(self, q: float = 0.5) -> float:
        """Set-equivalent GPU time per step at quantile q (a shrunk tail counts less)."""
        return sum(self.load(p, q) for p in GPU_PHASES)

    def busy_wall(self, q: float = 0.5) -> float:
        """Wall time in GPU phases per step at quantile q."""
        return sum(self.per_step(p, q) for p in GPU_PHASES)

    def gap(self, q: float = 0.5) -> float:
        """Gap time per step at quantile q."""
        return sum(self.per_step(p, q) for p in GAP_PHASES)

    def period(self, q: float = 0.5) -> float:
        """Wall seconds of one step at quantile q."""
        return self.busy_wall(q) + self.gap(q)

    def duty(self) -> float:
        p = self.period()
        return self.busy() / p if p > 0 else 1.0

    def segments(self, q_busy: float = 0.5, q_gap: float = 0.5) -> tuple[tuple[Phase, float], ...]:
        """One step as (phase, seconds) in order; busy at q_busy, gaps at q_gap."""
        counts: dict[Phase, int] = {}
        for p in self.shape:
            counts[p] = counts.get(p, 0) + 1
        out = []
        for p in self.shape:
            q = q_busy if p.needs_gpu else q_gap
            out.append((p, self.per_step(p, q) / counts[p]))
        return tuple(out)

    def scaled(self, factor: float) -> Profile:
        """The same phases, order and GPU shares, every duration times `factor`."""
        return replace(self, phases={
            ph: replace(st, p10=st.p10 * factor, p50=st.p50 * factor, p90=st.p90 * factor,
                        ewma=st.ewma * factor) for ph, st in self.phases.items()})

    def multi_phase(self) -> bool:
        """True when a step holds more than one rollout or more than one gap."""
        return (sum(1 for p in self.shape if p is Phase.ROLLOUT) > 1
                or sum(1 for p in self.shape if not p.needs_gpu) > 1)


#: a 7B model's step, seconds: the middle of verl's Qwen2.5-Math-7B DAPO steps, 356 s on
#: 128 GPUs to 790 s on 32 (shared/research/rl-workloads.md)
PRIOR_STEP_7B_S = (356.0 + 790.0) / 2


def prior_for_model(model: str, gpus: int) -> PhasePrior:
    """A prior step for a model with no --rl-profile: default shares, period by size.

    The period grows with the parameters each token passes through, as the square
    root of their multiple of 7B (a job of a larger model gets more GPUs, so its step
    grows less than its size), from `PRIOR_STEP_7B_S`; a mixture of experts counts its
    active parameters (`active_param_count`): verl's Qwen3-30B-A3B steps in 498 s, in
    the 7B's range, not twice it. The `tiny` backend steps in seconds. A rough prior:
    it is replaced by observations. (It took 300 s for a 7B and total parameters until
    the prior periods on the suite were found below their sources' ranges: a 7B's at
    0.84 of its shortest published step; docs/benchmarks.md.)
    """
    from slurmrl.gpu.estimate import active_param_count

    try:
        params = active_param_count(model)
    except ValueError:
        params = 7_000_000_000
    billions = params / 1e9
    step = 5.0 if billions < 0.01 else PRIOR_STEP_7B_S * max(1.0, billions / 7.0) ** 0.5
    return PhasePrior(DEFAULT_SHARES, step)


def _quantiles(values: Iterable[float]) -> tuple[float, float, float]:
    xs = sorted(values)
    n = len(xs)

    def q(p: float) -> float:
        pos = p * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)

    return q(0.1), q(0.5), q(0.9)


@dataclass
class ProfileBuilder:
    """Accumulates one job's phase observations; `build()` gives a frozen Profile."""

    prior: PhasePrior | None = None
    window: int = 32  #: durations kept per phase: older ones are forgotten (drift)
    alpha: float = 0.2  #: weight of the newest observation in the moving mean
    min_obs: int = 3  #: observations of a phase before they replace its prior
    prior_spread: float = 0.15  #: prior p10/p90 = p50 * (1 -/+ spread)
    #: share of its set a rollout lease holds on average, before any observation: 0.55
    #: where the tail shrinks it (the design, the simulator), 1.0 where the lease holds the
    #: whole set until it ends (the controller today: docs/architecture.md)
    rollout_gpu_share: float = ROLLOUT_PRIOR_GPU_SHARE
    _durations: dict[Phase, deque[float]] = field(default_factory=dict)
    _ewma: dict[Phase, float] = field(default_factory=dict)
    _share: dict[Phase, float] = field(default_factory=dict)
    _head: dict[Phase, float] = field(default_factory=dict)
    _counts: dict[Phase, int] = field(default_factory=dict)
    #: per phase: its occurrences in each of the last `window` complete steps (a phase
    #: that stops recurring leaves the profile as the window moves on)
    _per_step: dict[Phase, deque[int]] = field(default_factory=dict)
    #: per phase that recurs within a step: its total per complete step (last `window`)
    _totals: dict[Phase, deque[float]] = field(default_factory=dict)
    _step_sum: dict[Phase, float] = field(default_factory=dict)
    _steps: int = 0
    _current: list[Phase] = field(default_factory=list)
    _current_trained: bool = False  #: a train or sync is in `_current`
    _last_shape: tuple[Phase, ...] = ()
    _last_release: float | None = None

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")

    @classmethod
    def from_observations(
        cls, observations: Iterable[tuple[Phase | str, float, float]],
        prior: PhasePrior | None = None, **kwargs: float,
    ) -> ProfileBuilder:
        """A builder fed `(phase, start, end)` tuples in time order."""
        b = cls(prior=prior, **kwargs)  # type: ignore[arg-type]
        for phase, start, end in observations:
            b.observe(Phase(phase), start, end)
        return b

    @property
    def observations(self) -> int:
        """Phase observations seen so far."""
        return sum(self._counts.values())

    def observe(self, phase: Phase, start: float, end: float, gpu_share: float = 1.0,
                head_share: float | None = None) -> None:
        """One interval of `phase` (a GPU phase's lease, or a gap).

        `gpu_share` is the mean fraction of the phase's GPU set the lease held (below 1
        when it shrank through the rollout's tail); busy time is counted as
        `(end - start) * gpu_share`, the set-equivalent time a partner cannot use, while
        the period keeps the wall time. `head_share`, where known, is the part of
        `gpu_share` held before the lease first shrank (all of it where it never did):
        with `gpu_share` it says how the tail gave the set back
        (`policies.complementarity.tail_stages`).
        """
        if end < start:
            raise ValueError(f"{phase} observation ends ({end}) before it starts ({start})")
        if not 0.0 < gpu_share <= 1.0:
            raise ValueError(f"gpu_share must be in (0, 1], got {gpu_share}")
        if head_share is not None and not 0.0 <= head_share <= 1.0:
            raise ValueError(f"head_share must be in [0, 1], got {head_share}")
        d = end - start
        gpu = phase.needs_gpu
        if gpu:
            self._follow(self._share, phase, gpu_share)
            if head_share is not None:
                self._follow(self._head, phase, head_share)
        # a new step starts at a rollout that follows a train/sync
        if phase is Phase.ROLLOUT and self._current_trained:
            self._last_shape = tuple(self._current)
            self._current = []
            self._current_trained = False
            self._steps += 1
            for ph in self._counts:  # a phase absent from this step adds 0
                self._per_step.setdefault(ph, deque(maxlen=self.window)).append(
                    self._last_shape.count(ph))
                self._totals.setdefault(ph, deque(maxlen=self.window)).append(
                    self._step_sum.get(ph, 0.0))
            self._step_sum = {}
        self._current.append(phase)
        if phase is Phase.TRAIN or phase is Phase.SYNC:
            self._current_trained = True
        self._step_sum[phase] = self._step_sum.get(phase, 0.0) + d
        buf = self._durations.get(phase)
        if buf is None:  # (not setdefault: that built a deque at every observation)
            buf = self._durations[phase] = deque(maxlen=self.window)
        buf.append(d)
        self._follow(self._ewma, phase, d)
        self._counts[phase] = self._counts.get(phase, 0) + 1
        if gpu:
            self._last_release = end

    def _follow(self, means: dict[Phase, float], phase: Phase, x: float) -> None:
        """Move the phase's moving mean in `means` towards `x` (weight `alpha`)."""
        prev = means.get(phase)
        means[phase] = x if prev is None else prev + self.alpha * (x - prev)

    def observed_share(self, phase: Phase) -> float | None:
        """The phase's learned GPU share once `min_obs` leases were seen, else None."""
        if self._counts.get(phase, 0) < self.min_obs:
            return None
        return self._share.get(phase)

    def observe_lease(
        self, phase: Phase, requested_at: float, granted_at: float, released_at: float,
        gpu_share: float = 1.0, head_share: float | None = None,
    ) -> None:
        """A GPU phase's lease (`gpu_share`, `head_share`: see `observe`); the time since
        the previous release is an idle gap.

        Waiting for the lease (granted - requested) is contention, neither busy nor gap.
        """
        last = self._last_release
        if (last is not None and requested_at > last
                and (not self._current or self._current[-1].needs_gpu)):
            self.observe(Phase.IDLE, last, requested_at)
        self.observe(phase, granted_at, released_at, gpu_share, head_share)

    def _prior_stats(self, phase: Phase, share: float, step: float) -> PhaseStats:
        d = share * step
        gpu_share = self.rollout_gpu_share if phase is Phase.ROLLOUT else 1.0
        return PhaseStats(phase, 0, 1.0, d * (1 - self.prior_spread), d,
                          d * (1 + self.prior_spread), d, gpu_share)

    def build(self) -> Profile:
        prior = self.prior
        step = prior.step_s if prior is not None and prior.step_s else None
        phases: dict[Phase, PhaseStats] = {}
        used_prior = used_obs = False
        # after `min_obs` complete steps the job's own steps say which phases it has: a
        # prior phase it never reported (a reward check it does not time) is not added
        # beside the gap its leases show (that gap is observed, as idle)
        prior_ok = self._steps < self.min_obs
        for phase in Phase:
            n = len(self._durations.get(phase, ()))
            if n >= self.min_obs or (n > 0 and (prior is None or not prior_ok)):
                # occurrences per step: over the last `window` complete steps, once
                # there are some
                recent = self._per_step.get(phase)
                if self._steps == 0:
                    per_step = float(self._current.count(phase)) or 1.0
                elif not recent or not any(recent):
                    continue  # absent from every recent complete step: it stopped
                else:
                    per_step = sum(recent) / len(recent)
                totals = self._totals.get(phase, ())
                if per_step > 1.0 and len(totals) >= self.min_obs:
                    # a phase that recurs within a step (rollout turns, tool stalls): the
                    # quantiles of its per-step totals, per occurrence
                    p10, p50, p90 = (x / per_step for x in _quantiles(totals))
                else:
                    p10, p50, p90 = _quantiles(self._durations[phase])
                phases[phase] = PhaseStats(phase, n, per_step, p10, p50, p90, self._ewma[phase],
                                           self._share.get(phase, 1.0), self._head.get(phase))
                used_obs = True
            elif (prior_ok and prior is not None and step is not None
                  and prior.share(phase) > 0):
                phases[phase] = self._prior_stats(phase, prior.share(phase), step)
                used_prior = True
        if self._last_shape:
            shape = self._last_shape
        elif self._current and self._steps == 0 and not used_prior:
            shape = tuple(self._current)
        else:
            order = (Phase.ROLLOUT, Phase.REWARD, Phase.TRAIN, Phase.SYNC, Phase.IDLE)
            shape = tuple(p for p in order if p in phases)
        source = "mixed" if used_prior and used_obs else ("prior" if used_prior else "observed")
        return Profile(phases, shape, source, self._steps)


@dataclass
class SitePriors:
    """What the site has learned of jobs by (model, GPU count), from the jobs observed
    so far (running or ended; each job's latest estimate counts once): the share of its
    set a rollout lease holds (its tail). It is the prior of any job of that model and
    size until its own rollouts are observed; `default_share` before `min_jobs` such
    jobs were seen.

    Placement is decided on arrival, before a job's own phases are seen. A rollout's
    tail comes from its response-length distribution, which is a property of the task
    and model (PolyTrace's lengths are per task and model:
    shared/research/rl-workloads.md), so jobs of one model and size on one site are the
    better prior. Their periods are not: step lengths differ 2x between jobs of one
    class, and a learned whole profile (tried: a typical job's) made disaggregated
    placements more optimistic than they ran (docs/benchmarks.md).
    """

    default_share: float = ROLLOUT_PRIOR_GPU_SHARE
    min_jobs: int = 2  #: jobs observed before the learned mean replaces the default
    _share: dict[tuple[str, int], dict[int, float]] = field(default_factory=dict)
    #: (model, GPUs) -> job -> (phase shares of its median step, its median period)
    _steps: dict[tuple[str, int], dict[int, tuple[dict[Phase, float], float]]] = field(
        default_factory=dict)

    def record_share(self, job_id: int, model: str, gpus: int, share: float) -> None:
        """Job `job_id`'s current estimate of its rollout share (replaces its last)."""
        self._share.setdefault((model, gpus), {})[job_id] = share

    def rollout_share(self, model: str, gpus: int) -> float:
        seen = self._share.get((model, gpus), {})
        return sum(seen.values()) / len(seen) if len(seen) >= self.min_jobs else \
            self.default_share

    def record_step(self, job_id: int, model: str, gpus: int, profile: Profile) -> None:
        """Job `job_id`'s phase shares and period as its profile now says (replaces its
        last); a profile with no complete step is not recorded. Only a what-if learns
        these (`SimConfig.site_prior`): docs/benchmarks.md measures why."""
        period = profile.period()
        if profile.steps < 1 or period <= 0:
            return
        shares = {ph: profile.per_step(ph) / period for ph in profile.phases}
        self._steps.setdefault((model, gpus), {})[job_id] = (shares, period)

    def phase_prior(self, model: str, gpus: int, step_s: float | None) -> PhasePrior | None:
        """The mean phase shares of the jobs of this model and size recorded so far, at
        `step_s` (None: their median period); None before `min_jobs` of them."""
        seen = list(self._steps.get((model, gpus), {}).values())
        if len(seen) < self.min_jobs:
            return None
        phases = sorted({ph for shares, _ in seen for ph in shares}, key=list(Phase).index)
        mean = {ph: sum(shares.get(ph, 0.0) for shares, _ in seen) / len(seen)
                for ph in phases}
        total = sum(mean.values())
        if step_s is None:
            periods = sorted(period for _, period in seen)
            step_s = periods[len(periods) // 2]
        return PhasePrior(tuple((ph, v / total) for ph, v in mean.items()), step_s)


def profile_from_prior(prior: PhasePrior, spread: float = 0.25,
                       rollout_gpu_share: float = ROLLOUT_PRIOR_GPU_SHARE) -> Profile:
    """The profile of a job before any observation."""
    return ProfileBuilder(prior=prior, prior_spread=spread,
                          rollout_gpu_share=rollout_gpu_share).build()


def profile_from_segments(
    segments: Iterable[tuple[Phase, float]], spread: float = 0.0
) -> Profile:
    """A profile of one known step (tests, simulator, replay): mean durations per phase
    as given, p10/p90 at `spread` around them."""
    segs = list(segments)
    if not segs:
        raise ValueError("a profile needs at least one phase")
    by_phase: dict[Phase, list[float]] = {}
    for phase, d in segs:
        if d < 0:
            raise ValueError(f"{phase} duration must be >= 0, got {d}")
        by_phase.setdefault(phase, []).append(d)
    phases = {}
    for p, ds in by_phase.items():
        m = sum(ds) / len(ds)
        phases[p] = PhaseStats(p, len(ds), float(len(ds)), m * (1 - spread), m,
                               m * (1 + spread), m)
    return Profile(phases, tuple(p for p, _ in segs), "observed", 1)
