"""The default policy's placement round on hand-built snapshots where the right answer is
known: oldest first, a staggered pair that finds only its members' GPUs free, a job
whose whole run is already past its limit, and jobs the predictor cannot score."""

from __future__ import annotations

from dataclasses import replace

from policies import registry
from policies.base import Action, PoolSnapshot, SiteLimits
from policies.complementarity import predict
from slurmrl.model import Phase
from slurmrl.profiles import profile_from_segments
from tests.unit.policies.test_floating_placement import floating_snap
from tests.unit.policies.test_pairing import _tail_job, by_job, job, running, snap

LIMITS = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25)


def test_an_older_job_that_fits_is_placed_before_younger_pairs() -> None:
    # job 1 (oldest) fits the 16 free GPUs: the younger pair took 8 of them and left 8
    # idle while job 1 waited
    pol = registry.load("pairing", "complementary")
    old, young = job(1, 90, 10, gpus=16), [job(2, 50, 50), job(3, 50, 50)]
    out = by_job(pol.place(snap([old, *young], free=16, node=None)))
    assert (out[1].action, out[1].gpus) == (Action.OPEN, 16)
    assert out[2].action is Action.WAIT and out[3].action is Action.WAIT
    # with room for both, both go
    out = by_job(pol.place(snap([old, *young], free=24, node=None)))
    assert out[1].gpus == 16 and out[2].pool_id == out[3].pool_id != out[1].pool_id
    # an older job that does not fit holds nothing back
    out = by_job(pol.place(snap([old, *young], free=8, node=None)))
    assert out[1].action is Action.WAIT and out[2].pool_id == out[3].pool_id is not None


def test_an_older_job_is_placed_before_a_younger_floating_one() -> None:
    # a younger job that floats took the GPUs first, and the older one waited
    pol = registry.load("pairing", "complementary")
    out = by_job(pol.place(floating_snap([job(1, 90, 10, gpus=16), job(2, 30, 70)], free=16)))
    assert (out[1].action, out[1].gpus) == (Action.OPEN, 16)
    assert out[2].action is Action.WAIT


def test_a_staggered_pair_with_only_its_own_gpus_free_shares_one_window() -> None:
    # matched in a staggered pool of 9 GPUs, which saves more; on one window of 8 the
    # pair is still accepted (1.33 and 1.40, under 1.5): with 8 free, the first opened
    # alone and the second waited
    pol = registry.load("pairing", "complementary")
    lax = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.5)
    a, b = (_tail_job(i, 0.55, rollout=50, reward=30, train=20, max_slowdown=1.5)
            for i in (1, 2))
    got = pol.pair(a, b, lax, node=16)
    same = pol.accepts((a, b), lax)
    assert got is not None and got[1] == 9 and same is not None
    out = by_job(pol.place(snap([a, b], free=9, limits=lax)))
    assert {p.gpus for p in out.values()} == {9}
    out = by_job(pol.place(snap([a, b], free=8, limits=lax)))
    assert out[1].action is Action.OPEN and out[2].action is Action.OPEN
    assert out[1].pool_id == out[2].pool_id and out[1].gpus == 8
    assert out[1].gpu_offset == out[2].gpu_offset == 0
    assert (out[1].predicted_slowdown, out[2].predicted_slowdown) == same.slowdowns


def _past_budget() -> PoolSnapshot:
    """A pool whose one member declared 100 steps, did 50 at 1.8 times its solo time:
    alone from now its run ends at 1.4, past its limit of 1.25 (1.15 floating)."""
    base = job(1, 50, 50)
    period = base.profile.period() if base.profile else 0.0
    member = running(base, steps=100, seen=50, ran_s=50 * period * 1.8)
    return PoolSnapshot(7, 8, (member,))


def test_a_job_past_its_budget_takes_a_partner_that_costs_it_nothing() -> None:
    pol = registry.load("pairing", "complementary")
    pool = _past_budget()
    # a perfect complement does not slow it: it joins, as it does a job without
    # --rl-steps (every partner was refused)
    (p,) = pol.place(snap([job(2, 50, 50)], (pool,), limits=LIMITS))
    assert (p.action, p.pool_id) == (Action.JOIN, 7)
    bare = replace(pool.members[0], request=replace(pool.members[0].request, steps=None))
    (q,) = pol.place(snap([job(2, 50, 50)], (replace(pool, members=(bare,)),), limits=LIMITS))
    assert q.action is Action.JOIN
    # one that slows it (to 1.2 while sharing) makes its run worse still: refused
    assert predict([pool.members[0], job(2, 70, 30)]).slowdowns[0] > 1.1
    (r,) = pol.place(snap([job(2, 70, 30)], (pool,), limits=LIMITS))
    assert r.action is Action.OPEN


def test_a_job_past_its_budget_takes_a_floating_partner_that_costs_it_nothing() -> None:
    # a window added for the joiner: nobody is slowed, and the pool may grow later
    pool = replace(_past_budget(), floating=True)
    (p,) = registry.load("pairing", "complementary").place(
        floating_snap([job(2, 70, 30)], (pool,)))
    assert (p.action, p.pool_id, p.gpus) == (Action.JOIN, 7, 16)


def test_a_job_the_predictor_cannot_score_waits_and_the_others_are_placed() -> None:
    pol = registry.load("pairing", "complementary")
    nan = profile_from_segments([(Phase.ROLLOUT, float("nan")), (Phase.IDLE, 50),
                                 (Phase.TRAIN, 25), (Phase.REWARD, 25)])
    inf = profile_from_segments([(Phase.ROLLOUT, float("inf")), (Phase.IDLE, 50),
                                 (Phase.TRAIN, 25), (Phase.REWARD, 25)])
    bad = {1: (replace(job(1, 50, 50), profile=nan), "profile has a non-finite rollout"),
           2: (replace(job(2, 50, 50), profile=inf), "profile has a non-finite rollout"),
           3: (job(3, 50, 50, gpus=-8), "requests -8 GPUs"),
           4: (job(4, 50, 50, gpus=0), "requests 0 GPUs"),
           5: (replace(job(5, 50, 50), running_s=-1.0), "negative running time")}
    good = [job(6, 40, 60), job(7, 50, 50)]
    out = by_job(pol.place(snap([*(j for j, _ in bad.values()), *good])))
    for jid, (_, why) in bad.items():
        assert out[jid].action is Action.WAIT
        assert f"job {jid}" in out[jid].reason and why in out[jid].reason
    assert out[6].action is Action.OPEN and out[6].pool_id == out[7].pool_id
    # a pool whose member cannot be scored takes nobody: the job opens its own
    pool = PoolSnapshot(9, 8, (replace(job(8, 45, 55), profile=nan),))
    (p,) = pol.place(snap([job(6, 40, 60)], (pool,)))
    assert p.action is Action.OPEN
