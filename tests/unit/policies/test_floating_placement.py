"""The default policy's floating pools, offered only where the cluster says pools may
float (the controller with `slurm.floating_pools`, the simulator's `SimConfig.floating`):
a job joins the pool where every member stays within its limit without another window,
else adds one, else opens a pool of one window, never past the most GPUs a floating pool
may hold (one node's, in the controller); and where pools may not float, nothing
changes."""

from __future__ import annotations

from dataclasses import replace

from policies import registry
from policies.base import Action, ClusterSnapshot, JobSnapshot, PoolSnapshot, SiteLimits
from policies.complementarity import predict_floating
from tests.unit.policies.test_pairing import job

LIMITS = SiteLimits(max_slowdown=1.5, default_max_slowdown=1.15, max_jobs_per_pool=5)


def floating_snap(waiting: list[JobSnapshot], pools: tuple[PoolSnapshot, ...] = (),
                  free: int = 64, floating: bool = True) -> ClusterSnapshot:
    return ClusterSnapshot(0.0, pools, tuple(waiting), {"pools": free}, LIMITS, {"pools": 8},
                           {}, {"pools": floating})


def pool(members: list[JobSnapshot], windows: int) -> PoolSnapshot:
    return PoolSnapshot(7, windows * 8, tuple(members), floating=True)


def test_a_light_job_joins_a_floating_pool_without_another_window() -> None:
    # busy 40 s of each 100 s: three such jobs on two windows keep within 1.15
    members = [job(i, busy=40, gap=60) for i in (1, 2)]
    new = job(3, busy=40, gap=60)
    assert predict_floating([*members, new], 2).max_slowdown <= 1.15
    (p,) = registry.load("pairing", "complementary").place(
        floating_snap([new], (pool(members, 2),)))
    assert (p.action, p.pool_id, p.gpus) == (Action.JOIN, 7, 16)


def test_a_heavy_job_brings_its_own_window_and_never_more_windows_than_members() -> None:
    # busy 90 s of each 100 s: on two windows the third would wait far beyond 1.15
    members = [job(i, busy=90, gap=10) for i in (1, 2)]
    new = job(3, busy=90, gap=10)
    assert predict_floating([*members, new], 2).max_slowdown > 1.15
    (p,) = registry.load("pairing", "complementary").place(
        floating_snap([new], (pool(members, 2),)))
    assert (p.action, p.pool_id, p.gpus) == (Action.JOIN, 7, 24)


def test_a_full_floating_pool_takes_nobody_and_a_lone_job_opens_one_window() -> None:
    members = [job(i, busy=40, gap=60) for i in range(1, 6)]  # five: the site's most
    new = job(9, busy=40, gap=60)
    (p,) = registry.load("pairing", "complementary").place(
        floating_snap([new], (pool(members, 3),)))
    assert p.action is Action.OPEN and p.gpus == 8


def test_where_pools_may_not_float_the_policy_forms_none() -> None:
    members = [job(i, busy=40, gap=60) for i in (1, 2)]
    new = job(3, busy=40, gap=60)
    fixed = PoolSnapshot(7, 8, tuple(members[:1]))
    pol = registry.load("pairing", "complementary")
    (p,) = pol.place(floating_snap([new], (fixed,), floating=False))
    assert p.gpus in (None, 8)  # joins the fixed pool or opens one of its own size
    (q,) = pol.place(floating_snap([new], (fixed,), floating=True))
    assert q.pool_id != 7  # a fixed pool is not a floating one to join
    off = registry.load("pairing", "complementary", {"floating": False})
    (r,) = off.place(floating_snap([new], (fixed,), floating=True))
    assert (r.action, r.gpus) == (p.action, p.gpus)


def test_a_batch_fills_one_new_floating_pool_as_it_grows() -> None:
    jobs = [job(i, busy=40, gap=60) for i in range(1, 6)]
    out = registry.load("pairing", "complementary").place(floating_snap(jobs))
    assert {p.pool_id for p in out} == {out[0].pool_id}  # one pool for all five
    assert max(p.gpus or 0 for p in out) < 5 * 8  # on fewer windows than jobs
    assert all(p.action is Action.OPEN for p in out)
    assert out[0].reason.startswith("opens a floating pool")


def test_a_newcomer_is_predicted_on_its_peers_observed_profile_not_the_size_prior() -> None:
    # two jobs busy 60 s of each 100 s observed in a two-window pool; a third of their
    # model arrives with no profile: seen as its peer, it fits without another window.
    # One of another model has only the model-size prior, on which it would not
    members = [job(i, busy=60, gap=40) for i in (1, 2)]
    blank = JobSnapshot(3, "u3", members[0].request, None, 3.0, host_mem_bytes=0)
    (p,) = registry.load("pairing", "complementary").place(
        floating_snap([blank], (pool(members, 2),)))
    assert (p.action, p.gpus) == (Action.JOIN, 16)
    other = replace(blank, request=replace(blank.request, model="Qwen2.5-32B"))
    (q,) = registry.load("pairing", "complementary").place(
        floating_snap([other], (pool(members, 2),)))
    assert (q.action, q.gpus) == (Action.JOIN, 24)


def test_the_predictors_switch_costs_are_the_simulators() -> None:
    # the floating predictor prices a window changing hands as the simulator does;
    # policies do not import the simulator, so the constants are kept in step here
    from policies import complementarity
    from slurmrl.sim import costs

    assert complementarity.PCIE_BPS == costs.PCIE_BPS
    assert complementarity.FIXED_SWITCH_S == costs.FIXED_SWITCH_S


def long_tail(jid: int) -> JobSnapshot:
    """Rollout 70% of a step, through a tail that holds 0.4 of its set on average."""
    from slurmrl.model import Phase
    from slurmrl.profiles import profile_from_segments

    p = profile_from_segments([(Phase.ROLLOUT, 70), (Phase.TRAIN, 10), (Phase.REWARD, 20)])
    phases = dict(p.phases)
    phases[Phase.ROLLOUT] = replace(phases[Phase.ROLLOUT], gpu_share=0.4)
    return replace(job(jid, busy=80, gap=20), profile=replace(p, phases=phases))


def test_where_tails_hold_their_window_a_long_tail_job_brings_its_own() -> None:
    # three long-tail jobs fit two windows only where their tails pack onto one GPU
    members = [long_tail(i) for i in (1, 2)]
    new = long_tail(3)
    packed = predict_floating([*members, new], 2, pack_tails=True).max_slowdown
    held = predict_floating([*members, new], 2, pack_tails=False).max_slowdown
    assert packed <= 1.15 < held
    pol = registry.load("pairing", "complementary")
    where = floating_snap([new], (pool(members, 2),))
    (p,) = pol.place(replace(where, packs_tails={"pools": True}))  # the simulator's what-if
    assert (p.action, p.gpus, p.floating) == (Action.JOIN, 16, True)
    (p,) = pol.place(where)  # tails held: as the controller runs floating pools
    assert (p.action, p.gpus, p.floating) == (Action.JOIN, 24, True)


def test_with_tails_held_a_job_whose_kind_never_shares_windows_opens_no_floating_pool(
) -> None:
    # three long-tail jobs never fit two windows with their tails held: a floating pool
    # opened for one would only grow a window per member, so it is placed as with fixed
    # windows (and stays open to a fixed-window partner); a light job opens one
    pol = registry.load("pairing", "complementary")
    (p,) = pol.place(floating_snap([long_tail(1)]))
    assert p.action is Action.OPEN and not p.floating
    (p,) = pol.place(replace(floating_snap([long_tail(1)]), packs_tails={"pools": True}))
    assert p.action is Action.OPEN and p.floating
    (p,) = pol.place(floating_snap([job(2, busy=40, gap=60)]))
    assert p.action is Action.OPEN and p.floating


def test_where_a_pool_may_hold_two_jobs_none_floats() -> None:
    # two jobs share one window as a fixed pool does, or two windows and nothing
    pol = registry.load("pairing", "complementary")
    two = replace(floating_snap([job(2, busy=40, gap=60)]),
                  limits=replace(LIMITS, max_jobs_per_pool=2))
    (p,) = pol.place(two)
    assert p.action is Action.OPEN and not p.floating


def test_a_floating_pool_holds_no_more_gpus_than_the_bound_says() -> None:
    # the controller keeps a floating pool on one node: of 16 GPUs here, two windows
    heavy = [job(i, busy=90, gap=10) for i in (1, 2)]
    new = job(3, busy=90, gap=10)  # would bring a third window (as in the test above)
    bound = replace(floating_snap([new], (pool(heavy, 2),)), floating_max_gpus={"pools": 16})
    (p,) = registry.load("pairing", "complementary").place(bound)
    assert p.pool_id != 7 and p.gpus == 8  # a pool of its own, not a third window
    # where two windows do not fit the bound, a job does not float at all
    lone = job(4, busy=40, gap=60)
    (q,) = registry.load("pairing", "complementary").place(
        replace(floating_snap([lone]), floating_max_gpus={"pools": 8}))
    assert not q.floating
    (r,) = registry.load("pairing", "complementary").place(floating_snap([lone]))
    assert r.floating  # unbounded, it opens a floating pool of one window


def test_a_job_that_would_not_float_within_its_limit_takes_a_staggered_pool() -> None:
    # three long-tail jobs on two windows, tails packed: ~1.12 at worst. A user who
    # accepts 1.15 floats; one who accepts 1.10 would not, and on 16-GPU nodes two
    # such jobs are predicted within the site's cap in a staggered pool of 9 GPUs (each
    # training beside the other's tail): it opens that. On 8-GPU nodes none fits: it
    # floats. A job without a tail has no staggered pool: it floats
    pol = registry.load("pairing", "complementary")
    assert 1.10 < predict_floating([long_tail(1)] * 3, 2).max_slowdown <= 1.15
    tight = replace(long_tail(1), request=replace(long_tail(1).request, max_slowdown=1.10))
    for who, node, gpus, floats in ((tight, 16, 9, False), (tight, 8, 8, True),
                                    (long_tail(1), 16, 8, True)):
        where = replace(floating_snap([who]), packs_tails={"pools": True},
                        node_gpus={"pools": node})
        (p,) = pol.place(where)
        assert (p.action, p.gpus, p.floating) == (Action.OPEN, gpus, floats), (node, who)
    light = replace(floating_snap([job(2, busy=40, gap=60, max_slowdown=1.01)]),
                    packs_tails={"pools": True}, node_gpus={"pools": 16})
    (p,) = pol.place(light)
    assert p.floating


def test_jobs_whose_profile_lasts_no_time_are_placed_not_a_crash() -> None:
    # observations may start and end at one instant: a profile of zero-length phases
    # made the floating model index an empty step, and the exception stopped every
    # placement of the round (and of every round while the job waited)
    from slurmrl.model import Phase
    from slurmrl.profiles import profile_from_segments

    flat = profile_from_segments([(Phase.ROLLOUT, 0.0), (Phase.TRAIN, 0.0)])
    a, b = (replace(job(i, 50, 50, gpus=2), profile=flat) for i in (1, 2))
    assert len(predict_floating([a, b], 1, pack_tails=True).slowdowns) == 2
    out = registry.load("pairing", "complementary").place(floating_snap([a, b]))
    assert {p.job_id for p in out} == {1, 2}
