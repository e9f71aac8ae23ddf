"""Rollout replicas without sequence migration free GPUs later than a consolidated tail,
and the simulator runs jobs with either tail under its lease invariants."""

from __future__ import annotations

from dataclasses import replace

import pytest

from slurmrl.sim.runner import config_for, run_jobs
from slurmrl.sim.workload import generate, load, replica_tail_points, tail_points


def needed_at(points: tuple[tuple[float, int], ...], gpus: int, frac: float) -> int:
    """GPUs a rollout with these tail points needs at `frac` of its time."""
    need = gpus
    for f, k in points:
        if frac >= f:
            need = k
    return need


@pytest.mark.parametrize("kind", ["heavy", "math"])
@pytest.mark.parametrize(("gpus", "replica"), [(8, 1), (8, 2), (16, 4)])
def test_replicas_free_gpus_in_replica_steps_and_never_before_a_consolidated_tail(
        kind: str, gpus: int, replica: int) -> None:
    rep = replica_tail_points(kind, gpus, replica)
    # one point per replica but the last, each freeing one replica's GPUs
    assert [k for _, k in rep] == list(range(gpus - replica, 0, -replica))
    fracs = [f for f, _ in rep]
    assert fracs == sorted(fracs) and fracs[0] > 0.0 and fracs[-1] < 1.0
    cons = tail_points(kind, gpus)
    for i in range(101):
        frac = i / 100
        assert needed_at(rep, gpus, frac) >= needed_at(cons, gpus, frac)
    # and strictly more GPU time in total: what migrating sequences would give back
    area = sum(needed_at(rep, gpus, i / 1000) for i in range(1000))
    assert area > sum(needed_at(cons, gpus, i / 1000) for i in range(1000))


@pytest.mark.parametrize(("gpus", "replica"), [(8, 0), (8, 8), (8, 16), (8, 3), (1, 1)])
def test_one_engine_has_no_replica_tail(gpus: int, replica: int) -> None:
    assert replica_tail_points("heavy", gpus, replica) == ()


def test_jobs_with_replica_tails_hold_more_gpu_time_than_consolidated_ones() -> None:
    w = load("long-cot")
    jobs = generate(w, 0, "steady", 6)
    cfg = config_for(w)  # lease invariants checked after every event
    cons = run_jobs(jobs, cfg, "dedicated")
    reps = run_jobs([replace(j, tail=replica_tail_points("heavy", j.rollout_gpus, 1))
                     for j in jobs], cfg, "dedicated")
    leased = sum(r.lease_gpu_s for r in cons.sim.runs.values())
    assert sum(r.lease_gpu_s for r in reps.sim.runs.values()) > 1.4 * leased
    # alone on their sets, neither tail changes how long a job takes
    for jid, r in cons.sim.runs.items():
        assert r.finished_at == pytest.approx(reps.sim.runs[jid].finished_at)
