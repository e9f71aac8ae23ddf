"""Profiles from observations, and the bounded-slowdown slice policy."""

from __future__ import annotations

import pytest

from policies.slice_bounded import BoundedSlowdownSlice
from slurmrl.leases import LeaseTable
from slurmrl.model import Phase, PhasePrior
from slurmrl.profiles import Profile, ProfileBuilder, SitePriors, prior_for_model


def test_profile_starts_from_the_prior_and_follows_observations() -> None:
    prior = PhasePrior(((Phase.ROLLOUT, 0.5), (Phase.TRAIN, 0.4), (Phase.REWARD, 0.1)), 100.0)
    b = ProfileBuilder(prior=prior)
    p0 = b.build()
    assert p0.source == "prior"
    assert p0.period() == pytest.approx(100.0)
    t = 0.0
    for _ in range(5):
        for phase, d in ((Phase.ROLLOUT, 300.0), (Phase.REWARD, 30.0), (Phase.TRAIN, 100.0)):
            b.observe(phase, t, t + d)
            t += d
    p = b.build()
    assert p.source == "observed"
    assert p.period() == pytest.approx(430.0)
    assert p.steps == 4


def test_profile_window_follows_drift() -> None:
    b = ProfileBuilder(window=8)
    t = 0.0
    for d in [10.0] * 20 + [50.0] * 8:
        b.observe(Phase.ROLLOUT, t, t + d)
        b.observe(Phase.TRAIN, t + d, t + d + 1)
        t += d + 1
    assert b.build().phases[Phase.ROLLOUT].p50 == pytest.approx(50.0)


def test_turns_per_step_vary_but_the_step_rollout_does_not() -> None:
    # an agentic job: every step generates 120 s in 1 to 6 turns, with 10 s tool stalls
    # between them, then trains 60 s. Its busy time per step is 180 s at every quantile;
    # a turn's own duration varies 20-120 s, and its p90 times the mean turns would not.
    b = ProfileBuilder()
    t = 0.0
    for turns in [1, 3, 6, 2, 3, 5, 3, 4, 3, 6, 1, 3]:
        for k in range(turns):
            b.observe(Phase.ROLLOUT, t, t + 120.0 / turns)
            t += 120.0 / turns
            if k < turns - 1:
                b.observe(Phase.IDLE, t, t + 10.0)
                t += 10.0
        b.observe(Phase.TRAIN, t, t + 60.0)
        t += 60.0
    p = b.build()
    assert p.phases[Phase.ROLLOUT].per_step > 3.0
    assert p.per_step(Phase.ROLLOUT, 0.9) == pytest.approx(120.0)
    assert p.per_step(Phase.ROLLOUT, 0.1) == pytest.approx(120.0)
    assert p.busy(0.9) == pytest.approx(180.0)
    # tool stalls: 0-50 s per step, median 20 s (2 stalls), not a median stall x mean count
    assert p.gap(0.5) == pytest.approx(20.0)


def test_shrunk_rollout_counts_less_busy_but_keeps_its_wall_time() -> None:
    b = ProfileBuilder()
    for i in range(4):
        b.observe(Phase.ROLLOUT, i * 100.0, i * 100.0 + 80.0, gpu_share=0.5)
        b.observe(Phase.TRAIN, i * 100.0 + 80.0, i * 100.0 + 100.0)
    p = b.build()
    assert p.busy_wall() == pytest.approx(100.0)
    assert p.busy() == pytest.approx(60.0)


def test_a_rollouts_share_held_before_its_tail_is_learned_beside_its_mean_share() -> None:
    b = ProfileBuilder()
    for i in range(4):
        # the set for the first 20% of the rollout, then a tail on few GPUs
        b.observe(Phase.ROLLOUT, i * 100.0, i * 100.0 + 80.0, gpu_share=0.4, head_share=0.2)
        b.observe(Phase.TRAIN, i * 100.0 + 80.0, i * 100.0 + 100.0)
    roll = b.build().phases[Phase.ROLLOUT]
    assert roll.gpu_share == pytest.approx(0.4) and roll.head_share == pytest.approx(0.2)
    assert b.build().phases[Phase.TRAIN].head_share is None  # never said
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="head_share must be in"):
            b.observe(Phase.ROLLOUT, 400.0, 480.0, gpu_share=0.4, head_share=bad)
    assert b.build().phases[Phase.ROLLOUT].n == 4  # the bad ones changed nothing


def test_observe_lease_infers_gaps_and_rejects_bad_times() -> None:
    b = ProfileBuilder()
    b.observe_lease(Phase.ROLLOUT, 0.0, 1.0, 11.0)
    b.observe_lease(Phase.TRAIN, 21.0, 21.0, 26.0)
    assert b.build().phases[Phase.IDLE].p50 == pytest.approx(10.0)
    with pytest.raises(ValueError, match="before it starts"):
        b.observe(Phase.TRAIN, 5.0, 4.0)


def test_site_phase_prior_is_the_mean_step_of_jobs_like_a_new_one() -> None:
    def observed(roll: float, train: float, reward: float, steps: int = 3) -> Profile:
        b = ProfileBuilder(min_obs=1)
        t = 0.0
        for _ in range(steps):
            for ph, d in ((Phase.ROLLOUT, roll), (Phase.REWARD, reward), (Phase.TRAIN, train)):
                b.observe(ph, t, t + d)
                t += d
        b.observe(Phase.ROLLOUT, t, t + 1)  # the next step begins: the last one is complete
        return b.build()

    site = SitePriors(min_jobs=2)
    site.record_step(1, "Qwen2.5-14B", 8, observed(60, 20, 20))
    assert site.phase_prior("Qwen2.5-14B", 8, None) is None  # one job is not enough
    site.record_step(2, "Qwen2.5-14B", 8, ProfileBuilder().build())  # no step: not recorded
    assert site.phase_prior("Qwen2.5-14B", 8, None) is None
    site.record_step(2, "Qwen2.5-14B", 8, observed(100, 60, 40))
    prior = site.phase_prior("Qwen2.5-14B", 8, None)
    assert prior is not None
    # the mean of each job's shares (0.6/0.2/0.2 and 0.5/0.3/0.2), the median period
    assert prior.share(Phase.ROLLOUT) == pytest.approx(0.55)
    assert prior.share(Phase.TRAIN) == pytest.approx(0.25)
    assert prior.share(Phase.REWARD) == pytest.approx(0.2)
    assert prior.step_s == pytest.approx(200)
    fixed = site.phase_prior("Qwen2.5-14B", 8, 300.0)
    assert fixed is not None and fixed.step_s == 300.0
    assert site.phase_prior("Qwen2.5-14B", 16, None) is None  # another size: not learned


def test_site_learns_the_rollout_share_of_jobs_like_a_new_one() -> None:
    site = SitePriors(default_share=0.55, min_jobs=2)
    site.record_share(1, "Qwen3-30B-A3B", 8, 0.30)
    assert site.rollout_share("Qwen3-30B-A3B", 8) == 0.55  # one job is not enough
    site.record_share(2, "Qwen3-30B-A3B", 8, 0.20)
    assert site.rollout_share("Qwen3-30B-A3B", 8) == pytest.approx(0.25)
    site.record_share(2, "Qwen3-30B-A3B", 8, 0.40)  # a job's newer estimate replaces its last
    assert site.rollout_share("Qwen3-30B-A3B", 8) == pytest.approx(0.35)
    # other models and sizes keep the default: their tails differ
    assert site.rollout_share("Qwen3-30B-A3B", 16) == 0.55
    assert site.rollout_share("Qwen2.5-7B", 8) == 0.55
    b = ProfileBuilder(min_obs=2)
    b.observe(Phase.ROLLOUT, 0, 10, gpu_share=0.3)
    assert b.observed_share(Phase.ROLLOUT) is None
    b.observe(Phase.ROLLOUT, 20, 30, gpu_share=0.3)
    assert b.observed_share(Phase.ROLLOUT) == pytest.approx(0.3)


def test_model_size_prior_grows_with_the_model() -> None:
    small, big = prior_for_model("Qwen2.5-7B", 8), prior_for_model("Llama-3-70B", 8)
    assert small.step_s is not None and big.step_s is not None and big.step_s > small.step_s


def test_model_size_prior_periods_lie_in_the_published_ranges() -> None:
    # verl (shared/research/rl-workloads.md): a 7B DAPO step 356-790 s, Qwen3-30B-A3B's
    # 498 s; the prior took 300 s for a 7B and 621 s for the 30B-A3B (its total size)
    seven, moe = prior_for_model("Qwen2.5-7B", 8).step_s, prior_for_model("Qwen3-30B-A3B", 8).step_s
    assert seven is not None and 356.0 <= seven <= 790.0
    assert moe is not None and 356.0 <= moe <= 790.0 and moe == pytest.approx(seven)


def test_bounded_slowdown_serves_the_member_that_waited_most() -> None:
    table = LeaseTable(1, range(2), BoundedSlowdownSlice(), lease_timeout_s=1e9)
    table.set_member(1, 1.1)
    table.set_member(2, 2.0)
    lease, _ = table.request(3, Phase.TRAIN, {0, 1}, 0.0)  # a third holds the pool
    table.request(2, Phase.TRAIN, {0, 1}, 1.0)
    table.request(1, Phase.TRAIN, {0, 1}, 2.0)
    events = table.release(lease.request_id, 10.0)
    granted = [e for e in events if type(e).__name__ == "Grant"]
    assert granted[0].lease.job_id == 1  # tighter limit, similar wait: goes first


def test_bounded_slowdown_takes_a_limit_of_one_as_no_wait_allowed() -> None:
    # --rl-max-slowdown=1.0 is valid: it divided by zero, and every grant in its pool
    # failed with it
    table = LeaseTable(1, range(2), BoundedSlowdownSlice(), lease_timeout_s=1e9)
    table.set_member(1, 1.0)
    table.set_member(2, 1.2)
    lease, _ = table.request(3, Phase.TRAIN, {0, 1}, 0.0)
    table.request(2, Phase.TRAIN, {0, 1}, 1.0)
    table.request(1, Phase.TRAIN, {0, 1}, 2.0)
    events = table.release(lease.request_id, 10.0)
    granted = [e for e in events if type(e).__name__ == "Grant"]
    assert granted[0].lease.job_id == 1


def _leases_then(b: ProfileBuilder, t: float, reward_s: float) -> float:
    """One step as the controller sees it: a rollout lease, a train lease (5 s each),
    then a reported reward of `reward_s` (none where 0), and the next rollout after."""
    for phase in (Phase.ROLLOUT, Phase.TRAIN):
        b.observe_lease(phase, t, t, t + 5.0)
        t += 5.0
    if reward_s:
        b.observe(Phase.REWARD, t, t + reward_s)
        t += reward_s
    return t


def test_a_prior_phase_the_job_never_reports_leaves_once_its_steps_are_seen() -> None:
    # prior: half of a 100 s step on reward; the job never times its reward, and its
    # leases show a 10 s gap: counting the prior's 50 s reward beside that idle gap made
    # it look 3.5x more complementary than it is
    prior = PhasePrior(((Phase.ROLLOUT, 0.3), (Phase.TRAIN, 0.2), (Phase.REWARD, 0.5)), 100.0)
    b = ProfileBuilder(prior=prior)
    t = 0.0
    for _ in range(20):
        t = _leases_then(b, t, 0.0) + 10.0  # the gap, not reported
    p = b.build()
    assert p.source == "observed" and Phase.REWARD not in p.phases
    assert p.period() == pytest.approx(20.0) and p.duty() == pytest.approx(0.5)


def test_a_phase_that_stops_leaves_the_profile_within_its_window() -> None:
    b = ProfileBuilder(window=32)
    t = 0.0
    for _ in range(100):
        t = _leases_then(b, t, 20.0)
    assert b.build().period() == pytest.approx(30.0)
    for _ in range(40):  # more than a window of steps without a reward check
        t = _leases_then(b, t, 0.0)
    p = b.build()
    assert Phase.REWARD not in p.phases  # it used to stay (1000 steps on: 1.7 s a step)
    assert p.period() == pytest.approx(10.0)


def _three_members(policy: object, limits: dict[int, float],
                   horizon: float = 3000.0) -> tuple[dict[int, int], dict[int, float]]:
    """Three members of one pool, every phase on all of it: each holds its lease 10 s,
    works 5 s on the CPU, then asks again. Grants per job, and how long each request
    still waiting at the end has waited."""
    import heapq

    from slurmrl.leases import Grant, LeaseTable

    table = LeaseTable(1, range(4), policy, lease_timeout_s=1e9)  # type: ignore[arg-type]
    for job, limit in limits.items():
        table.set_member(job, limit)
    queue = [(0.0, "ask", j) for j in limits]
    heapq.heapify(queue)
    grants = dict.fromkeys(limits, 0)
    now = 0.0

    def granted(events: list[object], now: float) -> None:
        for e in events:
            if isinstance(e, Grant):
                grants[e.lease.job_id] += 1
                heapq.heappush(queue, (now + 10.0, "release", e.lease.lease_id))

    while queue:
        now, kind, x = heapq.heappop(queue)
        if now > horizon:
            break
        if kind == "ask":
            granted(table.request(x, Phase.TRAIN, range(4), now)[1], now)
        else:
            lease = table.lease(x)
            assert lease is not None
            granted(table.release(x, now), now)
            heapq.heappush(queue, (now + 5.0, "ask", lease.job_id))
    return grants, {r.job_id: now - r.requested_at for r in table.waiting}


def test_bounded_slowdown_serves_a_looser_member_beside_two_tight_ones() -> None:
    # its pressure was the share of its time spent waiting, which cannot pass 1: two
    # members at 1.1 took turns ahead of one at 1.5, which was never granted again
    from policies.slice_bounded import BoundedSlowdownSlice

    grants, waited = _three_members(BoundedSlowdownSlice(), {1: 1.1, 2: 1.5, 3: 1.1})
    assert grants[2] >= 20  # served, if less often than the tight ones
    assert grants[1] > grants[2] and grants[3] > grants[2]
    assert max(waited.values(), default=0.0) < 300.0
    # one limit for all: the same turns as round-robin
    even, _ = _three_members(BoundedSlowdownSlice(), {1: 1.3, 2: 1.3, 3: 1.3})
    assert max(even.values()) - min(even.values()) <= 1


def test_a_slice_policy_orders_requests_and_cannot_change_what_they_ask() -> None:
    # a policy returning edited copies (same ids) was granted what the copies asked: a
    # job asking for GPU 0 got the whole pool
    from dataclasses import replace

    from slurmrl.leases import Grant, LeaseTable
    from slurmrl.leases.types import PhaseRequest, PoolView

    class Editing:
        name = "editing"

        def order(self, view: PoolView) -> list[PhaseRequest]:
            return [replace(r, gpus=view.gpus, min_gpus=1) for r in view.waiting]

    table = LeaseTable(1, range(4), Editing(), lease_timeout_s=10)  # type: ignore[arg-type]
    _, events = table.request(7, Phase.TRAIN, {0}, 0.0)
    assert [sorted(e.lease.gpus) for e in events if isinstance(e, Grant)] == [[0]]
