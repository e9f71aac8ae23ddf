"""Pairing and admission policies on hand-built jobs where the right answer is known."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import registry
from policies.base import Action, ClusterSnapshot, JobSnapshot, PoolSnapshot, SiteLimits, Verdict
from policies.complementarity import (
    allowance,
    formula,
    group_load,
    lifetime,
    newcomer_views,
    predict,
    profile_of,
    seen_periods,
    tail_stages,
)
from slurmrl.model import Mux, Phase, PhasePrior, RlRequest
from slurmrl.profiles import profile_from_segments

GiB = 2**30


def job(jid: int, busy: float, gap: float, *, gpus: int = 8, mux: Mux = Mux.AUTO,
        max_slowdown: float | None = None, host: int | None = 0,
        turns: int = 1) -> JobSnapshot:
    segs: list[tuple[Phase, float]] = []
    for _ in range(turns):
        segs += [(Phase.ROLLOUT, busy / 2 / turns), (Phase.IDLE, gap / 2 / turns)]
    segs += [(Phase.TRAIN, busy / 2), (Phase.REWARD, gap / 2)]
    req = RlRequest(gpus, "Qwen2.5-7B", mux=mux, max_slowdown=max_slowdown)
    return JobSnapshot(jid, f"u{jid}", req, profile_from_segments(segs), float(jid),
                       host_mem_bytes=host)


def snap(waiting: list[JobSnapshot], pools: tuple[PoolSnapshot, ...] = (), free: int = 64,
         limits: SiteLimits | None = None, node: int | None = 16) -> ClusterSnapshot:
    """Nodes of 16 GPUs by default: a staggered pool of two 8-GPU jobs fits one."""
    return ClusterSnapshot(0.0, pools, tuple(waiting), {"pools": free},
                           limits or SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25),
                           {} if node is None else {"pools": node})


def by_job(placements: object) -> dict[int, object]:
    return {p.job_id: p for p in placements}  # type: ignore[attr-defined]


def test_formula_perfect_complement_has_no_slowdown() -> None:
    a, b = job(1, 50, 50), job(2, 50, 50)
    pred = formula([a, b])
    assert pred.slowdowns == pytest.approx((1.0, 1.0))
    assert pred.utilisation == pytest.approx(1.0)
    assert pred.gain() == pytest.approx(1.0)


def test_complementary_pairs_a_perfect_complement_into_one_new_pool() -> None:
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(snap([job(1, 40, 60), job(2, 50, 50)])))
    assert out[1].action is Action.OPEN and out[2].action is Action.OPEN
    assert out[1].pool_id == out[2].pool_id


def test_two_rollout_heavy_jobs_are_not_paired() -> None:
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(snap([job(1, 90, 10), job(2, 85, 15)])))
    assert out[1].action is Action.OPEN and out[2].action is Action.OPEN
    assert out[1].pool_id != out[2].pool_id  # each alone, at once: nobody waits for a partner
    assert predict([job(1, 90, 10), job(2, 85, 15)]).max_slowdown > 1.5


def test_parked_state_that_does_not_fit_host_memory_blocks_the_pair() -> None:
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25,
                        parked_host_mem_bytes=1500 * GiB)
    big = [job(1, 40, 60, host=1100 * GiB), job(2, 50, 50, host=1100 * GiB)]
    out = by_job(registry.load("pairing", "complementary").place(snap(big, limits=limits)))
    assert out[1].pool_id != out[2].pool_id
    small = [job(1, 40, 60, host=100 * GiB), job(2, 50, 50, host=100 * GiB)]
    out = by_job(registry.load("pairing", "complementary").place(snap(small, limits=limits)))
    assert out[1].pool_id == out[2].pool_id


def test_a_users_max_slowdown_is_respected() -> None:
    # unequal periods: the formula predicts 1.2 for the shorter job
    a, b = job(1, 40, 60, max_slowdown=1.1), job(2, 48, 72)
    assert predict([a, b]).slowdowns[0] > 1.1
    out = by_job(registry.load("pairing", "complementary").place(snap([a, b])))
    assert out[1].pool_id != out[2].pool_id


def test_max_load_keeps_apart_a_pair_with_more_gpu_work_than_the_pool_has_time() -> None:
    # duty cycles 0.60 + 0.55: predicted within the users' 1.25, so paired by default;
    # a site's max_load of 1.0 refuses the pair, one of 1.2 lets it through
    a, b = job(1, 60, 40), job(2, 55, 45)
    assert group_load([a, b]) == pytest.approx(1.15)
    assert predict([a, b]).max_slowdown < 1.25
    for max_load, together in ((None, True), (1.0, False), (1.2, True)):
        pol = registry.load("pairing", "complementary", {"max_load": max_load})
        out = by_job(pol.place(snap([a, b])))
        assert (out[1].pool_id == out[2].pool_id) is together, max_load
    with pytest.raises(registry.UnknownPolicy,
                       match="'complementary': bad parameters: max_load must be > 0, got 0"):
        registry.load("pairing", "complementary", {"max_load": 0})


def test_max_load_when_light_present_caps_heavy_pairs_only_while_a_light_job_could_use_it() -> None:
    # the same heavy pair (0.60 + 0.55): alone, or beside a light job that cannot share
    # (--rl-mux=off), it is paired; beside a light job that can (0.30, half the cap or
    # less), it is kept apart, and the light job pairs instead
    a, b = job(1, 60, 40), job(2, 55, 45)
    pol = registry.load("pairing", "complementary",
                        {"max_load": 1.0, "max_load_when": "light-present"})
    for light, together in ((None, True), (job(3, 30, 70, mux=Mux.OFF), True),
                            (job(3, 30, 70), False)):
        out = by_job(pol.place(snap([a, b] + ([light] if light else []))))
        assert (out[1].pool_id == out[2].pool_id) is together, light
        if light is not None and light.request.mux is Mux.AUTO:
            assert out[3].pool_id in (out[1].pool_id, out[2].pool_id)
    assert pol.max_load == 1.0  # an uncapped round leaves the policy as it was
    with pytest.raises(registry.UnknownPolicy, match="max_load_when must be 'always' or "
                       "'light-present', got 'sometimes'"):
        registry.load("pairing", "complementary", {"max_load_when": "sometimes"})


def test_mux_off_runs_dedicated_and_nobody_joins_it() -> None:
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(snap([job(1, 40, 60, mux=Mux.OFF), job(2, 50, 50)])))
    assert out[1].action is Action.DEDICATED
    assert out[2].action is Action.OPEN


def test_single_arrival_joins_an_open_pool_with_a_complementary_member() -> None:
    member = job(1, 50, 50)
    pool = PoolSnapshot(7, 8, (member,))
    out = registry.load("pairing", "complementary").place(snap([job(2, 50, 50)], (pool,)))
    assert out[0].action is Action.JOIN and out[0].pool_id == 7


def test_different_gpu_counts_never_share() -> None:
    out = by_job(registry.load("pairing", "complementary").place(
        snap([job(1, 40, 60), job(2, 50, 50, gpus=4)])))
    assert out[1].pool_id != out[2].pool_id


def test_no_free_gpus_means_wait_not_a_bad_pair() -> None:
    out = by_job(registry.load("pairing", "complementary").place(
        snap([job(1, 90, 10), job(2, 85, 15)], free=8)))
    assert out[1].action is Action.OPEN and out[2].action is Action.WAIT


def test_several_rollout_turns_are_scored_by_simulating_the_slice_policy() -> None:
    a, b = job(1, 50, 50, turns=4), job(2, 50, 50, turns=4)
    pred = predict([a, b])
    assert pred.max_slowdown >= formula([a, b]).max_slowdown - 1e-9
    assert pred.max_slowdown > 1.0  # turns collide: the formula alone would say 1.0


@pytest.mark.parametrize("name", ["dedicated", "random", "greedy", "fifo-lock", "gang"])
def test_baselines_place_every_job_once(name: str) -> None:
    jobs = [job(i, 40 + i, 60 - i) for i in range(1, 6)]
    out = registry.load("pairing", name).place(snap(jobs))
    assert sorted(p.job_id for p in out) == [1, 2, 3, 4, 5]
    if name == "dedicated":
        assert all(p.action is Action.DEDICATED for p in out)


def test_matching_pairs_a_batch_of_four_into_complementary_pairs() -> None:
    jobs = [job(1, 30, 70), job(2, 70, 30), job(3, 31, 69), job(4, 69, 31)]
    out = by_job(registry.load("pairing", "complementary").place(snap(jobs)))
    assert out[1].pool_id == out[2].pool_id or out[1].pool_id == out[4].pool_id
    assert len({out[i].pool_id for i in range(1, 5)}) == 2


def test_site_limits_admission_gives_reasons() -> None:
    adm = registry.load("admission", "site-limits", {"gpu_mem_bytes": 80 * GiB})
    lim = SiteLimits(max_gpus_per_job=16)
    too_big = JobSnapshot(1, "u", RlRequest(32), None, 0.0)
    v = adm.admit(too_big, lim)
    assert v.verdict is Verdict.REJECT and "32" in v.reason and "16" in v.reason
    mem = JobSnapshot(2, "u", RlRequest(8, mem_bytes=100 * GiB), None, 0.0)
    assert "GiB" in adm.admit(mem, lim).reason
    # just over the GPUs' memory (--rl-mem=82000M): the two figures differ as they do
    # (they read "80GiB exceeds the GPUs' 80 GiB")
    near = JobSnapshot(5, "u", RlRequest(8, mem_bytes=82000 * 2**20), None, 0.0)
    assert adm.admit(near, lim).reason == ("--rl-mem=80.08GiB per GPU exceeds the GPUs' "
                                           "80.00 GiB")
    off = JobSnapshot(3, "u", RlRequest(8, mux=Mux.OFF), None, 0.0)
    assert adm.admit(off, lim).verdict is Verdict.DEDICATED
    assert adm.admit(JobSnapshot(4, "u", RlRequest(8), None, 0.0), lim).verdict is Verdict.ACCEPT


def test_unknown_policy_names_the_valid_ones() -> None:
    with pytest.raises(registry.UnknownPolicy, match="complementary"):
        registry.load("pairing", "nope")


def _tail_job(jid: int, share: float, rollout: float = 50, reward: float = 10,
              train: float = 40, max_slowdown: float = 1.25, gpus: int = 8) -> JobSnapshot:
    """Rollout `rollout` s (its lease held `share` of the set on average: the tail
    shrank it), then reward, then train: observed for 4 steps."""
    from slurmrl.profiles import ProfileBuilder

    b = ProfileBuilder()
    t = 0.0
    for _ in range(4):
        b.observe(Phase.ROLLOUT, t, t + rollout, gpu_share=share)
        b.observe(Phase.REWARD, t + rollout, t + rollout + reward)
        b.observe(Phase.TRAIN, t + rollout + reward, t + rollout + reward + train)
        t += rollout + reward + train
    req = RlRequest(gpus, "Qwen2.5-7B", max_slowdown=max_slowdown)
    return JobSnapshot(jid, f"u{jid}", req, b.build(), float(jid), host_mem_bytes=0)


def test_a_shrunk_rollout_tail_still_blocks_the_partners_training() -> None:
    # set-equivalent load is only 55 s of 100 s per job, but the tail keeps a GPU for the
    # whole 50 s rollout and training needs the whole set: 40 + 90 > 125 s per 100 s
    a, b = _tail_job(1, 0.3), _tail_job(2, 0.3)
    assert predict([a, b], bound=1.25).max_slowdown > 1.25
    out = by_job(registry.load("pairing", "complementary").place(snap([a, b])))
    assert out[1].pool_id != out[2].pool_id


def _long_tail_job(jid: int, gpus: int = 8) -> JobSnapshot:
    """Rollout 80 s holding 30% of the set on average (a long tail), reward 5 s, train
    15 s; accepts a slowdown of 1.15."""
    return _tail_job(jid, 0.3, rollout=80, reward=5, train=15, max_slowdown=1.15, gpus=gpus)


def test_long_tails_pair_in_a_staggered_pool_where_one_window_would_not_fit() -> None:
    a, b = _long_tail_job(1), _long_tail_job(2)
    # on the same 8 GPUs each tail blocks the other's training: over 1.15
    assert predict([a, b]).max_slowdown > 1.15
    # on 9 GPUs, one on 0-7 and one on 1-8, each trains beside the other's tail
    assert predict([a, b], offsets=(0, 1), pool_gpus=9).max_slowdown <= 1.15
    out = by_job(registry.load("pairing", "complementary").place(snap([a, b])))
    assert out[1].pool_id == out[2].pool_id and out[1].gpus == out[2].gpus == 9
    assert {out[1].gpu_offset, out[2].gpu_offset} == {0, 1}
    assert "staggered" in out[1].reason
    # a site that turns staggering off gets two pools of 8
    off = by_job(registry.load("pairing", "complementary", {"stagger": 0}).place(snap([a, b])))
    assert off[1].pool_id != off[2].pool_id and off[1].gpus == off[2].gpus == 8


def test_no_window_of_a_staggered_pool_straddles_two_nodes() -> None:
    pol = registry.load("pairing", "complementary")
    a, b = _long_tail_job(1), _long_tail_job(2)
    # 8-GPU jobs on nodes of 8: a pool of 9 would put one job's GPUs on two nodes
    for node in (8, None):  # nor where the site's node size is unknown
        out = by_job(pol.place(snap([a, b], node=node)))
        assert all(p.gpus == 8 and p.gpu_offset == 0 for p in out.values())
    # 16-GPU jobs get a staggered pool only on nodes of 17 GPUs or more
    c, d = _long_tail_job(3, gpus=16), _long_tail_job(4, gpus=16)
    assert {p.gpus for p in pol.place(snap([c, d], node=16))} == {16}
    assert {p.gpus for p in pol.place(snap([c, d], node=32))} == {17}
    assert [pol.shift(g, 8) for g in (1, 2, 7, 8, 16)] == [0, 1, 1, 0, 0]


def test_a_lone_long_tail_job_opens_a_staggered_pool_and_a_later_one_takes_the_other_window(
        ) -> None:
    pol = registry.load("pairing", "complementary")
    (alone,) = pol.place(snap([_long_tail_job(1)]))
    assert alone.action is Action.OPEN and alone.gpus == 9 and alone.gpu_offset == 0
    # a job without a tail gains nothing from the extra GPU: it opens a pool of its size
    (plain,) = pol.place(snap([job(3, 90, 10)]))
    assert plain.gpus == 8
    for host_offset, joiner_offset in ((0, 1), (1, 0)):
        pool = PoolSnapshot(7, 9, (_long_tail_job(1),), offsets=(host_offset,))
        (pl,) = pol.place(snap([_long_tail_job(2)], pools=(pool,)))
        assert pl.action is Action.JOIN and pl.pool_id == 7 and pl.gpu_offset == joiner_offset
    # a staggered pool takes two members: a third opens its own
    full = PoolSnapshot(7, 9, (_long_tail_job(1), _long_tail_job(2)), offsets=(0, 1))
    (pl,) = pol.place(snap([_long_tail_job(4)], pools=(full,)))
    assert pl.action is Action.OPEN


def running(base: JobSnapshot, *, steps: int | None, seen: int, ran_s: float) -> JobSnapshot:
    """`base` as a running pool member that declared `--rl-steps=steps`, has completed
    `seen` steps of its profile's period, and has run `ran_s` seconds."""
    assert base.profile is not None
    return replace(base, request=replace(base.request, steps=steps),
                   profile=replace(base.profile, steps=seen), running_s=ran_s)


def test_a_job_near_its_end_takes_a_partner_its_limit_would_refuse_while_sharing() -> None:
    # A ran alone for 90 of its declared 100 steps: a partner that slows it by 1.4 for
    # its last 10 keeps its whole run near 1.04, under its limit of 1.25
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    base, joiner = job(1, 70, 30), job(2, 70, 30, max_slowdown=1.5)
    period = base.profile.period() if base.profile else 0.0
    near_end = running(base, steps=100, seen=90, ran_s=90 * period)
    shared = predict([near_end, joiner]).slowdowns
    assert shared[0] > 1.25 and shared[1] <= 1.5  # refused on its shared slowdown
    assert lifetime([near_end, joiner], shared)[0] < 1.1

    def place(member: JobSnapshot) -> Action:
        pool = PoolSnapshot(7, 8, (member,))
        return pol.place(snap([joiner], (pool,), limits=limits))[0].action

    assert place(near_end) is Action.JOIN
    # no --rl-steps: its end is unknown, so it is judged on the shared slowdown
    assert place(running(base, steps=None, seen=90, ran_s=90 * period)) is Action.OPEN
    # it already spent its budget (shared at 1.24 so far): the last steps would exceed it
    assert place(running(base, steps=100, seen=90, ran_s=90 * period * 1.24)) is Action.OPEN
    # past its declared steps: its end is unknown again
    assert place(running(base, steps=100, seen=100, ran_s=100 * period)) is Action.OPEN


def test_lifetime_counts_the_member_that_outlives_its_partner_as_alone_after() -> None:
    # two members whose ends are known: A (100 s left) ends first at 1.5 (150 s wall);
    # B has done 30 s of its 330 s of work in those 150 s, then runs alone
    a = running(job(1, 50, 50), steps=3, seen=2, ran_s=200.0)  # period 100: 100 s left
    b = running(job(2, 50, 50), steps=4, seen=1, ran_s=100.0)  # 300 s left
    a_life, b_life = lifetime([a, b], (1.5, 1.5))
    assert a_life == pytest.approx((200 + 150) / 300)
    assert b_life == pytest.approx((100 + 150 + (300 - 100)) / 400)
    # a group of three is never alone after the first leaves: judged while sharing
    assert lifetime([a, b, job(3, 50, 50)], (1.5, 1.5, 1.5)) == (1.5, 1.5, 1.5)


def newcomer(base: JobSnapshot, steps: int | None) -> JobSnapshot:
    """`base` as a job not yet started (no complete step seen) that declared
    `--rl-steps=steps`."""
    assert base.profile is not None
    return replace(base, request=replace(base.request, steps=steps),
                   profile=replace(base.profile, steps=0), running_s=0.0)


def test_a_newcomer_joins_a_member_near_its_end_beyond_its_limit_while_sharing() -> None:
    # A has 10 of its 100 steps left (1,000 s of work); B declared 200 steps (20,000 s):
    # B shares ~950 s at 1.45, beyond its limit of 1.25, then runs alone: ~1.02 over its run
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    host = running(job(1, 70, 30), steps=100, seen=90, ran_s=9000.0)
    b = newcomer(job(2, 70, 30), 200)
    shared = predict([host, b]).slowdowns
    assert shared[1] > 1.25
    first = 1000.0 * shared[0]  # A is done after its 1,000 s of work at its shared rate
    assert lifetime([host, b], shared)[1] == pytest.approx(
        1 + first * (1 - 1 / shared[1]) / 20_000)

    def place(joiner: JobSnapshot) -> Action:
        return pol.place(snap([joiner], (PoolSnapshot(7, 8, (host,)),), limits=limits))[0].action

    assert place(b) is Action.JOIN
    # no --rl-steps: its run may last any time at 1.45
    assert place(newcomer(job(2, 70, 30), None)) is Action.OPEN
    # 3 steps (300 s of work): it would be done before A, sharing all its run at 1.45
    assert place(newcomer(job(2, 70, 30), 3)) is Action.OPEN
    # A's end unknown (no --rl-steps): B's time beside it is unbounded
    bare = running(job(1, 70, 30), steps=None, seen=90, ran_s=9000.0)
    assert pol.place(snap([b], (PoolSnapshot(7, 8, (bare,)),), limits=limits))[0].action \
        is Action.OPEN


def test_two_newcomers_are_judged_sharing_however_their_declared_lengths_differ() -> None:
    # a prior's period says too little of which of two newcomers is done first (long-cot
    # jobs of one prior ran 400-900 s a step, and drifted): neither is taken to run alone
    # after the other, so a pair that slows both beyond their limits is refused
    from slurmrl.profiles import profile_from_prior

    prior = profile_from_prior(PhasePrior(((Phase.ROLLOUT, 0.5), (Phase.TRAIN, 0.3),
                                           (Phase.IDLE, 0.2)), 100.0))

    def fresh(jid: int, steps: int) -> JobSnapshot:
        return newcomer(replace(job(jid, 70, 30), profile=prior), steps)

    for steps in (120, 200, 1000):
        assert lifetime([fresh(1, 100), fresh(2, steps)], (1.3, 1.4)) == (1.3, 1.4)
        assert allowance([fresh(1, 100), fresh(2, steps)], (1.25, 1.25)) == (1.25, 1.25)
    # A (5 steps of 100 s, its limit 1.5) and B (200 steps, the site's 1.25): B would be
    # slowed by 1.45 while A runs; they do not pair
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    a = newcomer(job(1, 70, 30, max_slowdown=1.5), 5)
    b = newcomer(job(2, 70, 30), 200)
    shared = predict([a, b]).slowdowns
    assert shared[1] > 1.25 and shared[0] <= 1.5
    out = by_job(pol.place(snap([a, b], limits=limits)))
    assert out[1].pool_id != out[2].pool_id  # type: ignore[attr-defined]
    # with B's limit at 1.5 they do
    b = newcomer(job(2, 70, 30, max_slowdown=1.5), 200)
    out = by_job(pol.place(snap([a, b], limits=limits)))
    assert out[1].pool_id == out[2].pool_id  # type: ignore[attr-defined]


def fresh(jid: int, model: str = "Qwen2.5-7B", gpus: int = 8,
          max_slowdown: float | None = None) -> JobSnapshot:
    """A job just submitted with no --rl-profile: pairing knows only its model and size."""
    return JobSnapshot(jid, f"u{jid}", RlRequest(gpus, model, max_slowdown=max_slowdown),
                       None, float(jid), host_mem_bytes=0)


def test_a_newcomer_with_no_profile_is_judged_by_a_running_job_of_its_model() -> None:
    # the model-size prior makes any 7B job look busy (generation 45%, training 47% of a
    # 300 s step): beside a running 7B job busy 40% of its 100 s step it would slow that
    # job almost 4x. It is judged on the running job's phases instead, at 0.75 and 1.25
    # of its period (the prior's spread), and joins within both members' limits
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    host = running(job(1, 40, 60), steps=None, seen=20, ran_s=2000.0)
    new = fresh(2, max_slowdown=1.4)
    assert predict([host, new]).slowdowns[0] > 3
    fast, slow = newcomer_views([host, new])
    assert fast[0] is host and slow[0] is host
    assert [v[1].profile.period() for v in (fast, slow)] == pytest.approx(  # type: ignore[union-attr]
        [75.0, 125.0])
    worse = [max(a, b) for a, b in zip(predict(fast).slowdowns, predict(slow).slowdowns,
                                       strict=True)]
    assert worse[0] <= 1.25 < worse[1] <= 1.4

    def placed(newcomer: JobSnapshot) -> Action:
        return pol.place(snap([newcomer], (PoolSnapshot(7, 8, (host,)),), limits=limits))[0].action

    assert placed(new) is Action.JOIN
    # its limit of 1.25 (the site's default) is exceeded at 1.25 of the period
    assert placed(fresh(2)) is Action.OPEN
    # a job of another model keeps its own prior, seen once
    assert newcomer_views([host, fresh(2, "Llama-3-70B", max_slowdown=1.4)]) == [
        (host, fresh(2, "Llama-3-70B", max_slowdown=1.4))]
    assert placed(fresh(2, "Llama-3-70B", max_slowdown=1.4)) is Action.OPEN
    # one with its own --rl-profile is seen on it, not on the peer's phases
    told = replace(new, request=replace(new.request, profile=PhasePrior(
        ((Phase.ROLLOUT, 0.45), (Phase.TRAIN, 0.55)), 300.0)))
    assert [set(v[1].profile.phases) for v in newcomer_views([host, told])] == [  # type: ignore[union-attr]
        {Phase.ROLLOUT, Phase.TRAIN}] * 2
    assert placed(told) is Action.OPEN


def test_a_borrowing_newcomer_is_judged_at_the_periods_running_jobs_of_its_model_show(
        ) -> None:
    # judged on the host's phases at 0.75-1.25 of its 100 s period, the newcomer joins
    # (the test above). But two running jobs of its model and size take 150 s a step:
    # the newcomer's own period may be as long, and at 150 s the host runs at 1.44, over
    # its limit of 1.25, so it opens its own pool
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    host = running(job(1, 40, 60), steps=None, seen=20, ran_s=2000.0)
    new = fresh(2, max_slowdown=1.4)

    def pool_of(model: str, seen: int) -> PoolSnapshot:
        slow = [running(job(j, 60, 90), steps=None, seen=seen, ran_s=3000.0) for j in (3, 4)]
        return PoolSnapshot(8, 8, tuple(replace(m, request=replace(m.request, model=model))
                                        for m in slow))

    def placed(*others: PoolSnapshot) -> Action:
        pools = (PoolSnapshot(7, 8, (host,)), *others)
        return pol.place(snap([new], pools, limits=limits))[0].action

    slow = pool_of("Qwen2.5-7B", 20)
    assert seen_periods([PoolSnapshot(7, 8, (host,)), slow]) == {
        ("Qwen2.5-7B", 8): pytest.approx((100.0, 150.0))}
    short, long = newcomer_views([host, new], seen_periods([slow]))
    assert [v[1].profile.period() for v in (short, long)] == pytest.approx(  # type: ignore[union-attr]
        [75.0, 150.0])
    assert predict(long).slowdowns[0] > 1.4
    assert placed() is Action.JOIN
    assert placed(slow) is Action.OPEN
    # jobs of another model, or that completed fewer than 3 steps, say nothing of its
    assert placed(pool_of("Llama-3-70B", 20)) is Action.JOIN
    assert placed(pool_of("Qwen2.5-7B", 2)) is Action.JOIN
    # and the policy object keeps no round's periods
    assert pol.periods == {}


def test_a_newcomers_stated_period_is_judged_at_both_ends() -> None:
    # a newcomer whose --rl-profile gives the running job's very phases (40% busy, 100 s
    # steps) would, at its word, interleave with it: the host predicted at 1.15, under
    # its limit of 1.25. But the period is the user's estimate: at its long end (1.25 x,
    # the prior's spread) the host runs at 1.30, over 1.25, so the newcomer opens its own
    # pool; where the host may run at 1.35 both ends fit and it joins
    host = running(job(1, 40, 60), steps=None, seen=20, ran_s=2000.0)
    new = fresh(2, max_slowdown=1.4)
    told = replace(new, request=replace(new.request, profile=PhasePrior(
        ((Phase.ROLLOUT, 0.2), (Phase.IDLE, 0.3), (Phase.TRAIN, 0.2), (Phase.REWARD, 0.3)),
        100.0)))
    assert predict([host, told]).slowdowns[0] == pytest.approx(1.149, abs=0.01)
    short, long = newcomer_views([host, told])
    assert short[0] is host and long[0] is host
    assert [v[1].profile.period() for v in (short, long)] == pytest.approx(  # type: ignore[union-attr]
        [75.0, 125.0])
    assert predict(long).slowdowns[0] > 1.25 > predict(short).slowdowns[0]
    pol = registry.load("pairing", "complementary")

    def placed(default: float) -> Action:
        limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=default)
        return pol.place(snap([told], (PoolSnapshot(7, 8, (host,)),), limits=limits))[0].action

    assert placed(1.25) is Action.OPEN
    assert placed(1.35) is Action.JOIN
    # as the controller and the simulator give it (its prior's profile, no step seen):
    # the same two views; once it has completed a step its period is observed: one
    prior_only = replace(told, profile=profile_of(told))
    assert len(newcomer_views([host, prior_only])) == 2
    seen = running(prior_only, steps=None, seen=1, ran_s=100.0)
    assert newcomer_views([host, seen]) == [(host, seen)]


def test_two_newcomers_estimates_are_judged_at_opposite_ends() -> None:
    # two newcomers whose --rl-profiles give the same phases (40% busy) and 100 s steps
    # interleave at their word (1.04 at worst). Each period is its user's estimate:
    # seen both short or both long, the pair was one schedule at two speeds and the two
    # views agreed. Seen at opposite ends (75 s beside 125 s), the shorter job runs
    # 1.58x: at a limit of 1.5 each opens a pool of its own, at 1.6 they share one
    def told(jid: int) -> JobSnapshot:
        new = fresh(jid)
        return replace(new, request=replace(new.request, profile=PhasePrior(
            ((Phase.ROLLOUT, 0.2), (Phase.IDLE, 0.3), (Phase.TRAIN, 0.2),
             (Phase.REWARD, 0.3)), 100.0)))

    a, b = told(1), told(2)
    assert predict([replace(a, profile=profile_of(a)),
                    replace(b, profile=profile_of(b))]).max_slowdown < 1.05
    views = newcomer_views([a, b])
    assert [[m.profile.period() for m in v] for v in views] == [  # type: ignore[union-attr]
        pytest.approx([75.0, 125.0]), pytest.approx([125.0, 75.0])]
    assert [predict(v).slowdowns for v in views] == [
        pytest.approx((1.579, 1.012), abs=0.01), pytest.approx((1.012, 1.579), abs=0.01)]
    pol = registry.load("pairing", "complementary")

    def pools(limit: float) -> set[int | None]:
        limits = SiteLimits(max_slowdown=1.6, default_max_slowdown=limit)
        return {p.pool_id for p in pol.place(snap([a, b], limits=limits, node=None))}

    assert len(pools(1.5)) == 2
    assert len(pools(1.6)) == 1
    # a third newcomer that gave a profile is seen like the first, at the short end
    # where the second is at the long one
    third = newcomer_views([a, b, told(3)])
    assert [[m.profile.period() for m in v] for v in third] == [  # type: ignore[union-attr]
        pytest.approx([75.0, 125.0, 75.0]), pytest.approx([125.0, 75.0, 125.0])]


@settings(max_examples=1000, deadline=None)
@given(left=st.integers(1, 400), seen=st.integers(1, 50), ran=st.floats(0.5, 1.5),
       n_steps=st.integers(1, 400), s_host=st.floats(1.0, 4.0), s_new=st.floats(1.0, 4.0),
       lim_host=st.floats(1.0, 2.0), lim_new=st.floats(1.0, 2.0),
       order=st.booleans())
def test_allowance_never_rules_out_shared_slowdowns_the_whole_run_accepts(
        left: int, seen: int, ran: float, n_steps: int, s_host: float, s_new: float,
        lim_host: float, lim_new: float, order: bool) -> None:
    # `allowance` lets `predict` stop simulating a group once a member is sure to exceed
    # its bound: it must not stop one that `lifetime` would accept, whichever member is
    # listed first
    period = 100.0
    host = running(job(1, 70, 30), steps=seen + left, seen=seen, ran_s=seen * period * ran)
    new = newcomer(job(2, 70, 30), n_steps)
    members, shared, lims = [host, new], [s_host, s_new], [lim_host, lim_new]
    if order:
        members, shared, lims = members[::-1], shared[::-1], lims[::-1]
    life = lifetime(members, shared)
    if all(x <= lim for x, lim in zip(life, lims, strict=True)):
        bounds = allowance(members, lims)
        assert bounds is None or all(s <= b + 1e-9 for s, b in zip(shared, bounds, strict=True))
    # two newcomers, one of `n_steps` and one of `seen + left` steps
    pair = [newcomer(job(3, 70, 30), seen + left), new]
    life = lifetime(pair, shared)
    if all(x <= lim for x, lim in zip(life, lims, strict=True)):
        bounds = allowance(pair, lims)
        assert bounds is None or all(s <= b + 1e-9 for s, b in zip(shared, bounds, strict=True))


def test_a_pair_with_no_free_gpus_still_joins_an_open_pool() -> None:
    # the matching chose the two waiting jobs as a new pair, which found no GPUs; each
    # could have joined the open pool, and both waited
    a, b = job(1, 50, 50), job(2, 50, 50)
    pool = PoolSnapshot(7, 8, (job(9, 45, 55),))
    alone = by_job(registry.load("pairing", "complementary").place(snap([a], (pool,), free=0)))
    assert alone[1].action is Action.JOIN and alone[1].pool_id == 7
    out = by_job(registry.load("pairing", "complementary").place(
        snap([a, b], (pool,), free=0)))
    assert [out[1].action, out[2].action].count(Action.JOIN) == 1  # one joiner a round
    (joined,) = [p for p in out.values() if p.action is Action.JOIN]
    assert joined.pool_id == 7


def test_a_job_opens_a_pool_of_its_own_size_where_no_staggered_one_fits() -> None:
    # alone, a long-tailed job opens a staggered pool of 9 GPUs for a partner to come;
    # with exactly its 8 GPUs free it waited
    pol = registry.load("pairing", "complementary")
    (roomy,) = pol.place(snap([_long_tail_job(1)], free=9))
    assert roomy.action is Action.OPEN and roomy.gpus == 9
    (tight,) = pol.place(snap([_long_tail_job(1)], free=8))
    assert tight.action is Action.OPEN and tight.gpus == 8


def test_every_two_members_of_a_group_must_be_able_to_share() -> None:
    # a colocated job may share with disaggregated jobs of either split; two
    # disaggregated jobs of different splits may not share with each other
    from policies.complementarity import compatible
    from slurmrl.model import Layout

    def split(jid: int, rollout: int | None) -> JobSnapshot:
        j = job(jid, 10, 90, gpus=4)
        layout = Layout.COLOCATED if rollout is None else Layout.DISAGGREGATED
        return replace(j, request=replace(j.request, layout=layout, rollout_gpus=rollout))

    a, b, c = split(1, None), split(2, 2), split(3, 1)
    assert compatible(a, b) is None and compatible(a, c) is None
    assert compatible(b, c) is not None
    pol = registry.load("pairing", "complementary", {"max_group": 3})
    lax = SiteLimits(max_slowdown=100.0, default_max_slowdown=100.0, max_jobs_per_pool=3)
    assert pol.accepts((a, b), lax) is not None and pol.accepts((a, c), lax) is not None
    assert pol.accepts((a, b, c), lax) is None


def _layout(j: JobSnapshot, rollout: int | None, *, disaggregated: bool = True) -> JobSnapshot:
    from slurmrl.model import Layout

    layout = Layout.DISAGGREGATED if disaggregated else Layout.COLOCATED
    return replace(j, request=replace(j.request, layout=layout, rollout_gpus=rollout))


def test_a_batch_pairs_a_colocated_job_with_a_disaggregated_one_as_arrivals_one_by_one_do(
) -> None:
    # a colocated job and a disaggregated one of its GPU count may share (`compatible`);
    # arriving one by one, the second joins the first's pool: waiting together in one
    # batch, they must share one new pool too, not open two
    co = _layout(job(1, 50, 50, gpus=4), None, disaggregated=False)
    di = _layout(job(2, 40, 60, gpus=4), 2)
    pol = registry.load("pairing", "complementary")
    limits = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)
    assert pol.accepts((co, di), limits) is not None
    (one,) = pol.place(snap([di], (PoolSnapshot(7, 4, (co,)),)))
    assert one.action is Action.JOIN and one.pool_id == 7
    out = by_job(pol.place(snap([co, di])))
    assert out[1].action is Action.OPEN and out[2].action is Action.OPEN
    assert out[1].pool_id == out[2].pool_id and out[1].gpus == 4
    # either way round (the disaggregated job submitted first)
    out = by_job(pol.place(snap([replace(di, submitted_at=0.5), co])))
    assert out[1].pool_id == out[2].pool_id


def test_a_batch_pairs_disaggregated_jobs_of_one_split_given_or_defaulted() -> None:
    # --rl-rollout-gpus 4 of 8 is the default split: the two jobs may share
    a = _layout(job(1, 50, 50), None)
    b = _layout(job(2, 40, 60), 4)
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(snap([a, b])))
    assert out[1].action is Action.OPEN and out[1].pool_id == out[2].pool_id


def test_a_colocated_job_in_a_batch_finds_a_partner_of_either_split() -> None:
    # two disaggregated jobs of different splits may not share; a colocated one shares
    # with either: the batch pairs it with one of them, and the other opens alone
    co = _layout(job(1, 50, 50, gpus=4), None, disaggregated=False)
    d2, d1 = _layout(job(2, 40, 60, gpus=4), 2), _layout(job(3, 45, 55, gpus=4), 1)
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(snap([co, d2, d1])))
    assert out[2].pool_id != out[3].pool_id
    assert out[1].pool_id in (out[2].pool_id, out[3].pool_id)


def test_the_sites_cap_bounds_a_user_who_accepts_more() -> None:
    # two rollout-heavy jobs predicted ~1.8x: their users accept 3.0, the site 1.5 at most
    a, b = job(1, 90, 10, max_slowdown=3.0), job(2, 85, 15, max_slowdown=3.0)
    assert 1.5 < predict([a, b]).max_slowdown < 3.0
    out = by_job(registry.load("pairing", "complementary").place(snap([a, b])))
    assert out[1].pool_id != out[2].pool_id  # type: ignore[attr-defined]
    # where the site allows it, they share
    lax = SiteLimits(max_slowdown=3.0, default_max_slowdown=1.25)
    out = by_job(registry.load("pairing", "complementary").place(snap([a, b], limits=lax)))
    assert out[1].pool_id == out[2].pool_id  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([2, 3, 4, 6, 8, 16]), st.floats(0.0, 1.0),
       st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_a_tail_is_pictured_by_halves_at_the_share_its_lease_held(
        gpus: int, share: float, head: float | None) -> None:
    stages = tail_stages(share, gpus, head)
    ks = [k for k, _ in stages]
    # the whole set, then halvings, down to one GPU; each for a share of the rollout
    assert ks[0] == gpus and ks[-1] == 1 and ks == sorted(ks, reverse=True)
    assert all(x >= -1e-12 for _, x in stages)
    assert sum(x for _, x in stages) == pytest.approx(1.0)
    # at the mean share of the set the lease held (at least one GPU's)
    mean = sum(k * x for k, x in stages) / gpus
    assert mean == pytest.approx(min(1.0, max(1 / gpus, share)), abs=1e-9)
    x = (mean - 1 / gpus) / (1 - 1 / gpus)
    if head is None or head > x + 1e-12 or gpus < 4:
        # not known (a prior), more than the share allows, or no halving above one GPU:
        # one step, the whole set then one GPU
        assert len(stages) == 2
    else:  # the set for as long as it was observed to hold it before the tail
        assert stages[0][1] == pytest.approx(head) or stages[-1][1] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([4, 8, 16]), st.floats(0.0, 0.99), st.floats(0.0, 1.0))
def test_a_floating_pool_pictures_a_halving_tail_as_one_move_at_its_share(
        gpus: int, share: float, head: float) -> None:
    # a floating pool's tail moves once, to one GPU (`floatsim`): the halves are folded
    # into the whole set and one GPU at the same mean share, the picture before halves
    from policies.complementarity import _one_step_tail
    from policies.groupsim import TAIL, tail_stage

    (_, x0), *rest = tail_stages(share, gpus, head)
    segs = [("reward", 5.0), ("rollout", 100.0 * x0),
            *((tail_stage(k), 100.0 * x) for k, x in rest if x > 0), ("train", 20.0)]
    out = _one_step_tail(segs, gpus)
    assert [ph for ph, _ in out] == ["reward", "rollout", TAIL, "train"]
    s = min(1.0, max(1 / gpus, share))
    x = (s - 1 / gpus) / (1 - 1 / gpus)
    assert out[1][1] == pytest.approx(100.0 * x, abs=1e-6)
    assert out[2][1] == pytest.approx(100.0 * (1 - x), abs=1e-6)
