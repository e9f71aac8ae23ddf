"""A job that declared its steps (`--rl-steps`) is judged on its whole run: near its end
it may take a partner that slows it beyond its limit for the last steps, a newcomer may
join it beyond its own limit for those steps, and the real default policy, driven by the
simulator, keeps both runs within their limits."""

from __future__ import annotations

from policies import registry
from policies.base import SiteLimits
from slurmrl.model import Layout, Phase, PhasePrior
from slurmrl.sim.engine import SimConfig, Simulation
from slurmrl.sim.metrics import compute
from slurmrl.sim.workload import Segment, SimJob

#: one step: 70 s on the GPUs, 30 s of reward checks. Two such jobs sharing a pool take
#: 140 s a round: each is slowed 1.4x while they share
STEP = (Segment(Phase.ROLLOUT, 40.0), Segment(Phase.TRAIN, 30.0), Segment(Phase.REWARD, 30.0))


#: the `--rl-profile` of a user who knows that step
PROFILE = PhasePrior(((Phase.ROLLOUT, 0.4), (Phase.TRAIN, 0.3), (Phase.REWARD, 0.3)), 100.0)


def job(jid: int, submit: float, steps: int, max_slowdown: float,
        prior: PhasePrior | None = None) -> SimJob:
    return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-7B", 7e9, 8, Layout.COLOCATED, 8,
                  (STEP,) * steps, (), prior, max_slowdown, False)


def run(declare_steps: bool, b_limit: float = 1.5, b_steps: int = 20,
        b_prior: PhasePrior | None = None) -> Simulation:
    """A (limit 1.25) has run 18 of its 20 steps alone when B arrives."""
    jobs = [job(1, 0.0, 20, 1.25), job(2, 1850.0, b_steps, b_limit, b_prior)]
    cfg = SimConfig(gpus=16, limits=SiteLimits(max_slowdown=1.5, default_max_slowdown=1.25),
                    declare_steps=declare_steps)
    sim = Simulation(jobs, cfg, registry.load("pairing", "complementary"),
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    return sim.run()


def slowdown(sim: Simulation, jid: int) -> float:
    r = sim.runs[jid]
    assert r.finished_at is not None and r.placed_at is not None
    return (r.finished_at - r.placed_at) / r.solo_s


def test_a_job_near_its_declared_end_shares_its_last_steps_within_its_limit() -> None:
    declared = run(declare_steps=True)
    pools = [[m.job.job_id for m in p.history] for p in declared.closed]
    assert [1, 2] in pools  # B joined A's pool for A's last steps
    assert slowdown(declared, 1) <= 1.25  # A's whole run within its own limit
    assert slowdown(declared, 2) <= 1.5
    undeclared = run(declare_steps=False)
    # without --rl-steps A is judged on 1.4 while sharing, over its 1.25: B runs alone
    assert sorted([m.job.job_id for m in p.history] for p in undeclared.closed) == [[1], [2]]
    assert compute(undeclared).savings == 0.0 < compute(declared).savings


def test_a_newcomer_shares_a_members_last_steps_beyond_its_limit_and_ends_within_it() -> None:
    # B's limit is 1.25 too, and its --rl-profile says it shares at 1.4 beside A: it
    # does so only while A finishes, then runs alone
    declared = run(declare_steps=True, b_limit=1.25, b_steps=40, b_prior=PROFILE)
    pools = [[m.job.job_id for m in p.history] for p in declared.closed]
    assert [1, 2] in pools
    assert slowdown(declared, 1) <= 1.25
    assert 1.0 < slowdown(declared, 2) <= 1.25
    # without --rl-steps neither end is known: B would share its whole run at 1.4
    undeclared = run(declare_steps=False, b_limit=1.25, b_steps=40, b_prior=PROFILE)
    assert sorted([m.job.job_id for m in p.history] for p in undeclared.closed) == [[1], [2]]
