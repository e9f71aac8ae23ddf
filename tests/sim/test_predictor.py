"""The pairing predictor agrees with the simulator on a pair it would have to refuse.

Two colocated jobs of unequal periods, each holding the set most of its step: the one
with the shorter step is starved more. The predictor (policies/complementarity.py over
policies/groupsim.py) must predict each member's slowdown as the simulator measures it
while they share, or the default policy admits pairs that break users' limits.
"""

from __future__ import annotations

import pytest

from policies import complementarity, registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode, SiteLimits
from slurmrl.model import Layout, Phase
from slurmrl.sim.engine import SimConfig, Simulation
from slurmrl.sim.workload import Segment, SimJob
from tests.sim.test_elastic_rollout import OnePool

TAIL = ((0.35, 4), (0.5, 2), (0.65, 1))


def job(jid: int, steps: int, roll: float, train: float, gap: float) -> SimJob:
    step = (Segment(Phase.ROLLOUT, roll), Segment(Phase.REWARD, gap / 2),
            Segment(Phase.TRAIN, train), Segment(Phase.IDLE, gap / 2))
    return SimJob(jid, "c", f"u{jid}", 0.0, "Qwen2.5-7B", 7e9, 8, Layout.COLOCATED, 8,
                  (step,) * steps, TAIL, None, None, False)


def test_each_members_predicted_slowdown_matches_the_simulated_one() -> None:
    # step counts chosen so that, shared, both end at about the same time: each one's
    # measured slowdown is then its slowdown while sharing, what the predictor predicts
    long, short = job(1, 37, 300.0, 300.0, 40.0), job(2, 40, 210.0, 170.0, 25.0)
    sim = Simulation([long, short], SimConfig(gpus=8), OnePool(),
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits")).run()
    runs = [sim.runs[1], sim.runs[2]]
    # they really shared: the run's only pool (closed once both were done) had both as
    # members, from the start
    assert [sorted(m.job.job_id for m in p.history) for p in sim.closed] == [[1, 2]]
    assert not sim.pools and all(r.placed_at == 0.0 for r in runs)
    measured = [((r.finished_at or 0.0) - (r.placed_at or 0.0)) / r.solo_s for r in runs]
    assert measured[1] > measured[0] > 1.0  # the short-step job pays more
    complementarity.clear_caches()
    predicted = complementarity.predict([sim._snapshot(r) for r in runs]).slowdowns
    for p, m in zip(predicted, measured, strict=True):
        # never optimistic (that admits pairs that break users' limits), and not so
        # pessimistic that good pairs are refused; it was 15% optimistic for the short
        # job when each member was measured at its own end (finishing alone, diluted)
        assert 0.95 * m <= p <= 1.15 * m, (predicted, measured)


def test_members_of_unequal_lengths_are_measured_over_the_common_horizon() -> None:
    # the short-step job now outlives its partner: over its own life it runs its last
    # steps alone, so its own slowdown is diluted far below its slowdown while sharing;
    # until the first member is done (the predictor's horizon) it is not
    def shared() -> Simulation:
        return Simulation([job(1, 20, 300.0, 300.0, 40.0), job(2, 60, 210.0, 170.0, 25.0)],
                          SimConfig(gpus=8), OnePool(),
                          lambda: registry.load("slice", "round-robin"),
                          registry.load("admission", "site-limits"))

    sim = shared().run(until=lambda s: any(r.finished_at is not None for r in s.runs.values()))
    runs = [sim.runs[1], sim.runs[2]]
    assert runs[0].finished_at is not None and runs[1].finished_at is None
    horizon = [sim.now / sim.work_done(r) for r in runs]
    assert 0.0 < sim.work_done(runs[1]) < runs[1].solo_s
    complementarity.clear_caches()
    predicted = complementarity.predict([sim._snapshot(r) for r in runs]).slowdowns
    for p, m in zip(predicted, horizon, strict=True):
        assert 0.95 * m <= p <= 1.15 * m, (predicted, horizon)
    whole = shared().run()
    own = (whole.runs[2].finished_at or 0.0) / whole.runs[2].solo_s
    assert own < 0.75 * horizon[1]  # diluted by the steps it ran alone


class OneGroup:
    """Every job into one pool opened for all of them at once (one provisional id)."""

    name = "one-group"
    mode = PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        return [Placement(j.job_id, Action.OPEN, -1, j.request.gpus) for j in snapshot.waiting]


#: a heavy-tailed rollout on 8 GPUs: half the set free after 11% of it, 6 GPUs after 18%,
#: 7 after 26% (`slurmrl.sim.workload.tail_points("heavy", 8)`, rounded)
HEAVY = ((0.11, 4), (0.18, 2), (0.26, 1))


@pytest.mark.parametrize("spec", [
    [(30, 200.0, 40.0, 60.0)] * 3,
    [(30, 300.0, 30.0, 30.0)] * 3,
])
def test_three_jobs_whose_tails_halve_are_not_predicted_faster_than_they_run(
        spec: list[tuple[int, float, float, float]]) -> None:
    # three rollout-heavy jobs in one pool of 8, each rollout's lease halving through its
    # tail: a partner's rollout starts on the half a shrinking tail frees and runs at half
    # speed. Pictured as one step (the whole set, then one GPU, at the same mean share)
    # the worst member was predicted 4-6% faster than it ran, and groups of three put
    # jobs over their limits; pictured in halves, from the share of the set each lease
    # held before it first shrank, it is not
    jobs = [SimJob(i + 1, "c", f"u{i + 1}", 0.0, "Qwen2.5-7B", 7e9, 8, Layout.COLOCATED, 8,
                   ((Segment(Phase.ROLLOUT, roll), Segment(Phase.REWARD, gap / 2),
                     Segment(Phase.TRAIN, train), Segment(Phase.IDLE, gap / 2)),) * steps,
                   HEAVY, None, None, False)
            for i, (steps, roll, train, gap) in enumerate(spec)]
    sim = Simulation(jobs, SimConfig(gpus=8, limits=SiteLimits(max_jobs_per_pool=3)),
                     OneGroup(), lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    sim.run(until=lambda s: any(r.finished_at is not None for r in s.runs.values()))
    runs = [sim.runs[j.job_id] for j in jobs]
    # they shared one pool from the start
    assert [sorted(m.job.job_id for m in p.history) for p in sim.pools.values()] == [[1, 2, 3]]
    assert all(r.placed_at == 0.0 for r in runs)
    measured = max(sim.now / sim.work_done(r) for r in runs)
    complementarity.clear_caches()
    predicted = complementarity.predict([sim._snapshot(r) for r in runs]).max_slowdown
    assert measured > 1.3  # they did slow each other
    assert 0.98 * measured <= predicted <= 1.1 * measured, (predicted, measured)
